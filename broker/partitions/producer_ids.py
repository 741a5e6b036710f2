"""Producer id allocation and epochs: InitProducerId's bookkeeping.

Ids are handed out from blocks whose upper bound is made durable before the
first id of the block is used, so after any crash the next start resumes past
every id ever issued: ids are never reused. Transactional ids and their epochs
belong to the transaction coordinator (broker/transactions/coordinator.py), which reads
the map older versions kept here once, through `legacy_transactional`.

An id belongs to the principal it was handed out to (docs/protocol.md section 7,
"Producer ids belong to principals"), for as long as it can be used, restarts
included. So each principal draws its ids from blocks of its own, and a block's owner
is written in the same durable step as its bound: owning costs no write beyond the
one per block there always was. `User:ANONYMOUS` owns every id not in a recorded
range, so with security off (every connection anonymous) the file holds what it
always held, a bare integer; with owners it holds `[bound, [[start, end, principal],
...]]`, adjacent ranges of one principal merged. A principal's unused rest of a block
is left unused at a restart, as the anonymous block's always was.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from broker.partitions.producer_state import PRODUCER_EPOCH_MAX
from broker.storage import fsync_dir, seal, unseal, write_atomic
from protocol.authorization import ANONYMOUS
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


class _Block:
    """The block a principal draws ids from now: `next` up to `end`."""

    __slots__ = ("end", "next")

    def __init__(self, start: int, end: int) -> None:
        self.next = start
        self.end = end


class ProducerIdManager:
    """Issues producer ids and epochs; knows which ids exist, whose they are, and their
    newest epoch."""

    def __init__(self, directory: Path) -> None:
        self._block_path = directory / BLOCK_FILE
        self._txn_path = directory / TXN_FILE
        bound, owned = self._load()
        # Ids below were handed out, or skipped, before this start.
        self._floor = bound
        self._bound = bound  # durable: no id at or above it was handed out
        # [start, end) ranges of principals other than ANONYMOUS, ascending and disjoint.
        self._owned = owned
        self._starts = [start for start, _, _ in owned]
        self._current: dict[str, _Block] = {}  # principal -> the block it draws from
        self._blocks: dict[int, _Block] = {}  # start -> each block reserved since the start
        # Newest epoch handed out per id, for fencing. Bounded: ids that fall out
        # are checked against the partitions' producer state instead.
        self._epochs: dict[int, int] = {}

    def _load(self) -> tuple[int, list[tuple[int, int, str]]]:
        """The bound of the ids ever handed out, and the ranges their owners hold."""
        if not self._block_path.exists():
            return 0, []
        body = unseal(self._block_path.read_bytes())
        if body is None:
            raise ProducerIdStateError(
                f"{self._block_path} fails its CRC; producer ids could be reused. "
                "Restore it from a backup, or write a higher block by hand."
            )
        value = msgpack.unpackb(body, raw=False)
        if isinstance(value, int):
            bound, owned = value, []
        else:
            bound, ranges = value
            owned = [(start, end, principal) for start, end, principal in ranges]
        assert isinstance(bound, int) and bound >= 0, value
        assert all(0 <= s < e <= bound and isinstance(p, str) for s, e, p in owned), value
        return bound, owned

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

    def allocate(self, principal: str = ANONYMOUS) -> int:
        """A producer id never handed out before, durably so, and durably `principal`'s."""
        block = self._current.get(principal)
        if block is None or block.next >= block.end:
            block = self._reserve(principal)
        pid = block.next
        block.next += 1
        return pid

    def _reserve(self, principal: str) -> _Block:
        """The next block, `principal`'s: durable before any id of it is used, so a failed
        write hands out none."""
        start = self._bound
        end = start + ID_BLOCK_SIZE
        owned = self._owned
        if principal != ANONYMOUS:
            last = owned[-1] if owned else None
            if last is not None and last[1] == start and last[2] == principal:
                owned = [*owned[:-1], (last[0], end, principal)]
            else:
                owned = [*owned, (start, end, principal)]
        body: Any = [end, [list(r) for r in owned]] if owned else end
        write_atomic(self._block_path, seal(msgpack.packb(body)))
        self._bound = end
        if owned is not self._owned:
            self._owned = owned
            self._starts = [s for s, _, _ in owned]
        block = self._current[principal] = self._blocks[start] = _Block(start, end)
        return block

    def owner(self, producer_id: int) -> str:
        """The principal `producer_id` was handed out to (ANONYMOUS for ids never issued)."""
        if not self._owned:
            return ANONYMOUS
        i = bisect_right(self._starts, producer_id) - 1
        if i >= 0:
            _, end, principal = self._owned[i]
            if producer_id < end:
                return principal
        return ANONYMOUS

    def remember(self, pid: int, epoch: int) -> None:
        """`epoch` is the newest of `pid`: older ones are fenced from now on."""
        epochs = self._epochs
        epochs[pid] = epoch
        if len(epochs) > EPOCHS_REMEMBERED_MAX:
            for old in list(epochs)[: EPOCHS_REMEMBERED_MAX // 2]:
                del epochs[old]

    def is_issued(self, producer_id: int) -> bool:
        if producer_id < self._floor:
            return producer_id >= 0
        # Blocks reserved since the start are ID_BLOCK_SIZE ids each, from the floor on.
        start = producer_id - (producer_id - self._floor) % ID_BLOCK_SIZE
        block = self._blocks.get(start)
        return block is not None and producer_id < block.next

    def fenced(self, producer_id: int, producer_epoch: int) -> bool:
        """True when a newer epoch of this id has been issued."""
        newest = self._epochs.get(producer_id)
        return newest is not None and producer_epoch < newest

    def new_producer(self, principal: str = ANONYMOUS) -> Grant:
        pid = self.allocate(principal)
        self.remember(pid, 0)
        return Grant(ErrorCode.NONE, pid, 0)

    def bump(
        self, producer_id: int, producer_epoch: int, known_epoch: int | None, principal: str
    ) -> Grant:
        """KIP-360: the client resets its sequences by asking for epoch + 1.

        `known_epoch` is the newest epoch the partitions hold for this id, the
        fallback when the id fell out of memory (a restart, say). Past the last epoch
        the producer gets a new id, `principal`'s (the caller, whom the caller has
        checked owns `producer_id`), so the id goes on being its holder's."""
        if not self.is_issued(producer_id):
            return Grant(ErrorCode.UNKNOWN_PRODUCER_ID)
        current = self._epochs.get(producer_id)
        if current is None:
            current = producer_epoch if known_epoch is None else max(known_epoch, producer_epoch)
        if producer_epoch != current:
            return Grant(ErrorCode.INVALID_PRODUCER_EPOCH)
        if current >= PRODUCER_EPOCH_MAX:
            return self.new_producer(principal)
        self.remember(producer_id, current + 1)
        return Grant(ErrorCode.NONE, producer_id, current + 1)
