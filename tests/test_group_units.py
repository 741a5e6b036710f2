"""Unit tests of the consumer-group core, no broker: the assignor's balance and
stickiness (broker/groups/assignor.py) and the membership transitions, fencing codes,
timeouts and the no-two-owners invariant (broker/groups/state.py)."""

from __future__ import annotations

import itertools
import random
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
) -> m.ConsumerGroupHeartbeatRequest:
    return m.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id=member_id,
        member_epoch=epoch,
        rebalance_timeout_ms=rebalance_timeout_ms,
        subscribed_topics=subscribed,
        owned=None if owned is None else _owned(owned),
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

    def join(self, topics: list[str] | None = None) -> Heartbeat:
        result = self.beat(_request("", 0, subscribed=topics or ["t"]))
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

    def request(self, rng: random.Random) -> m.ConsumerGroupHeartbeatRequest:
        if not self.member_id:
            return _request("", 0, subscribed=self.topics)
        owned = frozenset(self.owned)
        full = self.lost_answer
        send_owned = full or owned != self.reported or rng.random() < 0.3
        return _request(
            self.member_id,
            self.epoch,
            subscribed=self.topics if full or rng.random() < 0.1 else None,
            owned=owned if send_owned else None,
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
    """1,000 seeded steps of joins, heartbeats, slow revocations, lost answers,
    subscription changes, new partitions, leaves and kills; after each, the broker's
    invariant holds and no two live members consume the same partition."""
    rng = random.Random(848)
    counts = {"a": 6, "b": 3}
    group = Group("g")
    clients: list[Client] = []
    now = 0
    ids = itertools.count()
    settings = GroupSettings(10_000, max_size=12, max_rebalance_timeout_ms=60_000)

    def beat(client: Client, *, lossy: bool = True) -> None:
        nonlocal group
        request = client.request(rng)
        result = heartbeat(group, request, None, counts, now, settings, f"m{next(ids)}")
        group = result.group
        client.last_beat_ms = now
        if lossy and not result.error and rng.random() < 0.05:
            client.lost_answer = True  # the answer never arrives
            return
        client.answered(result, request)

    for _ in range(1_000):
        now += rng.randint(0, 300)
        roll = rng.random()
        if roll < 0.08 and len(clients) < 10:
            clients.append(Client(topics=rng.choice([["a"], ["a", "b"], ["b", "c"]])))
            beat(clients[-1])
        elif roll < 0.12 and clients:
            leaving = clients.pop(rng.randrange(len(clients)))
            if leaving.member_id:
                group = heartbeat(
                    group, _request(leaving.member_id, -1), None, counts, now, settings, "x"
                ).group
        elif roll < 0.15 and clients:
            clients.pop(rng.randrange(len(clients)))  # killed: it just stops
        elif roll < 0.17 and clients:
            rng.choice(clients).topics = rng.choice([["a"], ["b"], ["a", "c"]])
        elif roll < 0.18:
            grow = rng.choice(["a", "b", "c"])
            counts[grow] = counts.get(grow, 0) + rng.randint(1, 2)
        elif roll < 0.20:
            now += settings.session_timeout_ms  # long enough for the killed to expire
        elif clients:
            client = rng.choice(clients)
            if client.revoking and rng.random() < 0.7:
                client.owned -= client.revoking  # done with its revocation callbacks
                client.revoking = set()
            beat(client)
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
