"""`poll()` and `send_batch()` of two code trees' clients, side by side in interleaved rounds.

One asyncio broker (this tree's) holds 3,000,000 100-byte records; each round runs,
in alternating order, a consumer process of each tree reading them all from the
start, then a producer process of each sending as many with `send_batch()` (the
client suite's settings, bench_client.PRODUCER_CONFIG). Each process reports its
records/s and CPU seconds; the rows give medians with min-max and each round's
ratio new/base. The base tree is any checkout, e.g.

    git archive <commit> | tar -x -C /tmp/base
    python -m bench.compare_client --base /tmp/base --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_client import BATCH_CALL_RECORDS, PRODUCER_CONFIG, RECORD_SIZE
from client.admin import create_topic
from harness.broker_process import BrokerProcess

# argv: bootstrap, records. Prints records/s and the process's CPU seconds.
_CONSUME = """
import sys, time
from client import Consumer, TopicPartition
with Consumer(TopicPartition("read", 0), bootstrap_servers=sys.argv[1],
              auto_offset_reset="earliest") as consumer:
    records, count = int(sys.argv[2]), 0
    began, cpu = time.perf_counter(), time.process_time()
    while count < records:
        for batch in consumer.poll(timeout_ms=1_000, max_records=1_000_000).values():
            count += len(batch)
    print(count / (time.perf_counter() - began), time.process_time() - cpu)
"""
# argv: bootstrap, records, topic, record bytes, call records, config as JSON.
_SEND_BATCH = """
import json, os, sys, time
from client import Producer
bootstrap, records, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
size, call = map(int, sys.argv[4:6])
column = [os.urandom(size) for _ in range(call)]
with Producer(bootstrap, **json.loads(sys.argv[6])) as producer:
    producer.partitions_for(topic)
    began, cpu = time.perf_counter(), time.process_time()
    for start in range(0, records, call):
        producer.send_batch(topic, column[: min(call, records - start)], partition=0)
    producer.flush()
    print(records / (time.perf_counter() - began), time.process_time() - cpu)
"""


def _run(tree: str, code: str, *args: str) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": tree},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rate, cpu = map(float, out.split())
    return rate, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the code tree to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--records", type=int, default=3_000_000)
    args = parser.parse_args()
    trees = {"base": str(args.base.resolve()), "new": os.getcwd()}
    records = str(args.records)
    config = json.dumps(PRODUCER_CONFIG)
    batch_args = (str(RECORD_SIZE), str(BATCH_CALL_RECORDS), config)
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", backend="asyncio").start()
        try:
            for topic in ("read", "write"):
                create_topic(broker.bootstrap, topic, partitions=1)
            _run(trees["new"], _SEND_BATCH, broker.bootstrap, records, "read", *batch_args)
            for round_ in range(args.rounds):
                order = ("base", "new") if round_ % 2 == 0 else ("new", "base")
                for name in order:
                    figure = _run(trees[name], _CONSUME, broker.bootstrap, records)
                    figures.setdefault(("poll()", name), []).append(figure)
                for name in order:
                    figure = _run(
                        trees[name], _SEND_BATCH, broker.bootstrap, records, "write", *batch_args
                    )
                    figures.setdefault(("send_batch()", name), []).append(figure)
        finally:
            broker.kill()
    for what in ("poll()", "send_batch()"):
        for name in trees:
            rates = [rate for rate, _ in figures[what, name]]
            cpu = statistics.median(c for _, c in figures[what, name])
            print(
                f"{what} {name}: {statistics.median(rates):,.0f} records/s "
                f"({min(rates):,.0f}-{max(rates):,.0f}), client CPU {cpu:.2f} s"
            )
        ratios = [
            n[0] / b[0] for b, n in zip(figures[what, "base"], figures[what, "new"], strict=True)
        ]
        print(
            f"{what} new/base per round: {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} rounds)"
        )


if __name__ == "__main__":
    main()
