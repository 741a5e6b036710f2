"""Transactions: what they cost a producer, how long a commit takes, what the
consume-transform-produce loop does, what ids cost in memory. Each figure is taken
against a broker of each backend (trio, asyncio), and compared within the backend.

- Throughput: the project's `Producer` with acks=all and idempotence, sending
  100-byte records with `send()`, once without transactions and once committing
  every 100, 1,000 and 10,000 records, rounds interleaved (plain, 100, 1,000,
  10,000, then reversed) so a noisy neighbour hits every case alike; the median
  of `ROUNDS` rounds is reported with its min-max, and each transactional figure
  as a ratio to the plain one of the same backend and run.
- Commit latency: p50/p99 of `commit_transaction()` (the last records' Produce
  with EndTxn behind it in the same write: the batches, the decision and the
  markers in one fsync round, then COMPLETE) over the transactions of the
  1,000-record case, beside one fsync round: the median time of a 100 KiB
  append and its fdatasync in the broker's data dir, sampled between the rounds.
- The consume-transform-produce loop of examples/exactly_once_loop.py (poll a
  batch read_committed, send each record's transform, send the offsets to the
  transaction, commit) with batches of 5 and of 500 records, in records/s, its
  median and min-max over the rounds.
- Memory: broker RSS before and after 100,000 transactional ids have each had
  InitProducerId (pipelined over 16 connections, so fsync rounds are shared).
- Round trip (issue 40, target 1): a Metadata request for every topic from a
  blocking socket (pre-encoded, the frame the SDK sends) against the same request
  through the sync SDK (`Consumer.topics()`: made on the caller's thread over a
  blocking connection of its own, client/connection.py `DirectRequests`), through
  the event loop as the SDK made it before (`PortalThread.call` into the core: the
  caller's thread, the loop's, the connection and back), and through the crossing
  before that (`BlockingPortal.call` into the same core), `RT_CALLS` calls per case
  and round in rotating order; the median of every call with p10-p90, and the median
  of each round's ratio to the raw socket's, with its range.

    .venv/bin/python -m bench.bench_txn [--records N]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench import progress
from bench.bench_broker import _rss_bytes
from client import Consumer, Producer
from client.admin import create_topic
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from protocol.framing import LENGTH
from protocol.messages import MetadataRequest, encode_request

RECORD = b"x" * 100
ROUNDS = 3
TXN_SIZES = (100, 1_000, 10_000)
LOOP_BATCHES = (5, 500)
RT_CALLS = 1_000
BACKENDS = ("trio", "asyncio")
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


def fsync_round_s(data_dir: Path, samples: int = 20) -> list[float]:
    """Times of a 100 KiB append and its fdatasync, in the broker's data dir: what one
    fsync round of the broker costs on this disk just now."""
    path = data_dir / "fsync-probe"
    block = b"x" * (100 * 1024)
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(samples):
            started = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return times


def _loop(bootstrap: str, topic: str, batch: int, records: int, tag: str) -> float:
    """Records per second through examples/exactly_once_loop.py's shape: each poll of at
    most `batch` records from `topic` is transformed to `<topic>-out`, its offsets sent
    to the transaction, and committed."""
    with (
        Producer(bootstrap, transactional_id=f"loop-{tag}", linger_ms=5) as producer,
        Consumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"loop-{tag}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        ) as consumer,
    ):
        producer.init_transactions()
        done = 0
        started = 0.0
        while done < records:
            polled = consumer.poll(timeout_ms=1_000, max_records=batch)
            if not polled:
                continue
            if not started:
                started = time.perf_counter()
            producer.begin_transaction()
            for items in polled.values():
                for record in items:
                    producer.send(f"{topic}-out", (record.value or b"").upper(), key=record.key)
            offsets = {tp: items[-1].offset + 1 for tp, items in polled.items()}
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
            done += sum(len(items) for items in polled.values())
        return done / (time.perf_counter() - started)


def _raw_round_trips_s(bootstrap: str, calls: int) -> list[float]:
    """Times of `calls` Metadata round trips (every topic) from a blocking socket."""
    host, port = bootstrap.rsplit(":", 1)
    frame = encode_request(MetadataRequest(topics=None), 1, None)
    frame = LENGTH.pack(len(frame)) + frame
    times = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(calls):
            started = time.perf_counter()
            sock.sendall(frame)
            answer = sock.recv(65536)
            (length,) = LENGTH.unpack_from(answer)
            while len(answer) < LENGTH.size + length:
                answer += sock.recv(65536)
            times.append(time.perf_counter() - started)
    return times


def _sdk_round_trips_s(call: Callable[[], object], calls: int) -> list[float]:
    """Times of `calls` Metadata round trips through the sync SDK (`call()`)."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def round_trips(broker: BrokerProcess, calls: int = RT_CALLS) -> list[dict[str, Any]]:
    """Issue 40's target 1: a request's round trip through the sync SDK beside a raw
    socket's, and beside the same call made through the event loop, crossing threads
    as the SDK did before (`PortalThread.call`) and before issue 40
    (`BlockingPortal.call`), in rotating order per round."""
    backend = broker.backend
    with Consumer(("bench", 0), bootstrap_servers=broker.bootstrap) as consumer:
        consumer.topics()  # connected
        cases: dict[str, Callable[[], list[float]]] = {
            "raw socket": partial(_raw_round_trips_s, broker.bootstrap, calls),
            "sync SDK, Consumer.topics()": partial(_sdk_round_trips_s, consumer.topics, calls),
            "sync SDK through the event loop (PortalThread.call)": partial(
                _sdk_round_trips_s,
                # The path before lookups ran on the caller's thread: the A/B of one run.
                partial(consumer._thread.call, consumer._core.topics),
                calls,
            ),
            "sync SDK through BlockingPortal.call (before issue 40)": partial(
                _sdk_round_trips_s,
                # The old crossing into the same core: the A/B of the same run.
                partial(consumer._portal.call, consumer._core.topics),
                calls,
            ),
        }
        names = list(cases)
        times: dict[str, list[float]] = {name: [] for name in names}
        medians: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(2 * ROUNDS):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order[::-1] if round_ % 2 else order:
                got = cases[name]()
                times[name] += got
                medians[name].append(statistics.median(got))
    rows = []
    for name in names:
        ordered = sorted(times[name])
        ratios = [a / b for a, b in zip(medians[name], medians["raw socket"], strict=True)]
        rows.append(
            {
                "benchmark": f"round trip, Metadata, {name} ({backend})",
                "p50_us": statistics.median(ordered) * 1e6,
                "p10_p90_us": f"{ordered[len(ordered) // 10] * 1e6:.0f}-"
                f"{ordered[len(ordered) * 9 // 10] * 1e6:.0f}",
                "vs_raw": f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
            }
        )
    return rows


def throughput(broker: BrokerProcess, records: int) -> list[dict[str, Any]]:
    bootstrap, backend = broker.bootstrap, broker.backend
    cases: list[int | None] = [None, *TXN_SIZES]
    figures: dict[int | None, list[float]] = {c: [] for c in cases}
    loops: dict[int, list[float]] = {b: [] for b in LOOP_BATCHES}
    latencies: list[float] = []
    fsyncs: list[float] = []
    for round_ in progress.rounds(ROUNDS, f"transactions {backend}"):
        for case in cases if round_ % 2 == 0 else cases[::-1]:
            timed = latencies if case == 1_000 else []
            figures[case].append(_send(bootstrap, records, case, timed))
            fsyncs += fsync_round_s(broker.data_dir)
        for batch in LOOP_BATCHES:
            # Each round reads its own input, filled beforehand, so the loop's
            # consumer never waits for records.
            count = max(batch * 20, records // 2 if batch > 5 else records // 20)
            topic = f"loop-{backend}-{batch}-{round_}"
            create_topic(bootstrap, topic, 1)
            create_topic(bootstrap, f"{topic}-out", 1)
            with Producer(bootstrap, enable_idempotence=True, **CONFIG) as filler:
                for i in range(count):
                    filler.send(topic, RECORD, key=b"%d" % i, partition=0)
            loops[batch].append(_loop(bootstrap, topic, batch, count, f"{batch}-{round_}"))
    plain = statistics.median(figures[None])
    rows = []
    for case, values in figures.items():
        median = statistics.median(values)
        rows.append(
            {
                "benchmark": f"send() idempotent, no transaction ({backend})"
                if case is None
                else f"send() in transactions of {case:,} records ({backend})",
                "records_per_s": median,
                "min_max": f"{min(values):,.0f}-{max(values):,.0f}",
                "vs_plain": f"{median / plain:.2f}x",
                "vs_plain_min_max": f"{min(values) / plain:.2f}-{max(values) / plain:.2f}x",
            }
        )
    ordered = sorted(latencies)
    rows.append(
        {
            "benchmark": f"commit_transaction() latency, 1,000-record transactions ({backend})",
            "p50_ms": statistics.median(ordered) * 1000,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
            "commits": len(ordered),
            "fsync_round_p50_ms": statistics.median(fsyncs) * 1000,
        }
    )
    for batch, values in loops.items():
        rows.append(
            {
                "benchmark": f"consume-transform-produce, batches of {batch} ({backend})",
                "records_per_s": statistics.median(values),
                "min_max": f"{min(values):,.0f}-{max(values):,.0f}",
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
    rows: list[dict[str, Any]] = []
    for backend in BACKENDS:
        with tempfile.TemporaryDirectory(dir=".") as tmp:
            broker = BrokerProcess(Path(tmp) / "data", backend=backend).start()
            try:
                create_topic(broker.bootstrap, "bench", 1)
                rows += round_trips(broker)
                rows += throughput(broker, records)
                if backend == BACKENDS[0]:
                    rows.append(rss_with_transactional_ids(broker))
            finally:
                broker.kill()
    return rows


def main() -> None:
    from bench.__main__ import table

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    print(table(run(parser.parse_args().records)))


if __name__ == "__main__":
    main()
