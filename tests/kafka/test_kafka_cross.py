"""One topic, two protocols, on both backends: what Kafka's clients write through the
kafka listener, minibroker's SDK reads through its own listener, and what the SDK writes
(plain, compressed, in committed and aborted transactions) Kafka's clients read through
the kafka listener, with the same keys, values, headers, offsets and timestamps.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from client import Consumer, Producer, TopicPartition
from tests.conftest import BACKENDS
from tests.kafka.kafka_support import (
    KafkaStack,
    Rec,
    header_pairs,
    produce,
    read_back,
    records,
    stack_per_backend,
    without_offsets,
)

RECORDS = 200
DEADLINE_MS = 30_000


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaStack]:
    yield from stack_per_backend(request, tmp_path_factory, "cross", proxied=False)


def read_sdk(bootstrap: str, topic: str, count: int) -> list[Rec]:
    """Partition 0 from the beginning with minibroker's Consumer, manually assigned."""
    out: list[Rec] = []
    with Consumer(
        TopicPartition(topic, 0), bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    ) as consumer:
        polls = 0
        while len(out) < count and polls < DEADLINE_MS // 500:
            polls += 1
            for batch in consumer.poll(timeout_ms=500, max_records=count - len(out)).values():
                out += [
                    Rec(r.key, r.value, header_pairs(r.headers), r.timestamp, r.offset)
                    for r in batch
                ]
    return out


@pytest.mark.parametrize(
    ("client", "codec"),
    [
        ("kafka-python", "gzip"),
        ("aiokafka", "snappy"),
        ("confluent-kafka", "lz4"),
        ("confluent-kafka", "zstd"),
        ("confluent-kafka", "none"),
    ],
)
def test_sdk_reads_what_kafka_clients_wrote(stack: KafkaStack, client: str, codec: str) -> None:
    """Kafka's v2 batches (CRC-32C, varint records, each codec) as Kafka's clients wrote
    them are what minibroker's consumer decodes: every field, at the acknowledged offset."""
    topic = stack.new_topic(f"to-sdk-{client}-{codec}")
    sent = records(RECORDS, f"{client}-{codec}")
    offsets = produce(client, stack.kafka, topic, sent, codec)
    back = read_sdk(stack.mb, topic, RECORDS)
    assert [r.offset for r in back] == offsets == list(range(RECORDS))
    assert without_offsets(back) == sent


def sdk_send(producer: Producer, topic: str, chunk: list[Rec]) -> list[Rec]:
    """`chunk` sent to partition 0 and acknowledged, each with its offset."""
    handles = [
        producer.send(
            topic,
            r.value,
            key=r.key,
            partition=0,
            headers=list(r.headers),
            timestamp_ms=r.timestamp,
        )
        for r in chunk
    ]
    producer.flush(30)
    return [
        r._replace(offset=h.get(timeout=30).offset) for r, h in zip(chunk, handles, strict=True)
    ]


def write_with_sdk(bootstrap: str, topic: str) -> tuple[list[Rec], list[Rec]]:
    """Records from minibroker's producers in turn: uncompressed, gzip, zstd and lz4 (each
    its own idempotent producer), a committed transaction, an aborted one, then plain
    again. Returns (what a read_committed reader must see, at the offsets the producers
    were acknowledged with; the aborted records)."""
    sent = records(7 * 30, "sdk")
    chunks = [sent[i : i + 30] for i in range(0, len(sent), 30)]
    visible: list[Rec] = []
    aborted: list[Rec] = []

    for chunk, codec in zip(chunks[:4], (None, "gzip", "zstd", "lz4"), strict=True):
        with Producer(bootstrap, compression_type=codec, linger_ms=5) as producer:
            visible += sdk_send(producer, topic, chunk)
    with Producer(bootstrap, transactional_id=f"{topic}-tx", compression_type="zstd") as tx:
        tx.init_transactions()
        tx.begin_transaction()
        visible += sdk_send(tx, topic, chunks[4])
        tx.commit_transaction()
        tx.begin_transaction()
        aborted += sdk_send(tx, topic, chunks[5])
        tx.abort_transaction()
    with Producer(bootstrap) as producer:
        visible += sdk_send(producer, topic, chunks[6])
    return visible, aborted


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "confluent-kafka"])
def test_kafka_clients_read_what_the_sdk_wrote(stack: KafkaStack, client: str) -> None:
    """Tried: minibroker's own batches (msgpack records, each codec), a transaction's
    control records taking offsets, and an aborted transaction between committed data;
    a read_committed Kafka consumer must get every committed record with its fields at
    the SDK's acknowledged offset, and none of the aborted ones."""
    topic = stack.new_topic(f"from-sdk-{client}")
    visible, _aborted = write_with_sdk(stack.mb, topic)
    back = read_back(client, stack.kafka, topic, len(visible))
    assert back == visible  # the aborted records, in the middle, are not among them


def test_a_read_uncommitted_kafka_consumer_sees_the_aborted_records(stack: KafkaStack) -> None:
    """The aborted records are in the log, so the read_committed test above shows
    filtering, not loss: read_uncommitted gets them at their offsets, in order."""
    topic = stack.new_topic("from-sdk-uncommitted")
    visible, aborted = write_with_sdk(stack.mb, topic)
    everything = sorted(visible + aborted, key=lambda r: r.offset)
    back = read_back("confluent-kafka", stack.kafka, topic, len(everything), "read_uncommitted")
    assert back == everything


def test_a_topic_written_through_both_listeners_reads_the_same_through_both(
    stack: KafkaStack,
) -> None:
    """Kafka's v2 batches and minibroker's own, interleaved in one partition (confluent-kafka
    zstd, the SDK gzip, kafka-python lz4, the SDK again): minibroker's consumer and two
    Kafka consumers each read every record once, in order, at its acknowledged offset."""
    topic = stack.new_topic("mixed")
    sent = records(4 * 50, "mixed")
    chunks = [sent[i : i + 50] for i in range(0, len(sent), 50)]
    expected: list[Rec] = []
    for chunk, writer, codec in zip(
        chunks,
        ("confluent-kafka", "sdk", "kafka-python", "sdk"),
        ("zstd", "gzip", "lz4", "none"),
        strict=True,
    ):
        if writer == "sdk":
            with Producer(stack.mb, compression_type=None if codec == "none" else codec) as p:
                expected += sdk_send(p, topic, chunk)
        else:
            offsets = produce(writer, stack.kafka, topic, chunk, codec)
            expected += [r._replace(offset=o) for r, o in zip(chunk, offsets, strict=True)]
    assert [r.offset for r in expected] == list(range(len(sent)))
    assert read_sdk(stack.mb, topic, len(sent)) == expected
    for client in ("confluent-kafka", "kafka-python"):
        assert read_back(client, stack.kafka, topic, len(sent)) == expected, client
