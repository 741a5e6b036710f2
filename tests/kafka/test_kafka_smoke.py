"""Kafka's own client against a real broker's kafka listener: an idempotent producer
with acks=all, and a consumer with manually assigned partitions and manual commits."""

from __future__ import annotations

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata

from client import Consumer, Producer
from tests.kafka.conftest import TwoListeners

RECORDS = 20


def test_kafka_python_produces_idempotently_and_reads_back(two_listeners: TwoListeners) -> None:
    address = two_listeners.kafka
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        assert admin._client.check_version() == (2, 8)  # what it reads from ApiVersions
        admin.create_topics([NewTopic("orders", 2, 1)])
        assert set(admin.list_topics()) == {"orders"}
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=address, enable_idempotence=True, acks="all")
    try:
        sent = [
            producer.send("orders", key=b"k%d" % i, value=b"v%d" % i, headers=[("n", b"%d" % i)])
            for i in range(RECORDS)
        ]
        producer.flush(timeout=30)
        offsets = [(m.partition, m.offset) for m in (f.get(timeout=30) for f in sent)]
    finally:
        producer.close()
    assert sorted(offsets) == sorted({(p, o) for p, o in offsets})  # each record once

    consumer = KafkaConsumer(
        bootstrap_servers=address,
        group_id="audit",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    try:
        partitions = [TopicPartition("orders", p) for p in (0, 1)]
        consumer.assign(partitions)
        got = {}
        for record in consumer:
            got[record.key] = (record.value, record.headers, (record.partition, record.offset))
            if len(got) == RECORDS:
                break
        consumer.commit({tp: OffsetAndMetadata(5, "", -1) for tp in partitions})
        committed = [consumer.committed(tp) for tp in partitions]
    finally:
        consumer.close()
    assert got == {b"k%d" % i: (b"v%d" % i, [("n", b"%d" % i)], offsets[i]) for i in range(RECORDS)}
    assert committed == [5, 5]


def test_our_sdk_reads_what_a_kafka_client_wrote(two_listeners: TwoListeners) -> None:
    producer = KafkaProducer(bootstrap_servers=two_listeners.kafka, acks="all")
    try:
        producer.send("mixed", value=b"from kafka").get(timeout=30)
    finally:
        producer.close()
    with Consumer(
        ("mixed", 0), bootstrap_servers=two_listeners.minibroker, auto_offset_reset="earliest"
    ) as ours:
        records = []
        for _ in range(20):
            records += [r for batch in ours.poll(timeout_ms=500).values() for r in batch]
            if records:
                break
    assert [(r.offset, r.value) for r in records] == [(0, b"from kafka")]


def test_kafka_python_reads_what_our_sdk_wrote(two_listeners: TwoListeners) -> None:
    """Our magic-1 batches reach a Kafka consumer converted to v2, beside v2 ones."""
    with Producer(bootstrap_servers=two_listeners.minibroker, acks="all") as ours:
        for i in range(3):
            ours.send("mixed", value=b"ours %d" % i, key=b"k", headers=[("h", b"1")])
        ours.flush(30)
    producer = KafkaProducer(bootstrap_servers=two_listeners.kafka, acks="all")
    try:
        producer.send("mixed", value=b"theirs").get(timeout=30)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=two_listeners.kafka,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    try:
        consumer.assign([TopicPartition("mixed", 0)])
        got = [(r.offset, r.key, r.value, r.headers) for r in consumer]
    finally:
        consumer.close()
    assert got == [
        (0, b"k", b"ours 0", [("h", b"1")]),
        (1, b"k", b"ours 1", [("h", b"1")]),
        (2, b"k", b"ours 2", [("h", b"1")]),
        (3, None, b"theirs", []),
    ]
