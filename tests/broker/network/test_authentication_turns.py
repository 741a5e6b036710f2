"""Logins take turns (issue 40, item 6): at most `max_authenticating_connections` of a
listener's connections not yet authenticated run their SASL exchange at once, the
others wait in order and lose nothing; authenticated clients never wait for a turn,
and a turn that outlasts `authentication_turn_ms` goes to the next login. On the real
broker process, both backends."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch
from tests.security_fixtures import Pki, listeners, metric, wait_for

USERS = "alice:alice-pw"


def start(tmp_path: Path, backend: str, settings: str) -> BrokerProcess:
    return BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=settings + listeners(("sasl", "sasl_plaintext")),
        env={"MINIBROKER_BOOTSTRAP_USERS": USERS},
        metrics_port=0,
    ).start()


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    proc = start(
        tmp_path,
        backend,
        "max_authenticating_connections = 2\nauthentication_turn_ms = 600000\n",
    )
    try:
        yield proc
    finally:
        proc.kill()


def turns(broker: BrokerProcess, listener: str = "sasl") -> tuple[float | None, float | None]:
    """(connections holding a turn, connections waiting) on `listener`."""
    labels = {"listener": listener}
    return (
        metric(broker, "minibroker_listener_authenticating", labels),
        metric(broker, "minibroker_listener_authentications_waiting", labels),
    )


def test_logins_beyond_the_turns_wait_in_order_and_none_is_lost(broker: BrokerProcess) -> None:
    """Two connections hold both turns without a word; the logins behind them wait,
    unanswered, while an authenticated client produces; once the two leave, every
    waiting login is answered and authenticates."""
    address = broker.address("sasl")
    with WireClient(address, timeout_s=10) as producer:
        producer.authenticate("alice", "alice-pw")
        assert producer.create_topic("orders") == 0
        holders = [WireClient(address, timeout_s=10) for _ in range(2)]
        waiting = [WireClient(address, timeout_s=10) for _ in range(3)]
        try:
            assert wait_for(lambda: turns(broker) == (2, 3)), turns(broker)
            for c in waiting:
                c.send("ApiVersions")
            # Authenticated traffic takes no turn: it runs while the logins wait.
            for i in range(20):
                batch = values_batch([f"v{i}".encode()])
                assert producer.produce("orders", 0, batch)["error"] == 0
            assert turns(broker) == (2, 3)
            for c in holders:
                c.close()
            for c in waiting:
                assert c.recv()["error"] == 0  # the request sent while it waited
                c.authenticate("alice", "alice-pw")
            assert wait_for(lambda: turns(broker) == (0, 0)), turns(broker)
        finally:
            for c in holders + waiting:
                c.close()


def test_a_turn_held_too_long_goes_to_the_next_login(tmp_path: Path, backend: str) -> None:
    """One idle connection holds the only turn; a login behind it gets the turn once
    authentication_turn_ms has passed, and the idle one still may log in after."""
    broker = start(
        tmp_path, backend, "max_authenticating_connections = 1\nauthentication_turn_ms = 300\n"
    )
    try:
        address = broker.address("sasl")
        with WireClient(address, timeout_s=10) as idle, WireClient(address, timeout_s=10) as c:
            assert wait_for(lambda: turns(broker)[1] == 1), turns(broker)
            c.authenticate("alice", "alice-pw")
            idle.authenticate("alice", "alice-pw")
            assert turns(broker) == (0, 0)
    finally:
        broker.kill()


def test_a_storm_of_logins_all_succeed(tmp_path: Path, backend: str) -> None:
    """100 SCRAM logins at once through 4 turns, queued behind 4 silent connections
    that hold the turns: every one waits, then authenticates once the 4 are gone,
    never more than 4 running at once, and the turns are all given back."""
    broker = start(
        tmp_path, backend, "max_authenticating_connections = 4\nauthentication_turn_ms = 600000\n"
    )
    storm = 100
    seen: list[tuple[float | None, float | None]] = []
    done = threading.Event()

    def login(_: int) -> int:
        with WireClient(broker.address("sasl"), timeout_s=30) as c:
            return int(c.authenticate("alice", "alice-pw")["error"])

    def watch() -> None:
        while not done.is_set():
            seen.append(turns(broker))

    silent = [WireClient(broker.address("sasl"), timeout_s=10) for _ in range(4)]
    try:
        assert wait_for(lambda: turns(broker) == (4, 0)), turns(broker)
        with ThreadPoolExecutor(storm + 1) as pool:
            logins = [pool.submit(login, i) for i in range(storm)]
            assert wait_for(lambda: turns(broker) == (4, storm)), turns(broker)
            watching = pool.submit(watch)
            for c in silent:
                c.close()
            results = [f.result(timeout=60) for f in logins]
            done.set()
            watching.result()
        assert results == [0] * storm
        assert max(held or 0 for held, _ in seen) <= 4, seen
        successes = metric(
            broker,
            "minibroker_authentications_total",
            {"listener": "sasl", "mechanism": "SCRAM-SHA-256", "result": "success"},
        )
        assert successes == storm
        assert wait_for(lambda: turns(broker) == (0, 0)), turns(broker)
    finally:
        done.set()
        for c in silent:
            c.close()
        broker.kill()


def test_a_tls_handshake_waits_its_turn(tmp_path: Path, backend: str) -> None:
    """On a tls listener the handshake is the login: a socket that never sends its
    ClientHello holds the only turn, a client's handshake waits behind it and
    completes once the socket is gone."""
    pki = Pki.create(tmp_path / "pki")
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=pki.settings()
        + "max_authenticating_connections = 1\nauthentication_turn_ms = 600000\n"
        + listeners(("secure", "tls")),
        metrics_port=0,
    ).start()
    try:
        host, port = broker.address("secure").rsplit(":", 1)
        silent = socket.create_connection((host, int(port)), timeout=10)
        assert wait_for(lambda: turns(broker, "secure") == (1, 0)), turns(broker, "secure")
        with ThreadPoolExecutor(1) as pool:
            connecting = pool.submit(WireClient, broker.address("secure"), 30, pki.client_context())
            assert wait_for(lambda: turns(broker, "secure") == (1, 1)), turns(broker, "secure")
            assert not connecting.done()
            silent.close()
            with connecting.result(timeout=30) as c:
                assert c.call("ApiVersions")["error"] == 0
        assert wait_for(lambda: turns(broker, "secure") == (0, 0)), turns(broker, "secure")
    finally:
        broker.kill()
