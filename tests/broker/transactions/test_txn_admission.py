"""Unit tests of the admission rules (broker/transactions/state.py `admission`): which
request a transactional id's entry accepts in which state, without a broker."""

from __future__ import annotations

import pytest

from broker.transactions.state import (
    MARKERS_PENDING,
    Admitted,
    Ask,
    Refused,
    TxnEntry,
    TxnStateError,
    admission,
    completed,
    decided,
    initialized,
    not_added,
    prepared,
    reinit_refusal,
    repeated_init,
    with_partitions,
)
from protocol.errors import ErrorCode

EMPTY_ENTRY = initialized(None, "tx", 5, 0, 1000, 0, "User:alice")
ONGOING_ENTRY = with_partitions(EMPTY_ENTRY, {("t", 0)}, 1)
PREPARED_ENTRY = prepared(ONGOING_ENTRY, 100, 2)
DECIDED_ENTRY = decided(ONGOING_ENTRY, True, (5, 1), 3)  # committed by the client
ENDED_ENTRY = completed(DECIDED_ENTRY, 4)


def code(verdict: Admitted | Refused) -> Admitted | ErrorCode:
    return verdict.code if isinstance(verdict, Refused) else verdict


@pytest.mark.parametrize(
    ("entry", "ask", "committed", "expected"),
    [
        (ONGOING_ENTRY, Ask.BATCH, None, Admitted.PROCEED),
        (EMPTY_ENTRY, Ask.OFFSETS, None, Admitted.PROCEED),
        (PREPARED_ENTRY, Ask.BATCH, None, ErrorCode.INVALID_TXN_STATE),
        (PREPARED_ENTRY, Ask.OFFSETS, None, ErrorCode.INVALID_TXN_STATE),
        (PREPARED_ENTRY, Ask.PREPARE, None, Admitted.PROCEED),
        (ONGOING_ENTRY, Ask.END, True, Admitted.PROCEED),
        (EMPTY_ENTRY, Ask.END, False, Admitted.PROCEED),
        (PREPARED_ENTRY, Ask.COMMIT_TXNS, True, Admitted.PROCEED),
        (ONGOING_ENTRY, Ask.COMMIT_TXNS, True, ErrorCode.INVALID_TXN_STATE),
        (ONGOING_ENTRY, Ask.COMMIT_TXNS, False, Admitted.PROCEED),
        (EMPTY_ENTRY, Ask.COMMIT_TXNS, False, ErrorCode.INVALID_TXN_STATE),
    ],
)
def test_each_request_is_accepted_in_its_states(
    entry: TxnEntry, ask: Ask, committed: bool | None, expected: object
) -> None:
    verdict = admission(
        entry, "tx", entry.producer_id, entry.producer_epoch, ask, committed=committed
    )
    assert code(verdict) == expected


@pytest.mark.parametrize("ask", [Ask.BATCH, Ask.OFFSETS, Ask.PREPARE, Ask.COMMIT_TXNS])
def test_nothing_but_end_txn_passes_markers_being_written(ask: Ask) -> None:
    verdict = admission(DECIDED_ENTRY, "tx", 5, 1, ask, committed=True)
    assert verdict == MARKERS_PENDING
    assert admission(DECIDED_ENTRY, "tx", 5, 1, Ask.END, committed=True) is Admitted.FINISH_FIRST


@pytest.mark.parametrize("entry", [DECIDED_ENTRY, ENDED_ENTRY])
def test_the_transaction_that_just_ended_is_retried_only_with_the_same_end(
    entry: TxnEntry,
) -> None:
    for ask in (Ask.END, Ask.COMMIT_TXNS):
        assert admission(entry, "tx", 5, 0, ask, committed=True) is Admitted.RETRY
        assert code(admission(entry, "tx", 5, 0, ask, committed=False)) == (
            ErrorCode.INVALID_TXN_STATE
        )
    assert code(admission(entry, "tx", 5, 0, Ask.PREPARE)) == ErrorCode.INVALID_TXN_STATE
    joined = admission(entry, "tx", 5, 0, Ask.BATCH)
    assert isinstance(joined, Refused) and joined.last_ended
    assert joined.code == ErrorCode.INVALID_PRODUCER_EPOCH


def test_a_transaction_the_broker_aborted_fences_its_producer() -> None:
    timed_out = decided(ONGOING_ENTRY, False, (5, 1), 3, by_client=False)
    verdict = admission(timed_out, "tx", 5, 0, Ask.END, committed=True)
    assert code(verdict) == ErrorCode.INVALID_PRODUCER_EPOCH


def test_a_batch_of_an_unknown_or_fenced_producer_gets_produce_codes() -> None:
    assert code(admission(EMPTY_ENTRY, "tx", 6, 0, Ask.BATCH)) == ErrorCode.INVALID_TXN_STATE
    assert code(admission(ENDED_ENTRY, "tx", 5, 5, Ask.BATCH)) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert code(admission(None, "tx", 5, 0, Ask.END, committed=True)) == (
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    )
    assert code(admission(ENDED_ENTRY, "tx", 5, 0, Ask.OFFSETS)) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert code(admission(ONGOING_ENTRY, "tx", 5, 3, Ask.END, committed=True)) == (
        ErrorCode.INVALID_PRODUCER_EPOCH
    )


def test_another_principal_is_refused_where_it_is_checked() -> None:
    assert code(admission(ONGOING_ENTRY, "tx", 5, 0, Ask.OFFSETS, principal="User:bob")) == (
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    )
    assert admission(ONGOING_ENTRY, "tx", 5, 0, Ask.BATCH) is Admitted.PROCEED


# ------------------------------------------------------------------ classic (Kafka's clients)

CLASSIC_EMPTY = initialized(None, "ktx", 7, 3, 1000, 0, classic=True)
CLASSIC_ONGOING = with_partitions(CLASSIC_EMPTY, {("t", 0)}, 1)
# A client's end keeps the classic producer's epoch: the next ids are its own.
CLASSIC_COMMITTED = completed(decided(CLASSIC_ONGOING, True, (7, 3), 2), 3)


def test_a_classic_entry_keeps_its_flag_through_the_log_and_a_native_one_its_old_form() -> None:
    for entry in (CLASSIC_EMPTY, CLASSIC_ONGOING, CLASSIC_COMMITTED):
        assert TxnEntry.decode(entry.encode()) == entry
    assert len(EMPTY_ENTRY.encode()) == 12 and len(CLASSIC_EMPTY.encode()) == 13
    anonymous_native = initialized(None, "tx", 5, 0, 1000, 0)
    assert len(anonymous_native.encode()) == 11  # the records of older brokers
    with pytest.raises(TxnStateError):
        TxnEntry.decode([*CLASSIC_EMPTY.encode()[:12], "yes"])


def test_a_classic_batch_needs_its_partition_added_to_an_open_transaction() -> None:
    assert not_added(CLASSIC_ONGOING, ("t", 0)) is None
    refused = not_added(CLASSIC_ONGOING, ("t", 1))
    assert refused is not None and refused.code == ErrorCode.INVALID_TXN_STATE
    # After the commit the same epoch is current: a late batch finds no transaction.
    late = not_added(CLASSIC_COMMITTED, ("t", 0))
    assert late is not None and late.code == ErrorCode.INVALID_TXN_STATE
    assert not_added(ONGOING_ENTRY, ("t", 1)) is None  # native: the batch adds it


def test_a_classic_end_txn_naming_the_ended_transaction_is_a_retry_or_a_contradiction() -> None:
    again = admission(CLASSIC_COMMITTED, "ktx", 7, 3, Ask.END, committed=True)
    assert again is Admitted.PROCEED
    other = admission(CLASSIC_COMMITTED, "ktx", 7, 3, Ask.END, committed=False)
    assert code(other) == ErrorCode.INVALID_TXN_STATE
    assert admission(CLASSIC_COMMITTED, "ktx", 7, 3, Ask.ADD) is Admitted.PROCEED


def test_a_classic_reinit_may_bump_only_the_current_or_a_timed_out_producer() -> None:
    assert reinit_refusal(CLASSIC_ONGOING, -1, -1) is None
    assert reinit_refusal(None, 7, 3) is None
    assert reinit_refusal(CLASSIC_ONGOING, 7, 3) is None
    fenced = reinit_refusal(CLASSIC_ONGOING, 7, 2)
    assert fenced is not None and fenced.code == ErrorCode.PRODUCER_FENCED
    timed_out = completed(decided(CLASSIC_ONGOING, False, (7, 4), 2, by_client=False), 3)
    assert reinit_refusal(timed_out, 7, 3) is None  # KIP-588: the broker aborted it
    newer = initialized(timed_out, "ktx", 7, 5, 1000, 4, classic=True)
    refused = reinit_refusal(newer, 7, 3)
    assert refused is not None and refused.code == ErrorCode.PRODUCER_FENCED


def test_a_classic_reinit_repeated_after_its_answer_was_lost_gets_the_same_answer() -> None:
    """Kafka's coordinator keeps the epoch a KIP-360 InitProducerId named: the request
    sent again (its answer lost) gets the pid and epoch it was given, unbumped; a new
    instance's init (-1/-1), a timeout's bump or an open transaction since make it a
    new request again, judged by `reinit_refusal`."""
    bumped = initialized(CLASSIC_COMMITTED, "ktx", 7, 4, 1000, 4, classic=True, named=(7, 3))
    assert TxnEntry.decode(bumped.encode()) == bumped
    assert repeated_init(bumped, 7, 3, "User:ANONYMOUS") == (7, 4)
    assert repeated_init(bumped, 7, 4, "User:ANONYMOUS") is None  # the current: a bump
    assert repeated_init(bumped, -1, -1, "User:ANONYMOUS") is None  # a new instance
    assert repeated_init(bumped, 7, 3, "User:mallory") is None
    assert repeated_init(with_partitions(bumped, {("t", 0)}, 5), 7, 3, "User:ANONYMOUS") is None
    timed_out = completed(
        decided(with_partitions(bumped, {("t", 0)}, 5), False, (7, 5), 6, by_client=False), 7
    )
    assert repeated_init(timed_out, 7, 3, "User:ANONYMOUS") is None
    newer = initialized(bumped, "ktx", 7, 5, 1000, 5, classic=True)
    assert newer.reinit is None and repeated_init(newer, 7, 3, "User:ANONYMOUS") is None
    with pytest.raises(TxnStateError):
        TxnEntry.decode([*bumped.encode()[:13], [7, 3, 7]])
