"""Named points where a test makes the broker die as kill -9 would.

A crash test must stop the real process between two durable steps (a decision
written, its markers not yet), which no signal from outside can time. Setting
`MINIBROKER_CRASH_AT=<name>` arms one point; reaching it sends SIGKILL to the
process itself, so nothing is flushed or closed on the way out.
`MINIBROKER_CRASH_AT=<name>:<n>` dies the n-th time the point is reached (the
second marker of a decision, say). Unset, a point costs one string comparison.
"""

from __future__ import annotations

import os
import signal

ENV = "MINIBROKER_CRASH_AT"
_ARMED, _, _NTH = os.environ.get(ENV, "").partition(":")
_left = int(_NTH or 1)


def crash_point(name: str) -> None:
    global _left
    if name == _ARMED:
        _left -= 1
        if _left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
