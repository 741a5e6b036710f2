"""The transaction coordinator: InitProducerId for transactional ids, transactional
Produce admission, EndTxn, PrepareTxn, CommitTxns, timeouts and recovery
(docs/protocol.md section 5, docs/transactions.md).

The transitions themselves are pure (broker/transactions/state.py); this module orders the
IO around them. Every change is written to the transaction log and fdatasynced
(broker/transactions/log.py) before it is answered. Two share the fsync round of
what they go with, as section 5 allows: a partition add that of its batch, and a
decision that of its markers. Ending a transaction is the decision (the entry moves
to the next epoch at once, fencing the old one) and the COMMIT or ABORT marker on
every partition of the transaction, durable together; then the groups' record in
the offsets log, for every group whose offsets joined it; then COMPLETE. A crash
anywhere between is finished by `recover` before the listener opens, which also
decides a transaction by a marker whose decision was lost, and adopts a batch whose
partition add was.

Requests for one transactional id are serialised by a lock per id (CommitTxns
takes the locks of all its ids, in sorted order, and of its app id), so a
decision never interleaves with an admission of the same transaction, while
different ids proceed in parallel and share the log's fsync rounds.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from broker.clock import now_ms
from broker.config import BrokerConfig
from broker.crash_points import crash_point
from broker.partitions import (
    PRODUCER_EPOCH_MAX,
    FlushFailed,
    GroupCommitter,
    Partition,
    ProducerIdManager,
    StorageError,
    TopicRegistry,
)
from broker.transactions.log import TxnLog, TxnLogError
from broker.transactions.recovery import recover
from broker.transactions.state import (
    DECIDED,
    DEFAULT_TIMEOUT_MS,
    ENDED,
    ONGOING,
    OPEN,
    PREPARE_COMMIT,
    PREPARED,
    TXN_ABORT_CAUSES,
    Admitted,
    AppVersion,
    Ask,
    Refused,
    TxnEntry,
    TxnStateError,
    TxnStats,
    admission,
    completed,
    decided,
    initialized,
    not_added,
    prepared,
    reinit_refusal,
    repeated_init,
    with_group,
    with_partitions,
)
from protocol import messages as m
from protocol.batch import BatchHeader
from protocol.errors import ErrorCode, ProtocolError

log = logging.getLogger(f"minibroker.{__name__}")

TopicPartition = tuple[str, int]

UNWRITTEN = -1
"""`_one_round_ends`' value for a one-round commit whose COMPLETE could not be written."""


class CoordinatorError(ProtocolError):
    """A request the coordinator refuses; `code` is the answer."""


class GroupMarkers(Protocol):
    """The committed-offsets store (broker/groups/offset_store.py), as transactions end."""

    def pending_owners(self) -> set[tuple[str, int, int | None]]:
        """(group_id, producer_id, producer_epoch or None where unknown) of every pending
        transactional offset."""
        ...

    async def settled(self, group_ids: Iterable[str]) -> None:
        """Return once no TxnOffsetCommit is still writing offsets of these groups."""
        ...

    async def write_markers(
        self, markers: Sequence[tuple[int, int | None, Iterable[str], bool]]
    ) -> None:
        """For each (producer_id, producer_epoch, groups, committed): the pending offsets
        of the producer's transaction at that epoch (any epoch: None) in those groups
        become committed, or are dropped; durable on return."""
        ...

    async def write_markers_now(
        self, markers: Sequence[tuple[int, int | None, Iterable[str], bool]]
    ) -> int:
        """`write_markers`, in force at once and written, not synced: return the size the
        offsets log must reach on disk for them to be (0: nothing written), for `durable`."""
        ...

    async def durable(self, end: int) -> None:
        """Return once the offsets log is on disk up to `end`; OSError if not."""
        ...


@dataclass(slots=True)
class TxnCounters:
    """Transactions ended since start: commits, and aborts by cause."""

    commits: int = 0
    aborts: Counter[str] = field(
        default_factory=lambda: Counter(dict.fromkeys(TXN_ABORT_CAUSES, 0))
    )


class TransactionCoordinator:
    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicRegistry,
        producer_ids: ProducerIdManager,
        committer: GroupCommitter,
        txn_log: TxnLog,
        offsets: GroupMarkers,
    ) -> None:
        self.config = config
        self.topics = topics
        self.producer_ids = producer_ids
        self.committer = committer
        self.log = txn_log
        self.offsets = offsets
        self.entries: OrderedDict[str, TxnEntry] = OrderedDict()  # least recently used first
        self.apps: dict[str, AppVersion] = {}
        self.counters = TxnCounters()
        # Called after markers are written: long-polling read_committed fetches look again.
        self.on_markers: Callable[[], None] = lambda: None
        self._locks: dict[tuple[str, str], anyio.Lock] = {}
        self._pids: dict[int, str] = {}  # producer id -> its transactional id
        # Transactions answered whose markers are still being synced (`_settle`), by id:
        # set once COMPLETE is recorded, or the round failed (the sweep completes them).
        self._settling: dict[str, anyio.Event] = {}
        # `sync_soon`'s syncs asked for and not done (`_behind`, which `_sync_behind` runs):
        # compaction, which starts the file afresh, waits for them.
        self._syncs_behind = 0
        self._behind: list[tuple[int, Callable[[], object]]] = []
        self._behind_wake: anyio.Event | None = None
        # The size `txn.wal` must reach on disk for a one-round commit's COMPLETE, by id,
        # until it has: the id's next marker waits for it (`_previous_ends_durable`).
        self._one_round_ends: dict[str, int] = {}
        # Where `_settle` runs: `run`'s task group, while it runs.
        self._settlers: anyio.abc.TaskGroup | None = None

    # ------------------------------------------------------------------ state

    def load(self) -> None:
        """Read the transaction log into memory (TxnLogError when it is damaged)."""
        records = self.log.open(self._replay)
        legacy = {} if records else self.producer_ids.legacy_transactional()
        for tid, (pid, epoch) in legacy.items():
            # Ids mapped before the coordinator existed keep their pid and fencing.
            entry = initialized(None, tid, pid, epoch, DEFAULT_TIMEOUT_MS, now_ms())
            self.log.append_now([[entry.encode()], [], []])
            self._install(entry)
        if legacy:
            self.producer_ids.retire_legacy()
        for entry in self.entries.values():
            self.producer_ids.remember(entry.producer_id, entry.producer_epoch)

    def _replay(self, body: Any) -> None:
        try:
            # A fourth list, of expired app ids, is absent from records written before
            # app versions expired.
            entries, apps, removed, *rest = body
            for item in entries:
                self._install(TxnEntry.decode(item))
            for item in apps:
                app = AppVersion.decode(item)
                self.apps[app.txn_app_id] = app
            for tid in removed:
                self._forget(tid)
            for app_id in rest[0] if rest else ():
                self.apps.pop(app_id, None)
        except (TxnStateError, TypeError, ValueError) as exc:
            raise TxnLogError(f"{self.log.path}: {exc}") from exc

    def _install(self, entry: TxnEntry) -> None:
        tid = entry.transactional_id
        old = self.entries.get(tid)
        if old is not None and old.producer_id != entry.producer_id:
            self._pids.pop(old.producer_id, None)
        self.entries[tid] = entry
        self.entries.move_to_end(tid)
        self._pids[entry.producer_id] = tid

    def _forget(self, transactional_id: str) -> None:
        entry = self.entries.pop(transactional_id, None)
        if entry is not None:
            self._pids.pop(entry.producer_id, None)

    def owner_of(self, producer_id: int) -> str | None:
        """The transactional id `producer_id` is bound to, if any: its batches must be
        transactional, or they would slip past the last stable offset."""
        return self._pids.get(producer_id)

    def principal_of(self, producer_id: int) -> str | None:
        """The principal `producer_id` belongs to when it is bound to a transactional id:
        the one that initialized that id last (None when it is bound to none)."""
        tid = self._pids.get(producer_id)
        return None if tid is None else self.entries[tid].principal

    async def persist(
        self,
        entries: Iterable[TxnEntry],
        apps: Iterable[AppVersion] = (),
        removed: Iterable[str] = (),
        removed_apps: Iterable[str] = (),
    ) -> None:
        """Make the changes durable, then install them; OSError leaves memory unchanged.

        An id or app forgotten here (expired, evicted) is not locked: one that a request
        changes while this is synced was changed after it in `txn.wal` too, and stays."""
        entries, apps, removed = list(entries), list(apps), list(removed)
        body: list[Any] = [[e.encode() for e in entries], [a.encode() for a in apps], removed]
        removed_apps = list(removed_apps)
        if removed_apps:
            body.append(removed_apps)
        chosen = [(tid, self.entries.get(tid)) for tid in removed]
        chosen_apps = [(app_id, self.apps.get(app_id)) for app_id in removed_apps]
        await self.log.append(body)
        removed = [tid for tid, entry in chosen if self.entries.get(tid) is entry]
        removed_apps = [a for a, app in chosen_apps if self.apps.get(a) is app]
        self._apply(entries, apps, removed, removed_apps)

    def _write(self, entries: Iterable[TxnEntry], apps: Iterable[AppVersion] = ()) -> int:
        """Write the changes and install them at once, before they are durable; return
        the size `txn.wal` must reach on disk for them to be. OSError leaves memory
        unchanged.

        For the changes section 5 lets share an fsync round with what they allow (a
        partition add with its batch, a decision with its markers): the caller answers
        nothing that rests on them before `log.durable(end)` returns, and recovery copes
        with either side of the round lost (`recover`). And for COMPLETE, which is never
        synced for its own sake: recovery redoes it when it is lost."""
        entries, apps = list(entries), list(apps)
        end = self.log.write([[e.encode() for e in entries], [a.encode() for a in apps], []])
        self._apply(entries, apps, [], [])
        return end

    def _apply(
        self,
        entries: list[TxnEntry],
        apps: list[AppVersion],
        removed: list[str],
        removed_apps: list[str],
    ) -> None:
        for tid in removed:
            self._forget(tid)
        for entry in entries:
            self._install(entry)
            self.producer_ids.remember(entry.producer_id, entry.producer_epoch)
        for app in apps:
            self.apps[app.txn_app_id] = app
        for app_id in removed_apps:
            self.apps.pop(app_id, None)

    @asynccontextmanager
    async def _locked(self, ids: Iterable[str], apps: Iterable[str] = ()) -> AsyncIterator[None]:
        keys = sorted({("txn", i) for i in ids} | {("app", a) for a in apps})
        async with AsyncExitStack() as stack:
            for key in keys:
                # Taken without a yield when free: an EndTxn right behind its transaction's
                # last Produce then appends its markers before the fsync round the batches
                # started runs, and shares it.
                lock = self._locks.setdefault(key, anyio.Lock(fast_acquire=True))
                await stack.enter_async_context(lock)
                stack.callback(self._release, key, lock)
            # An id's end answered before its markers were synced is COMPLETE in memory
            # only: what comes next of the id is written after its COMPLETE record.
            await self._settled(i for kind, i in keys if kind == "txn")
            yield

    def _release(self, key: tuple[str, str], lock: anyio.Lock) -> None:
        # Runs before the lock itself is released (callbacks unwind first): drop it from
        # the table only when nobody else waits, so the table stays as small as the load.
        if lock.statistics().tasks_waiting == 0 and self._locks.get(key) is lock:
            del self._locks[key]

    def _next_ids(self, entry: TxnEntry, principal: str) -> tuple[int, int]:
        """The pid and epoch after `entry`'s: a new pid, `principal`'s, when the epoch
        would pass its maximum."""
        if entry.producer_epoch >= PRODUCER_EPOCH_MAX:
            return self.producer_ids.allocate(principal), 0
        return entry.producer_id, entry.producer_epoch + 1

    # ------------------------------------------------------------------ InitProducerId

    async def init_producer(
        self,
        transactional_id: str,
        timeout_ms: int | None,
        principal: str,
        *,
        classic: bool = False,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> tuple[int, int]:
        """InitProducerId for `transactional_id` by `principal` (allowed to write it), whose
        producer the id's becomes; `classic` from a Kafka client (`TxnEntry.classic`),
        which may name the producer it had (`reinit_refusal`); the retry of such a request
        whose answer was lost is answered the same (`repeated_init`)."""
        timeout = DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms
        limit = self.config.transaction_max_timeout_ms
        if not 1 <= timeout <= limit:
            raise CoordinatorError(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"transaction_timeout_ms={timeout} is not in "
                f"[1, transaction_max_timeout_ms={limit}]",
            )
        async with self._locked([transactional_id]):
            entry = self.entries.get(transactional_id)
            if classic:
                again = repeated_init(entry, producer_id, producer_epoch, principal)
                if again is not None:
                    return again
            refused = reinit_refusal(entry, producer_id, producer_epoch) if classic else None
            if refused is not None:
                raise CoordinatorError(refused.code, refused.message)
            if entry is not None and entry.state in DECIDED:
                entry = (await self.complete([entry]))[0]
            if entry is not None and entry.state in OPEN:
                entry = (await self.end_transactions([entry], False, "fenced"))[0]
            removed: list[str] = []
            if entry is None:
                removed = await self._make_room()
                pid, epoch = self.producer_ids.allocate(principal), 0
            else:
                pid, epoch = self._next_ids(entry, principal)
            named = (producer_id, producer_epoch) if classic and producer_id >= 0 else None
            new = initialized(
                entry,
                transactional_id,
                pid,
                epoch,
                timeout,
                now_ms(),
                principal,
                classic=classic,
                named=named,
            )
            await self.persist([new], removed=removed)
            return pid, epoch

    async def _make_room(self) -> list[str]:
        """Ids to forget so that one more fits under max_transactional_ids: the least
        recently used ended ones; CoordinatorError when every id held is open. An id
        whose end is still being settled is never one (forgotten, its decision would be
        gone from `txn.wal` before its markers are durable), but is waited for when too
        few others have ended; while it is, other ends may start settling."""
        while True:
            excess = len(self.entries) + 1 - self.config.max_transactional_ids
            if excess <= 0:
                return []
            victims = [
                tid
                for tid, e in self.entries.items()
                if e.state in ENDED and tid not in self._settling
            ][:excess]
            if len(victims) == excess or not self._settling:
                break
            await self._settled(list(self._settling))
        if len(victims) < excess:
            raise CoordinatorError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"max_transactional_ids={self.config.max_transactional_ids} ids are held "
                "and too few have ended; retry later",
            )
        return victims

    # ------------------------------------------------------------------ Produce

    def admit(
        self, transactional_id: str, batches: list[tuple[TopicPartition, BatchHeader]]
    ) -> tuple[dict[TopicPartition, tuple[ErrorCode, str]], set[TopicPartition], int]:
        """Judge the transactional batches of one Produce and make the transaction hold
        their partitions, written before any is appended. Returns the refused ones; of
        those, the ones of the transaction that just ended (a resend of one the log
        holds is answered as its duplicate, section 9); and the size `txn.wal` must
        reach on disk before the batches are answered (0: no change was written).

        The partition add shares the batches' fsync round (docs/protocol.md section 5):
        should the batch reach the disk and the add not, recovery adopts the batch into
        the transaction it carries the pid and epoch of. The caller holds
        `locked([transactional_id])` until it has appended them."""
        entry = self.entries.get(transactional_id)
        refused: dict[TopicPartition, tuple[ErrorCode, str]] = {}
        ended: set[TopicPartition] = set()
        admitted: set[TopicPartition] = set()
        for key, header in batches:
            verdict = admission(
                entry, transactional_id, header.producer_id, header.producer_epoch, Ask.BATCH
            )
            if isinstance(verdict, Refused):
                refused[key] = (verdict.code, verdict.message)
                if verdict.last_ended:
                    ended.add(key)
            elif entry is not None and (unadded := not_added(entry, key)) is not None:
                refused[key] = (unadded.code, unadded.message)
            else:
                admitted.add(key)
        if not admitted:
            return refused, ended, 0
        assert entry is not None
        end = 0
        held = entry.partitions if entry.state == ONGOING else frozenset()
        groups = len(entry.groups) if entry.state == ONGOING else 0
        if entry.state != ONGOING or not admitted <= held:
            limit = self.config.max_partitions_per_transaction
            if len(held | admitted) + groups > limit:
                message = (
                    "a transaction may hold at most "
                    f"max_partitions_per_transaction={limit} partitions and groups"
                )
                for key in admitted - held:
                    refused[key] = (ErrorCode.INVALID_TXN_STATE, message)
                admitted &= held
                if not admitted:
                    return refused, ended, 0
            try:
                end = self._write([with_partitions(entry, admitted - held, now_ms())])
                crash_point("txn_partitions_added")
            except OSError as exc:
                log.error("event=txn_log_write_failed id=%r error=%r", transactional_id, str(exc))
                for key in admitted:
                    refused[key] = (ErrorCode.KAFKA_STORAGE_ERROR, f"transaction log: {exc}")
        return refused, ended, end

    def locked(self, transactional_id: str) -> Any:
        """The lock a transactional Produce holds from admission to append, and a
        TxnOffsetCommit from judgement to its pending offsets being written."""
        return self._locked([transactional_id])

    # ------------------------------------------------------------------ AddPartitionsToTxn

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[TopicPartition],
        principal: str,
    ) -> dict[TopicPartition, tuple[ErrorCode, str]]:
        """A classic producer's AddPartitionsToTxn: the transaction holds `partitions`
        (it starts if none is open), durably, before the answer. Returns the partitions
        refused (a partition that does not exist); when any is, none is added, as Kafka
        does. CoordinatorError refuses the whole request (the producer's verdict, the
        limit, a storage failure)."""
        async with self._locked([transactional_id]):
            entry = self._classic(transactional_id, producer_id, producer_epoch, principal)
            missing = {
                key: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{key[0]}-{key[1]} does not exist")
                for key in partitions
                if self.topics.partition(*key) is None
            }
            if missing:
                return missing
            await self._add_classic(entry, set(partitions), None)
            return {}

    async def add_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        principal: str,
    ) -> None:
        """A classic producer's AddOffsetsToTxn: the transaction holds the group, durably,
        before its TxnOffsetCommit may write offsets of it (`add_group`)."""
        async with self._locked([transactional_id]):
            entry = self._classic(transactional_id, producer_id, producer_epoch, principal)
            await self._add_classic(entry, set(), group_id)

    def _classic(
        self, transactional_id: str, producer_id: int, producer_epoch: int, principal: str
    ) -> TxnEntry:
        """The classic entry the producer may add to; CoordinatorError otherwise."""
        self._admitted(transactional_id, producer_id, producer_epoch, Ask.ADD, principal=principal)
        entry = self.entries[transactional_id]
        if not entry.classic:
            raise CoordinatorError(
                ErrorCode.INVALID_TXN_STATE,
                f"transactional id {transactional_id!r} was initialized through the "
                "minibroker listener, whose transactions add what they write to",
            )
        return entry

    async def _add_classic(
        self, entry: TxnEntry, partitions: set[TopicPartition], group_id: str | None
    ) -> None:
        """Make the classic transaction hold `partitions` and the group, durably."""
        ongoing = entry.state == ONGOING
        held = entry.partitions if ongoing else frozenset()
        groups = entry.groups if ongoing else frozenset()
        new_groups = set() if group_id is None or group_id in groups else {group_id}
        if ongoing and partitions <= held and not new_groups:
            return
        limit = self.config.max_partitions_per_transaction
        if len(held | partitions) + len(groups | new_groups) > limit:
            raise CoordinatorError(
                ErrorCode.INVALID_TXN_STATE,
                "a transaction may hold at most "
                f"max_partitions_per_transaction={limit} partitions and groups",
            )
        stamp = now_ms()
        added = with_partitions(entry, partitions - held, stamp)
        for group in new_groups:
            added = with_group(added, group, stamp)
        try:
            await self.persist([added])
        except OSError as exc:
            log.error("event=txn_log_write_failed id=%r error=%r", entry.transactional_id, str(exc))
            raise CoordinatorError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"transaction log: {exc}"
            ) from exc
        crash_point("txn_partitions_added" if partitions - held else "txn_group_added")

    # ------------------------------------------------------------------ TxnOffsetCommit

    def judge_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, principal: str
    ) -> None:
        """Raise CoordinatorError unless `principal`'s producer may add offsets to its
        transaction: the fencing verdicts of EndTxn, and the states a transactional batch
        is refused in."""
        self._admitted(
            transactional_id, producer_id, producer_epoch, Ask.OFFSETS, principal=principal
        )

    def add_group(self, transactional_id: str, group_id: str) -> int:
        """Make the transaction hold the group (it starts the transaction if none is open),
        written, not synced: return the size `txn.wal` must reach on disk for it to be (0:
        the group was held already). The caller holds `locked` and had the producer
        judged; the TxnOffsetCommit's answer waits for its pending offsets alone, which
        carry the producer's pid and epoch, so recovery adopts the group should this
        record be lost (`recover`), and the next round of `txn.wal` takes it."""
        entry = self.entries[transactional_id]
        if entry.state == ONGOING and group_id in entry.groups:
            return 0
        if entry.classic:
            # Its AddOffsetsToTxn adds the group; without it the offsets of an ended
            # transaction (its epoch did not move) would start a new one.
            raise CoordinatorError(
                ErrorCode.INVALID_TXN_STATE,
                f"group {group_id!r} is not in the open transaction of {transactional_id!r}: "
                "AddOffsetsToTxn comes first",
            )
        limit = self.config.max_partitions_per_transaction
        if entry.state == ONGOING and len(entry.partitions) + len(entry.groups) >= limit:
            raise CoordinatorError(
                ErrorCode.INVALID_TXN_STATE,
                "a transaction may hold at most "
                f"max_partitions_per_transaction={limit} partitions and groups",
            )
        try:
            end = self._write([with_group(entry, group_id, now_ms())])
        except OSError as exc:
            log.error("event=txn_log_write_failed id=%r error=%r", transactional_id, str(exc))
            raise CoordinatorError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"transaction log: {exc}"
            ) from exc
        crash_point("txn_group_added")
        return end

    async def durable(self, end: int) -> None:
        """Return once `txn.wal` is on disk up to `end` (a change `_write` wrote)."""
        await self.log.durable(end)

    def sync_soon(self, end: int, then: Callable[[], object] = lambda: None) -> None:
        """Start syncing `txn.wal` up to `end` now, in the background, and call `then`
        once it is on disk (not if the sync fails, which whoever waits for `end` learns
        too). For an acks=1 partition add, whose Produce answer waits for it: the
        connection's writer may come to that answer only after the requests behind it
        (an EndTxn's round) ran. For a one-round commit's decision, behind its answer."""
        if self.log.is_durable(end):
            then()
            return
        if self._settlers is None:
            return
        self._syncs_behind += 1
        self._behind.append((end, then))
        assert self._behind_wake is not None  # set with `_settlers`
        self._behind_wake.set()

    async def _sync_behind(self) -> None:
        """`sync_soon`'s syncs, one round for what asked meanwhile: a task of its own
        rather than one per call, which cost trio 40-50 µs on a commit's path before
        its answer."""
        while True:
            if not self._behind:
                wake = self._behind_wake = anyio.Event()
                await wake.wait()
            asked, self._behind = self._behind, []
            try:
                await self.log.durable(max(end for end, _ in asked))
                for _, then in asked:
                    then()
            except OSError as exc:
                log.error("event=txn_log_sync_failed error=%r", str(exc))
            finally:
                self._syncs_behind -= len(asked)

    def is_durable(self, end: int) -> bool:
        """Whether `txn.wal` is on disk up to `end` already (0: nothing was written)."""
        return self.log.is_durable(end)

    # ------------------------------------------------------------------ ending

    async def end_txn(self, req: m.EndTxnRequest, principal: str) -> m.EndTxnResponse:
        async with self._locked([req.transactional_id]):
            verdict = self._admitted(
                req.transactional_id,
                req.producer_id,
                req.producer_epoch,
                Ask.END,
                committed=req.committed,
                principal=principal,
            )
            entry = self.entries[req.transactional_id]
            if verdict is Admitted.RETRY:
                last = entry.last_ended
                assert last is not None
                if entry.state in DECIDED:
                    await self.complete([entry])
                return m.EndTxnResponse(
                    producer_id=last.next_producer_id, producer_epoch=last.next_producer_epoch
                )
            if verdict is Admitted.FINISH_FIRST:
                entry = (await self.complete([entry]))[0]
                if entry.classic:
                    # Its epoch did not move: the end just finished may be the one asked.
                    self._admitted(
                        req.transactional_id,
                        req.producer_id,
                        req.producer_epoch,
                        Ask.END,
                        committed=req.committed,
                        principal=principal,
                    )
            if req.last_sequences is not None:
                missing = self._batches_missing(entry, req.last_sequences)
                if missing is not None:
                    raise CoordinatorError(ErrorCode.CONCURRENT_TRANSACTIONS, missing)
            ended = (
                await self.end_transactions([entry], req.committed, "client", settle_later=True)
            )[0]
            return m.EndTxnResponse(
                producer_id=ended.producer_id, producer_epoch=ended.producer_epoch
            )

    def _batches_missing(self, entry: TxnEntry, wanted: list[m.TxnLastSequences]) -> str | None:
        """Why the transaction's batches are not all in the log up to EndTxn's
        `last_sequences`, or None when they are. A pid and epoch name one transaction
        and sequences are in order per partition, so the producer's newest batch there
        ending at the named sequence means every one before it was written too."""
        held = entry.partitions if entry.state == ONGOING else frozenset()
        pid, epoch = entry.producer_id, entry.producer_epoch
        for t in wanted:
            for p in t.partitions:
                partition = self.topics.partition(t.topic, p.partition)
                last = None
                if (t.topic, p.partition) in held and partition is not None:
                    last = partition.producers.last_sequence(pid)
                if last != (epoch, p.last_sequence):
                    seen = "none" if last is None or last[0] != epoch else str(last[1])
                    return (
                        f"{t.topic}-{p.partition}: the transaction's batches up to sequence "
                        f"{p.last_sequence} are not all written (the last written: {seen}); "
                        "wait for the Produce answers, then retry or abort"
                    )
        return None

    async def prepare_txn(self, req: m.PrepareTxnRequest, principal: str) -> m.PrepareTxnResponse:
        limit = self.config.transaction_max_prepared_ms
        if not 1 <= req.prepared_timeout_ms <= limit:
            raise CoordinatorError(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"prepared_timeout_ms={req.prepared_timeout_ms} is not in "
                f"[1, transaction_max_prepared_ms={limit}]",
            )
        app_ids = [] if req.txn_app_id is None else [req.txn_app_id]
        async with self._locked([req.transactional_id], app_ids):
            self._admitted(
                req.transactional_id,
                req.producer_id,
                req.producer_epoch,
                Ask.PREPARE,
                principal=principal,
            )
            entry = self.entries[req.transactional_id]
            recorded = self.apps.get(req.txn_app_id) if req.txn_app_id is not None else None
            if (
                recorded is not None
                and req.txn_app_version is not None
                and req.txn_app_version <= recorded.txn_app_version
            ):
                # A late writer of a finished write (a Spark task still running after the
                # driver committed or aborted): its transaction can never be committed, so
                # it must not hold the last stable offset until its prepared timeout.
                if entry.state in OPEN:
                    await self.end_transactions([entry], False, "client")
                raise CoordinatorError(
                    ErrorCode.INVALID_TXN_STATE,
                    f"app {req.txn_app_id!r} has version {recorded.txn_app_version} recorded, "
                    f"at or above {req.txn_app_version}: nothing more is committed under it; "
                    "the transaction was aborted",
                )
            if entry.state == PREPARED:
                return m.PrepareTxnResponse()
            # PREPARED promises that a CommitTxns commits the batches and offsets: they
            # go to disk first.
            await self._contents_durable([entry])
            stamp = now_ms()
            await self.persist([prepared(entry, stamp + req.prepared_timeout_ms, stamp)])
            crash_point("txn_prepared")
            return m.PrepareTxnResponse()

    def _admitted(
        self,
        transactional_id: str,
        pid: int,
        epoch: int,
        ask: Ask,
        *,
        committed: bool | None = None,
        principal: str | None = None,
    ) -> Admitted:
        """`admission`'s verdict on the id's entry; CoordinatorError when it refuses."""
        verdict = admission(
            self.entries.get(transactional_id),
            transactional_id,
            pid,
            epoch,
            ask,
            committed=committed,
            principal=principal,
        )
        if isinstance(verdict, Refused):
            raise CoordinatorError(verdict.code, verdict.message)
        return verdict

    async def commit_txns(self, req: m.CommitTxnsRequest) -> m.CommitTxnsResponse:
        ids = [t.transactional_id for t in req.transactions]
        app_ids = [] if req.txn_app_id is None else [req.txn_app_id]
        async with self._locked(ids, app_ids):
            recorded = self.apps.get(req.txn_app_id) if req.txn_app_id is not None else None
            if (
                recorded is not None
                and req.txn_app_version is not None
                and (req.txn_app_version <= recorded.txn_app_version)
            ):
                return await self._already_committed(req, recorded)
            results: list[m.TxnResult] = []
            to_end: list[TxnEntry] = []
            to_finish: list[TxnEntry] = []
            for ref in req.transactions:
                try:
                    verdict = self._admitted(
                        ref.transactional_id,
                        ref.producer_id,
                        ref.producer_epoch,
                        Ask.COMMIT_TXNS,
                        committed=req.committed,
                    )
                    entry = self.entries[ref.transactional_id]
                    if verdict is Admitted.PROCEED:
                        to_end.append(entry)
                    elif entry.state in DECIDED:
                        to_finish.append(entry)
                    results.append(m.TxnResult(ref.transactional_id))
                except CoordinatorError as exc:
                    results.append(m.TxnResult(ref.transactional_id, exc.code, exc.message))
            failed = next((r for r in results if r.error), None)
            if failed is not None:
                return m.CommitTxnsResponse(
                    error=failed.error,
                    message=f"nothing ended: {failed.transactional_id!r}: {failed.message}",
                    txn_app_version=-1 if recorded is None else recorded.txn_app_version,
                    transactions=results,
                )
            app = None
            if req.txn_app_id is not None and req.txn_app_version is not None:
                app = AppVersion(req.txn_app_id, req.txn_app_version, now_ms())
            if to_finish:
                await self.complete(to_finish)
            if to_end:
                await self.end_transactions(to_end, req.committed, "client", app)
            elif app is not None:
                await self.persist([], [app])
            return m.CommitTxnsResponse(
                txn_app_version=app.txn_app_version
                if app is not None
                else (-1 if recorded is None else recorded.txn_app_version),
                transactions=results,
            )

    async def _already_committed(
        self, req: m.CommitTxnsRequest, recorded: AppVersion
    ) -> m.CommitTxnsResponse:
        """The app's version is already recorded: a re-run micro-batch. Nothing commits;
        what the re-run left open is aborted."""
        still_open = [
            entry
            for ref in req.transactions
            if (entry := self.entries.get(ref.transactional_id)) is not None
            and (entry.producer_id, entry.producer_epoch) == (ref.producer_id, ref.producer_epoch)
            and entry.state in OPEN
        ]
        if still_open:
            await self.end_transactions(still_open, False, "client")
        return m.CommitTxnsResponse(
            already_committed=True,
            txn_app_version=recorded.txn_app_version,
            transactions=[m.TxnResult(ref.transactional_id) for ref in req.transactions],
        )

    async def end_transactions(
        self,
        entries: list[TxnEntry],
        committed: bool,
        cause: str,
        app: AppVersion | None = None,
        *,
        settle_later: bool = False,
    ) -> list[TxnEntry]:
        """Decide `entries` in one durable record (with `app`), then complete them
        (`complete`, which `settle_later` lets return before their markers are synced)."""
        await self._previous_ends_durable(entries)
        if committed and settle_later and app is None:
            one_round = await self._commit_in_one_round(entries)
            if one_round is not None:
                return one_round
        if committed:
            await self._contents_durable(entries)
            crash_point("txn_contents_durable")
        stamp = now_ms()
        by_client = cause == "client"
        decisions = [
            decided(
                e,
                committed,
                # A classic producer keeps its epoch across the ends it asks for (it
                # never learns of a new one); the broker's ends fence it all the same.
                (e.producer_id, e.producer_epoch)
                if e.classic and by_client
                else self._next_ids(e, e.principal),
                stamp,
                by_client=by_client,
            )
            for e in entries
        ]
        # Written, not yet synced: the decision shares its fsync round with the markers
        # (docs/protocol.md section 5), which `complete` waits for together.
        self._write(decisions, [] if app is None else [app])
        crash_point("txn_decided")
        for before in entries:
            if before.state in OPEN:
                if committed:
                    self.counters.commits += 1
                else:
                    self.counters.aborts[cause] += 1
                # One per transaction: DEBUG; INFO has log_summaries' count instead.
                log.debug(
                    "event=txn_decided id=%r committed=%s cause=%s partitions=%d",
                    before.transactional_id,
                    committed,
                    cause,
                    len(before.partitions),
                )
        return await self.complete(decisions, settle_later=settle_later)

    async def _commit_in_one_round(self, entries: list[TxnEntry]) -> list[TxnEntry] | None:
        """EndTxn's commit in one fsync round before the answer, where `end_transactions`
        waits for two (the batches', then the decision's), for a transaction that wrote
        to one partition: its COMMIT marker goes right behind its batches in the segment
        holding them, so the segment's round makes them durable together and the marker
        decides the transaction (`recover` reads it); the decision, COMPLETE already, is
        written after that round and synced behind the answer. A transaction holding
        groups' offsets has them durable first (they are, once its TxnOffsetCommit was
        answered; they hold its groups for it, `recover`), and its groups' marker
        written and in force before the answer, synced behind it before COMPLETE is
        written (`_settle_one_round`). None, nothing done, for any other transaction,
        or when the marker could not share its batches' segment (docs/transactions.md)."""
        if len(entries) != 1 or self._settlers is None:
            return None
        entry = entries[0]
        if (
            entry.state != ONGOING
            or entry.classic
            or len(entry.partitions) != 1
            or entry.producer_epoch >= PRODUCER_EPOCH_MAX
        ):
            return None
        [(topic, index)] = entry.partitions
        partition = self.topics.partition(topic, index)
        pid, epoch = entry.producer_id, entry.producer_epoch
        if partition is None or not partition.producers.in_txn(pid):
            return None
        if entry.groups:
            # Once the marker is durable it commits the offsets, at recovery too: the
            # pending offsets come first (they hold the groups for the entry, `recover`).
            await self.offsets.settled(entry.groups)
        offset = partition.append_commit_first(pid, epoch, now_ms())
        if offset is None:
            return None
        crash_point("txn_marker_written")
        # The partition's add may not be durable yet (an acks=-1 batch's answer does not
        # wait for it): lost, recovery adopts the partition by the marker, which names
        # the entry's pid and epoch; the COMPLETE synced behind the answer takes it.
        self.committer.request_flush(partition, batches=1)
        failures: list[Exception] = []
        try:
            await self._markers_durable([(partition, offset)], failures)
        finally:
            self.on_markers()
        # The marker decided the transaction when it was written: a failed round leaves
        # it decided, for the sweep to complete once the segment syncs, as `complete` does.
        decision = decided(entry, True, self._next_ids(entry, entry.principal), now_ms())
        self.counters.commits += 1
        if failures:
            self._write_or_install(decision)
            raise StorageError(f"the commit's round failed: {failures[0]}")
        crash_point("txn_markers_durable")
        done = completed(decision, now_ms())
        if entry.groups:
            return [await self._groups_then_settle(decision, done, partition, self._settlers)]
        self._complete_one_round(done, partition, pid, epoch)
        return [done]

    def _complete_one_round(
        self, done: TxnEntry, partition: Partition, pid: int, epoch: int
    ) -> None:
        """Write a one-round commit's COMPLETE, synced behind the answer: until then its
        marker decides it."""
        end = self._write_or_install(done)
        # Until `txn.wal` holds the decision on disk, the marker decides it; should the
        # write have failed, the id's state is written before its next marker.
        self._one_round_ends[done.transactional_id] = end or UNWRITTEN
        if end:
            self.sync_soon(
                end,
                functools.partial(
                    self._one_round_synced, done.transactional_id, end, partition, pid, epoch
                ),
            )

    async def _groups_then_settle(
        self,
        decision: TxnEntry,
        done: TxnEntry,
        partition: Partition,
        settlers: anyio.abc.TaskGroup,
    ) -> TxnEntry:
        """A one-round commit holding groups, its marker durable: the groups' marker
        written and in force, the entry COMPLETE in memory, and `_settle_one_round`
        started, which the id's next request waits for (`_locked`). Should the groups'
        marker not be written, StorageError, and the decision is written for the sweep
        to complete."""
        pid, epoch = decision.marker_ids()
        try:
            groups_end = await self.offsets.write_markers_now([(pid, epoch, decision.groups, True)])
        except OSError as exc:
            self._write_or_install(decision)
            raise StorageError(f"the groups' marker could not be written: {exc}") from exc
        self._apply([done], [], [], [])
        settled = anyio.Event()
        self._settling[done.transactional_id] = settled
        settlers.start_soon(self._settle_one_round, decision, done, partition, groups_end, settled)
        return done

    async def _settle_one_round(
        self,
        decision: TxnEntry,
        done: TxnEntry,
        partition: Partition,
        groups_end: int,
        settled: anyio.Event,
    ) -> None:
        """`_groups_then_settle`'s end: the groups' marker synced, then COMPLETE written
        (a COMPLETE on disk before the groups' marker would leave the pending offsets to
        no transaction, and recovery would drop them). A failed sync writes the
        decision instead, for the sweep to complete (the marker decides until then)."""
        tid = done.transactional_id
        pid, epoch = decision.marker_ids()
        try:
            if groups_end:
                await self.offsets.durable(groups_end)
            crash_point("txn_group_markers_durable")
            self._complete_one_round(done, partition, pid, epoch)
        except OSError as exc:
            log.error("event=txn_markers_sync_failed ids=%r error=%r", [tid], str(exc))
            end = self._write_or_install(decision)
            self._one_round_ends[tid] = end or UNWRITTEN
        finally:
            if self._settling.get(tid) is settled:
                del self._settling[tid]
            settled.set()

    def _one_round_synced(
        self, transactional_id: str, end: int, partition: Partition, pid: int, epoch: int
    ) -> None:
        """A one-round commit's COMPLETE is on disk: `txn.wal` decides it from now on."""
        if self._one_round_ends.get(transactional_id) == end:
            del self._one_round_ends[transactional_id]
        partition.producers.forget_marker(pid, epoch)

    async def _previous_ends_durable(self, entries: list[TxnEntry]) -> None:
        """Return once the previous one-round commit of each of `entries`' ids is on disk
        in `txn.wal` (StorageError if it cannot be). Its marker decides it until then, and
        a partition remembers one marker per producer: a marker of the id's next
        transaction written before would replace it, and after a power loss that kept
        the new marker and lost the old COMPLETE nothing would decide the old one."""
        ends = self._one_round_ends
        for e in entries:
            end = ends.get(e.transactional_id)
            if end is None:
                continue
            try:
                if end == UNWRITTEN:
                    # Any record of the id's state now says the commit ended.
                    end = self._write([e])
                await self.log.durable(end)
            except OSError as exc:
                raise StorageError(f"the previous commit's record is not durable: {exc}") from exc
            ends.pop(e.transactional_id, None)

    def _write_or_install(self, entry: TxnEntry) -> int:
        """`_write` the entry; when the write fails, install it all the same, since a
        durable marker decided it (recovery reads the outcome there): 0 then."""
        try:
            return self._write([entry])
        except OSError as exc:
            log.error("event=txn_write_failed id=%r error=%r", entry.transactional_id, str(exc))
            self._apply([entry], [], [], [])
            return 0

    async def _contents_durable(self, entries: list[TxnEntry]) -> None:
        """Return once every batch and pending offset of the open `entries` is on disk;
        StorageError if a round fails, nothing decided. The decision and the markers may
        share one fsync round, but not with what they commit: after a power loss, a
        decision or one partition's marker that outlived a batch or the offsets would
        commit the transaction without them (and a PREPARED record, a transaction whose
        commit cannot have them). The producer's acks=-1 and TxnOffsetCommit answers
        have made this so already, unless EndTxn came right behind its batches
        (`last_sequences`), after acks=1 ones, or before an offsets answer."""
        open_entries = [e for e in entries if e.state in OPEN]
        waits: list[tuple[Partition, int]] = []
        for entry in open_entries:
            for topic, index in entry.partitions:
                partition = self.topics.partition(topic, index)
                if partition is None or not partition.producers.in_txn(entry.producer_id):
                    continue
                end = partition.log.log_end_offset
                if partition.log.flushed_offset < end:
                    # Asked for all at once, so that one round syncs every partition.
                    self.committer.request_flush(partition)
                    waits.append((partition, end - 1))
        try:
            for partition, last in waits:
                await self.committer.wait_durable(partition, last)
        except FlushFailed as exc:
            raise StorageError(str(exc)) from exc
        groups = {g for entry in open_entries for g in entry.groups}
        if groups:
            await self.offsets.settled(groups)

    async def complete(
        self, entries: list[TxnEntry], *, settle_later: bool = False
    ) -> list[TxnEntry]:
        """Write the markers of the decided `entries`, wait until they and every change
        written to `txn.wal` before them (the decisions) are durable, in one fsync round,
        then record the entries COMPLETE. Raises OSError or StorageError (the entries stay
        decided) on a storage failure.

        Sharing the round is safe because a marker is only ever written for a decided
        transaction: should a marker reach the disk and its decision not, recovery finds
        the marker and decides the transaction by it (`recover`). The groups' markers in
        `groups/offsets.wal` are the exception: they wait for the decision, since nothing
        in recovery would read an outcome from them.

        `settle_later` (EndTxn) returns once the decisions are durable and every marker
        is written, partitions' and groups', and in force (docs/protocol.md section 5):
        from then on recovery writes any marker a crash lost, from the decision. The
        markers' round and COMPLETE follow in `_settle`, while the id's next request
        waits for them in `_locked`. So the answer costs the decision's fsync alone,
        not the markers' too nor the groups' round after it."""
        decisions_end = self.log.size_bytes
        pending = [e for e in entries if e.state in DECIDED]
        if any(e.classic for e in pending):
            # A classic transaction's markers carry the same pid and epoch as the next
            # transaction's batches, so recovery could not tell which one a marker whose
            # decision was lost ends: its decision is durable before any marker is written.
            await self.log.durable(decisions_end)
        written = self._append_markers(pending)
        groups = [
            (*e.marker_ids(), e.groups, e.state == PREPARE_COMMIT) for e in pending if e.groups
        ]
        if settle_later and pending and self._settlers is not None:
            return await self._answer_then_settle(
                entries, pending, written, groups, decisions_end, self._settlers
            )
        # Collected rather than raised inside the task group, which would wrap them.
        failures: list[Exception] = []

        async def decisions_then_groups() -> None:
            try:
                await self.log.durable(decisions_end)
                if groups:
                    await self.offsets.write_markers(groups)
            except OSError as exc:
                failures.append(exc)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(decisions_then_groups)
                await self._markers_durable(written, failures)
        finally:
            if written:
                self.on_markers()
        if failures:
            raise failures[0]
        self._forget_markers(pending)
        if not pending:
            return entries
        return self._completed(entries, pending)

    def _append_markers(self, pending: list[TxnEntry]) -> list[tuple[Partition, int]]:
        """Append the COMMIT or ABORT marker of each decided entry wherever its
        transaction wrote and has no marker yet, each partition's sync requested; return
        what must be durable before COMPLETE: those markers, and the end of every other
        partition of theirs not synced to its end, which may hold a marker written
        before (by a round that failed, or before a kill -9 left it in the page cache)."""
        stamp = now_ms()
        written: list[tuple[Partition, int]] = []
        for entry in pending:
            pid, epoch = entry.marker_ids()
            for topic, index in sorted(entry.partitions):
                partition = self.topics.partition(topic, index)
                if partition is None:
                    continue
                if not partition.producers.in_txn_at(pid, epoch):
                    # No batch of the transaction landed here, or its marker did before
                    # (the producer's next transaction may be open here since): none is
                    # due, but one written may not be durable yet.
                    last = partition.log.log_end_offset - 1
                    if partition.log.flushed_offset <= last:
                        written.append((partition, last))
                        self.committer.request_flush(partition)
                    continue
                offset = partition.append_marker(pid, epoch, entry.state == PREPARE_COMMIT, stamp)
                crash_point("txn_marker_written")
                written.append((partition, offset))
                self.committer.request_flush(partition, batches=1)
        return written

    async def _markers_durable(
        self, written: list[tuple[Partition, int]], failures: list[Exception]
    ) -> None:
        """Wait for the partitions' markers `written`; a failed round goes to `failures`."""
        try:
            for partition, offset in written:
                await self.committer.wait_durable(partition, offset)
        except FlushFailed as exc:
            failures.append(StorageError(str(exc)))

    def _forget_markers(self, pending: list[TxnEntry]) -> None:
        """The decisions are durable: txn.wal decides the transactions from now on, so
        their partitions no longer keep their markers (written now or before a crash or
        a failed round) for recovery."""
        for entry in pending:
            pid, epoch = entry.marker_ids()
            for topic, index in entry.partitions:
                partition = self.topics.partition(topic, index)
                if partition is not None:
                    partition.producers.forget_marker(pid, epoch)

    def _completed(self, entries: list[TxnEntry], pending: list[TxnEntry]) -> list[TxnEntry]:
        """Record the decided `pending` COMPLETE: every marker of theirs is durable."""
        crash_point("txn_markers_durable")
        done = {e.transactional_id: completed(e, now_ms()) for e in pending}
        # Not fsynced: lost, the entry is still decided and recovery completes it again,
        # finding its markers written (in_txn is false) and writing none twice.
        self._write(done.values())
        return [done.get(e.transactional_id, e) for e in entries]

    async def _answer_then_settle(
        self,
        entries: list[TxnEntry],
        pending: list[TxnEntry],
        written: list[tuple[Partition, int]],
        groups: list[tuple[int, int, frozenset[str], bool]],
        decisions_end: int,
        settlers: anyio.abc.TaskGroup,
    ) -> list[TxnEntry]:
        """`complete(settle_later=True)` up to the answer: the decisions durable, the
        groups' markers written, the entries COMPLETE in memory (what ListTransactions
        and the id's next request see) while `txn.wal` still holds them decided until
        `_settle` has their markers synced. Raises as `complete` does, nothing left to
        settle (the sweep completes the entries)."""
        try:
            await self.log.durable(decisions_end)
            self._forget_markers(pending)
            groups_end = await self.offsets.write_markers_now(groups) if groups else 0
        finally:
            if written:
                self.on_markers()
        stamp = now_ms()
        done = {e.transactional_id: completed(e, stamp) for e in pending}
        self._apply(list(done.values()), [], [], [])
        settled = anyio.Event()
        for tid in done:
            self._settling[tid] = settled
        settlers.start_soon(self._settle, pending, done, written, groups_end, settled)
        return [done.get(e.transactional_id, e) for e in entries]

    async def _settle(
        self,
        pending: list[TxnEntry],
        done: dict[str, TxnEntry],
        written: list[tuple[Partition, int]],
        groups_end: int,
        settled: anyio.Event,
    ) -> None:
        """The end of `_answer_then_settle`'s transactions: their markers synced (the
        partitions' and the groups' rounds at once), then COMPLETE written. A failed
        round puts the decided entries back in memory, for the sweep to complete, as
        `complete` leaves them."""
        failures: list[Exception] = []

        async def groups_durable() -> None:
            try:
                await self.offsets.durable(groups_end)
            except OSError as exc:
                failures.append(exc)

        try:
            async with anyio.create_task_group() as tg:
                if groups_end:
                    tg.start_soon(groups_durable)
                await self._markers_durable(written, failures)
            # Nothing else of these ids ran meanwhile (`_locked`, `_make_room` and the
            # sweep wait for `settled`), so memory still holds what `done` installed.
            if failures:
                log.error(
                    "event=txn_markers_sync_failed ids=%r error=%r", sorted(done), str(failures[0])
                )
                for entry in pending:
                    self._install(entry)
                return
            crash_point("txn_markers_durable")
            # Not fsynced, as in `_completed`.
            self._write(done.values())
        except Exception:
            # A write that fails here (the log refuses after a failed sync) must not end
            # the coordinator's tasks: the markers are durable, and recovery completes
            # the entries still decided in `txn.wal`.
            log.exception("event=txn_settle_failed")
        finally:
            for tid in done:
                if self._settling.get(tid) is settled:
                    del self._settling[tid]
            settled.set()

    async def _settled(self, transactional_ids: Iterable[str]) -> None:
        """Return once none of these ids' ends is still being settled."""
        for tid in transactional_ids:
            settling = self._settling.get(tid)
            if settling is not None:
                await settling.wait()

    # ------------------------------------------------------------------ housekeeping

    async def run(self) -> None:
        """Abort transactions past their deadline, finish decided ones, forget old ids;
        and settle the ends answered before their markers were synced (`_settle`)."""
        async with anyio.create_task_group() as settlers:
            self._settlers = settlers
            self._behind_wake = anyio.Event()
            settlers.start_soon(self._sync_behind)
            try:
                while True:
                    await anyio.sleep(
                        self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
                        / 1000
                    )
                    try:
                        await self.sweep(now_ms())
                    except Exception:
                        # A disk that fails under a marker must not stop the sweeps: the
                        # decided transactions stay decided and the next sweep tries again.
                        log.exception("event=txn_sweep_failed")
            finally:
                self._settlers = None

    async def log_summaries(self) -> None:
        """Every log_summary_interval_ms, and at shutdown, one INFO line counting the
        transactions committed and aborted since the last one, when there were any: a
        busy broker ends hundreds of transactions a minute, too many for a line each."""
        last = self._summary(None)
        try:
            while True:
                await anyio.sleep(self.config.log_summary_interval_ms / 1000)
                last = self._summary(last)
        finally:
            self._summary(last)

    def _summary(self, last: tuple[int, int, float] | None) -> tuple[int, int, float]:
        """Log what ended since `last` (commits, aborts, when), if anything; return now's."""
        now = (self.counters.commits, self.counters.aborts.total(), time.monotonic())
        if last is not None and now[:2] != last[:2]:
            log.info(
                "event=txn_summary seconds=%d committed=%d aborted=%d",
                round(now[2] - last[2]),
                now[0] - last[0],
                now[1] - last[1],
            )
        return now

    async def sweep(self, stamp: int) -> None:
        for tid, entry in list(self.entries.items()):
            deadline = entry.deadline_ms
            if entry.state in DECIDED or (deadline is not None and deadline <= stamp):
                async with self._locked([tid]):
                    current = self.entries.get(tid)
                    if current is None:
                        continue
                    if current.state in DECIDED:
                        await self.complete([current])
                    elif current.deadline_ms is not None and current.deadline_ms <= stamp:
                        log.info("event=txn_timed_out id=%r state=%s", tid, current.state)
                        await self.end_transactions([current], False, "timeout")
        expiration = self.config.transactional_id_expiration_ms
        busy = self._locks_held()
        expired = [
            tid
            for tid, e in self.entries.items()
            if e.state in ENDED
            and e.updated_ms + expiration < stamp
            and tid not in busy
            and tid not in self._settling
        ]
        # An app version is bounded the same way: forgetting it lets a micro-batch re-run
        # after that long commit again (docs/transactions.md, Limits), but keeping every
        # one would grow without bound, as each Spark batch write records one.
        busy_apps = {name for kind, name in self._locks if kind == "app"}
        expired_apps = [
            name
            for name, app in self.apps.items()
            if app.committed_ms + expiration < stamp and name not in busy_apps
        ]
        if expired or expired_apps:
            await self.persist([], removed=expired, removed_apps=expired_apps)
            log.info("event=txn_ids_expired ids=%d apps=%d", len(expired), len(expired_apps))
        # Only with no lock held: a change written and synced is installed in memory by
        # its task after the sync, and a compaction before that would drop it.
        # Nor while an end is being settled: the state in memory says COMPLETE before
        # the markers are durable, which only `txn.wal`'s decision may say. Nor while a
        # task waits for `txn.wal` to reach a size the compacted file may not have.
        if (
            not self._locks
            and not self._settling
            and not self._syncs_behind
            and self.log.wants_compaction()
        ):
            self.log.compact([self._whole_state()])

    def _locks_held(self) -> set[str]:
        return {tid for kind, tid in self._locks if kind == "txn"}

    def _whole_state(self) -> list[Any]:
        return [
            [e.encode() for e in self.entries.values()],
            [a.encode() for a in self.apps.values()],
            [],
        ]

    async def recover(self) -> None:
        """Before serving: finish what a crash left (broker/transactions/recovery.py)."""
        await recover(self, now_ms())

    # ------------------------------------------------------------------ listing

    def list_transactions(self, req: m.ListTransactionsRequest) -> m.ListTransactionsResponse:
        prefix = req.transactional_id_prefix or ""
        states = None if req.states is None else set(req.states)
        out = []
        for tid in sorted(self.entries):
            entry = self.entries[tid]
            if not tid.startswith(prefix) or (states is not None and entry.state not in states):
                continue
            out.append(_listing(entry))
        return m.ListTransactionsResponse(transactions=out)

    def describe_transactions(self, ids: Iterable[str]) -> list[m.TransactionListing | None]:
        """Each id's transaction as ListTransactions lists it (None: an unknown id)."""
        return [None if (e := self.entries.get(tid)) is None else _listing(e) for tid in ids]

    def describe_apps(self, req: m.DescribeTxnAppsRequest) -> m.DescribeTxnAppsResponse:
        names = sorted(self.apps) if req.txn_app_ids is None else req.txn_app_ids
        return m.DescribeTxnAppsResponse(
            apps=[
                m.TxnApp(a.txn_app_id, a.txn_app_version, a.committed_ms)
                for name in names
                if (a := self.apps.get(name)) is not None
            ]
        )

    def stats(self) -> TxnStats:
        """For the metrics scrape."""
        return TxnStats(
            Counter(e.state for e in self.entries.values()),
            self.counters.commits,
            dict(self.counters.aborts),
            self.oldest_open_ms(),
        )

    def oldest_open_ms(self) -> dict[TopicPartition, int]:
        """Per partition, when its oldest open transaction started: the LSO lag."""
        oldest: dict[TopicPartition, int] = {}
        for entry in self.entries.values():
            if entry.state in OPEN or entry.state in DECIDED:
                for key in entry.partitions:
                    if entry.started_ms >= 0:
                        oldest[key] = min(oldest.get(key, entry.started_ms), entry.started_ms)
        return oldest

    def close(self) -> None:
        self.log.close()


def _listing(entry: TxnEntry) -> m.TransactionListing:
    by_topic: dict[str, list[int]] = {}
    for topic, index in sorted(entry.partitions):
        by_topic.setdefault(topic, []).append(index)
    return m.TransactionListing(
        entry.transactional_id,
        entry.producer_id,
        entry.producer_epoch,
        entry.state,
        entry.started_ms,
        entry.timeout_ms,
        [m.TxnTopicPartitions(t, ps) for t, ps in by_topic.items()],
    )
