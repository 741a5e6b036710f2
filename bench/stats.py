"""The few figures every suite prints the same way: a table, a verdict, a min-max, a percentile."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def min_max(values: Sequence[float], digits: int = 1) -> str:
    """ "low-high" with thousands separators, as the tables quote a spread of runs."""
    return f"{min(values):,.{digits}f}-{max(values):,.{digits}f}"


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (`fraction` 0.99 for p99): a value that was measured."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))]


def table(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c, "")
            cells.append(
                f"{v:,.1f}"
                if isinstance(v, float)
                else f"{v:,}"
                if isinstance(v, int) and not isinstance(v, bool)
                else str(v)
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
