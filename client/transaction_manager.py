"""The transactional producer's state machine, beside the record accumulator it steers.

Modelled on Kafka's TransactionManager (states in `TxnState`), and sans-IO like
the accumulator: the producer calls `begin_*` before each transactional request
and `on_*` with the broker's answer, and gets back the batches to wait for or
the batches finished now. Appends are accepted only in IN_TRANSACTION, and every
batch is stamped transactional. There is no KIP-360 bump inside a transaction
(an InitProducerId would abort it on the broker): a batch that fails for good,
OUT_OF_ORDER_SEQUENCE_NUMBER and UNKNOWN_PRODUCER_ID included, makes the
transaction abortable instead: its queued batches fail at once, later appends
are refused and commit is refused, so no transaction with a lost batch is ever
committed. EndTxn's answer brings the next epoch, adopted with sequences
restarting at 0. INVALID_PRODUCER_ID_MAPPING is fatal too.

The accumulator asks this manager what a transaction decides for its batches
(`client.accumulator.TransactionGate`); this manager works the batches through
the accumulator's methods that say they run under its lock. One lock, the
accumulator's, guards both: a batch's failure and the abortable state it causes
(its queued batches failed, appends refused) are one step for `append`, which
runs on the caller's thread.
"""

from __future__ import annotations

import logging
from enum import Enum

from client.accumulator import ProducerBatch, RecordAccumulator
from client.errors import (
    MEMBER_ERRORS,
    TXN_FATAL_CODES,
    IllegalStateError,
    MinibrokerError,
    TransactionAbortableError,
    TransactionAbortedError,
    TxnOffsetCommitFailedError,
    error_for,
)
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")


class TxnState(Enum):
    """Where a transactional producer is (Kafka's TransactionManager states, plus prepare)."""

    UNINITIALIZED = "uninitialized"  # no usable pid/epoch: init_transactions() first
    INITIALIZING = "initializing"
    READY = "ready"  # between transactions
    IN_TRANSACTION = "in_transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    PREPARING = "preparing"
    PREPARED = "prepared"  # handed over: someone commits or aborts it by its TxnHandle
    ABORTABLE_ERROR = "abortable_error"  # a batch failed: only an abort is possible
    FATAL_ERROR = "fatal_error"  # fenced: the producer is unusable


# States in which the transaction's batches go out without lingering, and are waited for.
_ENDING = frozenset({TxnState.COMMITTING, TxnState.ABORTING, TxnState.PREPARING})
# States in which a failing batch makes the transaction abortable.
_ONGOING = frozenset({TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.PREPARING})
# States in which a failed batch is neither retried nor split: the transaction is lost.
_ABORTING = frozenset({TxnState.ABORTING, TxnState.ABORTABLE_ERROR})


class TransactionManager:
    """The transaction states of one producer over its accumulator; see the module doc.

    A producer without a transactional_id has one too, whose every call is refused."""

    def __init__(self, accumulator: RecordAccumulator) -> None:
        self._acc = accumulator
        self.lock = accumulator.lock
        self.txn_state: TxnState | None = None
        self._txn_error: MinibrokerError | None = None  # the first failure of the transaction
        # The last sequences named by an EndTxn(commit) that went out behind the batches and
        # has not been answered: the broker may have committed, after which a batch's
        # failure (a resend fenced, or timed out while the broker was down) says nothing
        # about the transaction. Only an answer to that EndTxn ends the doubt.
        self._commit_in_doubt: dict[tuple[str, int], int] | None = None
        self._doubt_failure: BaseException | None = None  # the first batch failure meanwhile
        # That EndTxn committed: every batch of the transaction is in the log, and one still
        # unanswered is resent only to learn its offset.
        self._commit_landed = False
        if accumulator.transactional:
            with self.lock:
                accumulator.attach_transactions(self)
                self._enter(TxnState.UNINITIALIZED)

    # ------------------------------------------------------------------ asked by the accumulator

    @property
    def aborting(self) -> bool:
        """Whether the transaction is lost, so a failed batch is neither retried nor split."""
        return self.txn_state in _ABORTING

    @property
    def commit_landed(self) -> bool:
        """Whether an EndTxn naming the last sequences committed: every batch is written."""
        return self._commit_landed

    def may_expire(self) -> bool:
        """Whether queued batches may expire: not while a commit is in doubt, as the broker's
        answer to the EndTxn settles them, committed or not."""
        return self._commit_in_doubt is None or self._commit_landed

    def batch_failed(self, error: BaseException, done: list[ProducerBatch]) -> None:
        """A batch of the transaction failed for good: the transaction becomes abortable,
        or, while a commit is in doubt, the failure is kept for when the doubt ends."""
        if self._commit_in_doubt is not None:
            self._doubt_failure = self._doubt_failure or error
        elif self.txn_state in _ONGOING:
            self._make_abortable(error, done)

    def fenced(self) -> None:
        """The producer is fenced or otherwise unusable: no transaction goes on."""
        self._commit_in_doubt = self._doubt_failure = None
        self._commit_landed = False
        self.txn_state = TxnState.FATAL_ERROR

    # ------------------------------------------------------------------ states

    def _enter(self, state: TxnState) -> None:
        """Move to `state`: batches go out without lingering while a transaction ends, and
        appends are refused with the error that says why, outside IN_TRANSACTION."""
        acc = self._acc
        was_ending = self.txn_state in _ENDING
        self.txn_state = state
        if state is not TxnState.COMMITTING:
            self._commit_in_doubt = self._doubt_failure = None
            self._commit_landed = False
        if (state in _ENDING) != was_ending:
            acc.set_ending(not was_ending)
        if acc.fatal_error is not None or acc.closed:
            return
        if state is TxnState.IN_TRANSACTION:
            acc.refuse(None)
        elif state is TxnState.ABORTABLE_ERROR:
            acc.refuse(self._txn_error)
        elif state is TxnState.READY:
            acc.refuse(
                IllegalStateError("send() outside a transaction: call begin_transaction() first")
            )
        elif state is TxnState.PREPARED:
            acc.refuse(
                IllegalStateError(
                    "the transaction is prepared: no more records; init_transactions() starts "
                    "afresh"
                )
            )
        elif state in _ENDING:
            acc.refuse(
                IllegalStateError(f"the transaction is {state.value}: begin the next one first")
            )
        else:
            acc.refuse(IllegalStateError("call init_transactions() first"))

    def _txn_require(self, call: str, *states: TxnState) -> None:
        """Raise unless the producer is in one of `states` (the fatal error when fenced)."""
        acc = self._acc
        if not acc.transactional:
            raise IllegalStateError(f"{call} needs a transactional producer (transactional_id)")
        if acc.fatal_error is not None:
            raise acc.fatal_error
        if acc.closed:
            raise MinibrokerError("producer is closed")
        if self.txn_state not in states:
            assert self.txn_state is not None
            if self.txn_state is TxnState.ABORTABLE_ERROR and self._txn_error is not None:
                raise self._txn_error
            if self.txn_state is TxnState.COMMITTING:
                raise IllegalStateError(
                    f"{call} is not allowed while commit_transaction() has not finished: the "
                    "broker may have committed the transaction, so call commit_transaction() "
                    "again to learn the outcome (it is safe to repeat)"
                )
            raise IllegalStateError(f"{call} is not allowed when {self.txn_state.value}")

    def _txn_answer_error(self, error: int, context: str, message: str | None) -> MinibrokerError:
        """The exception for a failed transactional request; a fencing code is fatal."""
        exc = error_for(error, context, message)
        if error in TXN_FATAL_CODES:
            # No batch is unfinished: these requests go out only once all were answered.
            self._acc.set_fatal(exc)
        return exc

    def _make_abortable(
        self,
        cause: BaseException,
        done: list[ProducerBatch],
        kind: type[TransactionAbortableError] = TransactionAbortableError,
    ) -> None:
        """The transaction lost a batch (or its offsets): fail its queued ones now and allow
        only an abort."""
        self._txn_error = kind(
            f"the transaction must be aborted: {cause}", getattr(cause, "code", None)
        )
        self._enter(TxnState.ABORTABLE_ERROR)
        self._acc.fail_queued(
            TransactionAbortedError(f"not sent: the transaction failed ({cause})"), done
        )

    # ------------------------------------------------------------------ the producer's calls

    def begin_init(self) -> None:
        """init_transactions() starts: fresh, between transactions, or after a prepare."""
        with self.lock:
            self._txn_require(
                "init_transactions()",
                TxnState.UNINITIALIZED,
                TxnState.INITIALIZING,
                TxnState.READY,
                TxnState.PREPARED,
            )
            self._enter(TxnState.INITIALIZING)

    def on_init(
        self, error: int, producer_id: int, producer_epoch: int, message: str | None
    ) -> None:
        """InitProducerId's answer: adopt the id and epoch, or raise (fatal when fenced)."""
        with self.lock:
            if error == ErrorCode.NONE:
                self._acc.adopt(producer_id, producer_epoch)
                self._enter(TxnState.READY)
                return
            exc = self._txn_answer_error(error, "InitProducerId", message)
            if self._acc.fatal_error is None:
                self._enter(TxnState.UNINITIALIZED)
            raise exc

    def begin_transaction(self) -> None:
        with self.lock:
            self._txn_require("begin_transaction()", TxnState.READY)
            self._txn_error = None
            self._enter(TxnState.IN_TRANSACTION)

    def begin_commit(self) -> list[ProducerBatch]:
        """commit_transaction() starts: no more appends; returns the batches to wait for.

        Also resumes a commit that timed out. An abortable transaction raises its error."""
        with self.lock:
            self._txn_require(
                "commit_transaction()",
                TxnState.IN_TRANSACTION,
                TxnState.PREPARED,
                TxnState.COMMITTING,
            )
            self._enter(TxnState.COMMITTING)
            return self._acc.unfinished_batches()

    def begin_prepare(self) -> list[ProducerBatch]:
        """prepare_transaction() starts: as begin_commit, for a PrepareTxn."""
        with self.lock:
            self._txn_require("prepare_transaction()", TxnState.IN_TRANSACTION, TxnState.PREPARING)
            self._enter(TxnState.PREPARING)
            return self._acc.unfinished_batches()

    def begin_abort(self) -> tuple[list[ProducerBatch], list[ProducerBatch]]:
        """abort_transaction() starts: queued batches fail with TransactionAbortedError.

        Returns (the in-flight batches to wait for, the batches finished now)."""
        with self.lock:
            self._txn_require(
                "abort_transaction()",
                TxnState.IN_TRANSACTION,
                TxnState.ABORTABLE_ERROR,
                TxnState.PREPARING,
                TxnState.PREPARED,
                TxnState.ABORTING,
            )
            self._enter(TxnState.ABORTING)
            done: list[ProducerBatch] = []
            self._acc.fail_queued(TransactionAbortedError("the transaction was aborted"), done)
            return self._acc.unfinished_batches(), done

    def commit_sequences(self) -> dict[tuple[str, int], int] | None:
        """While committing with every batch sent and none failed: each partition's last
        sequence of the transaction, for an EndTxn sent right behind the last Produce
        (the broker commits only if its log ends there). None when the commit must wait
        for the answers instead: a batch failed or waits to be sent, or nothing was sent.
        The caller sends that EndTxn: from here until its answer, the commit is in doubt.

        A pid and epoch name one transaction and sequences restart at each, so a
        partition's last sequence covers every batch the transaction sent there."""
        with self.lock:
            if self.txn_state is not TxnState.COMMITTING:
                return None
            sequences = self._acc.last_sequences()
            if sequences:
                self._commit_in_doubt = sequences
            return sequences or None

    @property
    def commit_in_doubt(self) -> dict[tuple[str, int], int] | None:
        """The last sequences of an EndTxn(commit) sent behind the batches and not answered
        (the transaction may be committed), or None."""
        with self.lock:
            return self._commit_in_doubt

    def on_commit_landed(self) -> None:
        """The EndTxn naming the last sequences committed (its answer is not applied yet):
        the log holds every batch of the transaction. A batch still unanswered is resent
        only to learn its offset; expiry or a refusal finishes it as written, offset -1."""
        with self.lock:
            assert self._commit_in_doubt is not None
            self._commit_landed = True

    def on_commit_refused(self) -> list[ProducerBatch]:
        """The broker answered the EndTxn behind the batches without committing (it then
        changed nothing): the doubt ends, and a batch that failed meanwhile makes the
        transaction abortable after all. Returns the batches finished now."""
        with self.lock:
            failure = self._doubt_failure
            self._commit_in_doubt = self._doubt_failure = None
            done: list[ProducerBatch] = []
            if failure is not None and self.txn_state in _ONGOING:
                self._make_abortable(failure, done)
            return done

    @property
    def failed_in_doubt(self) -> bool:
        """Whether a batch failed while a commit was in doubt."""
        with self.lock:
            return self._doubt_failure is not None

    def check_flushed(self) -> None:
        """Before EndTxn(commit) or PrepareTxn: raise if any batch of the transaction failed
        (TransactionAbortableError) or is still unfinished."""
        with self.lock:
            if self._acc.fatal_error is not None:
                raise self._acc.fatal_error
            if self.txn_state is TxnState.ABORTABLE_ERROR:
                assert self._txn_error is not None
                raise self._txn_error
            unfinished = self._acc.unfinished_batches()
            if unfinished:
                raise IllegalStateError(f"{len(unfinished)} batch(es) still unfinished")

    def on_end(
        self,
        committed: bool,
        error: int,
        producer_id: int,
        producer_epoch: int,
        message: str | None,
    ) -> list[ProducerBatch]:
        """EndTxn's answer. Success brings the next transaction's pid and epoch (sequences
        restart at 0). A failed commit leaves the transaction abortable; a failed abort
        leaves the epoch unknown, so init_transactions() is needed; fencing is fatal.
        Returns the batches finished now (a commit's whose answers were lost)."""
        with self.lock:
            acc = self._acc
            if error == ErrorCode.NONE:
                done: list[ProducerBatch] = []
                if committed and self._commit_in_doubt is not None:
                    self._settle_committed(done)
                acc.adopt(producer_id, producer_epoch)
                self._txn_error = None
                acc.metrics["transactions_committed" if committed else "transactions_aborted"] += 1
                self._enter(TxnState.READY)
                return done
            verb = "commit" if committed else "abort"
            exc = self._txn_answer_error(error, f"EndTxn({verb})", message)
            if acc.fatal_error is not None:
                raise exc
            if committed:
                self._txn_error = TransactionAbortableError(
                    f"the transaction must be aborted: {exc}", error
                )
                self._enter(TxnState.ABORTABLE_ERROR)
                raise self._txn_error
            self._enter(TxnState.UNINITIALIZED)
            raise exc

    def _settle_committed(self, done: list[ProducerBatch]) -> None:
        """An EndTxn naming the last sequences committed: the broker's log held every batch
        up to them, so a batch still unanswered was written (its offset unknown, -1, as
        for a duplicate whose original is no longer cached) and is not sent again: under
        the next epoch it would be a new batch."""
        self._acc.finish_as_written(done)
        if self._doubt_failure is not None:
            log.warning(
                "the transaction committed with every batch in the log, but a batch reported "
                "a failure before the commit's answer: %s",
                self._doubt_failure,
            )

    def on_prepare(self, error: int, message: str | None) -> tuple[int, int]:
        """PrepareTxn's answer: the prepared (pid, epoch), or raise (abortable or fatal)."""
        with self.lock:
            if error == ErrorCode.NONE:
                self._enter(TxnState.PREPARED)
                return self._acc.producer_id, self._acc.producer_epoch
            exc = self._txn_answer_error(error, "PrepareTxn", message)
            if self._acc.fatal_error is not None:
                raise exc
            self._txn_error = TransactionAbortableError(
                f"the transaction must be aborted: {exc}", error
            )
            self._enter(TxnState.ABORTABLE_ERROR)
            raise self._txn_error

    def begin_send_offsets(self) -> None:
        """send_offsets_to_transaction() starts: only inside a begun transaction."""
        with self.lock:
            self._txn_require("send_offsets_to_transaction()", TxnState.IN_TRANSACTION)

    def on_send_offsets(
        self, error: int, message: str | None
    ) -> tuple[MinibrokerError | None, list[ProducerBatch]]:
        """TxnOffsetCommit's answer: (the error to raise or None, the batches finished now).

        Fencing is fatal. Any other refusal leaves the transaction abortable, its queued
        batches failed: TxnOffsetCommitFailedError when the group refused the consumer's
        member (fenced, stale or unknown, or its instance id taken over), as Kafka's
        CommitFailedException there (and its abortable FencedInstanceIdException)."""
        with self.lock:
            if error == ErrorCode.NONE:
                return None, []
            exc = self._txn_answer_error(error, "TxnOffsetCommit", message)
            if self._acc.fatal_error is not None:
                return exc, []
            done: list[ProducerBatch] = []
            if self.txn_state in _ONGOING:
                refused_member = error in MEMBER_ERRORS or error == ErrorCode.FENCED_INSTANCE_ID
                kind = TxnOffsetCommitFailedError if refused_member else TransactionAbortableError
                self._make_abortable(exc, done, kind)
            return self._txn_error or exc, done

    @property
    def transaction_open(self) -> bool:
        """Whether a transaction was begun and is neither ended nor prepared (or being so)."""
        return self.txn_state in (
            TxnState.IN_TRANSACTION,
            TxnState.ABORTABLE_ERROR,
            TxnState.PREPARING,
            TxnState.ABORTING,
        )
