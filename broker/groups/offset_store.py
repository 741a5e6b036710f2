"""Committed consumer offsets: OffsetCommit, OffsetFetch, TxnOffsetCommit, the markers
of transactions that hold offsets, retention, and `<data_dir>/groups/offsets.wal`
(docs/protocol.md section 6, docs/consumer-groups.md "Committed offsets").

The state and its records are pure (broker/groups/offset_state.py); this module orders
the IO around them. Every change that is answered is written to the log and
fdatasynced (broker/storage/record_log.py, shared rounds) before it is answered, and
most before they are installed in memory. Two are in force once written: a
TxnOffsetCommit's pending offsets, whose answer waits for the round while its
connection runs the requests behind it, and a transaction's markers written behind
its durable decision. Changes of one group are serialised by a lock per group, from
the write to the install, so memory always holds what replaying the file gives.

Who may commit is the group membership's business: the store asks a `MemberCheck`
(the group coordinator once the listener opens; `NoMembers` during recovery). Which
producer may add offsets to a transaction is the transaction coordinator's: the
store asks a `TxnJoin`, which also adds the group to the transaction durably; the
coordinator in turn has the store write the markers (`write_markers`) when the
transaction ends.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import anyio

from broker.clock import now_ms
from broker.config import BrokerConfig
from broker.crash_points import crash_point
from broker.groups.offset_state import (
    Entry,
    OffsetState,
    OffsetStateError,
    Pending,
    commit_record,
    deleted_record,
    empty_record,
    empty_since,
    expire_record,
    markers_record,
    pending_record,
)
from broker.metrics import OffsetStats
from broker.partitions import TopicRegistry
from broker.storage import RecordLog, RecordLogError
from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError

log = logging.getLogger(f"minibroker.{__name__}")

GroupMarker = tuple[int, int | None, Iterable[str], bool]
"""A transaction's end in its groups: (producer_id, producer_epoch, group_ids,
committed); an epoch of None ends the producer's pending offsets of any epoch."""

DIRECTORY = "groups"
FILE = "offsets.wal"


class OffsetLogError(RecordLogError):
    """The offsets log is damaged before its end; the broker will not start on it."""


class OffsetLog(RecordLog):
    error = OffsetLogError
    failure_event = "offsets_log"

    def __init__(self, data_dir: Path, max_bytes: int) -> None:
        super().__init__(data_dir / DIRECTORY, FILE, max_bytes)


class MemberCheck(Protocol):
    """What the group membership tells the store."""

    def locked(self, group_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the group's membership still from the member check to the answer, so no
        heartbeat moves the member's epoch or partitions in between."""
        ...

    def check_member(self, group_id: str, member_id: str, member_epoch: int) -> ErrorCode:
        """NONE when the member may commit for the group at this epoch, else why not
        (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH)."""
        ...

    def has_members(self, group_id: str) -> bool: ...

    def subscribed_topics(self, group_id: str) -> Container[str] | None:
        """The topics the group's members subscribe to (none without members), or None
        when its members are not consumers."""
        ...


class NoMembers:
    """Membership while no group coordinator runs: every group is empty, so only a commit
    from outside the group (member_id "", epoch -1) passes."""

    @asynccontextmanager
    async def locked(self, group_id: str) -> AsyncIterator[None]:
        yield  # no member, nothing to hold still

    def check_member(self, group_id: str, member_id: str, member_epoch: int) -> ErrorCode:
        if member_id == "" and member_epoch == m.MEMBER_EPOCH_NONE:
            return ErrorCode.NONE
        return ErrorCode.UNKNOWN_MEMBER_ID

    def has_members(self, group_id: str) -> bool:
        return False

    def subscribed_topics(self, group_id: str) -> Container[str] | None:
        return frozenset()


class TxnJoin(Protocol):
    """What the transaction coordinator does for a TxnOffsetCommit."""

    def locked(self, transactional_id: str) -> AbstractAsyncContextManager[None]: ...

    def judge_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, principal: str
    ) -> None:
        """Raise ProtocolError unless this producer may add offsets to its transaction."""
        ...

    def add_group(self, transactional_id: str, group_id: str) -> int:
        """Make the transaction hold the group, written, not synced (the pending offsets
        make it durable in effect). ProtocolError when it may not."""
        ...


class WrittenCommit(NamedTuple):
    """A TxnOffsetCommit written and in force, to be answered once `durable` has returned
    (which fills in `response`'s errors itself should a sync fail); `is_durable` says
    whether it would wait. Meanwhile its connection runs the requests behind it."""

    response: m.TxnOffsetCommitResponse
    is_durable: Callable[[], bool]
    durable: Callable[[], Awaitable[None]]


class OffsetDeletion(NamedTuple):
    """An OffsetDelete's answer: the group's error, or each partition's."""

    error: ErrorCode
    message: str | None
    topics: list[m.TopicPartitionErrors]


class Verdicts(NamedTuple):
    """A commit request judged partition by partition: the offsets to write, and the
    error of every partition (0 for those written, if the write succeeds)."""

    accepted: list[Entry]
    errors: dict[tuple[str, int], ErrorCode]
    new_keys: int


class OffsetStore:
    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicRegistry,
        offsets_log: OffsetLog,
        members: MemberCheck,
    ) -> None:
        self.config = config
        self.topics = topics
        self.log = offsets_log
        self.members = members
        self.state = OffsetState()
        self._locks: dict[str, anyio.Lock] = {}
        self._reserved = 0  # new offsets of commits written but not installed yet
        self._commits: Counter[str] = Counter({"OffsetCommit": 0, "TxnOffsetCommit": 0})
        self._expired = 0

    def load(self) -> None:
        """Read the offsets log into memory (OffsetLogError when it is damaged)."""
        self.log.open(self._replay)
        log.info(
            "event=offsets_loaded groups=%d offsets=%d", len(self.state.groups), self.state.held
        )

    def _replay(self, body: Any) -> None:
        try:
            self.state.apply(body)
        except OffsetStateError as exc:
            raise OffsetLogError(f"{self.log.path}: {exc}") from exc

    # ------------------------------------------------------------------ locks and writes

    @asynccontextmanager
    async def _locked(self, group_ids: Iterable[str]) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for group_id in sorted(set(group_ids)):
                lock = self._locks.setdefault(group_id, anyio.Lock())
                await stack.enter_async_context(lock)
                stack.callback(self._release, group_id, lock)
            yield

    def _release(self, group_id: str, lock: anyio.Lock) -> None:
        # As in the transaction coordinator: the table stays as small as the load.
        if lock.statistics().tasks_waiting == 0 and self._locks.get(group_id) is lock:
            del self._locks[group_id]

    async def _write_durably(
        self,
        record: list[object],
        *,
        written_point: str | None = None,
        durable_point: str | None = None,
    ) -> None:
        """Write `record`, wait until it is durable, install it. OSError when it could not
        be: then nothing is installed. A failed write leaves the file as it was; after a
        failed fdatasync the file's state is unknown, so the log takes no more writes
        until a restart reads it again (RecordLog.failure_event)."""
        end = self.log.write(record)
        if written_point is not None:
            crash_point(written_point)
        await self.log.durable_or_refuse(end)
        if durable_point is not None:
            crash_point(durable_point)
        self.state.apply(record)

    def _judge(
        self, group_id: str, topics: list[m.OffsetCommitTopic], producer_id: int
    ) -> Verdicts:
        """Which partitions exist and fit under max_committed_offsets."""
        accepted: list[Entry] = []
        errors: dict[tuple[str, int], ErrorCode] = {}
        room = self.config.max_committed_offsets - self.state.held - self._reserved
        group = self.state.group(group_id)
        held: Container[tuple[str, int]] = (
            ()
            if group is None
            else group.committed
            if producer_id < 0
            else group.pending.get(producer_id, {})
        )
        new_keys = 0
        for t in topics:
            for p in t.partitions:
                key = (t.topic, p.partition)
                if self.topics.partition(*key) is None:
                    errors[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if key not in held:
                    if new_keys >= room:
                        errors[key] = ErrorCode.POLICY_VIOLATION
                        continue
                    new_keys += 1
                accepted.append((key, Pending(p.offset, p.metadata)))
        return Verdicts(accepted, errors, new_keys)

    # ------------------------------------------------------------------ OffsetCommit

    async def offset_commit(self, req: m.OffsetCommitRequest) -> m.OffsetCommitResponse:
        async with self.members.locked(req.group_id):
            refused = self.members.check_member(req.group_id, req.member_id, req.member_epoch)
            if refused:
                return m.OffsetCommitResponse(
                    error=refused,
                    message=_member_message(refused, req.group_id, req.member_id, req.member_epoch),
                    topics=_all_errors(req.topics, refused),
                )
            return await self._commit(req)

    async def _commit(self, req: m.OffsetCommitRequest) -> m.OffsetCommitResponse:
        async with self._locked([req.group_id]):
            verdicts = self._judge(req.group_id, req.topics, -1)
            message: str | None = None
            if verdicts.accepted:
                stamp = now_ms()
                since = empty_since(
                    self.state.group(req.group_id), self.members.has_members(req.group_id), stamp
                )
                record = commit_record(req.group_id, since, stamp, verdicts.accepted)
                message = await self._write(record, verdicts, "offset_commit_durable")
                if message is None:
                    self._commits["OffsetCommit"] += len(verdicts.accepted)
        return m.OffsetCommitResponse(
            error=ErrorCode.KAFKA_STORAGE_ERROR if message else ErrorCode.NONE,
            message=message or _partition_message(verdicts),
            topics=_answer(req.topics, verdicts.errors),
        )

    async def _write(
        self,
        record: list[object],
        verdicts: Verdicts,
        point: str,
    ) -> str | None:
        """Write a judged commit durably; on failure every accepted partition is answered
        KAFKA_STORAGE_ERROR and the reason returned."""
        self._reserved += verdicts.new_keys
        try:
            await self._write_durably(record, durable_point=point)
            return None
        except OSError as exc:
            for key, _ in verdicts.accepted:
                verdicts.errors[key] = ErrorCode.KAFKA_STORAGE_ERROR
            return f"offsets log: {exc}"
        finally:
            self._reserved -= verdicts.new_keys

    # ------------------------------------------------------------------ TxnOffsetCommit

    async def txn_offset_commit(
        self, req: m.TxnOffsetCommitRequest, txn: TxnJoin, principal: str
    ) -> m.TxnOffsetCommitResponse | WrittenCommit:
        """`principal`'s producer is judged, then the member, then the partitions; the group
        joins the transaction (written) and the pending offsets are written and in force,
        under the id's, the member's and the group's locks; the offsets are synced after
        they are let go, before the answer (`WrittenCommit`): the producer's batches, and
        whatever its connection sends next, run meanwhile. Ending the transaction waits
        for that round (`settled`), so its groups' marker comes after the offsets on disk
        too."""
        async with txn.locked(req.transactional_id):
            try:
                txn.judge_offsets(
                    req.transactional_id, req.producer_id, req.producer_epoch, principal
                )
            except ProtocolError as exc:
                return _txn_refused(req, exc.code, exc.message)
            async with self.members.locked(req.group_id):
                refused = self.members.check_member(req.group_id, req.member_id, req.member_epoch)
                if refused:
                    why = _member_message(refused, req.group_id, req.member_id, req.member_epoch)
                    return _txn_refused(req, refused, why)
                return await self._add_pending(req, txn)

    async def _add_pending(
        self, req: m.TxnOffsetCommitRequest, txn: TxnJoin
    ) -> m.TxnOffsetCommitResponse | WrittenCommit:
        """The producer and the member passed: judge the partitions, add the group to the
        transaction, write the pending offsets and put them in force."""
        async with self._locked([req.group_id]):
            verdicts = self._judge(req.group_id, req.topics, req.producer_id)
            if not verdicts.accepted:
                return m.TxnOffsetCommitResponse(
                    message=_partition_message(verdicts),
                    topics=_answer(req.topics, verdicts.errors),
                )
            try:
                txn.add_group(req.transactional_id, req.group_id)
            except ProtocolError as exc:
                return _txn_refused(req, exc.code, exc.message)
            since = empty_since(
                self.state.group(req.group_id), self.members.has_members(req.group_id), now_ms()
            )
            record = pending_record(
                req.group_id, since, req.producer_id, req.producer_epoch, verdicts.accepted
            )
            try:
                end = self.log.write(record)
            except OSError as exc:
                for key, _ in verdicts.accepted:
                    verdicts.errors[key] = ErrorCode.KAFKA_STORAGE_ERROR
                return m.TxnOffsetCommitResponse(
                    error=ErrorCode.KAFKA_STORAGE_ERROR,
                    message=f"offsets log: {exc}",
                    topics=_answer(req.topics, verdicts.errors),
                )
            # In force before it is durable, as a Produce's batch is: what runs next (its
            # transaction's end, an OffsetFetch) sees it; nothing is answered on it
            # before the round. Pending offsets are no one's committed offsets yet.
            self.state.apply(record)
        response = m.TxnOffsetCommitResponse(
            message=_partition_message(verdicts), topics=_answer(req.topics, verdicts.errors)
        )
        accepted = {key for key, _ in verdicts.accepted}

        def is_durable() -> bool:
            return self.log.is_durable(end)

        async def durable() -> None:
            # The answer rests on the pending offsets alone: they carry the producer's
            # pid and epoch, so should the group's add (written to txn.wal, synced by the
            # next round there) be lost, recovery adopts the group for the transaction,
            # as it adopts a partition by a batch (docs/transactions.md, "At start").
            try:
                await self.log.durable_or_refuse(end)
            except OSError as exc:
                response.error = ErrorCode.KAFKA_STORAGE_ERROR
                response.message = f"offsets log: {exc}"
                for t in response.topics:
                    for p in t.partitions:
                        if (t.topic, p.partition) in accepted:
                            p.error = ErrorCode.KAFKA_STORAGE_ERROR
                return
            crash_point("txn_offsets_pending_durable")

        return WrittenCommit(response, is_durable, durable)

    # ------------------------------------------------------------------ markers

    def pending_owners(self) -> set[tuple[str, int, int | None]]:
        """(group_id, producer_id, producer_epoch or None) of every pending
        transactional offset."""
        return self.state.pending_owners()

    async def settled(self, group_ids: Iterable[str]) -> None:
        """Return once every TxnOffsetCommit of these groups written so far is durable: one
        being judged holds its group's lock until its pending offsets are written, and a
        round then syncs everything written. OSError when that round fails."""
        async with self._locked(group_ids):
            pass
        await self.log.durable_or_refuse(self.log.size_bytes)

    async def write_markers(self, markers: Sequence[GroupMarker]) -> None:
        """End transactions in their groups: for each (producer_id, producer_epoch,
        groups, committed), the pending offsets the producer's transaction at that epoch
        holds there become committed, or are dropped. One record for all, durable on
        return; a group where it holds none is skipped (its marker was written before a
        crash, or by `write_markers_now`, whose round may have failed: so the log is
        synced up to its end first, and a log that refuses writes raises). OSError on a
        storage failure."""
        wanted = _wanted(markers)
        async with self._locked(g for g, _, _, _ in wanted):
            due, committed_offsets = self._due(wanted)
            if not due:
                # In force is not durable: the ending's COMPLETE, which follows this
                # return, must never stand in txn.wal for a marker the disk may lack.
                await self.log.durable_or_refuse(self.log.size_bytes)
                return
            await self._write_durably(
                markers_record(now_ms(), due),
                written_point="txn_group_markers_written",
            )
            self._commits["TxnOffsetCommit"] += committed_offsets

    async def write_markers_now(self, markers: Sequence[GroupMarker]) -> int:
        """`write_markers`, in force at once and written, not synced: return the size the
        log must reach on disk for them to be (0: nothing written), for `durable`.

        Only for transactions whose decision is durable in `txn.wal`: that decision, not
        this record, is what recovery ends their groups by should this one be lost, so
        memory may show the offsets committed before the disk does. OSError when the
        record could not be written: nothing changed."""
        wanted = _wanted(markers)
        async with self._locked(g for g, _, _, _ in wanted):
            due, committed_offsets = self._due(wanted)
            if not due:
                return 0
            record = markers_record(now_ms(), due)
            end = self.log.write(record)
            crash_point("txn_group_markers_written")
            self.state.apply(record)
            self._commits["TxnOffsetCommit"] += committed_offsets
            return end

    def _due(
        self, wanted: list[tuple[str, int, int | None, bool]]
    ) -> tuple[list[tuple[str, int, bool]], int]:
        """The markers of `wanted` whose transaction holds pending offsets in the group,
        as a markers record lists them, and how many offsets they commit. A marker of
        an ended transaction ends its own offsets only: recovery may write it again
        after the producer's next transaction wrote offsets to the same group."""
        due = [
            (g, pid, committed)
            for g, pid, epoch, committed in wanted
            if self.state.holds_pending(g, pid, epoch)
        ]
        committed_offsets = sum(
            len(group.pending[pid])
            for g, pid, committed in due
            if committed and (group := self.state.group(g)) is not None
        )
        return due, committed_offsets

    async def durable(self, end: int) -> None:
        """Return once the log is on disk up to `end` (`write_markers_now`); OSError if
        not, after which the log refuses writes."""
        await self.log.durable_or_refuse(end)

    # ------------------------------------------------------------------ deleted topics

    def pending_in(self, topic: str) -> list[tuple[str, int]]:
        """(group_id, producer_id) of every open transaction holding an offset of `topic`:
        DeleteTopics refuses such a topic, as one holding a transaction's data."""
        return self.state.pending_in(topic)

    async def delete_topic(self, topic: str) -> None:
        """Drop every group's offsets of deleted topic `topic`, durably; nothing to write
        when none holds one (a deletion finished again after a crash). The topic is out of
        the registry already, so no commit judged from now on names it; the groups being
        written are locked too, so a commit judged before lands first and goes with it.
        OSError on a storage failure: nothing dropped."""
        groups = set(self.state.holds_topic(topic)) | set(self._locks)
        async with self._locked(groups):
            if not self.state.holds_topic(topic):
                return
            await self._write_durably(
                deleted_record(topic), durable_point="topic_delete_offsets_durable"
            )
        log.info("event=topic_offsets_deleted topic=%s", topic)

    # ------------------------------------------------------------------ OffsetFetch

    def offset_fetch(self, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
        group = self.state.group(req.group_id)
        if req.topics is not None:
            wanted = [(t.topic, p) for t in req.topics for p in t.partitions]
        elif group is None:
            wanted = []
        else:
            keys = set(group.committed)
            if req.require_stable:
                # A partition whose first offset is still in a transaction is unstable too.
                keys.update(k for offsets in group.pending.values() for k in offsets)
            wanted = sorted(keys)
        by_topic: dict[str, list[m.OffsetFetchPartition]] = {}
        for topic, index in wanted:
            key = (topic, index)
            committed = None if group is None else group.committed.get(key)
            out = m.OffsetFetchPartition(index)
            if req.require_stable and group is not None and group.is_pending(key):
                out.error = ErrorCode.UNSTABLE_OFFSET_COMMIT
            elif committed is not None:
                out.offset, out.metadata = committed.offset, committed.metadata
            elif self.topics.partition(topic, index) is None:
                out.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            by_topic.setdefault(topic, []).append(out)
        return m.OffsetFetchResponse(
            topics=[m.OffsetFetchTopic(t, parts) for t, parts in by_topic.items()]
        )

    # ------------------------------------------------------------------ DeleteGroups

    async def delete_group(self, group_id: str) -> tuple[ErrorCode, str | None]:
        """Delete a group with no members: its committed offsets go, durably, in one
        "expire" record (so recovery needs nothing new). NON_EMPTY_GROUP while it has
        members or an open transaction's offsets; GROUP_ID_NOT_FOUND when it holds
        nothing."""
        async with self.members.locked(group_id), self._locked([group_id]):
            if self.members.has_members(group_id):
                return ErrorCode.NON_EMPTY_GROUP, f"group {group_id!r} has members"
            group = self.state.group(group_id)
            if group is None:
                return ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} holds no offsets"
            if group.pending:
                return (
                    ErrorCode.NON_EMPTY_GROUP,
                    f"group {group_id!r} holds offsets of an open transaction",
                )
            try:
                await self._write_durably(expire_record(group_id, sorted(group.committed)))
            except OSError as exc:
                return ErrorCode.KAFKA_STORAGE_ERROR, f"offsets log: {exc}"
            log.info("event=group_deleted group=%r offsets=%d", group_id, len(group.committed))
            return ErrorCode.NONE, None

    # ------------------------------------------------------------------ OffsetDelete

    async def delete_offsets(
        self, group_id: str, topics: list[m.GroupTopicPartitions]
    ) -> OffsetDeletion:
        """Kafka's OffsetDelete (KIP-496): the committed offsets of the named partitions
        go, durably, in one "expire" record (as DeleteGroups'), so both listeners' next
        OffsetFetch finds none. GROUP_ID_NOT_FOUND for a group with neither members nor
        offsets; NON_EMPTY_GROUP while members of another protocol than "consumer" are
        in it; per partition, GROUP_SUBSCRIBED_TO_TOPIC where a member subscribes to the
        topic and UNKNOWN_TOPIC_OR_PARTITION where the partition does not exist. A
        partition with no committed offset is answered NONE; an open transaction's
        pending offset is left to its transaction's end."""
        async with self.members.locked(group_id), self._locked([group_id]):
            subscribed = self.members.subscribed_topics(group_id)
            group = self.state.group(group_id)
            if subscribed is None:
                why = f"group {group_id!r} has members of another protocol than consumer"
                return OffsetDeletion(ErrorCode.NON_EMPTY_GROUP, why, [])
            if group is None and not self.members.has_members(group_id):
                why = f"group {group_id!r} has no members and holds no offsets"
                return OffsetDeletion(ErrorCode.GROUP_ID_NOT_FOUND, why, [])
            errors: dict[tuple[str, int], ErrorCode] = {}
            doomed: list[tuple[str, int]] = []
            for t in topics:
                for index in t.partitions:
                    key = (t.topic, index)
                    if self.topics.partition(*key) is None:
                        errors[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    elif t.topic in subscribed:
                        errors[key] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
                    elif group is not None and key in group.committed:
                        doomed.append(key)
            message = None
            if doomed:
                try:
                    await self._write_durably(
                        expire_record(group_id, doomed), durable_point="offset_delete_durable"
                    )
                except OSError as exc:
                    errors.update(dict.fromkeys(doomed, ErrorCode.KAFKA_STORAGE_ERROR))
                    message = f"offsets log: {exc}"
                else:
                    log.info("event=offsets_deleted group=%r offsets=%d", group_id, len(doomed))
            answer = [
                m.TopicPartitionErrors(
                    t.topic,
                    [
                        m.PartitionError(p, errors.get((t.topic, p), ErrorCode.NONE))
                        for p in t.partitions
                    ],
                )
                for t in topics
            ]
            return OffsetDeletion(ErrorCode.NONE, message, answer)

    # ------------------------------------------------------------------ housekeeping

    async def run(self) -> None:
        """Follow the groups' membership, expire offsets past retention, compact."""
        while True:
            await anyio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                self.sweep(now_ms())
            except OSError:
                # A disk that fails here must not stop the sweeps: what was not
                # written is looked at again next time.
                log.exception("event=offsets_sweep_failed")

    def sweep(self, stamp: int) -> None:
        """Compact the log when due, then look at every group not being written. The
        sweep's records are written, not synced: one lost in a crash is redone by the
        first sweep after the restart."""
        if self.log.failed is not None:
            return
        if not self._locks and self.log.wants_compaction():
            # Every record written is installed: writers hold a group lock until then.
            self.log.compact(self.state.snapshot())
        retention = self.config.offsets_retention_ms
        for group_id in [g for g in self.state.groups if g not in self._locks]:
            group = self.state.group(group_id)
            assert group is not None
            since = empty_since(group, self.members.has_members(group_id), stamp)
            if since != group.empty_since_ms:
                self._write_now(empty_record(group_id, since))
            expired = self.state.expired(group_id, stamp, retention)
            if expired:
                self._write_now(expire_record(group_id, expired))
                self._expired += len(expired)
                log.info("event=offsets_expired group=%r offsets=%d", group_id, len(expired))

    def _write_now(self, record: list[object]) -> None:
        """Write and install at once, with no wait between: no other write of the group
        can come between them."""
        self.log.write(record)
        self.state.apply(record)

    def stats(self) -> OffsetStats:
        """For the metrics scrape: counts, and the lag of committed offsets, for at most
        max_consumer_lag_series partitions (groups in name order)."""
        limit = self.config.max_consumer_lag_series
        lag: list[tuple[str, str, int, int]] = []
        committed = pending = 0
        for group_id in sorted(self.state.groups):
            group = self.state.groups[group_id]
            committed += len(group.committed)
            pending += group.held() - len(group.committed)
            if len(lag) + len(group.committed) > limit:
                continue
            for (topic, index), c in sorted(group.committed.items()):
                partition = self.topics.partition(topic, index)
                if partition is not None:
                    lag.append(
                        (group_id, topic, index, max(0, partition.log.log_end_offset - c.offset))
                    )
        return OffsetStats(
            len(self.state.groups),
            committed,
            pending,
            dict(self._commits),
            self._expired,
            lag,
            committed - len(lag),
        )

    def close(self) -> None:
        self.log.close()


def _all_errors(topics: list[m.OffsetCommitTopic], code: ErrorCode) -> list[m.TopicPartitionErrors]:
    return [
        m.TopicPartitionErrors(t.topic, [m.PartitionError(p.partition, code) for p in t.partitions])
        for t in topics
    ]


def _answer(
    topics: list[m.OffsetCommitTopic], errors: dict[tuple[str, int], ErrorCode]
) -> list[m.TopicPartitionErrors]:
    return [
        m.TopicPartitionErrors(
            t.topic,
            [
                m.PartitionError(p.partition, errors.get((t.topic, p.partition), ErrorCode.NONE))
                for p in t.partitions
            ],
        )
        for t in topics
    ]


def _txn_refused(
    req: m.TxnOffsetCommitRequest, code: ErrorCode, message: str | None
) -> m.TxnOffsetCommitResponse:
    return m.TxnOffsetCommitResponse(
        error=code, message=message, topics=_all_errors(req.topics, code)
    )


def _member_message(code: ErrorCode, group_id: str, member_id: str, member_epoch: int) -> str:
    return (
        f"{ErrorCode.name_of(code)}: member {member_id!r} at epoch {member_epoch} may not "
        f"commit for group {group_id!r}"
    )


def _partition_message(verdicts: Verdicts) -> str | None:
    codes = set(verdicts.errors.values())
    if ErrorCode.POLICY_VIOLATION in codes:
        return "max_committed_offsets is reached: offsets of partitions not yet held are refused"
    if codes:
        return "some partitions do not exist"
    return None


def _wanted(markers: Sequence[GroupMarker]) -> list[tuple[str, int, int | None, bool]]:
    """(group_id, producer_id, producer_epoch, committed) per group of `markers`."""
    return [
        (g, pid, epoch, committed)
        for pid, epoch, groups, committed in markers
        for g in sorted(groups)
    ]
