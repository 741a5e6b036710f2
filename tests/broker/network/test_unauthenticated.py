"""What a connection that has not authenticated may claim of the broker (issue 39,
items 1 and 2), on the real broker process, both backends: frames no larger than
authentication needs, a bounded time to authenticate, and no room taken from
authenticated clients or from another listener."""

from __future__ import annotations

import itertools
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, frame_of_length, values_batch
from tests.security_fixtures import listeners, metric, wait_for

PREAUTH_BYTES_MAX = 512 * 1024
USERS = "alice:alice-pw"
BOUND_MS = 1500


def start(tmp_path: Path, backend: str, settings: str = "") -> BrokerProcess:
    config = (
        settings
        + listeners(("sasl", "sasl_plaintext"))
        + '[[listeners]]\nname = "kafka"\nhost = "127.0.0.1"\nport = 0\n'
        'security = "sasl_plaintext"\nprotocol = "kafka"\n'
    )
    return BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=config,
        env={"MINIBROKER_BOOTSTRAP_USERS": USERS},
    ).start()


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    proc = start(tmp_path, backend)
    try:
        yield proc
    finally:
        proc.kill()


@pytest.mark.parametrize("listener", ["sasl", "kafka"])
def test_a_frame_over_the_cap_before_authentication_closes_at_once(
    broker: BrokerProcess, listener: str
) -> None:
    """Only the length prefix is sent: the broker must not wait for (or hold) the rest."""
    with WireClient(broker.address(listener), timeout_s=5) as c:
        c.send_raw(frame_of_length(PREAUTH_BYTES_MAX + 1))
        assert c.is_closed_by_peer()
    assert broker.log_shows("before authentication exceeds sasl_server_max_receive_bytes")


def test_a_frame_under_the_cap_waits_and_after_authentication_more_is_allowed(
    broker: BrokerProcess,
) -> None:
    with WireClient(broker.address("sasl"), timeout_s=1) as c:
        c.send_raw(frame_of_length(PREAUTH_BYTES_MAX))
        assert not c.is_closed_by_peer()  # held for the rest, as any begun request
    with WireClient(broker.address("sasl"), timeout_s=10) as c:
        c.authenticate("alice", "alice-pw")
        assert c.create_topic("big") == 0
        batch = values_batch([b"x" * (PREAUTH_BYTES_MAX + 1024)])
        assert c.produce("big", 0, batch)["error"] == 0


# ------------------------------------------------------------------ a bounded time


def kafka_api_versions(sock: socket.socket, correlation_id: int) -> bool:
    """One Kafka ApiVersions v0 round trip; False when the broker closed the connection."""
    client_id = b"unauthenticated-test"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    try:
        sock.sendall(struct.pack(">i", len(body)) + body)
        head = sock.recv(4)
        if len(head) < 4:
            return False
        (length,) = struct.unpack(">i", head)
        while length:
            chunk = sock.recv(length)
            if not chunk:
                return False
            length -= len(chunk)
    except (ConnectionResetError, BrokenPipeError):
        return False
    return True


def minibroker_api_versions(c: WireClient) -> bool:
    try:
        return bool(c.call("ApiVersions")["error"] == 0)
    except (ConnectionError, BrokenPipeError):
        return False


@pytest.mark.parametrize("listener", ["sasl", "kafka"])
def test_a_connection_that_never_authenticates_is_closed_after_the_bound(
    tmp_path: Path, backend: str, listener: str
) -> None:
    """It asks ApiVersions five times a second: activity is no authentication. One that
    authenticated at the same time stays."""
    broker = start(tmp_path, backend, f"sasl_authentication_timeout_ms = {BOUND_MS}\n")
    try:
        host, port = broker.address(listener).rsplit(":", 1)
        idle = socket.create_connection((host, int(port)), timeout=10)
        idle_client = WireClient(broker.address("sasl"), timeout_s=10)
        calls = itertools.count(1)
        if listener == "kafka":

            def ask() -> bool:
                return kafka_api_versions(idle, next(calls))
        else:
            idle.close()
            idle = idle_client.sock

            def ask() -> bool:
                return minibroker_api_versions(idle_client)

        started = time.monotonic()
        with WireClient(broker.address("sasl"), timeout_s=10) as authenticated:
            authenticated.authenticate("alice", "alice-pw")
            while ask():
                assert time.monotonic() - started < 20, "still open long after the bound"
                time.sleep(0.2)  # its pace: a request now and then, as the attack did
            assert time.monotonic() - started >= BOUND_MS / 1000 * 0.9
            # Open as long as the other, and past the bound: authenticated, it stays.
            assert minibroker_api_versions(authenticated)
        idle.close()
        assert broker.log_shows(
            f"not authenticated within sasl_authentication_timeout_ms={BOUND_MS}"
        )
    finally:
        broker.kill()


# ------------------------------------------------------------------ room for the others


def bare_sockets(address: str, count: int) -> list[socket.socket]:
    host, port = address.rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(count)]


def turned_away(broker: BrokerProcess) -> int:
    """Connections the broker closed to make room, or refused."""
    return sum(
        "event=connection_evicted" in line or "event=connection_refused" in line
        for line in broker.log_lines
    )


def test_bare_sockets_on_one_listener_leave_room_for_a_client_on_another(
    tmp_path: Path, backend: str
) -> None:
    """Hundreds of sockets that never authenticate on the kafka listener, more than
    max_connections: a client still connects to the minibroker listener, authenticates
    and produces."""
    broker = start(tmp_path, backend, "max_connections = 200\n")
    sockets: list[socket.socket] = []
    try:
        sockets = bare_sockets(broker.address("kafka"), 300)
        assert wait_for(lambda: turned_away(broker) >= 100), "the broker took every socket"
        with WireClient(broker.address("sasl"), timeout_s=10) as c:
            c.authenticate("alice", "alice-pw")
            assert c.create_topic("orders") == 0
            assert c.produce("orders", 0, values_batch([b"one"]))["error"] == 0
    finally:
        for sock in sockets:
            sock.close()
        broker.kill()


def test_authenticated_connections_keep_their_room(tmp_path: Path, backend: str) -> None:
    """At max_connections with every connection authenticated, a new one is refused and
    none of them is closed for it."""
    broker = start(tmp_path, backend, "max_connections = 5\n")
    clients = []
    try:
        for _ in range(5):
            c = WireClient(broker.address("sasl"), timeout_s=10)
            clients.append(c)
            c.authenticate("alice", "alice-pw")
        (late,) = bare_sockets(broker.address("kafka"), 1)
        late.settimeout(10)
        assert late.recv(1) == b""  # refused: closed at once
        late.close()
        assert broker.log_shows("reason=max_connections=5")
        assert all(minibroker_api_versions(c) for c in clients)
    finally:
        for c in clients:
            c.close()
        broker.kill()


def test_a_listener_at_its_own_limit_makes_room_from_its_own_connections(
    tmp_path: Path, backend: str
) -> None:
    """A listener's max_connections counts its connections only: the kafka listener's
    bare sockets push each other out, never past its 10."""
    config = (
        listeners(("sasl", "sasl_plaintext"))
        + '[[listeners]]\nname = "kafka"\nhost = "127.0.0.1"\nport = 0\n'
        'security = "sasl_plaintext"\nprotocol = "kafka"\nmax_connections = 10\n'
    )
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=config,
        env={"MINIBROKER_BOOTSTRAP_USERS": USERS},
    ).start()
    sockets: list[socket.socket] = []
    try:
        sockets = bare_sockets(broker.address("kafka"), 30)
        assert wait_for(lambda: turned_away(broker) >= 20)
        assert metric(broker, "minibroker_listener_connections_open", {"listener": "kafka"}) == 10
        assert "of listener kafka" not in broker.log_text()  # none refused: room was made
    finally:
        for sock in sockets:
            sock.close()
        broker.kill()


def test_an_address_at_its_limit_is_refused(tmp_path: Path, backend: str) -> None:
    """max_connections_per_ip, and an override for 127.0.0.1 in its place."""
    settings = 'max_connections_per_ip = 2\nmax_connections_per_ip_overrides = ["127.0.0.1:4"]\n'
    broker = start(tmp_path, backend, settings)
    sockets: list[socket.socket] = []
    try:
        sockets = bare_sockets(broker.address("sasl"), 5)
        assert broker.log_shows("reason=max_connections_per_ip=4 for 127.0.0.1")
        assert turned_away(broker) == 1
    finally:
        for sock in sockets:
            sock.close()
        broker.kill()
