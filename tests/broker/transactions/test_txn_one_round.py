"""A one-partition commit's marker goes behind its batches before anything decides it
(docs/transactions.md, "One round"): the partition's side of it, and the
coordinator's when the round fails.

The marker may only share a round with batches in its own segment (recovery cuts a
torn segment at its first bad batch, so the marker never outlives them there), and
read_committed must not see the transaction before that round made it durable.
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from broker.clock import now_ms
from broker.partitions import StorageError
from broker.partitions.partition import Partition, ProducerLimits
from broker.storage.log import LogConfig
from broker.transactions.coordinator import TransactionCoordinator
from broker.transactions.state import COMPLETE_COMMIT, PREPARE_COMMIT
from protocol import messages as m
from protocol.batch import build_batch, validate
from protocol.errors import ErrorCode
from tests.broker.transactions.test_txn_settle import (
    _states_on_disk,
    append_batch,
    first_round_fails,
)

PID, EPOCH = 7, 3
LIMITS = ProducerLimits(max_producers=1000, expiration_ms=86_400_000)
NOW = 10_000


def _open(directory: Path, config: LogConfig | None = None) -> Partition:
    return Partition.open(
        "t", 0, directory, config or LogConfig(), LIMITS, clean_shutdown=True, now_ms=NOW
    )


def _append_txn(p: Partition, pid: int, seq: int, value: bytes = b"v") -> int:
    data = build_batch(
        [(NOW, None, value, None)],
        producer_id=pid,
        producer_epoch=EPOCH,
        base_sequence=seq,
        transactional=True,
    )
    r = p.append(data, validate(data), NOW)
    assert r.error == ErrorCode.NONE, r
    return r.base_offset


def _flush(p: Partition) -> None:
    p.log.mark_flushed(p.log.log_end_offset)


def test_read_committed_waits_for_the_marker_on_disk(tmp_path: Path) -> None:
    p = _open(tmp_path)
    first = _append_txn(p, PID, 0)
    _append_txn(p, PID, 1)
    assert p.last_stable_offset == first
    marker = p.append_commit_first(PID, EPOCH, NOW)
    assert marker == 2 and not p.producers.in_txn(PID)
    # Ended here, but not durable: a power loss now could take the whole transaction.
    assert p.last_stable_offset == first
    p.log.mark_flushed(marker)  # the batches on disk, the marker not yet
    assert p.last_stable_offset == first
    _flush(p)
    assert p.last_stable_offset == marker + 1
    # The marker decides the transaction until txn.wal's decision is durable.
    assert p.producers.last_marker(PID) == (EPOCH, True)


def test_the_oldest_unflushed_commit_holds_the_stable_offset(tmp_path: Path) -> None:
    p = _open(tmp_path)
    a = _append_txn(p, PID, 0)
    _append_txn(p, PID + 1, 0)
    p.append_commit_first(PID + 1, EPOCH, NOW)
    assert p.last_stable_offset == a  # PID's transaction is open before it anyway
    p.append_commit_first(PID, EPOCH, NOW)
    assert p.last_stable_offset == a
    _flush(p)
    assert p.last_stable_offset == p.log.log_end_offset


def test_what_is_held_back_is_bounded_without_readers(tmp_path: Path) -> None:
    """Commit after commit with no reader asking for the LSO: the commits held back are
    only those whose marker is not flushed yet, not every one since the start."""
    p = _open(tmp_path)
    for i in range(200):
        _append_txn(p, PID, i)
        p.append_commit_first(PID, EPOCH, NOW)
        _flush(p)
    assert len(p._commits_unflushed) <= 1
    assert p.last_stable_offset == p.log.log_end_offset


def test_no_marker_first_while_an_older_segment_is_not_flushed(tmp_path: Path) -> None:
    """A round syncs each segment's file on its own: a power loss in it could keep a
    new segment's marker and lose the older one's batch, so the commit takes the path
    that syncs the batches before anything decides it."""
    p = _open(tmp_path)
    _append_txn(p, PID, 0)
    p.log.roll(NOW)
    _append_txn(p, PID, 1)
    assert p.append_commit_first(PID, EPOCH, NOW) is None
    assert p.producers.in_txn(PID) and p.log.log_end_offset == 2
    _flush(p)
    assert p.append_commit_first(PID, EPOCH, NOW) == 2


def test_no_marker_first_when_it_would_start_a_segment(tmp_path: Path) -> None:
    p = _open(tmp_path, LogConfig(segment_bytes=1024))
    _append_txn(p, PID, 0, b"x" * 940)
    assert p.log.segment_bases == [0]
    assert p.append_commit_first(PID, EPOCH, NOW) is None
    assert p.producers.in_txn(PID) and p.log.segment_bases == [0]
    # The ordinary marker, written once the decision is durable, may start one.
    assert p.append_marker(PID, EPOCH, True, NOW) == 1
    assert p.log.segment_bases == [0, 1]


def test_a_failed_round_leaves_the_commit_decided(tmp_path: Path) -> None:
    """The round that was to make the batch and its marker durable fails: the marker
    decided the transaction when it was written, so the entry is left decided
    (PREPARE_COMMIT, for the sweep), EndTxn gets a storage error, and once a round
    succeeds the sweep completes it and a retry of EndTxn is answered as committed."""
    registry, partition, committer, txn_log, coordinator = first_round_fails(tmp_path, now_ms())

    async def main() -> None:
        async with _started(coordinator, partition) as (_tg, pid, epoch):
            request = m.EndTxnRequest(
                transactional_id="a", producer_id=pid, producer_epoch=epoch, committed=True
            )
            with anyio.fail_after(5), pytest.raises(StorageError):
                await coordinator.end_txn(request, "User:ANONYMOUS")
            assert committer.failed
            assert coordinator.entries["a"].state == PREPARE_COMMIT
            assert _states_on_disk(txn_log.path, "a")[-1] == PREPARE_COMMIT
            assert partition.last_stable_offset == 0  # the marker is not known durable
            with anyio.fail_after(5):
                await coordinator.sweep(now_ms())
            assert _states_on_disk(txn_log.path, "a")[-1] == COMPLETE_COMMIT
            assert partition.last_stable_offset == partition.log.log_end_offset == 2
            with anyio.fail_after(5):
                answer = await coordinator.end_txn(request, "User:ANONYMOUS")
            assert (answer.error, answer.producer_epoch) == (0, epoch + 1)

    anyio.run(main)
    coordinator.close()
    registry.close()


@asynccontextmanager
async def _started(
    coordinator: TransactionCoordinator, partition: Partition
) -> AsyncIterator[tuple[anyio.abc.TaskGroup, int, int]]:
    """The coordinator running, id "a" initialised, its first batch on `partition`:
    the task group, pid and epoch. The group's tasks are cancelled on exit."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(coordinator.run)
        await anyio.wait_all_tasks_blocked()
        pid, epoch = await coordinator.init_producer("a", None, "User:ANONYMOUS")
        await append_batch(coordinator, partition, pid, epoch, now_ms())
        yield tg, pid, epoch
        tg.cancel_scope.cancel()


async def _commit(coordinator: TransactionCoordinator, pid: int, epoch: int) -> m.EndTxnResponse:
    """Id "a"'s EndTxn(commit) at `pid` and `epoch`."""
    request = m.EndTxnRequest(
        transactional_id="a", producer_id=pid, producer_epoch=epoch, committed=True
    )
    return await coordinator.end_txn(request, "User:ANONYMOUS")


def test_the_next_marker_waits_for_the_previous_commit_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-round commit's COMPLETE is synced behind its answer, its marker deciding it
    meanwhile. A partition remembers one marker per producer, so the id's next marker
    must not be written before that record is on disk: after a power loss that kept the
    newer marker and lost the older COMPLETE, nothing would decide the older commit.
    Tried: `txn.wal`'s sync held open after the first commit; the next EndTxn waits,
    its marker unwritten, until the sync is released."""
    registry, partition, committer, txn_log, coordinator = first_round_fails(tmp_path, now_ms())
    committer.failed = True  # every round flushes
    release = anyio.Event()
    sync = txn_log.durable

    async def held(end: int) -> None:
        await release.wait()
        await sync(end)

    async def main() -> None:
        async with _started(coordinator, partition) as (tg, pid, epoch):
            monkeypatch.setattr(txn_log, "durable", held)
            with anyio.fail_after(5):
                first = await _commit(coordinator, pid, epoch)
            assert (first.error, first.producer_epoch) == (0, epoch + 1)
            assert partition.log.log_end_offset == 2  # the batch and its marker
            assert partition.producers.last_marker(pid) == (epoch, True)
            await append_batch(coordinator, partition, pid, epoch + 1, now_ms())
            answers: list[m.EndTxnResponse] = []

            async def second() -> None:
                answers.append(await _commit(coordinator, pid, epoch + 1))

            tg.start_soon(second)
            await anyio.wait_all_tasks_blocked()
            assert not answers
            assert partition.log.log_end_offset == 3  # no marker yet
            assert partition.producers.last_marker(pid) == (epoch, True)
            release.set()
            with anyio.fail_after(5):
                while not answers:
                    await anyio.sleep(0)
            assert (answers[0].error, answers[0].producer_epoch) == (0, epoch + 2)
            assert partition.log.log_end_offset == 4
            assert partition.producers.last_marker(pid) in (None, (epoch + 1, True))

    anyio.run(main)
    coordinator.close()
    registry.close()


def test_a_commit_whose_complete_was_not_written_is_recorded_before_the_next_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-round commit's COMPLETE could not be written (the marker decided it, the
    answer went out): the id's next end writes the id's state and waits for it on disk
    before its marker, which would otherwise replace the only record of that commit.
    Tried: the write fails once; the writes, syncs and markers after it are logged."""
    registry, partition, committer, txn_log, coordinator = first_round_fails(tmp_path, now_ms())
    committer.failed = True  # every round flushes
    write, sync, marker = txn_log.write, txn_log.durable, partition.append_commit_first
    failures = [OSError(errno.EIO, "injected")]
    events: list[tuple[str, int]] = []

    def logged_write(body: Any) -> int:
        if failures:
            raise failures.pop()
        end = write(body)
        events.append(("written", end))
        return end

    async def logged_sync(end: int) -> None:
        await sync(end)
        events.append(("durable", end))

    def logged_marker(pid: int, epoch: int, stamp: int) -> int | None:
        offset = marker(pid, epoch, stamp)
        events.append(("marker", -1 if offset is None else offset))
        return offset

    async def main() -> None:
        async with _started(coordinator, partition) as (_tg, pid, epoch):
            monkeypatch.setattr(txn_log, "write", logged_write)
            monkeypatch.setattr(txn_log, "durable", logged_sync)
            monkeypatch.setattr(partition, "append_commit_first", logged_marker)
            with anyio.fail_after(5):
                first = await _commit(coordinator, pid, epoch)
            assert not failures  # the COMPLETE's write was the one that failed
            assert (first.error, first.producer_epoch) == (0, epoch + 1)
            assert events == [("marker", 1)]
            await append_batch(coordinator, partition, pid, epoch + 1, now_ms())
            with anyio.fail_after(5):
                second = await _commit(coordinator, pid, epoch + 1)
            assert (second.error, second.producer_epoch) == (0, epoch + 2)
            at = events.index(("marker", 3))
            written = [e for kind, e in events[1:at] if kind == "written"]
            assert len(written) == 2  # the add, then the id's state
            assert ("durable", written[-1]) in events[1:at], events

    anyio.run(main)
    coordinator.close()
    registry.close()
