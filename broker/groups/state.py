"""Consumer-group membership and reconciliation, pure logic (docs/protocol.md section 6,
KIP-848; docs/consumer-groups.md).

A `Group` is a value: its epoch, its members and the target assignment computed
by broker/groups/assignor.py at that epoch. Every change of membership, of a
subscription or of a subscribed topic's partition count bumps the group epoch
and recomputes the target at once.

The target says who *should* own what; `Member.assigned` says what the broker
counts as a member's *now*. They differ while partitions move, and the one rule
that matters is that no partition is ever in two members' `assigned`:

- a partition joins a member's `assigned` only while no other member has it;
- a partition leaves it only when the member's heartbeat no longer lists it in
  `owned` (the member let go), or when the member is removed.

A member with partitions to give up (`assigned` minus its target) is told its
new assignment without them and keeps its epoch until it has let go; then it
moves to the group's epoch. `check_invariants` runs after every transition.

Static membership (KIP-345): a member that joins with an `instance_id` another
member holds takes that member's place at once, with its partitions and target,
and the old member id is fenced (FENCED_INSTANCE_ID). The broker's `assigned`
stays single-owned; the one exception to the rule is outside it, in the world:
the replaced process, if it still runs, may go on reading until its next
heartbeat or commit is refused. A static member that leaves with epoch -2 stays
in the group, holding its partitions, until its session runs out.

No IO, no clock, no randomness: time comes in as `now_ms`, a new member's id as
an argument. Each transition returns the group's next deadline (a session or a
revocation running out), for the coordinator's timer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from broker.groups.assignor import TopicPartition, assign
from protocol import messages as m
from protocol.errors import ErrorCode

EMPTY, ASSIGNING, RECONCILING, STABLE, DEAD = m.GROUP_STATES
# ASSIGNING is never reported: the transition that bumps the group epoch computes
# the target before it returns. DEAD is a group the coordinator does not hold.
NO_DEADLINE = -1
NOTHING: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """The broker settings a transition needs (broker/config.py declares them)."""

    session_timeout_ms: int
    max_size: int
    max_rebalance_timeout_ms: int


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    member_epoch: int
    previous_epoch: int
    client_id: str
    subscribed_topics: frozenset[str]
    rebalance_timeout_ms: int
    last_heartbeat_ms: int
    client_host: str = ""
    """Where its joining heartbeat came from (Kafka's ConsumerGroupDescribe shows it)."""
    assigned: frozenset[TopicPartition] = NOTHING
    """What the broker counts as this member's: granted, or not yet let go."""
    pending_revocation: frozenset[TopicPartition] = NOTHING
    """Partitions it was told to give up and still holds."""
    revocation_deadline_ms: int = NO_DEADLINE
    last_sent: frozenset[TopicPartition] | None = None
    """The assignment last answered to it (None: must be sent with the next answer)."""
    instance_id: str | None = None
    """Its static membership's id; None for a dynamic member."""
    replaced: str | None = None
    """The member id it took the place of (same instance_id), fenced since."""

    @property
    def departed(self) -> bool:
        """A static member that left with epoch -2: it holds its partitions, runs nothing."""
        return self.member_epoch == m.MEMBER_EPOCH_LEAVE_STATIC

    def deadline_ms(self, session_timeout_ms: int) -> int:
        """When it is removed unless it heartbeats (or lets go of its revoked partitions)."""
        session = self.last_heartbeat_ms + session_timeout_ms
        if self.pending_revocation:
            return min(session, self.revocation_deadline_ms)
        return session


@dataclass(frozen=True, slots=True)
class Group:
    group_id: str
    group_epoch: int = 0
    members: Mapping[str, Member] = field(default_factory=dict)
    target: Mapping[str, frozenset[TopicPartition]] = field(default_factory=dict)
    partition_counts: Mapping[str, int] = field(default_factory=dict)
    """Partition counts of the subscribed topics that exist, as the target used them."""

    @property
    def state(self) -> str:
        """EMPTY, RECONCILING (a member is behind the group epoch or does not hold
        exactly its target yet; a departed static member has no epoch to catch up)
        or STABLE."""
        if not self.members:
            return EMPTY
        for member_id, member in self.members.items():
            behind = member.member_epoch != self.group_epoch and not member.departed
            if behind or member.assigned != self.target.get(member_id, NOTHING):
                return RECONCILING
        return STABLE

    def deadline_ms(self, session_timeout_ms: int) -> int:
        """The earliest member deadline, or NO_DEADLINE for a group without members."""
        return min(
            (member.deadline_ms(session_timeout_ms) for member in self.members.values()),
            default=NO_DEADLINE,
        )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A heartbeat's answer and the group after it (unchanged when refused)."""

    group: Group
    deadline_ms: int
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    member_id: str = ""
    member_epoch: int = -1
    assignment: frozenset[TopicPartition] | None = None
    replaced: str | None = None
    """The member this join took the place of (static membership), now fenced."""


@dataclass(frozen=True, slots=True)
class Expiry:
    """The group after removing the members whose time ran out, and why each went."""

    group: Group
    deadline_ms: int
    removed: Mapping[str, str] = field(default_factory=dict)


def heartbeat(
    group: Group,
    request: m.ConsumerGroupHeartbeatRequest,
    client_id: str | None,
    partition_counts: Mapping[str, int],
    now_ms: int,
    settings: GroupSettings,
    new_member_id: str,
    *,
    client_named: bool = False,
    client_host: str = "",
) -> Heartbeat:
    """One ConsumerGroupHeartbeat: join (member_id "", epoch 0; or a known id with
    epoch 0, a fresh join of that id), leave (epoch -1, or -2 for a static member
    keeping its partitions) or stay.

    `client_id` is the request envelope's (None keeps the member's); `partition_counts`
    holds at least the topics anyone in the group subscribes to, as they are now;
    `new_member_id` names the member if this is a join. `client_named`: the member
    names itself (Kafka's ConsumerGroupHeartbeat v1, KIP-1082), so an unknown id with
    epoch 0 joins under that id. A negative `rebalance_timeout_ms` keeps the member's
    (Kafka's clients send -1 when it did not change; the native decoder refuses it);
    `client_host` is recorded at a join."""
    session = settings.session_timeout_ms

    def refused(code: ErrorCode, message: str) -> Heartbeat:
        return Heartbeat(group, group.deadline_ms(session), code, message)

    member_id, epoch, instance_id = request.member_id, request.member_epoch, request.instance_id
    known = group.members.get(member_id)
    timeout = request.rebalance_timeout_ms
    if timeout < 0:
        if epoch == m.MEMBER_EPOCH_JOIN:
            return refused(ErrorCode.INVALID_REQUEST, "a join names its rebalance_timeout_ms")
        timeout = 0 if known is None else known.rebalance_timeout_ms  # unknown: refused below
    if timeout > settings.max_rebalance_timeout_ms:
        return refused(
            ErrorCode.INVALID_REQUEST,
            f"rebalance_timeout_ms={timeout} is above "
            f"group_max_rebalance_timeout_ms={settings.max_rebalance_timeout_ms}",
        )
    if known is None and ((member_id and not client_named) or epoch != m.MEMBER_EPOCH_JOIN):
        successor = _successor(group, member_id, instance_id)
        if successor is not None:
            return refused(ErrorCode.FENCED_INSTANCE_ID, _fenced_message(member_id, successor))
        return refused(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"member {member_id!r} is not in group {group.group_id!r}: join with "
            'member_id "" and member_epoch 0',
        )
    if known is not None and instance_id not in (None, known.instance_id):
        return refused(
            ErrorCode.INVALID_REQUEST,
            f"member {member_id!r} joined with instance_id {known.instance_id!r}, not "
            f'{instance_id!r}: an instance id is bound at a join with member_id ""',
        )
    static_leave = epoch == m.MEMBER_EPOCH_LEAVE_STATIC
    if known is not None and (
        epoch == m.MEMBER_EPOCH_LEAVE or (static_leave and known.instance_id is None)
    ):
        # A dynamic member leaving with -2 leaves as with -1, as in Kafka.
        members = dict(group.members)
        del members[member_id]
        left = _reassigned(group, members, partition_counts)
        return _answer(left, session, member_id=member_id, member_epoch=epoch)
    if known is not None and known.departed and epoch != m.MEMBER_EPOCH_JOIN:
        return refused(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member {member_id!r} left the group with member_epoch -2: rejoin with member_epoch 0",
        )
    if static_leave:
        assert known is not None
        return _depart(group, known, now_ms, session)
    owned = None if request.owned is None else _flatten(request.owned)
    if epoch == m.MEMBER_EPOCH_JOIN:
        if request.subscribed_topics is None:
            return refused(ErrorCode.INVALID_REQUEST, "a join must name its subscribed_topics")
        holder = None if known is not None or instance_id is None else _holder(group, instance_id)
        if holder is not None:
            joiner = (client_id, client_host)
            named = member_id or new_member_id
            return _replace(
                group, holder, request, joiner, partition_counts, now_ms, session, named
            )
        others = len(group.members) - (known is not None)
        if others >= settings.max_size:
            return refused(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"group {group.group_id!r} has group_max_size={settings.max_size} members",
            )
        member_id = member_id or new_member_id
        assert member_id not in group.members or known is not None, member_id
        joined = Member(
            member_id,
            member_epoch=m.MEMBER_EPOCH_JOIN,
            previous_epoch=m.MEMBER_EPOCH_NONE,
            client_id=client_id or "",
            subscribed_topics=frozenset(request.subscribed_topics),
            rebalance_timeout_ms=timeout,
            last_heartbeat_ms=now_ms,
            client_host=client_host,
            instance_id=instance_id if known is None else known.instance_id,
        )
        # A known id rejoining is a new member: what the old one held is released.
        group = _reassigned(group, {**group.members, member_id: joined}, partition_counts)
        return _reconciled(group, member_id, owned, now_ms, session, resend=True)
    assert known is not None
    # A full heartbeat (both lists) or one at the previous epoch comes from a member
    # that lost an answer or its connection: it gets its assignment again.
    full = request.subscribed_topics is not None and owned is not None
    if epoch == known.member_epoch:
        resend = full
    elif epoch == known.previous_epoch and owned is not None and owned <= known.assigned:
        resend = True
    else:
        return refused(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member_epoch={epoch} is not member {member_id!r}'s epoch {known.member_epoch}: "
            "rejoin with member_epoch 0",
        )
    member = replace(
        known,
        client_id=known.client_id if client_id is None else client_id,
        rebalance_timeout_ms=timeout,
        last_heartbeat_ms=now_ms,
    )
    subscribed = request.subscribed_topics
    members = {**group.members, member_id: member}
    if subscribed is not None and frozenset(subscribed) != known.subscribed_topics:
        members[member_id] = replace(member, subscribed_topics=frozenset(subscribed))
        group = _reassigned(group, members, partition_counts)
    elif _counts_of(members, partition_counts) != group.partition_counts:
        group = _reassigned(group, members, partition_counts)
    else:
        group = replace(group, members=members)
    return _reconciled(group, member_id, owned, now_ms, session, resend=resend)


def commit_error(group: Group | None, member_id: str, member_epoch: int) -> ErrorCode:
    """May this member commit offsets for the group (Kafka's validateOffsetCommit)?

    A negative epoch commits from outside the group: allowed while it has no
    members. Otherwise the member must be known (else UNKNOWN_MEMBER_ID, or
    FENCED_INSTANCE_ID when a static member took its place) and name its current
    epoch: a newer one is FENCED_MEMBER_EPOCH, an older one STALE_MEMBER_EPOCH. A
    static member that left (epoch -2) commits nothing: FENCED_MEMBER_EPOCH."""
    if group is None:
        return ErrorCode.NONE if member_epoch < 0 else ErrorCode.UNKNOWN_MEMBER_ID
    member = group.members.get(member_id)
    if member is None:
        if _successor(group, member_id, None) is not None:
            return ErrorCode.FENCED_INSTANCE_ID
        return ErrorCode.UNKNOWN_MEMBER_ID
    if member.departed or member_epoch > member.member_epoch:
        return ErrorCode.FENCED_MEMBER_EPOCH
    if member_epoch < member.member_epoch:
        return ErrorCode.STALE_MEMBER_EPOCH
    return ErrorCode.NONE


def expire(group: Group, now_ms: int, settings: GroupSettings) -> Expiry:
    """Remove the members whose session ran out or that kept revoked partitions past
    their rebalance_timeout_ms; their partitions are free at once."""
    session = settings.session_timeout_ms
    removed: dict[str, str] = {}
    for member_id, member in group.members.items():
        if member.last_heartbeat_ms + session <= now_ms:
            removed[member_id] = "session_timeout"
        elif member.pending_revocation and member.revocation_deadline_ms <= now_ms:
            removed[member_id] = "rebalance_timeout"
    if not removed:
        return Expiry(group, group.deadline_ms(session))
    members = {i: mb for i, mb in group.members.items() if i not in removed}
    after = _reassigned(group, members, group.partition_counts)
    check_invariants(after)
    return Expiry(after, after.deadline_ms(session), removed)


def check_invariants(group: Group) -> None:
    """What holds after every transition; above all, no partition has two owners."""
    held: set[TopicPartition] = set()
    total = 0
    for member_id, member in group.members.items():
        assert member.member_id == member_id, (member_id, member)
        assert member.pending_revocation <= member.assigned, member
        assert member.member_epoch <= group.group_epoch, (group.group_epoch, member)
        held |= member.assigned
        total += len(member.assigned)
    assert len(held) == total, f"a partition of {group.group_id!r} has two owners"
    instances = [mb.instance_id for mb in group.members.values() if mb.instance_id is not None]
    assert len(instances) == len(set(instances)), f"an instance id of {group.group_id!r} repeats"
    assert set(group.target) == set(group.members), group
    targets = [tp for tps in group.target.values() for tp in tps]
    assert len(targets) == len(set(targets)), f"the target of {group.group_id!r} repeats"


def _reassigned(
    group: Group, members: dict[str, Member], partition_counts: Mapping[str, int]
) -> Group:
    """The group with `members`, at the next epoch, its target recomputed from the
    previous one. A departed static member runs nothing, so what leaves its target
    leaves its partitions at once: no revocation of it is waited for."""
    counts = _counts_of(members, partition_counts)
    epoch = group.group_epoch + 1
    target = assign(
        {i: member.subscribed_topics for i, member in members.items()}, counts, group.target
    )
    return replace(
        group,
        group_epoch=epoch,
        members={
            i: replace(mb, assigned=mb.assigned & target[i]) if mb.departed else mb
            for i, mb in members.items()
        },
        target=target,
        partition_counts=counts,
    )


def _counts_of(
    members: Mapping[str, Member], partition_counts: Mapping[str, int]
) -> dict[str, int]:
    topics = set().union(*(member.subscribed_topics for member in members.values()))
    return {t: partition_counts[t] for t in sorted(topics) if t in partition_counts}


def _holder(group: Group, instance_id: str) -> Member | None:
    return next((mb for mb in group.members.values() if mb.instance_id == instance_id), None)


def _successor(group: Group, member_id: str, instance_id: str | None) -> Member | None:
    """The static member that took the place of unknown `member_id`: the one that replaced
    it, or the holder of the instance id its request names."""
    successor = None
    if member_id:
        successor = next((mb for mb in group.members.values() if mb.replaced == member_id), None)
    if successor is None and instance_id is not None:
        successor = _holder(group, instance_id)
    return successor


def _fenced_message(member_id: str, successor: Member) -> str:
    return (
        f"member {member_id!r} was replaced by member {successor.member_id!r}, which joined "
        f"with the same instance_id {successor.instance_id!r}"
    )


def _replace(
    group: Group,
    holder: Member,
    request: m.ConsumerGroupHeartbeatRequest,
    joiner: tuple[str | None, str],
    partition_counts: Mapping[str, int],
    now_ms: int,
    session_timeout_ms: int,
    new_member_id: str,
) -> Heartbeat:
    """A join with the instance id `holder` holds (KIP-345): the new member takes its
    place, its target and the partitions it holds, at once; `holder` is fenced.
    `joiner` is the new member's client id and host.

    What `holder` was giving up is released rather than inherited: the new process
    never owned it. The group epoch moves only if the subscription or a partition
    count changed, so the other members notice nothing."""
    assert request.subscribed_topics is not None
    target = group.target[holder.member_id]
    client_id, client_host = joiner
    successor = replace(
        holder,
        member_id=new_member_id,
        client_id=client_id or "",
        client_host=client_host,
        subscribed_topics=frozenset(request.subscribed_topics),
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        last_heartbeat_ms=now_ms,
        assigned=holder.assigned & target,
        pending_revocation=NOTHING,
        revocation_deadline_ms=NO_DEADLINE,
        last_sent=None,
        replaced=holder.member_id,
    )
    members = {i: mb for i, mb in group.members.items() if i != holder.member_id}
    members[new_member_id] = successor
    targets = {i: tps for i, tps in group.target.items() if i != holder.member_id}
    targets[new_member_id] = target
    group = replace(group, members=members, target=targets)
    changed = successor.subscribed_topics != holder.subscribed_topics
    if changed or _counts_of(members, partition_counts) != group.partition_counts:
        group = _reassigned(group, members, partition_counts)
    owned = None if request.owned is None else _flatten(request.owned)
    joined = _reconciled(group, new_member_id, owned, now_ms, session_timeout_ms, resend=True)
    return replace(joined, replaced=holder.member_id)


def _depart(group: Group, member: Member, now_ms: int, session_timeout_ms: int) -> Heartbeat:
    """A static member leaves with epoch -2: it keeps its target and the partitions it
    holds for the session timeout, counted from now; what it was giving up is free
    (it revoked everything before leaving), as in Kafka."""
    target = group.target[member.member_id]
    departed = replace(
        member,
        member_epoch=m.MEMBER_EPOCH_LEAVE_STATIC,
        previous_epoch=m.MEMBER_EPOCH_LEAVE_STATIC,
        last_heartbeat_ms=now_ms,
        assigned=member.assigned & target,
        pending_revocation=NOTHING,
        revocation_deadline_ms=NO_DEADLINE,
        last_sent=None,
    )
    group = replace(group, members={**group.members, member.member_id: departed})
    return _answer(
        group,
        session_timeout_ms,
        member_id=member.member_id,
        member_epoch=m.MEMBER_EPOCH_LEAVE_STATIC,
    )


def _reconciled(
    group: Group,
    member_id: str,
    owned: frozenset[TopicPartition] | None,
    now_ms: int,
    session_timeout_ms: int,
    *,
    resend: bool,
) -> Heartbeat:
    """Move one member toward its target: drop what it let go of, grant what no one
    holds, and advance its epoch once it holds nothing it must give up."""
    member = group.members[member_id]
    target = group.target[member_id]
    assigned = member.assigned
    if owned is not None:
        assigned -= (assigned - target) - owned
    pending = assigned - target
    wanted = target - assigned
    if wanted:
        others = set().union(*(o.assigned for i, o in group.members.items() if i != member_id))
        assigned |= wanted - others
    deadline = member.revocation_deadline_ms
    if not pending:
        deadline = NO_DEADLINE
    elif not member.pending_revocation:
        deadline = now_ms + member.rebalance_timeout_ms
    epoch, previous = member.member_epoch, member.previous_epoch
    if not pending and epoch != group.group_epoch:
        epoch, previous = group.group_epoch, epoch
    current = assigned & target
    answer = current if resend or current != member.last_sent else None
    member = replace(
        member,
        member_epoch=epoch,
        previous_epoch=previous,
        assigned=assigned,
        pending_revocation=pending,
        revocation_deadline_ms=deadline,
        last_sent=current,
    )
    group = replace(group, members={**group.members, member_id: member})
    return _answer(
        group, session_timeout_ms, member_id=member_id, member_epoch=epoch, assignment=answer
    )


def _answer(
    group: Group,
    session_timeout_ms: int,
    *,
    member_id: str,
    member_epoch: int,
    assignment: frozenset[TopicPartition] | None = None,
) -> Heartbeat:
    check_invariants(group)
    return Heartbeat(
        group,
        group.deadline_ms(session_timeout_ms),
        member_id=member_id,
        member_epoch=member_epoch,
        assignment=assignment,
    )


def _flatten(topics: Iterable[m.GroupTopicPartitions]) -> frozenset[TopicPartition]:
    return frozenset((t.topic, p) for t in topics for p in t.partitions)
