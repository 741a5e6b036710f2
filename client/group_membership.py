"""The consumer's side of a KIP-848 group, sans IO: when to heartbeat, with what, and what an
answer changes (docs/protocol.md section 6).

`GroupMembership` takes `now_ms` and answers values, as the producer's accumulator
does: `poll(now_ms)` gives the heartbeat to send now (or None) and the deadline of
the next one; `on_heartbeat(response, now_ms)` digests an answer and returns the
`Changes` the application must go through, in this order: partitions lost (the
member was fenced: no commit, they may be someone else's already), partitions to
revoke (commit, then give them up), partitions to take. The I/O shell
(client/coordinator.py) runs the callbacks and reports back with `revoked`,
`assigned` and `lost_handled`; a partition leaves `owned`, and so is released to
the broker by the next heartbeat, only after its revocation finished.

Kafka's client rules: join with member id "" and epoch 0; send the subscription
and the owned partitions only when they changed since the broker last acknowledged
them, and whole after a (re)join, a failed heartbeat or a new connection;
heartbeat every `heartbeat_interval_ms` of the last answer, and at once after a
revocation or an assignment was handled. FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID
lose every owned partition and rejoin with epoch 0. A member the application has
not polled for `max_poll_interval_ms` leaves (epoch -1) and its partitions are lost,
as in Kafka's consumer; the next poll rejoins.

Static membership (`instance_id`, the consumer's `group_instance_id`): every
heartbeat carries it, so a restarted consumer with the same id takes its
predecessor's partitions at once; leaving (on close or a poll timeout) is epoch
-2, which keeps the partitions for the broker's session timeout. FENCED_INSTANCE_ID
(another consumer joined with the same id) is fatal, as in Kafka: rejoining would
fence that consumer in turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from client.errors import MinibrokerError, error_for
from client.types import TopicPartition
from protocol.errors import RETRIABLE, ErrorCode
from protocol.messages import (
    MEMBER_EPOCH_JOIN,
    MEMBER_EPOCH_LEAVE,
    MEMBER_EPOCH_LEAVE_STATIC,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    GroupTopicPartitions,
)

FENCED_CODES = frozenset({ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID})
"""Heartbeat answers after which the member's partitions are lost and it rejoins."""

Partitions = frozenset[TopicPartition]
_NONE: Partitions = frozenset()


class MemberState(Enum):
    UNSUBSCRIBED = "unsubscribed"  # no subscription, or left the group
    JOINING = "joining"  # the next heartbeat joins (member id "", epoch 0)
    STABLE = "stable"  # a member; `pending()` says whether an assignment waits to be handled
    FENCED = "fenced"  # dropped by the broker (or poll timeout): the app must handle the loss
    FATAL = "fatal"  # the group refuses this consumer for good (`fatal_error` says why)


@dataclass(frozen=True)
class Changes:
    """What the application must go through now, in field order; empty when nothing."""

    lost: Partitions = _NONE
    revoke: Partitions = _NONE
    assign: Partitions = _NONE
    fatal: MinibrokerError | None = field(default=None, compare=False)

    def __bool__(self) -> bool:
        return bool(self.lost or self.revoke or self.assign or self.fatal)


def to_wire(partitions: Partitions) -> list[GroupTopicPartitions]:
    """Partitions as the heartbeat lists them: by topic, sorted, so equal sets look equal."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [GroupTopicPartitions(t, sorted(ps)) for t, ps in sorted(by_topic.items())]


def from_wire(assignment: list[GroupTopicPartitions]) -> Partitions:
    return frozenset(TopicPartition(t.topic, p) for t in assignment for p in t.partitions)


class GroupMembership:
    """One consumer's membership of `group_id`; see the module doc. Not thread-safe: the
    shell calls it from its event loop (`polled` excepted, a plain store)."""

    def __init__(
        self,
        group_id: str,
        *,
        rebalance_timeout_ms: int,
        max_poll_interval_ms: int,
        retry_backoff_ms: float,
        retry_backoff_max_ms: float,
        instance_id: str | None = None,
    ) -> None:
        self.group_id = group_id
        self.instance_id = instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.state = MemberState.UNSUBSCRIBED
        self.member_id = ""
        self.member_epoch = MEMBER_EPOCH_JOIN
        self.subscription: tuple[str, ...] = ()
        self.owned: Partitions = _NONE
        self.target: Partitions | None = None  # the broker's last assignment
        self.heartbeat_interval_ms: float | None = None
        self.fatal_error: MinibrokerError | None = None
        self.last_poll_ms = 0.0
        self._next_heartbeat_ms = math.inf
        self._failures = 0
        # What the broker has acknowledged; None forces the field into the next heartbeat.
        self._acked_subscription: tuple[str, ...] | None = None
        self._acked_owned: Partitions | None = None
        # The heartbeat awaiting its answer: the incarnation it belongs to and what it carried.
        self._in_flight: tuple[int, tuple[str, ...] | None, Partitions | None] | None = None
        self._incarnation = 0  # bumped on every leave and fence: older answers are ignored

    # ------------------------------------------------------------------ the application

    def subscribe(self, topics: tuple[str, ...] | list[str], now_ms: float) -> None:
        """Follow `topics` (joining if not a member yet); the next heartbeat says so at once."""
        wanted = tuple(sorted(set(topics)))
        if not wanted:
            raise ValueError("subscribe to at least one topic (unsubscribe to leave)")
        self.subscription = wanted
        self.last_poll_ms = now_ms
        if self.state is MemberState.UNSUBSCRIBED:
            self._rejoin()
        self._next_heartbeat_ms = now_ms

    def polled(self, now_ms: float) -> None:
        """The application polled: the max_poll_interval_ms clock restarts."""
        self.last_poll_ms = now_ms

    def leave(self) -> ConsumerGroupHeartbeatRequest | None:
        """Stop being a member: the heartbeat to send (best effort) with epoch -1 (-2 for a
        static member), or None when the broker never named this member. Owned partitions
        should have been revoked first (`revoked`); whatever is left is forgotten."""
        request = None
        if self.member_id and self.state in (MemberState.JOINING, MemberState.STABLE):
            request = self._request(self._leave_epoch, None, None)
        self._forget()
        self.subscription = ()
        self.state = MemberState.UNSUBSCRIBED
        self._next_heartbeat_ms = math.inf
        return request

    def pending(self) -> Changes:
        """What the application must handle before the group can move on."""
        if self.state is MemberState.FENCED:
            return Changes(lost=self.owned)
        if self.state is MemberState.STABLE and self.target is not None:
            return Changes(revoke=self.owned - self.target, assign=self.target - self.owned)
        return Changes()

    def revoked(self, partitions: Partitions, now_ms: float) -> None:
        """These partitions were committed and given up: release them now."""
        self.owned -= partitions
        self._heartbeat_now(now_ms)

    def assigned(self, partitions: Partitions, now_ms: float) -> None:
        """These partitions are now consumed: acknowledge them now."""
        self.owned |= partitions
        self._heartbeat_now(now_ms)

    def heartbeat_soon(self, now_ms: float) -> None:
        """Something else (a refused commit) says the membership may have changed: ask now."""
        self._heartbeat_now(now_ms)

    def fail(self, error: MinibrokerError) -> None:
        """The group refused this consumer for good outside a heartbeat (a commit answered
        FENCED_INSTANCE_ID): no more heartbeats."""
        self.state = MemberState.FATAL
        self.fatal_error = error
        self._in_flight = None
        self._next_heartbeat_ms = math.inf

    def lost_handled(self, now_ms: float) -> None:
        """on_partitions_lost ran (from the application's poll): rejoin with epoch 0."""
        self.owned = _NONE
        self.last_poll_ms = now_ms
        if self.state is MemberState.FENCED:
            self._rejoin()
            self._next_heartbeat_ms = now_ms

    # ------------------------------------------------------------------ the heartbeat

    def poll(self, now_ms: float) -> tuple[ConsumerGroupHeartbeatRequest | None, float]:
        """The heartbeat to send now (None if none is due) and when the next one is due."""
        if self.state not in (MemberState.JOINING, MemberState.STABLE) or self._in_flight:
            return None, math.inf
        if (
            self.state is MemberState.STABLE
            and now_ms - self.last_poll_ms > self.max_poll_interval_ms
        ):
            # Kafka's consumer leaves rather than hold partitions an app stopped consuming
            # (a static one for the session timeout, with epoch -2).
            leave = self._request(self._leave_epoch, None, None)
            self._fence()
            return leave, math.inf
        if now_ms < self._next_heartbeat_ms:
            return None, self._next_heartbeat_ms
        subscription = self.subscription if self.subscription != self._acked_subscription else None
        owned = self.owned if self.owned != self._acked_owned else None
        self._in_flight = (self._incarnation, subscription, owned)
        return self._request(self.member_epoch, subscription, owned), math.inf

    def on_heartbeat(self, response: ConsumerGroupHeartbeatResponse, now_ms: float) -> Changes:
        """The answer to the heartbeat `poll` gave: adopt it and say what changed."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None or in_flight[0] != self._incarnation:
            return Changes()  # the answer to a leave, or from before a fence
        _, subscription, owned = in_flight
        error = response.error
        if error == ErrorCode.NONE:
            self._failures = 0
            if subscription is not None:
                self._acked_subscription = subscription
            if owned is not None:
                self._acked_owned = owned
            self.member_id = response.member_id or self.member_id
            self.member_epoch = response.member_epoch
            if response.heartbeat_interval_ms > 0:
                self.heartbeat_interval_ms = response.heartbeat_interval_ms
            if response.assignment is not None:
                self.target = from_wire(response.assignment)
            self.state = MemberState.STABLE
            unacked = (
                self.subscription != self._acked_subscription or self.owned != self._acked_owned
            )
            interval = self.heartbeat_interval_ms or self.retry_backoff_ms
            self._next_heartbeat_ms = now_ms if unacked else now_ms + interval
            return self.pending()
        if error in FENCED_CODES:
            self._fence()
            if not self.owned:  # nothing to lose: rejoin at once
                self._rejoin()
                self._next_heartbeat_ms = now_ms
            return self.pending()
        if error in RETRIABLE:
            self._retry_later(now_ms)
            return Changes()
        self.state = MemberState.FATAL
        self.fatal_error = error_for(
            error, f"consumer group {self.group_id!r} heartbeat", _explain(error, response.message)
        )
        return Changes(fatal=self.fatal_error)

    def on_heartbeat_failed(self, now_ms: float) -> None:
        """The heartbeat got no answer (lost connection, timeout): resend it whole, later."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None and in_flight[0] == self._incarnation:
            self._retry_later(now_ms)

    def connection_changed(self) -> None:
        """Heartbeats now go over another connection: the next one carries every field."""
        self._acked_subscription = self._acked_owned = None

    # ------------------------------------------------------------------ internals

    def _request(
        self, epoch: int, subscription: tuple[str, ...] | None, owned: Partitions | None
    ) -> ConsumerGroupHeartbeatRequest:
        return ConsumerGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=epoch,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            subscribed_topics=None if subscription is None else list(subscription),
            owned=None if owned is None else to_wire(owned),
            instance_id=self.instance_id,
        )

    @property
    def _leave_epoch(self) -> int:
        return MEMBER_EPOCH_LEAVE if self.instance_id is None else MEMBER_EPOCH_LEAVE_STATIC

    def _heartbeat_now(self, now_ms: float) -> None:
        if self.state in (MemberState.JOINING, MemberState.STABLE):
            self._next_heartbeat_ms = min(self._next_heartbeat_ms, now_ms)

    def _retry_later(self, now_ms: float) -> None:
        self._failures += 1
        backoff = self.retry_backoff_ms * 2 ** min(self._failures - 1, 20)
        self._next_heartbeat_ms = now_ms + min(backoff, self.retry_backoff_max_ms)
        self.connection_changed()  # the broker may or may not have seen it

    def _forget(self) -> None:
        """A new incarnation: no member id, epoch 0, no assignment, nothing acknowledged."""
        self._incarnation += 1
        self._in_flight = None
        self.member_id = ""
        self.member_epoch = MEMBER_EPOCH_JOIN
        self.target = None
        self.heartbeat_interval_ms = None
        self._failures = 0
        self.connection_changed()

    def _fence(self) -> None:
        self._forget()
        self.state = MemberState.FENCED
        self._next_heartbeat_ms = math.inf

    def _rejoin(self) -> None:
        self._forget()
        self.owned = _NONE
        self.state = MemberState.JOINING


def _explain(error: int, message: str | None) -> str | None:
    prefix = message + "; " if message else ""
    if error == ErrorCode.UNSUPPORTED_VERSION:
        return prefix + "the broker does not serve consumer groups"
    if error == ErrorCode.FENCED_INSTANCE_ID:
        return prefix + "another consumer joined with this one's group_instance_id"
    return message
