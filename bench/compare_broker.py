"""Broker CPU per batch of two code trees, side by side in interleaved rounds.

A change is judged against the code before it in one run: both brokers run
at once, each round loads one then the other (order alternating), and the
per-round ratio new/base is reported as a median with a bootstrap 95% interval
and its min-max. The base tree is any checkout, e.g.

    git archive <commit> | tar -x -C /tmp/base
    python -m bench.compare_broker --base /tmp/base --load acks1 --backend trio

`--load clients-4` is issue 14's durable case (bench_client's 4 `Producer`
processes, `--batches` 16 KiB batches in all) against each broker.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
from pathlib import Path

from bench.bench_broker import _produce, bootstrap_median_ci, produce_parallel
from bench.bench_client import (
    DURABLE_CPU_UNIT_BYTES,
    DURABLE_PRODUCERS,
    DURABLE_RECORD_BYTES,
    durable_round,
)
from harness.broker_process import BrokerProcess


def tree_brokers(
    tmp: Path, trees: dict[str, str], backend: str, config: str | None = None
) -> dict[str, BrokerProcess]:
    """One started broker per code tree (name -> path), each running that tree's code,
    with its data dir under `tmp`."""
    return {
        name: BrokerProcess(
            # Absolute: each broker runs in its own tree, and a relative data dir then
            # lay in the base tree, outside the directory removed after the run.
            tmp.resolve() / name,
            backend=backend,
            config=config,
            env={"PYTHONPATH": tree},
            # `python -m broker` imports from its working directory first.
            preexec_fn=functools.partial(os.chdir, tree),
        ).start()
        for name, tree in trees.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the code tree to compare with")
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--load", choices=["acks1", "acks-all-4", "clients-4"], default="acks1")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batches", type=int, default=2000, help="per round")
    args = parser.parse_args()
    trees = {"base": str(args.base.resolve()), "new": os.getcwd()}
    figures: dict[str, list[tuple[float, ...]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        brokers = tree_brokers(Path(tmp), trees, args.backend)
        try:
            for round_ in range(args.rounds):
                for name in ("base", "new") if round_ % 2 == 0 else ("new", "base"):
                    if args.load == "acks1":
                        figure: tuple[float, ...] = _produce(
                            brokers[name], acks=1, idempotent=True, n_batches=args.batches
                        )
                    elif args.load == "acks-all-4":
                        figure = produce_parallel(
                            brokers[name], producers=4, acks=-1, n_batches=args.batches // 4
                        )
                    else:
                        payload = args.batches * DURABLE_CPU_UNIT_BYTES
                        records = payload // DURABLE_RECORD_BYTES // DURABLE_PRODUCERS
                        figure = durable_round(brokers[name], records)
                    figures[name].append(figure)
        finally:
            for broker in brokers.values():
                broker.kill()
    names = (
        ["MB/s", "client CPU µs/record", "broker CPU µs/16 KiB", "records/batch"]
        if args.load == "clients-4"
        else ["MB/s", "broker CPU µs/batch", "batches/fsync"]
    )
    for i, name in enumerate(names[: len(figures["new"][0])]):
        base = [f[i] for f in figures["base"]]
        new = [f[i] for f in figures["new"]]
        ratios = [n / b for n, b in zip(new, base, strict=True)]
        low, high = bootstrap_median_ci(ratios)
        print(
            f"{args.backend} {args.load} {name}: base {statistics.median(base):.1f}, "
            f"new {statistics.median(new):.1f}; new/base {statistics.median(ratios):.3f} "
            f"(95% CI {low:.3f}-{high:.3f}, min-max {min(ratios):.2f}-{max(ratios):.2f}, "
            f"{args.rounds} rounds)"
        )


if __name__ == "__main__":
    main()
