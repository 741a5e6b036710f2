"""What the tests of Kafka's clients against the kafka listener share: a broker with a
minibroker and a kafka listener (optionally behind a fault proxy), the records they
send, and each client's way of producing and of reading a partition back.

A Kafka client connects to the address Metadata advertises, not the one it was given,
so a proxy in front of the kafka listener must own the advertised address: the proxy
binds a free port first and the listener advertises it (`advertised_port`). Every
connection a client opens then passes the proxy, before and after a restart (the
broker's ports are pinned after the first start).
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import confluent_kafka
import kafka
import kafka.structs
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AIOTopicPartition

from client.admin import create_topic
from harness.broker_process import BrokerProcess
from tests.fault_proxy import FaultProxy

PRODUCE = 0  # Kafka's api key of Produce
DEADLINE_S = 60.0
# An hour ago: recent enough that no retention by time deletes the records meanwhile.
BASE_TIMESTAMP_MS = int(time.time() * 1000) - 3_600_000
CLIENTS = ("kafka-python", "aiokafka", "confluent-kafka")
CODECS = ("gzip", "snappy", "lz4", "zstd")


def listeners_config(
    *, mb_port: int = 0, kafka_port: int = 0, kafka_advertised_port: int = 0
) -> str:
    """A settings file with a minibroker listener `mb` and a kafka listener `kafka` on
    127.0.0.1, the latter advertising `kafka_advertised_port` (0: its own)."""
    return (
        '[[listeners]]\nname = "mb"\nhost = "127.0.0.1"\n'
        f"port = {mb_port}\n\n"
        f'[[listeners]]\nname = "kafka"\nhost = "127.0.0.1"\nport = {kafka_port}\n'
        f'advertised_port = {kafka_advertised_port}\nprotocol = "kafka"\n'
    )


def start_pinned(
    data_dir: Path, backend: str, settings: str = "", *, kafka_advertised_port: int = 0
) -> BrokerProcess:
    """A broker with `settings` and both listeners on free ports, pinned once it has
    started so that a restart (`broker.start()` after a kill) binds the same ones."""
    broker = BrokerProcess(
        data_dir,
        backend=backend,
        config=settings + listeners_config(kafka_advertised_port=kafka_advertised_port),
    ).start()
    ports = broker.listener_ports
    broker.config = settings + listeners_config(
        mb_port=ports["mb"], kafka_port=ports["kafka"], kafka_advertised_port=kafka_advertised_port
    )
    return broker


P = TypeVar("P", bound=FaultProxy)


def start_behind_proxy(
    data_dir: Path,
    backend: str,
    make_proxy: Callable[[Callable[[], tuple[str, int]]], P],
    settings: str = "",
) -> tuple[BrokerProcess, P]:
    """A broker whose kafka listener Kafka's clients reach only through the proxy that
    `make_proxy(target)` binds first: the listener advertises the proxy's port, so the
    clients' connections after Metadata go through it too. The broker's ports are pinned
    so that a restart reuses them and the proxy, which looks its target up at each
    connection, finds it again."""
    ports: dict[str, int] = {}
    proxy = make_proxy(lambda: ("127.0.0.1", ports["kafka"]))
    try:
        broker = start_pinned(data_dir, backend, settings, kafka_advertised_port=proxy.port)
    except BaseException:
        proxy.close()
        raise
    ports.update(broker.listener_ports)
    return broker, proxy.start()


class KafkaFaultProxy(FaultProxy):
    """FaultProxy on Kafka's framing (an int32 length, then a request header of api key,
    version and correlation id, or a response header that starts with the correlation
    id): `drop_request` swallows a Produce request, `drop_response` discards a Produce
    response after the broker appended, each closing the client's connection. The
    other faults of FaultProxy rewrite minibroker's batches and are not offered here."""

    def _request(self, frame: bytes, apis: dict[int, str]) -> bytes | None:
        api_key, _version, correlation_id = struct.unpack_from(">hhi", frame, 4)
        if api_key != PRODUCE:
            return frame
        apis[correlation_id] = "Produce"
        return None if self._roll("drop_request") else frame

    def _response(self, frame: bytes, apis: dict[int, str]) -> bytes | None:
        (correlation_id,) = struct.unpack_from(">i", frame, 4)
        if apis.pop(correlation_id, None) == "Produce" and self._roll("drop_response"):
            return None
        return frame


@dataclass
class KafkaStack:
    """A broker with both listeners, on pinned ports so that it restarts on the same
    ones, and the proxy in front of its kafka listener when there is one."""

    broker: BrokerProcess
    proxy: KafkaFaultProxy | None = None

    @property
    def kafka(self) -> str:
        """Where Kafka's clients bootstrap (the proxy when there is one)."""
        if self.proxy is not None:
            return self.proxy.bootstrap
        return f"127.0.0.1:{self.broker.listener_ports['kafka']}"

    @property
    def mb(self) -> str:
        """Where minibroker's SDK connects."""
        return self.broker.address("mb")

    def faults(self, **rates: float) -> None:
        """Set the proxy's fault rates (others to 0) and forget what it injected."""
        assert self.proxy is not None, "this stack has no proxy"
        for name in self.proxy.rates:
            self.proxy.rates[name] = rates.get(name, 0.0)
        self.proxy.injected.clear()

    def new_topic(self, prefix: str, partitions: int = 1) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        create_topic(self.mb, name, partitions=partitions)
        return name

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        self.broker.kill()


def start_stack(data_dir: Path, backend: str, *, proxied: bool) -> KafkaStack:
    if proxied:
        broker, proxy = start_behind_proxy(data_dir, backend, KafkaFaultProxy)
        return KafkaStack(broker, proxy)
    return KafkaStack(start_pinned(data_dir, backend))


def stack_per_backend(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *,
    proxied: bool,
) -> Iterator[KafkaStack]:
    """The body of a module's stack fixture, parametrized over the backends: a stack on
    `request.param` in a fresh `kafka-{name}-{backend}` directory, closed after."""
    data_dir: Path = tmp_path_factory.mktemp(f"kafka-{name}-{request.param}") / "data"
    stack = start_stack(data_dir, request.param, proxied=proxied)
    try:
        yield stack
    finally:
        stack.close()


class Rec(NamedTuple):
    """One record as sent and as read back (offset -1 until read)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    offset: int = -1


def records(n: int, tag: str) -> list[Rec]:
    """`n` records with null keys, null values (never both), headers (some empty) and
    create times among them; values compress (a run of one byte) so the codecs have work."""
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else f"k{i % 13}".encode()
        # Never both null: kafka-python and aiokafka refuse a record without either.
        tombstone = i % 11 == 5 and key is not None
        value = None if tombstone else f"{tag}-{i:05d}-".encode() + b"x" * (i % 50)
        headers: tuple[tuple[str, bytes], ...] = ()
        if i % 5 == 0:
            headers = (("i", str(i).encode()), ("empty", b""))
        out.append(Rec(key, value, headers, BASE_TIMESTAMP_MS + i))
    return out


def without_offsets(recs: list[Rec]) -> list[Rec]:
    return [r._replace(offset=-1) for r in recs]


# ------------------------------------------------------------------ producing


# A restart is (at, action): once `at` records are acknowledged, `action` (a kill -9
# and restart of the broker) runs before the second half of the records is sent.
Restart = tuple[int, Callable[[], None]] | None


def produce(
    client: str, bootstrap: str, topic: str, recs: list[Rec], codec: str, restart: Restart = None
) -> list[int]:
    """Send `recs` to partition 0 with `client`'s idempotent producer at acks=all, small
    batches (many requests, so faults land at many points) and quick retries. With
    `restart`, half the records are sent, the action runs once enough are acknowledged,
    then the rest are sent. Every record must be acknowledged; returns each record's
    acknowledged offset."""
    if client == "kafka-python":
        return _produce_kafka_python(bootstrap, topic, recs, codec, restart)
    if client == "aiokafka":
        return asyncio.run(_produce_aiokafka(bootstrap, topic, recs, codec, restart))
    return _produce_confluent(bootstrap, topic, recs, codec, restart)


def _halves(recs: list[Rec]) -> tuple[range, range]:
    half = len(recs) // 2
    return range(half), range(half, len(recs))


def _wait(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def _send_kwargs(r: Rec) -> dict[str, Any]:
    """`r` as kafka-python's and aiokafka's send take it, for partition 0."""
    return {
        "value": r.value,
        "key": r.key,
        "partition": 0,
        "headers": list(r.headers),
        "timestamp_ms": r.timestamp,
    }


def _produce_kafka_python(
    bootstrap: str, topic: str, recs: list[Rec], codec: str, restart: Restart
) -> list[int]:
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        compression_type=None if codec == "none" else codec,
        batch_size=512,
        linger_ms=2,
        retry_backoff_ms=20,
        reconnect_backoff_ms=20,
        reconnect_backoff_max_ms=200,
        request_timeout_ms=10_000,
        delivery_timeout_ms=60_000,
    )
    futures: list[Any] = []
    at, action = restart or (0, None)
    try:
        for half, part in enumerate(_halves(recs)):
            for i in part:
                futures.append(producer.send(topic, **_send_kwargs(recs[i])))
            if half == 0 and action is not None:
                _wait(lambda: sum(f.is_done for f in futures) >= at, f"{at} acknowledgements")
                action()
        producer.flush(DEADLINE_S)
        return [f.get(timeout=DEADLINE_S).offset for f in futures]
    finally:
        producer.close(timeout=5)


async def _produce_aiokafka(
    bootstrap: str, topic: str, recs: list[Rec], codec: str, restart: Restart
) -> list[int]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        compression_type=None if codec == "none" else codec,
        max_batch_size=512,
        linger_ms=2,
        retry_backoff_ms=20,
        request_timeout_ms=10_000,
    )
    await producer.start()
    futures: list[asyncio.Future[Any]] = []
    at, action = restart or (0, None)
    try:
        for half, part in enumerate(_halves(recs)):
            for i in part:
                futures.append(await producer.send(topic, **_send_kwargs(recs[i])))
            if half == 0 and action is not None:
                deadline = time.monotonic() + DEADLINE_S
                while sum(f.done() for f in futures) < at:
                    assert time.monotonic() < deadline, f"timed out waiting for {at} acks"
                    await asyncio.sleep(0.002)
                await asyncio.to_thread(action)
        done = await asyncio.wait_for(asyncio.gather(*futures), DEADLINE_S)
        return [metadata.offset for metadata in done]
    finally:
        await producer.stop()


def _produce_confluent(
    bootstrap: str, topic: str, recs: list[Rec], codec: str, restart: Restart
) -> list[int]:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": codec,
            "batch.size": 512,
            "linger.ms": 2,
            "retry.backoff.ms": 20,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 200,
            "message.timeout.ms": 60_000,
        }
    )
    offsets: dict[int, int] = {}
    errors: list[str] = []

    def delivered(index: int) -> Callable[[Any, Any], None]:
        def report(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(f"record {index}: {error}")
            else:
                offsets[index] = message.offset()

        return report

    at, action = restart or (0, None)

    def acked() -> int:
        producer.poll(0)
        return len(offsets)

    for half, part in enumerate(_halves(recs)):
        for i in part:
            r = recs[i]
            producer.produce(
                topic,
                value=r.value,
                key=r.key,
                partition=0,
                headers=list(r.headers),
                timestamp=r.timestamp,
                on_delivery=delivered(i),
            )
        if half == 0 and action is not None:
            _wait(lambda: acked() >= at, f"{at} acknowledgements")
            action()
    left = producer.flush(DEADLINE_S)
    assert left == 0 and not errors, (left, errors[:5])
    return [offsets[i] for i in range(len(recs))]


# ------------------------------------------------------------------ reading back


def read_back(
    client: str, bootstrap: str, topic: str, count: int, isolation: str = "read_committed"
) -> list[Rec]:
    """Partition 0 of `topic` from its beginning, by manual assignment, until `count`
    records came (or the deadline passed), with each record's offset."""
    if client == "kafka-python":
        return _read_kafka_python(bootstrap, topic, count, isolation)
    if client == "aiokafka":
        return asyncio.run(_read_aiokafka(bootstrap, topic, count, isolation))
    return _read_confluent(bootstrap, topic, count, isolation)


def header_pairs(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """A client's headers (None, or a sequence of pairs of some kind) as Rec holds them."""
    return tuple((k, v) for k, v in headers or ())


def _rec_of(m: Any) -> Rec:
    """A kafka-python or aiokafka ConsumerRecord (the same fields) as a Rec."""
    return Rec(m.key, m.value, header_pairs(m.headers), m.timestamp, m.offset)


def _read_kafka_python(bootstrap: str, topic: str, count: int, isolation: str) -> list[Rec]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        isolation_level=isolation,
    )
    tp = kafka.structs.TopicPartition(topic, 0)
    out: list[Rec] = []
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                out += [_rec_of(m) for m in batch]
    finally:
        consumer.close()
    return out


async def _read_aiokafka(bootstrap: str, topic: str, count: int, isolation: str) -> list[Rec]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation
    )
    tp = AIOTopicPartition(topic, 0)
    out: list[Rec] = []
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < count and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                out += [_rec_of(m) for m in batch]
    finally:
        await consumer.stop()
    return out


def _read_confluent(bootstrap: str, topic: str, count: int, isolation: str) -> list[Rec]:
    """Ends at the partition's end (librdkafka's end-of-partition event): the records were
    acknowledged at acks=all before, so the end it sees is past them."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            # librdkafka wants a group even for a consumer that only assigns; nothing
            # joins or commits.
            "group.id": f"assign-only-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    out: list[Rec] = []
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=count - len(out), timeout=0.5):
                error = m.error()
                if error is not None and error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    return out
                if error is not None:
                    raise AssertionError(f"confluent-kafka consumer: {error}")
                out.append(
                    Rec(m.key(), m.value(), header_pairs(m.headers()), m.timestamp()[1], m.offset())
                )
    finally:
        consumer.close()
    return out
