"""`format("minibroker")` end to end: a real local SparkSession against a real broker."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from harness.broker_process import BrokerProcess
from spark_connector import use_in_this_thread
from spark_connector.reader import HEADERS_TYPE
from tests.spark.faults import FailingOnceWriter, FaultSource
from tests.spark.topics import end_offsets, ends_at, new_topic, read, writer

pytestmark = pytest.mark.spark


# --------------------------------------------------------------------------- round trip


def test_write_then_read_back_every_column(
    spark: SparkSession, shared_broker: BrokerProcess
) -> None:
    """Keys, values, explicit and chosen partitions and headers survive a round trip."""
    topic = new_topic(shared_broker, partitions=3)
    rows = [
        (
            None if i % 7 == 0 else f"key-{i}",
            f"value-{i}".encode() * (1 + i % 3),
            None if i % 5 == 0 else i % 3,
            None if i % 2 else [("i", str(i).encode()), ("parity", b"even")],
        )
        for i in range(3000)
    ]
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("partition", IntegerType()),
            StructField("headers", HEADERS_TYPE),
        ]
    )
    df = spark.createDataFrame(rows, schema).repartition(2)
    writer(df, shared_broker).option("topic", topic).save()

    back = read(spark, shared_broker, topic=topic).collect()
    assert len(back) == len(rows)
    assert {r.topic for r in back} == {topic}
    expected = Counter(
        (k.encode() if k else None, v, tuple(h) if h else None) for k, v, _p, h in rows
    )
    got = Counter(
        (r.key, r.value, tuple((h.key, h.value) for h in r.headers) if r.headers else None)
        for r in back
    )
    assert got == expected
    wanted_partition = {v: p for _k, v, p, _h in rows if p is not None}
    assert all(
        r.partition == wanted_partition[r.value] for r in back if r.value in wanted_partition
    )
    for p in range(3):
        offsets = sorted(r.offset for r in back if r.partition == p)
        assert offsets == list(range(len(offsets)))  # every offset once, none skipped
    now = time.time()
    assert all(now - 300 < r.timestamp.timestamp() <= now + 5 for r in back)


def test_topic_column_string_values_and_subscribe(
    spark: SparkSession, shared_broker: BrokerProcess
) -> None:
    """A `topic` column routes rows; string values and binary keys; long partitions."""
    first, second = new_topic(shared_broker, 2), new_topic(shared_broker, 1)
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("key", BinaryType()),
            StructField("value", StringType()),
            StructField("partition", LongType()),
            StructField("ignored", IntegerType()),
        ]
    )
    rows = [
        (first if i % 3 else second, str(i).encode(), f"v{i}", 0 if i % 3 == 0 else i % 2, i)
        for i in range(500)
    ]
    writer(spark.createDataFrame(rows, schema), shared_broker).save()

    back = read(spark, shared_broker, subscribe=f"{first},{second}").collect()
    assert sorted((r.topic, r.key, r.value.decode(), r.partition) for r in back) == sorted(
        (t, k, v, p) for t, k, v, p, _ in rows
    )


def test_offsets_options_and_split_partitions(
    spark: SparkSession, shared_broker: BrokerProcess
) -> None:
    topic = new_topic(shared_broker, partitions=2)
    df = spark.range(0, 1000).selectExpr(
        "cast(id as string) as value", "cast(id % 2 as int) as partition"
    )
    # No transaction markers, so that records and offsets are the same numbers.
    delivery = {"minibroker.delivery": "at_least_once"}
    writer(df, shared_broker).options(**delivery).option("topic", topic).save()
    assert end_offsets(shared_broker, topic, 2) == {0: 500, 1: 500}

    split = read(spark, shared_broker, topic=topic, maxRecordsPerPartition="100")
    assert split.rdd.getNumPartitions() == 10
    assert split.count() == 1000

    window = read(
        spark,
        shared_broker,
        topic=topic,
        startingOffsets=f'{{"{topic}": {{"0": 10, "1": -2}}}}',
        endingOffsets=f'{{"{topic}": {{"0": 20, "1": 5}}}}',
        maxRecordsPerPartition="3",
    ).collect()
    assert sorted((r.partition, r.offset) for r in window) == [(0, o) for o in range(10, 20)] + [
        (1, o) for o in range(5)
    ]
    empty = read(spark, shared_broker, topic=topic, startingOffsets="latest")
    assert empty.count() == 0


# --------------------------------------------------------------------------- failures


def test_failed_attempt_is_retried_at_least_once(
    spark: SparkSession, shared_broker: BrokerProcess
) -> None:
    """at_least_once: rows the failed attempt pushed appear twice, no row is lost."""
    spark.dataSource.register(FaultSource)
    topic = new_topic(shared_broker, partitions=2)
    total = 4000
    # Spark partition 0 holds values 0..1999 in order.
    df = spark.range(0, total, numPartitions=2).selectExpr("cast(id as string) as value")
    (
        writer(df, shared_broker, fmt="minibroker_faults")
        .option("test.fault", "failing_once")
        .option("topic", topic)
        .option("minibroker.delivery", "at_least_once")
        .save()
    )

    counts = Counter(
        int(r.value) for r in read(spark, shared_broker, topic=topic).select("value").collect()
    )
    pushed_by_failed_attempt = FailingOnceWriter.FAIL_AFTER
    assert sum(counts.values()) == total + pushed_by_failed_attempt
    assert set(counts) == set(range(total))
    assert {v for v, n in counts.items() if n == 2} == set(range(pushed_by_failed_attempt))
    assert max(counts.values()) == 2


def test_broker_killed_during_write_loses_no_row(spark: SparkSession, tmp_path: Path) -> None:
    """kill -9 mid-write, restart on the same port: the job completes, every row once (the
    tasks' open transactions survive the restart, their resends are deduplicated)."""
    broker = BrokerProcess(tmp_path / "data", backend="trio").start()
    try:
        topic = new_topic(broker, partitions=2)
        total = 400_000
        df = spark.range(0, total, numPartitions=4).selectExpr(
            "cast(id as string) as value", "cast(id % 2 as int) as partition"
        )
        crashes: list[int] = []

        def crash_mid_write() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                written = sum(ends_at(broker, topic, 2, "read_uncommitted"))
                if written >= 20_000:
                    broker.kill()
                    crashes.append(written)
                    time.sleep(1.0)
                    broker.start()
                    return
                time.sleep(0.05)

        # The write stays on the main thread: Spark resolves pip-installed (pyspark_*)
        # sources only there, so the crash comes from the side.
        crasher = threading.Thread(target=crash_mid_write)
        crasher.start()
        writer(df, broker).option("topic", topic).save()
        crasher.join(timeout=150)
        assert crashes and crashes[0] < total, "the broker was not killed during the write"

        values = read(spark, broker, topic=topic).select("value")
        assert values.distinct().count() == total
        assert values.count() == total  # the idempotent resends left no duplicate
    finally:
        broker.kill()


# --------------------------------------------------------------------------- errors


def planning_error(action: Callable[[], object]) -> str:
    with pytest.raises(PySparkException) as info:
        action()
    return str(info.value)


def test_bad_options_fail_at_planning(spark: SparkSession, shared_broker: BrokerProcess) -> None:
    df = spark.range(3).selectExpr("cast(id as string) as value")
    boot = shared_broker.bootstrap

    def save(frame: DataFrame = df, mode: str = "append", **options: str) -> None:
        w = frame.write.format("minibroker").mode(mode)
        for name, value in options.items():
            w = w.option(name, value)
        w.save()

    with_boot = {"minibroker.bootstrap.servers": boot}
    assert "'minibroker.bootstrap.servers' is required" in planning_error(lambda: save(topic="t"))
    assert "'minibroker.linger.ms' must be a number" in planning_error(
        lambda: save(**with_boot, topic="t", **{"minibroker.linger.ms": "soon"})
    )
    assert "set option 'topic' or add a string column 'topic'" in planning_error(
        lambda: save(**with_boot)
    )
    assert "column 'key' must be string or binary, got bigint" in planning_error(
        lambda: save(spark.range(3).selectExpr("id as key", "'v' as value"), **with_boot, topic="t")
    )
    assert "save mode 'overwrite' is not supported" in planning_error(
        lambda: save(mode="overwrite", **with_boot, topic="t")
    )
    assert "'startingOffsets' must be earliest, latest or JSON" in planning_error(
        lambda: read(spark, shared_broker, topic="t", startingOffsets="first")
    )
    assert "topic 'no-such-topic' does not exist" in planning_error(
        lambda: read(spark, shared_broker, topic="no-such-topic").collect()
    )


# --------------------------------------------------------------------------- discovery


def test_format_works_without_register(spark: SparkSession, shared_broker: BrokerProcess) -> None:
    """The session never registers "minibroker": Spark finds `pyspark_minibroker` itself."""
    topic = new_topic(shared_broker, partitions=1)
    df = spark.range(5).selectExpr("cast(id as string) as value")
    writer(df, shared_broker).option("topic", topic).save()
    assert read(spark, shared_broker, topic=topic).count() == 5


def test_format_works_from_another_thread_once_it_uses_the_session(
    spark: SparkSession, shared_broker: BrokerProcess
) -> None:
    topic = new_topic(shared_broker, partitions=1)
    outcome: list[object] = []

    def save() -> None:
        use_in_this_thread(spark)
        try:
            writer(spark.range(7).selectExpr("cast(id as string) as value"), shared_broker).option(
                "topic", topic
            ).save()
            outcome.append("saved")
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=save)
    thread.start()
    thread.join(timeout=120)
    assert outcome == ["saved"]
    assert read(spark, shared_broker, topic=topic).count() == 7


def test_installed_distribution_is_found_by_sparks_lookup() -> None:
    """After `pip install`, Spark's lookup (pyspark/sql/worker/lookup_data_sources.py) must
    find `pyspark_minibroker` with `pkgutil.iter_modules()` from anywhere."""
    try:
        importlib.metadata.distribution("minibroker")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("minibroker is not pip-installed here (`make test` installs it)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = (
        "import pkgutil, pyspark_minibroker as m; "
        "names = {i.name for i in pkgutil.iter_modules()}; "
        "print(m.DefaultSource.name(), 'pyspark_minibroker' in names)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd="/", env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["minibroker", "True"], (
        "pyspark_minibroker imports but pkgutil.iter_modules() does not list it, so Spark will "
        "not register it: setuptools' editable install maps modules through a finder hook; "
        'give pyproject [tool.setuptools] package-dir = {"" = "."} (or install with '
        "--config-settings editable_mode=compat) so the install puts the root on sys.path"
    )
