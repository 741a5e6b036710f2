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

Then issue 28's default-settings case, on a trio and an asyncio broker, in
`DEFAULTS_ROUNDS` interleaved rounds: one producer's send() of 100-byte records
at acks=all with the SDK's defaults against the settings above (`PRODUCER_CONFIG`),
and each round's ratio; produce p99 in an open loop at 50% of that round's
default-settings rate, with the defaults; and at `LOW_LOAD_PCT`% load with
adaptive batching on and off, to show that it adds no latency at low load.

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
from bench.open_loop import producer_latencies
from bench.stats import percentile
from client import Consumer, Producer, TopicPartition
from client.admin import create_topic
from client.config import ProducerConfig
from harness.broker_process import BrokerProcess, cpu_seconds

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

# Issue 28's default-settings case.
DEFAULTS_ROUNDS = 3
LATENCY_LOAD_PCT = 50
LOW_LOAD_PCT = 10
LATENCY_DURATION_S = 2.0
TREE = Path(__file__).resolve().parent.parent  # the source tree whose client is measured


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
        self.broker_cpu = cpu_seconds(self.pid)

    def stop(self) -> tuple[float, float, float]:
        return (
            time.perf_counter() - self.wall,
            time.process_time() - self.cpu,
            cpu_seconds(self.pid) - self.broker_cpu,
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


# (name, load in % of the default settings' rate, Producer settings) of the open loops.
_ADAPTIVE_OFF: dict[str, Any] = {**DURABLE_CONFIG, "adaptive_batching": False}
LATENCY_CASES = (
    ("p99 at 50%", LATENCY_LOAD_PCT, DURABLE_CONFIG),
    ("p99 at 50%, fixed", LATENCY_LOAD_PCT, _ADAPTIVE_OFF),
    ("p99 low", LOW_LOAD_PCT, DURABLE_CONFIG),
    ("p99 low, fixed", LOW_LOAD_PCT, _ADAPTIVE_OFF),
)


def _send_rate(broker: BrokerProcess, records: int, config: dict[str, Any]) -> tuple[float, float]:
    """(records/s, producer CPU µs per record) of one producer's send() of `records`
    100-byte records into a fresh topic with Producer settings `config`, until acked."""
    topic = f"bench-defaults-{time.monotonic_ns()}"
    create_topic(broker.bootstrap, topic, partitions=1)
    values = [os.urandom(RECORD_SIZE) for _ in range(256)]
    with Producer(broker.bootstrap, **config) as producer:
        producer.partitions_for(topic)
        began, cpu = time.perf_counter(), time.process_time()
        send = producer.send
        for i in range(records):
            send(topic, values[i & 255], partition=0)
        producer.flush()
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
        assert producer.metrics()["records_sent"] == records
    return records / seconds, cpu / records * 1e6


def _p50_p99_ms(broker: BrokerProcess, rate: float, config: dict[str, Any]) -> tuple[float, float]:
    """Produce p50 and p99 in ms, from each record's scheduled send time to its ack, of an open
    loop at `rate` records/s for LATENCY_DURATION_S (bench/open_loop.py)."""
    topic = f"bench-latency-{time.monotonic_ns()}"
    values = [os.urandom(RECORD_SIZE) for _ in range(256)]
    records = max(100, int(rate * LATENCY_DURATION_S))
    latencies = producer_latencies(broker.bootstrap, topic, values, config, rate, records)
    return percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000


def defaults_rows(records: int, rounds: int = DEFAULTS_ROUNDS) -> list[dict[str, Any]]:
    """Issue 28's default-settings case on a trio and an asyncio broker (see the module
    doc): each round measures the default and the tuned rates, then the open loops at
    fractions of that round's default rate, so drift lands on all of them alike."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-client-", dir=".") as tmp:
        for backend in ("trio", "asyncio"):
            broker = BrokerProcess(Path(tmp) / f"data-defaults-{backend}", backend=backend).start()
            got: dict[str, list[float]] = {}
            try:
                for round_ in progress.rounds(rounds, f"default settings, {backend}"):
                    cases = [
                        ("default", DURABLE_CONFIG),
                        ("tuned", PRODUCER_CONFIG),
                        ("fixed", _ADAPTIVE_OFF),
                    ]
                    measured = {
                        name: _send_rate(broker, records, config)
                        for name, config in (cases if round_ % 2 == 0 else cases[::-1])
                    }
                    for name, (rate, cpu) in measured.items():
                        got.setdefault(f"{name} rate", []).append(rate)
                        got.setdefault(f"{name} cpu", []).append(cpu)
                    got.setdefault("ratio", []).append(
                        measured["default"][0] / measured["tuned"][0]
                    )
                    rate = measured["default"][0]
                    for name, load, config in LATENCY_CASES:
                        p50, p99 = _p50_p99_ms(broker, rate * load / 100, config)
                        got.setdefault(name, []).append(p99)
                        got.setdefault(f"{name} p50", []).append(p50)
                        got.setdefault(f"{name} rate", []).append(rate * load / 100)
            finally:
                broker.kill()
            common = {"rounds": rounds, "records": records}
            settings = {
                "default": "default settings",
                "tuned": "batch_size 256 KiB, linger_ms 5",
                "fixed": "default settings but adaptive_batching off (before issue 28)",
            }
            for name, what in settings.items():
                rows.append(
                    {
                        "benchmark": f"one producer send() of 100-byte records, acks=all, "
                        f"{what} ({backend} broker)",
                        "records_per_sec": _median_range(got[f"{name} rate"], 0),
                        "client_cpu_us_per_record": _median_range(got[f"{name} cpu"], 2),
                        "of_tuned": _median_range(got["ratio"], 2) if name == "default" else "",
                        **common,
                    }
                )
            for name, load, config in LATENCY_CASES:
                adaptive = "default settings" if config is DURABLE_CONFIG else "adaptive off"
                rows.append(
                    {
                        "benchmark": f"produce p99 at {load}% of the default rate, "
                        f"{adaptive} ({backend} broker)",
                        "p99_ms": _median_range(got[name], 2),
                        "p50_ms": _median_range(got[f"{name} p50"], 2),
                        "records_per_sec": _median_range(got[f"{name} rate"], 0),
                        "rounds": rounds,
                    }
                )
    return rows


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
    rows += defaults_rows(records // 4)
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
    parser.add_argument(
        "--defaults-only", action="store_true", help="only the default-settings case"
    )
    args = parser.parse_args()
    if args.defaults_only:
        print(markdown(defaults_rows(args.records // 4, args.rounds)))
        return
    if args.base is None:
        print(markdown(run(args.records, args.backend, args.producer_records)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-client-", dir=".") as tmp:
        rows = durable_rows(Path(tmp), args.producer_records, args.rounds, args.base)
    print(markdown(rows))


if __name__ == "__main__":
    main()
