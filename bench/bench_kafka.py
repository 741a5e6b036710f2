"""The kafka listener against minibroker's own, on one broker with both, on each backend.

Two measurements, rounds of the two sides interleaved (ABBA) in one run:
- produce throughput of 100-byte records to one partition: confluent-kafka's idempotent
  producer at acks=all (librdkafka's batch defaults plus linger.ms 5) through the kafka
  listener, against minibroker's `Producer.send()` as bench_client tunes it (acks=all
  idempotent, 256 KiB batches, linger_ms 5) through its own, each after one record
  acknowledged (librdkafka asks for its producer id on a 500 ms timer after start); each
  round's ratio of the two rates, and the broker's CPU per record of each beside it;
- broker CPU per 16 KiB batch at acks=1, idempotent: bench_broker's raw pipelined load
  on minibroker's protocol, and the same load in Kafka's (Produce v7 of pre-encoded v2
  batches, the same records per batch, the same window of requests in flight), each
  round's ratio kafka/minibroker.

- transactions: confluent-kafka's transactional producer writing the same records in
  transactions of 1,000 (begin, produce, commit) against its idempotent rate above,
  interleaved with it (target: at least 0.8x); and the commit latency of a small
  transaction (10 records), commit_transaction()'s own time, p50 and p99.
- consume throughput through the kafka listener: confluent-kafka's Consumer reading from
  the start a partition that the SDK wrote (our magic-1 batches, which the listener
  converts to v2 in a worker thread) against one that confluent-kafka wrote (v2 batches,
  served as they lie with sendfile on trio): the records of the first produce round of
  each, each round's ratio of the two rates (issue 40, item 8: at least 0.5x).

Ratios are medians with a bootstrap 95% interval, judged by it (bench.__main__'s costs).

    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_kafka --scale 0.1
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import confluent_kafka
import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from bench import progress
from bench.bench_broker import (
    BATCH_BYTES,
    RECORD_BYTES,
    _batch_template,
    _cpu_s,
    _pipeline,
    _produce,
    bootstrap_median_ci,
)
from bench.bench_client import PRODUCER_CONFIG
from bench.stats import min_max
from client import Consumer, Producer, TopicPartition
from client.admin import create_topic
from harness.broker_process import BrokerProcess

PRODUCE_RECORDS = 200_000  # per round at scale 1
CPU_BATCHES = 6_000  # per round at scale 1
THROUGHPUT_ROUNDS = 6
CPU_ROUNDS = 8
ACK_WAIT_S = 60.0
CONFLUENT_CONFIG: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
CONFIG = (
    '[[listeners]]\nname = "mb"\nhost = "127.0.0.1"\nport = 0\n\n'
    '[[listeners]]\nname = "kafka"\nhost = "127.0.0.1"\nport = 0\nprotocol = "kafka"\n'
)
BACKENDS = ("trio", "asyncio")
CONSUME_ROUNDS = 6
CONFLUENT = "confluent-kafka Producer, idempotent acks=all, linger.ms 5"
TXN_RECORDS = 1_000  # per transaction of the throughput rounds
CONFLUENT_TXN = f"confluent-kafka Producer, transactions of {TXN_RECORDS:,} records, linger.ms 5"
SMALL_TXN_RECORDS = 10  # per transaction of the commit latency
COMMITS = 300  # small transactions timed at scale 1
KAFKA_WRITTEN = "confluent-kafka Consumer, data confluent-kafka wrote (v2 as stored)"
SDK_WRITTEN = "confluent-kafka Consumer, data the SDK wrote (magic 1, converted)"
SDK = "minibroker Producer.send(), idempotent acks=all, 256 KiB batches, linger_ms 5"

# Kafka's wire protocol, as much of it as the load needs.
PRODUCE_KEY, PRODUCE_VERSION = 0, 7
INIT_PRODUCER_ID_KEY, INIT_PRODUCER_ID_VERSION = 22, 1
CLIENT_ID = b"bench-kafka"
# Offsets in a v2 record batch (Kafka's DefaultRecordBatch).
V2_CRC, V2_ATTRIBUTES, V2_BASE_SEQUENCE = 17, 21, 53


def _values() -> list[bytes]:
    return [os.urandom(RECORD_BYTES) for _ in range(256)]


def _end_offset(bootstrap: str, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=bootstrap) as consumer:
        return consumer.end_offsets([tp])[tp]


# ------------------------------------------------------------------ throughput


def confluent_round(broker: BrokerProcess, topic: str, records: int) -> tuple[float, float]:
    """(seconds, broker CPU µs per record) of `records` sends through the kafka listener,
    from the first produce() until flush() saw every acknowledgement, after a first record
    acknowledged (the producer id acquired)."""
    create_topic(broker.bootstrap, topic, partitions=1)
    values = _values()
    errors: list[str] = []

    def failed(error: Any, _message: Any) -> None:
        errors.append(str(error))

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.address("kafka"),
            **CONFLUENT_CONFIG,
            "delivery.report.only.error": True,
            "on_delivery": failed,
        }
    )
    # One record acknowledged before the clock starts: librdkafka asks for its producer
    # id only once a connection is up, on a timer of its own (500 ms after start here).
    producer.produce(topic, values[0], partition=0)
    producer.flush(ACK_WAIT_S)
    produce = producer.produce
    cpu = _cpu_s(broker.pid)
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                produce(topic, values[i & 255], partition=0)
                break
            except BufferError:  # its queue is full: serve callbacks while it drains
                producer.poll(0.001)
    left = producer.flush(ACK_WAIT_S)
    seconds = time.perf_counter() - started
    cpu = _cpu_s(broker.pid) - cpu
    if left or errors:
        raise RuntimeError(f"confluent-kafka: {left} unsent, errors {errors[:3]}")
    if _end_offset(broker.bootstrap, topic) != records + 1:
        raise RuntimeError(f"{topic} does not hold the {records} records sent")
    return seconds, cpu / records * 1e6


def _transactional(broker: BrokerProcess, topic: str) -> confluent_kafka.Producer:
    """A confluent-kafka transactional producer, its transactions initialized and one
    transaction of one record committed (its partition's first add out of the way)."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.address("kafka"),
            **CONFLUENT_CONFIG,
            "transactional.id": f"bench-{topic}",
        }
    )
    producer.init_transactions(ACK_WAIT_S)
    producer.begin_transaction()
    producer.produce(topic, b"first", partition=0)
    producer.commit_transaction(ACK_WAIT_S)
    return producer


def confluent_txn_round(broker: BrokerProcess, topic: str, records: int) -> tuple[float, float]:
    """(seconds, broker CPU µs per record) of `records` sends in transactions of
    TXN_RECORDS through the kafka listener, from the first begin_transaction() until the
    last commit_transaction() returned; every record is committed by then."""
    create_topic(broker.bootstrap, topic, partitions=1)
    values = _values()
    producer = _transactional(broker, topic)
    produce = producer.produce
    cpu = _cpu_s(broker.pid)
    started = time.perf_counter()
    for first in range(0, records, TXN_RECORDS):
        producer.begin_transaction()
        for i in range(first, min(first + TXN_RECORDS, records)):
            while True:
                try:
                    produce(topic, values[i & 255], partition=0)
                    break
                except BufferError:
                    producer.poll(0.001)
        producer.commit_transaction(ACK_WAIT_S)
    seconds = time.perf_counter() - started
    cpu = _cpu_s(broker.pid) - cpu
    transactions = -(-records // TXN_RECORDS) + 1
    # The records, and a COMMIT marker per transaction.
    if _end_offset(broker.bootstrap, topic) != records + 1 + transactions:
        raise RuntimeError(f"{topic} does not hold the {records} records sent")
    return seconds, cpu / records * 1e6


def commit_latencies_ms(broker: BrokerProcess, topic: str, commits: int) -> list[float]:
    """commit_transaction()'s time, in ms, of `commits` transactions of SMALL_TXN_RECORDS,
    each produced and flushed first so that the commit is timed alone (EndTxn, the
    markers and their fsync)."""
    create_topic(broker.bootstrap, topic, partitions=1)
    producer = _transactional(broker, topic)
    latencies = []
    for _ in range(commits):
        producer.begin_transaction()
        for _ in range(SMALL_TXN_RECORDS):
            producer.produce(topic, b"x" * RECORD_BYTES, partition=0)
        if producer.flush(ACK_WAIT_S):
            raise RuntimeError("confluent-kafka: a small transaction's records unsent")
        started = time.perf_counter()
        producer.commit_transaction(ACK_WAIT_S)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def sdk_round(broker: BrokerProcess, topic: str, records: int) -> tuple[float, float]:
    """(seconds, broker CPU µs per record) of `records` send() calls, as bench_peers times
    them (from the first send() until flush() returned), after one record acknowledged
    as confluent_round waits for one."""
    create_topic(broker.bootstrap, topic, partitions=1)
    values = _values()
    with Producer(broker.bootstrap, **PRODUCER_CONFIG) as producer:
        producer.send(topic, values[0], partition=0).get(ACK_WAIT_S)  # as confluent_round
        send = producer.send
        cpu = _cpu_s(broker.pid)
        started = time.perf_counter()
        for i in range(records):
            send(topic, values[i & 255], partition=0)
        producer.flush(ACK_WAIT_S)
        seconds = time.perf_counter() - started
        cpu = _cpu_s(broker.pid) - cpu
        if producer.metrics()["records_sent"] != records + 1:
            raise RuntimeError(f"minibroker Producer: not all {records} records sent")
    return seconds, cpu / records * 1e6


# ------------------------------------------------------------------ broker CPU per batch


def _kafka_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    """A request with header v1 (api key, version, correlation id, client id)."""
    header = struct.pack(">hhih", api_key, version, correlation_id, len(CLIENT_ID)) + CLIENT_ID
    return struct.pack(">i", len(header) + len(body)) + header + body


def _kafka_call(sock: socket.socket, frame: bytes) -> bytes:
    """Send one request and return its answer's body (after the correlation id)."""
    sock.sendall(frame)
    (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
    return _recv_exactly(sock, size)[4:]


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise RuntimeError("the kafka listener closed the connection")
        buf += chunk
    return bytes(buf)


def _init_producer_id(sock: socket.socket) -> tuple[int, int]:
    """InitProducerId v1 without a transactional id: (producer id, epoch)."""
    body = struct.pack(">hi", -1, 60_000)
    answer = _kafka_call(
        sock, _kafka_frame(INIT_PRODUCER_ID_KEY, INIT_PRODUCER_ID_VERSION, 0, body)
    )
    _throttle, error, producer_id, epoch = struct.unpack_from(">ihqh", answer)
    if error:
        raise RuntimeError(f"InitProducerId: error {error}")
    return producer_id, epoch


def _v2_template(producer_id: int, epoch: int) -> bytes:
    """A v2 batch of as many 100-byte records (no key, no headers) as bench_broker's
    16 KiB template holds, uncompressed, sequence 0."""
    _, count = _batch_template(-1, -1)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=0,
        batch_size=2 * BATCH_BYTES,
    )
    now = int(time.time() * 1000)
    for i in range(count):
        builder.append(i, now, None, os.urandom(RECORD_BYTES), [])
    return bytes(builder.build())


def _with_v2_sequence(template: bytes, sequence: int) -> bytes:
    """The template with another base sequence, its CRC-32C redone."""
    batch = bytearray(template)
    struct.pack_into(">i", batch, V2_BASE_SEQUENCE, sequence)
    struct.pack_into(">I", batch, V2_CRC, crc32c.crc32c(memoryview(batch)[V2_ATTRIBUTES:]))
    return bytes(batch)


def _produce_frames(topic: str, template: bytes, count: int, n_batches: int) -> list[bytes]:
    name = topic.encode()
    frames = []
    for i in range(n_batches):
        batch = _with_v2_sequence(template, (i * count) % 2**31)
        body = (
            struct.pack(">hhi", -1, 1, 30_000)  # no transactional id, acks=1, timeout
            + struct.pack(">ih", 1, len(name))
            + name
            + struct.pack(">iii", 1, 0, len(batch))
            + batch
        )
        frames.append(_kafka_frame(PRODUCE_KEY, PRODUCE_VERSION, i, body))
    return frames


def kafka_produce_error(body: bytes) -> int:
    """The error of a Produce answer's one partition: after the correlation id, the
    topics' count, the topic's name, the partitions' count and the partition's index."""
    (name_length,) = struct.unpack_from(">h", body, 8)
    (error,) = struct.unpack_from(">h", body, 10 + name_length + 8)
    return int(error)


def kafka_cpu_round(broker: BrokerProcess, n_batches: int) -> tuple[float, float]:
    """(MB/s, broker CPU µs per batch) of bench_broker's acks=1 idempotent load in Kafka's
    protocol, on one connection to the kafka listener, into a fresh topic."""
    topic = f"bench-kafka-{time.monotonic_ns()}"
    create_topic(broker.bootstrap, topic, partitions=1)
    address = broker.address("kafka")
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        producer_id, epoch = _init_producer_id(sock)
        template = _v2_template(producer_id, epoch)
        _, count = _batch_template(-1, -1)
        frames = _produce_frames(topic, template, count, n_batches)
        payload = sum(len(f) for f in frames)
        cpu = _cpu_s(broker.pid)
        elapsed = _pipeline(address, frames, sock, kafka_produce_error)
        cpu = _cpu_s(broker.pid) - cpu
    return payload / elapsed / 1e6, cpu / n_batches * 1e6


def consume_round(broker: BrokerProcess, topic: str, records: int) -> tuple[float, float]:
    """(seconds, broker CPU µs per record) of confluent-kafka's Consumer reading `records`
    records of partition 0 of `topic` from its start through the kafka listener, from
    assign() until the last one arrived."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.address("kafka"),
            "group.id": f"bench-{topic}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
    try:
        cpu = _cpu_s(broker.pid)
        started = time.perf_counter()
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        seen = 0
        deadline = started + ACK_WAIT_S
        while seen < records:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{topic}: {seen} of {records} records consumed")
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error() is not None:
                    raise RuntimeError(f"{topic}: {message.error()}")
                seen += 1
        seconds = time.perf_counter() - started
        cpu = _cpu_s(broker.pid) - cpu
    finally:
        consumer.close()
    return seconds, cpu / records * 1e6


# ------------------------------------------------------------------ the suite


def _interleaved(
    rounds: int, what: str, cases: dict[str, Callable[[int], tuple[float, float]]]
) -> dict[str, list[tuple[float, float]]]:
    """Each case once per round, in ABBA order."""
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    names = list(cases)
    for round_ in progress.rounds(rounds, what):
        for name in names if round_ % 2 == 0 else names[::-1]:
            figures[name].append(cases[name](round_))
    return figures


def _throughput_rows(
    backend: str, figures: dict[str, list[tuple[float, float]]], records: int
) -> list[dict[str, Any]]:
    rows = []
    for name, values in figures.items():
        rates = [records / seconds for seconds, _ in values]
        rows.append(
            {
                "benchmark": f"produce {backend}: {name}",
                "value": statistics.median(rates),
                "unit": "records/s",
                "min_max": min_max(rates, 0),
                "mb_per_sec": statistics.median(rates) * RECORD_BYTES / 1e6,
                "broker_cpu_us_per_record": statistics.median(cpu for _, cpu in values),
                "rounds": len(values),
            }
        )
    # Of seconds for the same records: minibroker's over confluent-kafka's is the ratio
    # of confluent-kafka's rate to minibroker's.
    rows.append(
        _ratio_row(f"produce {backend}, confluent-kafka / minibroker", figures, SDK, CONFLUENT, 0)
    )
    # Of seconds again: the idempotent rounds' over the transactional ones' is the ratio
    # of the transactional rate to the idempotent one.
    name = f"produce {backend}, confluent-kafka transactions / idempotent"
    rows.append(_ratio_row(name, figures, CONFLUENT, CONFLUENT_TXN, 0))
    return rows


def _commit_row(backend: str, latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "benchmark": f"commit latency {backend}: confluent-kafka, {SMALL_TXN_RECORDS}-record "
        "transaction",
        "value": statistics.median(ordered),
        "unit": "ms",
        "min_max": min_max(ordered, 2),
        "p99_ms": ordered[min(len(ordered) - 1, round(len(ordered) * 0.99))],
        "rounds": len(ordered),
    }


def _ratio_row(
    name: str, figures: dict[str, list[tuple[float, float]]], top: str, bottom: str, index: int
) -> dict[str, Any]:
    """The median of the rounds' ratios top/bottom of figure `index`, with its bootstrap
    95% interval: each round's pair ran back to back, so the ratio cancels the drift of
    the shared machine that the figures themselves carry."""
    ratios = [t[index] / b[index] for t, b in zip(figures[top], figures[bottom], strict=True)]
    low, high = bootstrap_median_ci(ratios)
    return {
        "benchmark": name,
        "value": statistics.median(ratios),
        "unit": "x",
        "min_max": min_max(ratios, 2),
        "ci95_low": low,
        "ci95_high": high,
        "rounds": len(ratios),
    }


def _cpu_rows(backend: str, figures: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    rows = []
    for name, values in figures.items():
        cpu = [c for _, c in values]
        rows.append(
            {
                "benchmark": f"broker CPU per 16 KiB batch {backend}, {name} listener, acks=1 "
                "idempotent",
                "value": statistics.median(cpu),
                "unit": "µs/batch",
                "min_max": min_max(cpu),
                "mb_per_sec": statistics.median(mb for mb, _ in values),
                "rounds": len(values),
            }
        )
    name = f"broker CPU per batch {backend}, kafka / minibroker"
    rows.append(_ratio_row(name, figures, "kafka", "minibroker", 1))
    return rows


def _consume_rows(
    backend: str, figures: dict[str, list[tuple[float, float]]], records: int
) -> list[dict[str, Any]]:
    rows = []
    for name, values in figures.items():
        rates = [records / seconds for seconds, _ in values]
        rows.append(
            {
                "benchmark": f"consume {backend}: {name}",
                "value": statistics.median(rates),
                "unit": "records/s",
                "min_max": min_max(rates, 0),
                "mb_per_sec": statistics.median(rates) * RECORD_BYTES / 1e6,
                "broker_cpu_us_per_record": statistics.median(cpu for _, cpu in values),
                "rounds": len(values),
            }
        )
    # Of seconds for the same records: Kafka-written data's over the SDK's is the ratio of
    # the rate on the SDK's data to the rate on Kafka's.
    name = f"consume {backend}, SDK-written / Kafka-written"
    rows.append(_ratio_row(name, figures, KAFKA_WRITTEN, SDK_WRITTEN, 0))
    return rows


Round = Callable[[BrokerProcess, str, int], tuple[float, float]]
CpuRound = Callable[[BrokerProcess, int], tuple[float, float]]


def _topic_round(
    measure: Round, broker: BrokerProcess, prefix: str, records: int, round_: int
) -> tuple[float, float]:
    return measure(broker, f"{prefix}-{round_}", records)


def _cpu_round(
    measure: CpuRound, broker: BrokerProcess, n_batches: int, _round: int
) -> tuple[float, float]:
    return measure(broker, n_batches)


def _minibroker_cpu_round(broker: BrokerProcess, n_batches: int) -> tuple[float, float]:
    return _produce(broker, acks=1, idempotent=True, n_batches=n_batches)


def run(scale: float = 1.0) -> list[dict[str, Any]]:
    records = max(1_000, round(PRODUCE_RECORDS * scale))
    n_batches = max(100, round(CPU_BATCHES * scale))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for backend in BACKENDS:
            broker = BrokerProcess(
                Path(tmp) / f"data-{backend}", backend=backend, config=CONFIG
            ).start()
            try:
                throughput = _interleaved(
                    THROUGHPUT_ROUNDS,
                    f"produce, {backend}",
                    {
                        CONFLUENT: partial(_topic_round, confluent_round, broker, "conf", records),
                        SDK: partial(_topic_round, sdk_round, broker, "sdk", records),
                        CONFLUENT_TXN: partial(
                            _topic_round, confluent_txn_round, broker, "txn", records
                        ),
                    },
                )
                commits = commit_latencies_ms(broker, "commits", max(50, round(COMMITS * scale)))
                # The first produce round's topics: records + 1 each (one before the clock).
                consume = _interleaved(
                    CONSUME_ROUNDS,
                    f"consume, {backend}",
                    {
                        KAFKA_WRITTEN: partial(_consume, broker, "conf-0", records + 1),
                        SDK_WRITTEN: partial(_consume, broker, "sdk-0", records + 1),
                    },
                )
                cpu = _interleaved(
                    CPU_ROUNDS,
                    f"broker CPU per batch, {backend}",
                    {
                        "kafka": partial(_cpu_round, kafka_cpu_round, broker, n_batches),
                        "minibroker": partial(_cpu_round, _minibroker_cpu_round, broker, n_batches),
                    },
                )
            finally:
                broker.kill()
            rows += _throughput_rows(backend, throughput, records)
            rows.append(_commit_row(backend, commits))
            rows += _consume_rows(backend, consume, records + 1)
            rows += _cpu_rows(backend, cpu)
    return rows


def _consume(broker: BrokerProcess, topic: str, records: int, _round: int) -> tuple[float, float]:
    return consume_round(broker, topic, records)


def _value(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(row for row in rows if row["benchmark"] == name)


def _judged(
    row: dict[str, Any], *, at_least: float | None = None, at_most: float | None = None
) -> str:
    """A ratio judged by its interval, as bench.__main__ judges costs: a median on the
    right side whose interval reaches over the limit has not shown anything yet."""
    low, high = row["ci95_low"], row["ci95_high"]
    if at_least is not None:
        ok, wrong = low >= at_least, high < at_least
    else:
        assert at_most is not None
        ok, wrong = high <= at_most, low > at_most
    if ok:
        return "met"
    return "MISSED" if wrong else "not shown (the interval spans the limit)"


def targets(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for backend in BACKENDS:
        confluent = _value(rows, f"produce {backend}: {CONFLUENT}")["value"]
        sdk = _value(rows, f"produce {backend}: {SDK}")["value"]
        speed = _value(rows, f"produce {backend}, confluent-kafka / minibroker")
        ratio = _value(rows, f"broker CPU per batch {backend}, kafka / minibroker")
        converted = _value(rows, f"consume {backend}, SDK-written / Kafka-written")
        out += [
            f"- {backend}: confluent-kafka's idempotent producer ({confluent:,.0f} records/s) "
            f"against minibroker's tuned send() ({sdk:,.0f}): {speed['value']:.2f}x, median of "
            f"{speed['rounds']} paired rounds, 95% CI {speed['ci95_low']:.2f}-"
            f"{speed['ci95_high']:.2f} (at least 1x wanted): {_judged(speed, at_least=1)}.",
            f"- {backend}: broker CPU per 16 KiB batch through the kafka listener is "
            f"{ratio['value']:.2f}x minibroker's listener, median of {ratio['rounds']} paired "
            f"rounds, 95% CI {ratio['ci95_low']:.2f}-{ratio['ci95_high']:.2f} (at most 1.2x "
            f"wanted, issue 40): {_judged(ratio, at_most=1.2)}.",
            f"- {backend}: confluent-kafka's Consumer reads the SDK's data (converted to v2 "
            f"in a worker thread) at {converted['value']:.2f}x its rate on Kafka-written data, "
            f"median of {converted['rounds']} paired rounds, 95% CI "
            f"{converted['ci95_low']:.2f}-{converted['ci95_high']:.2f} (at least 0.5x wanted): "
            f"{_judged(converted, at_least=0.5)}.",
        ]
        txn = _value(rows, f"produce {backend}, confluent-kafka transactions / idempotent")
        commit = _value(
            rows,
            f"commit latency {backend}: confluent-kafka, {SMALL_TXN_RECORDS}-record transaction",
        )
        out += [
            f"- {backend}: confluent-kafka in transactions of {TXN_RECORDS:,} records against its "
            f"idempotent rate: {txn['value']:.2f}x, median of {txn['rounds']} paired rounds, "
            f"95% CI {txn['ci95_low']:.2f}-{txn['ci95_high']:.2f} (at least 0.8x wanted): "
            f"{_judged(txn, at_least=0.8)}; a {SMALL_TXN_RECORDS}-record transaction's commit "
            f"takes {commit['value']:.1f} ms at p50 ({commit['p99_ms']:.1f} ms at p99, "
            f"{commit['rounds']} commits).",
        ]
    return out


def main() -> None:
    from bench.__main__ import standalone

    standalone("kafka", __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
