"""Spark throughput: one DataFrame of 100-byte values into four sinks, then read back;
and a streaming query's end-to-end latency.

- `noop`: Spark's own sink that drops rows in the JVM; the ceiling for any sink.
- `discard`: a Python Arrow writer that drops every batch; the ceiling for any
  Python data source, since rows still cross from the JVM to a Python worker.
- `minibroker exactly_once` (the default) and `minibroker at_least_once`: the real
  write to a broker that this benchmark starts (harness.broker_process, a fresh
  data dir), with and without the per-task transactions.
Then the exactly-once topic is read back with `format("minibroker")` into `noop`.
Last, a query reads topic A and writes topic B (both minibroker, exactly once)
while records go into A at a fixed rate; each record's latency is from its send to
the moment a read_committed consumer of B gets it.

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
from typing import cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from bench import progress

ROOT = Path(__file__).resolve().parents[1]
VALUE_BYTES = 100
PARTITIONS = 2
ROUNDS = 3


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


def _medians(rounds: list[list[dict]]) -> list[dict]:
    """One row per measurement: the median round's figures, with the min-max of rows/s."""
    merged = []
    for runs in zip(*rounds, strict=True):
        rates = sorted(run["rows_per_s"] for run in runs)
        median = next(run for run in runs if run["rows_per_s"] == rates[len(rates) // 2])
        merged.append({**median, "min_max": f"{rates[0]:,}-{rates[-1]:,}", "runs": len(runs)})
    return merged


def _topic_offsets(bootstrap: str, topic: str) -> int:
    from client import Consumer, TopicPartition

    consumer = Consumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return sum(consumer.end_offsets(tps).values())
    finally:
        consumer.close()


def _measure(spark: SparkSession, bootstrap: str, topic: str, rows: int) -> list[dict]:
    """The five measurements over `rows` fresh rows, written to `topic`-eo and -alo."""
    from client.admin import create_topic

    df = _values(spark, rows)
    writes = {}
    for delivery in ("exactly_once", "at_least_once"):
        create_topic(bootstrap, f"{topic}-{delivery}", partitions=PARTITIONS)
        writes[delivery] = (
            df.write.format("minibroker")
            .mode("append")
            .option("minibroker.bootstrap.servers", bootstrap)
            .option("minibroker.delivery", delivery)
            .option("topic", f"{topic}-{delivery}")
        )
    results = [
        _timed("spark write noop", rows, df.write.format("noop").mode("overwrite").save),
        _timed(
            "spark write discard-only Python Arrow writer",
            rows,
            df.write.format("discard").mode("append").save,
        ),
        _timed("spark write minibroker exactly_once", rows, writes["exactly_once"].save),
        _timed("spark write minibroker at_least_once", rows, writes["at_least_once"].save),
    ]
    df.unpersist()
    # Every task attempt's transaction ends with one marker per partition it wrote to.
    markers = PARTITIONS * PARTITIONS
    for delivery, extra in (("exactly_once", markers), ("at_least_once", 0)):
        written = _topic_offsets(bootstrap, f"{topic}-{delivery}")
        if not rows <= written <= rows + extra:
            raise RuntimeError(f"{topic}-{delivery} holds {written} offsets for {rows} rows")
    back = (
        spark.read.format("minibroker")
        .option("minibroker.bootstrap.servers", bootstrap)
        .option("topic", f"{topic}-exactly_once")
        .load()
    )
    results.append(
        _timed("spark read minibroker", rows, back.write.format("noop").mode("overwrite").save)
    )
    return results


def _stream_latency(
    spark: SparkSession, bootstrap: str, checkpoint: Path, rate: int, seconds: float
) -> dict:
    """Records into topic A at `rate` per second for `seconds`, a query A -> B exactly
    once, a read_committed consumer of B: p50/p99 of send-to-receive, after a warm-up
    of a fifth of the run (query start-up, first micro-batches)."""
    import threading

    from client import Consumer, Producer, TopicPartition
    from client.admin import create_topic

    for name in ("stream-a", "stream-b"):
        create_topic(bootstrap, name, partitions=PARTITIONS)
    query = (
        spark.readStream.format("minibroker")
        .option("minibroker.bootstrap.servers", bootstrap)
        .option("subscribe", "stream-a")
        .option("startingOffsets", "earliest")
        .load()
        .select("value")
        .writeStream.format("minibroker")
        .option("minibroker.bootstrap.servers", bootstrap)
        .option("minibroker.linger.ms", "1")
        .option("topic", "stream-b")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    total = int(rate * seconds)

    def produce() -> None:
        with Producer(bootstrap, linger_ms=1) as p:
            start = time.perf_counter()
            for i in range(total):
                # Paced against the start, so a slow send does not lower the rate.
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                p.send("stream-a", b"%d" % time.time_ns())

    latencies: list[float] = []
    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        consumer.assign([TopicPartition("stream-b", p) for p in range(PARTITIONS)])
        producer = threading.Thread(target=produce)
        producer.start()
        deadline = time.monotonic() + seconds + 120
        while len(latencies) < total and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=100, max_records=10_000).values():
                now = time.time_ns()
                latencies += [(now - int(cast(bytes, r.value))) / 1e6 for r in records]
        producer.join()
    finally:
        consumer.close()
        query.stop()
    if len(latencies) != total:
        raise RuntimeError(f"stream-b got {len(latencies)} of {total} records")
    steady = sorted(latencies[total // 5 :])
    return {
        "benchmark": "spark stream minibroker A -> B exactly_once, end-to-end latency",
        "rows": total,
        "rate_per_s": rate,
        "p50_ms": round(steady[len(steady) // 2], 1),
        "p99_ms": round(steady[int(len(steady) * 0.99)], 1),
    }


def run(rows: int = 5_000_000, stream_rate: int = 2_000, stream_s: float = 30.0) -> list[dict]:
    """Write `rows` 100-byte values with local[2] into noop, discard and minibroker (both
    deliveries), then read them back; one dict per measurement, after a warm-up round on
    fewer rows (JIT, Python worker start-up and imports would otherwise land on the
    first sink); the median of `ROUNDS` rounds with its min-max. Then the streaming
    latency at `stream_rate` records/s."""
    from harness.broker_process import BrokerProcess

    spark = _session()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
            broker = BrokerProcess(Path(tmp) / "data", backend="trio").start()
            try:
                _measure(spark, broker.bootstrap, "warm-up", min(rows, 200_000))
                results = _medians(
                    [
                        _measure(spark, broker.bootstrap, f"bench{r}", rows)
                        for r in progress.rounds(ROUNDS, "write")
                    ]
                )
                stream = _stream_latency(
                    spark, broker.bootstrap, Path(tmp) / "checkpoint", stream_rate, stream_s
                )
            finally:
                broker.kill()
    finally:
        spark.stop()
    ceiling = results[1]["rows_per_s"]
    for result in results:
        result["share_of_python_ceiling"] = round(result["rows_per_s"] / ceiling, 3)
    return [*results, stream]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    for result in run(parser.parse_args().rows):
        print(json.dumps(result))


if __name__ == "__main__":
    main()
