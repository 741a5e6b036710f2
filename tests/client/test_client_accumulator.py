"""Sans-IO tests of the producer core: batching, sequences, retries and KIP-360 recovery.

Everything runs on a fake clock (plain numbers passed as now_ms); nothing sleeps.
The last tests drive the accumulator against a model of the broker's
idempotence rules (docs/protocol.md section 3) with random faults and check that
every record lands exactly once, in order.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgpack
import pytest

from client.accumulator import BufferFull, ProducerBatch, RecordAccumulator
from client.errors import (
    DeliveryTimeoutError,
    MinibrokerError,
    MinibrokerTimeoutError,
    ProducerFencedError,
    RecordTooLargeError,
)
from protocol.batch import (
    SEQUENCE_MODULUS,
    decode_records,
    encode_batch,
    read_header,
    validate,
)
from protocol.errors import ErrorCode
from protocol.records import encode_rows, join_records, record_parts

E = ErrorCode


class Clock:
    """A fake monotonic clock in ms: tests set `.now`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(**overrides: object) -> RecordAccumulator:
    settings: dict[str, object] = {
        "clock": Clock(),
        "batch_size": 1000,
        "buffer_memory": 100_000,
        "linger_ms": 0,
        "retry_backoff_ms": 100,
        "retry_backoff_max_ms": 1000,
        "delivery_timeout_ms": 120_000,
    }
    settings.update(overrides)
    acc = RecordAccumulator(**settings)  # type: ignore[arg-type]
    acc.set_producer_id(7, 0)
    return acc


def add(acc: RecordAccumulator, value: bytes, partition: int = 0, now: float = 0, topic: str = "t"):
    acc.clock.now = now  # type: ignore[attr-defined]
    return acc.append(topic, partition, 1_000, None, value, None, None)


def fill_batches(acc: RecordAccumulator, count: int, partition: int = 0) -> None:
    """Append records until `count` batches are sealed (each ~ one 500-byte record pair)."""
    for i in range(count):
        add(acc, b"a" * 400, partition)
        add(acc, b"b%03d" % i + b"b" * 396, partition)


def drain_one_each(acc: RecordAccumulator, now: float, n: int) -> list[ProducerBatch]:
    requests = acc.drain(now, n)
    assert all(len(r) == 1 for r in requests)
    return [r[0] for r in requests]


def sequences(batches: list[ProducerBatch]) -> list[int | None]:
    return [b.sequence for b in batches]


# --------------------------------------------------------------------------- batching


def test_linger_holds_a_batch_until_its_deadline() -> None:
    acc = make(linger_ms=10)
    add(acc, b"x", now=100)
    assert acc.drain(105, 5) == []
    assert acc.next_deadline(105) == 110
    (request,) = acc.drain(110, 5)
    assert [b.record_count for b in request] == [1]


def test_a_full_batch_is_sendable_before_linger_expires() -> None:
    acc = make(linger_ms=10_000)
    fill_batches(acc, 1)
    add(acc, b"next")  # opens a second, lingering batch
    batches = drain_one_each(acc, 0, 5)
    assert [b.record_count for b in batches] == [2]
    assert acc.next_deadline(0) == 10_000


def test_sequences_are_assigned_per_partition_at_first_drain() -> None:
    acc = make()
    fill_batches(acc, 3, partition=0)
    fill_batches(acc, 1, partition=1)
    requests = acc.drain(0, 5)
    by_partition = defaultdict(list)
    for request in requests:
        assert len({b.partition for b in request}) == len(request)  # one batch per partition
        for b in request:
            by_partition[b.partition].append(b.sequence)
    assert by_partition == {0: [0, 2, 4], 1: [0]}


def test_drain_respects_max_requests() -> None:
    acc = make()
    fill_batches(acc, 4)
    assert len(acc.drain(0, 2)) == 2
    assert len(acc.drain(0, 5)) == 2


def test_max_request_size_splits_partitions_over_requests() -> None:
    acc = make(max_request_size=1200)
    fill_batches(acc, 1, partition=0)
    fill_batches(acc, 1, partition=1)
    requests = acc.drain(0, 5)
    assert [len(r) for r in requests] == [1, 1]


def test_record_too_large_is_refused_at_append() -> None:
    acc = make(max_request_size=500, batch_size=500)
    with pytest.raises(RecordTooLargeError):
        add(acc, b"x" * 600)


def test_buffer_memory_blocks_then_frees_on_completion() -> None:
    acc = make(buffer_memory=2_000, batch_size=1_000)
    fill_batches(acc, 1)
    add(acc, b"c" * 400)
    with pytest.raises(BufferFull):
        for _ in range(10):
            add(acc, b"d" * 400)
    assert acc.buffered_bytes == 2_000
    (first,) = drain_one_each(acc, 0, 1)
    assert acc.on_response(first, E.NONE, 0, 1) == [first]
    assert acc.buffered_bytes == 1_000
    add(acc, b"e" * 400)


# --------------------------------------------------------------------------- adaptive batching


def full_pipeline(**overrides: object) -> tuple[RecordAccumulator, list[ProducerBatch]]:
    """An accumulator whose partition 0 has both of its in-flight slots taken (2 batches
    of 2 records each in flight), batch_size 1000 and max_request_size 3000."""
    settings: dict[str, object] = {"max_in_flight": 2, "max_request_size": 3_000}
    settings.update(overrides)
    acc = make(**settings)
    fill_batches(acc, 2)
    in_flight = drain_one_each(acc, 0, 5)
    assert [b.record_count for b in in_flight] == [2, 2]
    return acc, in_flight


def test_a_batch_grows_past_batch_size_while_every_in_flight_slot_is_taken() -> None:
    acc, in_flight = full_pipeline()
    for i in range(7):
        add(acc, b"%03d" % i + b"g" * 397)
    # the sender has no slot to drain into until an answer comes
    assert acc.on_response(in_flight[0], E.NONE, 0, 1) == [in_flight[0]]
    (grown,) = drain_one_each(acc, 1, 1)  # one slot free
    # 6 records of 421 bytes: 2,582 bytes of the 3,000 that max_request_size allows
    assert (grown.record_count, grown.size, grown.reserved) == (6, 2_582, 3_000)
    assert grown.sequence == 4  # one base sequence for all of it
    wire = grown.wire(acc.producer_id, acc.producer_epoch, acc.compression)
    header = validate(wire)
    assert header.record_count == 6 and len(wire) <= 3_000
    values = [r[2] for r in decode_records(wire, 0, header)]
    assert values == [b"%03d" % i + b"g" * 397 for i in range(6)]
    (seventh,) = drain_one_each(acc, 1, 1)  # the 7th record opened the next batch
    assert (seventh.record_count, seventh.sequence) == (1, 10)


def test_each_growth_step_counts_as_a_full_batch_for_the_sticky_partitioner() -> None:
    full: list[tuple[str, int]] = []
    acc, _ = full_pipeline(on_batch_full=lambda topic, partition: full.append((topic, partition)))
    full.clear()
    for _ in range(6):
        add(acc, b"p" * 400)  # two growth steps, then sealed at max_request_size
    assert full == [("t", 0)] * 3


def test_a_grown_batch_is_retried_with_its_sequence_and_bytes() -> None:
    acc, in_flight = full_pipeline()
    for _ in range(6):
        add(acc, b"r" * 400)
    acc.on_response(in_flight[0], E.NONE, 0, 1)
    (grown,) = drain_one_each(acc, 1, 1)
    wire = grown.wire(acc.producer_id, acc.producer_epoch, acc.compression)
    acc.on_response(in_flight[1], E.NONE, 2, 2)
    assert acc.on_connection_lost([grown], 3, "dropped") == []
    (again,) = drain_one_each(acc, 200, 5)
    assert again is grown and again.sequence == 4
    assert again.wire(acc.producer_id, acc.producer_epoch, acc.compression) == wire
    assert acc.on_response(again, E.DUPLICATE_SEQUENCE_NUMBER, -1, 201) == [grown]
    assert acc.buffered_bytes == 0  # the growth's reservation is given back with the batch


def test_no_batch_grows_while_the_partition_has_a_free_in_flight_slot() -> None:
    acc = make(max_in_flight=3, max_request_size=3_000)
    fill_batches(acc, 1)
    drain_one_each(acc, 0, 5)  # one of three slots taken: two batches may still go ahead
    for _ in range(4):
        add(acc, b"s" * 400)
    batches = drain_one_each(acc, 0, 5)
    assert [(b.record_count, b.reserved) for b in batches] == [(2, 1_000), (2, 1_000)]


def test_with_adaptive_batching_off_batch_size_is_a_cap() -> None:
    acc, _ = full_pipeline(adaptive_batching=False)
    for _ in range(6):
        add(acc, b"o" * 400)
    assert [b.record_count for b in drain_one_each(acc, 0, 5)] == [2, 2, 2]
    assert acc.buffered_bytes == 5 * 1_000  # 2 in flight and 3 queued batches of 2


def test_growth_takes_buffer_memory_and_stops_where_it_runs_out() -> None:
    acc, in_flight = full_pipeline(buffer_memory=4_000)
    for _ in range(4):
        add(acc, b"m" * 400)  # 3 batches of 1,000 reserved, then one step of growth
    assert acc.buffered_bytes == 4_000
    with pytest.raises(BufferFull):
        add(acc, b"m" * 400)
    acc.on_response(in_flight[0], E.NONE, 0, 1)
    (grown,) = drain_one_each(acc, 1, 5)
    assert (grown.record_count, grown.reserved) == (4, 2_000)


def test_a_batch_refused_as_too_large_is_split_into_pieces_of_its_sequence_range() -> None:
    acc, in_flight = full_pipeline()
    handles = [add(acc, b"%03d" % i + b"z" * 397) for i in range(6)]
    for batch, offset in zip(in_flight, (0, 2), strict=True):
        acc.on_response(batch, E.NONE, offset, 1)
    (grown,) = drain_one_each(acc, 1, 5)
    assert (grown.record_count, grown.sequence) == (6, 4)
    assert acc.on_response(grown, E.MESSAGE_TOO_LARGE, -1, 2) == []  # split, not failed
    pieces = drain_one_each(acc, 2, 5)
    assert [(p.record_count, p.sequence) for p in pieces] == [(2, 4), (2, 6), (2, 8)]
    values = []
    for piece in pieces:
        wire = piece.wire(acc.producer_id, acc.producer_epoch, acc.compression)
        values += [r[2] for r in decode_records(wire, 0, validate(wire, max_bytes=1_000))]
    assert values == [b"%03d" % i + b"z" * 397 for i in range(6)]
    assert acc.on_response(pieces[0], E.NONE, 4, 3) == [pieces[0]]
    assert acc.on_response(pieces[1], E.NONE, 10, 3) == [pieces[1]]  # another producer between
    assert not grown.finished
    assert acc.on_response(pieces[2], E.NONE, 12, 3) == [pieces[2], grown]
    assert [h.get(0).offset for h in handles] == [4, 5, 10, 11, 12, 13]
    assert acc.metrics["records_sent"] == 10 and acc.buffered_bytes == 0
    assert acc.producer_id_request() is None  # no hole: no epoch bump
    for _ in range(6):
        add(acc, b"n" * 400)  # batches no longer grow to the refused batch's size
    assert max(b.size for b in drain_one_each(acc, 4, 5)) < grown.size


def test_a_single_record_refused_as_too_large_fails() -> None:
    acc = make()
    handle = add(acc, b"x" * 900)
    (batch,) = drain_one_each(acc, 0, 5)
    assert acc.on_response(batch, E.MESSAGE_TOO_LARGE, -1, 1) == [batch]
    with pytest.raises(RecordTooLargeError):
        handle.get(0)


def test_a_grown_batch_does_not_wait_for_linger_once_a_slot_frees() -> None:
    acc, in_flight = full_pipeline(linger_ms=10_000)
    for _ in range(3):
        add(acc, b"l" * 400)
    assert acc.next_deadline(5, can_send=True) == 5  # ready: it outgrew batch_size
    acc.on_response(in_flight[0], E.NONE, 0, 6)
    (grown,) = drain_one_each(acc, 6, 5)
    assert grown.record_count == 3


MIXED_RECORDS = [
    # (timestamp_ms, key, value, headers): every shape record_parts frames itself or leaves
    # to msgpack: keyless and keyed, None key or value, headers, deltas from -1 to 70,000.
    (1_000, None, b"v" * 100, None),
    (1_000, b"k", b"v" * 300, None),
    (1_003, None, None, None),
    (1_003, b"", b"", None),
    (1_127, None, b"x", None),
    (1_128, b"key", b"y" * 70_000, None),
    (999, None, b"z", None),
    (71_000, b"k", None, None),
    (1_001, None, b"h", [("trace", b"\x01"), ("n\u00e9", b"")]),
    (1_001, b"k", b"v", []),
]


def test_a_batch_built_record_by_record_has_the_bytes_of_encode_rows() -> None:
    acc = make(batch_size=1_000_000, max_request_size=2_000_000, buffer_memory=4_000_000)
    handles = [acc.append("t", 0, ts, k, v, h, None) for ts, k, v, h in MIXED_RECORDS]
    (batch,) = drain_one_each(acc, 0, 1)
    wire = batch.wire(7, 0, 0)
    base = MIXED_RECORDS[0][0]
    # What the batch was before records were framed one by one: rows packed at once.
    expected = encode_batch(
        encode_rows([(ts - base, k, v, h) for ts, k, v, h in MIXED_RECORDS]),
        record_count=len(MIXED_RECORDS),
        base_timestamp=base,
        max_timestamp=71_000,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
    )
    assert wire == expected
    assert batch.wire(7, 0, 0) is wire  # encoded once
    acc.on_response(batch, E.NONE, 10, 1)
    assert [h.get(0).timestamp for h in handles] == [r[0] for r in MIXED_RECORDS]


def test_record_parts_match_msgpack_for_any_record() -> None:
    for delta in (-200, -1, 0, 1, 127, 128, 70_000):
        for key in (None, b"", b"k" * 300):
            for value in (None, b"", b"v" * 70_000):
                for headers in (None, [], [("a", b"b")]):
                    row = (delta, key, value, headers)
                    joined = join_records([b"", *record_parts(*row)], 1)
                    assert joined == encode_rows([row]), row


def test_wait_for_space_returns_when_a_batch_frees_its_memory() -> None:
    acc = make(buffer_memory=2_000, batch_size=1_000)
    fill_batches(acc, 2)
    with pytest.raises(BufferFull):
        add(acc, b"x" * 400)
    assert acc.wait_for_space(1_000, 0) is False
    first = drain_one_each(acc, 0, 1)[0]
    waiter = ThreadPoolExecutor(1).submit(acc.wait_for_space, 1_000, 10)
    time.sleep(0.05)
    assert not waiter.done()
    for batch in acc.on_response(first, E.NONE, 0, 1):
        batch.notify()
    assert waiter.result(5) is True
    add(acc, b"x" * 400)


def test_wait_for_space_returns_when_the_accumulator_closes() -> None:
    acc = make(buffer_memory=1_000, batch_size=1_000)
    fill_batches(acc, 1)
    waiter = ThreadPoolExecutor(1).submit(acc.wait_for_space, 1_000, 10)
    time.sleep(0.05)
    acc.close()
    assert waiter.result(5) is True
    with pytest.raises(MinibrokerError, match="closed"):
        add(acc, b"x")


def test_batch_wait_sees_a_finish_from_another_thread() -> None:
    acc = make()
    handle = add(acc, b"v")
    (batch,) = drain_one_each(acc, 0, 1)
    assert batch.done_event is None  # made only by a waiter
    with pytest.raises(MinibrokerTimeoutError):
        handle.get(0.01)

    def finish() -> None:
        time.sleep(0.05)
        for b in acc.on_response(batch, E.NONE, 5, 1):
            b.notify()

    ThreadPoolExecutor(1).submit(finish)
    assert handle.get(5).offset == 5


def test_handles_give_record_metadata_and_callbacks_run_once() -> None:
    acc = make()
    calls = []
    h0 = acc.append("t", 0, 1_000, b"k", b"v0", None, lambda e, m: calls.append((e, m)))
    h1 = acc.append("t", 0, 1_005, None, b"v1", None, None)
    (batch,) = drain_one_each(acc, 0, 1)
    done = acc.on_response(batch, E.NONE, 40, 1)
    assert h0.done() and calls == []  # callbacks run at notify, outside the lock
    for b in done:
        b.notify()
    assert h0.get(0).offset == 40 and h1.get(0).offset == 41
    assert h1.get(0).timestamp == 1_005
    assert len(calls) == 1 and calls[0][0] is None and calls[0][1].offset == 40


def test_done_callbacks_run_once_at_notify_or_at_once_when_already_finished() -> None:
    acc = make()
    calls: list[tuple[str, object]] = []
    h0 = add(acc, b"v0")
    h1 = add(acc, b"v1")
    h0.add_done_callback(lambda h: calls.append(("h0", h.get(0).offset)))
    h1.add_done_callback(lambda h: calls.append(("h1", h.get(0).offset)))
    (batch,) = drain_one_each(acc, 0, 1)
    done = acc.on_response(batch, E.NONE, 40, 1)
    assert calls == []  # finished, but callbacks run at notify, outside the lock
    for b in done:
        b.notify()
        b.notify()  # a second notify runs nothing again
    assert calls == [("h0", 40), ("h1", 41)]
    h1.add_done_callback(lambda h: calls.append(("late", h.get(0).offset)))
    assert calls[-1] == ("late", 41)  # already finished: run now, on this thread


def test_done_callback_of_a_failed_batch_sees_the_error() -> None:
    acc = make()
    handle = add(acc, b"v")
    errors: list[BaseException | None] = []
    handle.add_done_callback(lambda h: errors.append(h.exception()))
    (batch,) = drain_one_each(acc, 0, 1)
    for b in acc.on_response(batch, E.INVALID_PRODUCER_EPOCH, -1, 1):
        b.notify()
    assert len(errors) == 1 and isinstance(errors[0], ProducerFencedError)


def test_a_done_callback_added_between_finish_and_notify_runs_at_once_and_only_then() -> None:
    """The I/O thread marks a batch finished under the accumulator's lock and notifies it
    later: a callback added in between runs on the adding thread, and notify leaves it."""
    acc = make()
    handle = add(acc, b"v")
    ran: list[str] = []
    (batch,) = drain_one_each(acc, 0, 1)
    (done,) = acc.on_response(batch, E.NONE, 7, 1)  # finished, not yet notified
    handle.add_done_callback(lambda h: ran.append(f"at once {h.get(0).offset}"))
    assert ran == ["at once 7"]
    done.notify()
    assert ran == ["at once 7"]


def test_an_exception_in_a_done_callback_is_logged_on_either_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    acc = make()
    handle = add(acc, b"v")
    after: list[int] = []

    def boom(_h: object) -> None:
        raise RuntimeError("boom")

    handle.add_done_callback(boom)
    handle.add_done_callback(lambda h: after.append(h.get(0).offset))
    (batch,) = drain_one_each(acc, 0, 1)
    for b in acc.on_response(batch, E.NONE, 3, 1):
        b.notify()  # the raising callback does not stop the next one
    handle.add_done_callback(boom)  # finished: run here, and still not raised
    assert after == [3]
    assert [r.getMessage() for r in caplog.records] == ["done callback raised"] * 2


def test_wakeup_fires_once_when_a_batch_becomes_ready_before_the_planned_wake() -> None:
    wakes = []
    acc = make(linger_ms=5, wakeup=lambda: wakes.append(1))
    assert acc.next_deadline(0) == float("inf")  # sender sleeps with nothing to do
    add(acc, b"x", now=0)
    add(acc, b"y", now=1)
    assert len(wakes) == 1
    acc.drain(0, 5)
    assert acc.next_deadline(2) == 5
    fill_batches(acc, 1, partition=1)  # ready now, earlier than 5: wake
    assert len(wakes) == 2


def test_flush_makes_lingering_batches_ready() -> None:
    acc = make(linger_ms=60_000)
    add(acc, b"x")
    assert acc.drain(0, 5) == []
    waiting = acc.begin_flush()
    assert len(waiting) == 1
    assert len(acc.drain(0, 5)) == 1
    acc.end_flush()


# --------------------------------------------------------------------------- retries


def test_retry_keeps_sequence_epoch_and_bytes() -> None:
    acc = make()
    fill_batches(acc, 1)
    (batch,) = drain_one_each(acc, 0, 1)
    wire = batch.wire(acc.producer_id, acc.producer_epoch, acc.compression)
    assert acc.on_connection_lost([batch], 10, "dropped") == []
    assert batch.unresolved
    assert acc.drain(50, 5) == []  # backoff: 100 ms
    assert acc.next_deadline(50) == 110
    (again,) = drain_one_each(acc, 110, 1)
    assert again is batch
    assert batch.wire(acc.producer_id, acc.producer_epoch, acc.compression) == wire


def test_backoff_grows_exponentially_up_to_the_max() -> None:
    acc = make(retry_backoff_ms=100, retry_backoff_max_ms=350)
    fill_batches(acc, 1)
    now = 0.0
    delays = []
    for _ in range(4):
        (batch,) = drain_one_each(acc, now, 1)
        acc.on_response(batch, E.KAFKA_STORAGE_ERROR, -1, now)
        delays.append(acc.next_deadline(now) - now)
        now = acc.next_deadline(now)
    assert delays == [100, 200, 350, 350]


def test_a_failure_in_the_middle_retries_everything_after_it_in_sequence_order() -> None:
    acc = make()
    fill_batches(acc, 5)
    sent = drain_one_each(acc, 0, 5)
    assert sequences(sent) == [0, 2, 4, 6, 8]
    assert acc.on_response(sent[0], E.NONE, 0, 1) == [sent[0]]
    acc.on_response(sent[1], E.KAFKA_STORAGE_ERROR, -1, 1)
    # The partition is broken: nothing goes out while later batches are still in flight.
    fill_batches(acc, 1)
    assert acc.drain(500, 5) == []
    for b in sent[2:]:
        assert acc.on_response(b, E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, 2) == []
    assert acc.producer_id_request() is None  # cascade, not a lost state: no epoch bump
    resent = drain_one_each(acc, 101, 5)
    assert resent == [*sent[1:], resent[-1]]
    assert sequences(resent) == [2, 4, 6, 8, 10]


def test_duplicate_answers_count_as_success() -> None:
    acc = make()
    fill_batches(acc, 2)
    first, second = drain_one_each(acc, 0, 2)
    assert acc.on_response(first, E.DUPLICATE_SEQUENCE_NUMBER, -1, 1) == [first]
    assert first.error is None and first.base_offset == -1
    assert acc.on_response(second, E.NONE, 17, 1) == [second]
    assert second.base_offset == 17


def test_retries_exhausted_fail_the_batch() -> None:
    acc = make(retries=1)
    fill_batches(acc, 1)
    (batch,) = drain_one_each(acc, 0, 1)
    acc.on_response(batch, E.REQUEST_TIMED_OUT, -1, 0)
    (batch,) = drain_one_each(acc, 200, 1)
    (done,) = acc.on_response(batch, E.REQUEST_TIMED_OUT, -1, 200)
    assert isinstance(done.error, MinibrokerError) and done.error.code == E.REQUEST_TIMED_OUT


def test_non_retriable_error_fails_only_that_batch_and_resequences_the_rest() -> None:
    acc = make()
    fill_batches(acc, 3)
    sent = drain_one_each(acc, 0, 3)
    (failed,) = acc.on_response(sent[0], E.MESSAGE_TOO_LARGE, -1, 1)
    assert failed.error is not None and failed.error.code == E.MESSAGE_TOO_LARGE
    for b in sent[1:]:
        assert acc.on_response(b, E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, 1) == []
    assert acc.producer_id_request() == (7, 0)
    acc.set_producer_id(7, 1)
    assert sequences(drain_one_each(acc, 1, 5)) == [0, 2]


# --------------------------------------------------------------------------- KIP-360


def test_out_of_order_on_the_first_in_flight_batch_bumps_the_epoch() -> None:
    acc = make()
    fill_batches(acc, 4)
    sent = drain_one_each(acc, 0, 4)
    acc.on_response(sent[0], E.NONE, 0, 1)
    acc.on_response(sent[1], E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, 1)
    assert acc.producer_id_request() is None  # two batches still in flight
    acc.on_response(sent[2], E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, 1)
    acc.on_response(sent[3], E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, 1)
    fill_batches(acc, 1)
    assert acc.drain(1, 5) == []  # nothing goes out before the bump
    assert acc.producer_id_request() == (7, 0)
    acc.set_producer_id(7, 1)
    resent = drain_one_each(acc, 1, 5)
    assert resent[:3] == sent[1:]
    assert sequences(resent) == [0, 2, 4, 6]
    header = read_header(resent[0].wire(acc.producer_id, acc.producer_epoch, acc.compression))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 0)
    assert acc.metrics["epoch_bumps"] == 1


def test_bump_waits_until_unknown_outcomes_are_resolved_with_the_old_epoch() -> None:
    acc = make()
    fill_batches(acc, 1, partition=0)
    fill_batches(acc, 1, partition=1)
    (request,) = acc.drain(0, 1)
    p0, p1 = sorted(request, key=lambda b: b.partition)
    acc.on_response(p0, E.UNKNOWN_PRODUCER_ID, -1, 1)
    acc.on_connection_lost([p1], 1, "dropped")  # p1 may or may not be appended
    fill_batches(acc, 1, partition=1)
    assert acc.producer_id_request() is None
    # Only the unresolved batch goes out, with its old epoch and sequence.
    (retry,) = drain_one_each(acc, 200, 5)
    header = read_header(retry.wire(acc.producer_id, acc.producer_epoch, acc.compression))
    assert retry is p1 and (header.producer_epoch, header.base_sequence) == (0, 0)
    acc.on_response(p1, E.NONE, 0, 201)  # it had been appended: resolved, no duplicate
    assert acc.producer_id_request() == (7, 0)
    acc.set_producer_id(7, 1)
    resent = {b.partition: b for r in acc.drain(201, 5) for b in r}
    assert resent[0] is p0 and p0.sequence == 0
    assert resent[1].sequence == 0 and resent[1] is not p1


def test_unknown_producer_id_while_pid_is_lost_asks_for_a_new_id() -> None:
    acc = make()
    acc.reset_producer_id()
    assert acc.producer_id_request() == (-1, -1)
    assert acc.drain(0, 5) == []


def test_fencing_is_fatal_for_everything() -> None:
    acc = make()
    fill_batches(acc, 2)
    (first,) = drain_one_each(acc, 0, 1)
    add(acc, b"queued")
    done = acc.on_response(first, E.PRODUCER_FENCED, -1, 1)
    assert len(done) == 3 and all(isinstance(b.error, ProducerFencedError) for b in done)
    with pytest.raises(ProducerFencedError):
        add(acc, b"more")
    assert acc.producer_id_request() is None


def test_delivery_timeout_expires_queued_batches_and_bumps_if_sequenced() -> None:
    acc = make(delivery_timeout_ms=1_000)
    fill_batches(acc, 1)
    (batch,) = drain_one_each(acc, 0, 1)
    acc.on_connection_lost([batch], 10, "dropped")
    assert acc.next_deadline(10) == 110
    assert acc.expire(999) == []
    (expired,) = acc.expire(1_000)
    assert isinstance(expired.error, DeliveryTimeoutError)
    assert acc.producer_id_request() == (7, 0)


# --------------------------------------------------------------------------- model broker


@dataclass
class _ProducerEntry:
    epoch: int
    cached: deque = field(default_factory=lambda: deque(maxlen=5))  # (first, last, base_offset)


class ModelBroker:
    """The idempotence rules of docs/protocol.md section 3, in memory."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], list[bytes]] = defaultdict(list)
        self.epochs: dict[int, int] = {}
        self.state: dict[tuple[str, int, int], _ProducerEntry] = {}
        self.next_pid = 100
        self.message_max_bytes: int | None = None  # larger batches: MESSAGE_TOO_LARGE

    def init_producer_id(self, pid: int, epoch: int) -> tuple[int, int]:
        if pid < 0:
            pid, self.next_pid = self.next_pid, self.next_pid + 1
            self.epochs[pid] = 0
            return pid, 0
        assert self.epochs[pid] == epoch
        self.epochs[pid] = epoch + 1
        return pid, epoch + 1

    def produce(self, topic: str, partition: int, wire: bytes) -> tuple[int, int]:
        header = validate(wire)
        if self.message_max_bytes is not None and len(wire) > self.message_max_bytes:
            return E.MESSAGE_TOO_LARGE, -1
        pid, epoch, first = header.producer_id, header.producer_epoch, header.base_sequence
        last = header.last_sequence
        if pid not in self.epochs:
            return E.UNKNOWN_PRODUCER_ID, -1
        entry = self.state.get((topic, partition, pid))
        if entry is not None and epoch < entry.epoch:
            return E.INVALID_PRODUCER_EPOCH, -1
        if entry is not None and epoch == entry.epoch:
            for c_first, c_last, c_offset in entry.cached:
                if (c_first, c_last) == (first, last):
                    return E.NONE, c_offset
        if entry is None or epoch > entry.epoch:
            if first != 0:
                return (
                    E.UNKNOWN_PRODUCER_ID if entry is None else E.OUT_OF_ORDER_SEQUENCE_NUMBER
                ), -1
            entry = self.state[(topic, partition, pid)] = _ProducerEntry(epoch)
        elif first != (entry.cached[-1][1] + 1) % SEQUENCE_MODULUS:
            oldest = entry.cached[0][0]
            if 0 < (oldest - last) % SEQUENCE_MODULUS < SEQUENCE_MODULUS // 2:
                return E.DUPLICATE_SEQUENCE_NUMBER, -1
            return E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        log = self.logs[(topic, partition)]
        base_offset = len(log)
        log += [r[2] for r in decode_records(wire, 0, header)]
        entry.cached.append((first, last, base_offset))
        return E.NONE, base_offset


def simulate(seed: int, *, records: int = 400, partitions: int = 3) -> None:
    """Send `records` through the accumulator over a faulty pipelined link to ModelBroker.

    Faults: requests lost before the broker sees them, responses lost after it
    appended, retriable storage errors, and batches the broker rejects with
    UNKNOWN_PRODUCER_ID or OUT_OF_ORDER_SEQUENCE_NUMBER (without appending). Those
    rejections only hit a batch's first attempt under its epoch: a real broker
    answers a retry of an appended batch as a duplicate, never as a rejection."""
    rng = random.Random(seed)
    broker = ModelBroker()
    clock = Clock()
    batch_size = rng.choice([60, 200, 1_000])
    max_request_size = rng.choice([2, 4, 100]) * batch_size
    acc = RecordAccumulator(
        clock=clock,
        batch_size=batch_size,
        max_request_size=max_request_size,
        adaptive_batching=rng.random() < 0.75,
        linger_ms=rng.choice([0, 3]),
        retry_backoff_ms=5,
        retry_backoff_max_ms=40,
        buffer_memory=1_000_000,
    )
    # A broker that takes less than max_request_size: grown batches are split.
    # (At least 100 bytes: every record here fits in a batch of its own of that size.)
    smallest = max(batch_size, 100)
    broker.message_max_bytes = rng.choice([None, smallest, 2 * smallest])
    link: deque[tuple[list[ProducerBatch], list[tuple[int, int]] | None]] = deque()
    sent: dict[int, list[bytes]] = defaultdict(list)
    attempted: set[tuple[int, int, int | None]] = set()
    now = 0.0
    next_record = 0
    steps = 0
    while next_record < records or acc.unfinished:
        steps += 1
        assert steps < 200_000, "no progress"
        now += rng.choice([0, 0, 1, 5])
        roll = rng.random()
        if next_record < records and roll < 0.45:
            partition = rng.randrange(partitions)
            value = b"%d:%d" % (partition, len(sent[partition]))
            sent[partition].append(value)
            clock.now = now
            acc.append("t", partition, int(now), None, value, None, None)
            next_record += 1
        elif roll < 0.65:
            request = acc.producer_id_request()
            if request is not None and not link:
                acc.set_producer_id(*broker.init_producer_id(*request))
                continue
            for batches in acc.drain(now, 5 - len(link)):
                link.append((batches, None))
        elif link and roll < 0.95:
            batches, _ = link.popleft()
            fault = rng.random()
            if fault < 0.03:  # request lost: the broker never saw it
                lost = [batches] + [b for b, _ in link]
                link.clear()
                for lost_batches in lost:
                    acc.on_connection_lost(lost_batches, now, "request lost")
                continue
            results = []
            for b in batches:
                wire = b.wire(acc.producer_id, acc.producer_epoch, acc.compression)
                assert len(wire) <= max_request_size
                first_attempt = (b.partition, acc.producer_epoch, b.sequence) not in attempted
                attempted.add((b.partition, acc.producer_epoch, b.sequence))
                kind = rng.random()
                if kind < 0.03:
                    results.append((E.KAFKA_STORAGE_ERROR, -1))
                elif kind < 0.05 and first_attempt:
                    results.append((E.UNKNOWN_PRODUCER_ID, -1))
                elif kind < 0.07 and first_attempt:
                    results.append((E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1))
                else:
                    results.append(broker.produce(b.topic, b.partition, wire))
            if fault < 0.08:  # appended, but the response is lost with the connection
                lost = [batches] + [b for b, _ in link]
                link.clear()
                for lost_batches in lost:
                    acc.on_connection_lost(lost_batches, now, "response lost")
                continue
            for b, (error, offset) in zip(batches, results, strict=True):
                acc.on_response(b, error, offset, now)
        else:
            acc.expire(now)
    for partition, values in sent.items():
        assert broker.logs[("t", partition)] == values, f"seed {seed} partition {partition}"


@pytest.mark.parametrize("seed", range(60))
def test_random_faults_deliver_every_record_exactly_once_in_order(seed: int) -> None:
    simulate(seed)


def test_model_broker_follows_the_contract() -> None:
    broker = ModelBroker()
    pid, epoch = broker.init_producer_id(-1, -1)
    acc = make()
    acc.set_producer_id(pid, epoch)
    fill_batches(acc, 2)
    first, second = drain_one_each(acc, 0, 2)
    wire1 = first.wire(pid, epoch, 0)
    wire2 = second.wire(pid, epoch, 0)
    assert broker.produce("t", 0, wire2) == (E.UNKNOWN_PRODUCER_ID, -1)
    assert broker.produce("t", 0, wire1) == (E.NONE, 0)
    assert broker.produce("t", 0, wire1) == (E.NONE, 0)  # duplicate
    assert broker.produce("t", 0, wire2) == (E.NONE, 2)
    assert msgpack.unpackb(msgpack.packb(broker.logs[("t", 0)])) == broker.logs[("t", 0)]


def test_the_producer_passes_adaptive_batching_and_its_in_flight_limit_on() -> None:
    from client import AsyncProducer

    default = AsyncProducer()._acc
    assert (default.adaptive_batching, default.max_in_flight) == (True, 5)
    capped = AsyncProducer(adaptive_batching=False, max_in_flight_requests_per_connection=3)._acc
    assert (capped.adaptive_batching, capped.max_in_flight) == (False, 3)


def test_an_answer_needs_the_sender_only_when_it_has_something_to_do() -> None:
    """`sender_needed` after an answer: not while the sender sleeps on a deadline appends
    know of with nothing queued; yes with a batch queued, a retry, the in-flight limit
    reached (appends then do not wake it), an epoch bump, or a close."""
    acc = make()
    fill_batches(acc, 1)
    (batch,) = drain_one_each(acc, 0, 1)
    acc.next_deadline(0)  # the sender goes to sleep
    acc.on_response(batch, E.NONE, 0, 1)
    assert not acc.sender_needed()

    fill_batches(acc, 2)
    [[first]] = acc.drain(1, 1)  # one request, one batch: the other stays queued
    acc.next_deadline(1)
    acc.on_response(first, E.NONE, 2, 2)
    assert acc.sender_needed()
    (second,) = drain_one_each(acc, 2, 1)
    acc.next_deadline(2)
    acc.on_response(second, E.KAFKA_STORAGE_ERROR, -1, 3)  # retried: queued again
    assert acc.sender_needed()
    (second,) = drain_one_each(acc, 200, 1)
    acc.next_deadline(200, can_send=False)  # the limit reached: appends wake nobody
    acc.on_response(second, E.NONE, 4, 201)
    assert acc.sender_needed()

    fill_batches(acc, 1)
    (third,) = drain_one_each(acc, 202, 1)
    acc.next_deadline(202)
    acc.on_response(third, E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, 203)  # KIP-360: a bump
    assert acc.sender_needed()

    closing = make()
    fill_batches(closing, 1)
    (batch,) = drain_one_each(closing, 0, 1)
    closing.next_deadline(0)
    closing.close()
    closing.on_response(batch, E.NONE, 0, 1)
    assert closing.sender_needed()
