"""Group commit for acks=-1: one fdatasync round serves every batch appended before it.

Producers append and then wait for their partition's flushed offset to pass
their batch. A single flusher task runs rounds: it collects the partitions
with waiters, syncs their dirty segment files in a worker thread (so the event
loop keeps appending), marks them flushed, and wakes every waiter. Batches
appended while a round runs ride the next one, which is what makes fsync cost
per round rather than per batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Protocol

import anyio

from broker.crash_points import crash_point
from broker.partitions.partition import Partition
from broker.storage import fdatasync_each

log = logging.getLogger(f"minibroker.{__name__}")


class FlushFailed(Exception):
    """fdatasync failed: the batch is in the page cache but not known durable."""


class FsyncObserver(Protocol):
    """Where each round's figures go (broker/metrics.py's BrokerMetrics): metrics imports
    the domains whose names it labels, so this module does not import metrics."""

    def observe_fsync(self, seconds: float, batches: int) -> None: ...


class GroupCommitter:
    def __init__(self, metrics: FsyncObserver) -> None:
        self._metrics = metrics
        self._dirty: dict[int, Partition] = {}
        self._batches_queued = 0
        self._wake = anyio.Event()
        self._round_done = anyio.Event()
        self._failed: set[int] = set()
        # The partitions of the round in flight, each with the offset its sync covers
        # everything below of.
        self._syncing: dict[int, int] = {}

    def request_flush(self, partition: Partition, batches: int = 0) -> None:
        """Sync `partition` in the next round: for `batches` acks=-1 appends, which
        count towards the group size, or for a rolled segment (none), so the
        recovery point and retention can move past it."""
        self._dirty[id(partition)] = partition
        self._batches_queued += batches
        self._wake.set()

    async def wait_durable(self, partition: Partition, last_offset: int) -> None:
        """Return once every offset up to `last_offset` of `partition` is on disk."""
        plog = partition.log
        key = id(partition)
        while plog.flushed_offset <= last_offset:
            if self._syncing.get(key, 0) <= last_offset:
                # Not covered by the round in flight, if any: the next one. (Asking for
                # one the round in flight covers would sync the file again for nothing,
                # and make whatever arrives meanwhile wait for that round to end first.)
                self._dirty[key] = partition
                self._wake.set()
            await self._round_done.wait()
            if key in self._failed and plog.flushed_offset <= last_offset:
                raise FlushFailed(f"fdatasync failed for {partition.topic}-{partition.index}")

    async def forget(self, partitions: Iterable[Partition]) -> None:
        """Stop syncing `partitions` (their topic is deleted, everything of them flushed):
        none stays queued, and this returns once no round in flight holds their files'
        descriptors, which the caller may then close."""
        keys = {id(p) for p in partitions}
        for key in keys:
            self._dirty.pop(key, None)
        while keys & self._syncing.keys():
            await self._round_done.wait()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            batch = self._dirty
            self._dirty = {}
            batches, self._batches_queued = self._batches_queued, 0
            targets = [(key, p, *p.log.sync_targets()) for key, p in batch.items()]
            self._syncing = {key: end_offset for key, _p, _fds, end_offset in targets}
            crash_point("flush_round_started")
            started = time.perf_counter()
            failed = _failed_targets(
                [fds for _key, _p, fds, _end in targets],
                await fdatasync_each([fd for _key, _p, fds, _end in targets for fd in fds]),
            )
            self._metrics.observe_fsync(time.perf_counter() - started, batches)
            self._failed = set()
            for i, (key, p, _fds, end_offset) in enumerate(targets):
                if i in failed:
                    self._failed.add(key)
                    log.error("event=fsync_failed topic=%s partition=%d", p.topic, p.index)
                else:
                    p.log.mark_flushed(end_offset)
            self._syncing = {}
            done, self._round_done = self._round_done, anyio.Event()
            done.set()


def _failed_targets(fd_lists: list[list[int]], errors: Sequence[int]) -> set[int]:
    """The indices of the fd lists one of whose fdatasyncs (`errors`, in order) failed."""
    failed: set[int] = set()
    at = 0
    for i, fds in enumerate(fd_lists):
        if any(errors[at : at + len(fds)]):
            failed.add(i)
        at += len(fds)
    return failed
