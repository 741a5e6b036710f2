"""Kafka's classic consumer-group protocol, pure logic: JoinGroup, SyncGroup, Heartbeat
and LeaveGroup as a state machine (docs/consumer-groups.md, "Classic groups").

Beside the KIP-848 groups of state.py, as Kafka keeps its classic groups beside its
modern ones. Here the broker assigns nothing: members join behind a barrier, the
coordinator picks a leader and the protocol every member supports, the leader assigns
on its side and hands the plan over in SyncGroup, and the coordinator passes each
member its part. The states are Kafka's: Empty, PreparingRebalance (the join barrier,
bounded by the largest rebalance timeout), CompletingRebalance (waiting for the
leader's SyncGroup, bounded the same way), Stable.

Static membership (KIP-345) follows the rule the native groups follow (docs/protocol.md
section 6): a join with member_id "" and an instance id another member holds takes
that member's place at once, keeping its assignment, with no rebalance while the group
is Stable and the chosen protocol stays; the replaced member id is fenced
(FENCED_INSTANCE_ID). A static member that stops without leaving keeps its place until
its session runs out, so a restart within it moves nothing.

No IO, no clock, no randomness: time comes in as `now_ms`, a new member's id as an
argument. Each transition returns a `Step`: the group after it, the caller's answer (or
None: the caller waits for its answer in a later step), the answers due to members
waiting on an earlier JoinGroup or SyncGroup, and the group's next deadline.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from protocol.errors import ErrorCode

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"
"""A group the coordinator does not hold."""
STATES = (EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD)
"""Kafka's names for a classic group's states, as DescribeGroups and ListGroups answer."""
NO_DEADLINE = -1
NO_GENERATION = -1
"""The generation of a commit from outside the group's membership."""

Protocols = tuple[tuple[str, bytes], ...]
"""A member's (protocol name, metadata) pairs, in its order of preference."""


@dataclass(frozen=True, slots=True)
class ClassicSettings:
    """The broker settings a transition needs (broker/config.py declares them)."""

    max_size: int
    min_session_timeout_ms: int
    max_session_timeout_ms: int
    max_rebalance_timeout_ms: int
    initial_rebalance_delay_ms: int


@dataclass(frozen=True, slots=True)
class Join:
    """One JoinGroup, as the coordinator needs it. `rebalance_timeout_ms` -1 (v0) is the
    session timeout; `require_known_member_id` is KIP-394's (v4+)."""

    member_id: str
    instance_id: str | None
    protocol_type: str
    protocols: Protocols
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    require_known_member_id: bool


@dataclass(frozen=True, slots=True)
class Sync:
    """One SyncGroup: `assignments` is the leader's plan (empty from a follower);
    `protocol_type` and `protocol_name` are None before v5."""

    member_id: str
    generation: int
    instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    protocol_type: str
    protocols: Protocols
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_heartbeat_ms: int
    assignment: bytes = b""
    """Its part of the leader's plan for the current generation."""
    joined: bool = False
    """It has joined since the rebalance began (PreparingRebalance) and waits for the
    barrier."""
    pending_sync: bool = False
    """It is of the generation being completed and has not sent its SyncGroup yet."""
    awaiting_sync: bool = False
    """It sent its SyncGroup and waits for the leader's."""
    replaced: str | None = None
    """The member id it took the place of (same instance id), fenced since."""

    def metadata(self, protocol: str) -> bytes:
        return next(data for name, data in self.protocols if name == protocol)

    def kept_alive(self, state: str) -> bool:
        """A member waiting on the barrier or on the leader is bounded by the rebalance
        timeout instead of its session, as in Kafka."""
        return (state == PREPARING_REBALANCE and self.joined) or self.awaiting_sync


@dataclass(frozen=True, slots=True)
class ClassicGroup:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: Mapping[str, Member] = field(default_factory=dict)
    """By member id, in the order they were added (the leader's successor is the first)."""
    pending: Mapping[str, int] = field(default_factory=dict)
    """Member ids handed out with MEMBER_ID_REQUIRED (KIP-394), each until its deadline."""
    join_deadline_ms: int = NO_DEADLINE
    """PreparingRebalance: when the barrier completes whoever joined."""
    delay_until_ms: int = NO_DEADLINE
    """PreparingRebalance from Empty: the barrier waits for more members until then
    (group_initial_rebalance_delay_ms)."""
    sync_deadline_ms: int = NO_DEADLINE
    """CompletingRebalance: when the members that sent no SyncGroup are removed."""

    @property
    def is_empty(self) -> bool:
        """Nothing to hold: no member, and no member id handed out and awaited."""
        return not self.members and not self.pending

    def deadline_ms(self) -> int:
        """The earliest moment something happens without a request."""
        deadlines = list(self.pending.values())
        for member in self.members.values():
            if not member.kept_alive(self.state):
                deadlines.append(member.last_heartbeat_ms + member.session_timeout_ms)
        if self.state == PREPARING_REBALANCE:
            all_joined = all(mb.joined for mb in self.members.values()) and not self.pending
            deadlines.append(max(self.delay_until_ms, 0) if all_joined else self.join_deadline_ms)
        elif self.state == COMPLETING_REBALANCE:
            deadlines.append(self.sync_deadline_ms)
        return min(deadlines, default=NO_DEADLINE)


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    generation: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    """For the leader: every member's (id, instance id, metadata of the chosen protocol)."""


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


A = TypeVar("A")


@dataclass(frozen=True, slots=True)
class Step(Generic[A]):
    """A transition's result: the group after it (unchanged when refused), the caller's
    answer (None: it waits, `waiting` names it), the answers due to members waiting on
    an earlier JoinGroup or SyncGroup, the members removed and why, and the deadline."""

    group: ClassicGroup
    answer: A | None = None
    waiting: str | None = None
    joins: Mapping[str, JoinAnswer] = field(default_factory=dict)
    syncs: Mapping[str, SyncAnswer] = field(default_factory=dict)
    removed: Mapping[str, str] = field(default_factory=dict)

    @property
    def deadline_ms(self) -> int:
        return self.group.deadline_ms()


class _Run:
    """The answers one transition owes to waiting members, gathered as it goes."""

    def __init__(self) -> None:
        self.joins: dict[str, JoinAnswer] = {}
        self.syncs: dict[str, SyncAnswer] = {}
        self.removed: dict[str, str] = {}

    def step(
        self, group: ClassicGroup, answer: A | None = None, waiting: str | None = None
    ) -> Step[A]:
        check_invariants(group)
        return Step(group, answer, waiting, self.joins, self.syncs, self.removed)


# ---------------------------------------------------------------------------- JoinGroup


def join(
    group: ClassicGroup, req: Join, now_ms: int, settings: ClassicSettings, new_member_id: str
) -> Step[JoinAnswer]:
    """One JoinGroup. The caller is answered now (an error, MEMBER_ID_REQUIRED, or the
    current generation to a member that already has it) or waits for the barrier."""
    run = _Run()
    if (
        not settings.min_session_timeout_ms
        <= req.session_timeout_ms
        <= (settings.max_session_timeout_ms)
    ):
        return run.step(
            group,
            _join_error(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session_timeout_ms={req.session_timeout_ms} is outside "
                f"[{settings.min_session_timeout_ms}, {settings.max_session_timeout_ms}] "
                "(group_min_session_timeout_ms, group_max_session_timeout_ms)",
                req.member_id,
            ),
        )
    if not req.protocol_type or not req.protocols:
        return run.step(
            group,
            _join_error(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                "a member names its protocol type and at least one protocol",
                req.member_id,
            ),
        )
    member_id = req.member_id
    known = group.members.get(member_id)
    holder = None if req.instance_id is None else _holder(group, req.instance_id)
    if member_id and known is None and member_id not in group.pending:
        error, message = _unknown(group, member_id, req.instance_id)
        return run.step(group, _join_error(error, message, member_id))
    if known is not None and holder is not None and holder is not known:
        return run.step(
            group,
            _join_error(ErrorCode.FENCED_INSTANCE_ID, _fenced(member_id, holder), member_id),
        )
    others = [mb for mb in group.members.values() if mb is not known and mb is not holder]
    if not _compatible(others, req):
        return run.step(
            group,
            _join_error(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"group {group.group_id!r} runs protocol type {group.protocol_type!r} "
                f"with {sorted(_common(others))}: this member offers {req.protocol_type!r} "
                f"with {[name for name, _ in req.protocols]}",
                member_id,
            ),
        )
    if holder is not None and not member_id:
        return _replace_static(group, holder, req, now_ms, settings, new_member_id, run)
    if known is None and member_id not in group.pending:
        size = len(group.members) + len(group.pending)
        if size >= settings.max_size:
            return run.step(
                group,
                _join_error(
                    ErrorCode.GROUP_MAX_SIZE_REACHED,
                    f"group {group.group_id!r} has group_max_size={settings.max_size} members",
                ),
            )
        if req.require_known_member_id and req.instance_id is None:
            # KIP-394: the member learns its id first, so that a join whose answer is
            # lost leaves no member behind that nobody will ever heartbeat for.
            pending = {**group.pending, new_member_id: now_ms + req.session_timeout_ms}
            group = replace(group, pending=pending)
            answer = _join_error(
                ErrorCode.MEMBER_ID_REQUIRED, "join again with this member id", new_member_id
            )
            return run.step(group, answer)
        member_id = new_member_id
    if known is None:
        pending = {i: d for i, d in group.pending.items() if i != member_id}
        added = _new_member(member_id, req, now_ms, settings)
        group = replace(group, members={**group.members, member_id: added}, pending=pending)
        if group.leader is None:
            group = replace(group, leader=member_id)
        group = _with_protocol_type(group)
        return _await_barrier(group, member_id, now_ms, settings, run, new=True)
    updated = _updated(known, req, now_ms, settings)
    same = updated.protocols == known.protocols
    group = _put(group, updated)
    if group.state == COMPLETING_REBALANCE and same:
        # Its JoinGroup answer was lost: the current generation again.
        return run.step(group, _generation_answer(group, member_id, leader=group.leader))
    if group.state == STABLE and same and member_id != group.leader:
        return run.step(group, _generation_answer(group, member_id, leader=group.leader))
    return _await_barrier(group, member_id, now_ms, settings, run, new=False)


def _await_barrier(
    group: ClassicGroup,
    member_id: str,
    now_ms: int,
    settings: ClassicSettings,
    run: _Run,
    *,
    new: bool,
) -> Step[JoinAnswer]:
    """`member_id` joined: start a rebalance unless one runs, put it behind the barrier,
    and complete the barrier if it was the last one awaited."""
    if group.state != PREPARING_REBALANCE:
        group = _prepare_rebalance(group, now_ms, settings, run)
    elif new and group.delay_until_ms > now_ms:
        # Kafka's InitialDelayedJoin: each new member in the delay gives the others
        # one more delay to arrive, up to the rebalance timeout.
        delay = min(now_ms + settings.initial_rebalance_delay_ms, group.join_deadline_ms)
        group = replace(group, delay_until_ms=max(group.delay_until_ms, delay))
    member = group.members[member_id]
    group = _put(group, replace(member, joined=True))
    if member.rebalance_timeout_ms > group.join_deadline_ms - now_ms:
        group = replace(group, join_deadline_ms=now_ms + member.rebalance_timeout_ms)
    group = _try_complete_join(group, now_ms, run)
    if member_id in run.joins:
        return run.step(group, run.joins.pop(member_id))
    return run.step(group, waiting=member_id)


def _replace_static(
    group: ClassicGroup,
    holder: Member,
    req: Join,
    now_ms: int,
    settings: ClassicSettings,
    new_member_id: str,
    run: _Run,
) -> Step[JoinAnswer]:
    """A join with member_id "" and the instance id `holder` holds (KIP-345): a new member
    id takes its place and its assignment; `holder` is fenced, and a JoinGroup or
    SyncGroup it waits on is answered FENCED_INSTANCE_ID. In a Stable group whose chosen
    protocol stays, nothing else moves: the new member is answered the current
    generation, named as a follower (the leader named is the old id when it replaced the
    leader, so that it assigns nothing the Stable group would not pass on)."""
    fenced = _fenced(holder.member_id, holder)
    if holder.joined and group.state == PREPARING_REBALANCE:
        run.joins[holder.member_id] = _join_error(ErrorCode.FENCED_INSTANCE_ID, fenced)
    if holder.awaiting_sync:
        run.syncs[holder.member_id] = SyncAnswer(ErrorCode.FENCED_INSTANCE_ID, fenced)
    successor = replace(
        _updated(holder, req, now_ms, settings),
        member_id=new_member_id,
        joined=False,
        awaiting_sync=False,
        replaced=holder.member_id,
    )
    members = {
        (new_member_id if i == holder.member_id else i): (
            successor if i == holder.member_id else mb
        )
        for i, mb in group.members.items()
    }
    old_leader = group.leader
    leader = new_member_id if old_leader == holder.member_id else old_leader
    group = replace(group, members=members, leader=leader)
    if group.state == STABLE and _select(group.members.values()) == group.protocol_name:
        answer = _generation_answer(group, new_member_id, leader=old_leader)
        return run.step(group, replace(answer, members=()))
    return _await_barrier(group, new_member_id, now_ms, settings, run, new=False)


def _prepare_rebalance(
    group: ClassicGroup, now_ms: int, settings: ClassicSettings, run: _Run
) -> ClassicGroup:
    """Begin the join barrier: every member must join again within the largest
    rebalance timeout. Members waiting for the leader's plan are told to rejoin."""
    if group.state == COMPLETING_REBALANCE:
        for member_id, member in group.members.items():
            if member.awaiting_sync:
                run.syncs[member_id] = SyncAnswer(
                    ErrorCode.REBALANCE_IN_PROGRESS, "the group rebalances: join again"
                )
    members = {
        i: replace(mb, joined=False, pending_sync=False, awaiting_sync=False, assignment=b"")
        for i, mb in group.members.items()
    }
    timeout = max((mb.rebalance_timeout_ms for mb in members.values()), default=0)
    delay = now_ms
    if group.state == EMPTY:
        delay = now_ms + min(settings.initial_rebalance_delay_ms, timeout)
    return replace(
        group,
        state=PREPARING_REBALANCE,
        members=members,
        join_deadline_ms=now_ms + timeout,
        delay_until_ms=delay,
        sync_deadline_ms=NO_DEADLINE,
    )


def _try_complete_join(group: ClassicGroup, now_ms: int, run: _Run) -> ClassicGroup:
    """Complete the barrier when every member joined and no handed-out id is awaited
    (after the initial delay), or when the rebalance timeout ran out: dynamic members
    that did not join are removed (a static one keeps its place), the next generation
    begins with its leader and protocol, and every joined member is answered."""
    if group.state != PREPARING_REBALANCE:
        return group
    all_joined = all(mb.joined for mb in group.members.values()) and not group.pending
    if not (all_joined and now_ms >= group.delay_until_ms) and now_ms < group.join_deadline_ms:
        return group
    for member_id, member in group.members.items():
        if not member.joined and member.instance_id is None:
            run.removed[member_id] = "rebalance_timeout"
    members = {i: mb for i, mb in group.members.items() if i not in run.removed}
    group = replace(
        group, members=members, join_deadline_ms=NO_DEADLINE, delay_until_ms=NO_DEADLINE
    )
    if not members:
        return replace(
            group,
            state=EMPTY,
            generation=group.generation + 1,
            protocol_type=None,
            protocol_name=None,
            leader=None,
        )
    leader = group.leader
    if leader not in members or not members[leader].joined:
        leader = next((i for i, mb in members.items() if mb.joined), next(iter(members)))
    protocol = _select(members.values())
    timeout = max(mb.rebalance_timeout_ms for mb in members.values())
    group = replace(
        group,
        state=COMPLETING_REBALANCE,
        generation=group.generation + 1,
        protocol_name=protocol,
        leader=leader,
        members={
            i: replace(mb, joined=False, pending_sync=True, last_heartbeat_ms=now_ms)
            for i, mb in members.items()
        },
        sync_deadline_ms=now_ms + timeout,
    )
    for member_id, member in members.items():
        if member.joined:
            run.joins[member_id] = _generation_answer(group, member_id, leader=leader)
    return group


def _generation_answer(group: ClassicGroup, member_id: str, *, leader: str | None) -> JoinAnswer:
    """The current generation as JoinGroup answers it; the leader gets the members."""
    assert group.protocol_name is not None
    protocol = group.protocol_name
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    if member_id == leader:
        members = tuple(
            (i, mb.instance_id, mb.metadata(protocol)) for i, mb in group.members.items()
        )
    return JoinAnswer(
        generation=group.generation,
        protocol_type=group.protocol_type,
        protocol_name=protocol,
        leader=leader or "",
        member_id=member_id,
        members=members,
    )


# ---------------------------------------------------------------------------- SyncGroup


def sync(group: ClassicGroup, req: Sync, now_ms: int) -> Step[SyncAnswer]:
    """One SyncGroup: the leader's plan completes the rebalance and answers every
    member waiting for it; a follower waits for it; in a Stable group a member gets
    its part at once."""
    run = _Run()
    refused = _member_error(group, req.member_id, req.instance_id, req.generation)
    if refused is not None:
        return run.step(group, SyncAnswer(*refused))
    if (req.protocol_type is not None and req.protocol_type != group.protocol_type) or (
        req.protocol_name is not None and req.protocol_name != group.protocol_name
    ):
        return run.step(
            group,
            SyncAnswer(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"the generation runs {group.protocol_type!r}/{group.protocol_name!r}",
            ),
        )
    member = replace(group.members[req.member_id], last_heartbeat_ms=now_ms)
    group = _put(group, member)
    if group.state == PREPARING_REBALANCE:
        answer = SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS, "the group rebalances: join again")
        return run.step(group, answer)
    if group.state == STABLE:
        return run.step(group, _sync_answer(group, member))
    assert group.state == COMPLETING_REBALANCE, group.state
    group = _put(group, replace(member, pending_sync=False, awaiting_sync=True))
    if req.member_id != group.leader:
        return run.step(group, waiting=req.member_id)
    waiting = [i for i, mb in group.members.items() if mb.awaiting_sync and i != req.member_id]
    members = {
        i: replace(
            mb, assignment=req.assignments.get(i, b""), awaiting_sync=False, pending_sync=False
        )
        for i, mb in group.members.items()
    }
    group = replace(group, state=STABLE, members=members, sync_deadline_ms=NO_DEADLINE)
    for member_id in waiting:
        run.syncs[member_id] = _sync_answer(group, members[member_id])
    return run.step(group, _sync_answer(group, members[req.member_id]))


def _sync_answer(group: ClassicGroup, member: Member) -> SyncAnswer:
    return SyncAnswer(
        protocol_type=group.protocol_type,
        protocol_name=group.protocol_name,
        assignment=member.assignment,
    )


# ---------------------------------------------------------------------------- Heartbeat


def heartbeat(
    group: ClassicGroup, member_id: str, instance_id: str | None, generation: int, now_ms: int
) -> Step[ErrorCode]:
    """One Heartbeat: NONE keeps the session; REBALANCE_IN_PROGRESS tells the member to
    join again."""
    run = _Run()
    refused = _member_error(group, member_id, instance_id, generation)
    if refused is not None:
        return run.step(group, refused[0])
    group = _put(group, replace(group.members[member_id], last_heartbeat_ms=now_ms))
    if group.state == PREPARING_REBALANCE:
        return run.step(group, ErrorCode.REBALANCE_IN_PROGRESS)
    return run.step(group, ErrorCode.NONE)


# ---------------------------------------------------------------------------- LeaveGroup


def leave(
    group: ClassicGroup,
    leaving: Sequence[tuple[str, str | None]],
    now_ms: int,
    settings: ClassicSettings,
) -> Step[list[ErrorCode]]:
    """One LeaveGroup of (member id, instance id) pairs (v3+ a batch; a static member may
    be named by its instance id alone): each is answered its own error, and the group
    rebalances without those that left."""
    run = _Run()
    errors: list[ErrorCode] = []
    gone: list[str] = []
    pending = dict(group.pending)
    for member_id, instance_id in leaving:
        if instance_id is not None:
            holder = _holder(group, instance_id)
            if holder is None:
                errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            if member_id and member_id != holder.member_id:
                errors.append(ErrorCode.FENCED_INSTANCE_ID)
                continue
            member_id = holder.member_id
        if member_id in pending:
            del pending[member_id]
            errors.append(ErrorCode.NONE)
        elif member_id in group.members:
            gone.append(member_id)
            errors.append(ErrorCode.NONE)
        else:
            errors.append(_unknown(group, member_id, None)[0])
    group = replace(group, pending=pending)
    for member_id in gone:
        run.removed[member_id] = "left"
    group = _remove(group, gone, now_ms, settings, run)
    return run.step(group, errors)


# ---------------------------------------------------------------------------- timers


def expire(group: ClassicGroup, now_ms: int, settings: ClassicSettings) -> Step[None]:
    """What time alone does: handed-out ids unused, sessions run out, the barrier
    completed at its deadline, and the members that sent no SyncGroup in time removed."""
    run = _Run()
    pending = {i: d for i, d in group.pending.items() if d > now_ms}
    group = replace(group, pending=pending)
    expired = [
        i
        for i, mb in group.members.items()
        if not mb.kept_alive(group.state) and mb.last_heartbeat_ms + mb.session_timeout_ms <= now_ms
    ]
    for member_id in expired:
        run.removed[member_id] = "session_timeout"
    late: list[str] = []
    if group.state == COMPLETING_REBALANCE and group.sync_deadline_ms <= now_ms:
        late = [i for i, mb in group.members.items() if mb.pending_sync and i not in expired]
        for member_id in late:
            run.removed[member_id] = "sync_timeout"
    group = _remove(group, [*expired, *late], now_ms, settings, run)
    group = _try_complete_join(group, now_ms, run)
    return run.step(group)


def _remove(
    group: ClassicGroup,
    gone: Sequence[str],
    now_ms: int,
    settings: ClassicSettings,
    run: _Run,
) -> ClassicGroup:
    """The group without `gone`: a Stable or completing group rebalances; a barrier may
    now be complete."""
    if not gone:
        return _try_complete_join(group, now_ms, run)
    for member_id in gone:
        member = group.members[member_id]
        if member.joined and group.state == PREPARING_REBALANCE:
            run.joins[member_id] = _join_error(ErrorCode.UNKNOWN_MEMBER_ID, "removed", member_id)
        if member.awaiting_sync:
            run.syncs[member_id] = SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID, "removed")
    members = {i: mb for i, mb in group.members.items() if i not in gone}
    leader = group.leader if group.leader in members else next(iter(members), None)
    group = replace(group, members=members, leader=leader)
    if group.state in (STABLE, COMPLETING_REBALANCE):
        group = _prepare_rebalance(group, now_ms, settings, run)
    return _try_complete_join(group, now_ms, run)


# ---------------------------------------------------------------------------- offsets


def commit_error(group: ClassicGroup | None, member_id: str, generation: int) -> ErrorCode:
    """May this member commit offsets for the group (Kafka's validateOffsetCommit)?
    A negative generation commits from outside the group: allowed while it has no
    members. A member must be known, of the current generation, and not in the
    middle of a rebalance's assignment."""
    if group is None or not group.members:
        return ErrorCode.NONE if generation < 0 else ErrorCode.UNKNOWN_MEMBER_ID
    refused = _member_error(group, member_id, None, generation)
    if refused is not None:
        return refused[0]
    if group.state == COMPLETING_REBALANCE:
        return ErrorCode.REBALANCE_IN_PROGRESS
    return ErrorCode.NONE


# ---------------------------------------------------------------------------- describing


def consumer_topics(metadata: bytes) -> list[str] | None:
    """The topics of a "consumer" member's subscription (Kafka's ConsumerProtocol
    Subscription, any version: they lead), or None for bytes that are not one."""
    try:
        reader = _Reader(metadata)
        reader.int16()  # version
        return [reader.string() for _ in range(reader.count())]
    except (struct.error, UnicodeDecodeError, ValueError):
        return None


class EveryTopic:
    """The topics of a subscription that does not read: every one (Kafka's
    isSubscribedToTopic when a member's subscription is unknown)."""

    def __contains__(self, topic: object) -> bool:
        return True


def subscribed_topics(group: ClassicGroup) -> Container[str] | None:
    """The topics the group's members subscribe to, as OffsetDelete asks (KIP-496):
    none for a group with no members; `EveryTopic` when a member's subscription does not
    read; None for members of another protocol type than "consumer", whose offsets
    Kafka does not let go while they are in the group (NON_EMPTY_GROUP). A member's
    subscription is its metadata for the chosen protocol, or its first one before any
    is chosen (a consumer sends the same topics with every protocol)."""
    if not group.members:
        return frozenset()
    if group.protocol_type != "consumer":
        return None
    topics: set[str] = set()
    for member in group.members.values():
        offered = dict(member.protocols)
        metadata = offered.get(group.protocol_name or "", next(iter(offered.values()), b""))
        subscribed = consumer_topics(metadata)
        if subscribed is None:
            return EveryTopic()
        topics.update(subscribed)
    return frozenset(topics)


def consumer_assignment(assignment: bytes) -> list[tuple[str, list[int]]] | None:
    """The partitions of a "consumer" member's assignment (ConsumerProtocol Assignment,
    any version), or None for bytes that are not one."""
    try:
        reader = _Reader(assignment)
        reader.int16()  # version
        topics = []
        for _ in range(reader.count()):
            topic = reader.string()
            topics.append((topic, [reader.int32() for _ in range(reader.count())]))
        return topics
    except (struct.error, UnicodeDecodeError, ValueError):
        return None


class _Reader:
    """The non-flexible encoding of Kafka's ConsumerProtocol; every count is checked
    against the bytes left, so hostile bytes cost no more than their length."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def int16(self) -> int:
        (value,) = struct.unpack_from(">h", self.data, self.at)
        self.at += 2
        return int(value)

    def int32(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.at)
        self.at += 4
        return int(value)

    def count(self) -> int:
        count = self.int32()
        if not 0 <= count <= len(self.data) - self.at:
            raise ValueError(f"an array of {count} items in {len(self.data)} bytes")
        return count

    def string(self) -> str:
        length = self.int16()
        if not 0 <= length <= len(self.data) - self.at:
            raise ValueError(f"a string of {length} bytes in {len(self.data)}")
        self.at += length
        return self.data[self.at - length : self.at].decode()


# ---------------------------------------------------------------------------- helpers


def check_invariants(group: ClassicGroup) -> None:
    """What holds after every transition."""
    instances = [mb.instance_id for mb in group.members.values() if mb.instance_id is not None]
    assert len(instances) == len(set(instances)), f"an instance id of {group.group_id!r} repeats"
    assert all(i == mb.member_id for i, mb in group.members.items()), group
    assert not set(group.pending) & set(group.members), group
    assert (group.leader is None) == (not group.members), group
    assert group.leader is None or group.leader in group.members, group
    if group.members:
        assert group.state != EMPTY, group
        types = {mb.protocol_type for mb in group.members.values()}
        assert types == {group.protocol_type}, group
    if group.state in (COMPLETING_REBALANCE, STABLE):
        assert group.protocol_name in _common(group.members.values()), group
    if group.state != PREPARING_REBALANCE:
        assert not any(mb.joined for mb in group.members.values()), group
    if group.state != COMPLETING_REBALANCE:
        assert not any(mb.awaiting_sync or mb.pending_sync for mb in group.members.values())


def _member_error(
    group: ClassicGroup, member_id: str, instance_id: str | None, generation: int
) -> tuple[ErrorCode, str] | None:
    """Kafka's order: a fenced instance, an unknown member, then a wrong generation."""
    if instance_id is not None:
        holder = _holder(group, instance_id)
        if holder is not None and holder.member_id != member_id:
            return ErrorCode.FENCED_INSTANCE_ID, _fenced(member_id, holder)
    if member_id not in group.members:
        return _unknown(group, member_id, instance_id)
    if generation != group.generation:
        return (
            ErrorCode.ILLEGAL_GENERATION,
            f"generation {generation} is not group {group.group_id!r}'s {group.generation}",
        )
    return None


def _unknown(group: ClassicGroup, member_id: str, instance_id: str | None) -> tuple[ErrorCode, str]:
    successor = next((mb for mb in group.members.values() if mb.replaced == member_id), None)
    if successor is None and instance_id is not None:
        successor = _holder(group, instance_id)
    if successor is not None and member_id:
        return ErrorCode.FENCED_INSTANCE_ID, _fenced(member_id, successor)
    return (
        ErrorCode.UNKNOWN_MEMBER_ID,
        f'member {member_id!r} is not in group {group.group_id!r}: join with member_id ""',
    )


def _fenced(member_id: str, successor: Member) -> str:
    return (
        f"member {member_id!r} was replaced by member {successor.member_id!r}, which joined "
        f"with the same instance id {successor.instance_id!r}"
    )


def _join_error(error: ErrorCode, message: str, member_id: str = "") -> JoinAnswer:
    return JoinAnswer(error, message, member_id=member_id)


def _holder(group: ClassicGroup, instance_id: str) -> Member | None:
    return next((mb for mb in group.members.values() if mb.instance_id == instance_id), None)


def _common(members: Iterable[Member]) -> set[str]:
    """The protocols every one of `members` offers."""
    sets = [{name for name, _ in mb.protocols} for mb in members]
    return set.intersection(*sets) if sets else set()


def _compatible(others: Sequence[Member], req: Join) -> bool:
    """A member may join when the group is empty of others, or when it offers the
    others' protocol type and one protocol they all offer."""
    if not others:
        return True
    if any(mb.protocol_type != req.protocol_type for mb in others):
        return False
    return bool(_common(others) & {name for name, _ in req.protocols})


def _select(members: Iterable[Member]) -> str:
    """Kafka's rule: of the protocols every member offers, each member votes for the
    first of its own list; the most votes win (a tie: the one a member named first)."""
    members = list(members)
    candidates = _common(members)
    assert candidates, "a group whose members share no protocol"
    votes: Counter[str] = Counter()
    order: list[str] = []
    for member in members:
        vote = next(name for name, _ in member.protocols if name in candidates)
        votes[vote] += 1
        if vote not in order:
            order.append(vote)
    return max(order, key=lambda name: votes[name])


def _new_member(member_id: str, req: Join, now_ms: int, settings: ClassicSettings) -> Member:
    return Member(
        member_id=member_id,
        instance_id=req.instance_id,
        client_id=req.client_id,
        client_host=req.client_host,
        protocol_type=req.protocol_type,
        protocols=req.protocols,
        session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=_rebalance_timeout(req, settings),
        last_heartbeat_ms=now_ms,
    )


def _updated(member: Member, req: Join, now_ms: int, settings: ClassicSettings) -> Member:
    return replace(
        member,
        client_id=req.client_id,
        client_host=req.client_host,
        protocols=req.protocols,
        session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=_rebalance_timeout(req, settings),
        last_heartbeat_ms=now_ms,
    )


def _rebalance_timeout(req: Join, settings: ClassicSettings) -> int:
    """v0 has none (the session timeout); above group_max_rebalance_timeout_ms it is cut
    to that, so that no member holds a barrier longer."""
    asked = req.session_timeout_ms if req.rebalance_timeout_ms < 0 else req.rebalance_timeout_ms
    return min(asked, settings.max_rebalance_timeout_ms)


def _with_protocol_type(group: ClassicGroup) -> ClassicGroup:
    first = next(iter(group.members.values()))
    return replace(group, protocol_type=first.protocol_type)


def _put(group: ClassicGroup, member: Member) -> ClassicGroup:
    return replace(group, members={**group.members, member.member_id: member})
