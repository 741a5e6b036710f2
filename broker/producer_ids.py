"""Producer id allocation and epochs: InitProducerId's bookkeeping.

Ids are handed out from blocks whose upper bound is made durable before the
first id of the block is used, so after any crash the next start resumes past
every id ever issued: ids are never reused. Transactional ids and their epochs
belong to the transaction coordinator (broker/transactions/coordinator.py), which reads
the map older versions kept here once, through `legacy_transactional`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgpack

from broker.producer_state import PRODUCER_EPOCH_MAX
from broker.storage import fsync_dir, seal, unseal, write_atomic
from protocol.errors import ErrorCode

ID_BLOCK_SIZE = 1000
EPOCHS_REMEMBERED_MAX = 1_000_000
BLOCK_FILE = "producer_id_block"
TXN_FILE = "transactional_ids"


class ProducerIdStateError(RuntimeError):
    """A persisted id file is unreadable; ids could be reused, so the broker will not start."""


@dataclass(frozen=True, slots=True)
class Grant:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


class ProducerIdManager:
    """Issues producer ids and epochs; knows which ids exist and their newest epoch."""

    def __init__(self, directory: Path) -> None:
        self._block_path = directory / BLOCK_FILE
        self._txn_path = directory / TXN_FILE
        self._next_id = self._load_block_end()
        self._block_end = self._next_id
        # Newest epoch handed out per id, for fencing. Bounded: ids that fall out
        # are checked against the partitions' producer state instead.
        self._epochs: dict[int, int] = {}

    def _load_block_end(self) -> int:
        if not self._block_path.exists():
            return 0
        body = unseal(self._block_path.read_bytes())
        if body is None:
            raise ProducerIdStateError(
                f"{self._block_path} fails its CRC; producer ids could be reused. "
                "Restore it from a backup, or write a higher block by hand."
            )
        value = msgpack.unpackb(body)
        assert isinstance(value, int) and value >= 0
        return value

    def legacy_transactional(self) -> dict[str, tuple[int, int]]:
        """transactional_id -> (pid, epoch) as brokers before the coordinator kept them."""
        if not self._txn_path.exists():
            return {}
        body = unseal(self._txn_path.read_bytes())
        if body is None:
            raise ProducerIdStateError(f"{self._txn_path} fails its CRC")
        raw = msgpack.unpackb(body, raw=False)
        return {tid: (pid, epoch) for tid, (pid, epoch) in raw.items()}

    def retire_legacy(self) -> None:
        """The coordinator holds the legacy map now: keep the file, under a name that is
        not read again (a later empty transaction log must not import old epochs)."""
        if self._txn_path.exists():
            os.replace(self._txn_path, self._txn_path.with_name(TXN_FILE + ".imported"))
            fsync_dir(self._txn_path.parent)

    def allocate(self) -> int:
        """A producer id never handed out before, durably so."""
        if self._next_id >= self._block_end:
            block_end = self._next_id + ID_BLOCK_SIZE
            # Durable before any id of the block is used: a failed write hands out none.
            write_atomic(self._block_path, seal(msgpack.packb(block_end)))
            self._block_end = block_end
        pid = self._next_id
        self._next_id += 1
        assert pid < self._block_end
        return pid

    def remember(self, pid: int, epoch: int) -> None:
        """`epoch` is the newest of `pid`: older ones are fenced from now on."""
        epochs = self._epochs
        epochs[pid] = epoch
        if len(epochs) > EPOCHS_REMEMBERED_MAX:
            for old in list(epochs)[: EPOCHS_REMEMBERED_MAX // 2]:
                del epochs[old]

    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < self._next_id

    def fenced(self, producer_id: int, producer_epoch: int) -> bool:
        """True when a newer epoch of this id has been issued."""
        newest = self._epochs.get(producer_id)
        return newest is not None and producer_epoch < newest

    def new_producer(self) -> Grant:
        pid = self.allocate()
        self.remember(pid, 0)
        return Grant(ErrorCode.NONE, pid, 0)

    def bump(self, producer_id: int, producer_epoch: int, known_epoch: int | None) -> Grant:
        """KIP-360: the client resets its sequences by asking for epoch + 1.

        `known_epoch` is the newest epoch the partitions hold for this id, the
        fallback when the id fell out of memory (a restart, say)."""
        if not self.is_issued(producer_id):
            return Grant(ErrorCode.UNKNOWN_PRODUCER_ID)
        current = self._epochs.get(producer_id)
        if current is None:
            current = producer_epoch if known_epoch is None else max(known_epoch, producer_epoch)
        if producer_epoch != current:
            return Grant(ErrorCode.INVALID_PRODUCER_EPOCH)
        if current >= PRODUCER_EPOCH_MAX:
            return self.new_producer()
        self.remember(producer_id, current + 1)
        return Grant(ErrorCode.NONE, producer_id, current + 1)
