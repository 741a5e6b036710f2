"""The connection limits' rule, pure (broker/network/limits.py): who is refused and
which connection not yet authenticated makes room."""

from __future__ import annotations

from broker.network.limits import AuthenticationTurns, ConnectionLimits, Refused

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


def test_logins_beyond_the_turns_wait_in_order_and_are_woken_as_turns_free() -> None:
    turns: AuthenticationTurns[str] = AuthenticationTurns(2, 100)
    assert turns.ask("a", "sasl", 0) == (True, [])
    assert turns.ask("b", "sasl", 0) == (True, [])
    assert turns.ask("c", "sasl", 0) == (False, [])
    assert turns.ask("d", "sasl", 0) == (False, [])
    assert (turns.holding("sasl"), turns.waiting("sasl")) == (2, 2)
    assert turns.ask("a", "sasl", 50) == (True, [])  # a holder's next step
    assert turns.leave("a", 60) == ["c"]  # authenticated: the first waiter's turn
    assert turns.ask("c", "sasl", 60) == (True, [])
    assert turns.leave("d", 70) == []  # closed while waiting
    assert turns.leave("d", 70) == []
    assert (turns.holding("sasl"), turns.waiting("sasl")) == (2, 0)


def test_each_listener_has_its_own_turns() -> None:
    turns: AuthenticationTurns[str] = AuthenticationTurns(1, 100)
    assert turns.ask("a", "sasl", 0) == (True, [])
    assert turns.ask("k", "kafka", 0) == (True, [])
    assert turns.ask("b", "sasl", 0) == (False, [])


def test_a_turn_held_too_long_goes_to_a_waiter_and_its_holder_queues_again() -> None:
    """An idle or slow connection cannot keep logins out: once its turn has lasted
    turn_ms it goes to the first connection waiting, and the holder waits at its next
    step."""
    turns: AuthenticationTurns[str] = AuthenticationTurns(1, 100)
    assert turns.ask("idle", "sasl", 0) == (True, [])
    assert turns.next_expiry_ms() is None  # no one waits: the turn may last
    assert turns.ask("idle", "sasl", 500) == (True, [])
    assert turns.ask("b", "sasl", 520) == (False, [])
    assert turns.next_expiry_ms() == 100  # already over: the waiter hands it on at once
    assert turns.expire(520) == ["b"]
    assert turns.next_expiry_ms() is None
    assert turns.ask("c", "sasl", 530) == (False, [])
    assert turns.next_expiry_ms() == 620
    assert turns.expire(619) == []
    assert turns.ask("idle", "sasl", 650) == (False, [])  # behind c
    assert turns.expire(620) == ["c"]
    assert turns.leave("c", 660) == ["idle"]


def test_a_holder_past_its_turn_hands_it_on_when_it_asks() -> None:
    turns: AuthenticationTurns[str] = AuthenticationTurns(1, 100)
    turns.ask("slow", "sasl", 0)
    turns.ask("b", "sasl", 10)
    assert turns.ask("slow", "sasl", 100) == (False, ["b"])
    assert turns.ask("b", "sasl", 100) == (True, [])


def test_only_as_many_turns_end_as_connections_wait() -> None:
    turns: AuthenticationTurns[str] = AuthenticationTurns(3, 100)
    for conn in ("a", "b", "c"):
        turns.ask(conn, "sasl", 0)
    turns.ask("d", "sasl", 0)
    assert turns.expire(100) == ["d"]
    assert turns.ask("b", "sasl", 150) == (True, [])  # a's turn went; b's stays
    assert turns.ask("c", "sasl", 150) == (True, [])
