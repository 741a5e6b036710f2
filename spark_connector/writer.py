"""The Arrow writer: each Spark task pushes its rows through one idempotent Producer.

Guarantee: no duplicates from network retries (the idempotent producer resends
a batch with its original sequence number, which the broker deduplicates); at
least once across Spark task retries (a retried task pushes all its rows again,
and the rows its failed attempt had already pushed stay in the log). Exactly
once comes with transactions.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from spark_connector.options import WriteOptions

if TYPE_CHECKING:
    from client import BatchMetadata

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
    """One successful task's report, sent to the driver's `commit`."""

    write_id: str
    task_partition: int
    attempt: int
    rows: int
    ranges: tuple[PartitionRange, ...] = field(default_factory=tuple)


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


def _logger() -> logging.Logger:
    """Spark runs commit/abort in a bare Python worker whose stderr reaches the driver's
    console; without a level and a handler set there, the INFO summary would be dropped."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    return log


class MinibrokerWriter(DataSourceArrowWriter):
    """Built once on the driver and pickled into every task: holds options only."""

    # Spark hands over Arrow batches of 10,000 rows (spark.sql.execution.arrow.
    # maxRecordsPerBatch); joining them into sends of about this many bytes lets the
    # producer cut full wire batches instead of one full and one small per Spark batch.
    send_bytes = 4 << 20

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex[:12]

    # ------------------------------------------------------------------ in each task

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MinibrokerCommitMessage:
        from client import Producer

        context = TaskContext.get()
        task_partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        # The producer connects lazily and rides out dropped connections and broker
        # restarts itself, resending with the same sequence numbers.
        producer = Producer(bootstrap_servers=self.options.bootstrap, **self.options.producer)
        futures = []
        metadata: list[BatchMetadata] = []
        close_s = self.options.delivery_timeout_s
        try:
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
            for future in futures:
                metadata.extend(future.get(timeout=wait_s))
        except BaseException:
            # Rows already handed over still get delivered, so what a failed attempt
            # leaves behind is exactly what it pushed; the original error is what matters.
            with contextlib.suppress(Exception):
                producer.close(timeout=close_s)
            raise
        producer.close(timeout=close_s)
        ranges = merge_ranges(PartitionRange.of(m) for m in metadata)
        rows = sum(m.record_count for m in metadata)
        return MinibrokerCommitMessage(
            self.write_id, task_partition, attempt, rows, tuple(ranges.values())
        )

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

    # ------------------------------------------------------------------ on the driver

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, MinibrokerCommitMessage)]
        merged = merge_ranges(r for m in done for r in m.ranges)
        rows = sum(m.rows for m in done)
        retried = sum(1 for m in done if m.attempt > 0)
        _logger().info(
            "minibroker write %s committed: %d rows from %d tasks (%d retried) to %s",
            self.write_id,
            rows,
            len(done),
            retried,
            _describe(merged) or "no partition",
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, MinibrokerCommitMessage)]
        rows = sum(m.rows for m in done)
        _logger().warning(
            "minibroker write %s aborted: %d of %d tasks had finished; their %d rows and "
            "whatever the failed tasks had pushed stay in the log (a log cannot be undone)",
            self.write_id,
            len(done),
            len(messages),
            rows,
        )


def _describe(merged: dict[tuple[str, int], PartitionRange]) -> str:
    return ", ".join(
        f"{t}[{p}] {r.count} rows in offsets {r.first_offset}..{r.last_offset}"
        for (t, p), r in sorted(merged.items())
    )
