"""A streaming pipeline through minibroker, exactly once across a query restart.

Reads topic A with `readStream.format("minibroker")`, transforms each event, and writes
topic B with `writeStream.format("minibroker")`. The query is stopped in the middle of
its work and started again from its checkpoint; B then holds every event of A exactly
once for a read_committed reader.

Start a broker in one terminal (`make run`, which listens on 127.0.0.1:9092),
then in another:

    .venv/bin/python examples/streaming_exactly_once.py
    .venv/bin/python examples/streaming_exactly_once.py --events 50000 --per-batch 2000

Each run uses fresh topics and a fresh checkpoint directory (printed), so it can be
repeated; the checkpoint is a temporary directory removed at the end, unless
`--checkpoint DIR` keeps it where you want it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections import Counter

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from client import Consumer, Producer, TopicPartition
from client.admin import create_topic


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="broker host:port")
    parser.add_argument("--events", type=int, default=10_000, help="events written to A")
    parser.add_argument("--per-batch", type=int, default=1_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument(
        "--checkpoint", help="the query's checkpoint, kept (default: a temp dir, removed)"
    )
    return parser.parse_args()


def start(spark: SparkSession, args: argparse.Namespace, a: str, b: str) -> StreamingQuery:
    events = (
        spark.readStream.format("minibroker")
        .option("minibroker.bootstrap.servers", args.bootstrap)
        .option("subscribe", a)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.per_batch))
        .load()
    )
    # The transform: upper-case the event, keep its key, and say where it came from.
    out = events.select(
        "key",
        F.upper(F.col("value").cast("string")).alias("value"),
        F.array(
            F.struct(
                F.lit("source").alias("key"),
                F.format_string("%s[%d]@%d", "topic", "partition", "offset")
                .cast("binary")
                .alias("value"),
            )
        ).alias("headers"),
    )
    return (
        out.writeStream.format("minibroker")
        .option("minibroker.bootstrap.servers", args.bootstrap)
        .option("topic", b)
        .option("checkpointLocation", args.checkpoint)
        .start()
    )


def read_all(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """Every value of `topic` a read_committed reader sees."""
    consumer = Consumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = consumer.end_offsets(tps)
        consumer.assign(tps)
        out: list[bytes] = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=500, max_records=10_000).values():
                out += [r.value for r in records]
        return out
    finally:
        consumer.close()


def main() -> int:
    args = parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    run = uuid.uuid4().hex[:8]
    if args.checkpoint is not None:
        return run_pipeline(args, run)
    with tempfile.TemporaryDirectory(prefix=f"minibroker-{run}-") as checkpoint:
        args.checkpoint = checkpoint
        return run_pipeline(args, run)


def run_pipeline(args: argparse.Namespace, run: str) -> int:
    a, b = f"events-{run}", f"events-upper-{run}"
    print(f"topics {a} -> {b}, checkpoint {args.checkpoint}")
    for topic in (a, b):
        create_topic(args.bootstrap, topic, partitions=args.partitions)
    with Producer(args.bootstrap) as p:
        for i in range(args.events):
            p.send(a, b"event-%d" % i, key=b"user-%d" % (i % 97))

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("minibroker-streaming-exactly-once")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    # First run: stopped as soon as a few micro-batches have gone through.
    query = start(spark, args, a, b)
    while (query.lastProgress or {}).get("batchId", -1) < 2 and query.isActive:
        time.sleep(0.1)
    query.stop()
    print(f"stopped after micro-batch {query.lastProgress['batchId']}; restarting")
    # Second run: the same checkpoint; it goes on where the first one stopped.
    query = start(spark, args, a, b)
    query.processAllAvailable()
    query.stop()
    spark.stop()

    got = Counter(read_all(args.bootstrap, b, args.partitions))
    wanted = Counter(b"EVENT-%d" % i for i in range(args.events))
    missing, doubled = wanted - got, +(got - wanted)
    print(f"events in A: {args.events}, in B: {sum(got.values())}, distinct: {len(got)}")
    if missing or doubled:
        print(f"NOT exactly once: {len(missing)} missing, {len(doubled)} doubled", file=sys.stderr)
        return 1
    print("B holds every event of A exactly once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
