"""Transactions: what they cost a producer, how long a commit takes, what ids cost in memory.

- Throughput: the project's `Producer` with acks=all and idempotence, sending
  100-byte records with `send()`, once without transactions and once committing
  every 100, 1,000 and 10,000 records, rounds interleaved (plain, 100, 1,000,
  10,000, then reversed) so a noisy neighbour hits every case alike; the median
  of `ROUNDS` rounds is reported with its min-max, and each transactional figure
  as a ratio to the plain one of the same run.
- Commit latency: p50/p99 of `commit_transaction()` (the flush of the last
  records, then EndTxn: decision, markers and COMPLETE, each fsynced) over the
  transactions of the 1,000-record case.
- Memory: broker RSS before and after 100,000 transactional ids have each had
  InitProducerId (pipelined over 16 connections, so fsync rounds are shared).

    .venv/bin/python -m bench.bench_txn [--records N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import progress
from bench.bench_broker import _rss_bytes
from client import Producer
from client.admin import create_topic
from harness.broker_process import BrokerProcess
from harness.wire import WireClient

RECORD = b"x" * 100
ROUNDS = 3
TXN_SIZES = (100, 1_000, 10_000)
CONFIG: dict[str, Any] = {"acks": "all", "linger_ms": 5, "batch_size": 256 * 1024}


def _send(bootstrap: str, records: int, txn_size: int | None, latencies: list[float]) -> float:
    """Records per second for `records` sends, committing every `txn_size` when set."""
    extra = {} if txn_size is None else {"transactional_id": f"bench-{txn_size}"}
    with Producer(bootstrap, enable_idempotence=True, **CONFIG, **extra) as producer:
        if txn_size is not None:
            producer.init_transactions()
        started = time.perf_counter()
        sent = 0
        while sent < records:
            n = records - sent if txn_size is None else min(txn_size, records - sent)
            if txn_size is not None:
                producer.begin_transaction()
            for _ in range(n):
                producer.send("bench", RECORD, partition=0)
            if txn_size is None:
                producer.flush()
            else:
                t = time.perf_counter()
                producer.commit_transaction()
                latencies.append(time.perf_counter() - t)
            sent += n
        return records / (time.perf_counter() - started)


def throughput(bootstrap: str, records: int) -> list[dict[str, Any]]:
    cases: list[int | None] = [None, *TXN_SIZES]
    figures: dict[int | None, list[float]] = {c: [] for c in cases}
    latencies: list[float] = []
    for round_ in progress.rounds(ROUNDS, "transactions"):
        for case in cases if round_ % 2 == 0 else cases[::-1]:
            timed = latencies if case == 1_000 else []
            figures[case].append(_send(bootstrap, records, case, timed))
    plain = statistics.median(figures[None])
    rows = []
    for case, values in figures.items():
        median = statistics.median(values)
        rows.append(
            {
                "benchmark": "send() idempotent, no transaction"
                if case is None
                else f"send() in transactions of {case:,} records",
                "records_per_s": median,
                "min_max": f"{min(values):,.0f}-{max(values):,.0f}",
                "vs_plain": f"{median / plain:.2f}x",
            }
        )
    ordered = sorted(latencies)
    rows.append(
        {
            "benchmark": "commit_transaction() latency, 1,000-record transactions",
            "p50_ms": statistics.median(ordered) * 1000,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
            "commits": len(ordered),
        }
    )
    return rows


def rss_with_transactional_ids(broker: BrokerProcess, ids: int = 100_000) -> dict[str, Any]:
    assert broker.proc is not None
    before = _rss_bytes(broker.proc.pid)
    connections = 16

    def init(worker: int) -> None:
        with WireClient(broker.bootstrap, timeout_s=120) as c:
            mine = range(worker, ids, connections)
            window = 256
            pending = 0
            for i in mine:
                c.send("InitProducerId", transactional_id=f"rss-{i:06d}")
                pending += 1
                if pending >= window:
                    assert c.recv()["error"] == 0
                    pending -= 1
            while pending:
                assert c.recv()["error"] == 0
                pending -= 1

    started = time.perf_counter()
    threads = [threading.Thread(target=init, args=(w,)) for w in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    after = _rss_bytes(broker.proc.pid)
    return {
        "benchmark": f"broker RSS for {ids:,} transactional ids",
        "rss_mb": after / 2**20,
        "growth_mb": (after - before) / 2**20,
        "bytes_per_id": (after - before) / ids,
        "inits_per_s": ids / seconds,
    }


def run(records: int = 20_000) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            create_topic(broker.bootstrap, "bench", 1)
            rows = throughput(broker.bootstrap, records)
            rows.append(rss_with_transactional_ids(broker))
            return rows
        finally:
            broker.kill()


def main() -> None:
    from bench.__main__ import table

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    print(table(run(parser.parse_args().records)))


if __name__ == "__main__":
    main()
