"""Writers that fail, stall or repeat at chosen points, registered as their own formats.

Spark's Python workers import this module by name (the repository is on their path),
so everything here must be importable and picklable. Files in a directory passed as
option `test.dir` carry signals between a worker and the test."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from spark_connector import (
    MinibrokerCommitMessage,
    MinibrokerDataSource,
    MinibrokerStreamWriter,
    MinibrokerWriter,
)
from spark_connector.writer import TaskAttempt

WAIT_S = 120.0


def until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited too long for {what}")
        time.sleep(0.05)


def failing_after(iterator: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The first `rows` rows, then an error (the writer has handed them over by then)."""
    left = rows
    for batch in iterator:
        yield batch.slice(0, left)
        left -= min(left, batch.num_rows)
        if left == 0:
            raise RuntimeError("injected failure")


def task() -> tuple[int, int]:
    context = TaskContext.get()
    assert context is not None
    return context.partitionId(), context.attemptNumber()


class FailingOnceWriter(MinibrokerWriter):
    """Fails Spark partition 0's first attempt after handing FAIL_AFTER rows to the producer."""

    FAIL_AFTER = 700
    send_bytes = 1  # hand each Arrow batch over at once, so the count is exact

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MinibrokerCommitMessage:
        if task() == (0, 0):
            iterator = failing_after(iterator, self.FAIL_AFTER)
        return super().write(iterator)


class FailingAlwaysWriter(MinibrokerWriter):
    """Every attempt of partition 1 fails after handing rows over, once partition 3 has
    started; partition 3 sends its rows only after the driver's abort has returned (file
    `aborted`): the task Spark leaves running past the job's end, slow to get going."""

    send_bytes = 1
    signals: Path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MinibrokerCommitMessage:
        partition = task()[0]
        if partition == 1:
            until((self.signals / "p3-started").exists, "partition 3's start")
            iterator = failing_after(iterator, 100)
        elif partition == 3:
            (self.signals / "p3-started").touch()
            until((self.signals / "aborted").exists, "the driver's abort")
        return super().write(iterator)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        super().abort(messages)
        (self.signals / "aborted").touch()


class CommitTwiceWriter(MinibrokerWriter):
    """The driver's commit, run a second time (as a retry would)."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        super().commit(messages)
        super().commit(messages)


class PausingCommitWriter(MinibrokerWriter):
    """Before committing, says so (file `committing`) and waits for file `go`: the test
    restarts the broker in between."""

    signals: Path

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        (self.signals / "committing").touch()
        until((self.signals / "go").exists, "the test's go")
        super().commit(messages)


class TwoAttempts(MinibrokerWriter):
    """Driven in the test process: `attempt` says which attempt of partition 0 runs."""

    attempt = 0
    send_bytes = 1

    def task_attempt(self) -> TaskAttempt:
        return TaskAttempt(0, self.attempt)


class FaultyStreamWriter(MinibrokerStreamWriter):
    """Fails where file `armed` says, "<batch id> <point>", at that micro-batch or a later
    one: `task` (every attempt of partition 0, after handing rows over), `before_commit`,
    `after_commit` (the broker committed, Spark's commit log does not know), `stop` (a
    task says so with file `stopping` and waits: the test stops the query)."""

    signals: Path

    def _armed(self, batch_id: int) -> str | None:
        try:
            at, point = (self.signals / "armed").read_text().split()
        except FileNotFoundError:
            return None
        return point if batch_id >= int(at) else None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MinibrokerCommitMessage:
        attempt = self.task_attempt()
        assert attempt.batch_id is not None
        point = self._armed(attempt.batch_id)
        if point == "task" and attempt.partition == 0:
            iterator = failing_after(iterator, 10)
        elif point == "stop":
            (self.signals / "stopping").touch()
            until(lambda: False, "the query's stop")
        return super().write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        point = self._armed(batchId)
        if point == "before_commit":
            raise RuntimeError("injected failure before the commit")
        super().commit(messages, batchId)
        if point == "after_commit":
            raise RuntimeError("injected failure after the commit")


WRITERS: dict[str, type[MinibrokerWriter]] = {
    "failing_once": FailingOnceWriter,
    "failing_always": FailingAlwaysWriter,
    "commit_twice": CommitTwiceWriter,
    "pausing_commit": PausingCommitWriter,
}


class FaultSource(MinibrokerDataSource):
    """`format("minibroker_faults")` with option `test.fault` naming one of WRITERS."""

    @classmethod
    def name(cls) -> str:
        return "minibroker_faults"

    def writer(self, schema: StructType, overwrite: bool) -> MinibrokerWriter:
        plain = super().writer(schema, overwrite)
        faulty = WRITERS[self.options["test.fault"]](plain.options)
        if isinstance(faulty, (PausingCommitWriter, FailingAlwaysWriter)):
            faulty.signals = Path(self.options["test.dir"])
        return faulty

    def streamWriter(self, schema: StructType, overwrite: bool) -> MinibrokerStreamWriter:
        plain = super().streamWriter(schema, overwrite)
        faulty = FaultyStreamWriter(plain.options, plain.app_id)
        faulty.signals = Path(self.options["test.dir"])
        return faulty
