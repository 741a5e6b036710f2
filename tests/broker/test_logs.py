"""The log line formats: logfmt text and JSON with typed values (broker/logs.py)."""

from __future__ import annotations

import json
import logging

from broker.logs import JsonFormatter, TextFormatter


def _record(template: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("minibroker.t", logging.INFO, __file__, 1, template, args, None)


TEMPLATE = "event=e flag=%s pid=%d seconds=%.3f topic=%s reason=%r clean=true part=x%s"
ARGS = (False, 42, 0.0123456, "123", "too late", 7)


def test_json_keeps_the_type_of_each_argument() -> None:
    out = json.loads(JsonFormatter().format(_record(TEMPLATE, *ARGS)))
    assert out["flag"] is False and out["clean"] is True
    assert out["pid"] == 42 and out["seconds"] == 0.012
    # A string stays a string whatever it looks like; part of a value stays text.
    assert out["topic"] == "123" and out["reason"] == "too late" and out["part"] == "x7"
    assert out["message"] == (
        "event=e flag=false pid=42 seconds=0.012 topic=123 reason='too late' clean=true part=x7"
    )


def test_text_shows_booleans_as_json_does() -> None:
    line = TextFormatter().format(_record("event=e clean=%s n=%d", True, 3))
    assert line.endswith(" logger=minibroker.t event=e clean=true n=3")


def test_json_of_a_template_it_cannot_follow_keeps_strings() -> None:
    out = json.loads(JsonFormatter().format(_record("event=e n=%*d m=%d", 3, 4, 5)))
    assert out["m"] == "5" and out["message"] == "event=e n=  4 m=5"
