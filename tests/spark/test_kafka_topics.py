"""Spark's batch reader on a topic that Kafka's clients wrote through the broker's kafka
listener: the v2 batches (each client's codec) arrive as the rows Spark's Kafka source
would give, with keys, values, headers, offsets and create times; a Kafka client's
transactions are read at read_committed."""

from __future__ import annotations

from collections.abc import Iterator

import confluent_kafka
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.kafka.kafka_support import (
    DEADLINE_S,
    KafkaStack,
    Rec,
    produce,
    records,
    start_stack,
)

RECORDS = 300


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaStack]:
    stack = start_stack(tmp_path_factory.mktemp("spark-kafka") / "data", "trio", proxied=False)
    try:
        yield stack
    finally:
        stack.close()


@pytest.mark.parametrize(
    ("client", "codec"), [("confluent-kafka", "zstd"), ("kafka-python", "lz4")]
)
def test_spark_reads_a_topic_kafka_clients_wrote(
    spark: SparkSession, stack: KafkaStack, client: str, codec: str
) -> None:
    topic = stack.new_topic(f"spark-{client}")
    sent = records(RECORDS, client)
    offsets = produce(client, stack.kafka, topic, sent, codec)
    rows = (
        spark.read.format("minibroker")
        .option("minibroker.bootstrap.servers", stack.mb)
        .option("topic", topic)
        .load()
        .select(
            "key",
            "value",
            "headers",
            F.unix_millis("timestamp").alias("ms"),
            "offset",
            "partition",
        )
        .orderBy("offset")
        .collect()
    )
    back = [
        Rec(
            None if r.key is None else bytes(r.key),
            None if r.value is None else bytes(r.value),
            tuple((h.key, bytes(h.value)) for h in r.headers or ()),
            r.ms,
            r.offset,
        )
        for r in rows
    ]
    assert {r.partition for r in rows} == {0}
    assert back == [r._replace(offset=o) for r, o in zip(sent, offsets, strict=True)]


def test_spark_reads_a_kafka_clients_transactions_at_read_committed(
    spark: SparkSession, stack: KafkaStack
) -> None:
    """confluent-kafka's transactions over two partitions, committed, aborted, committed:
    Spark's reader (read_committed by default) gets the committed ones whole and
    nothing of the aborted one, the markers Kafka's client had the coordinator write
    read as the native ones; at read_uncommitted it gets all three."""
    topic = stack.new_topic("spark-txn", partitions=2)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": stack.kafka, "transactional.id": f"{topic}-tx"}
    )
    producer.init_transactions(DEADLINE_S)
    sent: dict[str, list[bytes]] = {}
    for tag, commit in (("c1", True), ("a2", False), ("c3", True)):
        sent[tag] = [f"{tag}-{i}".encode() for i in range(10)]
        producer.begin_transaction()
        for i, value in enumerate(sent[tag]):
            producer.produce(topic, value=value, partition=i % 2)
        # Written before the end: librdkafka's abort drops what it has not sent yet.
        assert producer.flush(DEADLINE_S) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(DEADLINE_S)

    def values(isolation: str) -> list[bytes]:
        rows = (
            spark.read.format("minibroker")
            .option("minibroker.bootstrap.servers", stack.mb)
            .option("topic", topic)
            .option("isolation.level", isolation)
            .load()
            .select("value")
            .collect()
        )
        return sorted(bytes(r.value) for r in rows)

    assert values("read_committed") == sorted(sent["c1"] + sent["c3"])
    assert values("read_uncommitted") == sorted(v for vs in sent.values() for v in vs)
