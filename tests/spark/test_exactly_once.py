"""`df.write.format("minibroker")` exactly once (the default) across Spark's task retries,
failed jobs, a broker restart before the driver's commit and a repeated commit.

Each test writes through a real local SparkSession into a real broker, then checks
what a read_committed reader sees, what the log holds under read_uncommitted, and the
transactions the write left (its ids start with its write id, "spark-...")."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import BinaryType, StructField, StructType

from client.admin import describe_txn_apps
from harness.broker_process import BrokerProcess
from spark_connector.options import write_options
from tests.spark.faults import FailingOnceWriter, FaultSource, TwoAttempts, until
from tests.spark.topics import (
    ends_at,
    new_topic,
    open_transactions,
    transaction_states,
    values,
    wait_for,
    writer,
)

pytestmark = pytest.mark.spark


def numbered(spark: SparkSession, total: int, partitions: int) -> DataFrame:
    """Values "0".."total-1"; Spark partition k holds a contiguous run of them, in order."""
    return spark.range(0, total, numPartitions=partitions).selectExpr("cast(id as string) as value")


def new_ids(before: set[str], broker: BrokerProcess) -> dict[str, str]:
    """The transactions created since `before` was taken, with their states."""
    return {t: s for t, s in transaction_states(broker).items() if t not in before}


def counts(broker: BrokerProcess, topic: str, partitions: int, isolation: str) -> Counter[int]:
    return Counter(int(v) for v in values(broker, topic, partitions, isolation))


def test_a_failed_attempt_leaves_its_rows_aborted_and_the_retry_counts_once(
    spark: SparkSession, shared_broker: BrokerProcess
) -> None:
    spark.dataSource.register(FaultSource)
    topic = new_topic(shared_broker, partitions=2)
    total = 4000
    before = set(transaction_states(shared_broker))
    (
        writer(numbered(spark, total, 2), shared_broker, fmt="minibroker_faults")
        .option("test.fault", "failing_once")
        .option("topic", topic)
        .save()
    )
    assert counts(shared_broker, topic, 2, "read_committed") == Counter(range(total))
    # The failed attempt did push its first rows: they are in the log, in a transaction
    # that was aborted, so only a read_uncommitted reader sees them twice.
    pushed = counts(shared_broker, topic, 2, "read_uncommitted")
    assert {v for v, n in pushed.items() if n == 2} == set(range(FailingOnceWriter.FAIL_AFTER))
    states = new_ids(before, shared_broker)
    [write_id] = {t.split(".")[0] for t in states}
    assert states == {
        f"{write_id}.p0.a0": "COMPLETE_ABORT",
        f"{write_id}.p0.a1": "COMPLETE_COMMIT",
        f"{write_id}.p1.a0": "COMPLETE_COMMIT",
    }
    assert ends_at(shared_broker, topic, 2, "read_committed") == ends_at(
        shared_broker, topic, 2, "read_uncommitted"
    )


def test_a_job_whose_task_always_fails_leaves_nothing_visible_and_nothing_open(
    spark: SparkSession, shared_broker: BrokerProcess, tmp_path: Path
) -> None:
    """Partition 1 fails in all 4 attempts; partition 3 is still running when Spark calls
    abort() and writes and prepares only after it: the broker refuses that prepare and
    aborts the transaction, which would otherwise wait for its prepared timeout."""
    spark.dataSource.register(FaultSource)
    topic = new_topic(shared_broker, partitions=2)
    before = set(transaction_states(shared_broker))
    with pytest.raises(PySparkException, match="injected failure"):
        (
            writer(numbered(spark, 4000, 4), shared_broker, fmt="minibroker_faults")
            .option("test.fault", "failing_always")
            .option("test.dir", str(tmp_path))
            .option("topic", topic)
            .save()
        )
    write_id = next(iter(new_ids(before, shared_broker))).split(".")[0]
    late = f"{write_id}.p3.a0"
    wait_for(
        lambda: transaction_states(shared_broker, late).get(late) == "COMPLETE_ABORT",
        "the late attempt's refused prepare",
    )
    assert open_transactions(shared_broker, write_id) == []
    states = new_ids(before, shared_broker)
    assert {t for t in states if ".p1." in t} == {f"{write_id}.p1.a{a}" for a in range(4)}
    assert set(states.values()) == {"COMPLETE_ABORT"}
    assert [
        (a.txn_app_id, a.txn_app_version)
        for a in describe_txn_apps(shared_broker.bootstrap, [write_id])
    ] == [(write_id, 0)]
    assert values(shared_broker, topic, 2, "read_committed") == []
    assert len(values(shared_broker, topic, 2, "read_uncommitted")) >= 4 * 100 + 1000
    assert ends_at(shared_broker, topic, 2, "read_committed") == ends_at(
        shared_broker, topic, 2, "read_uncommitted"
    )


def test_two_attempts_of_one_partition_both_finish_and_one_counts(
    shared_broker: BrokerProcess,
) -> None:
    """What a speculative copy does: two attempts of partition 0 write and prepare the
    same rows, Spark hands the driver one message; a third attempt finishing after the
    commit is refused at its prepare and leaves nothing open."""
    topic = new_topic(shared_broker, partitions=1)
    options = write_options(
        {"minibroker.bootstrap.servers": shared_broker.bootstrap, "topic": topic},
        StructType([StructField("value", BinaryType())]),
    )
    rows = pa.record_batch({"value": [b"%d" % i for i in range(500)]})
    first = TwoAttempts(options)
    messages = []
    for attempt in (0, 1):
        first.attempt = attempt
        messages.append(first.write(iter([rows])))
    assert [m.handle is not None for m in messages] == [True, True]
    assert open_transactions(shared_broker, first.write_id) == [
        f"{first.write_id}.p0.a0",
        f"{first.write_id}.p0.a1",
    ]

    committed = threading.Event()

    def late_rows() -> object:
        # A task that was slow to start: its transaction begins after the driver's commit
        # swept the write, so only the refused prepare keeps it from staying open.
        until(committed.is_set, "the commit")
        yield rows

    first.attempt = 2
    late: list[object] = []
    straggler = threading.Thread(target=lambda: late.append(first.write(late_rows())))
    straggler.start()
    first.commit([messages[1]])
    committed.set()
    straggler.join(timeout=60)
    [third] = late
    assert third.finished and third.handle is None and third.rows == 0  # type: ignore[attr-defined]
    assert sorted(values(shared_broker, topic, 1)) == sorted(rows.column("value").to_pylist())
    assert transaction_states(shared_broker, first.write_id) == {
        f"{first.write_id}.p0.a0": "COMPLETE_ABORT",
        f"{first.write_id}.p0.a1": "COMPLETE_COMMIT",
        f"{first.write_id}.p0.a2": "COMPLETE_ABORT",
    }
    assert ends_at(shared_broker, topic, 1, "read_committed") == ends_at(
        shared_broker, topic, 1, "read_uncommitted"
    )


def test_broker_restarted_between_the_tasks_and_the_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Prepared transactions survive a kill -9; the driver's commit rides out the restart."""
    spark.dataSource.register(FaultSource)
    broker = BrokerProcess(tmp_path / "data", backend="trio").start()
    signals = tmp_path / "signals"
    signals.mkdir()
    try:
        topic = new_topic(broker, partitions=2)
        restarted: list[bool] = []

        def restart_when_committing() -> None:
            until((signals / "committing").exists, "the driver's commit")
            broker.kill()
            broker.start(broker.port)
            restarted.append(True)
            (signals / "go").touch()

        side = threading.Thread(target=restart_when_committing)
        side.start()
        (
            writer(numbered(spark, 3000, 2), broker, fmt="minibroker_faults")
            .option("test.fault", "pausing_commit")
            .option("test.dir", str(signals))
            .option("topic", topic)
            .save()
        )
        side.join(timeout=60)
        assert restarted == [True]
        assert counts(broker, topic, 2, "read_committed") == Counter(range(3000))
        assert open_transactions(broker, "spark-") == []
    finally:
        broker.kill()


def test_the_drivers_commit_run_twice_commits_once_without_error(
    spark: SparkSession, shared_broker: BrokerProcess
) -> None:
    spark.dataSource.register(FaultSource)
    topic = new_topic(shared_broker, partitions=2)
    (
        writer(numbered(spark, 2000, 2), shared_broker, fmt="minibroker_faults")
        .option("test.fault", "commit_twice")
        .option("topic", topic)
        .save()
    )
    assert counts(shared_broker, topic, 2, "read_committed") == Counter(range(2000))
    assert counts(shared_broker, topic, 2, "read_uncommitted") == Counter(range(2000))
