"""`readStream` / `writeStream` with `format("minibroker")`: a query stopped by failures at
random points and restarted from its checkpoint writes each input record once, and the
source restarted from its checkpoint neither skips nor repeats a record."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from client import Producer
from harness.broker_process import BrokerProcess
from spark_connector.options import stream_app_id
from tests.spark.faults import FaultSource, until
from tests.spark.topics import ends_at, new_topic, open_transactions, values

pytestmark = pytest.mark.spark

MICRO_BATCHES = 20
PER_BATCH = 100
POINTS = ("task", "before_commit", "after_commit", "stop")


def produce(broker: BrokerProcess, topic: str, items: range, partitions: int) -> None:
    with Producer(broker.bootstrap) as p:
        for i in items:
            p.send(topic, b"%d" % i, partition=i % partitions)


def wait_ended(query: StreamingQuery) -> None:
    deadline = time.monotonic() + 120
    while query.isActive:
        assert time.monotonic() < deadline, "the query did not end"
        time.sleep(0.05)


def test_sink_writes_each_record_once_across_failures_and_restarts(
    spark: SparkSession, shared_broker: BrokerProcess, tmp_path: Path
) -> None:
    spark.dataSource.register(FaultSource)
    seed = int(os.environ.get("MINIBROKER_STREAM_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    faults = sorted(
        zip(rng.sample(range(1, MICRO_BATCHES - 1), 5), rng.choices(POINTS, k=5), strict=True)
    )
    source, sink = new_topic(shared_broker, 2), new_topic(shared_broker, 2)
    total = MICRO_BATCHES * PER_BATCH
    produce(shared_broker, source, range(total), 2)
    checkpoint = tmp_path / "checkpoint"
    signals = tmp_path / "signals"
    signals.mkdir()

    def start() -> StreamingQuery:
        stream = (
            spark.readStream.format("minibroker")
            .option("minibroker.bootstrap.servers", shared_broker.bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(PER_BATCH))
            .load()
        )
        return (
            stream.selectExpr("value")
            .writeStream.format("minibroker_faults")
            .option("minibroker.bootstrap.servers", shared_broker.bootstrap)
            .option("minibroker.linger.ms", "2")
            .option("topic", sink)
            .option("test.dir", str(signals))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    for batch_id, point in faults:
        (signals / "armed").write_text(f"{batch_id} {point}")
        query = start()
        if point == "stop":
            until((signals / "stopping").exists, f"micro-batch {batch_id} to start")
            query.stop()
        wait_ended(query)
        assert (query.exception() is None) == (point == "stop"), (batch_id, point)
        (signals / "armed").unlink()
        (signals / "stopping").unlink(missing_ok=True)
    query = start()
    query.processAllAvailable()
    query.stop()

    context = f"seed {seed}, faults {faults}"
    assert Counter(values(shared_broker, sink, 2)) == Counter(b"%d" % i for i in range(total)), (
        context
    )
    app = stream_app_id({"checkpointlocation": str(checkpoint)})
    assert open_transactions(shared_broker, app) == [], context
    assert ends_at(shared_broker, sink, 2, "read_committed") == ends_at(
        shared_broker, sink, 2, "read_uncommitted"
    ), context


def test_source_restarted_from_its_checkpoint_neither_skips_nor_repeats(
    spark: SparkSession, shared_broker: BrokerProcess, tmp_path: Path
) -> None:
    """Source → Spark's file sink (exactly once by its own log), three runs; the input
    mixes plain records, committed and aborted transactions, and one transaction still
    open when a run drains the topic (the source must stop at it, then read it)."""
    prefix = f"src-{uuid.uuid4().hex[:8]}"
    topic = new_topic(shared_broker, 2, prefix=prefix)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    expected: list[bytes] = []

    def run() -> None:
        stream = (
            spark.readStream.format("minibroker")
            .option("minibroker.bootstrap.servers", shared_broker.bootstrap)
            .option("subscribePattern", f"{prefix}-.*")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "70")
            .load()
        )
        query = (
            stream.selectExpr("value", "partition", "offset")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        query.processAllAvailable()
        query.stop()

    produce(shared_broker, topic, range(0, 150), 2)
    expected += [b"%d" % i for i in range(150)]
    open_txn = Producer(shared_broker.bootstrap, transactional_id=f"{prefix}-open")
    try:
        open_txn.init_transactions()
        with Producer(shared_broker.bootstrap, transactional_id=f"{prefix}-tx") as tx:
            tx.init_transactions()
            with tx.transaction():
                for i in range(150, 200):
                    tx.send(topic, b"%d" % i, partition=i % 2)
            expected += [b"%d" % i for i in range(150, 200)]
            tx.begin_transaction()
            for i in range(200, 230):
                tx.send(topic, b"aborted-%d" % i, partition=i % 2)
            tx.abort_transaction()
        run()
        # A transaction left open holds both partitions' stable offsets: the next run must
        # stop at it and read nothing beyond, then the one after reads everything.
        open_txn.begin_transaction()
        for i in range(230, 260):
            open_txn.send(topic, b"%d" % i, partition=i % 2)
        open_txn.flush()
        produce(shared_broker, topic, range(260, 300), 2)
        run()
        seen_while_open = sorted(int(r.value) for r in spark.read.parquet(str(out)).collect())
        assert seen_while_open == list(range(200))
        open_txn.commit_transaction()
        expected += [b"%d" % i for i in range(230, 300)]
        run()
    finally:
        open_txn.close()
    rows = spark.read.parquet(str(out)).collect()
    assert Counter(r.value for r in rows) == Counter(expected)
    assert len({(r.partition, r.offset) for r in rows}) == len(rows)
