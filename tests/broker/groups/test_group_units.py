"""Unit tests of the consumer-group core, no broker: the assignor's balance and
stickiness (broker/groups/assignor.py) and the membership transitions, fencing codes,
timeouts, static membership and the no-two-owners invariant (broker/groups/state.py)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio
import pytest

from broker.config import BrokerConfig
from broker.groups.assignor import TopicPartition, assign
from broker.groups.coordinator import GroupCoordinator
from broker.groups.state import (
    EMPTY,
    RECONCILING,
    STABLE,
    Group,
    GroupSettings,
    Heartbeat,
    check_invariants,
    commit_error,
    expire,
    heartbeat,
)
from protocol import messages as m
from protocol.errors import ErrorCode

SETTINGS = GroupSettings(session_timeout_ms=10_000, max_size=50, max_rebalance_timeout_ms=60_000)

# ------------------------------------------------------------------ the assignor


def _all(counts: Mapping[str, int], topics: frozenset[str]) -> set[TopicPartition]:
    return {(t, p) for t in topics for p in range(counts.get(t, 0))}


def _check_complete(
    out: Mapping[str, frozenset[TopicPartition]],
    subs: Mapping[str, frozenset[str]],
    counts: Mapping[str, int],
) -> None:
    """Every partition of a subscribed topic is given to exactly one of its subscribers."""
    assert set(out) == set(subs)
    given = [tp for tps in out.values() for tp in tps]
    assert len(given) == len(set(given)), "a partition was given twice"
    wanted = set().union(*(_all(counts, topics) for topics in subs.values()))
    assert set(given) == wanted
    for member, tps in out.items():
        assert all(t in subs[member] for t, _ in tps), (member, tps)


def _check_balanced(
    out: Mapping[str, frozenset[TopicPartition]], subs: Mapping[str, frozenset[str]]
) -> None:
    """No partition could move to a subscriber holding two fewer; so members with the
    same subscription differ by at most one."""
    for a, b in itertools.permutations(out, 2):
        if len(out[a]) > len(out[b]) + 1:
            assert not any(t in subs[b] for t, _ in out[a]), (a, b, out)
        if subs[a] == subs[b]:
            assert abs(len(out[a]) - len(out[b])) <= 1, (a, b, out)


def _least_moves(kept: Mapping[str, int], total: int) -> int:
    """By brute force: the fewest kept partitions any balanced homogeneous assignment
    must take from their owner (each member holds total // n or one more)."""
    members = sorted(kept)
    base, extra = divmod(total, len(members))
    best = None
    for bigger in itertools.combinations(members, extra):
        quota = {mb: base + (mb in bigger) for mb in members}
        moved = sum(max(0, kept[mb] - quota[mb]) for mb in members)
        best = moved if best is None else min(best, moved)
    assert best is not None
    return best


def _kept_counts(
    previous: Mapping[str, frozenset[TopicPartition]],
    subs: Mapping[str, frozenset[str]],
    counts: Mapping[str, int],
) -> dict[str, int]:
    return {
        mb: len([tp for tp in previous.get(mb, ()) if tp in _all(counts, subs[mb])]) for mb in subs
    }


def _moved(
    previous: Mapping[str, frozenset[TopicPartition]], out: Mapping[str, frozenset[TopicPartition]]
) -> int:
    """Partitions taken from a member that is still there and still could hold them."""
    return sum(len(previous.get(mb, frozenset()) - tps) for mb, tps in out.items())


def test_a_fresh_group_gets_an_even_split() -> None:
    subs = {mb: frozenset({"t"}) for mb in ("a", "b", "c")}
    out = assign(subs, {"t": 6}, {})
    assert out == {
        "a": frozenset({("t", 0), ("t", 1)}),
        "b": frozenset({("t", 2), ("t", 3)}),
        "c": frozenset({("t", 4), ("t", 5)}),
    }


def test_one_join_and_one_leave_move_as_little_as_balance_needs() -> None:
    subs = {mb: frozenset({"t"}) for mb in ("a", "b", "c")}
    three = assign(subs, {"t": 6}, {})
    four = assign({**subs, "d": frozenset({"t"})}, {"t": 6}, three)
    assert _moved(three, four) == 1 and len(four["d"]) == 1
    assert sorted(len(tps) for tps in four.values()) == [1, 1, 2, 2]
    without_b = {mb: tps for mb, tps in four.items() if mb != "b"}
    two_left = assign({mb: subs.get(mb, frozenset({"t"})) for mb in without_b}, {"t": 6}, four)
    assert _moved(four, two_left) == 0  # b's partitions go to the others; nothing else moves
    assert sorted(len(tps) for tps in two_left.values()) == [2, 2, 2]


def test_topics_that_do_not_exist_are_skipped_and_more_members_than_partitions_idle() -> None:
    subs = {mb: frozenset({"t", "missing"}) for mb in ("a", "b", "c")}
    out = assign(subs, {"t": 2}, {})
    assert sorted(len(tps) for tps in out.values()) == [0, 1, 1]
    _check_complete(out, subs, {"t": 2})


@pytest.mark.parametrize("seed", range(200))
def test_homogeneous_assignments_are_complete_balanced_and_minimally_moved(seed: int) -> None:
    rng = random.Random(seed)
    topics = {f"t{i}": rng.randint(0, 9) for i in range(rng.randint(1, 3))}
    topic_set = frozenset(rng.sample(sorted(topics), rng.randint(1, len(topics))))
    before = [f"m{i}" for i in range(rng.randint(1, 6))]
    previous = assign(dict.fromkeys(before, topic_set), topics, {})
    if rng.random() < 0.3:  # a lopsided previous target, as from an older membership
        everything = sorted(_all(topics, topic_set))
        previous = {before[0]: frozenset(everything)}
    after = sorted(set(rng.sample(before, rng.randint(0, len(before)))) | {"new1", "new2"})
    after = after[: rng.randint(1, len(after))]
    subs = dict.fromkeys(after, topic_set)
    grown = {t: n + rng.choice((0, 0, 2)) for t, n in topics.items()}
    out = assign(subs, grown, previous)
    _check_complete(out, subs, grown)
    _check_balanced(out, subs)
    kept = _kept_counts(previous, subs, grown)
    assert _moved(previous, out) == _least_moves(kept, len(_all(grown, topic_set)))
    assert assign(dict(reversed(subs.items())), grown, previous) == out  # deterministic


@pytest.mark.parametrize("seed", range(200))
def test_mixed_subscriptions_are_complete_and_balanced(seed: int) -> None:
    rng = random.Random(1000 + seed)
    topics = {f"t{i}": rng.randint(1, 8) for i in range(rng.randint(2, 4))}
    names = sorted(topics)
    members = [f"m{i}" for i in range(rng.randint(2, 7))]
    subs = {mb: frozenset(rng.sample(names, rng.randint(1, len(names)))) for mb in members}
    previous = assign(subs, topics, {})
    _check_complete(previous, subs, topics)
    _check_balanced(previous, subs)
    # Someone changes subscription, someone leaves, someone joins.
    changed = dict(subs)
    changed[members[0]] = frozenset(rng.sample(names, rng.randint(1, len(names))))
    changed.pop(members[-1])
    changed["late"] = frozenset(rng.sample(names, rng.randint(1, len(names))))
    out = assign(changed, topics, previous)
    _check_complete(out, changed, topics)
    _check_balanced(out, changed)
    assert assign(dict(reversed(changed.items())), topics, previous) == out
    # Sticky: with nothing changed, nothing moves.
    assert assign(changed, topics, out) == out
    assert assign(subs, topics, previous) == previous


# ------------------------------------------------------------------ transitions


def _owned(tps: frozenset[TopicPartition] | set[TopicPartition]) -> list[m.GroupTopicPartitions]:
    topics: dict[str, list[int]] = {}
    for t, p in sorted(tps):
        topics.setdefault(t, []).append(p)
    return [m.GroupTopicPartitions(t, ps) for t, ps in topics.items()]


def _request(
    member_id: str,
    epoch: int,
    *,
    subscribed: list[str] | None = None,
    owned: frozenset[TopicPartition] | set[TopicPartition] | None = None,
    rebalance_timeout_ms: int = 30_000,
    instance_id: str | None = None,
) -> m.ConsumerGroupHeartbeatRequest:
    return m.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id=member_id,
        member_epoch=epoch,
        rebalance_timeout_ms=rebalance_timeout_ms,
        subscribed_topics=subscribed,
        owned=None if owned is None else _owned(owned),
        instance_id=instance_id,
    )


@dataclass
class Harness:
    """A group driven through heartbeats, with a clock and the topics' partition counts."""

    group: Group = field(default_factory=lambda: Group("g"))
    counts: dict[str, int] = field(default_factory=lambda: {"t": 6})
    now_ms: int = 1_000
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def beat(self, request: m.ConsumerGroupHeartbeatRequest, client_id: str = "c") -> Heartbeat:
        result = heartbeat(
            self.group,
            request,
            client_id,
            self.counts,
            self.now_ms,
            SETTINGS,
            f"member-{next(self.ids)}",
        )
        if result.error:
            assert result.group is self.group
        self.group = result.group
        check_invariants(self.group)
        return result

    def join(self, topics: list[str] | None = None, instance_id: str | None = None) -> Heartbeat:
        result = self.beat(_request("", 0, subscribed=topics or ["t"], instance_id=instance_id))
        assert result.error == ErrorCode.NONE, result
        return result


def _tps(*indexes: int, topic: str = "t") -> frozenset[TopicPartition]:
    return frozenset((topic, i) for i in indexes)


def test_the_first_member_gets_every_partition_and_the_group_is_stable() -> None:
    h = Harness()
    a = h.join()
    assert (a.member_id, a.member_epoch, a.assignment) == ("member-0", 1, _tps(*range(6)))
    assert (h.group.group_epoch, h.group.state) == (1, STABLE)
    again = h.beat(_request(a.member_id, 1, owned=a.assignment))
    assert again.assignment is None  # unchanged since the last answer
    assert a.deadline_ms == h.now_ms + SETTINGS.session_timeout_ms


def test_a_partition_moves_only_after_its_owner_lets_go() -> None:
    h = Harness()
    a = h.join()
    b = h.join()
    assert (b.member_epoch, b.assignment) == (2, frozenset())  # a still holds everything
    assert h.group.state == RECONCILING
    # a is told to keep three; its epoch stays until it gives the others up.
    told = h.beat(_request(a.member_id, 1, owned=a.assignment))
    assert (told.member_epoch, told.assignment) == (1, _tps(0, 1, 2))
    assert h.group.members[a.member_id].pending_revocation == _tps(3, 4, 5)
    # It has not let go yet (owned unchanged): b still gets nothing.
    assert h.beat(_request(a.member_id, 1)).assignment is None
    assert h.beat(_request(b.member_id, 2)).assignment is None
    assert h.group.members[b.member_id].assigned == frozenset()
    # It lets go of 3 and 4 only: 5 stays its own, the others may go to b.
    h.beat(_request(a.member_id, 1, owned=_tps(0, 1, 2, 5)))
    assert h.group.members[a.member_id].assigned == _tps(0, 1, 2, 5)
    assert h.beat(_request(b.member_id, 2)).assignment == _tps(3, 4)
    done = h.beat(_request(a.member_id, 1, owned=_tps(0, 1, 2)))
    assert (done.member_epoch, done.assignment) == (2, None)
    assert h.beat(_request(b.member_id, 2, owned=_tps(3, 4))).assignment == _tps(3, 4, 5)
    assert h.group.state == STABLE


def test_a_leave_frees_the_partitions_at_once() -> None:
    h = Harness()
    a = h.join()
    b = h.join()
    h.beat(_request(a.member_id, 1, owned=_tps(*range(6))))
    h.beat(_request(a.member_id, 1, owned=_tps(0, 1, 2)))
    h.beat(_request(b.member_id, 2, owned=set()))
    left = h.beat(_request(a.member_id, m.MEMBER_EPOCH_LEAVE))
    assert (left.member_id, left.member_epoch, h.group.group_epoch) == (a.member_id, -1, 3)
    assert h.beat(_request(b.member_id, 2)).assignment == _tps(*range(6))
    assert h.group.members[b.member_id].member_epoch == 3
    h.beat(_request(b.member_id, 3, owned=_tps(*range(6))))
    gone = h.beat(_request(b.member_id, m.MEMBER_EPOCH_LEAVE))
    assert gone.error == ErrorCode.NONE and h.group.state == EMPTY
    assert gone.deadline_ms == -1


@pytest.mark.parametrize(
    ("member", "epoch", "owned", "code"),
    [
        ("known", 2, None, ErrorCode.FENCED_MEMBER_EPOCH),  # ahead of its epoch
        ("known", 7, None, ErrorCode.FENCED_MEMBER_EPOCH),
        ("known", -5, None, ErrorCode.FENCED_MEMBER_EPOCH),
        ("unknown", 1, None, ErrorCode.UNKNOWN_MEMBER_ID),
        ("unknown", 0, None, ErrorCode.UNKNOWN_MEMBER_ID),  # the broker names members
        ("unknown", -1, None, ErrorCode.UNKNOWN_MEMBER_ID),
        ("", 1, None, ErrorCode.UNKNOWN_MEMBER_ID),
        ("", -1, None, ErrorCode.UNKNOWN_MEMBER_ID),
    ],
)
def test_fencing_codes(member: str, epoch: int, owned: None, code: ErrorCode) -> None:
    h = Harness()
    a = h.join()
    member_id = {"known": a.member_id, "unknown": "nobody"}.get(member, member)
    before = h.group
    result = h.beat(_request(member_id, epoch, owned=owned))
    assert result.error == code and result.message
    assert h.group is before


def test_a_member_that_names_itself_joins_under_its_own_id() -> None:
    """KIP-1082 (Kafka's heartbeat v1): with `client_named`, an unknown id at epoch 0
    joins under that id, and the host is recorded; without it the broker names
    members (test_fencing_codes)."""
    h = Harness()

    def named(request: m.ConsumerGroupHeartbeatRequest) -> Heartbeat:
        result = heartbeat(
            h.group,
            request,
            "c",
            h.counts,
            h.now_ms,
            SETTINGS,
            "unused",
            client_named=True,
            client_host="10.0.0.7",
        )
        h.group = result.group
        return result

    joined = named(_request("kafka-chosen", 0, subscribed=["t"]))
    assert (joined.error, joined.member_id, joined.member_epoch) == (0, "kafka-chosen", 1)
    assert h.group.members["kafka-chosen"].client_host == "10.0.0.7"
    assert named(_request("other", 1)).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_negative_rebalance_timeout_keeps_the_members() -> None:
    """Kafka's clients send -1 when the timeout did not change: the member keeps its
    own; a join must name one; an unknown member is still UNKNOWN_MEMBER_ID."""
    h = Harness()
    a = h.join()
    kept = h.beat(_request(a.member_id, 1, rebalance_timeout_ms=-1))
    assert kept.error == ErrorCode.NONE
    assert h.group.members[a.member_id].rebalance_timeout_ms == 30_000
    join = _request("", 0, subscribed=["t"], rebalance_timeout_ms=-1)
    assert h.beat(join).error == ErrorCode.INVALID_REQUEST
    assert h.beat(_request("nobody", 1, rebalance_timeout_ms=-1)).error == (
        ErrorCode.UNKNOWN_MEMBER_ID
    )


def test_the_previous_epoch_is_accepted_when_what_it_owns_is_assigned_to_it() -> None:
    h = Harness()
    a = h.join()
    b = h.join()
    h.beat(_request(a.member_id, 1, owned=a.assignment))
    bumped = h.beat(_request(a.member_id, 1, owned=_tps(0, 1, 2)))
    assert bumped.member_epoch == 2  # this answer is lost on its way
    # A stale epoch with owned outside its assignment, or without owned: fenced.
    for owned in (_tps(0, 1, 2, 3), None):
        assert h.beat(_request(a.member_id, 1, owned=owned)).error == ErrorCode.FENCED_MEMBER_EPOCH
    again = h.beat(_request(a.member_id, 1, owned=_tps(0, 1, 2)))
    assert (again.error, again.member_epoch, again.assignment) == (0, 2, _tps(0, 1, 2))
    assert h.beat(_request(b.member_id, 2)).assignment == _tps(3, 4, 5)


def test_a_full_heartbeat_gets_the_assignment_again() -> None:
    h = Harness()
    a = h.join()
    assert h.beat(_request(a.member_id, 1)).assignment is None
    full = h.beat(_request(a.member_id, 1, subscribed=["t"], owned=set()))
    assert full.assignment == _tps(*range(6))


def test_a_known_id_rejoining_is_a_fresh_member() -> None:
    h = Harness()
    a = h.join()
    b = h.join()
    h.beat(_request(a.member_id, 1, owned=a.assignment))
    again = h.beat(_request(a.member_id, 0, subscribed=["t"]))
    # Its partitions were released and the new target is granted at once.
    assert (again.member_id, again.member_epoch, h.group.group_epoch) == (a.member_id, 3, 3)
    assert again.assignment == _tps(0, 1, 2)
    assert h.beat(_request(b.member_id, 2)).assignment == _tps(3, 4, 5)


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (_request("", 0), ErrorCode.INVALID_REQUEST),  # a join names its topics
        (
            _request("", 0, subscribed=["t"], rebalance_timeout_ms=60_001),
            ErrorCode.INVALID_REQUEST,
        ),
    ],
)
def test_bad_joins_are_refused(request_: m.ConsumerGroupHeartbeatRequest, code: ErrorCode) -> None:
    h = Harness()
    result = h.beat(request_)
    assert result.error == code and h.group.state == EMPTY and h.group.group_epoch == 0


def test_a_full_group_refuses_one_more() -> None:
    h = Harness()
    small = GroupSettings(10_000, max_size=2, max_rebalance_timeout_ms=60_000)
    ids = []
    for i in range(3):
        result = heartbeat(
            h.group, _request("", 0, subscribed=["t"]), None, h.counts, 0, small, str(i)
        )
        h.group = result.group
        ids.append(result)
    assert [r.error for r in ids] == [0, 0, ErrorCode.GROUP_MAX_SIZE_REACHED]
    # A member of a full group may still rejoin with its id.
    rejoin = heartbeat(h.group, _request("0", 0, subscribed=["t"]), None, h.counts, 0, small, "x")
    assert (rejoin.error, rejoin.member_id) == (0, "0")


def test_subscription_and_partition_count_changes_bump_the_epoch() -> None:
    h = Harness()
    a = h.join(["t", "later"])
    assert h.group.partition_counts == {"t": 6}  # "later" does not exist yet
    same = h.beat(_request(a.member_id, 1, subscribed=["later", "t"], owned=a.assignment))
    assert h.group.group_epoch == 1 and same.assignment == a.assignment  # a full heartbeat
    h.counts["later"] = 2
    grown = h.beat(_request(a.member_id, 1))
    assert h.group.group_epoch == 2
    assert grown.assignment == _tps(*range(6)) | _tps(0, 1, topic="later")
    h.counts["t"] = 8
    assert len(h.beat(_request(a.member_id, 2)).assignment or ()) == 10
    narrowed = h.beat(_request(a.member_id, 3, subscribed=["later"]))
    assert h.group.group_epoch == 4 and narrowed.assignment == _tps(0, 1, topic="later")
    assert narrowed.member_epoch == 3  # still holds the partitions of t
    done = h.beat(_request(a.member_id, 3, owned=_tps(0, 1, topic="later")))
    assert (done.member_epoch, h.group.state) == (4, STABLE)


def test_a_silent_member_is_removed_when_its_session_runs_out() -> None:
    h = Harness()
    a = h.join()
    b = h.join()
    h.now_ms += 4_000
    h.beat(_request(b.member_id, 2))
    deadline = a.deadline_ms
    assert deadline == 11_000 and h.group.deadline_ms(SETTINGS.session_timeout_ms) == deadline
    early = expire(h.group, deadline - 1, SETTINGS)
    assert early.group is h.group and not early.removed and early.deadline_ms == deadline
    late = expire(h.group, deadline, SETTINGS)
    assert late.removed == {a.member_id: "session_timeout"}
    assert late.group.group_epoch == 3 and late.deadline_ms == 15_000
    h.group = late.group
    assert h.beat(_request(b.member_id, 2)).assignment == _tps(*range(6))
    assert h.beat(_request(a.member_id, 1)).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_member_keeping_revoked_partitions_past_its_rebalance_timeout_is_removed() -> None:
    h = Harness()
    a = h.join()
    h.join()
    told = h.beat(_request(a.member_id, 1, owned=a.assignment, rebalance_timeout_ms=3_000))
    assert told.assignment == _tps(0, 1, 2) and told.deadline_ms == h.now_ms + 3_000
    h.now_ms += 2_000
    # Heartbeating without letting go does not move the revocation deadline.
    still = h.beat(_request(a.member_id, 1, rebalance_timeout_ms=3_000))
    assert still.deadline_ms == 4_000
    assert not expire(h.group, 3_999, SETTINGS).removed
    assert expire(h.group, 4_000, SETTINGS).removed == {a.member_id: "rebalance_timeout"}


# ------------------------------------------------------------------ static membership


def _static_and_dynamic() -> tuple[Harness, Heartbeat, Heartbeat]:
    """A static member "a" (instance "i-a") holding 0-2 and a dynamic one holding 3-5."""
    h = Harness()
    a = h.join(instance_id="i-a")
    b = h.join()
    h.beat(_request(a.member_id, 1, owned=_tps(0, 1, 2), instance_id="i-a"))
    assert h.beat(_request(b.member_id, 2, owned=set())).assignment == _tps(3, 4, 5)
    h.beat(_request(b.member_id, 2, owned=_tps(3, 4, 5)))
    h.beat(_request(a.member_id, 2, owned=_tps(0, 1, 2), instance_id="i-a"))
    assert h.group.state == STABLE and h.group.group_epoch == 2
    return h, a, b


def test_a_restarted_static_member_takes_its_partitions_at_once_and_fences_the_old_one() -> None:
    h, a, b = _static_and_dynamic()
    before = h.group.members[b.member_id]
    # The process of "a" died; its restart joins with the same instance id, owning nothing.
    a2 = h.beat(_request("", 0, subscribed=["t"], owned=set(), instance_id="i-a"))
    assert a2.error == ErrorCode.NONE and a2.replaced == a.member_id
    assert a2.member_id not in (a.member_id, b.member_id)
    assert (a2.member_epoch, a2.assignment) == (2, _tps(0, 1, 2))  # no session timeout waited
    assert h.group.group_epoch == 2 and h.group.state == STABLE  # the others notice nothing
    assert set(h.group.members) == {a2.member_id, b.member_id}
    assert h.group.members[b.member_id] == before
    assert h.group.members[a2.member_id].instance_id == "i-a"
    # The old member, should it still run, is fenced on its next heartbeat and commit.
    for instance in ("i-a", None):
        old = h.beat(_request(a.member_id, 2, instance_id=instance))
        assert old.error == ErrorCode.FENCED_INSTANCE_ID and a2.member_id in (old.message or "")
    assert commit_error(h.group, a.member_id, 2) == ErrorCode.FENCED_INSTANCE_ID
    assert commit_error(h.group, a2.member_id, 2) == ErrorCode.NONE
    assert h.beat(_request(a2.member_id, 2, instance_id="i-a")).error == ErrorCode.NONE


def test_a_replacement_does_not_inherit_what_its_predecessor_was_giving_up() -> None:
    h = Harness()
    a = h.join(instance_id="i-a")
    b = h.join()
    told = h.beat(_request(a.member_id, 1, owned=a.assignment, instance_id="i-a"))
    assert told.assignment == _tps(0, 1, 2)  # 3-5 are being given up, still a's
    assert h.beat(_request(b.member_id, 2)).assignment is None
    a2 = h.beat(_request("", 0, subscribed=["t"], owned=set(), instance_id="i-a"))
    assert a2.assignment == _tps(0, 1, 2) and a2.member_epoch == 2
    assert h.group.members[a2.member_id].pending_revocation == frozenset()
    assert h.beat(_request(b.member_id, 2)).assignment == _tps(3, 4, 5)


def test_a_replacement_with_another_subscription_reassigns() -> None:
    h, _, _ = _static_and_dynamic()
    a2 = h.beat(_request("", 0, subscribed=["t", "u"], owned=set(), instance_id="i-a"))
    assert a2.error == ErrorCode.NONE and h.group.group_epoch == 3
    assert h.group.members[a2.member_id].subscribed_topics == {"t", "u"}


def test_a_static_member_leaving_with_minus_two_keeps_its_partitions_for_the_session() -> None:
    h, a, b = _static_and_dynamic()
    h.now_ms += 1_000
    left = h.beat(_request(a.member_id, m.MEMBER_EPOCH_LEAVE_STATIC, instance_id="i-a"))
    assert (left.error, left.member_epoch) == (ErrorCode.NONE, m.MEMBER_EPOCH_LEAVE_STATIC)
    assert h.group.group_epoch == 2 and h.group.state == STABLE  # nothing moves
    departed = h.group.members[a.member_id]
    assert departed.assigned == _tps(0, 1, 2) and departed.departed
    assert h.beat(_request(b.member_id, 2)).assignment is None
    # It left: its heartbeats and commits are refused until a rejoin.
    for epoch in (2, m.MEMBER_EPOCH_LEAVE_STATIC):
        assert h.beat(_request(a.member_id, epoch)).error == ErrorCode.FENCED_MEMBER_EPOCH
    for epoch in (2, m.MEMBER_EPOCH_LEAVE_STATIC, -1):
        assert commit_error(h.group, a.member_id, epoch) == ErrorCode.FENCED_MEMBER_EPOCH
    assert commit_error(h.group, "", -1) == ErrorCode.UNKNOWN_MEMBER_ID  # the group has members
    # Its session runs from the leave.
    deadline = departed.deadline_ms(SETTINGS.session_timeout_ms)
    assert deadline == h.now_ms + SETTINGS.session_timeout_ms
    # A restart within it takes the same partitions, and moves nothing else.
    h.now_ms += 5_000
    a2 = h.beat(_request("", 0, subscribed=["t"], owned=set(), instance_id="i-a"))
    assert (a2.replaced, a2.assignment, a2.member_epoch) == (a.member_id, _tps(0, 1, 2), 2)
    assert h.group.group_epoch == 2 and not h.group.members[a2.member_id].departed


def test_a_departed_static_member_expires_with_its_session_and_its_partitions_move() -> None:
    h, a, b = _static_and_dynamic()
    h.now_ms += 1_000
    h.beat(_request(a.member_id, m.MEMBER_EPOCH_LEAVE_STATIC, instance_id="i-a"))
    deadline = h.now_ms + SETTINGS.session_timeout_ms
    h.now_ms = deadline - 1
    h.beat(_request(b.member_id, 2))
    assert not expire(h.group, h.now_ms, SETTINGS).removed
    gone = expire(h.group, deadline, SETTINGS)
    assert gone.removed == {a.member_id: "session_timeout"}
    h.group = gone.group
    assert h.beat(_request(b.member_id, 2)).assignment == _tps(*range(6))
    # The instance id is free: a later join with it is a new member, replacing no one.
    a2 = h.join(instance_id="i-a")
    assert a2.replaced is None and a2.assignment == frozenset()


def test_a_departed_member_gives_a_newcomer_what_leaves_its_target_at_once() -> None:
    h = Harness()
    a = h.join(instance_id="i-a")
    h.beat(_request(a.member_id, 1, owned=a.assignment, instance_id="i-a"))
    h.beat(_request(a.member_id, m.MEMBER_EPOCH_LEAVE_STATIC, instance_id="i-a"))
    # It revoked everything before leaving, so no revocation of it is waited for.
    b = h.join()
    assert b.assignment == _tps(3, 4, 5)
    assert h.group.members[a.member_id].assigned == _tps(0, 1, 2)
    assert h.group.target[a.member_id] == _tps(0, 1, 2)


def test_a_dynamic_member_leaving_with_minus_two_just_leaves() -> None:
    h = Harness()
    a = h.join()
    b = h.join()
    left = h.beat(_request(a.member_id, m.MEMBER_EPOCH_LEAVE_STATIC))
    assert left.error == ErrorCode.NONE and set(h.group.members) == {b.member_id}
    assert h.group.group_epoch == 3


def test_a_static_member_that_times_out_frees_its_instance_id() -> None:
    h = Harness()
    a = h.join(instance_id="i-a")
    gone = expire(h.group, a.deadline_ms, SETTINGS)
    assert gone.removed == {a.member_id: "session_timeout"} and not gone.group.members
    h.group = gone.group
    # Unknown, and no one holds its instance id: rejoin, as a dynamic member would.
    late = h.beat(_request(a.member_id, 1, instance_id="i-a"))
    assert late.error == ErrorCode.UNKNOWN_MEMBER_ID
    again = h.join(instance_id="i-a")
    assert again.replaced is None and again.assignment == _tps(*range(6))
    # Now it is held: the old id is told it was fenced, not to rejoin (which would fence
    # the new member in turn).
    assert h.beat(_request(a.member_id, 1, instance_id="i-a")).error == (
        ErrorCode.FENCED_INSTANCE_ID
    )


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("another instance", ErrorCode.INVALID_REQUEST),
        ("a dynamic member naming one", ErrorCode.INVALID_REQUEST),
        ("a known id joining with another instance", ErrorCode.INVALID_REQUEST),
        ("without its instance id", ErrorCode.NONE),
        ("unknown id, instance held", ErrorCode.FENCED_INSTANCE_ID),
        ("unknown id, instance free", ErrorCode.UNKNOWN_MEMBER_ID),
    ],
)
def test_static_membership_codes(case: str, code: ErrorCode) -> None:
    h, a, b = _static_and_dynamic()
    request = {
        "another instance": _request(a.member_id, 2, instance_id="i-b"),
        "a dynamic member naming one": _request(b.member_id, 2, instance_id="i-b"),
        "a known id joining with another instance": _request(
            a.member_id, 0, subscribed=["t"], instance_id="i-b"
        ),
        "without its instance id": _request(a.member_id, 2),
        "unknown id, instance held": _request("nobody", 2, instance_id="i-a"),
        "unknown id, instance free": _request("nobody", 2, instance_id="i-z"),
    }[case]
    before = h.group
    result = h.beat(request)
    assert result.error == code and (result.message or not code)
    if code:
        assert h.group is before


def test_a_full_group_takes_a_replacement() -> None:
    small = GroupSettings(10_000, max_size=1, max_rebalance_timeout_ms=60_000)
    join = _request("", 0, subscribed=["t"], instance_id="i")
    first = heartbeat(Group("g"), join, None, {"t": 2}, 0, small, "one")
    second = heartbeat(first.group, join, None, {"t": 2}, 5, small, "two")
    assert (second.error, second.replaced, second.assignment) == (0, "one", _tps(0, 1))
    other = _request("", 0, subscribed=["t"], instance_id="j")
    full = heartbeat(second.group, other, None, {"t": 2}, 5, small, "three")
    assert full.error == ErrorCode.GROUP_MAX_SIZE_REACHED


def test_commit_error_answers_as_kafka_validates_an_offset_commit() -> None:
    h, _, b = _static_and_dynamic()
    assert commit_error(None, "", -1) == ErrorCode.NONE  # no members: from outside
    assert commit_error(None, "x", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert commit_error(h.group, b.member_id, 2) == ErrorCode.NONE
    assert commit_error(h.group, b.member_id, 3) == ErrorCode.FENCED_MEMBER_EPOCH
    assert commit_error(h.group, b.member_id, 1) == ErrorCode.STALE_MEMBER_EPOCH
    assert commit_error(h.group, "", -1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert commit_error(h.group, "nobody", 2) == ErrorCode.UNKNOWN_MEMBER_ID


# ------------------------------------------------------------------ the random walk


@dataclass
class Client:
    """A consumer as the broker's peer: what it consumes, and how it heartbeats."""

    member_id: str = ""
    epoch: int = 0
    owned: set[TopicPartition] = field(default_factory=set)
    revoking: set[TopicPartition] = field(default_factory=set)
    topics: list[str] = field(default_factory=lambda: ["a"])
    reported: frozenset[TopicPartition] | None = None
    lost_answer: bool = False
    last_beat_ms: int = 0
    instance_id: str | None = None

    def request(self, rng: random.Random) -> m.ConsumerGroupHeartbeatRequest:
        if not self.member_id:
            return _request("", 0, subscribed=self.topics, instance_id=self.instance_id)
        owned = frozenset(self.owned)
        full = self.lost_answer
        send_owned = full or owned != self.reported or rng.random() < 0.3
        return _request(
            self.member_id,
            self.epoch,
            subscribed=self.topics if full or rng.random() < 0.1 else None,
            owned=owned if send_owned else None,
            instance_id=self.instance_id,
        )

    def answered(self, result: Heartbeat, request: m.ConsumerGroupHeartbeatRequest) -> None:
        if result.error:
            # Fenced or forgotten: give everything up and join again.
            self.member_id, self.epoch, self.owned, self.revoking = "", 0, set(), set()
            self.reported, self.lost_answer = None, False
            return
        if request.owned is not None:
            self.reported = frozenset((t.topic, p) for t in request.owned for p in t.partitions)
        self.member_id, self.epoch, self.lost_answer = result.member_id, result.member_epoch, False
        if result.assignment is not None:
            self.revoking |= self.owned - result.assignment
            self.owned |= result.assignment


def test_a_random_walk_never_gives_a_partition_two_owners() -> None:
    """1,000 seeded steps of joins (dynamic and static), heartbeats, slow revocations,
    lost answers, subscription changes, new partitions, leaves (-1, and -2 for static
    members), kills, and restarts of static members, whose predecessor is killed or
    left running; after each, the broker's invariant holds, no two live members consume
    the same partition, and every heartbeat of a replaced predecessor is refused."""
    rng = random.Random(848)
    counts = {"a": 6, "b": 3}
    group = Group("g")
    clients: list[Client] = []
    zombies: list[Client] = []  # replaced, still running: the one exception to one owner
    departed: list[Client] = []  # static members that left with -2
    instances = (f"i{n}" for n in itertools.count())
    seen: Counter[str] = Counter()  # what happened, so the walk is known to cover it
    now = 0
    ids = itertools.count()
    settings = GroupSettings(10_000, max_size=12, max_rebalance_timeout_ms=60_000)

    def beat(client: Client, *, lossy: bool = True) -> None:
        nonlocal group
        request = client.request(rng)
        result = heartbeat(group, request, None, counts, now, settings, f"m{next(ids)}")
        group = result.group
        client.last_beat_ms = now
        assert result.error != ErrorCode.FENCED_INSTANCE_ID, "a live member was fenced"
        seen["replaced"] += result.replaced is not None
        if lossy and not result.error and rng.random() < 0.05:
            client.lost_answer = True  # the answer never arrives
            return
        client.answered(result, request)

    def leave(client: Client) -> None:
        nonlocal group
        if client.member_id:
            epoch = m.MEMBER_EPOCH_LEAVE if client.instance_id is None else -2
            request = _request(client.member_id, epoch, instance_id=client.instance_id)
            group = heartbeat(group, request, None, counts, now, settings, "x").group
            if client.instance_id is not None:
                departed.append(client)
                seen["departed"] += 1

    def restart(instance_id: str | None, topics: list[str]) -> None:
        clients.append(Client(topics=topics, instance_id=instance_id))
        beat(clients[-1])

    for _ in range(1_000):
        now += rng.randint(0, 300)
        roll = rng.random()
        static = [c for c in clients if c.instance_id is not None]
        if roll < 0.08 and len(clients) < 10:
            topics = rng.choice([["a"], ["a", "b"], ["b", "c"]])
            restart(next(instances) if rng.random() < 0.5 else None, topics)
        elif roll < 0.12 and clients:
            leave(clients.pop(rng.randrange(len(clients))))
        elif roll < 0.15 and clients:
            clients.pop(rng.randrange(len(clients)))  # killed: it just stops
        elif roll < 0.17 and clients:
            rng.choice(clients).topics = rng.choice([["a"], ["b"], ["a", "c"]])
        elif roll < 0.18:
            grow = rng.choice(["a", "b", "c"])
            counts[grow] = counts.get(grow, 0) + rng.randint(1, 2)
        elif roll < 0.20:
            now += settings.session_timeout_ms  # long enough for the killed to expire
        elif roll < 0.23 and static:
            old = static[rng.randrange(len(static))]
            clients.remove(old)
            if rng.random() < 0.5:
                zombies.append(old)  # paused, not dead: it will heartbeat again
            restart(old.instance_id, old.topics)
        elif roll < 0.25 and departed:
            old = departed.pop(rng.randrange(len(departed)))
            if not any(c.instance_id == old.instance_id for c in clients):
                restart(old.instance_id, old.topics)
        elif clients:
            client = rng.choice(clients)
            if client.revoking and rng.random() < 0.7:
                client.owned -= client.revoking  # done with its revocation callbacks
                client.revoking = set()
            beat(client)
        for zombie in list(zombies):
            if zombie.member_id and rng.random() < 0.3:
                holders = {mb.instance_id for mb in group.members.values()}
                request = zombie.request(rng)
                result = heartbeat(group, request, None, counts, now, settings, "z")
                # Fenced for good while its instance id is held; else merely unknown.
                fenced = zombie.instance_id in holders
                assert result.error == (
                    ErrorCode.FENCED_INSTANCE_ID if fenced else ErrorCode.UNKNOWN_MEMBER_ID
                ), result
                assert result.group is group
                seen[ErrorCode.name_of(result.error)] += 1
                zombies.remove(zombie)
        for client in clients:  # live members keep their sessions
            if client.member_id and now - client.last_beat_ms > settings.session_timeout_ms // 2:
                beat(client)
        group = expire(group, now, settings).group
        check_invariants(group)
        members = [c for c in clients if c.member_id in group.members]
        for x, y in itertools.combinations(members, 2):
            assert not x.owned & y.owned, (x, y)
        for c in members:
            assert c.owned <= group.members[c.member_id].assigned, c
    assert min(seen[k] for k in ("replaced", "departed", "FENCED_INSTANCE_ID")) > 0, seen

    # Once the killed members expire, well-behaved members converge on a balanced target.
    now += settings.session_timeout_ms
    for _ in range(20):
        for client in clients:
            client.owned -= client.revoking
            client.revoking = set()
            beat(client, lossy=False)
        group = expire(group, now, settings).group
    assert group.state == STABLE
    subs = {i: mb.subscribed_topics for i, mb in group.members.items()}
    _check_complete(group.target, subs, counts)
    _check_balanced(group.target, subs)
    for client in clients:
        assert client.owned == group.target[client.member_id]


# ------------------------------------------------------------------ the coordinator's hooks


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def _join(group_id: str, topics: list[str]) -> m.ConsumerGroupHeartbeatRequest:
    request = _request("", 0, subscribed=topics)
    request.group_id = group_id
    return request


@pytest.mark.anyio
async def test_check_member_answers_as_kafka_validates_an_offset_commit(anyio_backend: str) -> None:
    groups = GroupCoordinator(BrokerConfig(), {"t": 2})
    # A group without members takes commits from outside it (a negative epoch) only.
    assert groups.check_member("g", "", -1) == ErrorCode.NONE
    assert groups.check_member("g", "someone", 3) == ErrorCode.UNKNOWN_MEMBER_ID
    joined = await groups.heartbeat(_join("g", ["t"]))
    member_id, epoch = joined.member_id, joined.member_epoch
    assert (epoch, groups.has_members("g"), groups.group_ids()) == (1, True, ["g"])
    assert groups.check_member("g", member_id, epoch) == ErrorCode.NONE
    assert groups.check_member("g", member_id, epoch + 1) == ErrorCode.FENCED_MEMBER_EPOCH
    assert groups.check_member("g", member_id, epoch - 1) == ErrorCode.STALE_MEMBER_EPOCH
    assert groups.check_member("g", "", -1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert groups.check_member("g", "nobody", epoch) == ErrorCode.UNKNOWN_MEMBER_ID
    leave = _request(member_id, m.MEMBER_EPOCH_LEAVE)
    assert (await groups.heartbeat(leave)).error == ErrorCode.NONE
    assert (groups.has_members("g"), groups.group_ids()) == (False, [])
    assert groups.check_member("g", "", -1) == ErrorCode.NONE


@pytest.mark.anyio
async def test_groups_with_offsets_only_are_listed_as_empty(anyio_backend: str) -> None:
    groups = GroupCoordinator(BrokerConfig(), {"t": 2})
    groups.offset_groups = lambda: {"archived", "g"}
    await groups.heartbeat(_join("g", ["t"]))
    listed = groups.list_groups(m.ListGroupsRequest()).groups
    assert [(g.group_id, g.state, g.members) for g in listed] == [
        ("archived", EMPTY, 0),
        ("g", STABLE, 1),
    ]
    described = groups.describe_groups(m.DescribeGroupsRequest(group_ids=["archived", "x"]))
    assert [(d.state, d.error) for d in described.groups] == [
        (EMPTY, ErrorCode.NONE),
        ("DEAD", ErrorCode.GROUP_ID_NOT_FOUND),
    ]


@pytest.mark.anyio
async def test_the_timer_removes_a_silent_member_and_reports_the_group_empty(
    anyio_backend: str,
) -> None:
    config = BrokerConfig(group_session_timeout_ms=100, group_heartbeat_interval_ms=50)
    groups = GroupCoordinator(config, {"t": 2})
    async with anyio.create_task_group() as tg:
        tg.start_soon(groups.run)
        await groups.heartbeat(_join("g", ["t"]))
        assert groups.has_members("g")
        with anyio.fail_after(10):
            while groups.has_members("g"):
                await anyio.sleep(0.01)
        assert not groups.has_members("g") and groups.stats().groups == {}
        assert groups.stats().heartbeats == 1
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_failing_expiry_is_logged_and_the_timer_goes_on(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = BrokerConfig(group_session_timeout_ms=100, group_heartbeat_interval_ms=50)
    groups = GroupCoordinator(config, {"t": 2})
    failed = anyio.Event()
    real_expire = expire

    def broken(*args: object) -> None:
        failed.set()
        raise RuntimeError("boom")

    monkeypatch.setattr("broker.groups.coordinator.group_state.expire", broken)
    async with anyio.create_task_group() as tg:
        tg.start_soon(groups.run)
        await groups.heartbeat(_join("a", ["t"]))
        with anyio.fail_after(10):
            await failed.wait()
        assert "event=group_expiry_failed group='a'" in caplog.text
        monkeypatch.setattr("broker.groups.coordinator.group_state.expire", real_expire)
        await groups.heartbeat(_join("b", ["t"]))  # another group's timer still runs
        with anyio.fail_after(10):
            while groups.has_members("b"):
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_describe_shows_instance_ids_and_a_replacement_is_logged(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", "minibroker")
    groups = GroupCoordinator(BrokerConfig(), {"t": 2})
    static = _join("g", ["t"])
    static.instance_id = "i-1"
    first = await groups.heartbeat(static)
    await groups.heartbeat(_join("g", ["t"]))
    (group,) = groups.describe_groups(m.DescribeGroupsRequest(group_ids=["g"])).groups
    assert sorted((mb.member_id == first.member_id, mb.instance_id) for mb in group.members) == [
        (False, None),
        (True, "i-1"),
    ]
    second = await groups.heartbeat(static)
    # Its predecessor's share (it was giving the other partition up) comes at once.
    assert second.assignment is not None and len(second.assignment[0].partitions) == 1
    assert groups.check_member("g", first.member_id, first.member_epoch) == (
        ErrorCode.FENCED_INSTANCE_ID
    )
    assert (
        f"event=group_member_fenced group='g' member={first.member_id} instance='i-1' "
        f"replaced_by={second.member_id}"
    ) in caplog.text
    leave = _request(second.member_id, m.MEMBER_EPOCH_LEAVE_STATIC, instance_id="i-1")
    assert (await groups.heartbeat(leave)).member_epoch == m.MEMBER_EPOCH_LEAVE_STATIC
    assert f"event=group_member_departed group='g' member={second.member_id}" in caplog.text
    (group,) = groups.describe_groups(m.DescribeGroupsRequest(group_ids=["g"])).groups
    assert {mb.instance_id: mb.member_epoch for mb in group.members}["i-1"] == -2
