"""End-to-end client throughput against a broker this script starts (harness.broker_process).

Measures, with 100-byte records, an idempotent producer and acks=all:
- per-record `Producer.send()` (records/s, MB/s, until every record is acknowledged),
- `Producer.send_batch()` (lists of 100,000 values per call),
- `Consumer` reading everything back (records/s, MB/s).

Each row also shows the CPU seconds of this process and of the broker, so a
reader can tell who the bottleneck was. `run()` returns the rows (for the
lead's bench runner); running the file prints them as a markdown table:

    .venv/bin/python -m bench.bench_client [--records N] [--backend trio|asyncio]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from client import Consumer, Producer, TopicPartition
from client.admin import create_topic
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


def run(records: int = 1_000_000, backend: str = "asyncio") -> list[dict[str, Any]]:
    """Start a broker in a temporary directory, run the three benchmarks, return their rows."""
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", backend=backend).start()
        try:
            for topic in ("bench-send", "bench-batch"):
                create_topic(broker.bootstrap, topic, partitions=1)
            return [
                bench_send(broker, records),
                bench_send_batch(broker, records * 3),
                bench_consume(broker, records * 3),
            ]
        finally:
            broker.kill()


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="asyncio")
    args = parser.parse_args()
    print(markdown(run(args.records, args.backend)))


if __name__ == "__main__":
    main()
