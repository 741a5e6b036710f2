"""Sans-IO tests of the consumer's transaction filter (client/fetcher.py FetchedRecords).

Bytes and an aborted-transactions list in, records out, as docs/protocol.md
section 5 and Kafka's algorithm say: read_committed drops the transactional
batches of an aborted producer from its first offset up to its ABORT marker and
every control batch; read_uncommitted drops only control batches. The last test
checks the filter against a model on random interleavings of transactions.
"""

from __future__ import annotations

import random
import struct

import pytest

from client.fetcher import FetchedRecords
from protocol.batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    build_batch_from_columns,
    build_control_batch,
)
from protocol.messages import AbortedTransaction


class Log:
    """A partition's log being written: batches with their offsets stamped."""

    def __init__(self) -> None:
        self.data = b""
        self.next_offset = 0
        self.aborted: list[AbortedTransaction] = []

    def _put(self, batch: bytes, count: int) -> int:
        buf = bytearray(batch)
        struct.pack_into(">q", buf, 0, self.next_offset)
        self.data += bytes(buf)
        first = self.next_offset
        self.next_offset += count
        return first

    def plain(self, *values: bytes) -> int:
        return self._put(build_batch_from_columns(list(values), None, 1), len(values))

    def txn(self, pid: int, *values: bytes) -> int:
        batch = build_batch_from_columns(
            list(values),
            None,
            1,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        )
        return self._put(batch, len(values))

    def marker(self, pid: int, kind: int) -> int:
        batch = build_control_batch(kind, producer_id=pid, producer_epoch=0, timestamp_ms=1)
        return self._put(batch, 1)

    def read(self, *, committed: bool, fetch_offset: int = 0, step: int = 1000) -> list[bytes]:
        fetched = FetchedRecords(
            "t",
            0,
            self.data,
            fetch_offset,
            aborted_transactions=self.aborted,
            read_committed=committed,
        )
        out: list[bytes] = []
        while records := fetched.take(step):
            out += [r.value for r in records]
        assert fetched.position == self.next_offset
        return out


def test_interleaved_producers_one_aborted_one_committed() -> None:
    log = Log()
    first = log.txn(1, b"a1")
    log.txn(2, b"c1")
    log.txn(1, b"a2")
    log.plain(b"plain")
    log.txn(2, b"c2")
    log.marker(1, CONTROL_ABORT)
    log.marker(2, CONTROL_COMMIT)
    log.aborted = [AbortedTransaction(producer_id=1, first_offset=first)]
    assert log.read(committed=True) == [b"c1", b"plain", b"c2"]
    assert log.read(committed=False) == [b"a1", b"c1", b"a2", b"plain", b"c2"]


def test_a_producers_later_transaction_is_kept_after_its_abort_marker() -> None:
    log = Log()
    first = log.txn(1, b"aborted")
    log.marker(1, CONTROL_ABORT)
    log.txn(1, b"committed")
    log.marker(1, CONTROL_COMMIT)
    second = log.txn(1, b"aborted-again")
    log.marker(1, CONTROL_ABORT)
    log.txn(1, b"still-open")  # below the LSO only once decided; read_uncommitted sees it
    log.aborted = [
        AbortedTransaction(producer_id=1, first_offset=second),
        AbortedTransaction(producer_id=1, first_offset=first),  # any order
    ]
    assert log.read(committed=True) == [b"committed", b"still-open"]
    assert log.read(committed=False) == [
        b"aborted",
        b"committed",
        b"aborted-again",
        b"still-open",
    ]


def test_a_fetch_starting_inside_an_aborted_transaction() -> None:
    log = Log()
    first = log.txn(1, b"a1")
    log.txn(2, b"c1")
    middle = log.txn(1, b"a2")
    log.marker(1, CONTROL_ABORT)
    log.marker(2, CONTROL_COMMIT)
    log.aborted = [AbortedTransaction(producer_id=1, first_offset=first)]
    assert log.read(committed=True, fetch_offset=middle) == []
    assert log.read(committed=False, fetch_offset=middle) == [b"a2"]


def test_non_transactional_batches_of_an_aborted_producer_id_are_kept() -> None:
    """Only transactional batches belong to a transaction; an idempotent batch of the same
    id (not possible from one producer, but not the filter's business) is kept."""
    log = Log()
    first = log.txn(1, b"aborted")
    idempotent = build_batch_from_columns(
        [b"idempotent"], None, 1, producer_id=1, producer_epoch=0, base_sequence=0
    )
    log._put(idempotent, 1)
    log.marker(1, CONTROL_ABORT)
    log.aborted = [AbortedTransaction(producer_id=1, first_offset=first)]
    assert log.read(committed=True) == [b"idempotent"]


def test_an_aborted_entry_of_another_range_does_not_hide_a_committed_transaction() -> None:
    log = Log()
    log.txn(1, b"committed")
    log.marker(1, CONTROL_COMMIT)
    log.aborted = [AbortedTransaction(producer_id=1, first_offset=log.next_offset + 10)]
    assert log.read(committed=True) == [b"committed"]


def test_control_batches_alone_advance_the_position() -> None:
    log = Log()
    log.marker(1, CONTROL_COMMIT)
    log.marker(2, CONTROL_ABORT)
    for committed in (True, False):
        assert log.read(committed=committed) == []


@pytest.mark.parametrize("seed", range(25))
def test_random_interleavings_match_the_model(seed: int) -> None:
    """Producers 1-3 write transactions batch by batch, interleaved with plain batches, and
    each ends with a random decision (the last one may stay open). read_committed must
    give exactly the committed values (and the plain ones) in log order, whatever the
    take() step; read_uncommitted every value."""
    rng = random.Random(seed)
    log = Log()
    open_txns: dict[int, list[bytes]] = {}
    first_offsets: dict[int, int] = {}
    committed_values: set[bytes] = set()
    every: list[bytes] = []
    for n in range(60):
        value = b"%d" % n
        pid = rng.randrange(1, 4)
        action = rng.random()
        if action < 0.15:
            log.plain(value)
            committed_values.add(value)
            every.append(value)
        elif action < 0.7 or pid not in open_txns:
            offset = log.txn(pid, value)
            first_offsets.setdefault(pid, offset)
            open_txns.setdefault(pid, []).append(value)
            every.append(value)
        else:
            values = open_txns.pop(pid)
            first = first_offsets.pop(pid)
            if rng.random() < 0.5:
                log.marker(pid, CONTROL_COMMIT)
                committed_values.update(values)
            else:
                log.marker(pid, CONTROL_ABORT)
                log.aborted.append(AbortedTransaction(producer_id=pid, first_offset=first))
    # Still open at the end: a read_committed fetch would stop at the LSO; finish them.
    for pid, values in open_txns.items():
        log.marker(pid, CONTROL_COMMIT)
        committed_values.update(values)
    rng.shuffle(log.aborted)
    expected = [v for v in every if v in committed_values]
    for step in (1, 3, 1000):
        assert log.read(committed=True, step=step) == expected
    assert log.read(committed=False) == every
