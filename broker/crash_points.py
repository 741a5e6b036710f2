"""Named points where a test makes the broker die as kill -9 would.

A crash test must stop the real process between two durable steps (a decision
written, its markers not yet), which no signal from outside can time. Setting
`MINIBROKER_CRASH_AT=<name>` arms one point; reaching it sends SIGKILL to the
process itself, so nothing is flushed or closed on the way out. Unset, a point
costs one string comparison.
"""

from __future__ import annotations

import os
import signal

ENV = "MINIBROKER_CRASH_AT"
_ARMED = os.environ.get(ENV, "")


def crash_point(name: str) -> None:
    if name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
