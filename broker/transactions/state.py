"""Transactional-id state and its transitions, pure logic (docs/protocol.md section 5).

One `TxnEntry` per transactional_id. `producer_id`/`producer_epoch` are always the
CURRENT ones: the ids the next (or ongoing) transaction's batches must carry. When
a transaction is decided the entry moves to the next epoch at once, so every
batch of the old epoch is fenced from that moment, and `last_ended` keeps the old
(pid, epoch), the decision and the answer, so that a retried EndTxn gets the same
answer and the markers know whose transaction they end.

    EMPTY / COMPLETE_* --batch--> ONGOING --PrepareTxn--> PREPARED
    ONGOING / PREPARED --EndTxn, CommitTxns, timeout, InitProducerId--> PREPARE_COMMIT
                          or PREPARE_ABORT (decided; markers being written) --> COMPLETE_*
    EMPTY / COMPLETE_* --EndTxn--> COMPLETE_* (no marker; epoch bumped all the same)

No IO, no clock: time comes in as `now_ms`, new ids as arguments. Entries and app
versions encode to plain lists for broker/transactions/log.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, NamedTuple

from protocol.authorization import ANONYMOUS
from protocol.errors import ErrorCode
from protocol.messages import TXN_STATES

EMPTY = "EMPTY"
ONGOING = "ONGOING"
PREPARED = "PREPARED"
PREPARE_COMMIT = "PREPARE_COMMIT"
PREPARE_ABORT = "PREPARE_ABORT"
COMPLETE_COMMIT = "COMPLETE_COMMIT"
COMPLETE_ABORT = "COMPLETE_ABORT"
OPEN = frozenset({ONGOING, PREPARED})
DECIDED = frozenset({PREPARE_COMMIT, PREPARE_ABORT})
ENDED = frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT})
STATES = frozenset(TXN_STATES)
assert OPEN | DECIDED | ENDED == STATES
DEFAULT_TIMEOUT_MS = 60_000  # Kafka's transaction.timeout.ms default

TXN_ABORT_CAUSES: tuple[str, ...] = (
    "client",  # EndTxn(committed=false), CommitTxns(committed=false), or an app version
    # already committed (the re-run's transactions are aborted)
    "timeout",  # ONGOING past transaction_timeout_ms, PREPARED past its prepared timeout
    "fenced",  # a new instance's InitProducerId aborted the old one's open transaction
    "recovery",  # at start: transactional data no transaction claims, closed with ABORT
)
"""Why a transaction was aborted: each gets a `minibroker_transactions_aborted_total`
series, 0 until it happens."""


class TxnStats(NamedTuple):
    """The transaction coordinator's state, taken when Prometheus scrapes."""

    states: Mapping[str, int]
    """Transactional ids held, by state."""
    commits: int
    aborts: Mapping[str, int]
    """Aborted transactions by cause: client, timeout, fenced, recovery."""
    oldest_open_ms: Mapping[tuple[str, int], int]
    """Per (topic, partition) with an open transaction: when the oldest one started."""


class TxnStateError(ValueError):
    """A persisted entry that does not decode to a consistent state."""


@dataclass(frozen=True, slots=True)
class Ended:
    """The last ended transaction: whose it was, how it ended, what EndTxn answered."""

    producer_id: int
    producer_epoch: int
    committed: bool
    next_producer_id: int
    next_producer_epoch: int
    by_client: bool = True
    """False when the broker aborted it (timeout, fencing): the producer's commit
    then learns that its epoch is fenced, not that it asked twice."""


@dataclass(frozen=True, slots=True)
class TxnEntry:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    updated_ms: int
    started_ms: int = -1
    prepared_deadline_ms: int = -1
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    last_ended: Ended | None = None
    groups: frozenset[str] = field(default_factory=frozenset)
    """Consumer groups whose offsets joined the transaction (TxnOffsetCommit)."""
    principal: str = ANONYMOUS
    """Who initialized the id last: its producer id is theirs (docs/protocol.md section 7,
    "Producer ids belong to principals"); recorded here, durably, since the id outlives
    restarts and can change hands (InitProducerId by another principal allowed to write
    the transactional id)."""
    classic: bool = False
    """Initialized by a Kafka client through a kafka listener, whose transactions are
    Kafka's before KIP-890: the producer keeps its epoch across the transactions it ends
    itself, and adds each partition (AddPartitionsToTxn) before it writes there; a batch
    for a partition not added is refused (docs/transactions.md, "Kafka's clients")."""
    reinit: tuple[int, int, int, int] | None = None
    """The last classic InitProducerId that named its producer (KIP-360) and was granted:
    the (pid, epoch) it named and the (pid, epoch) it was given, so that its retry after
    a lost answer gets the same answer (`repeated_init`), as Kafka's coordinator keeps
    the previous epoch to recognise it."""

    def __post_init__(self) -> None:
        assert self.state in STATES, self.state
        assert self.reinit is None or self.classic, self
        assert (self.state in ENDED) == (not self.holds_anything) or self.state in OPEN, self
        assert self.state not in DECIDED or self.last_ended is not None, self

    @property
    def holds_anything(self) -> bool:
        """Whether the transaction has partitions or groups whose markers end it."""
        return bool(self.partitions or self.groups)

    @property
    def deadline_ms(self) -> int | None:
        """When the broker aborts this transaction, if it is open."""
        if self.state == ONGOING:
            return self.started_ms + self.timeout_ms
        if self.state == PREPARED:
            return self.prepared_deadline_ms
        return None

    def marker_ids(self) -> tuple[int, int]:
        """(producer_id, producer_epoch) the decided transaction's batches carry."""
        assert self.last_ended is not None
        return self.last_ended.producer_id, self.last_ended.producer_epoch

    def encode(self) -> list[Any]:
        last = self.last_ended
        return [
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
            self.state,
            self.timeout_ms,
            self.updated_ms,
            self.started_ms,
            self.prepared_deadline_ms,
            sorted([t, p] for t, p in self.partitions),
            None
            if last is None
            else [
                last.producer_id,
                last.producer_epoch,
                last.committed,
                last.next_producer_id,
                last.next_producer_epoch,
                last.by_client,
            ],
            sorted(self.groups),
            # Only when not anonymous or classic: with security off and the minibroker
            # listener alone the records stay as they were.
            *([] if self.principal == ANONYMOUS and not self.classic else [self.principal]),
            *([True] if self.classic else []),
            *([list(self.reinit)] if self.reinit is not None else []),
        ]

    @classmethod
    def decode(cls, item: Any) -> TxnEntry:
        try:
            # Entries written before TxnOffsetCommit have no groups; anonymous ones no
            # principal; native ones no classic flag; classic ones never re-initialized
            # naming their producer no reinit.
            (tid, pid, epoch, state, timeout, updated, started, deadline, parts, last, *rest) = item
            if len(rest) > 4:
                raise ValueError("too many fields")
            groups: Any = rest[0] if rest else []
            principal: Any = rest[1] if len(rest) > 1 else ANONYMOUS
            classic: Any = rest[2] if len(rest) > 2 else False
            reinit: Any = rest[3] if len(rest) > 3 else None
            if reinit is not None and not (
                isinstance(reinit, list)
                and len(reinit) == 4
                and all(type(v) is int for v in reinit)
            ):
                raise ValueError(f"reinit {reinit!r} is not four integers")
            entry = cls(
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                state=state,
                timeout_ms=timeout,
                updated_ms=updated,
                started_ms=started,
                prepared_deadline_ms=deadline,
                partitions=frozenset((t, p) for t, p in parts),
                last_ended=None if last is None else Ended(*last),
                groups=frozenset(groups),
                principal=principal,
                classic=classic,
                reinit=None if reinit is None else tuple(reinit),
            )
        except (TypeError, ValueError, AssertionError) as exc:
            raise TxnStateError(f"transaction entry {item!r}: {exc}") from exc
        ints = (pid, epoch, timeout, updated, started, deadline)
        if (
            not isinstance(tid, str)
            or state not in STATES
            or not all(type(v) is int for v in ints)
            or not all(isinstance(g, str) for g in groups)
            or not isinstance(principal, str)
            or type(classic) is not bool
        ):
            raise TxnStateError(f"transaction entry {item!r} is malformed")
        return entry


class Identity(Enum):
    CURRENT = "current"
    LAST_ENDED = "last_ended"


def identify(entry: TxnEntry | None, producer_id: int, producer_epoch: int) -> Identity | ErrorCode:
    """Whose request this is: the current producer, the one whose transaction just ended
    (a retry), or an error: an unknown pid, a fenced (older) or a future epoch."""
    if entry is None:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if (producer_id, producer_epoch) == (entry.producer_id, entry.producer_epoch):
        return Identity.CURRENT
    last = entry.last_ended
    if (
        last is not None
        and (producer_id, producer_epoch) == (last.producer_id, last.producer_epoch)
        and (entry.producer_id, entry.producer_epoch)
        == (last.next_producer_id, last.next_producer_epoch)
    ):
        # Only while no newer instance took over: then the retry is a zombie's.
        return Identity.LAST_ENDED
    if producer_id == entry.producer_id:
        if producer_epoch < entry.producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if last is not None and producer_id == last.producer_id:
        return ErrorCode.PRODUCER_FENCED  # ended and taken over, or moved to a new pid
    return ErrorCode.INVALID_PRODUCER_ID_MAPPING


class Ask(Enum):
    """What a request asks of a transactional id's entry."""

    BATCH = "batch"  # a transactional Produce's batch joins the transaction
    ADD = "add"  # AddPartitionsToTxn (a classic producer's partitions join it)
    OFFSETS = "offsets"  # a TxnOffsetCommit's offsets join it
    END = "end"  # EndTxn
    PREPARE = "prepare"  # PrepareTxn
    COMMIT_TXNS = "commit_txns"  # CommitTxns, committing or aborting


class Admitted(Enum):
    """How an accepted request goes on."""

    PROCEED = "proceed"
    RETRY = "retry"
    """A retry of the transaction that just ended, asking the same end: answered as it
    was, once that transaction's markers are finished if they are not yet."""
    FINISH_FIRST = "finish_first"
    """EndTxn while the previous transaction's markers are being written: they are
    finished first, then the request proceeds."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A request the entry does not accept, and the error it is answered with."""

    code: ErrorCode
    message: str
    last_ended: bool = False
    """The request carries the pid and epoch of the transaction that just ended."""


MARKERS_PENDING = Refused(
    ErrorCode.CONCURRENT_TRANSACTIONS,
    "the previous transaction's markers are still being written; retry",
)


def admission(
    entry: TxnEntry | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    ask: Ask,
    *,
    committed: bool | None = None,
    principal: str | None = None,
) -> Admitted | Refused:
    """Whether `entry` accepts the request, the one place the rules live: who sends it
    (`identify`), whether `principal` owns the producer (None: checked elsewhere), and
    which states accept what is asked. `committed` is the end asked (END, COMMIT_TXNS)."""
    who = identify(entry, producer_id, producer_epoch)
    if isinstance(who, ErrorCode):
        return _not_identified(who, ask, transactional_id, producer_id, producer_epoch, entry)
    assert entry is not None
    if principal is not None and entry.principal != principal:
        return Refused(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"the producer of transactional id {transactional_id!r} belongs to another principal",
        )
    joins = ask is Ask.BATCH or ask is Ask.OFFSETS or ask is Ask.ADD
    if who is Identity.LAST_ENDED:
        if joins:
            return Refused(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"epoch {producer_epoch} of producer {producer_id} is fenced: its transaction "
                "ended",
                last_ended=True,
            )
        assert entry.last_ended is not None
        return _same_end(entry.last_ended, committed)
    if entry.state in DECIDED:
        return Admitted.FINISH_FIRST if ask is Ask.END else MARKERS_PENDING
    if (
        entry.classic
        and ask is Ask.END
        and entry.state in (COMPLETE_COMMIT, COMPLETE_ABORT)
        and committed != (entry.state == COMPLETE_COMMIT)
    ):
        # A classic producer keeps its epoch: an EndTxn naming the ended transaction is
        # current, and one asking the other end contradicts what it asked (Kafka's 48).
        return Refused(
            ErrorCode.INVALID_TXN_STATE, f"the transaction already ended ({entry.state})"
        )
    if joins and entry.state == PREPARED:
        return Refused(
            ErrorCode.INVALID_TXN_STATE, "the transaction is PREPARED: nothing more joins it"
        )
    if ask is Ask.COMMIT_TXNS and committed and entry.state != PREPARED:
        return Refused(
            ErrorCode.INVALID_TXN_STATE,
            f"only a PREPARED transaction commits here, not {entry.state}",
        )
    if ask is Ask.COMMIT_TXNS and not committed and entry.state not in OPEN:
        return Refused(
            ErrorCode.INVALID_TXN_STATE, f"only an open transaction aborts, not {entry.state}"
        )
    return Admitted.PROCEED


def _same_end(last: Ended, committed: bool | None) -> Admitted | Refused:
    """A request naming the transaction that just ended is a retry when it asks the
    same end (`committed`; None asks none). Else: 47 when the broker ended it (its
    timeout passed), so the producer learns it is fenced; 48 when the client did."""
    if committed is not None and last.committed == committed:
        return Admitted.RETRY
    if not last.by_client:
        return Refused(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            "the broker aborted the transaction (its timeout passed); this epoch is fenced",
        )
    return Refused(
        ErrorCode.INVALID_TXN_STATE,
        f"the transaction already ended ({'commit' if last.committed else 'abort'})",
    )


def _not_identified(
    code: ErrorCode,
    ask: Ask,
    transactional_id: str,
    pid: int,
    epoch: int,
    entry: TxnEntry | None,
) -> Refused:
    """The refusal of a request whose pid and epoch are not the entry's. A batch gets
    the codes a transactional Produce answers with; the rest get `identify`'s."""
    if ask is Ask.BATCH:
        if code is ErrorCode.INVALID_PRODUCER_ID_MAPPING:
            return Refused(
                ErrorCode.INVALID_TXN_STATE,
                f"producer id {pid} is not the one bound to transactional id {transactional_id!r}",
            )
        return Refused(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"epoch {epoch} of producer {pid} is fenced: a newer instance took over",
        )
    if entry is None:
        return Refused(
            code, f"transactional id {transactional_id!r} is unknown: call InitProducerId"
        )
    current = f"current producer {entry.producer_id} epoch {entry.producer_epoch}"
    if code == ErrorCode.PRODUCER_FENCED:
        return Refused(code, f"producer {pid} epoch {epoch} was fenced ({current})")
    if code == ErrorCode.INVALID_PRODUCER_EPOCH:
        return Refused(code, f"epoch {epoch} of producer {pid} was never issued ({current})")
    return Refused(code, f"producer {pid} is not bound to {transactional_id!r} ({current})")


def initialized(
    entry: TxnEntry | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    timeout_ms: int,
    now_ms: int,
    principal: str = ANONYMOUS,
    *,
    classic: bool = False,
    named: tuple[int, int] | None = None,
) -> TxnEntry:
    """The entry after `principal`'s InitProducerId, once any open transaction was aborted;
    `classic` when a Kafka client sent it (`TxnEntry.classic`), `named` the producer it
    named (KIP-360), kept so that a retry is answered the same (`repeated_init`)."""
    assert entry is None or entry.state in ENDED, entry
    assert named is None or classic, named
    return TxnEntry(
        transactional_id,
        producer_id,
        producer_epoch,
        EMPTY,
        timeout_ms,
        now_ms,
        last_ended=None if entry is None else entry.last_ended,
        principal=principal,
        classic=classic,
        reinit=None if named is None else (*named, producer_id, producer_epoch),
    )


def repeated_init(
    entry: TxnEntry | None, producer_id: int, producer_epoch: int, principal: str
) -> tuple[int, int] | None:
    """The (pid, epoch) to answer again when a classic InitProducerId repeats the last one
    that named its producer (KIP-360) and whose answer was lost (kafka-python and
    librdkafka resend it as it was): Kafka's coordinator answers the current pid and
    epoch, unbumped, when the named epoch is its previous one. Only while what that
    request was given is still current, no transaction has opened since and the same
    principal asks; otherwise None, and the request is judged as a new one."""
    if entry is None or entry.reinit is None or producer_id < 0:
        return None
    asked_pid, asked_epoch, given_pid, given_epoch = entry.reinit
    if (
        (producer_id, producer_epoch) == (asked_pid, asked_epoch)
        and (given_pid, given_epoch) == (entry.producer_id, entry.producer_epoch)
        and entry.state in ENDED
        and entry.principal == principal
    ):
        return given_pid, given_epoch
    return None


def reinit_refusal(entry: TxnEntry | None, producer_id: int, producer_epoch: int) -> Refused | None:
    """Whether a classic InitProducerId naming the producer it had (KIP-360: a Kafka
    client bumping its epoch to recover from an abortable error) may bump it: only the
    current producer may, or the one whose transaction the broker aborted on timeout
    while no newer instance took over (KIP-588); any other is a zombie, which must not
    fence the newer instance. None: allowed (no producer named is a new instance)."""
    if producer_id < 0 or entry is None:
        return None
    if (producer_id, producer_epoch) == (entry.producer_id, entry.producer_epoch):
        return None
    last = entry.last_ended
    if (
        last is not None
        and not last.by_client
        and (producer_id, producer_epoch) == (last.producer_id, last.producer_epoch)
        and (entry.producer_id, entry.producer_epoch)
        == (last.next_producer_id, last.next_producer_epoch)
    ):
        return None
    return Refused(
        ErrorCode.PRODUCER_FENCED,
        f"producer {producer_id} epoch {producer_epoch} is not the current producer of "
        f"{entry.transactional_id!r} ({entry.producer_id} epoch {entry.producer_epoch})",
    )


def not_added(entry: TxnEntry, key: tuple[str, int]) -> Refused | None:
    """A classic producer's batch for a partition its open transaction has not added
    (AddPartitionsToTxn): refused, never appended, as KIP-890 part 1 verifies. This is
    also what keeps a late batch of an ended transaction out of the log (the classic
    producer's epoch did not move): it finds no open transaction holding its partition."""
    if entry.classic and not (entry.state == ONGOING and key in entry.partitions):
        return Refused(
            ErrorCode.INVALID_TXN_STATE,
            f"{key[0]}-{key[1]} is not in the open transaction of {entry.transactional_id!r}: "
            "AddPartitionsToTxn comes first",
        )
    return None


def with_partitions(entry: TxnEntry, added: set[tuple[str, int]], now_ms: int) -> TxnEntry:
    """A transactional batch arrived: the transaction is ONGOING and holds `added`."""
    ongoing = _ongoing(entry, now_ms)
    return replace(ongoing, partitions=ongoing.partitions | added)


def with_group(entry: TxnEntry, group_id: str, now_ms: int) -> TxnEntry:
    """A TxnOffsetCommit arrived: the transaction is ONGOING and holds the group."""
    ongoing = _ongoing(entry, now_ms)
    return replace(ongoing, groups=ongoing.groups | {group_id})


def _ongoing(entry: TxnEntry, now_ms: int) -> TxnEntry:
    """The entry's transaction, started now unless it is already ONGOING."""
    assert entry.state == ONGOING or entry.state in ENDED, entry
    if entry.state == ONGOING:
        return replace(entry, updated_ms=now_ms)
    return replace(
        entry,
        state=ONGOING,
        started_ms=now_ms,
        partitions=frozenset(),
        groups=frozenset(),
        updated_ms=now_ms,
    )


def prepared(entry: TxnEntry, deadline_ms: int, now_ms: int) -> TxnEntry:
    return replace(_ongoing(entry, now_ms), state=PREPARED, prepared_deadline_ms=deadline_ms)


def decided(
    entry: TxnEntry,
    committed: bool,
    next_ids: tuple[int, int],
    now_ms: int,
    *,
    by_client: bool = True,
) -> TxnEntry:
    """The decision: the entry moves to the next pid/epoch at once. An open transaction
    is PREPARE_* until its markers are written; one that wrote nothing is complete."""
    assert entry.state in OPEN or entry.state in ENDED, entry
    ended = Ended(entry.producer_id, entry.producer_epoch, committed, *next_ids, by_client)
    pid, epoch = next_ids
    if entry.state in OPEN and entry.holds_anything:
        state = PREPARE_COMMIT if committed else PREPARE_ABORT
        return replace(
            entry,
            producer_id=pid,
            producer_epoch=epoch,
            state=state,
            last_ended=ended,
            updated_ms=now_ms,
        )
    return replace(
        entry,
        producer_id=pid,
        producer_epoch=epoch,
        state=COMPLETE_COMMIT if committed else COMPLETE_ABORT,
        partitions=frozenset(),
        groups=frozenset(),
        started_ms=-1,
        prepared_deadline_ms=-1,
        last_ended=ended,
        updated_ms=now_ms,
    )


def completed(entry: TxnEntry, now_ms: int) -> TxnEntry:
    """Every marker of a decided transaction is durable."""
    assert entry.state in DECIDED, entry
    return replace(
        entry,
        state=COMPLETE_COMMIT if entry.state == PREPARE_COMMIT else COMPLETE_ABORT,
        partitions=frozenset(),
        groups=frozenset(),
        started_ms=-1,
        prepared_deadline_ms=-1,
        updated_ms=now_ms,
    )


@dataclass(frozen=True, slots=True)
class AppVersion:
    """The newest committed version of a streaming app (CommitTxns txn_app_id)."""

    txn_app_id: str
    txn_app_version: int
    committed_ms: int

    def encode(self) -> list[Any]:
        return [self.txn_app_id, self.txn_app_version, self.committed_ms]

    @classmethod
    def decode(cls, item: Any) -> AppVersion:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and all(type(v) is int for v in item[1:])
        ):
            raise TxnStateError(f"app version {item!r} is malformed")
        return cls(*item)
