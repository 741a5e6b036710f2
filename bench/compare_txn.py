"""A transaction's commit on two code trees, side by side in interleaved rounds.

Both brokers run at once. Each round times `commit_transaction()` of small
transactions through the sync SDK (the last Produce and EndTxn in one write), the
trees' transactions alternating one by one, then the consume-transform-produce
loop of bench/bench_txn.py with batches of 5 on one tree then the other (order
alternating). The client is this tree's for both, so only the broker differs.
Reported per tree: commit p50 (median of the rounds' p50s, with their min-max) and
loop records/s, and the per-round ratio new/base. The base tree is any checkout:

    git archive <commit> | tar -x -C /tmp/base
    python -m bench.compare_txn --base /tmp/base --backend trio
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.bench_txn import RECORD, _loop
from client import Producer
from client.admin import create_topic
from harness.broker_process import BrokerProcess


def commit_p50_ms(
    bootstraps: dict[str, str], transactions: int, records: int, tag: str
) -> dict[str, float]:
    """Per tree, the median `commit_transaction()` time of `transactions` of `records`
    records, the trees' transactions alternating one by one, so that a neighbour's
    burst of load lands on both."""
    times: dict[str, list[float]] = {name: [] for name in bootstraps}
    with contextlib.ExitStack() as stack:
        producers = {
            name: stack.enter_context(
                Producer(bootstrap, transactional_id=f"cmp-{tag}", acks="all", linger_ms=5)
            )
            for name, bootstrap in bootstraps.items()
        }
        for producer in producers.values():
            producer.init_transactions()
        for i in range(transactions):
            for name in list(producers) if i % 2 == 0 else list(producers)[::-1]:
                producer = producers[name]
                producer.begin_transaction()
                for _ in range(records):
                    producer.send("cmp", RECORD, partition=0)
                started = time.perf_counter()
                producer.commit_transaction()
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


def loop_records_per_s(broker: BrokerProcess, count: int, tag: str) -> float:
    bootstrap = broker.bootstrap
    topic = f"loop-{tag}"
    create_topic(bootstrap, topic, 1)
    create_topic(bootstrap, f"{topic}-out", 1)
    with Producer(bootstrap, enable_idempotence=True, acks="all", linger_ms=5) as filler:
        for i in range(count):
            filler.send(topic, RECORD, key=b"%d" % i, partition=0)
    return _loop(bootstrap, topic, 5, count, tag)


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the code tree to compare with")
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--transactions", type=int, default=200, help="per round")
    parser.add_argument("--records", type=int, default=10, help="per transaction")
    parser.add_argument("--loop-records", type=int, default=1000, help="per round")
    args = parser.parse_args()
    trees = {"base": str(args.base.resolve()), "new": os.getcwd()}
    commits: dict[str, list[float]] = {name: [] for name in trees}
    loops: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        brokers = {
            name: BrokerProcess(
                Path(tmp) / name,
                backend=args.backend,
                env={"PYTHONPATH": tree},
                # `python -m broker` imports from its working directory first.
                preexec_fn=functools.partial(os.chdir, tree),
            ).start()
            for name, tree in trees.items()
        }
        try:
            for broker in brokers.values():
                create_topic(broker.bootstrap, "cmp", 1)
            bootstraps = {name: broker.bootstrap for name, broker in brokers.items()}
            for round_ in range(args.rounds):
                p50s = commit_p50_ms(bootstraps, args.transactions, args.records, f"{round_}")
                for name in trees:
                    commits[name].append(p50s[name])
                for name in ("base", "new") if round_ % 2 == 0 else ("new", "base"):
                    broker = brokers[name]
                    loops[name].append(loop_records_per_s(broker, args.loop_records, f"{round_}"))
        finally:
            for broker in brokers.values():
                broker.terminate()
    for name in trees:
        print(
            f"{name}: commit p50 ms {_summary(commits[name])}, "
            f"loop (batches of 5) records/s {_summary(loops[name])}"
        )
    commit_ratio = [n / b for n, b in zip(commits["new"], commits["base"], strict=True)]
    loop_ratio = [n / b for n, b in zip(loops["new"], loops["base"], strict=True)]
    print(f"new/base per round: commit p50 {_summary(commit_ratio)}, loop {_summary(loop_ratio)}")


if __name__ == "__main__":
    main()
