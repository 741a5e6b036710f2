"""Spark throughput: one DataFrame of 100-byte values into three sinks, then read back.

- `noop`: Spark's own sink that drops rows in the JVM; the ceiling for any sink.
- `discard`: a Python Arrow writer that drops every batch; the ceiling for any
  Python data source, since rows still cross from the JVM to a Python worker.
- `minibroker`: the real write through the idempotent producer to a broker that
  this benchmark starts (harness.broker_process, a fresh data dir).
Then the topic is read back with `format("minibroker")` into `noop`.

Run: `python -m bench.bench_spark [--rows N]`; `run()` is what `make bench` calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

ROOT = Path(__file__).resolve().parents[1]
VALUE_BYTES = 100
PARTITIONS = 2


@dataclass(frozen=True)
class DiscardCommit(WriterCommitMessage):
    rows: int


class DiscardWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator) -> DiscardCommit:
        return DiscardCommit(sum(batch.num_rows for batch in iterator))


class DiscardDataSource(DataSource):
    """The cheapest possible Python Arrow writer: counts rows and drops them."""

    @classmethod
    def name(cls) -> str:
        return "discard"

    def writer(self, schema: StructType, overwrite: bool) -> DiscardWriter:
        return DiscardWriter()


def _session() -> SparkSession:
    # Workers must run this interpreter (pyarrow) and import this module (DiscardDataSource).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
    spark = (
        SparkSession.builder.master(f"local[{PARTITIONS}]")
        .appName("minibroker-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(PARTITIONS))
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(DiscardDataSource)
    return spark


def _values(spark: SparkSession, rows: int) -> DataFrame:
    """`rows` distinct 100-byte binary values (92 filler bytes and the id as 8 bytes),
    cached so that every sink is timed on the same rows and not on generating them."""
    filler = VALUE_BYTES - 8
    df = spark.range(0, rows, numPartitions=PARTITIONS).selectExpr(
        f"concat(cast(repeat('x', {filler}) as binary), unhex(lpad(hex(id), 16, '0'))) as value"
    )
    df.cache().count()
    return df


def _timed(name: str, rows: int, action: Callable[[], object]) -> dict:
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    return {
        "benchmark": name,
        "rows": rows,
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds),
    }


def _topic_rows(bootstrap: str, topic: str) -> int:
    from client import Consumer, TopicPartition

    consumer = Consumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return sum(consumer.end_offsets(tps).values())
    finally:
        consumer.close()


def _measure(spark: SparkSession, bootstrap: str, topic: str, rows: int) -> list[dict]:
    """The four measurements over `rows` fresh rows, written to (and read from) `topic`."""
    from client.admin import create_topic

    create_topic(bootstrap, topic, partitions=PARTITIONS)
    df = _values(spark, rows)
    write = (
        df.write.format("minibroker")
        .mode("append")
        .option("minibroker.bootstrap.servers", bootstrap)
        .option("topic", topic)
    )
    results = [
        _timed("spark write noop", rows, df.write.format("noop").mode("overwrite").save),
        _timed(
            "spark write discard-only Python Arrow writer",
            rows,
            df.write.format("discard").mode("append").save,
        ),
        _timed("spark write minibroker", rows, write.save),
    ]
    df.unpersist()
    written = _topic_rows(bootstrap, topic)
    if written != rows:
        raise RuntimeError(f"{topic} holds {written} records, {rows} were written")
    back = (
        spark.read.format("minibroker")
        .option("minibroker.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .load()
    )
    results.append(
        _timed("spark read minibroker", rows, back.write.format("noop").mode("overwrite").save)
    )
    return results


def run(rows: int = 5_000_000) -> list[dict]:
    """Write `rows` 100-byte values with local[2] into noop, discard and minibroker, then
    read them back; one dict per measurement, after a warm-up round on fewer rows
    (JIT, Python worker start-up and imports would otherwise land on the first sink)."""
    from harness.broker_process import BrokerProcess

    spark = _session()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
            broker = BrokerProcess(Path(tmp) / "data", backend="trio").start()
            try:
                _measure(spark, broker.bootstrap, "warm-up", min(rows, 200_000))
                results = _measure(spark, broker.bootstrap, "bench", rows)
            finally:
                broker.kill()
    finally:
        spark.stop()
    ceiling = results[1]["rows_per_s"]
    for result in results:
        result["share_of_python_ceiling"] = round(result["rows_per_s"] / ceiling, 3)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    for result in run(parser.parse_args().rows):
        print(json.dumps(result))


if __name__ == "__main__":
    main()
