"""The streaming sink: `df.writeStream.format("minibroker")`, exactly once per micro-batch.

The tasks of micro-batch N write as the batch writer's do: one transaction per task
attempt, prepared under app version N. The driver's `commit(messages, N)` is one
CommitTxns with `txn_app_id` = the query's identity and `txn_app_version` = N, so a
micro-batch that runs again after its commit (the driver died before Spark logged
it) commits nothing twice; then every other transaction of the query still open is
aborted: failed attempts, and whatever a stopped or failed earlier run left behind.
`abort(messages, N)` aborts the query's open transactions without recording N,
because Spark runs micro-batch N again when the query restarts.

Spark builds a stream writer afresh for every micro-batch's tasks and for every
commit, in different processes, so the identity comes from the options Spark hands
over (`checkpointLocation` or `queryName`) and the batch id, never from `__init__`.
Transactional ids are `<query id>.p<partition>.a<attempt>`: the same few are reused
by every micro-batch, so a query holds as many as its tasks, not one per batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from spark_connector import transactions
from spark_connector.options import WriteOptions
from spark_connector.writer import (
    ArrowSends,
    MinibrokerCommitMessage,
    describe_ranges,
    driver_log,
    end_or_explain,
    merge_ranges,
)


class MinibrokerStreamWriter(ArrowSends, DataSourceStreamArrowWriter):
    """Holds options and the query's app id (None with delivery at_least_once)."""

    def __init__(self, options: WriteOptions, app_id: str | None) -> None:
        self.options = options
        self.app_id = app_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MinibrokerCommitMessage:
        task = self.task_attempt()
        if task.batch_id is None:
            raise RuntimeError("no streaming.sql.batchId in the task's local properties")
        write_id = self.app_id if self.app_id is not None else "at-least-once"
        return self.write_attempt(iterator, task, write_id, task.batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, MinibrokerCommitMessage)]
        how = ""
        if self.app_id is not None:
            handles = [m.handle for m in done if m.handle is not None]
            ended = transactions.commit(
                self.options.admin(), self.app_id, handles, self.app_id, batchId
            )
            how = (
                f" exactly once ({'already committed before: a re-run; ' if ended.already else ''}"
                f"{ended.aborted} other transactions of the query aborted)"
            )
        merged = merge_ranges(r for m in done for r in m.ranges)
        driver_log().info(
            "minibroker stream %s batch %d committed%s: %d rows to %s",
            self.app_id,
            batchId,
            how,
            sum(m.rows for m in done),
            describe_ranges(merged) or "no partition",
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.app_id is None:
            driver_log().warning(
                "minibroker stream batch %d aborted: what its tasks pushed stays in the log "
                "(at_least_once)",
                batchId,
            )
            return
        app_id = self.app_id
        aborted = end_or_explain(lambda: transactions.abort(self.options.admin(), app_id), app_id)
        driver_log().warning(
            "minibroker stream %s batch %d aborted: nothing of it is visible; %d transactions "
            "aborted; the batch runs again when the query restarts",
            app_id,
            batchId,
            aborted,
        )
