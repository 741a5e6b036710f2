"""Where `make bench` is, on stderr: which suite of how many, and which round of which case,
so that half an hour of benchmarks is not half an hour of silence. Plain lines, which a
terminal and a log both keep; stdout stays the suites' tables."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

_current = {"suite": ""}


def suite(name: str, index: int, count: int) -> None:
    """Suite `index` (from 1) of `count` starts; later rounds name it."""
    _current["suite"] = name
    started = time.strftime("%H:%M:%S")
    print(f"bench: suite {index}/{count}: {name} (started {started})", file=sys.stderr, flush=True)


def rounds(count: int, what: str, start: int = 0, stop: int | None = None) -> Iterator[int]:
    """range(start, stop or count), saying 'bench: SUITE, WHAT: round i/count' before each."""
    where = f"{_current['suite']}, " if _current["suite"] else ""
    for index in range(start, count if stop is None else stop):
        print(f"bench: {where}{what}: round {index + 1}/{count}", file=sys.stderr, flush=True)
        yield index
