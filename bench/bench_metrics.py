"""Cost per call of the broker's hot-path metrics methods, in process (no broker).

The broker calls `observe_request` for every request and `record_produce` for
every partition of a Produce, so their cost is added to every request. Each case
runs enabled and disabled (``BrokerMetrics(enabled=False)``, what
``--metrics-port -1`` gives), best of `REPEAT` rounds, with the cost of the timing
loop's own call subtracted. `run()` returns the rows `make bench` prints;

    .venv/bin/python -m bench.bench_metrics [--number N]

prints them alone, without touching docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

from broker.metrics import BrokerMetrics

REPEAT = 7


def _cases(m: BrokerMetrics) -> dict[str, Callable[[], object]]:
    return {
        "observe_request": lambda: m.observe_request("Produce", 0, 0.0002),
        "observe_request(error)": lambda: m.observe_request("Produce", 45, 0.0002),
        "record_produce": lambda: m.record_produce("bench", 1000, 10),
        "observe_fsync": lambda: m.observe_fsync(0.001, 8),
    }


def _ns_per_call(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=REPEAT)) / number * 1e9


def run(number: int = 200_000) -> list[dict[str, Any]]:
    """One row per method: ns per call with metrics enabled and disabled."""
    baseline = _ns_per_call(lambda: None, number)
    per_state: dict[str, dict[str, float]] = {}
    for state, enabled in (("enabled_ns", True), ("disabled_ns", False)):
        m = BrokerMetrics(enabled=enabled)
        # Warm the caches as a running broker has them.
        m.observe_request("Produce", 0, 0.0002)
        m.record_produce("bench", 1000, 10)
        per_state[state] = {
            name: _ns_per_call(fn, number) - baseline for name, fn in _cases(m).items()
        }
    return [
        {
            "benchmark": f"metrics {name}",
            "enabled_ns": per_state["enabled_ns"][name],
            "disabled_ns": per_state["disabled_ns"][name],
        }
        for name in per_state["enabled_ns"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000, help="calls per round")
    for row in run(parser.parse_args().number):
        print(
            f"{row['benchmark']:32s} enabled {row['enabled_ns']:6.0f} ns  "
            f"disabled {row['disabled_ns']:6.0f} ns"
        )


if __name__ == "__main__":
    main()
