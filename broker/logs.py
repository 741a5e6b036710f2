"""One line per event on stderr, as logfmt text or JSON.

Messages are written as `event=name key=value ...`; the JSON formatter parses
those pairs into fields so both formats carry the same data. Every module of the
project logs to ``minibroker.<module>`` (``minibroker.broker.network.server``,
``minibroker.client.producer``), so the one handler and level `setup` puts on the
``minibroker`` logger cover them all.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time

_PAIR = re.compile(r"""(\w+)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S+)""")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={stamp}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} {record.getMessage()}"
        )
        if record.exc_info:
            line += " exc=" + repr(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, object] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        for key, value in _PAIR.findall(message):
            out[key] = value[1:-1] if value[:1] in "'\"" else value
        out["message"] = message
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
