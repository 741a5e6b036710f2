"""The client SDK against the real broker process, on both broker backends.

The async tests run the client on the same AnyIO backend as the broker
(asyncio or trio), so both faces meet both event loops.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest

from client import (
    AsyncConsumer,
    AsyncProducer,
    BatchMetadata,
    Consumer,
    CorruptRecordError,
    DeliveryTimeoutError,
    MinibrokerError,
    MinibrokerTimeoutError,
    NoBrokersAvailable,
    Producer,
    ProducerFencedError,
    RecordMetadata,
    TopicPartition,
    UnknownPartitionError,
)
from client.accumulator import RecordHandle
from client.admin import create_topic, create_topic_async, describe_topic, list_topics
from client.errors import ConnectionLostError, TopicAlreadyExistsError, UnknownTopicError
from client.partitioner import murmur2_partition
from harness.broker_process import BrokerProcess
from tests.fault_proxy import FaultProxy

TP0 = TopicPartition("t", 0)
FAST = {"retry_backoff_ms": 20, "request_timeout_ms": 5_000, "delivery_timeout_ms": 10_000}


@pytest.fixture
def anyio_backend(backend: str) -> str:
    return backend


def read_all(bootstrap: str, topic: str, **config: object) -> dict[int, list]:
    """Every record of `topic` by partition, read up to the end offsets."""
    with Consumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **config
    ) as consumer:
        partitions = consumer.assignment()
        ends = consumer.end_offsets(partitions)
        out: dict[int, list] = {tp.partition: [] for tp in partitions}
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, "consumer did not reach the end offsets"
            for tp, records in consumer.poll(timeout_ms=500, max_records=100_000).items():
                out[tp.partition] += records
        return out


# --------------------------------------------------------------------------- sync face


def test_send_get_and_consume_round_trip(broker: BrokerProcess) -> None:
    delivered = []
    with Producer(broker.bootstrap, client_id="it") as producer:
        first = producer.send("t", b"v0", key=b"k0", partition=0, timestamp_ms=1_234)
        second = producer.send(
            "t",
            "text value",
            partition=0,
            headers=[("trace", b"abc"), ("n", "1")],
            on_delivery=lambda err, md: delivered.append((err, md)),
        )
        assert first.get(10) == RecordMetadata("t", 0, 0, 1_234)
        assert first.done() and first.exception() is None
        assert second.get(10).offset == 1
        producer.flush(10)
        metrics = producer.metrics()
    assert delivered == [(None, second.get(0))]
    assert metrics["records_sent"] == 2 and metrics["producer_epoch"] == 0
    assert metrics["request_latency_avg_ms"] > 0

    with Consumer(TP0, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as c:
        records = c.poll(timeout_ms=5_000)[TP0]
        r0, r1 = records
        assert (r0.offset, r0.key, r0.value, r0.timestamp, r0.headers) == (
            0,
            b"k0",
            b"v0",
            1_234,
            (),
        )
        assert r1.value == b"text value"
        assert list(r1.headers) == [("trace", b"abc"), ("n", b"1")]
        assert c.position(TP0) == 2


def test_done_callbacks_run_on_the_producers_io_thread_with_the_offsets(
    broker: BrokerProcess,
) -> None:
    """One callback per batch is how the latency bench times acks: it must run as the
    answer is handled, on the producer's thread, not on the caller's."""
    caller = threading.get_ident()
    seen: list[tuple[int, int]] = []
    # A linger far longer than the test, so that every callback is added before its
    # batch can be sent; flush then sends them.
    with Producer(broker.bootstrap, linger_ms=60_000) as producer:
        handles = [producer.send("t", b"v%d" % i, partition=0) for i in range(20)]
        for handle in handles[::5]:
            handle.add_done_callback(
                lambda h: seen.append((h.get(0).offset, threading.get_ident()))
            )
        producer.flush(10)
        late: list[int] = []
        handles[0].add_done_callback(lambda h: late.append(threading.get_ident()))
    assert sorted(offset for offset, _ in seen) == [0, 5, 10, 15]
    assert all(thread != caller for _, thread in seen)
    assert late == [caller]


def test_keys_hash_like_kafka_and_keyless_records_stick(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "keyed", partitions=4)
    with Producer(broker.bootstrap, linger_ms=5) as producer:
        handles = {key: producer.send("keyed", b"v", key=key) for key in (b"a", b"b", b"c", b"d")}
        keyless = [producer.send("keyed", b"x") for _ in range(20)]
        producer.flush(10)
    for key, handle in handles.items():
        assert handle.get().partition == murmur2_partition(key, 4)
    assert len({h.get().partition for h in keyless}) == 1


def test_send_batch_with_lists_and_arrow_arrays(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "bulk", partitions=2)
    values = [b"%06d" % i for i in range(5_000)]
    with Producer(broker.bootstrap, max_request_size=16_384, batch_size=16_384) as producer:
        bf = producer.send_batch("bulk", values, partition=1)
        result = bf.get(10)
        assert len(result) > 1  # split into wire batches within max_request_size
        assert sum(m.record_count for m in result) == 5_000
        assert result[0] == BatchMetadata("bulk", 1, 0, result[0].record_count)
        offsets = [m.base_offset for m in result]
        assert offsets == sorted(offsets)
        arrow = producer.send_batch(
            "bulk", pa.array(["a", None, "c"]), keys=pa.array([b"k1", b"k2", b"k3"]), partition=0
        ).get(10)
        assert arrow == [BatchMetadata("bulk", 0, 0, 3)]
        keyed = producer.send_batch("bulk", [b"1", b"2", b"3"], keys=[b"a", b"b", b"c"]).get(10)
        assert sum(m.record_count for m in keyed) == 3
    got = read_all(broker.bootstrap, "bulk")
    assert [r.value for r in got[1][:5_000]] == values
    assert [(r.key, r.value) for r in got[0][:3]] == [(b"k1", b"a"), (b"k2", None), (b"k3", b"c")]


@pytest.mark.parametrize("compression", ["gzip", "zstd", "lz4"])
def test_compressed_batches_round_trip(broker: BrokerProcess, compression: str) -> None:
    with Producer(broker.bootstrap, compression_type=compression, linger_ms=20) as producer:
        for i in range(300):
            producer.send("c", b"value-%d" % i, partition=0)
    got = read_all(broker.bootstrap, "c")
    assert [r.value for r in got[0]] == [b"value-%d" % i for i in range(300)]


@pytest.mark.parametrize("acks", [1, 0])
def test_non_idempotent_acks(broker: BrokerProcess, acks: int) -> None:
    with Producer(broker.bootstrap, acks=acks) as producer:
        assert producer.config.enable_idempotence is False
        metadata = producer.send("a", b"x", partition=0).get(10)
        assert metadata.offset == (0 if acks == 1 else -1)
        producer.flush(10)
    assert len(read_all(broker.bootstrap, "a")[0]) == 1


def test_config_errors_like_kafka() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        Producer("127.0.0.1:1", max_in_flight_requests_per_connection=6)
    with pytest.raises(ValueError, match="acks"):
        Producer("127.0.0.1:1", enable_idempotence=True, acks=1)
    with pytest.raises(TypeError):
        Producer("127.0.0.1:1", no_such_setting=1)


def test_metadata_wait_is_bounded_by_max_block_ms() -> None:
    with Producer("127.0.0.1:1", max_block_ms=300) as producer:  # nothing listens there
        started = time.monotonic()
        with pytest.raises(MinibrokerTimeoutError) as info:
            producer.send("t", b"x")
        assert time.monotonic() - started < 5
    assert str(info.value) == (
        "cannot connect to 127.0.0.1:1 (connection refused) within max_block_ms=300"
    )
    assert isinstance(info.value.__cause__, ConnectionLostError)


UNREACHABLE = (
    r"cannot connect to 127\.0\.0\.1:1 \(connection refused\) after {} attempts in [\d.]+ s"
)


def test_unreachable_broker_fails_after_one_backoff_cycle() -> None:
    """Not max_block_ms (60 s) but the attempts until the reconnect backoff (50 ms doubling)
    reaches reconnect_backoff_max_ms: 6 in about 1.6 s with the defaults."""
    with Producer("127.0.0.1:1") as producer:
        started = time.monotonic()
        with pytest.raises(NoBrokersAvailable, match=UNREACHABLE.format(6)) as info:
            producer.send("t", b"x").get(10)
        assert 1.0 < time.monotonic() - started < 20
        assert isinstance(info.value.__cause__, ConnectionLostError) and info.value.retriable
        started = time.monotonic()
        with pytest.raises(NoBrokersAvailable, match=UNREACHABLE.format(7)):
            producer.send("t", b"x")  # one more attempt of its own, after the longest backoff
        assert time.monotonic() - started < 10
    with (
        Producer("127.0.0.1:1", reconnect_backoff_max_ms=200) as producer,
        pytest.raises(NoBrokersAvailable, match=UNREACHABLE.format(3)),
    ):
        producer.send("t", b"x")
    started = time.monotonic()
    with pytest.raises(NoBrokersAvailable, match=UNREACHABLE.format(6)):
        Consumer("t", bootstrap_servers="127.0.0.1:1")
    assert time.monotonic() - started < 20  # not request_timeout_ms (30 s)


@pytest.mark.anyio
async def test_async_producer_fails_the_same_way(broker: BrokerProcess) -> None:
    started = time.monotonic()
    async with AsyncProducer("127.0.0.1:1") as producer:
        with pytest.raises(NoBrokersAvailable, match=UNREACHABLE.format(6)):
            await producer.send_and_wait("t", b"x")
    assert time.monotonic() - started < 20
    await create_topic_async(broker.bootstrap, "orders", partitions=3)
    async with AsyncProducer(broker.bootstrap) as producer:
        started = time.monotonic()
        with pytest.raises(UnknownPartitionError) as info:
            await producer.send("orders", b"x", partition=7)
        assert time.monotonic() - started < 10  # at once, not after max_block_ms
    assert str(info.value) == "partition 7 of 'orders' does not exist (3 partitions)"


def _record_wakes(producer: AsyncProducer) -> list[bool]:
    """After each Produce answer of `producer`, whether it left its sender woken."""
    sender = producer._sender
    woken_after: list[bool] = []
    answer = sender._on_produce_answer

    def recorded(*args: Any) -> None:
        answer(*args)
        assert sender._wakeup_event is not None
        woken_after.append(sender._wakeup_event.is_set())

    sender._on_produce_answer = recorded  # type: ignore[method-assign]
    return woken_after


@pytest.mark.anyio
async def test_an_answer_wakes_the_sender_only_when_something_waits_to_be_sent(
    broker: BrokerProcess,
) -> None:
    """The answer of the only batch in flight, nothing queued behind it, leaves the
    sender asleep, so the caller waiting for it runs first (a woken sender's turn came
    before it: about 40 µs of every `flush()` and commit); with the in-flight limit
    reached, every answer wakes it (batches wait behind the limit, and appends leave
    the waking to answers then), and everything is delivered."""
    await create_topic_async(broker.bootstrap, "wake", partitions=1)
    async with AsyncProducer(broker.bootstrap, linger_ms=0) as producer:
        woken_after = _record_wakes(producer)
        for i in range(5):
            await producer.send_and_wait("wake", b"alone %d" % i)
        assert woken_after == [False] * 5
    async with AsyncProducer(
        broker.bootstrap, linger_ms=0, max_in_flight_requests_per_connection=1
    ) as producer:
        woken_after = _record_wakes(producer)
        handles = [await producer.send("wake", b"x" * 20_000) for _ in range(4)]
        await producer.flush()
        assert [(await h).offset for h in handles] == [5, 6, 7, 8]
        assert woken_after == [True, True, True, True], woken_after


def test_missing_partition_fails_at_once(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "orders", partitions=3)
    with Producer(broker.bootstrap) as producer:
        for partition in (3, 7, -1):
            started = time.monotonic()
            with pytest.raises(UnknownPartitionError) as info:
                producer.send("orders", b"x", partition=partition).get(10)
            assert time.monotonic() - started < 10  # at once, not after max_block_ms
            assert str(info.value) == (
                f"partition {partition} of 'orders' does not exist (3 partitions)"
            )
        assert producer.send("orders", b"x", partition=2).get(10).partition == 2


def test_allow_auto_create_topics(broker: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    with (
        Producer(broker.bootstrap, allow_auto_create_topics=False, max_block_ms=500) as p,
        pytest.raises(MinibrokerTimeoutError) as info,
    ):
        p.send("typo", b"x")
    assert str(info.value) == (
        "topic 'typo' does not exist within max_block_ms=500; allow_auto_create_topics=False"
    )
    with Consumer(bootstrap_servers=broker.bootstrap) as consumer, pytest.raises(UnknownTopicError):
        consumer.partitions_for_topic("typo")
    assert list_topics(broker.bootstrap) == []
    with caplog.at_level("WARNING", logger="minibroker.client"), Producer(broker.bootstrap) as p:
        p.send("created", b"x").get(10)
        p.send("created", b"y").get(10)
    assert [r.getMessage() for r in caplog.records] == [
        "topic 'created' did not exist: the broker created it with 1 partition "
        "(allow_auto_create_topics=False prevents this)"
    ]
    with Consumer(bootstrap_servers=broker.bootstrap, allow_auto_create_topics=True) as consumer:
        assert consumer.partitions_for_topic("read") == {0}
    assert sorted(list_topics(broker.bootstrap)) == ["created", "read"]


def test_fenced_producer_fails_clearly(broker: BrokerProcess) -> None:
    with Producer(broker.bootstrap, transactional_id="app") as old:
        old.init_transactions()
        old.begin_transaction()
        old.send("f", b"before", partition=0).get(10)
        with Producer(broker.bootstrap, transactional_id="app") as new:
            new.init_transactions()
            with new.transaction():
                new.send("f", b"new", partition=0).get(10)
            with pytest.raises(ProducerFencedError) as info:
                old.send("f", b"stale", partition=0).get(10)
            assert "newer epoch" in str(info.value)
            with pytest.raises(ProducerFencedError):
                old.send("f", b"refused", partition=0)


def test_delivery_timeout_when_the_broker_is_gone(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    producer = Producer(
        broker.bootstrap, delivery_timeout_ms=1_500, request_timeout_ms=1_000, retry_backoff_ms=50
    )
    try:
        producer.send("gone", b"ok", partition=0).get(10)
        broker.kill()
        handle = producer.send("gone", b"lost", partition=0)
        refused = f"cannot connect to {broker.bootstrap} (connection refused)"
        with pytest.raises(MinibrokerTimeoutError) as flushing:
            producer.flush(0.5)
        assert str(flushing.value) == f"flush did not complete within 0.5 s: {refused}"
        assert isinstance(flushing.value.__cause__, ConnectionLostError)
        with pytest.raises(DeliveryTimeoutError) as info:
            handle.get(10)
        assert str(info.value).endswith(f"; {refused}")
        assert isinstance(info.value.__cause__, ConnectionLostError)
    finally:
        producer.close(1)
        broker.kill()


def test_buffer_memory_blocks_up_to_max_block_ms(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    producer = Producer(
        broker.bootstrap,
        buffer_memory=4_096,
        batch_size=1_024,
        max_request_size=1_024,
        max_block_ms=300,
    )
    try:
        producer.send("full", b"x", partition=0).get(10)
        broker.kill()
        started = time.monotonic()
        with pytest.raises(MinibrokerTimeoutError):
            for _ in range(100):
                producer.send("full", b"y" * 500, partition=0)
        assert 0.25 < time.monotonic() - started < 5
    finally:
        producer.close(0)
        broker.kill()


def test_sync_send_waits_for_buffer_space_and_delivers_everything(
    broker: BrokerProcess,
) -> None:
    """A producer far ahead of the broker blocks in send() (on its own thread) batch
    after batch; every record still arrives once, in order."""
    values = [b"%04d" % i + b"v" * 1_000 for i in range(300)]
    config = {"buffer_memory": 8_192, "batch_size": 2_048, "max_request_size": 8_192}
    with Producer(broker.bootstrap, acks="all", **config) as p:
        handles = [p.send("space", v, partition=0) for v in values]
        assert [h.get(10).offset for h in handles] == list(range(300))
    assert [r.value for r in read_all(broker.bootstrap, "space")[0]] == values


def test_consumer_positions_seek_and_offsets(broker: BrokerProcess) -> None:
    with Producer(broker.bootstrap) as producer:
        producer.send_batch("o", [b"%d" % i for i in range(10)], partition=0).get(10)
    with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="latest") as c:
        tp = TopicPartition("o", 0)
        c.assign([tp])
        assert c.partitions_for_topic("o") == {0}
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 10}
        assert c.position(tp) == 10  # latest
        assert c.poll(timeout_ms=200) == {}
        c.seek(tp, 7)
        assert [r.value for r in c.poll(timeout_ms=5_000)[tp]] == [b"7", b"8", b"9"]
        c.seek_to_beginning(tp)
        assert c.position(tp) == 0
        c.seek_to_end()
        assert c.position(tp) == 10
        assert c.offsets_for_times({tp: 0}) == {tp: 0}
        assert "o" in c.topics()
        c.seek(tp, 1_000)  # beyond the end: reset by auto_offset_reset
        assert c.poll(timeout_ms=1_000) == {}
        assert c.position(tp) == 10
        with pytest.raises(MinibrokerError):
            c.partitions_for_topic("no-such-topic")


def test_auto_offset_reset_none_needs_a_seek(broker: BrokerProcess) -> None:
    with Producer(broker.bootstrap) as producer:
        producer.send_batch("none", [b"a", b"b"], partition=0).get(10)
    tp = TopicPartition("none", 0)
    with Consumer(tp, bootstrap_servers=broker.bootstrap, auto_offset_reset="none") as c:
        with pytest.raises(MinibrokerError, match="auto_offset_reset"):
            c.position(tp)
        c.seek(tp, 1)
        assert [r.value for r in c.poll(timeout_ms=5_000)[tp]] == [b"b"]
        c.seek(tp, 50)
        with pytest.raises(MinibrokerError, match="out of range"):
            c.poll(timeout_ms=5_000)


def test_consumer_iteration_stops_after_consumer_timeout(broker: BrokerProcess) -> None:
    with Producer(broker.bootstrap) as producer:
        producer.send_batch("it", [b"a", b"b", b"c"], partition=0)
    with Consumer(
        "it",
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=2_000,  # the first fetch must come within it, on a busy machine too
    ) as c:
        assert [r.value for r in c] == [b"a", b"b", b"c"]


def test_iteration_break_position_and_seek_keep_their_place(broker: BrokerProcess) -> None:
    with Producer(broker.bootstrap) as producer:
        producer.send_batch("loc", [b"%d" % i for i in range(100)], partition=0)
    tp = TopicPartition("loc", 0)
    with Consumer(tp, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as c:
        first = []
        for record in c:
            first.append(int(record.value))
            if len(first) == 10:
                break
        assert first == list(range(10))
        assert c.position(tp) == 10  # records fetched but not yet returned do not count
        assert [int(r.value) for r in c.poll(timeout_ms=1_000, max_records=5)[tp]] == [
            10,
            11,
            12,
            13,
            14,
        ]
        c.seek(tp, 90)
        assert [int(r.value) for r in c.poll(timeout_ms=5_000)[tp]] == list(range(90, 100))
        assert c.poll(timeout_ms=100) == {}


def test_a_break_at_the_last_record_held_leaves_nothing_used_up_behind(
    broker: BrokerProcess,
) -> None:
    """An iteration broken off at the last record the consumer holds (one fetched batch):
    poll(), position() and next() go on from the next offset. The used-up batch stayed
    at the head of the buffer: poll() answered {tp: []}, position() and next() raised
    IndexError."""
    tp = TopicPartition("held", 0)
    with (
        Producer(broker.bootstrap) as producer,
        Consumer(tp, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as c,
    ):
        producer.send_batch("held", [b"a", b"b", b"c"], partition=0).get(10)
        assert [r.value for r in itertools.islice(c, 3)] == [b"a", b"b", b"c"]
        assert c.position(tp) == 3
        assert c.poll(timeout_ms=100) == {}
        producer.send("held", b"d", partition=0).get(10)
        assert next(c).value == b"d"


def test_corrupt_fetched_batch_raises_naming_topic_partition_offset(
    broker: BrokerProcess,
) -> None:
    with Producer(broker.bootstrap) as producer:
        producer.send_batch("bad", [b"a", b"b"], partition=0).get(10)
        producer.send_batch("bad", [b"c", b"d"], partition=0).get(10)
    tp = TopicPartition("bad", 0)
    with (
        FaultProxy(lambda: (broker.host, broker.port), corrupt_fetch=1.0).start() as proxy,
        Consumer(tp, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest") as c,
    ):
        good = c.poll(timeout_ms=5_000)
        assert [r.value for r in good[tp]] == [b"a", b"b"]
        with pytest.raises(CorruptRecordError) as info:
            c.poll(timeout_ms=5_000)
        assert (info.value.topic, info.value.partition, info.value.offset) == ("bad", 0, 2)
        assert "bad-0 at offset 2" in str(info.value)


def test_consumer_of_a_topic_picks_it_up_once_created(broker: BrokerProcess) -> None:
    with Consumer(
        "later", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest"
    ) as consumer:
        assert consumer.poll(timeout_ms=100) == {}
        create_topic(broker.bootstrap, "later", partitions=2)
        with Producer(broker.bootstrap) as producer:
            producer.send("later", b"hello", partition=1).get(10)
        deadline = time.monotonic() + 10
        got: list = []
        while not got and time.monotonic() < deadline:
            got = [r for records in consumer.poll(timeout_ms=500).values() for r in records]
        assert [(r.partition, r.value) for r in got] == [(1, b"hello")]


def test_admin_helpers(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "adm", partitions=3)
    with pytest.raises(TopicAlreadyExistsError):
        create_topic(broker.bootstrap, "adm", partitions=3)
    create_topic(broker.bootstrap, "adm", partitions=3, exist_ok=True)
    assert "adm" in list_topics(broker.bootstrap)
    description = describe_topic(broker.bootstrap, "adm")
    assert description.topic == "adm"
    assert [p.partition for p in description.partitions] == [0, 1, 2]
    assert all(p.end_offset == 0 for p in description.partitions)


# --------------------------------------------------------------------------- async face


@pytest.mark.anyio
async def test_async_round_trip(broker: BrokerProcess) -> None:
    await create_topic_async(broker.bootstrap, "as", partitions=2)
    async with AsyncProducer(broker.bootstrap) as producer:
        metadata = await producer.send_and_wait("as", b"first", partition=0)
        assert metadata == RecordMetadata("as", 0, 0, metadata.timestamp)
        handle = await producer.send("as", b"second", partition=0)
        assert (await handle).offset == 1
        batch = await producer.send_batch("as", [b"b1", b"b2"], partition=1)
        assert await batch == [BatchMetadata("as", 1, 0, 2)]
        await producer.flush(10)
        assert await producer.partitions_for("as") == {0, 1}

    async with AsyncConsumer(
        "as",
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=500,
    ) as consumer:
        assert consumer.assignment() == {TopicPartition("as", 0), TopicPartition("as", 1)}
        one = await consumer.getone(TopicPartition("as", 0))
        assert one.value == b"first"
        rest = [r.value async for r in consumer]
        assert sorted(rest) == [b"b1", b"b2", b"second"]
        consumer.seek(TopicPartition("as", 1), 1)
        many = await consumer.getmany(timeout_ms=2_000)
        assert [r.value for r in many[TopicPartition("as", 1)]] == [b"b2"]
        assert await consumer.end_offsets([TopicPartition("as", 1)]) == {TopicPartition("as", 1): 2}


@pytest.mark.anyio
async def test_async_done_callbacks_run_on_the_event_loop(broker: BrokerProcess) -> None:
    seen: list[tuple[int, int]] = []
    async with AsyncProducer(broker.bootstrap) as producer:
        handle = await producer.send("t", b"v", partition=0)
        done = anyio.Event()

        def on_done(h: RecordHandle) -> None:
            seen.append((h.get(0).offset, threading.get_ident()))
            done.set()  # an anyio.Event: only legal on the event loop's thread

        handle.add_done_callback(on_done)
        with anyio.fail_after(10):
            await done.wait()
    assert seen == [(0, threading.get_ident())]  # this test runs on the event loop's thread


@pytest.mark.anyio
async def test_async_send_waits_for_buffer_space(broker: BrokerProcess) -> None:
    async with AsyncProducer(
        broker.bootstrap, buffer_memory=8_192, batch_size=1_024, max_request_size=1_024, **FAST
    ) as producer:
        handles = [await producer.send("bp", b"z" * 200, partition=0) for _ in range(500)]
        await producer.flush()
        assert [(await h).offset for h in handles] == list(range(500))


@pytest.mark.anyio
async def test_async_consumer_waits_for_records_produced_later(broker: BrokerProcess) -> None:
    async with (
        AsyncConsumer(
            TopicPartition("late", 0),
            bootstrap_servers=broker.bootstrap,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        ) as consumer,
        AsyncProducer(broker.bootstrap) as producer,
    ):
        await producer.send_and_wait("late", b"warm-up", partition=0)
        async with anyio.create_task_group() as tg:

            async def produce_later() -> None:
                await anyio.sleep(0.2)
                await producer.send_and_wait("late", b"later", partition=0)

            tg.start_soon(produce_later)
            values = [(await consumer.getone()).value for _ in range(2)]
        assert values == [b"warm-up", b"later"]


def test_batches_grown_past_the_brokers_message_max_bytes_are_split(tmp_path: Path) -> None:
    """A broker that takes batches of at most 64 KiB, a producer whose batches grow up to
    1 MiB while its one in-flight slot is taken: every batch the broker refuses as too
    large is split and resent, and every record lands once, in order, at its offset."""
    broker = BrokerProcess(tmp_path / "data", config="message_max_bytes = 65536\n").start()
    values = [b"%05d" % i + bytes(1_019) for i in range(3_000)]
    try:
        create_topic(broker.bootstrap, "split", partitions=1)
        with Producer(broker.bootstrap, max_in_flight_requests_per_connection=1) as producer:
            handles = [producer.send("split", value, partition=0) for value in values]
            producer.flush(60)
            assert [h.get(0).offset for h in handles] == list(range(len(values)))
        tp = TopicPartition("split", 0)
        with Consumer(tp, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as c:
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < len(values) and time.monotonic() < deadline:
                for records in c.poll(timeout_ms=500).values():
                    got += [r.value for r in records]
        assert got == values
    finally:
        broker.kill()
