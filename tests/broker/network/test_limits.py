"""The connection limits' rule, pure (broker/network/limits.py): who is refused and
which connection not yet authenticated makes room."""

from __future__ import annotations

from broker.network.limits import ConnectionLimits, Refused

HOST = "127.0.0.1"


def test_a_full_broker_closes_the_oldest_unauthenticated_connection_anywhere() -> None:
    limits: ConnectionLimits[str] = ConnectionLimits(3, {}, 100, {})
    limits.opened("bare-1", "kafka", HOST, authenticated=False)
    limits.opened("alice", "sasl", HOST, authenticated=True)
    limits.opened("bare-2", "kafka", HOST, authenticated=False)
    assert limits.admit("sasl", HOST) == ["bare-1"]
    limits.opened("bob", "sasl", HOST, authenticated=False)
    limits.authenticated("bob")
    assert limits.admit("sasl", HOST) == ["bare-2"]
    limits.opened("carol", "sasl", HOST, authenticated=True)
    assert limits.admit("kafka", HOST) == Refused("max_connections=3")
    assert len(limits) == 3


def test_a_full_listener_makes_room_from_its_own_connections_only() -> None:
    limits: ConnectionLimits[str] = ConnectionLimits(100, {"kafka": 2}, 100, {})
    limits.opened("sasl-bare", "sasl", HOST, authenticated=False)
    limits.opened("k1", "kafka", HOST, authenticated=True)
    limits.opened("k2", "kafka", HOST, authenticated=False)
    assert limits.admit("kafka", HOST) == ["k2"]
    limits.opened("k3", "kafka", HOST, authenticated=True)
    assert limits.admit("kafka", HOST) == Refused("max_connections=2 of listener kafka")
    assert limits.admit("sasl", HOST) == []


def test_an_address_has_its_limit_or_its_override() -> None:
    limits: ConnectionLimits[str] = ConnectionLimits(100, {}, 1, {"10.0.0.1": 2})
    limits.opened("a", "sasl", HOST, authenticated=False)
    assert limits.admit("sasl", HOST) == Refused(f"max_connections_per_ip=1 for {HOST}")
    limits.opened("b", "sasl", "10.0.0.1", authenticated=False)
    assert limits.admit("sasl", "10.0.0.1") == []
    limits.closed("a")
    limits.closed("a")  # twice: a no-op
    assert limits.admit("sasl", HOST) == []
