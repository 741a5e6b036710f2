"""The consumer's group membership state machine (client/group_membership.py), sans IO.

Kafka's KIP-848 client rules checked with explicit `now_ms` and typed answers, no
broker and no sleep: what each heartbeat carries, when it is due, what an answer
makes the application do (lose, revoke, take partitions) and in which order.
"""

from __future__ import annotations

import math

import pytest

from client.errors import FencedInstanceIdError, MinibrokerError
from client.group_membership import Changes, GroupMembership, MemberState, to_wire
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    GroupTopicPartitions,
)

E = ErrorCode
T0, T1, T2 = (TopicPartition("t", p) for p in range(3))
U0 = TopicPartition("u", 0)
INTERVAL = 3_000


def make(instance_id: str | None = None, **overrides: float) -> GroupMembership:
    settings: dict[str, float] = {
        "rebalance_timeout_ms": 60_000,
        "max_poll_interval_ms": 60_000,
        "retry_backoff_ms": 100,
        "retry_backoff_max_ms": 1_000,
    }
    settings.update(overrides)
    return GroupMembership("g", instance_id=instance_id, **settings)  # type: ignore[arg-type]


def answer(
    epoch: int = 1,
    assignment: list[TopicPartition] | None = None,
    *,
    error: int = E.NONE,
    member_id: str = "m1",
) -> ConsumerGroupHeartbeatResponse:
    return ConsumerGroupHeartbeatResponse(
        error=error,
        member_id=member_id,
        member_epoch=epoch,
        heartbeat_interval_ms=INTERVAL,
        assignment=None if assignment is None else to_wire(frozenset(assignment)),
    )


def send(m: GroupMembership, now: float) -> ConsumerGroupHeartbeatRequest:
    request, deadline = m.poll(now)
    assert request is not None, f"no heartbeat due at {now}"
    assert deadline == math.inf  # nothing more until this one is answered
    return request


def joined(
    assignment: list[TopicPartition], now: float = 0, instance_id: str | None = None
) -> GroupMembership:
    """A member that joined at `now`, got `assignment` and took it."""
    m = make(instance_id)
    m.subscribe(["t"], now)
    send(m, now)
    changes = m.on_heartbeat(answer(1, assignment), now)
    m.assigned(changes.assign, now)
    send(m, now)
    m.on_heartbeat(answer(1), now)
    return m


def test_join_names_no_member_and_sends_every_field() -> None:
    m = make()
    assert m.poll(0) == (None, math.inf)  # not subscribed: nothing to say
    m.subscribe(["u", "t", "u"], 0)
    request = send(m, 0)
    assert (request.group_id, request.member_id, request.member_epoch) == ("g", "", 0)
    assert request.subscribed_topics == ["t", "u"]
    assert request.owned == []  # sent, though empty: the first heartbeat carries everything
    assert request.rebalance_timeout_ms == 60_000
    assert request.instance_id is None  # a dynamic member, as before static membership
    assert m.poll(10) == (None, math.inf)  # one heartbeat in flight at a time


def test_an_assignment_is_taken_then_acknowledged_at_once() -> None:
    m = make()
    m.subscribe(["t"], 0)
    send(m, 0)
    changes = m.on_heartbeat(answer(1, [T0, T1]), 5)
    assert changes == Changes(assign=frozenset({T0, T1}))
    assert (m.member_id, m.member_epoch, m.state) == ("m1", 1, MemberState.STABLE)
    # Until the application took them, only the regular heartbeat is due, owned still empty.
    assert m.poll(6) == (None, 5 + INTERVAL)
    m.assigned(changes.assign, 7)
    request = send(m, 7)
    assert (request.member_id, request.member_epoch) == ("m1", 1)
    assert request.owned == [GroupTopicPartitions("t", [0, 1])]
    assert request.subscribed_topics is None  # acknowledged already
    assert not m.on_heartbeat(answer(2), 8)
    assert m.member_epoch == 2


def test_unchanged_fields_are_nil_and_the_interval_comes_from_the_answer() -> None:
    m = joined([T0])
    assert m.poll(INTERVAL - 1) == (None, INTERVAL)
    request = send(m, INTERVAL)
    assert request.subscribed_topics is None and request.owned is None
    assert request.member_epoch == 1
    m.on_heartbeat(answer(1), INTERVAL + 10)
    assert m.poll(INTERVAL + 11)[1] == 2 * INTERVAL + 10


def test_a_nil_assignment_keeps_the_last_one() -> None:
    m = joined([T0, T1])
    send(m, INTERVAL)
    assert not m.on_heartbeat(answer(1, None), INTERVAL)
    assert m.pending() == Changes()
    assert m.owned == {T0, T1}


def test_revocation_comes_first_and_releases_with_an_immediate_heartbeat() -> None:
    m = joined([T0, T1])
    send(m, INTERVAL)
    changes = m.on_heartbeat(answer(2, [T1, T2]), INTERVAL)
    assert changes == Changes(revoke=frozenset({T0}), assign=frozenset({T2}))
    # While the application revokes, heartbeats go on and still list T0 as owned.
    request = send(m, 2 * INTERVAL)
    assert request.owned is None
    m.on_heartbeat(answer(2), 2 * INTERVAL)
    assert m.pending() == changes  # still to do
    m.revoked(frozenset({T0}), 2 * INTERVAL + 1)
    release = send(m, 2 * INTERVAL + 1)
    assert release.owned == [GroupTopicPartitions("t", [1])]
    m.assigned(frozenset({T2}), 2 * INTERVAL + 2)
    m.on_heartbeat(answer(2), 2 * INTERVAL + 3)
    ack = send(m, 2 * INTERVAL + 3)  # owned changed while the release was in flight
    assert ack.owned == [GroupTopicPartitions("t", [1, 2])]
    assert m.pending() == Changes()


def test_a_new_assignment_during_a_revocation_replaces_the_target() -> None:
    m = joined([T0, T1])
    send(m, INTERVAL)
    m.on_heartbeat(answer(2, [T1]), INTERVAL)
    send(m, 2 * INTERVAL)
    changes = m.on_heartbeat(answer(3, [T0]), 2 * INTERVAL)
    assert changes == Changes(revoke=frozenset({T1}))


@pytest.mark.parametrize("code", [E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID])
def test_fencing_loses_every_partition_then_rejoins_with_epoch_zero(code: int) -> None:
    m = joined([T0, T1])
    send(m, INTERVAL)
    changes = m.on_heartbeat(answer(error=code), INTERVAL)
    assert changes == Changes(lost=frozenset({T0, T1}))
    assert m.state is MemberState.FENCED
    assert m.poll(10 * INTERVAL) == (None, math.inf)  # nothing until the loss is handled
    m.lost_handled(10 * INTERVAL)
    rejoin = send(m, 10 * INTERVAL)
    assert (rejoin.member_id, rejoin.member_epoch) == ("", 0)
    assert rejoin.subscribed_topics == ["t"] and rejoin.owned == []
    assert m.owned == frozenset()


def test_fenced_with_nothing_owned_rejoins_at_once() -> None:
    m = make()
    m.subscribe(["t"], 0)
    send(m, 0)
    m.on_heartbeat(answer(1, []), 0)
    send(m, INTERVAL)
    assert not m.on_heartbeat(answer(error=E.UNKNOWN_MEMBER_ID), INTERVAL)
    assert send(m, INTERVAL).member_epoch == 0


def test_a_revocation_cut_short_by_fencing_loses_the_rest() -> None:
    m = joined([T0, T1])
    send(m, INTERVAL)
    m.on_heartbeat(answer(2, [T1]), INTERVAL)
    send(m, 2 * INTERVAL)
    m.on_heartbeat(answer(error=E.FENCED_MEMBER_EPOCH), 2 * INTERVAL)
    m.revoked(frozenset({T0}), 2 * INTERVAL + 1)  # the revocation in progress finishes
    assert m.pending() == Changes(lost=frozenset({T1}))


def test_a_failed_heartbeat_is_resent_whole_after_a_growing_backoff() -> None:
    m = joined([T0])
    send(m, INTERVAL)
    m.on_heartbeat_failed(INTERVAL)
    assert m.poll(INTERVAL + 99) == (None, INTERVAL + 100)
    request = send(m, INTERVAL + 100)
    assert request.subscribed_topics == ["t"] and request.owned == [GroupTopicPartitions("t", [0])]
    m.on_heartbeat_failed(INTERVAL + 100)
    assert m.poll(INTERVAL + 100)[1] == INTERVAL + 300  # doubled
    for _ in range(10):
        _, due = m.poll(0)
        send(m, due)
        m.on_heartbeat_failed(due)
    assert m.poll(0)[1] - due == 1_000  # capped at retry_backoff_max_ms
    send(m, m.poll(0)[1])
    m.on_heartbeat(answer(1), 50_000)
    assert m.poll(50_000)[1] == 50_000 + INTERVAL  # success resets the backoff


def test_a_retriable_error_answer_backs_off_and_resends_whole() -> None:
    m = joined([T0])
    send(m, INTERVAL)
    assert not m.on_heartbeat(answer(error=E.REQUEST_TIMED_OUT), INTERVAL)
    assert m.state is MemberState.STABLE and m.owned == {T0}
    request = send(m, INTERVAL + 100)
    assert request.owned is not None and request.subscribed_topics is not None


def test_a_new_connection_sends_every_field() -> None:
    m = joined([T0])
    m.connection_changed()
    request = send(m, INTERVAL)
    assert request.subscribed_topics == ["t"] and request.owned == [GroupTopicPartitions("t", [0])]


def test_changing_the_subscription_heartbeats_at_once_with_only_the_topics() -> None:
    m = joined([T0])
    m.subscribe(["t", "u"], 10)
    request = send(m, 10)
    assert request.subscribed_topics == ["t", "u"] and request.owned is None
    changes = m.on_heartbeat(answer(2, [T0, U0]), 11)
    assert changes == Changes(assign=frozenset({U0}))


def test_fatal_answers_stop_the_member() -> None:
    m = make()
    m.subscribe(["t"], 0)
    send(m, 0)
    changes = m.on_heartbeat(answer(error=E.UNSUPPORTED_VERSION), 0)
    assert isinstance(changes.fatal, MinibrokerError)
    assert "does not serve consumer groups" in str(changes.fatal)
    assert m.state is MemberState.FATAL and m.fatal_error is changes.fatal
    assert m.poll(10**9) == (None, math.inf)


def test_group_max_size_is_fatal() -> None:
    m = make()
    m.subscribe(["t"], 0)
    send(m, 0)
    changes = m.on_heartbeat(answer(error=E.GROUP_MAX_SIZE_REACHED), 0)
    assert changes.fatal is not None and changes.fatal.code == E.GROUP_MAX_SIZE_REACHED


def test_leave_sends_epoch_minus_one_and_ignores_the_answer_in_flight() -> None:
    m = joined([T0])
    send(m, INTERVAL)
    m.revoked(frozenset({T0}), INTERVAL)
    leave = m.leave()
    assert leave is not None
    assert (leave.member_id, leave.member_epoch) == ("m1", -1)
    assert m.state is MemberState.UNSUBSCRIBED
    assert not m.on_heartbeat(answer(5, [T1]), INTERVAL + 1)  # the older heartbeat's answer
    assert m.pending() == Changes() and m.member_epoch == 0
    assert m.poll(10**9) == (None, math.inf)


def test_leave_before_being_named_sends_nothing() -> None:
    m = make()
    m.subscribe(["t"], 0)
    assert m.leave() is None


def test_an_answer_from_before_a_fence_is_ignored() -> None:
    m = joined([T0])
    send(m, INTERVAL)
    m.on_heartbeat(answer(error=E.FENCED_MEMBER_EPOCH), INTERVAL)
    m.lost_handled(INTERVAL)
    send(m, INTERVAL)  # the rejoin
    assert m.on_heartbeat(answer(7, [T1], member_id="m2"), INTERVAL + 1) == Changes(
        assign=frozenset({T1})
    )
    assert (m.member_id, m.member_epoch) == ("m2", 7)


def test_a_member_not_polled_for_max_poll_interval_leaves_and_loses_its_partitions() -> None:
    m = make(max_poll_interval_ms=10_000)
    m.subscribe(["t"], 0)
    send(m, 0)
    m.on_heartbeat(answer(1, [T0]), 0)
    m.assigned(frozenset({T0}), 0)
    send(m, 0)
    m.on_heartbeat(answer(1), 0)
    m.polled(9_000)
    assert send(m, 9_000).member_epoch == 1  # polled recently: an ordinary heartbeat
    m.on_heartbeat(answer(1), 9_000)
    leave, _ = m.poll(19_001)
    assert leave is not None and (leave.member_id, leave.member_epoch) == ("m1", -1)
    assert m.pending() == Changes(lost=frozenset({T0}))
    assert not m.on_heartbeat(answer(1), 19_002)  # the leave's answer changes nothing
    m.lost_handled(30_000)  # the application polls again
    rejoin = send(m, 30_000)
    assert (rejoin.member_id, rejoin.member_epoch) == ("", 0)


def test_subscribing_to_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="unsubscribe"):
        make().subscribe([], 0)


def test_heartbeat_soon_asks_at_once_and_never_later_than_planned() -> None:
    m = joined([T0])
    assert m.poll(10) == (None, INTERVAL)
    m.heartbeat_soon(10)  # a commit was refused: what became of this member?
    assert send(m, 10).member_epoch == 1


# ------------------------------------------------------------------ static membership


def test_a_static_member_names_its_instance_in_every_heartbeat_and_leaves_with_minus_two() -> None:
    m = make("i-1")
    m.subscribe(["t"], 0)
    requests = [send(m, 0)]
    changes = m.on_heartbeat(answer(1, [T0]), 0)
    m.assigned(changes.assign, 0)
    requests.append(send(m, 0))
    m.on_heartbeat(answer(1), 0)
    requests.append(send(m, INTERVAL))
    m.on_heartbeat(answer(1), INTERVAL)
    m.revoked(frozenset({T0}), INTERVAL)
    leave = m.leave()
    assert leave is not None
    assert [r.instance_id for r in [*requests, leave]] == ["i-1"] * 4
    assert (leave.member_id, leave.member_epoch) == ("m1", -2)  # keeps its partitions


def test_a_static_member_not_polled_leaves_with_minus_two() -> None:
    m = make("i-1", max_poll_interval_ms=10_000)
    m.subscribe(["t"], 0)
    send(m, 0)
    m.on_heartbeat(answer(1, [T0]), 0)
    m.assigned(frozenset({T0}), 0)
    send(m, 0)
    m.on_heartbeat(answer(1), 0)
    leave, _ = m.poll(10_001)
    assert leave is not None and (leave.member_epoch, leave.instance_id) == (-2, "i-1")
    assert m.pending() == Changes(lost=frozenset({T0}))
    m.lost_handled(20_000)
    rejoin = send(m, 20_000)  # takes its partitions back at once, if within the session
    assert (rejoin.member_id, rejoin.member_epoch, rejoin.instance_id) == ("", 0, "i-1")


def test_fenced_instance_id_is_fatal_and_never_rejoins() -> None:
    m = joined([T0], instance_id="i-1")
    send(m, INTERVAL)
    changes = m.on_heartbeat(answer(error=E.FENCED_INSTANCE_ID, member_id=""), INTERVAL)
    assert isinstance(changes.fatal, FencedInstanceIdError)
    assert changes.fatal.code == E.FENCED_INSTANCE_ID
    assert "group_instance_id" in str(changes.fatal)
    assert m.state is MemberState.FATAL and m.fatal_error is changes.fatal
    assert m.poll(10**9) == (None, math.inf)  # a rejoin would fence the newer consumer
    assert m.leave() is None


def test_a_commit_that_learnt_of_the_fence_stops_the_heartbeats() -> None:
    m = joined([T0], instance_id="i-1")
    send(m, INTERVAL)  # in flight when the commit's answer comes
    error = FencedInstanceIdError("commit: FENCED_INSTANCE_ID", E.FENCED_INSTANCE_ID)
    m.fail(error)
    assert (m.state, m.fatal_error) == (MemberState.FATAL, error)
    assert not m.on_heartbeat(answer(1), INTERVAL + 1)  # the heartbeat's answer is ignored
    assert m.poll(10**9) == (None, math.inf)
