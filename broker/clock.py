"""The broker's clocks in milliseconds: the wall clock its records are stamped with,
and the monotonic one that durations count on.

The IO shell takes time from here and hands it to the pure modules as a number (they
never read a clock), so every room reads the same two clocks.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch: what batches, entries and offsets are stamped with."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """Milliseconds on the monotonic clock, for what lasts (SASL sessions, group members'
    sessions, rebalance timeouts): a wall clock stepped back or forth must not end or
    extend them."""
    return time.monotonic_ns() // 1_000_000
