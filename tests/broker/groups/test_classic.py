"""The classic group state machine (broker/groups/classic.py), pure: JoinGroup's barrier,
generations, the leader's plan through SyncGroup, KIP-394, static members, timers."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from broker.groups import classic as c
from broker.groups.classic import A, ClassicGroup, ClassicSettings, Join, Step, Sync
from protocol.errors import ErrorCode

SETTINGS = ClassicSettings(
    max_size=10,
    min_session_timeout_ms=100,
    max_session_timeout_ms=60_000,
    max_rebalance_timeout_ms=60_000,
    initial_rebalance_delay_ms=0,
)
RANGE = (("range", b"r-meta"),)
_ids = itertools.count()


def new_id() -> str:
    return f"m{next(_ids)}"


def join_req(
    member_id: str = "",
    *,
    instance_id: str | None = None,
    protocols: c.Protocols = RANGE,
    protocol_type: str = "consumer",
    session_ms: int = 1_000,
    rebalance_ms: int = 5_000,
    known: bool = True,
) -> Join:
    return Join(
        member_id=member_id,
        instance_id=instance_id,
        protocol_type=protocol_type,
        protocols=protocols,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        client_id="c",
        client_host="127.0.0.1",
        require_known_member_id=known,
    )


def join(
    group: ClassicGroup, req: Join, now: int = 0, s: ClassicSettings = SETTINGS
) -> Step[c.JoinAnswer]:
    return c.join(group, req, now, s, new_id())


def sync(
    group: ClassicGroup, member_id: str, generation: int, plan: dict[str, bytes]
) -> Step[c.SyncAnswer]:
    return c.sync(group, Sync(member_id, generation, None, None, None, plan), 0)


def answered(step: Step[A]) -> A:
    assert step.answer is not None, step
    return step.answer


def waiter(step: Step[c.JoinAnswer]) -> str:
    assert step.waiting is not None and step.answer is None, step
    return step.waiting


def first_member(
    group: ClassicGroup, now: int = 0, session_ms: int = 10_000
) -> tuple[ClassicGroup, str]:
    """A member through KIP-394's two joins; answered at once (the only member)."""
    step = join(group, join_req(session_ms=session_ms), now)
    assert isinstance(step.answer, c.JoinAnswer)
    assert answered(step).error == ErrorCode.MEMBER_ID_REQUIRED
    member_id = answered(step).member_id
    step = join(step.group, join_req(member_id, session_ms=session_ms), now)
    return step.group, member_id


def test_kip_394_then_a_lone_member_leads_generation_1() -> None:
    group = ClassicGroup("g")
    step = join(group, join_req())
    assert answered(step).error == ErrorCode.MEMBER_ID_REQUIRED
    member_id = answered(step).member_id
    assert member_id in step.group.pending and not step.group.members
    step = join(step.group, join_req(member_id))
    answer = step.answer
    assert isinstance(answer, c.JoinAnswer) and answer.error == ErrorCode.NONE
    assert answer.generation == 1 and answer.leader == member_id == answer.member_id
    assert answer.protocol_name == "range"
    assert answer.members == ((member_id, None, b"r-meta"),)
    assert step.group.state == c.COMPLETING_REBALANCE
    synced = sync(step.group, member_id, 1, {member_id: b"plan"})
    assert synced.answer == c.SyncAnswer(
        protocol_type="consumer", protocol_name="range", assignment=b"plan"
    )
    assert synced.group.state == c.STABLE


def test_a_second_member_rebalances_and_followers_wait_for_the_leaders_plan() -> None:
    group, a = first_member(ClassicGroup("g"))
    group = sync(group, a, 1, {a: b"a1"}).group
    step = join(group, join_req(known=False))  # v3: no KIP-394
    b = waiter(step)
    assert b is not None and step.answer is None
    assert step.group.state == c.PREPARING_REBALANCE
    hb = c.heartbeat(step.group, a, None, 1, 10)
    assert hb.answer == ErrorCode.REBALANCE_IN_PROGRESS
    step = join(hb.group, join_req(a))
    assert answered(step).leader == a and answered(step).generation == 2
    assert [m[0] for m in answered(step).members] == [a, b]
    assert step.joins[b].leader == a and step.joins[b].members == ()
    group = step.group
    wait = sync(group, b, 2, {})
    assert wait.answer is None and wait.waiting == b
    done = sync(wait.group, a, 2, {a: b"a2", b: b"b2"})
    assert answered(done).assignment == b"a2" and done.syncs[b].assignment == b"b2"
    assert done.group.state == c.STABLE
    assert answered(c.sync(done.group, Sync(b, 1, None, None, None, {}), 0)).error == (
        ErrorCode.ILLEGAL_GENERATION
    )


def test_the_barrier_ends_at_the_rebalance_timeout_without_the_silent_member() -> None:
    group, a = first_member(ClassicGroup("g"))
    group = sync(group, a, 1, {a: b""}).group
    step = join(group, join_req(known=False, rebalance_ms=5_000), now=100)
    b = waiter(step)
    assert step.deadline_ms == 5_100
    expired = c.expire(step.group, 5_100, SETTINGS)
    assert expired.removed == {a: "rebalance_timeout"}
    assert expired.joins[b].leader == b and expired.joins[b].generation == 2
    assert list(expired.group.members) == [b]


def test_the_protocol_is_one_every_member_offers() -> None:
    group = ClassicGroup("g")
    both = (("cooperative-sticky", b"c"), ("range", b"r"))
    step = join(group, join_req(protocols=both, known=False))
    a = answered(step).member_id
    assert answered(step).protocol_name == "cooperative-sticky"
    group = sync(step.group, a, 1, {}).group
    step = join(group, join_req(protocols=RANGE, known=False))
    b = waiter(step)
    step = join(step.group, join_req(a, protocols=both))
    assert answered(step).protocol_name == "range"
    assert dict((m[0], m[2]) for m in answered(step).members) == {a: b"r", b: b"r-meta"}
    refused = join(step.group, join_req(protocols=(("roundrobin", b""),), known=False))
    assert answered(refused).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    other = join(step.group, join_req(protocol_type="connect", known=False))
    assert answered(other).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_session_timeout_bounds_and_expiry() -> None:
    low = join(ClassicGroup("g"), join_req(session_ms=50))
    assert answered(low).error == ErrorCode.INVALID_SESSION_TIMEOUT
    group, a = first_member(ClassicGroup("g"), session_ms=1_000)
    group = sync(group, a, 1, {}).group
    assert group.deadline_ms() == 1_000
    assert c.expire(group, 999, SETTINGS).group.members
    gone = c.expire(group, 1_000, SETTINGS)
    assert gone.removed == {a: "session_timeout"}
    assert gone.group.is_empty and gone.group.state == c.EMPTY


def test_unknown_and_stale_members() -> None:
    group, a = first_member(ClassicGroup("g"))
    group = sync(group, a, 1, {}).group
    assert c.heartbeat(group, "nobody", None, 1, 0).answer == ErrorCode.UNKNOWN_MEMBER_ID
    assert c.heartbeat(group, a, None, 7, 0).answer == ErrorCode.ILLEGAL_GENERATION
    assert answered(join(group, join_req("nobody"))).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert c.commit_error(group, a, 1) == ErrorCode.NONE
    assert c.commit_error(group, a, 0) == ErrorCode.ILLEGAL_GENERATION
    assert c.commit_error(group, "", -1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert c.commit_error(None, "", -1) == ErrorCode.NONE
    assert c.commit_error(None, "x", 3) == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_static_member_restarts_without_a_rebalance_and_fences_its_old_id() -> None:
    group = ClassicGroup("g")
    a = join(group, join_req(instance_id="i-a", known=True))
    assert answered(a).error == ErrorCode.NONE  # a static member skips KIP-394
    a_id = answered(a).member_id
    b = join(a.group, join_req(instance_id="i-b"))
    b_id = waiter(b)
    step = join(b.group, join_req(a_id, instance_id="i-a"))
    group = step.group
    group = sync(group, a_id, 2, {a_id: b"A", b_id: b"B"}).group
    assert group.state == c.STABLE
    restarted = join(group, join_req(instance_id="i-b"))
    new_b = answered(restarted).member_id
    assert new_b != b_id and answered(restarted).generation == 2
    assert answered(restarted).leader == a_id and answered(restarted).members == ()
    group = restarted.group
    assert group.state == c.STABLE and group.generation == 2
    assert answered(c.sync(group, Sync(new_b, 2, "i-b", None, None, {}), 0)).assignment == b"B"
    assert c.heartbeat(group, b_id, None, 2, 0).answer == ErrorCode.FENCED_INSTANCE_ID
    assert c.heartbeat(group, b_id, "i-b", 2, 0).answer == ErrorCode.FENCED_INSTANCE_ID
    assert c.commit_error(group, b_id, 2) == ErrorCode.FENCED_INSTANCE_ID
    # The leader restarts: the new id is answered as a follower, the old leader named.
    lead = join(group, join_req(instance_id="i-a"))
    assert answered(lead).leader == a_id != answered(lead).member_id
    assert lead.group.leader == answered(lead).member_id and lead.group.state == c.STABLE


def test_leave_group_batches_and_a_leader_leaving() -> None:
    group = ClassicGroup("g")
    a = join(group, join_req(instance_id="i-a"))
    b = join(a.group, join_req(known=False))
    step = join(b.group, join_req(answered(a).member_id, instance_id="i-a"))
    a_id, b_id = answered(a).member_id, waiter(b)
    group = sync(step.group, a_id, 2, {}).group
    left = c.leave(group, [("", "i-a"), ("nobody", None), ("", "i-x")], 0, SETTINGS)
    assert left.answer == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.UNKNOWN_MEMBER_ID]
    assert left.removed == {a_id: "left"}
    assert left.group.leader == b_id and left.group.state == c.PREPARING_REBALANCE
    fenced = c.leave(group, [("other", "i-a")], 0, SETTINGS)
    assert fenced.answer == [ErrorCode.FENCED_INSTANCE_ID]


def test_a_sync_that_never_comes_rebalances() -> None:
    group, a = first_member(ClassicGroup("g"))
    assert group.state == c.COMPLETING_REBALANCE and group.deadline_ms() == 5_000
    gone = c.expire(group, 5_000, SETTINGS)
    assert gone.removed == {a: "sync_timeout"} and gone.group.is_empty


def test_the_initial_delay_waits_for_more_members() -> None:
    slow = ClassicSettings(10, 100, 60_000, 60_000, initial_rebalance_delay_ms=300)
    a = join(ClassicGroup("g"), join_req(known=False), 0, slow)
    assert a.answer is None and a.deadline_ms == 300
    b = join(a.group, join_req(known=False), 200, slow)
    assert b.answer is None and b.deadline_ms == 500
    done = c.expire(b.group, 500, slow)
    assert {j.generation for j in done.joins.values()} == {1} and len(done.joins) == 2


# ------------------------------------------------------------------ random histories

OPS = st.lists(
    st.tuples(
        st.sampled_from(["join", "rejoin", "static", "sync", "heartbeat", "leave", "tick"]),
        st.integers(0, 3),
        st.integers(0, 2_000),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_random_histories_keep_the_invariants(ops: list[tuple[str, int, int]]) -> None:
    """check_invariants runs after every transition; besides, a waiting member is
    answered once, every answered generation is the group's, and the leader is told of
    every member."""
    group = ClassicGroup("g")
    now = 0
    waiting: set[str] = set()
    for op, pick, dt in ops:
        now += dt
        ids = list(group.members) + list(group.pending)
        target = ids[pick % len(ids)] if ids else ""
        member = group.members.get(target)
        step: Step[Any]
        if op == "join":
            step = join(group, join_req(known=pick % 2 == 0), now)
        elif op == "rejoin":
            step = join(group, join_req(target), now)
        elif op == "static":
            step = join(group, join_req(instance_id=f"i{pick}"), now)
        elif op == "sync" and member is not None:
            plan = {i: i.encode() for i in group.members} if target == group.leader else {}
            step = c.sync(group, Sync(target, group.generation, None, None, None, plan), now)
        elif op == "heartbeat" and member is not None:
            step = c.heartbeat(group, target, None, group.generation, now)
        elif op == "leave":
            step = c.leave(group, [(target, None)], now, SETTINGS)
        else:
            step = c.expire(group, now, SETTINGS)
        for member_id, answer in step.joins.items():
            assert member_id in waiting
            waiting.discard(member_id)
            if answer.error == ErrorCode.NONE:
                assert answer.generation == step.group.generation
                if answer.leader == member_id:
                    assert {m[0] for m in answer.members} == set(step.group.members)
        for member_id in step.syncs:
            assert member_id in waiting
            waiting.discard(member_id)
        if step.waiting is not None:
            waiting.add(step.waiting)
        group = step.group
        assert group.deadline_ms() == c.NO_DEADLINE or group.deadline_ms() >= 0


# ------------------------------------------------------------------ members' bytes


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_a_consumer_members_subscription_and_assignment_are_read(version: int) -> None:
    subscription = ConsumerProtocolSubscription(topics=["a", "bb"], user_data=b"u")
    assert c.consumer_topics(bytes(subscription.encode(version=version))) == ["a", "bb"]
    assignment = ConsumerProtocolAssignment(
        assigned_partitions=[
            ConsumerProtocolAssignment.TopicPartition(topic="a", partitions=[0, 2])
        ],
        user_data=None,
    )
    encoded = bytes(assignment.encode(version=min(version, 1)))
    assert c.consumer_assignment(encoded) == [("a", [0, 2])]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_bytes_that_are_no_consumer_protocol_read_as_nothing(data: bytes) -> None:
    """Whatever a member sends, reading it ends within its length, without an error."""
    topics = c.consumer_topics(data)
    assert topics is None or isinstance(topics, list)
    assignment = c.consumer_assignment(data)
    assert assignment is None or isinstance(assignment, list)
    huge_count = b"\x00\x00\x7f\xff\xff\xff"
    assert c.consumer_topics(huge_count) is None and c.consumer_assignment(huge_count) is None
