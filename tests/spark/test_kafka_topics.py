"""Spark's batch reader on a topic that Kafka's clients wrote through the broker's kafka
listener: the v2 batches (each client's codec) arrive as the rows Spark's Kafka source
would give, with keys, values, headers, offsets and create times."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.kafka.kafka_support import KafkaStack, Rec, produce, records, start_stack

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
