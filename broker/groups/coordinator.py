"""The group coordinator: ConsumerGroupHeartbeat, Kafka's classic JoinGroup, SyncGroup,
Heartbeat and LeaveGroup, ListGroups, DescribeGroups, the session and rebalance
timers, and the membership questions of the offsets store (docs/protocol.md section 6,
docs/consumer-groups.md).

The transitions are pure (broker/groups/state.py for KIP-848's groups, classic.py for
the classic ones); this module holds the groups of both kinds, serialises the requests
of one group with a lock, and expires members at the earliest deadline any group has
(a timer woken early when a nearer deadline appears, never a polling loop). A group
id is one kind while it has members: a member of the other kind is refused
INCONSISTENT_GROUP_PROTOCOL, as Kafka answers. A classic JoinGroup or SyncGroup that
must wait for other members waits outside the group's lock, for the answer a later
transition (another member's request, or a timer) hands it.

Membership is soft state: nothing of it is written to disk, static members'
instance ids included. After a restart every group is empty, every member's
heartbeat answers UNKNOWN_MEMBER_ID and the member rejoins. A group whose last
member goes is dropped (a later join starts it again at epoch 1; member ids are
random, so no old id is ever valid in it); the offsets store sees that at its
next retention sweep (`has_members`).
"""

from __future__ import annotations

import heapq
import logging
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Container,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import anyio

from broker.clock import monotonic_ms
from broker.config import BrokerConfig
from broker.groups import classic
from broker.groups import state as group_state
from broker.groups.assignor import TopicPartition
from broker.groups.state import EMPTY, NO_DEADLINE, Group, GroupSettings
from broker.metrics import GroupSnapshot, GroupStats
from broker.partitions import TopicRegistry
from protocol import messages as m
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")

T = TypeVar("T")


class Listing(NamedTuple):
    """A group as Kafka's ListGroups shows it: a classic group's protocol type, or
    "consumer" for a KIP-848 group ("" for one that only holds offsets), and its state
    in Kafka's spelling."""

    group_id: str
    protocol_type: str
    state: str


@dataclass(slots=True)
class _Waiter(Generic[T]):
    """A classic JoinGroup or SyncGroup waiting for the transition that answers it."""

    event: anyio.Event
    answer: T | None = None


class PartitionCounts(Mapping[str, int]):
    """The live partition count of every topic, read where a transition looks one up."""

    def __init__(self, topics: TopicRegistry) -> None:
        self._registry = topics

    def __getitem__(self, name: str) -> int:
        return len(self._registry.topics[name].partitions)

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry.topics)

    def __len__(self) -> int:
        return len(self._registry.topics)


class GroupCoordinator:
    def __init__(self, config: BrokerConfig, partition_counts: Mapping[str, int]) -> None:
        self.config = config
        self.settings = GroupSettings(
            session_timeout_ms=config.group_session_timeout_ms,
            max_size=config.group_max_size,
            max_rebalance_timeout_ms=config.group_max_rebalance_timeout_ms,
        )
        self.classic_settings = classic.ClassicSettings(
            max_size=config.group_max_size,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            max_rebalance_timeout_ms=config.group_max_rebalance_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        )
        self.partition_counts = partition_counts
        self.groups: dict[str, Group] = {}
        self.classic: dict[str, classic.ClassicGroup] = {}
        # (group id, member id) -> the member's JoinGroup or SyncGroup waiting
        self._joins: dict[tuple[str, str], _Waiter[classic.JoinAnswer]] = {}
        self._syncs: dict[tuple[str, str], _Waiter[classic.SyncAnswer]] = {}
        self.heartbeats = 0
        # Set by the offsets store: told (group id, wall-clock ms) when a group's last
        # member goes; asked which groups hold committed offsets, so ListGroups and
        # DescribeGroups show those as EMPTY.
        self.offset_groups: Callable[[], Collection[str]] = frozenset
        self._locks: dict[str, anyio.Lock] = {}
        self._timers: list[tuple[int, str]] = []  # (deadline, group id), a heap
        self._scheduled: dict[str, int] = {}  # group id -> its earliest entry in the heap
        self._wake = anyio.Event()

    # ------------------------------------------------------------------ locking

    @asynccontextmanager
    async def locked(self, group_id: str) -> AsyncIterator[None]:
        """Hold one group still: a commit that checks a member and then writes holds
        this, so no heartbeat moves the member's epoch in between."""
        lock = self._locks.setdefault(group_id, anyio.Lock())
        async with lock:
            try:
                yield
            finally:
                # Dropped when nobody else waits, so the table is as small as the load.
                if lock.statistics().tasks_waiting == 0 and self._locks.get(group_id) is lock:
                    del self._locks[group_id]

    # ------------------------------------------------------------------ requests

    async def heartbeat(
        self,
        req: m.ConsumerGroupHeartbeatRequest,
        *,
        client_named: bool = False,
        client_host: str = "",
    ) -> m.ConsumerGroupHeartbeatResponse:
        """`client_named`: a Kafka client's v1 heartbeat, whose member names itself
        (KIP-1082); `client_host`: where the request came from (state.heartbeat)."""
        async with self.locked(req.group_id):
            self.heartbeats += 1
            if req.group_id in self.classic:
                return m.ConsumerGroupHeartbeatResponse(
                    error=ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    message=_other_kind(req.group_id, "classic"),
                )
            group = self.groups.get(req.group_id)
            if group is None:
                joining = req.member_id == "" and req.member_epoch == m.MEMBER_EPOCH_JOIN
                if joining and len(self.groups) >= self.config.max_groups:
                    return m.ConsumerGroupHeartbeatResponse(
                        error=ErrorCode.POLICY_VIOLATION,
                        message=f"the broker holds max_groups={self.config.max_groups} groups",
                    )
                group = Group(req.group_id)
            result = group_state.heartbeat(
                group,
                req,
                req.client_id,
                self.partition_counts,
                monotonic_ms(),
                self.settings,
                uuid.uuid4().hex,
                client_named=client_named,
                client_host=client_host,
            )
            if result.error:
                return m.ConsumerGroupHeartbeatResponse(error=result.error, message=result.message)
            _log_changes(group, result.group)
            if result.replaced is not None:
                log.info(
                    "event=group_member_fenced group=%r member=%s instance=%r replaced_by=%s",
                    req.group_id,
                    result.replaced,
                    req.instance_id,
                    result.member_id,
                )
            elif (departed := result.group.members.get(result.member_id)) and departed.departed:
                log.info(
                    "event=group_member_departed group=%r member=%s partitions=%d",
                    req.group_id,
                    result.member_id,
                    len(departed.assigned),
                )
            self._install(result.group, result.deadline_ms)
            return m.ConsumerGroupHeartbeatResponse(
                member_id=result.member_id,
                member_epoch=result.member_epoch,
                heartbeat_interval_ms=self.config.group_heartbeat_interval_ms,
                assignment=None if result.assignment is None else _by_topic(result.assignment),
            )

    async def join_group(self, group_id: str, req: classic.Join) -> classic.JoinAnswer:
        """A classic JoinGroup: answered now, or once the barrier completes."""
        async with self.locked(group_id):
            if group_id in self.groups:
                return classic.JoinAnswer(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    _other_kind(group_id, "KIP-848"),
                    member_id=req.member_id,
                )
            group = self.classic.get(group_id)
            if group is None:
                if len(self.groups) + len(self.classic) >= self.config.max_groups:
                    return classic.JoinAnswer(
                        ErrorCode.POLICY_VIOLATION,
                        f"the broker holds max_groups={self.config.max_groups} groups",
                        member_id=req.member_id,
                    )
                group = classic.ClassicGroup(group_id)
            step = classic.join(group, req, monotonic_ms(), self.classic_settings, uuid.uuid4().hex)
            waiter = self._apply(group, step, self._joins)
        return await _answer_of(step.answer, waiter)

    async def sync_group(self, group_id: str, req: classic.Sync) -> classic.SyncAnswer:
        """A classic SyncGroup: the leader's completes the generation; a follower's
        waits for it."""
        async with self.locked(group_id):
            group = self.classic.get(group_id)
            if group is None:
                return classic.SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID, _no_classic(group_id))
            step = classic.sync(group, req, monotonic_ms())
            waiter = self._apply(group, step, self._syncs)
        return await _answer_of(step.answer, waiter)

    async def classic_heartbeat(
        self, group_id: str, member_id: str, instance_id: str | None, generation: int
    ) -> ErrorCode:
        async with self.locked(group_id):
            self.heartbeats += 1
            group = self.classic.get(group_id)
            if group is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            step = classic.heartbeat(group, member_id, instance_id, generation, monotonic_ms())
            self._apply(group, step, None)
            assert step.answer is not None
            return step.answer

    async def leave_group(
        self, group_id: str, leaving: Sequence[tuple[str, str | None]]
    ) -> list[ErrorCode] | None:
        """Each leaving member's error, or None when the group is not a classic one."""
        async with self.locked(group_id):
            group = self.classic.get(group_id)
            if group is None:
                return None
            step = classic.leave(group, leaving, monotonic_ms(), self.classic_settings)
            self._apply(group, step, None)
            assert step.answer is not None
            return step.answer

    def consumer_group(self, group_id: str) -> Group | None:
        """For Kafka's ConsumerGroupDescribe: the KIP-848 group with members."""
        return self.groups.get(group_id)

    def classic_group(self, group_id: str) -> classic.ClassicGroup | None:
        """For DescribeGroups on a kafka listener."""
        return self.classic.get(group_id)

    def kafka_listing(self, group_id: str) -> Listing | None:
        """The group with members, as Kafka's ListGroups shows it."""
        cgroup = self.classic.get(group_id)
        if cgroup is not None:
            return Listing(group_id, cgroup.protocol_type or "", cgroup.state)
        group = self.groups.get(group_id)
        if group is not None:
            # KIP-848's states in Kafka's spelling: Empty, Assigning, Reconciling, Stable.
            return Listing(group_id, "consumer", group.state.capitalize())
        return None

    def kafka_listings(self) -> list[Listing]:
        """Every group with members or committed offsets, sorted by id."""
        out: dict[str, Listing] = {}
        for group_id in (*self.classic, *self.groups):
            listed = self.kafka_listing(group_id)
            if listed is not None:
                out[group_id] = listed
        for group_id in self.offset_groups():
            out.setdefault(group_id, Listing(group_id, "", classic.EMPTY))
        return [out[g] for g in sorted(out)]

    def _apply(
        self,
        before: classic.ClassicGroup,
        step: classic.Step[Any],
        waiters: dict[tuple[str, str], _Waiter[Any]] | None,
    ) -> _Waiter[Any] | None:
        """Install a classic transition: hand the answers it owes, log what changed,
        schedule its deadline; the caller's waiter when the caller waits."""
        group_id = before.group_id
        after = step.group
        for member_id, joined in step.joins.items():
            _hand(self._joins, (group_id, member_id), joined)
        for member_id, synced in step.syncs.items():
            _hand(self._syncs, (group_id, member_id), synced)
        for member_id, reason in sorted(step.removed.items()):
            log.info(
                "event=group_member_removed group=%r member=%s reason=%s",
                group_id,
                member_id,
                reason,
            )
        added = after.members.keys() - before.members.keys()
        for member_id in sorted(added):
            log.info(
                "event=group_member_joined group=%r member=%s instance=%r protocol=classic",
                group_id,
                member_id,
                after.members[member_id].instance_id,
            )
        if after.generation != before.generation:
            log.info(
                "event=group_generation group=%r generation=%d state=%s members=%d leader=%s",
                group_id,
                after.generation,
                after.state,
                len(after.members),
                after.leader,
            )
        if after.state == classic.STABLE and before.state != classic.STABLE:
            log.info(
                "event=group_stable group=%r generation=%d members=%d",
                group_id,
                after.generation,
                len(after.members),
            )
        if after.is_empty:
            self._scheduled.pop(group_id, None)
            self.classic.pop(group_id, None)
        else:
            self.classic[group_id] = after
            self._schedule(group_id, step.deadline_ms)
        if step.waiting is None or waiters is None:
            return None
        key = (group_id, step.waiting)
        earlier = waiters.get(key)
        if earlier is not None:
            # The same member asked again (its first request timed out on its side).
            message = "superseded by a later request of the same member"
            superseded: Any = (
                classic.JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, message)
                if waiters is self._joins
                else classic.SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS, message)
            )
            _hand(waiters, key, superseded)
        waiter: _Waiter[Any] = _Waiter(anyio.Event())
        waiters[key] = waiter
        return waiter

    def list_groups(self, _: m.ListGroupsRequest) -> m.ListGroupsResponse:
        listed = {
            group_id: m.GroupListing(group_id, group.state, len(group.members))
            for group_id, group in self.groups.items()
        }
        for group_id, cgroup in self.classic.items():
            listed[group_id] = m.GroupListing(group_id, cgroup.state, len(cgroup.members))
        for group_id in self.offset_groups():
            listed.setdefault(group_id, m.GroupListing(group_id, EMPTY, 0))
        return m.ListGroupsResponse(groups=[listed[g] for g in sorted(listed)])

    def describe_groups(self, req: m.DescribeGroupsRequest) -> m.DescribeGroupsResponse:
        with_offsets = self.offset_groups()
        out = []
        for group_id in req.group_ids:
            group = self.groups.get(group_id)
            cgroup = self.classic.get(group_id)
            if group is not None:
                out.append(_described(group))
            elif cgroup is not None:
                out.append(_described_classic(cgroup))
            elif group_id in with_offsets:
                out.append(m.GroupDescription(group_id, state=EMPTY, group_epoch=0))
            else:
                out.append(
                    m.GroupDescription(group_id, ErrorCode.GROUP_ID_NOT_FOUND, group_state.DEAD)
                )
        return m.DescribeGroupsResponse(groups=out)

    # ------------------------------------------------------------------ for the offsets store

    def check_member(self, group_id: str, member_id: str, member_epoch: int) -> ErrorCode:
        """May this member commit offsets for the group? `state.commit_error` answers, or
        `classic.commit_error` for a classic group (`member_epoch` is its generation)."""
        if group_id in self.classic:
            return classic.commit_error(self.classic[group_id], member_id, member_epoch)
        return group_state.commit_error(self.groups.get(group_id), member_id, member_epoch)

    def subscribed_topics(self, group_id: str) -> Container[str] | None:
        """The topics the group's members subscribe to, for OffsetDelete; None when its
        members are not consumers (`classic.subscribed_topics`)."""
        cgroup = self.classic.get(group_id)
        if cgroup is not None:
            return classic.subscribed_topics(cgroup)
        group = self.groups.get(group_id)
        if group is None:
            return frozenset()
        return frozenset().union(*(mb.subscribed_topics for mb in group.members.values()))

    def has_members(self, group_id: str) -> bool:
        return group_id in self.groups or bool(
            group_id in self.classic and self.classic[group_id].members
        )

    def group_ids(self) -> list[str]:
        """The groups with members, sorted."""
        return sorted({*self.groups, *(g for g, c in self.classic.items() if c.members)})

    # ------------------------------------------------------------------ timers

    async def run(self) -> None:
        """Expire members at the earliest deadline; a nearer one wakes the wait."""
        while True:
            now = monotonic_ms()
            while self._timers and self._timers[0][0] <= now:
                deadline, group_id = heapq.heappop(self._timers)
                if self._scheduled.get(group_id) == deadline:
                    del self._scheduled[group_id]
                    try:
                        await self._expire(group_id)
                    except Exception:
                        # A bug in one group must not stop the others' timers; that
                        # group is looked at again after its next heartbeat.
                        log.exception("event=group_expiry_failed group=%r", group_id)
            self._wake = anyio.Event()
            delay_s = None if not self._timers else (self._timers[0][0] - monotonic_ms()) / 1000
            with anyio.move_on_after(delay_s):
                await self._wake.wait()

    async def _expire(self, group_id: str) -> None:
        async with self.locked(group_id):
            cgroup = self.classic.get(group_id)
            if cgroup is not None:
                self._apply(
                    cgroup, classic.expire(cgroup, monotonic_ms(), self.classic_settings), None
                )
                return
            group = self.groups.get(group_id)
            if group is None:
                return
            result = group_state.expire(group, monotonic_ms(), self.settings)
            for member_id, reason in sorted(result.removed.items()):
                log.info(
                    "event=group_member_expired group=%r member=%s reason=%s",
                    group_id,
                    member_id,
                    reason,
                )
            self._install(result.group, result.deadline_ms)

    def _install(self, group: Group, deadline_ms: int) -> None:
        group_id = group.group_id
        if not group.members:
            self._scheduled.pop(group_id, None)
            if self.groups.pop(group_id, None) is not None:
                log.info("event=group_empty group=%r epoch=%d", group_id, group.group_epoch)
            return
        self.groups[group_id] = group
        self._schedule(group_id, deadline_ms)

    def _schedule(self, group_id: str, deadline_ms: int) -> None:
        scheduled = self._scheduled.get(group_id)
        if deadline_ms != NO_DEADLINE and (scheduled is None or deadline_ms < scheduled):
            # A later deadline needs no entry: the earlier one fires, finds nothing due
            # and schedules the real one.
            self._scheduled[group_id] = deadline_ms
            if not self._timers or deadline_ms < self._timers[0][0]:
                self._wake.set()
            heapq.heappush(self._timers, (deadline_ms, group_id))

    # ------------------------------------------------------------------ metrics

    def stats(self) -> GroupStats:
        """For the metrics scrape."""
        return GroupStats(
            {
                group_id: GroupSnapshot(group.state, len(group.members), group.group_epoch)
                for group_id, group in self.groups.items()
            }
            | {
                group_id: GroupSnapshot(group.state, len(group.members), group.generation)
                for group_id, group in self.classic.items()
            },
            self.heartbeats,
        )


def _log_changes(before: Group, after: Group) -> None:
    """Joins and leaves are rare and worth a line each; heartbeats are not."""
    if before.group_epoch == after.group_epoch:
        return
    for event, ids in (
        ("joined", after.members.keys() - before.members.keys()),
        ("left", before.members.keys() - after.members.keys()),
    ):
        for member_id in sorted(ids):
            log.info(
                "event=group_member_%s group=%r member=%s epoch=%d",
                event,
                after.group_id,
                member_id,
                after.group_epoch,
            )


def _by_topic(partitions: frozenset[TopicPartition]) -> list[m.GroupTopicPartitions]:
    topics: dict[str, list[int]] = {}
    for topic, index in sorted(partitions):
        topics.setdefault(topic, []).append(index)
    return [m.GroupTopicPartitions(t, ps) for t, ps in topics.items()]


def _described(group: Group) -> m.GroupDescription:
    return m.GroupDescription(
        group.group_id,
        state=group.state,
        group_epoch=group.group_epoch,
        members=[
            m.GroupMemberDescription(
                member.member_id,
                member.member_epoch,
                member.client_id,
                sorted(member.subscribed_topics),
                _by_topic(member.assigned),
                member.instance_id,
            )
            for _, member in sorted(group.members.items())
        ],
    )


def _described_classic(group: classic.ClassicGroup) -> m.GroupDescription:
    """A classic group as the native DescribeGroups shows it: the generation as the
    epoch; a "consumer" member's subscription and assignment read from its bytes once a
    protocol is chosen (bytes that do not read are shown as nothing)."""
    chosen = group.protocol_name if group.state != classic.PREPARING_REBALANCE else None
    reads = group.protocol_type == "consumer" and chosen is not None
    members = []
    for member_id, member in group.members.items():
        topics = classic.consumer_topics(member.metadata(chosen)) if reads and chosen else None
        assigned = classic.consumer_assignment(member.assignment) if reads else None
        members.append(
            m.GroupMemberDescription(
                member_id,
                group.generation,
                member.client_id,
                topics or [],
                [m.GroupTopicPartitions(t, sorted(set(ps))) for t, ps in assigned or []],
                member.instance_id,
            )
        )
    return m.GroupDescription(
        group.group_id, state=group.state, group_epoch=group.generation, members=members
    )


def _other_kind(group_id: str, kind: str) -> str:
    return (
        f"group {group_id!r} has {kind} members: a group serves one protocol while it has "
        "members (INCONSISTENT_GROUP_PROTOCOL, as in Kafka)"
    )


def _no_classic(group_id: str) -> str:
    return f"group {group_id!r} has no classic members: join first"


def _hand(waiters: dict[tuple[str, str], _Waiter[T]], key: tuple[str, str], answer: T) -> None:
    """Wake the request waiting under `key`, if one still does, with its answer."""
    waiter = waiters.pop(key, None)
    if waiter is not None:
        waiter.answer = answer
        waiter.event.set()


async def _answer_of(answer: T | None, waiter: _Waiter[T] | None) -> T:
    """The caller's answer: the transition's own, or the one a later transition hands."""
    if answer is not None:
        return answer
    assert waiter is not None
    await waiter.event.wait()
    assert waiter.answer is not None
    return waiter.answer
