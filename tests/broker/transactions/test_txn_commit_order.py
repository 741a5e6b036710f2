"""A commit's decision is written only after the offsets it commits are on disk.

TxnOffsetCommit holds its group's lock until its pending offsets are durable; a
connection runs its requests in turn, so an EndTxn behind it on the same
connection comes later anyway. An EndTxn from another connection can arrive while
the offsets are still being synced, and after a power loss a decision that reached
the disk ahead of them would commit the transaction without them. So the
coordinator waits for the store to settle the transaction's groups before it writes
the decision (and before a PREPARED record). A kill -9 keeps the page cache, so this
order is checked here, on the coordinator with the offsets store stood in for: its
`settled` blocks until the test lets it go. The same wait for the batches is
checked against the real broker in test_txn_pipelined_end.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import anyio
import pytest

from broker.config import BrokerConfig
from broker.partitions.partition import Partition
from broker.partitions.producer_ids import ProducerIdManager
from broker.partitions.topics import TopicRegistry
from broker.transactions.coordinator import TransactionCoordinator
from broker.transactions.log import TxnLog
from broker.transactions.state import ONGOING, PREPARED
from protocol import messages as m

NOW = 10_000


class _Committer:
    def request_flush(self, partition: Partition, batches: int = 0) -> None:
        pass

    async def wait_durable(self, partition: Partition, last_offset: int) -> None:
        raise AssertionError("the transaction holds no partition")


class _OffsetsBeingSynced:
    """The offsets store while a TxnOffsetCommit of group "g" is being synced."""

    def __init__(self) -> None:
        self.synced = anyio.Event()
        self.waited_for: list[set[str]] = []
        self.markers: list[object] = []

    def pending_owners(self) -> set[tuple[str, int, int | None]]:
        return set()

    async def settled(self, group_ids: Iterable[str]) -> None:
        self.waited_for.append(set(group_ids))
        await self.synced.wait()

    async def write_markers(self, markers: object) -> None:
        assert self.synced.is_set(), "a groups' marker before the offsets were synced"
        self.markers.append(markers)


@pytest.mark.parametrize("request_kind", ["EndTxn", "PrepareTxn"])
def test_the_decision_waits_for_the_offsets_being_synced(tmp_path: Path, request_kind: str) -> None:
    config = BrokerConfig().validate()
    registry = TopicRegistry(tmp_path, config)
    registry.open_all(clean_shutdown=True, now_ms=NOW)
    offsets = _OffsetsBeingSynced()
    coordinator = TransactionCoordinator(
        config,
        registry,
        ProducerIdManager(tmp_path),
        _Committer(),  # type: ignore[arg-type]
        TxnLog(tmp_path, config.transaction_log_max_bytes),
        offsets,
    )
    coordinator.load()

    async def main() -> None:
        pid, epoch = await coordinator.init_producer("a", None, "User:ANONYMOUS")
        # TxnOffsetCommit's group add, written; its offsets not yet synced.
        assert coordinator.add_group("a", "g") > 0
        log_size = coordinator.log.size_bytes
        request: m.EndTxnRequest | m.PrepareTxnRequest = (
            m.EndTxnRequest(
                transactional_id="a", producer_id=pid, producer_epoch=epoch, committed=True
            )
            if request_kind == "EndTxn"
            else m.PrepareTxnRequest(
                transactional_id="a",
                producer_id=pid,
                producer_epoch=epoch,
                prepared_timeout_ms=60_000,
            )
        )
        async with anyio.create_task_group() as tg:
            if isinstance(request, m.EndTxnRequest):
                tg.start_soon(coordinator.end_txn, request, "User:ANONYMOUS")
            else:
                tg.start_soon(coordinator.prepare_txn, request, "User:ANONYMOUS")
            with anyio.fail_after(5):
                while not offsets.waited_for:
                    await anyio.sleep(0.001)
            await anyio.sleep(0.05)
            # Waiting for group "g": nothing written to txn.wal, the entry unchanged.
            assert offsets.waited_for == [{"g"}]
            assert coordinator.log.size_bytes == log_size
            assert coordinator.entries["a"].state == ONGOING
            offsets.synced.set()
        after = coordinator.entries["a"]
        if request_kind == "EndTxn":
            assert (after.state, after.producer_epoch) == ("COMPLETE_COMMIT", epoch + 1)
            assert offsets.markers, "the groups' marker was written after"
        else:
            assert after.state == PREPARED
        assert coordinator.log.size_bytes > log_size

    anyio.run(main)
    coordinator.close()
    registry.close()
