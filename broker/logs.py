"""One line per event on stderr, as logfmt text or JSON.

Messages are written as `event=name key=%s ...`; the JSON formatter parses the
pairs into fields so both formats carry the same data. A value that is one
argument of the template keeps the argument's type in JSON: a number is a JSON
number and a bool a JSON boolean (`true`/`false` in the text too), whatever the
text of a string looks like (`topic=123` stays a string). Every module of the
project logs to ``minibroker.<module>`` (``minibroker.broker.network.server``,
``minibroker.client.producer``), so the one handler and level `setup` puts on the
``minibroker`` logger cover them all.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import sys
import time

AUDIT_LOGGER = "minibroker.audit"
"""The one logger named for its readers, not a module: the audit trail (who
authenticated, which requests were denied), under `minibroker` so the format and
level apply, and apart so operators can route it."""

_PAIR = re.compile(r"""(\w+)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S+)""")
# One printf-style conversion of a template, as `%` formatting reads it.
_SPEC = re.compile(r"%(?:\(\w*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?([diouxXeEfFgGcrsa%])")
_KEY_BEFORE = re.compile(r"(\w+)=\Z")
_LITERALS: dict[str, object] = {"true": True, "false": False}


@functools.lru_cache(maxsize=1024)
def _slots(template: str) -> tuple[tuple[str | None, str], ...] | None:
    """For each argument `template` takes: the key whose whole value it is (None when it
    is part of a longer value) and its conversion letter; None when an argument sets a
    width or precision (`%*d`), whose count the pairs cannot follow."""
    slots: list[tuple[str | None, str]] = []
    for m in _SPEC.finditer(template):
        width, precision, conversion = m.groups()
        if conversion == "%":
            continue
        if "*" in (width, precision):
            return None
        key = _KEY_BEFORE.search(template, 0, m.start())
        whole = m.end() == len(template) or template[m.end()].isspace()
        slots.append((key.group(1) if key and whole else None, conversion))
    return tuple(slots)


def _arguments(record: logging.LogRecord) -> list[tuple[str | None, str, object]] | None:
    """(key, conversion, argument) for each argument of the record, when they line up."""
    args = record.args
    if not isinstance(args, tuple) or not args:
        return None
    slots = _slots(str(record.msg))
    if slots is None or len(slots) != len(args):
        return None
    return [(key, conversion, arg) for (key, conversion), arg in zip(slots, args, strict=True)]


def message(record: logging.LogRecord) -> str:
    """The record's message, with a bool shown by `%s` as `true`/`false` (logfmt's
    habit, and what JSON says) rather than Python's `True`/`False`."""
    arguments = _arguments(record)
    if arguments is None or not any(isinstance(arg, bool) for _, _, arg in arguments):
        return record.getMessage()
    shown = tuple(
        ("true" if arg else "false") if isinstance(arg, bool) and conversion == "s" else arg
        for _, conversion, arg in arguments
    )
    return str(record.msg) % shown


def fields(record: logging.LogRecord, text: str) -> dict[str, object]:
    """The `key=value` pairs of `text` (the record's message): strings, except the values
    that are a bool or a number, as the template's argument or literal (`clean=true`)."""
    out: dict[str, object] = {
        key: value[1:-1] if value[:1] in "'\"" else value for key, value in _PAIR.findall(text)
    }
    for key, literal in _PAIR.findall(str(record.msg)):
        if literal in _LITERALS and out.get(key) == literal:
            out[key] = _LITERALS[literal]
    for key, _, arg in _arguments(record) or ():
        if key is None or key not in out:
            continue
        if isinstance(arg, bool):
            out[key] = arg
        elif isinstance(arg, int):
            out[key] = int(arg)
        elif isinstance(arg, float):
            # The value as the text shows it (`seconds=%.3f`), when finite: JSON has no NaN.
            try:
                shown = float(str(out[key]))
            except ValueError:
                continue
            if math.isfinite(shown):
                out[key] = shown
    return out


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={stamp}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} {message(record)}"
        )
        if record.exc_info:
            line += " exc=" + repr(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = message(record)
        out: dict[str, object] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        out.update(fields(record, text))
        out["message"] = text
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("minibroker")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
