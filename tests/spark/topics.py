"""What the Spark tests need from the broker side: topics, writers and readers of them,
what a topic holds under each isolation level, and the transactions a write left."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from pyspark.sql import DataFrame, DataFrameWriter, SparkSession

from client import Consumer, TopicPartition
from client.admin import OPEN_TXN_STATES, create_topic, list_transactions
from harness.broker_process import BrokerProcess

DEADLINE_S = 60.0


def new_topic(broker: BrokerProcess, partitions: int, prefix: str = "spark") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, name, partitions=partitions)
    return name


def writer(df: DataFrame, broker: BrokerProcess, fmt: str = "minibroker") -> DataFrameWriter:
    return (
        df.write.format(fmt)
        .mode("append")
        .option("minibroker.bootstrap.servers", broker.bootstrap)
        .option("minibroker.linger.ms", "2")
    )


def read(spark: SparkSession, broker: BrokerProcess, **options: str) -> DataFrame:
    reader = spark.read.format("minibroker").option(
        "minibroker.bootstrap.servers", broker.bootstrap
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def end_offsets(broker: BrokerProcess, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(bootstrap_servers=broker.bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def values(
    broker: BrokerProcess, topic: str, partitions: int, isolation: str = "read_committed"
) -> list[bytes]:
    """Every value `topic` holds for a reader at `isolation`, partition by partition."""
    consumer = Consumer(
        bootstrap_servers=broker.bootstrap,
        isolation_level=isolation,
        auto_offset_reset="earliest",
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = consumer.end_offsets(tps)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        out: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "the topic was not read to its end in time"
            for records in consumer.poll(timeout_ms=200, max_records=10_000).values():
                out += [r.value for r in records]
        return out
    finally:
        consumer.close()


def stable(broker: BrokerProcess, topic: str, partitions: int) -> bool:
    """No partition of `topic` holds read_committed readers back (LSO = high watermark)."""
    return ends_at(broker, topic, partitions, "read_committed") == ends_at(
        broker, topic, partitions, "read_uncommitted"
    )


def ends_at(broker: BrokerProcess, topic: str, partitions: int, isolation: str) -> list[int]:
    consumer = Consumer(bootstrap_servers=broker.bootstrap, isolation_level=isolation)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = consumer.end_offsets(tps)
        return [ends[tp] for tp in tps]
    finally:
        consumer.close()


def transaction_states(broker: BrokerProcess, prefix: str = "spark-") -> dict[str, str]:
    return {t.transactional_id: t.state for t in list_transactions(broker.bootstrap, prefix)}


def open_transactions(broker: BrokerProcess, prefix: str) -> list[str]:
    return [
        t.transactional_id
        for t in list_transactions(broker.bootstrap, prefix, list(OPEN_TXN_STATES))
    ]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not in time: {what}"
        time.sleep(0.05)
