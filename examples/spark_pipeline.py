"""A Spark pipeline through minibroker: make orders, write them to a topic, read them back.

Start a broker in one terminal (`make run`, which listens on 127.0.0.1:9092),
then in another:

    .venv/bin/python examples/spark_pipeline.py                  # 100,000 generated orders
    .venv/bin/python examples/spark_pipeline.py --csv orders.csv   # your own orders

A CSV needs a header line and the columns order_id,customer,amount,country.

It uses `format("minibroker")` with no registration call: installing the
project (`make run` does `pip install -e .`) lets Spark find the data source.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from client import Consumer, TopicPartition
from client.admin import create_topic
from client.errors import TopicAlreadyExistsError

ORDER_SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE, country STRING"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="broker host:port")
    parser.add_argument("--topic", default="orders-enriched")
    parser.add_argument("--partitions", type=int, default=3, help="when the topic is created")
    parser.add_argument("--rows", type=int, default=100_000, help="orders to generate")
    parser.add_argument("--csv", help="read orders from this CSV instead of generating them")
    return parser.parse_args()


def orders(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    if args.csv:
        return spark.read.csv(args.csv, header=True, schema=ORDER_SCHEMA)
    countries = F.array(*(F.lit(c) for c in ("DE", "FR", "JP", "US", "BR")))
    return spark.range(args.rows).select(
        F.col("id").alias("order_id"),
        F.format_string("customer-%04d", F.col("id") % 997).alias("customer"),
        F.round((F.col("id") * 7919 % 100_000) / 100, 2).alias("amount"),
        F.element_at(countries, (F.col("id") % 5 + 1).cast("int")).alias("country"),
    )


def starting_offsets(bootstrap: str, topic: str) -> str:
    """Where the topic ends now, so the read-back sees exactly this run's records."""
    consumer = Consumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = consumer.end_offsets(tps)
    finally:
        consumer.close()
    return json.dumps({topic: {str(tp.partition): offset for tp, offset in ends.items()}})


def main() -> int:
    args = parse_args()
    # Spark starts its Python workers with `python3` from PATH unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("minibroker-spark-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    with contextlib.suppress(TopicAlreadyExistsError):
        create_topic(args.bootstrap, args.topic, partitions=args.partitions)
    start = starting_offsets(args.bootstrap, args.topic)

    # Transform: keep paid orders, tag each with a size class, and key it by customer
    # so one customer's orders stay in order on one partition.
    source = orders(spark, args)
    enriched = source.where(F.col("amount") > 0).withColumn(
        "size", F.when(F.col("amount") >= 500, "large").otherwise("small")
    )
    records = enriched.select(
        F.col("customer").alias("key"),
        F.to_json(F.struct("order_id", "customer", "amount", "country", "size")).alias("value"),
        F.array(
            F.struct(F.lit("source").alias("key"), F.lit(b"spark_pipeline").alias("value"))
        ).alias("headers"),
    )
    (
        records.write.format("minibroker")
        .mode("append")
        .option("minibroker.bootstrap.servers", args.bootstrap)
        .option("topic", args.topic)
        .save()
    )

    back = (
        spark.read.format("minibroker")
        .option("minibroker.bootstrap.servers", args.bootstrap)
        .option("topic", args.topic)
        .option("startingOffsets", start)
        .load()
    )
    parsed = back.select(
        "partition",
        F.from_json(F.col("value").cast("string"), f"{ORDER_SCHEMA}, size STRING").alias("o"),
    ).select("partition", "o.*")

    generated, written, read_back = source.count(), records.count(), back.count()
    print(f"orders in: {generated}, records written: {written}, records read back: {read_back}")
    print("records per topic partition:")
    for row in parsed.groupBy("partition").count().orderBy("partition").collect():
        print(f"  {args.topic}[{row['partition']}]: {row['count']}")
    print("orders read back per country and size:")
    for row in parsed.groupBy("country", "size").count().orderBy("country", "size").collect():
        print(f"  {row['country']} {row['size']:>5}: {row['count']}")
    spark.stop()
    if read_back != written:
        print("MISMATCH: the topic did not return what was written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
