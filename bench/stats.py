"""The few figures every suite prints the same way: a verdict, a min-max, a percentile."""

from __future__ import annotations

import math
from collections.abc import Sequence


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def min_max(values: Sequence[float], digits: int = 1) -> str:
    """ "low-high" with thousands separators, as the tables quote a spread of runs."""
    return f"{min(values):,.{digits}f}-{max(values):,.{digits}f}"


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (`fraction` 0.99 for p99): a value that was measured."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))]
