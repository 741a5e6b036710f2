"""The Arrow writer: each Spark task attempt pushes its rows through one Producer.

Delivery `exactly_once` (the default): each task attempt writes inside its own
transaction and prepares it; the driver's `commit` makes the winning attempts
visible with one CommitTxns and aborts every other transaction of the write,
`abort` aborts them all (spark_connector/transactions.py). If `save()` returned,
every row is visible exactly once to read_committed readers; if it raised, none is.

Delivery `at_least_once`: one idempotent producer per task, no transaction: no
duplicates from network retries (the broker deduplicates resends), but a retried
task pushes all its rows again and a failed job leaves what it pushed in the log.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from spark_connector import transactions
from spark_connector.options import WriteOptions

if TYPE_CHECKING:
    from client import BatchMetadata, Producer, TxnHandle

log = logging.getLogger(f"minibroker.{__name__}")


@dataclass(frozen=True)
class PartitionRange:
    """What one task appended to one topic partition: `count` records whose offsets
    lie in [first_offset, last_offset] (other writers may interleave in between)."""

    topic: str
    partition: int
    count: int
    first_offset: int
    last_offset: int

    @classmethod
    def of(cls, batch: BatchMetadata) -> PartitionRange:
        last = batch.base_offset + batch.record_count - 1
        return cls(batch.topic, batch.partition, batch.record_count, batch.base_offset, last)

    def merge(self, other: PartitionRange) -> PartitionRange:
        return PartitionRange(
            self.topic,
            self.partition,
            self.count + other.count,
            min(self.first_offset, other.first_offset),
            max(self.last_offset, other.last_offset),
        )


@dataclass(frozen=True)
class MinibrokerCommitMessage(WriterCommitMessage):
    """One successful task's report, sent to the driver's `commit`.

    `handle` is the attempt's prepared transaction (exactly once). `finished` says the
    write had ended before the attempt could prepare (its transaction was aborted, and
    `rows`/`ranges` are empty): a streaming micro-batch re-run after its commit."""

    write_id: str
    task_partition: int
    attempt: int
    rows: int
    ranges: tuple[PartitionRange, ...] = field(default_factory=tuple)
    handle: TxnHandle | None = None
    finished: bool = False


@dataclass(frozen=True)
class TaskAttempt:
    """Which task attempt runs: its Spark partition, attempt number and, in a streaming
    query, the micro-batch id."""

    partition: int
    attempt: int
    batch_id: int | None = None


def merge_ranges(ranges: Iterable[PartitionRange]) -> dict[tuple[str, int], PartitionRange]:
    merged: dict[tuple[str, int], PartitionRange] = {}
    for r in ranges:
        key = (r.topic, r.partition)
        merged[key] = merged[key].merge(r) if key in merged else r
    return merged


def _as_binary(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Strings become their UTF-8 bytes; binary passes as is (both without a copy)."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.binary() if pa.types.is_string(column.type) else pa.large_binary())
    return column


def _header(pair: dict[str, Any]) -> tuple[str, bytes]:
    key, value = pair["key"], pair["value"]
    if key is None or value is None:
        # The wire has no null header key or value (Kafka allows a null value).
        raise ValueError(f"column 'headers' holds a null header key or value: {pair!r}")
    return key, value.encode() if isinstance(value, str) else value


def _headers(column: pa.ChunkedArray) -> list[list[tuple[str, bytes]] | None]:
    """array<struct<key,value>> as the client's per-record [(key, value bytes)] lists."""
    return [None if row is None else list(map(_header, row)) for row in column.to_pylist()]


def driver_log() -> logging.Logger:
    """Spark runs commit/abort in a bare Python worker whose stderr reaches the driver's
    console; without a level and a handler set there, the INFO summary would be dropped."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    return log


class ArrowSends:
    """The task side the batch and the streaming writer share: Arrow rows into sends of
    one producer per task attempt, inside the attempt's transaction when exactly once."""

    # Spark hands over Arrow batches of 10,000 rows (spark.sql.execution.arrow.
    # maxRecordsPerBatch); joining them into sends of about this many bytes lets the
    # producer cut full wire batches instead of one full and one small per Spark batch.
    send_bytes = 4 << 20
    options: WriteOptions

    def task_attempt(self) -> TaskAttempt:
        context = TaskContext.get()
        if context is None:
            return TaskAttempt(0, 0)
        batch = context.getLocalProperty("streaming.sql.batchId")
        return TaskAttempt(
            context.partitionId(), context.attemptNumber(), None if batch is None else int(batch)
        )

    def write_attempt(
        self,
        iterator: Iterator[pa.RecordBatch],
        task: TaskAttempt,
        write_id: str,
        app_version: int,
    ) -> MinibrokerCommitMessage:
        """Send every row; exactly once, in a transaction named after `write_id` (also the
        app id) and the attempt, prepared under `app_version`."""
        from client import Producer

        txn_id = (
            transactions.transactional_id(write_id, task.partition, task.attempt)
            if self.options.exactly_once
            else None
        )
        # The producer connects lazily and rides out dropped connections and broker
        # restarts itself, resending with the same sequence numbers.
        producer = Producer(
            bootstrap_servers=self.options.bootstrap,
            transactional_id=txn_id,
            **self.options.producer,
        )
        metadata: list[BatchMetadata] = []
        close_s = self.options.delivery_timeout_s
        handle = None
        finished = False
        try:
            if txn_id is not None:
                producer.init_transactions()
                producer.begin_transaction()
            metadata = self._send_all(producer, iterator)
            if txn_id is not None:
                handle = self._prepare(producer, write_id, app_version)
                finished = handle is None
        except BaseException:
            # An open transaction is aborted by close(); without one, rows already
            # handed over still get delivered. The original error is what matters.
            with contextlib.suppress(Exception):
                producer.close(timeout=close_s)
            raise
        producer.close(timeout=close_s)
        if finished:
            metadata = []
        ranges = merge_ranges(PartitionRange.of(m) for m in metadata)
        rows = sum(m.record_count for m in metadata)
        return MinibrokerCommitMessage(
            write_id, task.partition, task.attempt, rows, tuple(ranges.values()), handle, finished
        )

    def _send_all(
        self, producer: Producer, iterator: Iterator[pa.RecordBatch]
    ) -> list[BatchMetadata]:
        futures = []
        for table in self._coalesced(iterator):
            for topic, partition, values, keys, headers in self._groups(table):
                futures.append(
                    producer.send_batch(
                        topic, values, keys=keys, partition=partition, headers=headers
                    )
                )
        # The producer retries each batch (same sequence numbers) until
        # delivery_timeout_ms; the margin only guards against a wedged client.
        wait_s = self.options.delivery_timeout_s + 30
        producer.flush(timeout=wait_s)
        metadata: list[BatchMetadata] = []
        for future in futures:
            metadata.extend(future.get(timeout=wait_s))
        return metadata

    def _prepare(self, producer: Producer, app_id: str, app_version: int) -> TxnHandle | None:
        """PrepareTxn under the write's app version; None when the broker refused it because
        the write had already ended (and aborted the transaction)."""
        from client import TransactionAbortableError
        from client.admin import describe_txn_apps
        from protocol.errors import ErrorCode

        try:
            return producer.prepare_transaction(app_id=app_id, app_version=app_version)
        except TransactionAbortableError as exc:
            if exc.code != ErrorCode.INVALID_TXN_STATE:
                raise
            apps = describe_txn_apps(self.options.admin(), [app_id])
            if not any(a.txn_app_version >= app_version for a in apps):
                raise
            driver_log().info(
                "minibroker write %s version %d had ended before this attempt prepared; "
                "its transaction was aborted",
                app_id,
                app_version,
            )
            return None

    def _coalesced(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
        pending: list[pa.RecordBatch] = []
        size = 0
        for batch in batches:
            pending.append(batch)
            size += batch.nbytes
            if size >= self.send_bytes:
                yield pa.Table.from_batches(pending)
                pending, size = [], 0
        if pending:
            yield pa.Table.from_batches(pending)

    def _groups(
        self, table: pa.Table
    ) -> Iterator[tuple[str, int | None, Any, Any, list[Any] | None]]:
        """Split Arrow rows into (topic, partition, values, keys, headers) sends.

        A `partition` of None leaves the choice to the client's partitioner."""
        if table.num_rows == 0:
            return
        columns = self.options.columns
        names = [n.lower() for n in table.schema.names]

        def column(name: str) -> pa.ChunkedArray | None:
            return table.column(names.index(name)) if name in columns else None

        values = _as_binary(column("value"))
        key_column = column("key")
        keys = None if key_column is None else _as_binary(key_column)
        header_column = column("headers")
        topic_column = None if self.options.topic is not None else column("topic")
        partition_column = column("partition")

        if topic_column is None and partition_column is None:
            assert self.options.topic is not None
            headers = None if header_column is None else _headers(header_column)
            yield self.options.topic, None, values, keys, headers
            return

        if topic_column is not None and topic_column.null_count:
            raise ValueError("column 'topic' holds a null and option 'topic' is not set")
        n = table.num_rows
        group_columns = {
            "t": topic_column if topic_column is not None else pa.nulls(n, pa.string()),
            "p": (
                partition_column.cast(pa.int32())
                if partition_column is not None
                else pa.nulls(n, pa.int32())
            ),
            "i": pa.array(range(n), pa.int32()),
        }
        groups = (
            pa.table(group_columns)
            .group_by(["t", "p"], use_threads=False)
            .aggregate([("i", "list")])
        )
        for topic, partition, indices in zip(
            groups.column("t").to_pylist(),
            groups.column("p").to_pylist(),
            groups.column("i_list").combine_chunks(),
            strict=True,
        ):
            take = indices.values
            topic = topic if topic is not None else self.options.topic
            if topic is None:
                # Planning checked that a topic column or option exists, not every row.
                raise ValueError("a row's 'topic' is null and no 'topic' option is set")
            yield (
                topic,
                partition,
                pc.take(values, take),
                None if keys is None else pc.take(keys, take),
                None if header_column is None else _headers(pc.take(header_column, take)),
            )


class MinibrokerWriter(ArrowSends, DataSourceArrowWriter):
    """Built once on the driver and pickled into every task and into the driver's commit:
    holds options and the write id, which names the write's transactions and app."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.write_id = "spark-" + uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MinibrokerCommitMessage:
        return self.write_attempt(iterator, self.task_attempt(), self.write_id, 0)

    # ------------------------------------------------------------------ on the driver

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, MinibrokerCommitMessage)]
        how = ""
        if self.options.exactly_once:
            handles = [m.handle for m in done if m.handle is not None]
            ended = transactions.commit(
                self.options.admin(), self.write_id, handles, self.write_id, 0
            )
            how = (
                f" exactly once ({'already committed: this is a retry; ' if ended.already else ''}"
                f"{ended.aborted} other transactions of the write aborted)"
            )
        merged = merge_ranges(r for m in done for r in m.ranges)
        rows = sum(m.rows for m in done)
        retried = sum(1 for m in done if m.attempt > 0)
        driver_log().info(
            "minibroker write %s committed%s: %d rows from %d tasks (%d retried) to %s",
            self.write_id,
            how,
            rows,
            len(done),
            retried,
            describe_ranges(merged) or "no partition",
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, MinibrokerCommitMessage)]
        if not self.options.exactly_once:
            driver_log().warning(
                "minibroker write %s aborted: %d of %d tasks had finished; their %d rows and "
                "whatever the failed tasks had pushed stay in the log (at_least_once)",
                self.write_id,
                len(done),
                len(messages),
                sum(m.rows for m in done),
            )
            return
        aborted = end_or_explain(
            lambda: transactions.abort(self.options.admin(), self.write_id, self.write_id, 0),
            self.write_id,
        )
        if transactions.committed(self.options.admin(), self.write_id):
            # The commit was made, but its answer never reached the driver.
            driver_log().error(
                "minibroker write %s was committed before this abort (its answer was lost): "
                "its rows ARE visible although the job failed",
                self.write_id,
            )
            return
        driver_log().warning(
            "minibroker write %s aborted: nothing of it is visible; %d of %d tasks had "
            "finished; %d transactions of the write aborted",
            self.write_id,
            len(done),
            len(messages),
            aborted,
        )


def end_or_explain(end: Callable[[], int], prefix: str) -> int:
    """Run the driver's abort; when the broker cannot be reached, say what stays open."""
    try:
        return end()
    except Exception:
        driver_log().exception(
            "could not abort the transactions of %s: they hold read_committed readers back "
            "until their timeout (minibroker.transaction.prepared.timeout.ms once prepared); "
            "`minibroker txn list --prefix %s` and `minibroker txn abort ID` end them now",
            prefix,
            transactions.sweep_prefix(prefix),
        )
        raise


def describe_ranges(merged: dict[tuple[str, int], PartitionRange]) -> str:
    return ", ".join(
        f"{t}[{p}] {r.count} rows in offsets {r.first_offset}..{r.last_offset}"
        for (t, p), r in sorted(merged.items())
    )
