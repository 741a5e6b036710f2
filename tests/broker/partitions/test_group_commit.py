"""Group commit: every batch appended while an fsync runs rides the next fsync.

`os.fdatasync` is replaced by one that blocks until the test lets it go (a replaced
one runs in broker/storage/sync_threads.py's Python threads), so "while an fsync
runs" is a fact of the test, not a timing guess.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest

from broker.metrics import BrokerMetrics
from broker.partitions.group_commit import FlushFailed, GroupCommitter
from broker.partitions.partition import Partition, ProducerLimits
from broker.storage.log import LogConfig
from protocol.batch import build_batch_from_columns, read_header

BACKENDS = ["trio", "asyncio"]


BATCH = build_batch_from_columns([b"v"], None, 0)
HEADER = read_header(BATCH)


def _append(committer: GroupCommitter, p: Partition) -> int:
    """One acks=-1 batch appended to `p`, its round asked of `committer`: its offset."""
    last = p.append(BATCH, HEADER, 0).last_offset
    committer.request_flush(p, batches=1)
    return last


def _open(tmp_path: Path, count: int) -> list[Partition]:
    """Partitions 0 to count - 1 of topic "t", each in a directory of its own."""
    return [
        Partition.open(
            "t",
            i,
            tmp_path / f"t-{i}",
            LogConfig(),
            ProducerLimits(10, 60_000),
            clean_shutdown=True,
            now_ms=0,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_appended_during_an_fsync_all_go_into_the_next_one(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    release = threading.Event()
    entered = threading.Semaphore(0)

    def blocking_fdatasync(fd: int) -> None:
        synced.append(fd)
        if len(synced) <= 2:  # the first sync of rounds 1 and 2 (one fd a partition)
            entered.release()
            assert release.wait(30)
            release.clear()

    monkeypatch.setattr(os, "fdatasync", blocking_fdatasync)
    partitions = _open(tmp_path, 2)
    metrics = BrokerMetrics(enabled=True)
    batches_per_round: list[int] = []
    round_ends: list[int] = []

    def observe_fsync(_seconds: float, batches: int) -> None:
        batches_per_round.append(batches)
        round_ends.append(len(synced))

    monkeypatch.setattr(metrics, "observe_fsync", observe_fsync)
    committer = GroupCommitter(metrics)

    segments: list[int] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(committer.run)
            first = _append(committer, partitions[0])
            await anyio.to_thread.run_sync(entered.acquire)  # round 1 is syncing
            later = [_append(committer, partitions[i % 2]) for i in range(10)]
            segments.extend(p.log.sync_targets()[0][0] for p in partitions)
            release.set()
            await committer.wait_durable(partitions[0], first)
            await anyio.to_thread.run_sync(entered.acquire)  # round 2 is syncing
            assert all(p.log.flushed_offset <= 1 for p in partitions[1:])
            release.set()
            await committer.wait_durable(partitions[0], later[-2])
            await committer.wait_durable(partitions[1], later[-1])
            tg.cancel_scope.cancel()

    try:
        anyio.run(main, backend=backend)
    finally:
        for p in partitions:
            p.log.close()
    # Round 2 held all ten batches, with one fsync per partition file; any later
    # round was a waiter's, with no batch of its own.
    assert batches_per_round[:2] == [1, 10]
    assert not any(batches_per_round[2:])
    assert sorted(synced[round_ends[0] : round_ends[1]]) == sorted(segments)
    assert [p.log.flushed_offset for p in partitions] == [6, 5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_waiter_the_round_in_flight_covers_asks_for_no_other(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's waiter arrives while the round that syncs its batch runs (as an acks=-1
    reply's does): it waits for that round. Asking for another would sync the file
    again with nothing new, and a marker appended meanwhile (a commit right behind its
    batch) would wait for that empty round to end before its own."""
    synced: list[int] = []
    release = threading.Event()
    entered = threading.Semaphore(0)

    def blocking_fdatasync(fd: int) -> None:
        synced.append(fd)
        entered.release()
        assert release.wait(30)
        release.clear()

    monkeypatch.setattr(os, "fdatasync", blocking_fdatasync)
    (p,) = _open(tmp_path, 1)
    committer = GroupCommitter(BrokerMetrics(enabled=True))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(committer.run)
            last = _append(committer, p)
            await anyio.to_thread.run_sync(entered.acquire)  # its round is syncing
            tg.start_soon(committer.wait_durable, p, last)
            await anyio.wait_all_tasks_blocked()
            release.set()
            await committer.wait_durable(p, last)
            await anyio.wait_all_tasks_blocked()
            assert len(synced) == 1, "a round was asked for with nothing to sync"
            tg.cancel_scope.cancel()

    try:
        anyio.run(main, backend=backend)
    finally:
        p.log.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_round_fails_only_the_partitions_whose_sync_failed(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C threads' errnos, one per file, map back to their partitions: in a round of
    three, the middle one's files start with a pipe's end (its fdatasync fails with
    EINVAL), so its waiter gets FlushFailed and its offsets stay unflushed, while the
    partitions on either side are durable."""
    pytest.importorskip("broker.storage._fdatasync_fast")
    partitions = _open(tmp_path, 3)
    read_end, write_end = os.pipe()
    bad = partitions[1].log
    targets = bad.sync_targets

    def with_a_pipe_first() -> tuple[list[int], int]:
        fds, end = targets()
        return [read_end, *fds], end

    monkeypatch.setattr(bad, "sync_targets", with_a_pipe_first)
    committer = GroupCommitter(BrokerMetrics(enabled=True))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(committer.run)
            lasts = [_append(committer, p) for p in partitions]
            await committer.wait_durable(partitions[0], lasts[0])
            await committer.wait_durable(partitions[2], lasts[2])
            with pytest.raises(FlushFailed):
                await committer.wait_durable(partitions[1], lasts[1])
            assert [p.log.flushed_offset for p in partitions] == [1, 0, 1]
            tg.cancel_scope.cancel()

    try:
        anyio.run(main, backend=backend)
    finally:
        monkeypatch.undo()
        for p in partitions:
            p.log.close()
        os.close(read_end)
        os.close(write_end)
