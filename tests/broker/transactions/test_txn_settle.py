"""EndTxn answers once its decision is durable; its markers are synced behind the answer.

The decision in `txn.wal` is what recovery completes a transaction by, so once it is
durable and the markers are written (and in force in memory), the answer may go
out while the markers' fsync rounds finish (docs/protocol.md section 5). Until
they have, `txn.wal` must not say COMPLETE, and nothing else of the id may be
written after the decision: the id's next request waits. Checked on the
coordinator, with the offsets store stood in for so that its round can be held
open: the transaction holds a group, whose marker's sync the test releases.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import anyio
import pytest

from broker.config import BrokerConfig
from broker.groups.offset_state import Pending, pending_record
from broker.groups.offset_store import NoMembers, OffsetLog, OffsetStore
from broker.partitions.group_commit import FlushFailed
from broker.partitions.partition import Partition
from broker.partitions.producer_ids import ProducerIdManager
from broker.partitions.topics import TopicRegistry
from broker.storage.record_log import scan_records
from broker.transactions.coordinator import TransactionCoordinator
from broker.transactions.log import TxnLog, TxnLogError
from broker.transactions.state import TxnEntry
from protocol import messages as m
from protocol.batch import build_batch, validate

NOW = 10_000


class _Committer:
    def request_flush(self, partition: Partition, batches: int = 0) -> None:
        pass

    async def wait_durable(self, partition: Partition, last_offset: int) -> None:
        raise AssertionError("the transaction holds no partition")


class _OffsetsSyncedOnRelease:
    """The offsets store, whose round for the groups' marker runs until released."""

    def __init__(self) -> None:
        self.released = anyio.Event()
        self.pending = True

    def pending_owners(self) -> set[tuple[str, int, int | None]]:
        return set()

    async def settled(self, group_ids: Iterable[str]) -> None:
        pass

    async def write_markers(
        self, markers: Sequence[tuple[int, int | None, Iterable[str], bool]]
    ) -> None:
        await self.released.wait()  # a synced write: the answer would wait for it

    async def write_markers_now(
        self, markers: Sequence[tuple[int, int | None, Iterable[str], bool]]
    ) -> int:
        self.pending = False  # in force at once
        return 1

    async def durable(self, end: int) -> None:
        await self.released.wait()


def _states_on_disk(path: Path, transactional_id: str) -> list[str]:
    """The states `txn.wal` holds for the id, record by record."""
    states = []
    for body, _end in scan_records(path.read_bytes(), path, TxnLogError):
        for item in body[0]:
            entry = TxnEntry.decode(item)
            if entry.transactional_id == transactional_id:
                states.append(entry.state)
    return states


def _coordinator(
    tmp_path: Path,
    config: BrokerConfig,
    registry: TopicRegistry,
    committer: object,
    offsets: object,
) -> tuple[TransactionCoordinator, TxnLog]:
    """A loaded coordinator over `registry`, with these stand-ins or stores for the group
    commit and the offsets, and its `txn.wal`."""
    txn_log = TxnLog(tmp_path, config.transaction_log_max_bytes)
    coordinator = TransactionCoordinator(
        config,
        registry,
        ProducerIdManager(tmp_path),
        committer,  # type: ignore[arg-type]
        txn_log,
        offsets,  # type: ignore[arg-type]
    )
    coordinator.load()
    return coordinator, txn_log


@pytest.mark.parametrize("committed", [True, False])
def test_end_txn_answers_before_its_markers_are_synced(tmp_path: Path, committed: bool) -> None:
    config = BrokerConfig().validate()
    registry = TopicRegistry(tmp_path, config)
    registry.open_all(clean_shutdown=True, now_ms=NOW)
    offsets = _OffsetsSyncedOnRelease()
    coordinator, txn_log = _coordinator(tmp_path, config, registry, _Committer(), offsets)
    decided = "PREPARE_COMMIT" if committed else "PREPARE_ABORT"
    complete = "COMPLETE_COMMIT" if committed else "COMPLETE_ABORT"

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinator.run)  # where the settling runs
            await anyio.wait_all_tasks_blocked()
            pid, epoch = await coordinator.init_producer("a", None, "User:ANONYMOUS")
            await coordinator.durable(coordinator.add_group("a", "g"))
            request = m.EndTxnRequest(
                transactional_id="a", producer_id=pid, producer_epoch=epoch, committed=committed
            )
            with anyio.fail_after(5):
                answer = await coordinator.end_txn(request, "User:ANONYMOUS")
            # Answered with the groups' round still open: the outcome in force in memory,
            # the decision (not COMPLETE) the last word on disk.
            assert (answer.error, answer.producer_epoch) == (0, epoch + 1)
            assert not offsets.pending
            listing = coordinator.list_transactions(m.ListTransactionsRequest())
            assert [t.state for t in listing.transactions] == [complete]
            assert _states_on_disk(txn_log.path, "a")[-1] == decided

            # The id's next request waits for the round; then COMPLETE comes first.
            reinitialized: list[tuple[int, int]] = []

            async def init_again() -> None:
                reinitialized.append(await coordinator.init_producer("a", None, "User:ANONYMOUS"))

            tg.start_soon(init_again)
            await anyio.wait_all_tasks_blocked()
            assert not reinitialized
            assert _states_on_disk(txn_log.path, "a")[-1] == decided
            offsets.released.set()
            with anyio.fail_after(5):
                while not reinitialized:
                    await anyio.wait_all_tasks_blocked()
            assert _states_on_disk(txn_log.path, "a")[-2:] == [complete, "EMPTY"]
            tg.cancel_scope.cancel()

    anyio.run(main)
    coordinator.close()
    registry.close()


def test_a_failed_sync_of_the_groups_marker_leaves_the_end_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The groups' marker is in force before its round: should that round fail (once:
    a later fdatasync that succeeds proves nothing of the pages the failed one dropped),
    no later ending of the id (its next request, the sweep) may write COMPLETE on the
    strength of the marker in memory, or recovery, after a power loss took the marker,
    would drop the committed transaction's offsets as no open transaction's. The id
    stays decided until a restart, whose recovery completes it from the file."""
    config = BrokerConfig().validate()
    registry = TopicRegistry(tmp_path, config)
    registry.open_all(clean_shutdown=True, now_ms=NOW)

    def open_coordinator() -> tuple[TransactionCoordinator, OffsetStore, TxnLog, OffsetLog]:
        offsets_log = OffsetLog(tmp_path, config.offsets_log_max_bytes)
        offsets = OffsetStore(config, registry, offsets_log, NoMembers())
        offsets.load()
        coordinator, txn_log = _coordinator(tmp_path, config, registry, _Committer(), offsets)
        return coordinator, offsets, txn_log, offsets_log

    coordinator, offsets, txn_log, offsets_log = open_coordinator()
    real_fdatasync = os.fdatasync
    armed = False

    def fdatasync(fd: int) -> None:
        nonlocal armed
        if armed and fd == offsets_log._fd:
            armed = False
            raise OSError(errno.EIO, "injected")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def main() -> None:
        nonlocal armed
        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinator.run)  # where the settling runs
            await anyio.wait_all_tasks_blocked()
            pid, epoch = await coordinator.init_producer("a", None, "User:ANONYMOUS")
            await coordinator.durable(coordinator.add_group("a", "g"))
            pending = pending_record("g", None, pid, epoch, [(("t", 0), Pending(5, None))])
            await offsets_log.durable(offsets_log.write(pending))
            offsets.state.apply(pending)
            armed = True
            request = m.EndTxnRequest(
                transactional_id="a", producer_id=pid, producer_epoch=epoch, committed=True
            )
            with anyio.fail_after(5):
                answer = await coordinator.end_txn(request, "User:ANONYMOUS")
            assert answer.error == 0
            with anyio.fail_after(5), pytest.raises(OSError):
                # Waits for the failed round, then finds the id decided.
                await coordinator.init_producer("a", None, "User:ANONYMOUS")
            assert not armed
            with pytest.raises(OSError):
                await coordinator.sweep(NOW)
            assert _states_on_disk(txn_log.path, "a")[-1] == "PREPARE_COMMIT"
            tg.cancel_scope.cancel()

    anyio.run(main)
    coordinator.close()
    offsets.close()

    coordinator, offsets, txn_log, _ = open_coordinator()
    anyio.run(coordinator.recover)
    assert _states_on_disk(txn_log.path, "a")[-1] == "COMPLETE_COMMIT"
    group = offsets.state.group("g")
    assert group is not None and group.committed[("t", 0)].offset == 5
    coordinator.close()
    offsets.close()
    registry.close()


def first_round_fails(
    tmp_path: Path, stamp: int
) -> tuple[TopicRegistry, Partition, _FirstRoundFails, TxnLog, TransactionCoordinator]:
    """A coordinator over topic "t" of one partition, whose group commit's first round
    that has something to sync fails."""
    config = BrokerConfig().validate()
    registry = TopicRegistry(tmp_path, config)
    registry.open_all(clean_shutdown=True, now_ms=stamp)
    registry.create("t", 1, None, stamp)
    partition = registry.partition("t", 0)
    assert partition is not None
    committer = _FirstRoundFails()
    coordinator, txn_log = _coordinator(
        tmp_path, config, registry, committer, _OffsetsSyncedOnRelease()
    )
    return registry, partition, committer, txn_log, coordinator


async def append_batch(
    coordinator: TransactionCoordinator, partition: Partition, pid: int, epoch: int, stamp: int
) -> int:
    """Id "a"'s transactional batch on `partition`, admitted and appended as a Produce
    does; the size `txn.wal` must reach for its partition add to be durable."""
    batch = build_batch(
        [(stamp, None, b"v", None)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional=True,
    )
    header = validate(batch)
    async with coordinator.locked("a"):
        key = (partition.topic, partition.index)
        refused, _ended, end = coordinator.admit("a", [(key, header)])
        assert not refused
        partition.append(batch, header, stamp)
    return end


class _FirstRoundFails:
    """The group commit, whose first round that has something to sync fails; the next
    ones flush."""

    def __init__(self) -> None:
        self.failed = False

    def request_flush(self, partition: Partition, batches: int = 0) -> None:
        pass

    async def wait_durable(self, partition: Partition, last_offset: int) -> None:
        if partition.log.flushed_offset > last_offset:
            return
        if not self.failed:
            self.failed = True
            raise FlushFailed("injected")
        partition.log.flush()


def test_a_failed_round_of_the_markers_is_synced_again_before_complete(tmp_path: Path) -> None:
    """The markers' round behind an EndTxn answer fails: the id stays decided, and what
    completes it next (here its next InitProducerId; the sweep alike) finds the marker
    written already, no marker due. It must still have the partition synced before
    COMPLETE goes to `txn.wal`: else a power loss could keep COMPLETE and lose the
    marker, and recovery would abort the committed transaction's data there as no
    entry's."""
    registry, partition, committer, txn_log, coordinator = first_round_fails(tmp_path, NOW)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinator.run)  # where the settling runs
            await anyio.wait_all_tasks_blocked()
            pid, epoch = await coordinator.init_producer("a", None, "User:ANONYMOUS")
            end = await append_batch(coordinator, partition, pid, epoch, NOW)
            await coordinator.durable(end)
            partition.log.flush()  # the batch is durable; the marker's round will fail
            request = m.EndTxnRequest(
                transactional_id="a", producer_id=pid, producer_epoch=epoch, committed=True
            )
            with anyio.fail_after(5):
                answer = await coordinator.end_txn(request, "User:ANONYMOUS")
            assert answer.error == 0
            with anyio.fail_after(5):
                await coordinator.init_producer("a", None, "User:ANONYMOUS")
            assert committer.failed
            assert _states_on_disk(txn_log.path, "a")[-2:] == ["COMPLETE_COMMIT", "EMPTY"]
            assert partition.log.flushed_offset == partition.log.log_end_offset == 2
            tg.cancel_scope.cancel()

    anyio.run(main)
    coordinator.close()
    registry.close()


class _OffsetsSyncedOneByOne:
    """The offsets store, each of whose groups' marker rounds runs until released."""

    def __init__(self) -> None:
        self.rounds: list[anyio.Event] = []

    def pending_owners(self) -> set[tuple[str, int, int | None]]:
        return set()

    async def settled(self, group_ids: Iterable[str]) -> None:
        pass

    async def write_markers(
        self, markers: Sequence[tuple[int, int | None, Iterable[str], bool]]
    ) -> None:
        pass

    async def write_markers_now(
        self, markers: Sequence[tuple[int, int | None, Iterable[str], bool]]
    ) -> int:
        self.rounds.append(anyio.Event())
        return len(self.rounds)

    async def durable(self, end: int) -> None:
        await self.rounds[end - 1].wait()


def test_making_room_never_forgets_an_id_whose_end_is_being_settled(tmp_path: Path) -> None:
    """max_transactional_ids is 2 and a new id waits for `a`'s end to settle, the only
    ended id; meanwhile `b`'s end is answered and starts settling. Once `a` settled,
    `b` is the least recently used: forgotten, its decision would leave `txn.wal`
    before its markers are durable (and its COMPLETE bring it back over the limit).
    `a` must be the one forgotten."""
    config = BrokerConfig(max_transactional_ids=2).validate()
    registry = TopicRegistry(tmp_path, config)
    registry.open_all(clean_shutdown=True, now_ms=NOW)
    offsets = _OffsetsSyncedOneByOne()
    coordinator, _txn_log = _coordinator(tmp_path, config, registry, _Committer(), offsets)

    async def begin(tid: str) -> m.EndTxnRequest:
        pid, epoch = await coordinator.init_producer(tid, None, "User:ANONYMOUS")
        await coordinator.durable(coordinator.add_group(tid, "g-" + tid))
        return m.EndTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True
        )

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinator.run)  # where the settling runs
            await anyio.wait_all_tasks_blocked()
            end_a, end_b = await begin("a"), await begin("b")
            with anyio.fail_after(5):
                await coordinator.end_txn(end_a, "User:ANONYMOUS")
            made: list[tuple[int, int]] = []

            async def init_c() -> None:
                made.append(await coordinator.init_producer("c", None, "User:ANONYMOUS"))

            tg.start_soon(init_c)
            await anyio.wait_all_tasks_blocked()
            assert not made, "no id has ended but `a`, still settling"
            with anyio.fail_after(5):
                await coordinator.end_txn(end_b, "User:ANONYMOUS")
            offsets.rounds[0].set()
            with anyio.fail_after(5):
                while not made:
                    await anyio.wait_all_tasks_blocked()
            assert sorted(coordinator.entries) == ["b", "c"]
            offsets.rounds[1].set()
            with anyio.fail_after(5):
                async with coordinator.locked("b"):  # once `b` settled
                    pass
            assert sorted(coordinator.entries) == ["b", "c"]
            tg.cancel_scope.cancel()

    anyio.run(main)
    coordinator.close()
    registry.close()
