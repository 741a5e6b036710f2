"""An id forgotten to make room (or expired) holds no lock while its removal is synced.

A request for that id in that window changes it after the removal in `txn.wal`, so
replaying the file keeps it; memory must keep it too, or the id's open transaction
has no entry until a restart: its requests are refused and no timeout ever ends it,
so its partitions' last stable offsets stay stuck.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import anyio
import pytest

from broker.config import BrokerConfig
from broker.partitions.partition import Partition
from broker.partitions.producer_ids import ProducerIdManager
from broker.partitions.topics import TopicRegistry
from broker.transactions.coordinator import TransactionCoordinator
from broker.transactions.log import TxnLog

NOW = 10_000


class _Committer:
    def request_flush(self, partition: Partition, batches: int = 0) -> None:
        pass

    async def wait_durable(self, partition: Partition, last_offset: int) -> None:
        raise AssertionError("no transaction here holds a partition")


class _NoGroups:
    def pending_owners(self) -> set[tuple[str, int, int | None]]:
        return set()


def test_an_id_changed_while_its_removal_is_synced_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = BrokerConfig(max_transactional_ids=2).validate()
    registry = TopicRegistry(tmp_path, config)
    registry.open_all(clean_shutdown=True, now_ms=NOW)

    def open_coordinator() -> TransactionCoordinator:
        coordinator = TransactionCoordinator(
            config,
            registry,
            ProducerIdManager(tmp_path),
            _Committer(),  # type: ignore[arg-type]
            TxnLog(tmp_path, config.transaction_log_max_bytes),
            _NoGroups(),  # type: ignore[arg-type]
        )
        coordinator.load()
        return coordinator

    coordinator = open_coordinator()
    real_fdatasync = os.fdatasync
    armed = False
    entered, release = threading.Event(), threading.Event()

    def fdatasync(fd: int) -> None:
        nonlocal armed
        if armed:
            armed = False
            entered.set()
            release.wait(10)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def main() -> None:
        nonlocal armed
        await coordinator.init_producer("a", None, "User:ANONYMOUS")
        await coordinator.init_producer("b", None, "User:ANONYMOUS")
        armed = True
        async with anyio.create_task_group() as tg:
            # `c` makes room: `a`, the least recently used, goes; the sync is held.
            tg.start_soon(coordinator.init_producer, "c", None, "User:ANONYMOUS")
            await anyio.to_thread.run_sync(entered.wait, 10)
            async with coordinator.locked("a"):
                # `a` starts a transaction meanwhile: written after the removal.
                end = coordinator.add_group("a", "g")
            release.set()
        await coordinator.durable(end)

    anyio.run(main)
    in_memory = {tid: e.state for tid, e in coordinator.entries.items()}
    assert in_memory.get("a") == "ONGOING"
    coordinator.close()
    again = open_coordinator()
    assert {tid: e.state for tid, e in again.entries.items()} == in_memory
    again.close()
    registry.close()
