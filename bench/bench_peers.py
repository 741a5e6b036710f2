"""minibroker against real peer servers in one run: Redis Streams and NATS JetStream.

Three measurements, 100-byte records, every system started here on 127.0.0.1:
- produce throughput: minibroker's per-record `Producer.send()` (acks=all idempotent,
  and acks=1), redis-py pipelined XADD (AOF always, AOF everysec), nats-py
  `publish_async` to a file-storage JetStream stream (with and without Nats-Msg-Id);
- consume throughput on the same data: minibroker's `Consumer` from the beginning,
  Redis XRANGE in chunks, a JetStream pull consumer fetching in batches;
- latency, open loop at 25/50/75% of each system's own throughput of this run,
  each record timed from its scheduled send time (not its actual send, so a stall
  is not hidden by coordinated omission) to its acknowledgement.

Each figure is the median of `runs` rounds with min-max; rounds interleave the
systems in ABBA order within a durability class. Every row names its durability
class, and targets compare like with like (or say that they do not). A peer whose
server or client library cannot be had gets rows saying why it was skipped.

Durability classes, as each server acknowledges:
- minibroker acks=all: fdatasync before the ack, one fsync round for every batch
  appended before it (broker/partitions/group_commit.py); acks=1: written, not fsynced.
- Redis `appendfsync always`: the AOF is written and fsynced once per event-loop pass,
  before that pass's replies go out (a 1,000-XADD pipeline spans several passes);
  `everysec`: a background fsync every second.
- nats-server from Debian (2.9.x) rejects `sync_interval` (added in 2.10, with `always`
  for an fsync per write); strace showed 2,000 acknowledged publishes as 2,001 pwrite64
  and no fsync: page cache only, flushed on the server's own timer.

minibroker's open-loop ack times are per batch: every record of a batch is acknowledged
at once, so one done callback per batch, run on the producer's I/O thread, gives each
record's time (see `AckTimes` in bench/open_loop.py).

    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_peers --scale 0.1 [--out DIR]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench import progress
from bench.bench_client import PRODUCER_CONFIG, cpu_seconds
from bench.open_loop import (
    ACK_WAIT_S,
    producer_latencies,
    records_due,
    run_open_loop,
    scheduled_latencies,
)
from bench.peers_servers import NatsServer, RedisServer, find_binary
from bench.stats import min_max, percentile
from client import Consumer, Producer, TopicPartition
from client.admin import create_topic
from harness.broker_process import BrokerProcess

RECORD_BYTES = 100
RUNS = 3
LOADS_PCT = (25, 50, 75)
PRODUCE_RECORDS = 300_000  # per round at scale 1, each round also bounded in time
REDIS_PIPELINE_DEPTH = 1_000
NATS_MAX_PENDING = 4_000  # nats-py's default publish_async_max_pending
READ_CHUNK = 5_000  # records per XRANGE and per JetStream fetch
# The Producer settings of bench/bench_client.py (what a user tuning for acks=all would
# set: 256 KiB batches, linger_ms 5); acks=1 is the same without idempotence, which
# Kafka's rules tie to acks=all.
MB_ACKS_ALL = dict(PRODUCER_CONFIG)
MB_ACKS_1 = {**PRODUCER_CONFIG, "acks": 1, "enable_idempotence": False}

FSYNC_GROUP = "fsync before ack, group commit"
FSYNC_SECOND = "fsync every second"
PAGE_CACHE = "page cache only"
CLASS_ORDER = (FSYNC_GROUP, FSYNC_SECOND, PAGE_CACHE)

MB_ALL = "minibroker trio acks=all idempotent"
MB_1 = "minibroker trio acks=1"
MB_ALL_LINGER0 = "minibroker trio acks=all idempotent, linger_ms 0"
MB_ALL_LINGER1 = "minibroker trio acks=all idempotent, linger_ms 1"
MB_ALL_SWITCH = "minibroker trio acks=all idempotent, switch interval 0.5 ms"
# CPython's default: a thread that wants the GIL waits this long before it asks the
# holder to let go (bench/trace_latency.py: the producer's I/O thread waits on the
# caller's thread, and that wait is the latency tail).
SWITCH_INTERVAL_S = 0.0005
REDIS_ALWAYS = "redis XADD AOF always"
REDIS_EVERYSEC = "redis XADD AOF everysec"
NATS_PLAIN = "nats JetStream"
NATS_MSGID = "nats JetStream Msg-Id"
LATENCY_CASES = (
    MB_ALL,
    MB_ALL_LINGER0,
    MB_ALL_LINGER1,
    MB_ALL_SWITCH,
    MB_1,
    REDIS_ALWAYS,
    REDIS_EVERYSEC,
    NATS_MSGID,
)
CONSUME_CASES = {MB_ALL: "minibroker Consumer", REDIS_ALWAYS: "redis XRANGE", NATS_MSGID: "nats"}


@dataclass
class Case:
    """One system in one configuration: how it produces, reads and is timed open loop."""

    label: str
    durability: str
    how: str
    # (stream, records, max_s) -> (records sent, seconds from the first send to the last ack)
    produce: Callable[[str, int, float], tuple[int, float]] | None = None
    open_loop: Callable[[str, float, int], list[float]] | None = None  # -> latencies in s
    # (stream, records) -> (records read, seconds after connecting)
    consume: Callable[[str, int], tuple[int, float]] | None = None
    skipped: str = ""
    rate_of: str = ""  # the case whose throughput sets the open-loop rates (default: its own)
    server_pid: int = 0  # whose CPU time the produce rows report
    streams: list[tuple[str, int]] = field(default_factory=list)  # (name, records) written

    def skip(self, reason: str) -> None:
        self.skipped = self.skipped or reason

    def name(self, what: str) -> str:
        """A topic, stream key or subject token of this case's own: cases share servers."""
        return re.sub(r"[^a-z0-9]+", "-", self.label.lower()).strip("-") + "-" + what


# ---------------------------------------------------------------------------- schedule


def _chunks_until(records: int, deadline: float) -> Iterator[range]:
    """Record indexes in chunks of 1,024, until all `records` or the perf_counter
    `deadline`: a produce round bounded in count and in time."""
    sent = 0
    while sent < records and time.perf_counter() < deadline:
        stop = min(records, sent + 1024)
        yield range(sent, stop)
        sent = stop


def _values() -> list[bytes]:
    return [os.urandom(RECORD_BYTES) for _ in range(256)]


# ---------------------------------------------------------------------------- minibroker


def minibroker_cases(broker: BrokerProcess, backend: str) -> list[Case]:
    """trio: every measurement, and the acks=all open loop three more times at the rates
    of the default settings: with linger_ms 0 and 1, to show what linger costs and what
    a user tuning for latency would get, and with CPython's switch interval at 0.5 ms,
    to show what the wait for the GIL costs; asyncio: produce."""
    values = _values()
    bootstrap = broker.bootstrap

    def produce(config: dict[str, Any]) -> Callable[[str, int, float], tuple[int, float]]:
        def run(topic: str, records: int, max_s: float) -> tuple[int, float]:
            create_topic(bootstrap, topic, partitions=1)
            with Producer(bootstrap, **config) as producer:
                producer.partitions_for(topic)
                send = producer.send
                started = time.perf_counter()
                sent = 0
                for chunk in _chunks_until(records, started + max_s):
                    for i in chunk:
                        send(topic, values[i & 255], partition=0)
                    sent = chunk.stop
                producer.flush(ACK_WAIT_S)
                seconds = time.perf_counter() - started
                assert producer.metrics()["records_sent"] == sent
            return sent, seconds

        return run

    def open_loop(
        config: dict[str, Any], switch_interval_s: float | None = None
    ) -> Callable[[str, float, int], list[float]]:
        def run(topic: str, rate: float, records: int) -> list[float]:
            default_switch_s = sys.getswitchinterval()
            sys.setswitchinterval(switch_interval_s or default_switch_s)
            try:
                return timed(topic, rate, records)
            finally:
                sys.setswitchinterval(default_switch_s)

        def timed(topic: str, rate: float, records: int) -> list[float]:
            return producer_latencies(bootstrap, topic, values, config, rate, records)

        return run

    def consume(topic: str, records: int) -> tuple[int, float]:
        tp = TopicPartition(topic, 0)
        with Consumer(tp, bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
            started = time.perf_counter()
            deadline = started + ACK_WAIT_S
            count = 0
            while count < records and time.perf_counter() < deadline:
                for batch in c.poll(timeout_ms=1_000, max_records=records - count).values():
                    count += len(batch)
            return count, time.perf_counter() - started

    how = "Producer.send() per record, batch_size 256 KiB, linger_ms 5, 5 in flight"
    if backend != "trio":
        return [
            Case(
                f"minibroker {backend} acks=all idempotent", FSYNC_GROUP, how, produce(MB_ACKS_ALL)
            ),
            Case(f"minibroker {backend} acks=1", PAGE_CACHE, how, produce(MB_ACKS_1)),
        ]
    return [
        Case(MB_ALL, FSYNC_GROUP, how, produce(MB_ACKS_ALL), open_loop(MB_ACKS_ALL), consume),
        Case(MB_1, PAGE_CACHE, how, produce(MB_ACKS_1), open_loop(MB_ACKS_1)),
        *(
            Case(
                name,
                FSYNC_GROUP,
                how.replace("linger_ms 5", f"linger_ms {linger_ms}"),
                open_loop=open_loop({**MB_ACKS_ALL, "linger_ms": linger_ms}),
                rate_of=MB_ALL,
            )
            for name, linger_ms in ((MB_ALL_LINGER0, 0), (MB_ALL_LINGER1, 1))
        ),
        Case(
            MB_ALL_SWITCH,
            FSYNC_GROUP,
            how + ", sys.setswitchinterval(0.0005) in the producer's process",
            open_loop=open_loop(MB_ACKS_ALL, SWITCH_INTERVAL_S),
            rate_of=MB_ALL,
        ),
    ]


# ---------------------------------------------------------------------------- redis


def redis_case(server: RedisServer, label: str, durability: str) -> Case:
    import redis

    values = _values()

    def client() -> redis.Redis:
        # redis-py picks hiredis as its parser when it is installed.
        return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=ACK_WAIT_S)

    def xadd(r: redis.Redis, stream: str, first: int, stop: int, acked: list[float]) -> None:
        """Pipelines of up to REDIS_PIPELINE_DEPTH XADDs, one at a time; each pipeline's
        records are acknowledged when its replies are in (stamped in `acked`, if given)."""
        for start in range(first, stop, REDIS_PIPELINE_DEPTH):
            end = min(stop, start + REDIS_PIPELINE_DEPTH)
            pipe = r.pipeline(transaction=False)
            for i in range(start, end):
                pipe.xadd(stream, {b"v": values[i & 255]})
            pipe.execute()
            if acked:
                acked[start:end] = [time.perf_counter()] * (end - start)

    def produce(stream: str, records: int, max_s: float) -> tuple[int, float]:
        with client() as r:
            r.ping()
            started = time.perf_counter()
            deadline = started + max_s
            sent = 0
            while sent < records and time.perf_counter() < deadline:
                stop = min(records, sent + REDIS_PIPELINE_DEPTH)
                xadd(r, stream, sent, stop, [])
                sent = stop
            seconds = time.perf_counter() - started
            assert r.xlen(stream) == sent
        return sent, seconds

    def open_loop(stream: str, rate: float, records: int) -> list[float]:
        acked = [0.0] * records
        with client() as r:
            r.ping()

            t0 = run_open_loop(partial(xadd, r, stream, acked=acked), rate, records)
        return scheduled_latencies(acked, t0, rate, time.perf_counter())

    def consume(stream: str, records: int) -> tuple[int, float]:
        with client() as r:
            r.ping()
            start = "-"
            count = 0
            started = time.perf_counter()
            deadline = started + ACK_WAIT_S
            while count < records and time.perf_counter() < deadline:
                entries = r.xrange(stream, min=start, count=min(READ_CHUNK, records - count))
                if not entries:
                    break
                count += len(entries)
                start = "(" + entries[-1][0].decode()
            return count, time.perf_counter() - started

    how = f"redis-py + hiredis, pipeline(transaction=False) of {REDIS_PIPELINE_DEPTH:,} XADD"
    return Case(label, durability, how, produce, open_loop, consume)


# ---------------------------------------------------------------------------- nats


def nats_cases(server: NatsServer) -> list[Case]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    values = _values()
    streams = {"PLAIN": "plain", "MSGID": "msgid"}

    async def connect() -> nats.NATS:
        # A server gone mid-run fails the case within seconds, not after a minute of retries.
        return await nats.connect(server.url, connect_timeout=5, max_reconnect_attempts=1)

    async def setup() -> None:
        nc = await connect()
        try:
            js = nc.jetstream()
            for name, prefix in streams.items():
                await js.add_stream(name=name, subjects=[f"{prefix}.>"], storage=StorageType.FILE)
        finally:
            await nc.close()

    asyncio.run(setup())

    def headers(msg_id: bool, subject: str, i: int) -> dict[str, str] | None:
        return {"Nats-Msg-Id": f"{subject}-{i}"} if msg_id else None

    def produce(msg_id: bool) -> Callable[[str, int, float], tuple[int, float]]:
        stream = "MSGID" if msg_id else "PLAIN"

        async def main(subject: str, records: int, max_s: float) -> tuple[int, float]:
            nc = await connect()
            try:
                js = nc.jetstream(publish_async_max_pending=NATS_MAX_PENDING)
                before = (await js.stream_info(stream)).state.messages
                started = time.perf_counter()
                sent = 0
                for chunk in _chunks_until(records, started + max_s):
                    for i in chunk:
                        hdr = headers(msg_id, subject, i)
                        await js.publish_async(subject, values[i & 255], headers=hdr)
                    sent = chunk.stop
                await asyncio.wait_for(js.publish_async_completed(), ACK_WAIT_S)
                seconds = time.perf_counter() - started
                assert (await js.stream_info(stream)).state.messages - before == sent
                return sent, seconds
            finally:
                await nc.close()

        def run(name: str, records: int, max_s: float) -> tuple[int, float]:
            return asyncio.run(main(f"{streams[stream]}.{name}", records, max_s))

        return run

    def open_loop(name: str, rate: float, records: int) -> list[float]:
        async def main() -> list[float]:
            subject = f"msgid.{name}"
            acked = [0.0] * records
            clock = time.perf_counter
            nc = await connect()
            try:
                js = nc.jetstream(publish_async_max_pending=NATS_MAX_PENDING)

                def delivered(k: int, future: asyncio.Future[Any]) -> None:
                    if not future.cancelled() and future.exception() is None:
                        acked[k] = clock()

                t0 = clock() + 0.005
                deadline = t0 + records / rate + ACK_WAIT_S
                sent = 0
                while sent < records and clock() < deadline:
                    due = records_due(t0, rate, records, clock())
                    for i in range(sent, due):
                        hdr = headers(True, subject, i)
                        future = await js.publish_async(subject, values[i & 255], headers=hdr)
                        future.add_done_callback(partial(delivered, i))
                    sent = max(sent, due)
                    await asyncio.sleep(max(0.0, t0 + sent / rate - clock()))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(js.publish_async_completed(), ACK_WAIT_S)
                return scheduled_latencies(acked, t0, rate, clock())
            finally:
                await nc.close()

        return asyncio.run(main())

    def consume(name: str, records: int) -> tuple[int, float]:
        async def main() -> tuple[int, float]:
            nc = await connect()
            try:
                js = nc.jetstream()
                config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
                sub = await js.pull_subscribe(
                    f"msgid.{name}", durable=None, stream="MSGID", config=config
                )
                count = 0
                started = time.perf_counter()
                deadline = started + ACK_WAIT_S
                while count < records and time.perf_counter() < deadline:
                    msgs = await sub.fetch(batch=min(READ_CHUNK, records - count), timeout=5)
                    count += len(msgs)
                seconds = time.perf_counter() - started
                await sub.unsubscribe()
                return count, seconds
            finally:
                await nc.close()

        return asyncio.run(main())

    durability = f"{PAGE_CACHE} (nats-server {server.version()}, no fsync per write)"
    how = f"nats-py js.publish_async, up to {NATS_MAX_PENDING:,} acks pending"
    return [
        Case(NATS_PLAIN, durability, how, produce(False)),
        Case(
            NATS_MSGID, durability, how + ", Nats-Msg-Id header", produce(True), open_loop, consume
        ),
    ]


# ---------------------------------------------------------------------------- rows


def _rate_row(name: str, case: Case, values: list[float]) -> dict[str, Any]:
    """The columns every records/s row has: median, min-max and MB/s of its runs."""
    return {
        "benchmark": name,
        "durability": case.durability,
        "median": round(statistics.median(values)),
        "min_max": min_max(values, 0),
        "runs": len(values),
        "unit": "records/s",
        "mb_per_s": round(statistics.median(values) * RECORD_BYTES / 1e6, 1),
    }


def _skipped_row(benchmark: str, case: Case, unit: str) -> dict[str, Any]:
    return {
        "benchmark": benchmark,
        "durability": case.durability,
        "median": f"skipped: {case.skipped}",
        "min_max": "",
        "runs": 0,
        "unit": unit,
        "how": case.how,
    }


def _abba(cases: list[Case], round_index: int) -> list[Case]:
    return cases if round_index % 2 == 0 else cases[::-1]


def _measure(case: Case, what: str, action: Callable[[], Any]) -> Any:
    """Run one measurement; a failure skips the case from here on, with the reason."""
    if case.skipped:
        return None
    try:
        return action()
    except Exception as exc:
        case.skip(f"{what} failed: {type(exc).__name__}: {exc}"[:200])
        return None


def _produce_rounds(
    cases: list[Case], scale: float, runs: int
) -> tuple[dict[str, list[float]], dict[str, list[tuple[float, float]]]]:
    """Records/s of every produce round, and CPU µs per record of this process (the
    client) and of the server, per case."""
    records = max(10_000, int(PRODUCE_RECORDS * scale))
    max_s = max(1.5, 5.0 * scale)
    rates: dict[str, list[float]] = {c.label: [] for c in cases}
    cpu: dict[str, list[tuple[float, float]]] = {c.label: [] for c in cases}
    for durability in CLASS_ORDER:  # one class at a time: fsync cost lands on its own class
        group = [c for c in cases if c.durability.startswith(durability) and c.produce]
        for r in progress.rounds(runs, f"produce, {durability}"):
            for case in _abba(group, r):
                stream = case.name(f"tput-{len(case.streams)}")
                assert case.produce is not None
                client_cpu, server_cpu = time.process_time(), cpu_seconds(case.server_pid)
                got = _measure(case, "produce", partial(case.produce, stream, records, max_s))
                if got:
                    sent, seconds = got
                    rates[case.label].append(sent / seconds)
                    cpu[case.label].append(
                        (
                            (time.process_time() - client_cpu) / sent * 1e6,
                            (cpu_seconds(case.server_pid) - server_cpu) / sent * 1e6,
                        )
                    )
                    case.streams.append((stream, sent))
    return rates, cpu


def run(scale: float = 1.0) -> list[dict[str, Any]]:
    """Start minibroker and the peers, measure, stop them all; the rows (see module doc)."""
    runs = RUNS
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        cases: list[Case] = []
        for backend in ("trio", "asyncio"):
            broker = BrokerProcess(Path(tmp) / backend, backend=backend)
            stack.callback(broker.kill)
            for case in minibroker_cases(broker.start(), backend):
                assert broker.proc is not None
                case.server_pid = broker.proc.pid
                cases.append(case)
        cases += _peer_cases(stack)
        load_before = os.getloadavg()[0]
        rows = _measure_all(cases, scale, runs)
        loads = (load_before, os.getloadavg()[0])
        rows.append(
            {
                "benchmark": "machine load (1-minute load average) at start and end",
                "durability": "",
                "median": round(statistics.mean(loads), 1),
                "min_max": min_max(loads, 1),
                "runs": 2,
                "unit": "runnable tasks",
                "how": f"os.getloadavg() on {os.cpu_count()} cores, shared with other benchmarks",
            }
        )
        return rows


def _peer_cases(stack: contextlib.ExitStack) -> list[Case]:
    """Start the peer servers (registered on `stack` to be killed); cases that cannot be
    had come back skipped, with the reason."""
    cases: list[Case] = []
    redis_labels = (
        (REDIS_ALWAYS, "always", FSYNC_GROUP),
        (REDIS_EVERYSEC, "everysec", FSYNC_SECOND),
    )
    redis_how = f"redis-py + hiredis, pipeline(transaction=False) of {REDIS_PIPELINE_DEPTH:,} XADD"
    binary, reason = find_binary("redis-server", "redis-server")
    try:
        import redis  # noqa: F401
    except ImportError:
        reason = reason or "python package redis not installed (the bench extra)"
    for label, fsync, durability in redis_labels:
        durability = f"{durability} (appendfsync {fsync})"
        if binary is None or reason:
            cases.append(Case(label, durability, redis_how, skipped=reason))
            continue
        try:
            server = stack.enter_context(RedisServer(binary, fsync))
            server.start()
            cases.append(redis_case(server, label, durability))
            cases[-1].server_pid = server.pid
        except Exception as exc:
            cases.append(Case(label, durability, redis_how, skipped=f"{exc}"[:200]))

    binary, reason = find_binary("nats-server", "nats-server")
    try:
        import nats  # noqa: F401
    except ImportError:
        reason = reason or "python package nats-py not installed (the bench extra)"
    nats_how = "nats-py js.publish_async"
    if binary is None or reason:
        return cases + [
            Case(n, PAGE_CACHE, nats_how, skipped=reason) for n in (NATS_PLAIN, NATS_MSGID)
        ]
    try:
        nats_server = stack.enter_context(NatsServer(binary))
        nats_server.start()
        for case in nats_cases(nats_server):
            case.server_pid = nats_server.pid
            cases.append(case)
    except Exception as exc:
        cases += [
            Case(n, PAGE_CACHE, nats_how, skipped=f"{exc}"[:200]) for n in (NATS_PLAIN, NATS_MSGID)
        ]
    return cases


def _measure_all(cases: list[Case], scale: float, runs: int) -> list[dict[str, Any]]:
    by_label = {c.label: c for c in cases}
    rows: list[dict[str, Any]] = []

    # 1. produce throughput
    rates, cpu = _produce_rounds(cases, scale, runs)
    records = max(10_000, int(PRODUCE_RECORDS * scale))
    for case in cases:
        if case.rate_of:  # an open-loop variant of another case: no produce rounds of its own
            continue
        name = f"produce {case.label}"
        if case.skipped or not rates[case.label]:
            rows.append(_skipped_row(name, case, "records/s"))
            continue
        values = rates[case.label]
        rows.append(
            {
                **_rate_row(name, case, values),
                "client_cpu_us_per_record": round(
                    statistics.median(c for c, _ in cpu[case.label]), 2
                ),
                "server_cpu_us_per_record": round(
                    statistics.median(s for _, s in cpu[case.label]), 2
                ),
                "how": case.how,
            }
        )

    # 2. consume the data of each system's first produce round
    consumers = [by_label[label] for label in CONSUME_CASES if label in by_label]
    readable = [c for c in consumers if not c.skipped and c.streams]
    target = min([records, *(c.streams[0][1] for c in readable)])
    read_rates: dict[str, list[float]] = {c.label: [] for c in consumers}
    for r in progress.rounds(runs, "consume"):
        for case in _abba(readable, r):
            assert case.consume is not None
            got = _measure(case, "consume", partial(case.consume, case.streams[0][0], target))
            if got:
                count, seconds = got
                read_rates[case.label].append(count / seconds)
    for case in consumers:
        name = f"consume {CONSUME_CASES[case.label]}"
        values = read_rates[case.label]
        if case.skipped or not values:
            rows.append(_skipped_row(name, case, "records/s"))
            continue
        rows.append(
            {
                **_rate_row(name, case, values),
                "how": f"{target:,} records from the start, chunks of {READ_CHUNK:,}"
                if case.label != MB_ALL
                else f"{target:,} records from the start, poll()",
            }
        )

    # 3. latency, open loop at a fraction of each system's own throughput
    duration_s = max(0.5, 3.0 * scale)
    lat_cases = [by_label[label] for label in LATENCY_CASES if label in by_label]
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for r in progress.rounds(runs, "latency"):
        for load in LOADS_PCT:
            for case in _abba(lat_cases, r):
                base = rates[case.rate_of or case.label]
                if case.skipped or not base or case.open_loop is None:
                    continue
                rate = statistics.median(base) * load / 100
                count = max(100, int(rate * duration_s))
                name = case.name(f"lat-{load}-{r}")
                lat = _measure(case, "latency", partial(case.open_loop, name, rate, count))
                if lat:
                    lat.sort()
                    results.setdefault((case.label, load), []).append(
                        tuple(percentile(lat, p) * 1000 for p in (0.5, 0.99, 0.999))  # type: ignore[arg-type]
                    )
    for case in lat_cases:
        for load in LOADS_PCT:
            name = f"latency {case.label} at {load}% load"
            got = results.get((case.label, load), [])
            if case.skipped or not got:
                rows.append(_skipped_row(name, case, "ms p99"))
                continue
            p50s, p99s, p999s = zip(*got, strict=True)
            rate = statistics.median(rates[case.rate_of or case.label]) * load / 100
            rows.append(
                {
                    "benchmark": name,
                    "durability": case.durability,
                    "median": round(statistics.median(p99s), 2),
                    "min_max": min_max(p99s, 2),
                    "runs": len(got),
                    "unit": "ms p99",
                    "p50_ms": round(statistics.median(p50s), 2),
                    "p99_9_ms": round(statistics.median(p999s), 2),
                    "rate_per_s": round(rate),
                    "load_pct": load,
                    "how": f"open loop {duration_s:g} s, from scheduled send time to ack",
                }
            )
    return rows


# ---------------------------------------------------------------------------- verdicts


def _find(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r.get("benchmark") == name), None)


def _measured(row: dict[str, Any] | None) -> bool:
    return row is not None and isinstance(row.get("median"), (int, float))


def _why_not(*pairs: tuple[str, dict[str, Any] | None]) -> str:
    missing = [
        f"{name}: {row['median'] if row else 'no row'}" for name, row in pairs if not _measured(row)
    ]
    return "not measured (" + "; ".join(missing) + ")"


def _ratio_line(rows: list[dict[str, Any]], peer: str, want: float, like: str) -> str:
    ours, theirs = _find(rows, f"produce {MB_ALL}"), _find(rows, f"produce {peer}")
    head = f"- send() idempotent acks=all at least {want:g}x {peer}"
    if not (_measured(ours) and _measured(theirs)):
        return f"{head}: {_why_not((MB_ALL, ours), (peer, theirs))}."
    assert ours is not None and theirs is not None
    ratio = ours["median"] / theirs["median"]
    verdict = "met" if ratio >= want else "MISSED"
    return (
        f"{head}: {ours['median']:,} against {theirs['median']:,} records/s (medians of "
        f"{ours['runs']} and {theirs['runs']} runs) is {ratio:.2f}x: {verdict}. {like}"
    )


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's three targets as verdict lines; a skipped peer is 'not measured'."""
    nats_row = _find(rows, f"produce {NATS_MSGID}")
    nats_class = nats_row["durability"] if nats_row else PAGE_CACHE
    lines = [
        _ratio_line(
            rows,
            REDIS_ALWAYS,
            2.5,
            f"Like with like: both {FSYNC_GROUP} (Redis fsyncs the AOF once per event-loop "
            "pass before replying).",
        ),
        _ratio_line(
            rows,
            NATS_MSGID,
            5,
            f"Not like with like: minibroker is {FSYNC_GROUP}, JetStream here is {nats_class}; "
            "the weaker durability favours NATS.",
        ),
    ]
    ours1, nats = _find(rows, f"produce {MB_1}"), _find(rows, f"produce {NATS_PLAIN}")
    if _measured(ours1) and _measured(nats):
        assert ours1 is not None and nats is not None
        lines.append(
            f"- like with like for NATS ({PAGE_CACHE}, no de-duplication): minibroker acks=1 "
            f"{ours1['median']:,} against {NATS_PLAIN} {nats['median']:,} records/s, "
            f"{ours1['median'] / nats['median']:.2f}x (no target)."
        )
    lat = _find(rows, f"latency {MB_ALL} at 50% load")
    head = "- minibroker acks=all p99 at 50% load at most 10 ms"
    if not _measured(lat):
        lines.append(f"{head}: {_why_not((MB_ALL, lat))}.")
    else:
        assert lat is not None
        verdict = "met" if lat["median"] <= 10 else "MISSED"
        lines.append(
            f"{head}: {lat['median']:.2f} ms (median of {lat['runs']} runs, {lat['min_max']}) "
            f"at {lat['rate_per_s']:,} records/s: {verdict}."
        )
    variants = (
        (MB_ALL_LINGER1, "with linger_ms 1 (Kafka's default 5), as a user tuning for latency"),
        (
            MB_ALL_SWITCH,
            f"with the producer process's switch interval at {SWITCH_INTERVAL_S * 1000:g} ms "
            "(CPython's default 5)",
        ),
    )
    for name, setting in variants:
        variant = _find(rows, f"latency {name} at 50% load")
        if _measured(lat) and _measured(variant):
            assert lat is not None and variant is not None
            verdict = "met" if variant["median"] <= 10 else "MISSED"
            lines.append(
                f"- the same {setting}: {variant['median']:.2f} ms ({variant['min_max']}), "
                f"{variant['median'] / lat['median']:.2f}x the default's: {verdict}."
            )
    return lines


# ---------------------------------------------------------------------------- plots


def plots(rows: list[dict[str, Any]], out_dir: Path) -> list[tuple[str, Path]]:
    """Two PNGs: produce/consume throughput per system grouped by durability class, and
    p50/p99/p99.9 latency against load per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    out: list[tuple[str, Path]] = []
    colors = dict(zip(CLASS_ORDER, ("tab:blue", "tab:orange", "tab:gray"), strict=True))

    def klass(row: dict[str, Any]) -> str:
        return next((c for c in CLASS_ORDER if str(row["durability"]).startswith(c)), PAGE_CACHE)

    def spread(row: dict[str, Any]) -> tuple[float, float]:
        low, high = (float(x.replace(",", "")) for x in row["min_max"].split("-"))
        return row["median"] - low, high - row["median"]

    produce = [r for r in rows if r["benchmark"].startswith("produce ") and _measured(r)]
    consume = [r for r in rows if r["benchmark"].startswith("consume ") and _measured(r)]
    produce.sort(key=lambda r: CLASS_ORDER.index(klass(r)))
    if produce or consume:
        fig, axes = plt.subplots(
            2, 1, figsize=(9, 7), height_ratios=[max(1, len(produce)), max(1, len(consume))]
        )
        for ax, group, title in (
            (axes[0], produce, "produce, 100-byte records"),
            (axes[1], consume, "consume the same data from the start"),
        ):
            names = [r["benchmark"].split(" ", 1)[1] for r in group]
            values = [r["median"] / 1000 for r in group]
            errors = [[s / 1000 for s in spread(r)] for r in group]
            ax.barh(
                names,
                values,
                xerr=list(zip(*errors, strict=True)) if errors else None,
                color=[colors[klass(r)] for r in group],
                capsize=3,
            )
            for y, (v, (_, up)) in enumerate(zip(values, errors, strict=True)):
                ax.text(v + up, y, f"  {v:,.0f}k", va="center", fontsize=8)
            ax.invert_yaxis()
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("thousand records/s (median, min-max bars)")
            ax.margins(x=0.15)
        handles = [plt.Rectangle((0, 0), 1, 1, color=colors[c]) for c in CLASS_ORDER]
        fig.legend(handles, CLASS_ORDER, loc="lower center", ncol=3, fontsize=8)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        path = out_dir / "peers_throughput.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(("Throughput per system, coloured by durability class", path))

    latency = [r for r in rows if r["benchmark"].startswith("latency ") and _measured(r)]
    if latency:
        fig, axes = plt.subplots(1, 3, figsize=(12, 4.2), sharey=True)
        systems = list(dict.fromkeys(r["benchmark"].split(" at ")[0][8:] for r in latency))
        for ax, (key, title) in zip(
            axes, (("p50_ms", "p50"), ("median", "p99"), ("p99_9_ms", "p99.9")), strict=True
        ):
            for system in systems:
                points = [r for r in latency if r["benchmark"].startswith(f"latency {system} at")]
                style = "-" if klass(points[0]) == FSYNC_GROUP else "--"
                ax.plot(
                    [r["load_pct"] for r in points],
                    [r[key] for r in points],
                    style,
                    marker="o",
                    label=system,
                )
            ax.set_yscale("log")
            ax.set_title(f"{title} (median of runs)", fontsize=10)
            ax.set_xlabel("load, % of the system's own max throughput")
            ax.set_xticks(list(LOADS_PCT))
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("ms from scheduled send to ack")
        axes[1].axhline(10, color="red", lw=0.8, ls=":", label="10 ms target (acks=all, 50%)")
        fig.legend(*axes[1].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
        fig.tight_layout(rect=(0, 0.12, 1, 1))
        path = out_dir / "peers_latency.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(("Open-loop latency against load (solid: fsync before ack)", path))
    return out


def main() -> None:
    from bench.__main__ import standalone

    standalone("peers", __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
