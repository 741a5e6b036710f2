"""`classic.subscribed_topics`, what OffsetDelete asks of a classic group (KIP-496):
its consumers' subscriptions read from their metadata, pure."""

from __future__ import annotations

import struct

from broker.groups import classic


def subscription(*topics: str) -> bytes:
    """Kafka's ConsumerProtocol Subscription v0: version, topics, user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


def member(member_id: str, *protocols: tuple[str, bytes], kind: str = "consumer") -> classic.Member:
    return classic.Member(
        member_id=member_id,
        instance_id=None,
        client_id="c",
        client_host="h",
        protocol_type=kind,
        protocols=tuple(protocols),
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        last_heartbeat_ms=0,
    )


def group(*members: classic.Member, chosen: str | None = None) -> classic.ClassicGroup:
    kind = members[0].protocol_type if members else None
    return classic.ClassicGroup(
        "g",
        state=classic.STABLE if members else classic.EMPTY,
        protocol_type=kind,
        protocol_name=chosen,
        members={mb.member_id: mb for mb in members},
    )


def test_no_members_subscribe_to_nothing() -> None:
    assert classic.subscribed_topics(group()) == frozenset()


def test_the_members_subscriptions_for_the_chosen_protocol_are_united() -> None:
    a = member("a", ("range", subscription("x")), ("roundrobin", subscription("x", "y")))
    b = member("b", ("roundrobin", subscription("z")), ("range", subscription("z")))
    assert classic.subscribed_topics(group(a, b, chosen="roundrobin")) == {"x", "y", "z"}
    # Before any protocol is chosen, each member's first protocol speaks for it.
    assert classic.subscribed_topics(group(a, b)) == {"x", "z"}


def test_a_subscription_that_does_not_read_covers_every_topic() -> None:
    topics = classic.subscribed_topics(group(member("a", ("range", b"\x00"))))
    assert topics is not None and "anything" in topics


def test_members_of_another_protocol_type_are_not_consumers() -> None:
    assert classic.subscribed_topics(group(member("a", ("p", b""), kind="connect"))) is None
