"""The transaction coordinator's recovery, before the listener opens (docs/transactions.md).

A crash can leave a transaction decided in `txn.wal` with markers missing, decided
only by a marker (the decision shared its fsync round and was lost), or a
partition holding a batch whose partition add was lost; this finishes, decides,
adopts or aborts each, so no last stable offset stays stuck.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from broker.partitions import TopicRegistry
from broker.transactions.state import (
    DECIDED,
    ENDED,
    ONGOING,
    OPEN,
    TxnEntry,
    with_group,
    with_partitions,
)

log = logging.getLogger(f"minibroker.{__name__}")


class PendingOffsets(Protocol):
    """What recovery asks of the committed-offsets store: whose transactional offsets
    are pending, and how to settle them."""

    def pending_owners(self) -> set[tuple[str, int, int | None]]: ...

    async def write_markers(
        self, markers: Sequence[tuple[int, int | None, Iterable[str], bool]]
    ) -> None: ...


class AbortCounts(Protocol):
    @property
    def aborts(self) -> Counter[str]: ...


class Recovering(Protocol):
    """What recovery needs of the transaction coordinator (coordinator.py, which calls
    `recover` with itself): declared here, so the two modules import one way."""

    @property
    def entries(self) -> Mapping[str, TxnEntry]: ...

    @property
    def topics(self) -> TopicRegistry: ...

    @property
    def offsets(self) -> PendingOffsets: ...

    @property
    def counters(self) -> AbortCounts: ...

    def owner_of(self, producer_id: int) -> str | None: ...

    async def persist(self, entries: Iterable[TxnEntry]) -> None: ...

    async def end_transactions(
        self, entries: list[TxnEntry], committed: bool, cause: str
    ) -> list[TxnEntry]: ...

    async def complete(self, entries: list[TxnEntry]) -> list[TxnEntry]: ...


async def recover(coordinator: Recovering, stamp: int) -> None:
    """Before serving: finish every decided transaction, and abort any transaction a
    partition holds open that no entry claims, so no last stable offset is stuck, and
    drop pending offsets no open transaction claims, so no OffsetFetch with
    require_stable waits for ever."""
    # A power loss can take several transactions' records of one id at once: each
    # later one is durable only through its batches, offsets and markers. Finishing
    # one moves its entry to the next one's epoch, whose lost adds and marker the next
    # pass finds; each pass adopts or ends something, or is the last.
    passes_max = (
        2
        + len(coordinator.entries)
        + sum(len(p.producers.markers) for p in coordinator.topics.all_partitions())
    )
    for _ in range(passes_max):
        if not await _finish_one_pass(coordinator, stamp):
            break
    else:
        raise AssertionError(f"recovery did not settle in {passes_max} passes")
    claimed: set[tuple[int, str, int]] = set()
    for entry in coordinator.entries.values():
        if entry.state in OPEN:
            claimed |= {(entry.producer_id, t, p) for t, p in entry.partitions}
    for partition in coordinator.topics.all_partitions():
        for pid in partition.producers.open_txns:
            if (pid, partition.topic, partition.index) in claimed:
                continue
            epoch = partition.producers.epoch_of(pid)
            owner = None if epoch is None else _current_entry(coordinator, pid, epoch)
            if owner is not None:
                # (A classic entry's: a native one's was adopted by the passes above.)
                # The current transaction's batch reached the disk and its partition
                # add, which shared the round, did not: the batch is the transaction's
                # (its pid and epoch say so), and a retry of it would be answered as a
                # duplicate, so it is adopted rather than aborted.
                log.warning(
                    "event=txn_partition_adopted id=%r topic=%s partition=%d",
                    owner.transactional_id,
                    partition.topic,
                    partition.index,
                )
                key = (partition.topic, partition.index)
                await coordinator.persist([with_partitions(owner, {key}, stamp)])
                continue
            log.warning(
                "event=txn_orphan_aborted topic=%s partition=%d producer_id=%d",
                partition.topic,
                partition.index,
                pid,
            )
            offset = partition.append_marker(pid, 0 if epoch is None else epoch, False, stamp)
            coordinator.counters.aborts["recovery"] += 1
            partition.log.flush()
            assert partition.log.flushed_offset > offset
    for partition in coordinator.topics.all_partitions():
        # txn.wal was synced at open and every decision made here was synced: no
        # marker is needed to decide a transaction any more.
        partition.producers.forget_markers()
    claimed_groups = {
        (group_id, entry.producer_id): entry.producer_epoch
        for entry in coordinator.entries.values()
        if entry.state in OPEN
        for group_id in entry.groups
    }
    # Pending offsets of an epoch other than the open transaction's are an ended
    # transaction's that its decision no longer ends (a marker ends its own epoch's).
    orphans = sorted(
        (group_id, pid)
        for group_id, pid, epoch in coordinator.offsets.pending_owners()
        if (group_id, pid) not in claimed_groups
        or epoch not in (None, claimed_groups[group_id, pid])
    )
    for group_id, pid in orphans:
        log.warning("event=txn_orphan_offsets_dropped group=%r producer_id=%d", group_id, pid)
        coordinator.counters.aborts["recovery"] += 1
    if orphans:
        await coordinator.offsets.write_markers(
            [(pid, None, [group_id], False) for group_id, pid in orphans]
        )


def _lost_adds(coordinator: Recovering) -> list[tuple[str, tuple[str, int]]]:
    """(transactional id, partition) where a partition holds a marker, or an open
    transaction's batches, of the entry's current pid and epoch though the entry,
    ONGOING, EMPTY or COMPLETE_* (which hold none), does not hold it: the
    transaction's add was lost. Both are adopted before a marker decides the
    transaction, so that its decision reaches every partition it wrote to: decided
    first, the entry would move to its next epoch and step 5 would abort the
    batches a commit's answer had counted. Not for a classic entry, whose adds are
    durable before its batches and whose markers follow its durable decision."""
    found: dict[tuple[str, tuple[str, int]], None] = {}
    for partition in coordinator.topics.all_partitions():
        key = (partition.topic, partition.index)
        producers = partition.producers
        ids: list[tuple[int, int | None]] = [
            (pid, epoch) for pid, (_offset, epoch, _committed) in producers.markers.items()
        ]
        ids += [(pid, producers.epoch_of(pid)) for pid in producers.open_txns]
        for pid, epoch in ids:
            entry = None if epoch is None else _current_native(coordinator, pid, epoch)
            if entry is not None and key not in entry.partitions:
                found[(entry.transactional_id, key)] = None
    return list(found)


async def _finish_one_pass(coordinator: Recovering, stamp: int) -> bool:
    """Adopt the lost adds of each entry's current transaction, decide open ones by
    their markers, and finish every decided one; whether anything changed."""
    lost_adds = _lost_adds(coordinator)
    for tid, key in lost_adds:
        # Its partition add, which no answer waited for, did not reach the disk, and its
        # batch or its marker did (they name the entry's pid and epoch): the partition is
        # the transaction's, which a marker may then decide.
        log.warning("event=txn_partition_adopted id=%r topic=%s partition=%d", tid, *key)
        await coordinator.persist([with_partitions(coordinator.entries[tid], {key}, stamp)])
    lost_groups = _lost_group_adds(coordinator)
    for tid, group_id in lost_groups:
        # A TxnOffsetCommit's answer rests on its pending offsets alone: its group add,
        # synced later, did not reach the disk; the offsets carry the entry's pid and
        # epoch, so they are its current transaction's.
        log.warning("event=txn_group_adopted id=%r group=%r", tid, group_id)
        await coordinator.persist([with_group(coordinator.entries[tid], group_id, stamp)])
    by_markers = _decided_by_markers(coordinator)
    for entry, committed in by_markers:
        # The decision shared its fsync round with the markers and was lost, or a commit
        # made in one round had none yet: a marker is only written for a decided
        # transaction, so the one found decides it.
        log.warning(
            "event=txn_decided_by_marker id=%r committed=%s", entry.transactional_id, committed
        )
        await coordinator.end_transactions([entry], committed, "recovery")
    decided_entries = [e for e in coordinator.entries.values() if e.state in DECIDED]
    if decided_entries:
        log.info("event=txn_recovery decided=%d", len(decided_entries))
        await coordinator.complete(decided_entries)
    return bool(lost_adds or lost_groups or by_markers or decided_entries)


def _lost_group_adds(coordinator: Recovering) -> list[tuple[str, str]]:
    """(transactional id, group) where pending offsets carry the pid and epoch of the
    entry's current transaction (ONGOING, or EMPTY or COMPLETE_* before its first add)
    and the entry does not hold their group: the add was lost. Not for a classic entry,
    whose AddOffsetsToTxn is durable before its offsets are written, and whose epoch
    does not tell one transaction from the next."""
    found = []
    for group_id, pid, epoch in sorted(
        coordinator.offsets.pending_owners(), key=lambda o: (o[0], o[1], o[2] or 0)
    ):
        entry = None if epoch is None else _current_native(coordinator, pid, epoch)
        if entry is not None and group_id not in entry.groups:
            found.append((entry.transactional_id, group_id))
    return found


def _current_native(coordinator: Recovering, pid: int, epoch: int) -> TxnEntry | None:
    """`_current_entry`, but None for a classic entry, whose epoch does not tell one
    transaction from the next."""
    entry = _current_entry(coordinator, pid, epoch)
    return None if entry is None or entry.classic else entry


def _current_entry(coordinator: Recovering, pid: int, epoch: int) -> TxnEntry | None:
    """The entry whose current transaction (ONGOING, or EMPTY or COMPLETE_* before its
    first add) runs at `pid` and `epoch`."""
    owner_id = coordinator.owner_of(pid)
    entry = None if owner_id is None else coordinator.entries.get(owner_id)
    if (
        entry is None
        or (entry.producer_id, entry.producer_epoch) != (pid, epoch)
        or not (entry.state == ONGOING or entry.state in ENDED)
    ):
        return None
    return entry


def _decided_by_markers(coordinator: Recovering) -> list[tuple[TxnEntry, bool]]:
    """Open transactions that a partition remembers a marker of (same pid and epoch),
    found by the replay at open or kept by a snapshot taken after it, with that
    marker's outcome."""
    found = []
    for entry in coordinator.entries.values():
        # A classic transaction's decision is durable before its markers (`complete`): a
        # marker of its pid and epoch ended one of its earlier transactions.
        if entry.state not in OPEN or entry.classic:
            continue
        for topic, index in sorted(entry.partitions):
            partition = coordinator.topics.partition(topic, index)
            marker = (
                None if partition is None else partition.producers.last_marker(entry.producer_id)
            )
            if marker is not None and marker[0] == entry.producer_epoch:
                found.append((entry, marker[1]))
                break
    return found
