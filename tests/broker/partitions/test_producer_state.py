"""The per-partition producer state (docs/protocol.md section 3): one test per rule, then a
Hypothesis state machine that drives it against a small independent model and a log."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import msgpack
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.partitions.producer_state import (
    CACHED_BATCHES,
    BatchMetadata,
    Decision,
    PartitionProducerState,
    SnapshotError,
)
from protocol.batch import SEQUENCE_MODULUS, BatchHeader
from protocol.errors import ErrorCode

M = SEQUENCE_MODULUS
EXPIRATION_MS = 1_000
PID = 7


class Partition:
    """A producer state plus the log offsets it is applied at, as the broker drives it."""

    def __init__(self, max_producers: int = 10, expiration_ms: int = EXPIRATION_MS) -> None:
        self.state = PartitionProducerState(
            max_producers=max_producers, expiration_ms=expiration_ms
        )
        self.next_offset = 100

    def send(self, pid: int, epoch: int, seq: int, count: int, now_ms: int = 0) -> Decision:
        """check(), and apply() at the log end when the verdict is to append."""
        decision = self.state.check(pid, epoch, seq, count, now_ms)
        if decision.error == ErrorCode.NONE and decision.duplicate is None:
            self.state.apply(pid, epoch, seq, count, self.next_offset, now_ms + 5, now_ms)
            self.next_offset += count
        return decision

    def append(self, pid: int, epoch: int, seq: int, count: int, now_ms: int = 0) -> int:
        """Send a batch that must be appended; return its base_offset."""
        base_offset = self.next_offset
        assert self.send(pid, epoch, seq, count, now_ms) == (ErrorCode.NONE, None, None)
        assert self.next_offset == base_offset + count
        return base_offset


def appended(decision: Decision) -> bool:
    return decision == (ErrorCode.NONE, None, None)


def test_batch_metadata_last_offset() -> None:
    assert BatchMetadata(3, 5, 100, 2, 9).last_offset == 102


def test_constructor_rejects_impossible_limits() -> None:
    with pytest.raises(ValueError):
        PartitionProducerState(max_producers=0, expiration_ms=1)
    with pytest.raises(ValueError):
        PartitionProducerState(max_producers=1, expiration_ms=-1)


def test_unknown_producer_must_start_at_sequence_zero() -> None:
    p = Partition()
    decision = p.send(PID, 0, 5, 1)
    assert decision.error == ErrorCode.UNKNOWN_PRODUCER_ID
    assert decision.duplicate is None and decision.message
    assert len(p.state) == 0 and p.state.epoch_of(PID) is None
    assert appended(p.send(PID, 0, 0, 1))
    assert len(p.state) == 1 and p.state.epoch_of(PID) == 0


def test_in_order_batches_append() -> None:
    p = Partition()
    seq = 0
    for count in (1, 3, 2, 7, 1, 4, 2):
        assert appended(p.send(PID, 0, seq, count))
        seq += count
    assert p.next_offset == 100 + seq


def test_lower_epoch_is_fenced() -> None:
    p = Partition()
    p.append(PID, 0, 0, 2)
    p.append(PID, 1, 0, 2)
    for seq, count in ((2, 1), (0, 2), (0, 1)):  # the old epoch's next, its resend, a restart
        decision = p.send(PID, 0, seq, count)
        assert decision.error == ErrorCode.INVALID_PRODUCER_EPOCH
        assert decision.duplicate is None and decision.message
    assert p.state.epoch_of(PID) == 1
    assert appended(p.send(PID, 1, 2, 1))


@pytest.mark.parametrize(
    ("seq", "count"),
    [
        (11, 1),  # a gap of one
        (20, 3),  # far ahead
        (9, 2),  # overlaps the newest batch
        (0, 3),  # starts at the oldest batch but ends elsewhere
        (2, 2),  # inside the window, not on a batch boundary
    ],
)
def test_out_of_order_sequence(seq: int, count: int) -> None:
    p = Partition()
    for first, n in ((0, 2), (2, 3), (5, 5)):
        p.append(PID, 0, first, n)
    decision = p.send(PID, 0, seq, count)
    assert decision.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert decision.duplicate is None and decision.message
    assert appended(p.send(PID, 0, 10, 1))


def six_batches(p: Partition) -> list[tuple[int, int, int]]:
    """Append six batches of one producer; return (first_seq, count, base_offset) of each."""
    batches = []
    seq = 0
    for count in (2, 3, 1, 4, 2, 3):
        batches.append((seq, count, p.append(PID, 0, seq, count, now_ms=seq)))
        seq += count
    return batches


@pytest.mark.parametrize("age", range(CACHED_BATCHES))
def test_resend_of_each_cached_batch_answers_its_base_offset(age: int) -> None:
    p = Partition()
    batches = six_batches(p)
    first, count, base_offset = batches[-1 - age]
    end = p.next_offset
    decision = p.state.check(PID, 0, first, count, 0)
    assert decision.error == ErrorCode.NONE and decision.message is None
    assert decision.duplicate == BatchMetadata(
        first_seq=first,
        last_seq=first + count - 1,
        base_offset=base_offset,
        last_offset_delta=count - 1,
        max_timestamp=first + 5,
    )
    assert p.next_offset == end
    assert appended(p.send(PID, 0, 15, 1))


def test_sixth_oldest_batch_is_a_duplicate_sequence() -> None:
    p = Partition()
    first, count, _ = six_batches(p)[0]
    decision = p.send(PID, 0, first, count)
    assert decision.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert decision.duplicate is None and decision.message


def test_sequences_wrap_from_max_to_zero() -> None:
    p = Partition()
    p.append(PID, 0, 0, M - 3)  # next sequence: M - 3
    p.append(PID, 0, M - 3, 2)  # M-3, M-2
    p.append(PID, 0, M - 1, 1)  # the last sequence before the wrap
    wrapped_offset = p.append(PID, 0, 0, 2)  # 0, 1
    after_wrap_offset = p.append(PID, 0, 2, 1)
    assert p.send(PID, 0, 0, 2).duplicate == BatchMetadata(0, 1, wrapped_offset, 1, 5)
    assert p.send(PID, 0, M - 1, 1).duplicate is not None
    assert p.send(PID, 0, 2, 1).duplicate.base_offset == after_wrap_offset
    assert p.send(PID, 0, 0, 1).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_batch_spanning_the_wrap() -> None:
    p = Partition()
    p.append(PID, 0, 0, M - 2)
    base_offset = p.append(PID, 0, M - 2, 4)  # M-2, M-1, 0, 1
    assert p.send(PID, 0, M - 2, 4).duplicate == BatchMetadata(M - 2, 1, base_offset, 3, 5)
    assert p.send(PID, 0, 0, 1).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert appended(p.send(PID, 0, 2, 1))


@pytest.mark.parametrize(
    ("seq", "error"),
    [
        (M - 1, ErrorCode.DUPLICATE_SEQUENCE_NUMBER),  # one behind the oldest, across the wrap
        (M - 2**30 + 1, ErrorCode.DUPLICATE_SEQUENCE_NUMBER),  # 2^30 - 1 behind: the farthest
        (M - 2**30, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # 2^30 behind counts as ahead
        (2, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
        (2**30, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ],
)
def test_duplicate_window_is_half_the_sequence_space(seq: int, error: ErrorCode) -> None:
    p = Partition()
    p.append(PID, 0, 0, 1)  # the oldest (and only) cached batch starts at 0; next is 1
    assert p.send(PID, 0, seq, 1).error == error


def test_batch_wholly_before_the_oldest_after_a_wrap() -> None:
    p = Partition()
    p.append(PID, 0, 0, M - 5)
    p.append(PID, 0, M - 5, 5)
    for seq in range(0, 30, 5):
        p.append(PID, 0, seq, 5)  # the cache now holds 5..29
    assert p.send(PID, 0, M - 10, 3).error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert p.send(PID, 0, 0, 5).error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert p.send(PID, 0, 3, 5).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_lapped_cache_answers_duplicate_before_next_sequence() -> None:
    """Rule 3 comes before rule 5 even when a cached batch starts at the next sequence."""
    p = Partition()
    lapping_offset = p.append(PID, 0, 0, M - 1)  # 0 .. M-2
    p.append(PID, 0, M - 1, 1)  # next sequence is 0 again
    decision = p.send(PID, 0, 0, M - 1)
    assert decision.duplicate is not None and decision.duplicate.base_offset == lapping_offset
    assert appended(p.send(PID, 0, 0, 1))


def _header(epoch: int, seq: int, count: int, max_timestamp: int = 5) -> BatchHeader:
    return BatchHeader(0, 0, 0, 2, 0, count - 1, 0, max_timestamp, PID, epoch, seq, count)


# Mostly small counts; now and then one big enough that a few of them span a lap.
_counts = st.integers(0, 19).flatmap(
    lambda k: st.integers(M // 3, M - 1) if k == 0 else st.integers(1, 4)
)


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(_counts, max_size=12),
    start_seq=st.integers(0, 2).flatmap(
        lambda k: st.integers(M - 20, M - 1) if k == 0 else st.just(0)
    ),
    idle_ms=st.sampled_from([3, 3, EXPIRATION_MS, EXPIRATION_MS + 1]),
    run=st.lists(
        st.tuples(st.sampled_from(["next"] * 6 + ["gap", "old", "epoch"]), _counts),
        min_size=1,
        max_size=12,
    ),
)
# The run's first batch makes the cache span a lap, so its second is a duplicate.
@example(history=[M - 1], start_seq=0, idle_ms=3, run=[("next", 1), ("next", M - 1)])
def test_apply_in_order_takes_what_check_and_apply_take_one_by_one(
    history: list[int], start_seq: int, idle_ms: int, run: list[tuple[str, int]]
) -> None:
    """The run's fast path against `check` and `apply` batch by batch, on twin states:
    from a cache that spans a lap or wraps around 2^31, an expired producer or none,
    runs of next batches broken by a gap, a resend or a new epoch, another producer
    seen since. It takes the same leading batches and leaves the same state (the
    snapshots hold the cache, last-seen times and LRU order), and it stops early only
    where the cache could come to span a lap."""
    fast, slow = Partition(), Partition()
    for p in (fast, slow):
        if start_seq:
            # As recovery would find it: a producer whose sequence nears the wrap.
            p.state.apply(PID, 1, start_seq, 1, p.next_offset, 5, 0)
            p.next_offset += 1
        for count in history:
            entry = p.state._producers.get(PID)
            p.send(PID, 1, 0 if entry is None else entry.next_seq, count)
        p.send(PID + 1, 0, 0, 1)  # seen more recently than PID
    now_ms = idle_ms
    entry = fast.state._producers.get(PID)
    seq = 0 if entry is None else entry.next_seq
    records_before = 0 if entry is None else entry.cached_records
    headers = []
    for kind, count in run:
        if kind == "gap":
            headers.append(_header(1, (seq + 1) % M, count))
        elif kind == "old":
            headers.append(_header(0, seq, count))
        elif kind == "epoch":
            headers.append(_header(2, 0, count))
        else:
            headers.append(_header(1, seq, count))
            seq = (seq + count) % M
    taken, end_offset = fast.state.apply_in_order(PID, headers, fast.next_offset, now_ms)
    assert end_offset == fast.next_offset + sum(h.record_count for h in headers[:taken])
    one_by_one = 0
    for header in headers:
        epoch, sequence, count = header.producer_epoch, header.base_sequence, header.record_count
        decision = slow.state.check(PID, epoch, sequence, count, now_ms)
        if not appended(decision):
            break
        if one_by_one == taken:
            # Left to check and apply: a producer with no entry to continue, one in a
            # new epoch, or a cache that might come to span a lap (the bound counts
            # every record since the run began).
            entry = slow.state._producers.get(PID)
            assert (
                entry is None
                or now_ms - entry.last_seen_ms > EXPIRATION_MS
                or header.producer_epoch != entry.epoch
                or records_before + sum(h.record_count for h in headers[: taken + 1]) >= M
            )
            break
        slow.state.apply(PID, epoch, sequence, count, slow.next_offset, 5, now_ms)
        slow.next_offset += count
        one_by_one += 1
    assert taken == one_by_one
    end = slow.next_offset
    assert fast.state.encode_snapshot(end) == slow.state.encode_snapshot(end)
    event(f"taken {'none' if not taken else 'some' if taken < len(headers) else 'all'}")


def test_epoch_bump_needs_sequence_zero_and_clears_the_cache() -> None:
    p = Partition()
    p.append(PID, 0, 0, 2)
    p.append(PID, 0, 2, 3)
    decision = p.send(PID, 1, 5, 1)
    assert decision.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and decision.message
    assert p.state.epoch_of(PID) == 0
    bumped_offset = p.append(PID, 1, 0, 1)
    assert p.state.epoch_of(PID) == 1
    # the old epoch's (0, 1) and (2, 4) are gone: neither is a duplicate in the new epoch
    assert p.send(PID, 1, 0, 2).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert p.send(PID, 1, 2, 3).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert p.send(PID, 1, 0, 1).duplicate.base_offset == bumped_offset
    assert appended(p.send(PID, 1, 1, 1))


def test_epoch_bump_of_more_than_one() -> None:
    p = Partition()
    p.append(PID, 0, 0, 2)
    assert appended(p.send(PID, 5, 0, 1))
    assert p.state.epoch_of(PID) == 5


@pytest.mark.parametrize(("epoch", "seq"), [(0, -1), (-1, 0), (-1, -1)])
def test_negative_epoch_or_sequence_is_an_invalid_record(epoch: int, seq: int) -> None:
    p = Partition()
    p.append(PID, 0, 0, 1)
    decision = p.send(PID, epoch, seq, 1)
    assert decision.error == ErrorCode.INVALID_RECORD and decision.message
    assert p.send(PID + 1, epoch, seq, 1).error == ErrorCode.INVALID_RECORD


def test_check_never_mutates() -> None:
    p = Partition(max_producers=2)
    p.append(1, 0, 0, 2)
    p.append(2, 3, 0, 2, now_ms=10)
    before = p.state.encode_snapshot(p.next_offset)
    probes = [
        (1, 0, 2, 1),
        (1, 0, 0, 2),
        (1, 0, 9, 1),
        (2, 2, 2, 1),
        (2, 4, 0, 1),
        (2, 4, 3, 1),
        (3, 0, 0, 1),
        (3, 0, 1, 1),
        (1, -1, 0, 1),
    ]
    for now_ms in (0, EXPIRATION_MS + 5, 10 * EXPIRATION_MS):
        for pid, epoch, seq, count in probes:
            p.state.check(pid, epoch, seq, count, now_ms)
    assert p.state.encode_snapshot(p.next_offset) == before
    assert (p.state.expired_total, p.state.evicted_total) == (0, 0)


def test_idle_producer_is_forgotten_after_expiration() -> None:
    p = Partition()
    p.append(PID, 3, 0, 2, now_ms=1_000)
    deadline_ms = 1_000 + EXPIRATION_MS
    assert appended(p.state.check(PID, 3, 2, 1, deadline_ms))
    assert p.state.check(PID, 2, 2, 1, deadline_ms).error == ErrorCode.INVALID_PRODUCER_EPOCH
    # one millisecond later the state is gone for check(), swept or not
    assert p.state.check(PID, 3, 2, 1, deadline_ms + 1).error == ErrorCode.UNKNOWN_PRODUCER_ID
    assert p.state.check(PID, 3, 0, 2, deadline_ms + 1).duplicate is None
    assert appended(p.state.check(PID, 2, 0, 1, deadline_ms + 1))
    assert p.state.expire(deadline_ms) == 0
    assert len(p.state) == 1
    assert p.state.expire(deadline_ms + 1) == 1
    assert len(p.state) == 0 and p.state.epoch_of(PID) is None
    assert p.state.expired_total == 1


def test_expire_forgets_only_the_idle() -> None:
    p = Partition()
    for pid, now_ms in ((1, 0), (2, 500), (3, 100), (4, 900)):
        p.append(pid, 0, 0, 1, now_ms=now_ms)
    p.append(1, 0, 1, 1, now_ms=600)  # seen again: no longer idle
    assert p.state.expire(EXPIRATION_MS + 101) == 1  # only 3 (last seen at 100)
    assert [p.state.epoch_of(pid) for pid in (1, 2, 3, 4)] == [0, 0, None, 0]
    assert p.state.expire(EXPIRATION_MS + 601) == 2
    assert [p.state.epoch_of(pid) for pid in (1, 2, 3, 4)] == [None, None, None, 0]
    assert p.state.expired_total == 3


def test_apply_after_expiry_starts_afresh_without_a_sweep() -> None:
    p = Partition()
    p.append(PID, 0, 0, 2, now_ms=0)
    p.append(PID, 0, 2, 2, now_ms=0)
    late_ms = EXPIRATION_MS + 1
    p.append(PID, 0, 0, 1, now_ms=late_ms)  # accepted as a new producer
    assert p.state.expired_total == 1 and len(p.state) == 1
    # the forgotten cache held (0, 1) and (2, 3): neither is a duplicate any more
    for seq in (0, 2):
        assert (
            p.state.check(PID, 0, seq, 2, late_ms).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        )
    assert appended(p.state.check(PID, 0, 1, 1, late_ms))


def test_forgotten_producer_back_at_sequence_zero_after_a_wrap_starts_afresh() -> None:
    """Same epoch, and 0 is the next sequence, yet the idle producer's cache is gone."""
    p = Partition()
    p.append(PID, 0, 0, M - 1)
    p.append(PID, 0, M - 1, 1)  # next sequence: 0
    late_ms = EXPIRATION_MS + 1
    assert p.state.check(PID, 0, M - 1, 1, late_ms - 1).duplicate is not None
    p.append(PID, 0, 0, 1, now_ms=late_ms)
    assert p.state.check(PID, 0, M - 1, 1, late_ms).error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER


def test_least_recently_used_producer_is_evicted() -> None:
    p = Partition(max_producers=3)
    for pid in (1, 2, 3):
        p.append(pid, 0, 0, 1)
    p.append(1, 0, 1, 1)  # LRU order is now 2, 3, 1
    p.state.check(2, 0, 1, 1, 0)  # check() does not count as use
    p.append(4, 0, 0, 1)
    assert len(p.state) == 3 and p.state.evicted_total == 1
    assert [p.state.epoch_of(pid) for pid in (1, 2, 3, 4)] == [0, None, 0, 0]
    assert p.send(2, 0, 1, 1).error == ErrorCode.UNKNOWN_PRODUCER_ID
    p.append(5, 0, 0, 1)
    assert [p.state.epoch_of(pid) for pid in (1, 3, 4, 5)] == [0, None, 0, 0]
    assert p.state.evicted_total == 2


def test_apply_accepts_whatever_a_valid_log_holds() -> None:
    """Replay after a change of limits or clock may meet batches check() would now refuse."""
    state = PartitionProducerState(max_producers=10, expiration_ms=EXPIRATION_MS)
    state.apply(PID, 2, 40, 3, 0, 0, 0)  # continues a producer this state never saw
    assert state.epoch_of(PID) == 2 and appended(state.check(PID, 2, 43, 1, 0))
    state.apply(PID, 1, 0, 2, 10, 0, 0)  # a lower epoch, after the original run forgot it
    assert state.epoch_of(PID) == 1 and appended(state.check(PID, 1, 2, 1, 0))
    state.apply(PID, 1, 0, 1, 20, 0, 0)  # a restart at 0 within the epoch
    assert state.check(PID, 1, 0, 2, 0).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert state.check(PID, 1, 0, 1, 0).duplicate.base_offset == 20
    state.apply(PID, 4, 0, 1, 30, 0, 0)
    assert state.epoch_of(PID) == 4 and state.check(PID, 4, 0, 1, 0).duplicate.base_offset == 30


def test_apply_asserts_that_offsets_grow() -> None:
    state = PartitionProducerState(max_producers=10, expiration_ms=EXPIRATION_MS)
    state.apply(PID, 0, 0, 3, 10, 0, 0)
    with pytest.raises(AssertionError):
        state.apply(PID, 0, 3, 1, 12, 0, 0)


# Snapshots


def varied_partition() -> Partition:
    """Producers whose LRU order differs from their insertion order, with 1..5 cached batches."""
    p = Partition(max_producers=4)
    p.append(1, 0, 0, 3, now_ms=10)
    for seq in range(0, 7):
        p.append(2, 4, seq, 1, now_ms=20 + seq)
    p.append(3, 0, 0, 1, now_ms=30)
    p.append(3, 1, 0, 2, now_ms=40)
    p.append(4, 0, 0, M - 2, now_ms=50)
    p.append(4, 0, M - 2, 3, now_ms=60)
    p.append(1, 0, 3, 2, now_ms=700)  # LRU order: 2, 3, 4, 1
    return p


def test_snapshot_round_trip() -> None:
    p = varied_partition()
    data = p.state.encode_snapshot(p.next_offset)
    offset, state = PartitionProducerState.decode_snapshot(
        data, max_producers=4, expiration_ms=EXPIRATION_MS
    )
    assert offset == p.next_offset
    assert state.encode_snapshot(offset) == data
    assert len(state) == 4
    assert [state.epoch_of(pid) for pid in (1, 2, 3, 4)] == [0, 4, 1, 0]
    for seq in range(2, 7):  # all five cached batches of producer 2
        duplicate = state.check(2, 4, seq, 1, 0).duplicate
        assert duplicate == p.state.check(2, 4, seq, 1, 0).duplicate
        assert duplicate is not None
    assert state.check(2, 4, 1, 1, 0).error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert state.check(4, 0, 0, M - 2, 0).duplicate is not None
    assert appended(state.check(4, 0, 1, 1, 0))
    # last_seen_ms: 2 and 3 were last seen before 4 and 1
    assert state.expire(40 + EXPIRATION_MS + 1) == 2
    assert [state.epoch_of(pid) for pid in (1, 2, 3, 4)] == [0, None, None, 0]


def test_snapshot_keeps_lru_order() -> None:
    p = varied_partition()
    data = p.state.encode_snapshot(p.next_offset)
    _, state = PartitionProducerState.decode_snapshot(
        data, max_producers=4, expiration_ms=EXPIRATION_MS
    )
    state.apply(5, 0, 0, 1, p.next_offset, 0, 800)
    state.apply(6, 0, 0, 1, p.next_offset + 1, 0, 800)
    assert [state.epoch_of(pid) for pid in (1, 2, 3, 4, 5, 6)] == [0, None, None, 0, 0, 0]
    assert state.evicted_total == 2


def test_snapshot_decode_trims_to_max_producers() -> None:
    p = varied_partition()
    data = p.state.encode_snapshot(p.next_offset)
    _, state = PartitionProducerState.decode_snapshot(
        data, max_producers=2, expiration_ms=EXPIRATION_MS
    )
    assert [state.epoch_of(pid) for pid in (1, 2, 3, 4)] == [0, None, None, 0]
    assert state.evicted_total == 2 and state.expired_total == 0


def test_empty_snapshot_round_trip() -> None:
    state = PartitionProducerState(max_producers=1, expiration_ms=1)
    offset, decoded = PartitionProducerState.decode_snapshot(
        state.encode_snapshot(0), max_producers=1, expiration_ms=1
    )
    assert offset == 0 and len(decoded) == 0


def test_snapshot_offset_must_lie_past_every_batch() -> None:
    p = varied_partition()
    with pytest.raises(AssertionError):
        p.state.encode_snapshot(p.next_offset - 1)


def decode(data: bytes) -> tuple[int, PartitionProducerState]:
    return PartitionProducerState.decode_snapshot(
        data, max_producers=10, expiration_ms=EXPIRATION_MS
    )


def test_snapshot_with_any_flipped_byte_is_refused() -> None:
    p = varied_partition()
    data = p.state.encode_snapshot(p.next_offset)
    for at in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[at] ^= mask
            with pytest.raises(SnapshotError):
                decode(bytes(corrupt))


def test_snapshot_truncated_at_any_length_is_refused() -> None:
    p = varied_partition()
    data = p.state.encode_snapshot(p.next_offset)
    for length in range(len(data)):
        with pytest.raises(SnapshotError):
            decode(data[:length])
    with pytest.raises(SnapshotError):
        decode(data + b"\x00")


def framed(body: bytes, offset: int = 1_000, version: int = 1, magic: bytes = b"MBPS") -> bytes:
    """A snapshot frame with a valid CRC around any body, written from the documented layout."""
    head = struct.pack(">4sHqI", magic, version, offset, len(body))
    return head + body + struct.pack(">I", zlib.crc32(head + body))


def body(*producers: object) -> bytes:
    return msgpack.packb(list(producers), use_bin_type=True)


GOOD_PRODUCER = [7, 1, 123, [[0, 1, 10, 1, 5], [2, 2, 12, 0, 6]]]


def test_framed_helper_matches_the_format() -> None:
    offset, state = decode(framed(body(GOOD_PRODUCER)))
    assert offset == 1_000 and state.epoch_of(7) == 1
    assert state.check(7, 1, 0, 2, 0).duplicate == BatchMetadata(0, 1, 10, 1, 5)
    assert appended(state.check(7, 1, 3, 1, 0))


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(framed(body(GOOD_PRODUCER), magic=b"MBPX"), id="magic"),
        pytest.param(framed(body(GOOD_PRODUCER), version=2), id="version"),
        pytest.param(framed(body(GOOD_PRODUCER), offset=-1), id="negative-offset"),
        pytest.param(framed(b"\xc1"), id="not-msgpack"),
        pytest.param(framed(body(GOOD_PRODUCER) + b"\x00"), id="trailing-data"),
        pytest.param(framed(msgpack.packb({"7": 1})), id="map-body"),
        pytest.param(framed(body([7, 1, 123])), id="short-producer"),
        pytest.param(framed(body([7, 1, 123, [[0, 1, 10, 1, 5]], 0])), id="long-producer"),
        pytest.param(framed(body([True, 1, 123, [[0, 0, 10, 0, 5]]])), id="bool-pid"),
        pytest.param(framed(body([-7, 1, 123, [[0, 0, 10, 0, 5]]])), id="negative-pid"),
        pytest.param(framed(body([7, 2**15, 123, [[0, 0, 10, 0, 5]]])), id="epoch-over-int16"),
        pytest.param(framed(body([7, -1, 123, [[0, 0, 10, 0, 5]]])), id="negative-epoch"),
        pytest.param(framed(body([7, 1, 1.5, [[0, 0, 10, 0, 5]]])), id="float-last-seen"),
        pytest.param(framed(body([7, 1, 123, []])), id="no-batches"),
        pytest.param(
            framed(body([7, 1, 123, [[i, i, 10 + i, 0, 5] for i in range(6)]])), id="six-batches"
        ),
        pytest.param(framed(body([7, 1, 123, [[0, 0, 10, 0]]])), id="short-batch"),
        pytest.param(framed(body([7, 1, 123, [[0, 0, 10, 0, "5"]]])), id="str-timestamp"),
        pytest.param(framed(body([7, 1, 123, [[0, 2, 10, 1, 5]]])), id="bad-last-seq"),
        pytest.param(framed(body([7, 1, 123, [[M, 0, 10, 0, 5]]])), id="seq-over-int31"),
        pytest.param(
            framed(body([7, 1, 123, [[0, 1, 10, 1, 5], [3, 3, 12, 0, 6]]])), id="sequence-gap"
        ),
        pytest.param(
            framed(body([7, 1, 123, [[0, 1, 10, 1, 5], [2, 2, 11, 0, 6]]])), id="offset-overlap"
        ),
        pytest.param(framed(body([7, 1, 123, [[0, 0, -1, 0, 5]]])), id="negative-offset-batch"),
        pytest.param(framed(body([7, 1, 123, [[0, 0, 1_000, 0, 5]]])), id="batch-at-snapshot"),
        pytest.param(framed(body([7, 1, 123, [[0, 0, 10, 0, 2**63]]])), id="timestamp-over-int64"),
        pytest.param(framed(body(GOOD_PRODUCER, GOOD_PRODUCER)), id="producer-twice"),
    ],
)
def test_garbage_with_a_valid_crc_is_refused(data: bytes) -> None:
    with pytest.raises(SnapshotError):
        decode(data)


def test_snapshot_error_is_a_value_error() -> None:
    assert issubclass(SnapshotError, ValueError)


# The state machine: an independent model, a log, restarts from snapshots


PIDS = (1, 2, 3, 4)
MAX_PRODUCERS = 3


@dataclass
class ModelProducer:
    epoch: int
    last_seen_ms: int
    batches: list[tuple[int, int, int]]  # (first_seq, record_count, base_offset), oldest first


class Model:
    """docs/protocol.md section 3 written as plainly as possible, with a list for LRU order."""

    def __init__(self) -> None:
        self.producers: dict[int, ModelProducer] = {}
        self.lru: list[int] = []

    def live(self, pid: int, now_ms: int) -> ModelProducer | None:
        producer = self.producers.get(pid)
        if producer is None or now_ms - producer.last_seen_ms > EXPIRATION_MS:
            return None
        return producer

    def decide(
        self, pid: int, epoch: int, seq: int, count: int, now_ms: int
    ) -> tuple[ErrorCode, int | None, bool]:
        """(error, base_offset of the duplicate, whether the batch starts a new state)."""
        producer = self.live(pid, now_ms)
        last = (seq + count - 1) % M
        if producer is None:
            return (ErrorCode.NONE if seq == 0 else ErrorCode.UNKNOWN_PRODUCER_ID), None, True
        if epoch < producer.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH, None, False
        if epoch == producer.epoch:
            for first, n, base_offset in producer.batches:
                if (first, (first + n - 1) % M) == (seq, last):
                    return ErrorCode.NONE, base_offset, False
        if epoch > producer.epoch:
            if seq == 0:
                return ErrorCode.NONE, None, True
            return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None, False
        newest_first, newest_count, _ = producer.batches[-1]
        if seq == (newest_first + newest_count) % M:
            return ErrorCode.NONE, None, False
        oldest_first = producer.batches[0][0]
        # unwrap `last` to the representative nearest the oldest first_seq, ties ahead
        half = M // 2
        unwrapped = oldest_first + (last - oldest_first + half - 1) % M - (half - 1)
        if unwrapped < oldest_first:
            return ErrorCode.DUPLICATE_SEQUENCE_NUMBER, None, False
        return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None, False

    def append(
        self, pid: int, epoch: int, seq: int, count: int, base_offset: int, now_ms: int
    ) -> None:
        producer = self.live(pid, now_ms)
        batch = (seq, count, base_offset)
        if producer is None or producer.epoch != epoch:
            producer = ModelProducer(epoch, now_ms, [batch])
        else:
            producer = ModelProducer(epoch, now_ms, [*producer.batches, batch][-5:])
        self.producers[pid] = producer
        if pid in self.lru:
            self.lru.remove(pid)
        self.lru.append(pid)
        while len(self.lru) > MAX_PRODUCERS:
            del self.producers[self.lru.pop(0)]

    def expire(self, now_ms: int) -> int:
        idle = [
            pid for pid in self.lru if now_ms - self.producers[pid].last_seen_ms > EXPIRATION_MS
        ]
        for pid in idle:
            self.lru.remove(pid)
            del self.producers[pid]
        return len(idle)


@dataclass(frozen=True)
class LogBatch:
    producer_id: int
    epoch: int
    first_seq: int
    record_count: int
    base_offset: int
    append_ms: int
    fresh: bool  # appended with no live state for its producer, or in a new epoch


# Producers 1 and 2 are busy enough to fill their caches; 3 and 4 come and go and
# push the partition past MAX_PRODUCERS.
pids = st.sampled_from((1, 1, 1, 2, 2, 3, 4))


class ProducerStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = self.empty_state()
        self.model = Model()
        self.log: list[LogBatch] = []
        self.next_offset = 0
        self.now_ms = 0
        self.snapshots: list[tuple[int, bytes]] = []
        self.epoch = dict.fromkeys(PIDS, 0)  # what each well-behaved client sends next
        self.next_seq = dict.fromkeys(PIDS, 0)

    @staticmethod
    def empty_state() -> PartitionProducerState:
        return PartitionProducerState(max_producers=MAX_PRODUCERS, expiration_ms=EXPIRATION_MS)

    def submit(self, pid: int, epoch: int, seq: int, count: int) -> Decision:
        """What the broker does with one produced batch; the model must agree."""
        decision = self.state.check(pid, epoch, seq, count, self.now_ms)
        error, duplicate_offset, fresh = self.model.decide(pid, epoch, seq, count, self.now_ms)
        event(f"{error.name}{' duplicate' if duplicate_offset is not None else ''}")
        assert decision.error == error, (decision, error)
        assert (decision.message is None) == (error == ErrorCode.NONE), decision
        if duplicate_offset is not None:
            assert decision.duplicate is not None, decision
            assert decision.duplicate.base_offset == duplicate_offset
            assert decision.duplicate.first_seq == seq
            assert decision.duplicate.last_seq == (seq + count - 1) % M
        else:
            assert decision.duplicate is None, decision
        if error == ErrorCode.NONE and duplicate_offset is None:
            batch = LogBatch(pid, epoch, seq, count, self.next_offset, self.now_ms, fresh)
            self.log.append(batch)
            self.next_offset += count
            self.state.apply(pid, epoch, seq, count, batch.base_offset, 0, self.now_ms)
            self.model.append(pid, epoch, seq, count, batch.base_offset, self.now_ms)
        return decision

    def produce_next(self, pid: int, count: int) -> None:
        """A well-behaved client: when refused, it bumps its epoch as InitProducerId would."""
        decision = self.submit(pid, self.epoch[pid], self.next_seq[pid], count)
        if appended(decision):
            self.next_seq[pid] = (self.next_seq[pid] + count) % M
        elif decision.error != ErrorCode.NONE:
            self.epoch[pid] += 1
            self.next_seq[pid] = 0

    @rule(pid=pids, counts=st.lists(st.integers(1, 5), min_size=1, max_size=4))
    def produce(self, pid: int, counts: list[int]) -> None:
        for count in counts:
            self.produce_next(pid, count)

    @rule(pid=pids, short_of_wrap=st.integers(0, 6))
    def produce_up_to_the_wrap(self, pid: int, short_of_wrap: int) -> None:
        # a count of 2^31 - 1 when already there: the cache then laps the sequence space
        count = (M - short_of_wrap - self.next_seq[pid]) % M or M - 1
        self.produce_next(pid, count)

    @rule(pid=pids, age=st.integers(1, 8))
    def resend(self, pid: int, age: int) -> None:
        mine = [b for b in self.log if b.producer_id == pid]
        if len(mine) >= age:
            batch = mine[-age]
            self.submit(pid, batch.epoch, batch.first_seq, batch.record_count)

    @rule(pid=pids, gap=st.integers(1, 3), count=st.integers(1, 5))
    def send_with_gap(self, pid: int, gap: int, count: int) -> None:
        self.submit(pid, self.epoch[pid], (self.next_seq[pid] + gap) % M, count)

    @rule(pid=pids, count=st.integers(1, 5))
    def bump_epoch(self, pid: int, count: int) -> None:
        self.epoch[pid] += 1
        self.next_seq[pid] = 0
        self.produce_next(pid, count)

    @rule(pid=pids, seq=st.integers(1, 5))
    def bump_epoch_without_sequence_zero(self, pid: int, seq: int) -> None:
        self.submit(pid, self.epoch[pid] + 1, seq, 1)

    @rule(pid=pids, older=st.integers(1, 3))
    def send_stale_epoch(self, pid: int, older: int) -> None:
        if self.epoch[pid] > 0:
            self.submit(pid, max(0, self.epoch[pid] - older), self.next_seq[pid], 1)

    # whole quarters of EXPIRATION_MS often land exactly on the expiry boundary
    @rule(elapsed_ms=st.sampled_from((0, 1, 250, 250, 500, 999, 1_000)))
    def advance_clock(self, elapsed_ms: int) -> None:
        self.now_ms += elapsed_ms

    @rule()
    def expire(self) -> None:
        assert self.state.expire(self.now_ms) == self.model.expire(self.now_ms)

    @rule(start=st.sampled_from(["latest", "older", "scratch"]), which=st.integers(0, 50))
    def restart(self, start: str, which: int) -> None:
        """Snapshot at the log end, then rebuild from a snapshot and replay what follows it."""
        self.snapshots.append((self.next_offset, self.state.encode_snapshot(self.next_offset)))
        if start == "scratch":
            offset, state = 0, self.empty_state()
        else:
            taken_at, data = self.snapshots[
                -1 if start == "latest" else which % len(self.snapshots)
            ]
            offset, state = PartitionProducerState.decode_snapshot(
                data, max_producers=MAX_PRODUCERS, expiration_ms=EXPIRATION_MS
            )
            assert offset == taken_at
        for batch in self.log:
            if batch.base_offset >= offset:
                state.apply(
                    batch.producer_id,
                    batch.epoch,
                    batch.first_seq,
                    batch.record_count,
                    batch.base_offset,
                    0,
                    batch.append_ms,
                )
        # replay from an older point may keep producers the live run swept; sweep both
        state.expire(self.now_ms)
        self.model.expire(self.now_ms)
        self.state = state

    @invariant()
    def same_producers(self) -> None:
        assert len(self.state) == len(self.model.producers)
        for pid in PIDS:
            model = self.model.producers.get(pid)
            assert self.state.epoch_of(pid) == (None if model is None else model.epoch)

    @invariant()
    def same_verdict_on_the_next_batch(self) -> None:
        for pid in PIDS:
            args = (pid, self.epoch[pid], self.next_seq[pid], 1, self.now_ms)
            error, duplicate_offset, _ = self.model.decide(*args)
            decision = self.state.check(*args)
            assert decision.error == error
            assert (decision.duplicate and decision.duplicate.base_offset) == duplicate_offset

    @invariant()
    def log_is_contiguous_per_producer_epoch(self) -> None:
        next_seq: dict[tuple[int, int], int] = {}
        for batch in self.log:
            key = (batch.producer_id, batch.epoch)
            if batch.fresh:
                assert batch.first_seq == 0, batch
            else:
                assert batch.first_seq == next_seq[key], (batch, next_seq.get(key))
            next_seq[key] = (batch.first_seq + batch.record_count) % M


ProducerStateMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestProducerStateMachine = ProducerStateMachine.TestCase
