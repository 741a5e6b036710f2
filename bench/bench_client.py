"""End-to-end client throughput against a broker this script starts (harness.broker_process).

Measures, with 100-byte records, an idempotent producer and acks=all:
- per-record `Producer.send()` (records/s, MB/s, until every record is acknowledged),
- `Producer.send_batch()` (lists of 100,000 values per call),
- `Consumer` reading everything back (records/s, MB/s).

Each row also shows the CPU seconds of this process and of the broker, so a
reader can tell who the bottleneck was.

Then issue 14's durable case, on a trio and an asyncio broker: 4 producer
processes, each a `Producer` with the default settings (16 KiB batches) at
acks=all, idempotent, calling send() per 1 KiB record into a partition of its
own. Its rows give MB/s, the producers' CPU per record, the broker's CPU per
16 KiB of records, and the fraction of the fdatasync ceiling measured in the
same rounds (bench_broker's, one fdatasync per 64 writes as in the broker
suite, and per 20: the most batches these producers have in flight at once):
medians of `DURABLE_ROUNDS` rounds with min-max. The same case with larger
`batch_size` (`DURABLE_LARGER_BATCH_BYTES`) shows what the default's 16 KiB
costs: with 5 requests in flight, a batch is what one fsync round can carry.

`run()` returns the rows (for the lead's bench runner); running the file prints
them as a markdown table:

    .venv/bin/python -m bench.bench_client [--records N] [--backend trio|asyncio]
        [--producer-records N]

With `--base TREE` it runs only the durable case, for this tree's client and
TREE's in the same rounds (the broker is this tree's): the before/after of a
client change.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import progress
from bench.bench_broker import WINDOW, fdatasync_ceiling_mb_s
from bench.bench_broker import _cpu_s as cpu_s_schedstat
from client import Consumer, Producer, TopicPartition
from client.admin import create_topic
from client.config import ProducerConfig
from harness.broker_process import BrokerProcess

RECORD_SIZE = 100
MB = 1024 * 1024
# Producer settings of the benchmark: Kafka's defaults except larger batches, which
# acks=all needs because every produce round waits for an fsync.
PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable_idempotence": True,
    "batch_size": 256 * 1024,
    "linger_ms": 5,
    "max_in_flight_requests_per_connection": 5,
}
BATCH_CALL_RECORDS = 100_000

# Issue 14's durable case: producer processes with default settings but acks=all.
DURABLE_PRODUCERS = 4
DURABLE_RECORD_BYTES = 1024
# Broker CPU is reported per this many bytes of records: the default batch, whatever
# batch_size a case uses.
DURABLE_CPU_UNIT_BYTES = 16 * 1024
DURABLE_CONFIG: dict[str, Any] = {"acks": "all", "enable_idempotence": True}
DURABLE_ROUNDS = 3
# What a user tuning the durable case for throughput would raise first.
DURABLE_LARGER_BATCH_BYTES = (64 * 1024, 256 * 1024)
DURABLE_TIMEOUT_S = 600
TREE = Path(__file__).resolve().parent.parent  # the source tree whose client is measured


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _row(name: str, records: int, seconds: float, cpu: float, broker_cpu: float) -> dict[str, Any]:
    return {
        "benchmark": name,
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_sec": round(records / seconds),
        "mb_per_sec": round(records * RECORD_SIZE / MB / seconds, 1),
        "client_cpu_s": round(cpu, 2),
        "broker_cpu_s": round(broker_cpu, 2),
    }


class _Clock:
    def __init__(self, broker: BrokerProcess) -> None:
        assert broker.proc is not None
        self.pid = broker.proc.pid
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        self.broker_cpu = _cpu_seconds(self.pid)

    def stop(self) -> tuple[float, float, float]:
        return (
            time.perf_counter() - self.wall,
            time.process_time() - self.cpu,
            _cpu_seconds(self.pid) - self.broker_cpu,
        )


def bench_send(broker: BrokerProcess, records: int) -> dict[str, Any]:
    values = [os.urandom(RECORD_SIZE) for _ in range(256)]
    with Producer(broker.bootstrap, **PRODUCER_CONFIG) as producer:
        producer.partitions_for("bench-send")
        clock = _Clock(broker)
        send = producer.send
        for i in range(records):
            send("bench-send", values[i & 255], partition=0)
        producer.flush()
        row = _row("producer send()", records, *clock.stop())
        assert producer.metrics()["records_sent"] == records
    return row


def bench_send_batch(broker: BrokerProcess, records: int) -> dict[str, Any]:
    column = [os.urandom(RECORD_SIZE) for _ in range(BATCH_CALL_RECORDS)]
    with Producer(broker.bootstrap, **PRODUCER_CONFIG) as producer:
        producer.partitions_for("bench-batch")
        clock = _Clock(broker)
        futures = []
        for start in range(0, records, BATCH_CALL_RECORDS):
            n = min(BATCH_CALL_RECORDS, records - start)
            futures.append(producer.send_batch("bench-batch", column[:n], partition=0))
        producer.flush()
        row = _row("producer send_batch()", records, *clock.stop())
        assert sum(m.record_count for f in futures for m in f.get(0)) == records
    return row


def bench_consume(broker: BrokerProcess, records: int) -> dict[str, Any]:
    tp = TopicPartition("bench-batch", 0)
    with Consumer(tp, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as c:
        clock = _Clock(broker)
        count = 0
        while count < records:
            for batch in c.poll(timeout_ms=1_000, max_records=1_000_000).values():
                count += len(batch)
        return _row("consumer poll()", count, *clock.stop())


# One producer process of the durable case. Run with `python -c` from a source tree
# (PYTHONPATH), so that `--base` can time another tree's client in the same rounds; it
# only uses the public Producer. argv: bootstrap, topic, partition, records, record
# bytes, config as JSON. It prints "ready", waits for a line on stdin, sends, flushes
# and prints the CPU seconds of the whole process (caller and I/O thread) meanwhile
# and the records per batch it sent.
_PRODUCER_PROCESS = """
import json, os, sys, time
from client import Producer
bootstrap, topic, partition, records, size = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
values = [os.urandom(size) for _ in range(256)]
with Producer(bootstrap, **json.loads(sys.argv[6])) as producer:
    producer.partitions_for(topic)
    print("ready", flush=True)
    sys.stdin.readline()
    cpu = time.process_time()
    send = producer.send
    for i in range(records):
        send(topic, values[i & 255], partition=partition)
    producer.flush()
    cpu = time.process_time() - cpu
    metrics = producer.metrics()
assert metrics["records_sent"] == records, metrics
print(cpu, metrics["batch_size_avg"], flush=True)
"""


def _start_producers(
    tree: Path, bootstrap: str, topic: str, records: int, config: dict[str, Any]
) -> list[Any]:
    """DURABLE_PRODUCERS processes of `tree`'s client with Producer settings `config`, each
    ready to send to its partition."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _PRODUCER_PROCESS,
                *(bootstrap, topic, str(i), str(records), str(DURABLE_RECORD_BYTES)),
                json.dumps(config),
            ],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(DURABLE_PRODUCERS)
    ]
    deadline = time.monotonic() + DURABLE_TIMEOUT_S
    for proc in procs:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready or proc.stdout.readline().strip() != "ready":
            for p in procs:
                p.kill()
            raise RuntimeError("a producer process did not start")
    return procs


def durable_round(
    broker: BrokerProcess, records: int, tree: Path = TREE, batch_size: int | None = None
) -> tuple[float, float, float, float]:
    """(MB/s, producers' CPU µs per record, broker CPU µs per 16 KiB of records, records
    per batch) of DURABLE_PRODUCERS processes of `tree`'s client sending `records` records
    each into a fresh topic, with the default batch_size or `batch_size`."""
    topic = f"bench-durable-{time.monotonic_ns()}"
    create_topic(broker.bootstrap, topic, partitions=DURABLE_PRODUCERS)
    config = DURABLE_CONFIG if batch_size is None else {**DURABLE_CONFIG, "batch_size": batch_size}
    procs = _start_producers(tree, broker.bootstrap, topic, records, config)
    assert broker.proc is not None
    broker_cpu = cpu_s_schedstat(broker.proc.pid)
    began = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=DURABLE_TIMEOUT_S)[0] for proc in procs]
    wall = time.perf_counter() - began
    broker_cpu = cpu_s_schedstat(broker.proc.pid) - broker_cpu
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"a producer process failed: {[p.returncode for p in procs]}")
    results = [tuple(map(float, out.split())) for out in outputs]
    total = DURABLE_PRODUCERS * records
    payload = total * DURABLE_RECORD_BYTES
    return (
        payload / wall / 1e6,
        sum(r[0] for r in results) / total * 1e6,
        broker_cpu / (payload / DURABLE_CPU_UNIT_BYTES) * 1e6,
        statistics.mean(r[1] for r in results),
    )


def _median_range(values: list[float], digits: int = 1) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def durable_rows(
    tmp_path: Path, records: int, rounds: int = DURABLE_ROUNDS, base: Path | None = None
) -> list[dict[str, Any]]:
    """Issue 14's case on a trio and an asyncio broker, side by side, for this tree's
    client with the default and the larger batch sizes, or (with `base`) with the
    default for this tree's client and another tree's. Every round measures both
    fdatasync ceilings and every case (in alternating order), so drift on the machine
    lands on each alike."""
    in_flight = DURABLE_PRODUCERS * ProducerConfig().max_in_flight_requests_per_connection
    n_batches = DURABLE_PRODUCERS * records * DURABLE_RECORD_BYTES // ProducerConfig().batch_size
    backends = ("trio", "asyncio")
    default = ProducerConfig().batch_size
    if base is None:
        runs = [(TREE, size) for size in (default, *DURABLE_LARGER_BATCH_BYTES)]
    else:
        runs = [(base.resolve(), default), (TREE, default)]
    cases = [(backend, tree, size) for backend in backends for tree, size in runs]
    brokers = {
        b: BrokerProcess(tmp_path / f"data-durable-{b}", backend=b).start() for b in backends
    }
    figures: dict[tuple[str, Path, int], list[tuple[float, ...]]] = {case: [] for case in cases}
    ceilings: dict[int, list[float]] = {WINDOW: [], in_flight: []}
    try:
        for round_ in progress.rounds(rounds, "durable producer processes"):
            for group, measured in ceilings.items():
                measured.append(fdatasync_ceiling_mb_s(tmp_path, n_batches, group))
            for backend, tree, size in cases if round_ % 2 == 0 else cases[::-1]:
                figure = durable_round(brokers[backend], records, tree, size)
                figures[(backend, tree, size)].append(figure)
    finally:
        for broker in brokers.values():
            broker.kill()
    rows = []
    for (backend, tree, size), values in figures.items():
        mb_s = [v[0] for v in values]
        row: dict[str, Any] = {
            "benchmark": f"{DURABLE_PRODUCERS} producer processes, send() of 1 KiB records, "
            f"{size // 1024} KiB batches, acks=all, idempotent, one partition each "
            f"({backend} broker)" + ("" if tree == TREE else f", client of {tree}"),
            "batch_size": size,
            "records": DURABLE_PRODUCERS * records,
            "mb_per_sec": _median_range(mb_s),
            "client_cpu_us_per_record": _median_range([v[1] for v in values], 2),
            "broker_cpu_us_per_16kib": _median_range([v[2] for v in values]),
            "records_per_batch": _median_range([v[3] for v in values]),
        }
        for group, ceiling in ceilings.items():
            row[f"fdatasync_ceiling_1_per_{group}_mb_s"] = _median_range(ceiling)
            row[f"of_ceiling_1_per_{group}"] = _median_range(
                [m / c for m, c in zip(mb_s, ceiling, strict=True)], 2
            )
        row["rounds"] = rounds
        rows.append(row)
    return rows


def run(
    records: int = 1_000_000, backend: str = "asyncio", producer_records: int = 50_000
) -> list[dict[str, Any]]:
    """Start a broker in a temporary directory, run the three benchmarks, then the durable
    case with `producer_records` records per producer process; return their rows."""
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", backend=backend).start()
        try:
            for topic in ("bench-send", "bench-batch"):
                create_topic(broker.bootstrap, topic, partitions=1)
            rows = [
                bench_send(broker, records),
                bench_send_batch(broker, records * 3),
                bench_consume(broker, records * 3),
            ]
        finally:
            broker.kill()
    # On the working directory's disk, as the broker suite's ceiling: /tmp may be tmpfs.
    with tempfile.TemporaryDirectory(prefix="bench-client-", dir=".") as tmp:
        return rows + durable_rows(Path(tmp), producer_records)


def markdown(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="asyncio")
    parser.add_argument("--producer-records", type=int, default=50_000)
    parser.add_argument(
        "--base",
        type=Path,
        help="only the durable case, for this tree's client and BASE's (another source "
        "tree, e.g. main's) in the same rounds",
    )
    parser.add_argument("--rounds", type=int, default=DURABLE_ROUNDS)
    args = parser.parse_args()
    if args.base is None:
        print(markdown(run(args.records, args.backend, args.producer_records)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-client-", dir=".") as tmp:
        rows = durable_rows(Path(tmp), args.producer_records, args.rounds, args.base)
    print(markdown(rows))


if __name__ == "__main__":
    main()
