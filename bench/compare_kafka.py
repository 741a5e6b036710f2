"""The kafka listener's broker CPU per batch against the native listener's, for one
code tree or two side by side, in interleaved rounds (issue 40, item 8).

Each tree's broker runs both listeners; each round loads every broker with
bench_kafka's two acks=1 idempotent loads (Kafka's Produce v7 and minibroker's
Produce, pre-encoded 16 KiB batches, the same window), brokers and loads in
alternating order. Per tree it reports the rounds' kafka/native ratios; with
`--base`, also new/base of the kafka load's CPU per batch. Ratios are medians with
a bootstrap 95% interval and their min-max. A base tree is any checkout, e.g.

    git archive <commit> | tar -x -C /tmp/base
    python -m bench.compare_kafka --base /tmp/base --backend trio
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.bench_broker import _produce, bootstrap_median_ci
from bench.bench_kafka import CONFIG, kafka_cpu_round
from bench.compare_broker import tree_brokers
from harness.broker_process import BrokerProcess

Load = Callable[[BrokerProcess, int], tuple[float, float]]


def _native(broker: BrokerProcess, n_batches: int) -> tuple[float, float]:
    return _produce(broker, acks=1, idempotent=True, n_batches=n_batches)


LOADS: dict[str, Load] = {"kafka": kafka_cpu_round, "native": _native}


def _ratio(top: list[float], bottom: list[float]) -> str:
    ratios = [t / b for t, b in zip(top, bottom, strict=True)]
    low, high = bootstrap_median_ci(ratios)
    return (
        f"{statistics.median(ratios):.3f} (95% CI {low:.3f}-{high:.3f}, "
        f"min-max {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} rounds)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, help="a code tree to compare with")
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batches", type=int, default=3000, help="per load and round")
    args = parser.parse_args()
    trees = {"new": os.getcwd()}
    if args.base is not None:
        trees = {"base": str(args.base.resolve()), **trees}
    # cpu[tree][load]: broker CPU µs per batch, one per round.
    cpu: dict[str, dict[str, list[float]]] = {tree: {load: [] for load in LOADS} for tree in trees}
    started = time.strftime("%H:%M", time.gmtime())
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        brokers = tree_brokers(Path(tmp), trees, args.backend, CONFIG)
        try:
            for round_ in range(args.rounds):
                names = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
                loads = list(LOADS) if round_ // 2 % 2 == 0 else list(LOADS)[::-1]
                for name in names:
                    for load in loads:
                        _mb_s, us = LOADS[load](brokers[name], args.batches)
                        cpu[name][load].append(us)
        finally:
            for broker in brokers.values():
                broker.kill()
    ended = time.strftime("%H:%M", time.gmtime())
    load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{args.backend}, {started}-{ended} UTC, load average {load_average} at the end")
    for name in trees:
        kafka, native = cpu[name]["kafka"], cpu[name]["native"]
        print(
            f"{name}: kafka {statistics.median(kafka):.1f} µs/batch "
            f"({min(kafka):.1f}-{max(kafka):.1f}), native {statistics.median(native):.1f} "
            f"({min(native):.1f}-{max(native):.1f}); kafka/native {_ratio(kafka, native)}"
        )
    if args.base is not None:
        for load in LOADS:
            print(f"{load} new/base {_ratio(cpu['new'][load], cpu['base'][load])}")


if __name__ == "__main__":
    main()
