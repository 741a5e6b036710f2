"""Unit tests of the transaction layers that are pure or file-only: the state
transitions (broker/transactions/state.py), the aborted-transaction index
(broker/storage/txn_index.py), the producer state's open transactions and snapshot v2,
and the transaction log's recovery rules (broker/transactions/log.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from broker.partitions.producer_state import PartitionProducerState, SnapshotError
from broker.storage.record_log import encode_record
from broker.storage.txn_index import (
    AbortedIndex,
    AbortedTxn,
    TxnIndexError,
    decode_entries,
    encode_entries,
)
from broker.transactions.log import TxnLog, TxnLogError
from broker.transactions.state import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_COMMIT,
    PREPARED,
    Identity,
    TxnEntry,
    completed,
    decided,
    identify,
    initialized,
    prepared,
    with_partitions,
)
from protocol.errors import ErrorCode

# ------------------------------------------------------------------ state transitions


def test_a_transaction_walks_its_states_and_moves_to_the_next_epoch_when_decided() -> None:
    entry = initialized(None, "tx", 7, 0, 60_000, now_ms=100)
    assert entry.state == EMPTY and entry.deadline_ms is None
    entry = with_partitions(entry, {("t", 0)}, now_ms=200)
    entry = with_partitions(entry, {("t", 1)}, now_ms=300)
    assert (entry.state, entry.started_ms, entry.deadline_ms) == (ONGOING, 200, 60_200)
    assert entry.partitions == {("t", 0), ("t", 1)}
    entry = prepared(entry, deadline_ms=5_000, now_ms=400)
    assert (entry.state, entry.deadline_ms) == (PREPARED, 5_000)
    entry = decided(entry, True, (7, 1), now_ms=500)
    assert (entry.state, entry.producer_epoch, entry.marker_ids()) == (PREPARE_COMMIT, 1, (7, 0))
    assert identify(entry, 7, 0) is Identity.LAST_ENDED
    assert identify(entry, 7, 1) is Identity.CURRENT
    entry = completed(entry, now_ms=600)
    assert (entry.state, entry.partitions, entry.started_ms) == (COMPLETE_COMMIT, frozenset(), -1)
    assert TxnEntry.decode(entry.encode()) == entry


def test_ending_a_transaction_that_wrote_nothing_needs_no_markers() -> None:
    entry = decided(initialized(None, "tx", 1, 3, 1000, 0), False, (1, 4), now_ms=10)
    assert (entry.state, entry.producer_epoch) == (COMPLETE_ABORT, 4)


@pytest.mark.parametrize(
    "pid,epoch,expected",
    [
        (5, 2, Identity.CURRENT),
        (5, 1, ErrorCode.PRODUCER_FENCED),
        (5, 3, ErrorCode.INVALID_PRODUCER_EPOCH),
        (6, 2, ErrorCode.INVALID_PRODUCER_ID_MAPPING),
    ],
)
def test_identify_names_each_kind_of_caller(pid: int, epoch: int, expected: object) -> None:
    entry = initialized(None, "tx", 5, 2, 1000, 0)
    assert identify(entry, pid, epoch) == expected
    assert identify(None, pid, epoch) == ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_a_retry_after_a_newer_instance_took_over_is_fenced() -> None:
    ended = completed(
        decided(
            with_partitions(initialized(None, "tx", 5, 0, 1000, 0), {("t", 0)}, 1), False, (5, 1), 2
        ),
        3,
    )
    assert identify(ended, 5, 0) is Identity.LAST_ENDED
    taken_over = initialized(ended, "tx", 5, 2, 1000, 4)
    assert identify(taken_over, 5, 0) == ErrorCode.PRODUCER_FENCED


# ------------------------------------------------------------------ aborted index


def test_aborted_index_lists_what_overlaps_a_fetch_and_forgets_what_retention_took() -> None:
    index = AbortedIndex()
    index.add(1, 0, 5)  # producer 1: offsets 0..4, marker at 5
    index.add(2, 3, 9)
    index.add(1, 10, 12)
    assert index.overlapping(0, 4) == [(1, 0), (2, 3)]
    assert index.overlapping(6, 11) == [(2, 3), (1, 10)]
    assert index.overlapping(13, 20) == []
    assert index.between(6, 12) == [AbortedTxn(9, 2, 3)]
    index.drop_before(6)
    assert len(index) == 2
    index.drop_from(12)
    assert index.overlapping(0, 100) == [(2, 3)]


def test_txnindex_file_round_trips_and_refuses_damage() -> None:
    entries = [AbortedTxn(105, 1, 100), AbortedTxn(110, 2, 90)]
    data = encode_entries(entries)
    assert decode_entries(data, 100, 200) == entries
    with pytest.raises(TxnIndexError, match="CRC"):
        decode_entries(data[:-1] + bytes([data[-1] ^ 1]), 100, 200)
    with pytest.raises(TxnIndexError, match="does not fit"):
        decode_entries(data, 106, 200)  # an entry below the segment


# ------------------------------------------------------------------ producer state


def test_open_transactions_set_the_stable_offset_and_survive_a_snapshot() -> None:
    state = PartitionProducerState(max_producers=10, expiration_ms=1000)
    state.begin_txn(1, 4)
    state.begin_txn(2, 6)
    state.begin_txn(1, 8)  # still the same transaction: first offset stays 4
    assert state.first_unstable_offset() == 4 and state.in_txn(1)
    assert state.end_txn(1, 9, 0, True) == 4 and not state.in_txn(1)
    assert state.first_unstable_offset() == 6
    _, loaded = PartitionProducerState.decode_snapshot(
        state.encode_snapshot(10), max_producers=10, expiration_ms=1000
    )
    assert loaded.open_txns == {2: 6}
    bad = bytearray(state.encode_snapshot(10))
    bad[-5] ^= 0xFF
    with pytest.raises(SnapshotError):
        PartitionProducerState.decode_snapshot(bytes(bad), max_producers=10, expiration_ms=1000)


def test_evicting_a_producer_keeps_its_open_transaction() -> None:
    state = PartitionProducerState(max_producers=1, expiration_ms=1000)
    state.begin_txn(1, 0)
    state.apply(1, 0, 0, 1, 0, 0, now_ms=0)
    state.apply(2, 0, 0, 1, 1, 0, now_ms=0)  # evicts producer 1's idempotence entry
    assert state.epoch_of(1) is None and state.first_unstable_offset() == 0


# ------------------------------------------------------------------ transaction log


def test_txn_log_cuts_a_torn_tail_and_compacts(tmp_path: Path) -> None:
    bodies: list[Any] = []

    async def main() -> None:
        log = TxnLog(tmp_path, max_bytes=4096)
        assert log.open(bodies.append) == 0 and bodies == []
        for i in range(3):
            await log.append([[], [["app", i, i]], []])
        log.close()
        path = log.path
        whole = path.read_bytes()
        path.write_bytes(whole + encode_record(["torn"])[:-3])
        log = TxnLog(tmp_path, max_bytes=4096)
        assert log.open(bodies.append) == 3
        assert [b[1][0][1] for b in bodies] == [0, 1, 2]
        assert path.read_bytes() == whole
        while not log.wants_compaction():
            await log.append([[], [["app", 9, 9]], []])
        log.compact([[[], [["app", 9, 9]], []]])
        log.close()
        bodies.clear()
        TxnLog(tmp_path, max_bytes=4096).open(bodies.append)
        assert bodies == [[[], [["app", 9, 9]], []]]

    anyio.run(main)


def test_an_end_from_before_a_compaction_is_durable(tmp_path: Path) -> None:
    """A size the log reached before compacting to a smaller file (a one-round commit's
    COMPLETE, whose sync failed, say) is on disk: compaction starts only once every
    record is synced. Waiting for it used to sync the new file for ever, the size
    never reached again."""

    async def main() -> None:
        log = TxnLog(tmp_path, max_bytes=4096)
        log.open(lambda body: None)
        end = 0
        while not log.wants_compaction():
            end = log.write([[], [["app", 9, 9]], []])
            await log.durable(end)
        log.compact([[[], [["app", 9, 9]], []]])
        assert log.path.stat().st_size < end
        assert log.is_durable(end)
        with anyio.fail_after(5):
            await log.durable(end)
        log.close()

    anyio.run(main)


def test_txn_log_refuses_damage_before_intact_records(tmp_path: Path) -> None:
    log = TxnLog(tmp_path, max_bytes=4096)
    log.open(lambda body: None)
    log.append_now([[], [], ["a"]])
    log.append_now([[], [], ["b"]])
    log.close()
    data = bytearray(log.path.read_bytes())
    data[9] ^= 0xFF  # inside the first record's body
    log.path.write_bytes(bytes(data))
    with pytest.raises(TxnLogError, match="later record is intact"):
        TxnLog(tmp_path, max_bytes=4096).open(lambda body: None)
