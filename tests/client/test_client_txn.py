"""Sans-IO tests of the transactional producer's state machine (client/transaction_manager.py
and the accumulator it steers).

Kafka's rules, checked without a broker or a sleep: sends only inside a begun
transaction, batches stamped transactional, fatal (fenced) versus abortable
errors, no commit of a transaction that lost a batch, the next epoch from
EndTxn with sequences from 0, prepare and its handle. The answers the producer
would get from the broker are fed in as error codes.
"""

from __future__ import annotations

import json
import math
import pickle
import random
from typing import Any

import pytest

from client.accumulator import ProducerBatch, RecordAccumulator
from client.errors import (
    TXN_FATAL_CODES,
    DeliveryTimeoutError,
    IllegalStateError,
    MinibrokerError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    error_for,
)
from client.transaction_manager import TransactionManager, TxnState
from client.types import TxnHandle
from protocol.batch import read_header
from protocol.errors import ErrorCode

E = ErrorCode
PID = 7


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TxnAccumulator:
    """An accumulator and its transaction manager, as the producer holds them: the tests
    call either's methods and read either's attributes on this one object."""

    def __init__(self, **settings: Any) -> None:
        self.accumulator = RecordAccumulator(**settings)
        self.transactions = TransactionManager(self.accumulator)

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self.transactions, name)
        except AttributeError:
            return getattr(self.accumulator, name)


def make(**overrides: object) -> TxnAccumulator:
    """A transactional accumulator after init_transactions() (pid 7, epoch 0)."""
    settings: dict[str, object] = {
        "clock": Clock(),
        "batch_size": 1000,
        "transactional": True,
        "retries": 3,
        "retry_backoff_ms": 100,
        "delivery_timeout_ms": 120_000,
    }
    settings.update(overrides)
    acc = TxnAccumulator(**settings)
    acc.begin_init()
    acc.on_init(E.NONE, PID, 0, None)
    return acc


def add(acc: TxnAccumulator, value: bytes = b"v", partition: int = 0):
    return acc.append("t", partition, 1_000, None, value, None, None)


def drain(acc: TxnAccumulator, now: float = 0) -> list[ProducerBatch]:
    return [batch for request in acc.drain(now, 5) for batch in request]


def succeed(acc: TxnAccumulator, batches: list[ProducerBatch]) -> None:
    for batch in batches:
        acc.on_response(batch, E.NONE, 0, 1)


def commit(acc: TxnAccumulator, next_epoch: int) -> None:
    """A whole successful commit: flush, check, EndTxn answered with `next_epoch`."""
    succeed(acc, drain(acc))
    acc.begin_commit()
    succeed(acc, drain(acc))
    acc.check_flushed()
    acc.on_end(True, E.NONE, PID, next_epoch, None)


# --------------------------------------------------------------------------- states


def test_sends_need_init_then_a_begun_transaction() -> None:
    acc = TxnAccumulator(transactional=True)
    assert acc.txn_state is TxnState.UNINITIALIZED
    assert acc.producer_id_request() is None  # no InitProducerId before init_transactions()
    with pytest.raises(IllegalStateError, match="init_transactions"):
        add(acc)
    acc.begin_init()
    acc.on_init(E.NONE, PID, 3, None)
    assert (acc.txn_state, acc.producer_id, acc.producer_epoch) == (TxnState.READY, PID, 3)
    with pytest.raises(IllegalStateError, match="begin_transaction"):
        add(acc)
    acc.begin_transaction()
    add(acc)
    with pytest.raises(IllegalStateError):
        acc.begin_transaction()


def test_transactional_calls_on_a_plain_producer_are_illegal() -> None:
    acc = TxnAccumulator()
    for call in (acc.begin_init, acc.begin_transaction, acc.begin_commit, acc.begin_abort):
        with pytest.raises(IllegalStateError, match="transactional_id"):
            call()


def test_commit_or_abort_without_a_transaction_is_illegal() -> None:
    acc = make()
    with pytest.raises(IllegalStateError):
        acc.begin_commit()
    with pytest.raises(IllegalStateError):
        acc.begin_abort()
    with pytest.raises(IllegalStateError):
        acc.begin_prepare()


def test_batches_are_transactional_and_stamped_with_the_transactions_epoch() -> None:
    acc = make()
    acc.begin_transaction()
    add(acc)
    (batch,) = drain(acc)
    header = read_header(batch.wire(acc.producer_id, acc.producer_epoch, 0, acc.transactional))
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID, 0, 0)


def test_commit_waits_for_every_batch_then_adopts_the_next_epoch_and_sequences_restart() -> None:
    acc = make(linger_ms=60_000)
    acc.begin_transaction()
    add(acc, partition=0)
    add(acc, partition=1)
    assert drain(acc) == []  # lingering
    waiting = acc.begin_commit()
    assert len(waiting) == 2
    with pytest.raises(IllegalStateError, match="committing"):
        add(acc)
    batches = drain(acc)  # commit makes them sendable at once
    assert len(batches) == 2
    with pytest.raises(IllegalStateError, match="unfinished"):
        acc.check_flushed()
    succeed(acc, batches)
    acc.check_flushed()
    acc.on_end(True, E.NONE, PID, 1, None)
    assert (acc.txn_state, acc.producer_epoch) == (TxnState.READY, 1)
    assert acc.metrics["transactions_committed"] == 1

    acc.begin_transaction()
    add(acc, partition=0)
    add(acc, partition=1)
    acc.begin_commit()
    assert sorted((b.partition, b.sequence) for b in drain(acc)) == [(0, 0), (1, 0)]


def test_an_empty_transaction_commits() -> None:
    acc = make()
    acc.begin_transaction()
    assert acc.begin_commit() == []
    acc.check_flushed()
    acc.on_end(True, E.NONE, PID, 1, None)
    assert acc.txn_state is TxnState.READY


def test_a_new_producer_id_from_endtxn_is_adopted() -> None:
    acc = make()
    acc.begin_transaction()
    add(acc)
    commit(acc, next_epoch=1)
    acc.begin_transaction()
    add(acc)
    commit(acc, next_epoch=2)
    acc.begin_transaction()
    acc.begin_commit()
    # Past epoch 32767 the broker answers with a new producer id at epoch 0.
    acc.on_end(True, E.NONE, PID + 1, 0, None)
    assert (acc.producer_id, acc.producer_epoch) == (PID + 1, 0)
    acc.begin_transaction()
    add(acc)
    (batch,) = drain(acc)
    header = read_header(batch.wire(acc.producer_id, acc.producer_epoch, 0, True))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID + 1, 0, 0)


# --------------------------------------------------------------------------- abortable


@pytest.mark.parametrize(
    "error",
    [E.INVALID_TXN_STATE, E.OUT_OF_ORDER_SEQUENCE_NUMBER, E.UNKNOWN_PRODUCER_ID, E.INVALID_RECORD],
)
def test_a_failed_batch_makes_the_transaction_abortable(error: ErrorCode) -> None:
    acc = make()
    acc.begin_transaction()
    failing = add(acc, partition=0)
    (first,) = drain(acc)
    queued = add(acc, partition=1)
    done = acc.on_response(first, error, -1, 1)
    assert acc.txn_state is TxnState.ABORTABLE_ERROR
    # The queued batch of the doomed transaction fails at once, not after a send.
    assert {b.partition for b in done} == {0, 1}
    assert failing.exception() is not None
    assert isinstance(queued.exception(), TransactionAbortedError)
    # No KIP-360 epoch bump inside a transaction: InitProducerId would abort it.
    assert acc.producer_id_request() is None
    with pytest.raises(TransactionAbortableError):
        add(acc)
    with pytest.raises(TransactionAbortableError):
        acc.begin_commit()
    with pytest.raises(TransactionAbortableError):
        acc.begin_prepare()
    with pytest.raises(TransactionAbortableError):
        acc.begin_transaction()
    in_flight, dropped = acc.begin_abort()
    assert in_flight == dropped == []
    acc.on_end(False, E.NONE, PID, 1, None)
    assert acc.txn_state is TxnState.READY
    assert acc.metrics["transactions_aborted"] == 1
    acc.begin_transaction()
    add(acc)


def test_a_batch_failing_during_commit_stops_the_commit() -> None:
    acc = make()
    acc.begin_transaction()
    add(acc, partition=0)
    add(acc, partition=1)
    acc.begin_commit()
    first, second = drain(acc)
    acc.on_response(first, E.NONE, 0, 1)
    acc.on_response(second, E.INVALID_TXN_STATE, -1, 1)
    with pytest.raises(TransactionAbortableError, match="INVALID_TXN_STATE"):
        acc.check_flushed()
    assert acc.txn_state is TxnState.ABORTABLE_ERROR


def test_retriable_errors_are_retried_inside_the_transaction() -> None:
    acc = make()
    acc.begin_transaction()
    add(acc)
    (batch,) = drain(acc)
    acc.on_response(batch, E.REQUEST_TIMED_OUT, -1, 1)
    acc.on_connection_lost(drain(acc, 1_000), 1_000, "dropped")
    assert acc.txn_state is TxnState.IN_TRANSACTION
    (again,) = drain(acc, 5_000)
    assert again is batch and batch.sequence == 0 and batch.attempts == 3
    acc.on_response(batch, E.NONE, 0, 5_001)
    acc.begin_commit()
    acc.check_flushed()


def test_a_batch_out_of_retries_makes_the_transaction_abortable() -> None:
    acc = make(retries=1)
    acc.begin_transaction()
    add(acc)
    for now in (0, 1_000):
        (batch,) = drain(acc, now)
        acc.on_response(batch, E.REQUEST_TIMED_OUT, -1, now + 1)
    assert acc.txn_state is TxnState.ABORTABLE_ERROR


def test_a_delivery_timeout_makes_the_transaction_abortable() -> None:
    acc = make(delivery_timeout_ms=1_000)
    acc.begin_transaction()
    handle = add(acc)
    done = acc.expire(1_000)
    assert done and isinstance(handle.exception(), DeliveryTimeoutError)
    assert acc.txn_state is TxnState.ABORTABLE_ERROR


def test_a_failed_endtxn_commit_leaves_only_an_abort() -> None:
    acc = make()
    acc.begin_transaction()
    acc.begin_commit()
    with pytest.raises(TransactionAbortableError, match="INVALID_TXN_STATE"):
        acc.on_end(True, E.INVALID_TXN_STATE, -1, -1, "aborted by its timeout")
    acc.begin_abort()
    acc.on_end(False, E.NONE, PID, 1, None)
    assert acc.txn_state is TxnState.READY


def test_a_failed_endtxn_abort_needs_init_transactions() -> None:
    acc = make()
    acc.begin_transaction()
    acc.begin_abort()
    with pytest.raises(MinibrokerError, match="INVALID_TXN_STATE"):
        acc.on_end(False, E.INVALID_TXN_STATE, -1, -1, None)
    assert acc.txn_state is TxnState.UNINITIALIZED
    with pytest.raises(IllegalStateError):
        acc.begin_transaction()
    acc.begin_init()


def test_a_commit_or_abort_that_timed_out_can_be_retried_but_not_switched() -> None:
    acc = make()
    acc.begin_transaction()
    acc.begin_commit()
    # (the EndTxn(commit) timed out: outcome unknown)
    with pytest.raises(IllegalStateError):
        acc.begin_abort()
    acc.begin_commit()
    acc.on_end(True, E.NONE, PID, 1, None)
    acc.begin_transaction()
    acc.begin_abort()
    with pytest.raises(IllegalStateError):
        acc.begin_commit()
    acc.begin_abort()


# --------------------------------------------------------------------------- abort


def test_abort_drops_queued_batches_and_waits_only_for_those_in_flight() -> None:
    acc = make()
    acc.begin_transaction()
    add(acc, partition=0)
    (in_flight,) = drain(acc)
    queued = add(acc, partition=1)
    waiting, dropped = acc.begin_abort()
    assert waiting == [in_flight]
    assert [b.partition for b in dropped] == [1]
    assert isinstance(queued.exception(), TransactionAbortedError)
    with pytest.raises(IllegalStateError, match="aborting"):
        add(acc)
    # An in-flight batch whose connection drops is not resent into an aborting transaction.
    done = acc.on_connection_lost([in_flight], 1, "dropped")
    assert done == [in_flight] and isinstance(in_flight.error, TransactionAbortedError)
    assert drain(acc, 10_000) == []
    acc.on_end(False, E.NONE, PID, 1, None)
    assert acc.txn_state is TxnState.READY and acc.unfinished == 0


# --------------------------------------------------------------------------- fatal


@pytest.mark.parametrize("error", sorted(TXN_FATAL_CODES))
def test_fencing_on_produce_is_fatal_for_every_later_call(error: ErrorCode) -> None:
    acc = make()
    acc.begin_transaction()
    add(acc, partition=0)
    (batch,) = drain(acc)
    queued = add(acc, partition=1)
    acc.on_response(batch, error, -1, 1)
    assert acc.txn_state is TxnState.FATAL_ERROR
    assert isinstance(batch.error, ProducerFencedError)
    assert isinstance(queued.exception(), ProducerFencedError)
    for call in (
        lambda: add(acc),
        acc.begin_transaction,
        acc.begin_commit,
        acc.begin_abort,
        acc.begin_prepare,
        acc.begin_init,
        acc.check_flushed,
    ):
        with pytest.raises(ProducerFencedError):
            call()


@pytest.mark.parametrize("error", sorted(TXN_FATAL_CODES))
def test_fencing_on_endtxn_prepare_or_init_is_fatal(error: ErrorCode) -> None:
    acc = make()
    acc.begin_transaction()
    acc.begin_commit()
    with pytest.raises(ProducerFencedError):
        acc.on_end(True, error, -1, -1, None)
    assert acc.txn_state is TxnState.FATAL_ERROR

    acc = make()
    acc.begin_transaction()
    acc.begin_prepare()
    with pytest.raises(ProducerFencedError):
        acc.on_prepare(error, None)

    acc = TxnAccumulator(transactional=True)
    acc.begin_init()
    with pytest.raises(ProducerFencedError):
        acc.on_init(error, -1, -1, None)
    with pytest.raises(ProducerFencedError):
        acc.begin_init()


def test_an_invalid_transaction_timeout_is_reported_and_init_can_be_retried() -> None:
    acc = TxnAccumulator(transactional=True)
    acc.begin_init()
    with pytest.raises(MinibrokerError, match="INVALID_TRANSACTION_TIMEOUT"):
        acc.on_init(E.INVALID_TRANSACTION_TIMEOUT, -1, -1, None)
    assert acc.txn_state is TxnState.UNINITIALIZED
    acc.begin_init()


def test_txn_fatal_codes_raise_producer_fenced_error() -> None:
    for code in TXN_FATAL_CODES:
        assert isinstance(error_for(code, "EndTxn"), ProducerFencedError)
    assert not isinstance(error_for(E.INVALID_TXN_STATE, "EndTxn"), ProducerFencedError)


# --------------------------------------------------------------------------- prepare


def test_prepare_flushes_then_refuses_sends_and_init_starts_afresh() -> None:
    acc = make()
    acc.begin_transaction()
    add(acc)
    waiting = acc.begin_prepare()
    assert len(waiting) == 1
    succeed(acc, drain(acc))
    acc.check_flushed()
    assert acc.on_prepare(E.NONE, None) == (PID, 0)
    assert acc.txn_state is TxnState.PREPARED and not acc.transaction_open
    with pytest.raises(IllegalStateError, match="prepared"):
        add(acc)
    with pytest.raises(IllegalStateError):
        acc.begin_transaction()
    acc.begin_init()
    acc.on_init(E.NONE, PID, 2, None)
    acc.begin_transaction()
    add(acc)


def test_the_writer_may_still_end_its_prepared_transaction() -> None:
    acc = make()
    acc.begin_transaction()
    acc.begin_prepare()
    acc.on_prepare(E.NONE, None)
    acc.begin_commit()
    acc.on_end(True, E.NONE, PID, 1, None)
    assert acc.txn_state is TxnState.READY


def test_a_failed_prepare_leaves_only_an_abort() -> None:
    acc = make()
    acc.begin_transaction()
    acc.begin_prepare()
    with pytest.raises(TransactionAbortableError, match="INVALID_TRANSACTION_TIMEOUT"):
        acc.on_prepare(E.INVALID_TRANSACTION_TIMEOUT, None)
    acc.begin_abort()


def test_txn_handle_pickles_and_round_trips_through_json() -> None:
    handle = TxnHandle("sink-3", 12, 4)
    assert pickle.loads(pickle.dumps(handle)) == handle
    assert TxnHandle.from_dict(json.loads(json.dumps(handle.to_dict()))) == handle
    assert handle.to_dict() == {
        "transactional_id": "sink-3",
        "producer_id": 12,
        "producer_epoch": 4,
    }


# --------------------------------------------------------------------------- no silent loss


@pytest.mark.parametrize("seed", range(20))
def test_no_transaction_with_a_failed_record_is_ever_committed(seed: int) -> None:
    """Random answers (success, retriable, lost, fatal-free failures): whenever the producer
    gets as far as EndTxn(commit), every record of that transaction was acknowledged."""
    rng = random.Random(seed)
    acc = make(retries=2, delivery_timeout_ms=50_000)
    answers = [E.NONE] * 6 + [E.REQUEST_TIMED_OUT, E.INVALID_TXN_STATE, None]
    epoch, now, commits = 0, 0.0, 0
    for _ in range(30):
        acc.begin_transaction()
        handles = [add(acc, b"x", rng.randrange(3)) for _ in range(rng.randrange(1, 6))]
        acc.begin_commit()
        while acc.unfinished:
            now += 1_000
            for batch in drain(acc, now):
                answer = rng.choice(answers)
                if answer is None:
                    acc.on_connection_lost([batch], now, "dropped")
                else:
                    acc.on_response(batch, answer, 0, now)
        epoch += 1
        try:
            acc.check_flushed()
        except TransactionAbortableError:
            assert any(h.exception() is not None for h in handles)
            acc.begin_abort()
            acc.on_end(False, E.NONE, PID, epoch, None)
            continue
        assert all(h.done() and h.exception() is None for h in handles)
        acc.on_end(True, E.NONE, PID, epoch, None)
        commits += 1
    assert acc.txn_state is TxnState.READY
    assert commits


def test_commit_sequences_name_each_partitions_last_sequence_once_all_is_sent() -> None:
    """EndTxn behind the last Produce names what was sent: nothing before the commit,
    nothing while a batch waits to be sent, then each partition's last sequence."""
    acc = make()
    acc.begin_transaction()
    for _ in range(3):
        add(acc, partition=0)
    add(acc, partition=1)
    first = drain(acc)  # the three records of partition 0 and the one of partition 1
    assert acc.commit_sequences() is None  # not committing yet
    add(acc, b"w" * 600, partition=0)
    add(acc, b"w" * 600, partition=0)  # a second and a third batch there
    acc.begin_commit()
    assert not acc.all_sent() and acc.commit_sequences() is None
    rest = drain(acc)
    assert acc.all_sent()
    assert [b.sequence for b in rest] == [3, 4]
    assert acc.commit_sequences() == {("t", 0): 4, ("t", 1): 0}
    succeed(acc, first + rest)
    acc.check_flushed()
    acc.on_end(True, E.NONE, PID, 1, None)
    acc.begin_transaction()
    add(acc, partition=1)
    acc.begin_commit()
    drain(acc)
    # The next epoch's sequences: partition 0 had nothing in this transaction.
    assert acc.commit_sequences() == {("t", 1): 0}


def test_commit_sequences_are_none_once_a_batch_failed() -> None:
    acc = make()
    acc.begin_transaction()
    add(acc, partition=0)
    add(acc, partition=1)
    acc.begin_commit()
    batches = drain(acc)
    acc.on_response(batches[0], E.INVALID_RECORD, -1, 1)
    assert acc.all_sent()
    assert acc.commit_sequences() is None
    assert acc.commit_in_doubt is None
    with pytest.raises(TransactionAbortableError):
        acc.check_flushed()


def in_doubt(acc: TxnAccumulator) -> list[ProducerBatch]:
    """A transaction over partitions 0 and 1 whose EndTxn went out behind its batches
    (commit_sequences named them) and is unanswered; returns the two batches."""
    acc.begin_transaction()
    add(acc, partition=0)
    add(acc, partition=1)
    acc.begin_commit()
    batches = drain(acc)
    assert acc.commit_sequences() == {("t", 0): 0, ("t", 1): 0}
    assert acc.commit_in_doubt == {("t", 0): 0, ("t", 1): 0}
    return batches


def test_a_batch_failure_while_the_commit_is_in_doubt_leaves_the_outcome_to_the_broker() -> None:
    """The broker may have committed: a batch refused meanwhile (its resend fenced after
    the commit, say) does not make the transaction abortable, no batch expires, and
    abort_transaction() is refused with the way out. The commit's answer then settles
    the batch whose answer was lost: written, its offset unknown."""
    acc = make(delivery_timeout_ms=1_000)
    first, second = in_doubt(acc)
    acc.on_connection_lost([first, second], 1, "cut")
    (refused,) = [b for b in drain(acc, now=10_000) if b is first]
    acc.on_response(refused, E.INVALID_RECORD, -1, 10_000)
    assert refused.finished and refused.error is not None
    assert acc.expire(1_000_000) == []
    assert acc.txn_state is TxnState.COMMITTING and not second.finished
    with pytest.raises(IllegalStateError, match="commit_transaction\\(\\) again"):
        acc.begin_abort()
    done = acc.on_end(True, E.NONE, PID, 1, None)
    assert done == [second] and second.error is None and second.base_offset == -1
    assert acc.txn_state is TxnState.READY and acc.commit_in_doubt is None
    assert (acc.producer_epoch, acc.unfinished) == (1, 0)


def test_a_commit_in_doubt_sets_no_expiry_deadline_for_the_sender() -> None:
    """The sender sleeps until next_deadline(): while the commit is in doubt a batch's
    delivery deadline, long past, must not wake it (it would spin, starving the event
    loop that runs the commit's own retries); once the commit is known, it counts."""
    acc = make(delivery_timeout_ms=1_000)
    first, second = in_doubt(acc)
    acc.on_connection_lost([first, second], 1, "cut")
    assert acc.next_deadline(1_000_000, can_send=False) == math.inf
    acc.on_commit_landed()
    assert acc.next_deadline(1_000_000, can_send=False) == 1_000_000
    assert {b.base_offset for b in acc.expire(1_000_000)} == {-1}
    assert first.error is None and second.error is None


def test_a_commit_in_doubt_refused_by_the_broker_counts_the_failures_seen_meanwhile() -> None:
    """CONCURRENT_TRANSACTIONS (a batch is missing, nothing changed) ends the doubt: the
    batch that failed meanwhile makes the transaction abortable after all."""
    acc = make()
    first, second = in_doubt(acc)
    acc.on_response(first, E.INVALID_RECORD, -1, 1)
    acc.on_response(second, E.NONE, 5, 1)
    assert acc.failed_in_doubt and acc.txn_state is TxnState.COMMITTING
    assert acc.on_commit_refused() == []
    assert acc.txn_state is TxnState.ABORTABLE_ERROR and acc.commit_in_doubt is None
    with pytest.raises(TransactionAbortableError, match="INVALID_RECORD"):
        acc.check_flushed()
    acc.begin_abort()
    acc.on_end(False, E.NONE, PID, 1, None)
    assert acc.txn_state is TxnState.READY


def test_a_commit_in_doubt_refused_without_a_failure_goes_on_committing() -> None:
    acc = make()
    first, second = in_doubt(acc)
    assert acc.on_commit_refused() == []
    assert acc.txn_state is TxnState.COMMITTING and acc.commit_in_doubt is None
    succeed(acc, [first, second])
    acc.check_flushed()
    assert acc.on_end(True, E.NONE, PID, 1, None) == []
    assert acc.metrics["transactions_committed"] == 1


def test_a_commit_in_doubt_answered_with_a_refusal_is_abortable() -> None:
    """The broker says it did not commit (here: the transaction ended the other way)."""
    acc = make()
    in_doubt(acc)
    with pytest.raises(TransactionAbortableError):
        acc.on_end(True, E.INVALID_TXN_STATE, -1, -1, None)
    assert acc.txn_state is TxnState.ABORTABLE_ERROR and acc.commit_in_doubt is None


def test_a_retried_batch_waits_to_be_sent_before_sequences_are_named() -> None:
    acc = make()
    acc.begin_transaction()
    add(acc, partition=0)
    acc.begin_commit()
    (batch,) = drain(acc)
    acc.on_connection_lost([batch], 1, "cut")
    assert not acc.all_sent() and acc.commit_sequences() is None
    assert drain(acc, now=10_000) == [batch]
    assert acc.commit_sequences() == {("t", 0): 0}  # the same sequence, resent
