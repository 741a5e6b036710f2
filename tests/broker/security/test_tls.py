"""TLS listeners on the real broker, both backends (docs/protocol.md section 7): handshakes
with and without client certificates, what the broker refuses and how (the connection
closes, the broker carries on), the handshake deadline, and certificate rotation by
SIGHUP with an open connection kept."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, fetched_values, values_batch
from protocol.framing import encode_frame
from tests.security_fixtures import Pki, listeners, metric, wait_for

HANDSHAKE_TIMEOUT_MS = 500


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path / "pki")


def start(tmp_path: Path, backend: str, pki: Pki, client_auth: str = "none") -> BrokerProcess:
    config = (
        pki.settings(client_auth)
        + f"tls_handshake_timeout_ms = {HANDSHAKE_TIMEOUT_MS}\n"
        + listeners(("plain", "plaintext"), ("secure", "tls"))
    )
    return BrokerProcess(tmp_path / "data", backend=backend, config=config).start()


@pytest.fixture
def tls_broker(tmp_path: Path, backend: str, pki: Pki) -> Iterator[BrokerProcess]:
    proc = start(tmp_path, backend, pki)
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def mtls_broker(tmp_path: Path, backend: str, pki: Pki) -> Iterator[BrokerProcess]:
    proc = start(tmp_path, backend, pki, client_auth="required")
    try:
        yield proc
    finally:
        proc.kill()


def refused(broker: BrokerProcess, context: ssl.SSLContext) -> bool:
    """Whether the broker ends a connection made with `context`: the handshake fails, or
    (TLS 1.3 finishes the client's side before the broker judges its certificate) the
    first request gets no answer and the connection closes."""
    try:
        client = WireClient(broker.address("secure"), timeout_s=10, ssl_context=context)
    except (ssl.SSLError, ConnectionError):
        return True
    with client:
        try:
            client.send("ApiVersions")
            client.recv()
        except (ssl.SSLError, ConnectionError):
            return True
    return False


def test_tls_serves_requests_and_fetches_copy_through_tls(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    with WireClient(tls_broker.address("secure"), ssl_context=pki.client_context()) as c:
        assert isinstance(c.sock, ssl.SSLSocket)
        assert c.sock.version() in ("TLSv1.2", "TLSv1.3")
        assert c.call("ApiVersions")["error"] == 0
        assert c.create_topic("t") == 0
        values = [os.urandom(3000) for _ in range(50)]
        for v in values:
            assert c.produce("t", 0, values_batch([v]), acks=-1)["error"] == 0
        # On trio, Fetch sends plaintext connections' records with sendfile; through TLS
        # they must be read and encrypted, and arrive whole.
        fetched = c.fetch("t", 0, 0, partition_max_bytes=1 << 20)
        assert fetched["error"] == 0
        assert [v for _, v in fetched_values(fetched["records"])] == values
        assert tls_broker.log_shows("event=listening listener=secure security=tls")
    # The plaintext listener beside it answers the same data.
    with WireClient(tls_broker.address("plain")) as c:
        assert len(fetched_values(c.fetch("t", 0, 0)["records"])) == 50


def test_a_pipeline_of_batches_through_tls_is_answered_whole_and_in_order(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    """64 Produce requests of 16 KiB in one write: the broker reads the TLS records a
    read brought in together (tls.receiver), so frames span records and reads; each is
    answered once, in order, and its batch is in the log in that order."""
    with WireClient(tls_broker.address("secure"), ssl_context=pki.client_context()) as c:
        assert c.create_topic("piped") == 0
        values = [os.urandom(16 * 1024) for _ in range(64)]
        requests = b"".join(
            encode_frame(
                {
                    "api": "Produce",
                    "v": 1,
                    "cid": 1000 + i,
                    "acks": 1,
                    "timeout_ms": 10_000,
                    "topics": [
                        {
                            "topic": "piped",
                            "partitions": [{"partition": 0, "records": values_batch([v])}],
                        }
                    ],
                }
            )
            for i, v in enumerate(values)
        )
        c.send_raw(requests)
        answers = [c.recv() for _ in values]
        assert [a["cid"] for a in answers] == [1000 + i for i in range(64)]
        assert [a["topics"][0]["partitions"][0]["base_offset"] for a in answers] == list(range(64))
        fetched = c.fetch("piped", 0, 0, partition_max_bytes=4 << 20)
        assert [v for _, v in fetched_values(fetched["records"])] == values


def test_without_client_auth_the_principal_is_anonymous(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    context = pki.client_context(certificate=pki.client_certificate("alice"))
    with WireClient(tls_broker.address("secure"), ssl_context=context) as c:
        assert c.call("ApiVersions")["error"] == 0
    assert "principal='User:alice'" not in tls_broker.log_text()


def test_a_client_trusting_another_ca_refuses_the_broker(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        WireClient(tls_broker.address("secure"), ssl_context=pki.client_context(trust=trustme.CA()))


def test_mtls_names_the_principal_from_the_certificate(
    mtls_broker: BrokerProcess, pki: Pki
) -> None:
    context = pki.client_context(certificate=pki.client_certificate("alice"))
    with WireClient(mtls_broker.address("secure"), ssl_context=context) as c:
        assert c.call("Metadata", topics=None)["error"] == 0
    assert mtls_broker.log_shows(
        "event=authentication listener=secure mechanism='TLS' principal='User:alice' "
        "peer=127.0.0.1 result=success"
    )
    assert (
        metric(
            mtls_broker,
            "minibroker_authentications_total",
            {"listener": "secure", "mechanism": "TLS", "result": "success"},
        )
        == 1
    )


def test_requested_client_auth_takes_a_certificate_or_none(
    tmp_path: Path, backend: str, pki: Pki
) -> None:
    proc = start(tmp_path, backend, pki, client_auth="requested")
    try:
        with WireClient(proc.address("secure"), ssl_context=pki.client_context()) as c:
            assert c.call("ApiVersions")["error"] == 0
        context = pki.client_context(certificate=pki.client_certificate("carol"))
        with WireClient(proc.address("secure"), ssl_context=context) as c:
            assert c.call("ApiVersions")["error"] == 0
        assert proc.log_shows("mechanism='TLS' principal='User:carol'")
        assert proc.log_text().count("event=authentication") == 1
        # A certificate that is sent is checked all the same.
        stranger = pki.client_certificate("mallory", ca=trustme.CA())
        assert refused(proc, pki.client_context(certificate=stranger))
    finally:
        proc.kill()


@pytest.mark.parametrize("case", ["no certificate", "another CA", "expired"])
def test_mtls_refuses_a_client_without_a_valid_certificate(
    mtls_broker: BrokerProcess, pki: Pki, case: str
) -> None:
    certificate = {
        "no certificate": None,
        "another CA": pki.client_certificate("mallory", ca=trustme.CA()),
        "expired": pki.client_certificate("alice", expired=True),
    }[case]
    assert refused(mtls_broker, pki.client_context(certificate=certificate))
    assert mtls_broker.log_shows("event=tls_handshake_failed listener=secure")
    assert wait_for(
        lambda: (
            (
                metric(
                    mtls_broker, "minibroker_tls_handshake_failures_total", {"listener": "secure"}
                )
                or 0
            )
            >= 1
        )
    )
    # The broker carries on.
    good = pki.client_context(certificate=pki.client_certificate("alice"))
    with WireClient(mtls_broker.address("secure"), ssl_context=good) as c:
        assert c.call("ApiVersions")["error"] == 0


def test_an_expired_certificate_is_named_in_the_log(mtls_broker: BrokerProcess, pki: Pki) -> None:
    context = pki.client_context(certificate=pki.client_certificate("alice", expired=True))
    assert refused(mtls_broker, context)
    assert mtls_broker.log_shows("certificate has expired")


def test_plaintext_to_a_tls_port_closes_that_connection_only(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    with WireClient(tls_broker.address("secure"), timeout_s=10) as c:
        c.send("ApiVersions")  # a msgpack frame where a ClientHello belongs
        assert c.is_closed_by_peer()
    assert tls_broker.log_shows("event=tls_handshake_failed listener=secure")
    with WireClient(tls_broker.address("secure"), ssl_context=pki.client_context()) as c:
        assert c.call("ApiVersions")["error"] == 0


def test_a_stalled_handshake_is_closed(tls_broker: BrokerProcess, pki: Pki) -> None:
    started = time.monotonic()
    with socket.create_connection(
        ("127.0.0.1", tls_broker.listener_ports["secure"]), timeout=15
    ) as s:
        assert s.recv(1) == b""  # closed, never answered
    assert time.monotonic() - started >= HANDSHAKE_TIMEOUT_MS / 1000 * 0.9
    assert tls_broker.log_shows(
        f"not finished within tls_handshake_timeout_ms={HANDSHAKE_TIMEOUT_MS}"
    )


def test_sighup_rotates_the_certificate_and_keeps_open_connections(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    old = WireClient(tls_broker.address("secure"), ssl_context=pki.client_context())
    with old:
        assert old.call("ApiVersions")["error"] == 0
        new_ca = trustme.CA()
        pki.issue_server_certificate(new_ca)
        os.kill(tls_broker.pid, signal.SIGHUP)
        assert tls_broker.log_shows("event=tls_reloaded")
        # New handshakes present the new certificate ...
        with WireClient(
            tls_broker.address("secure"), ssl_context=pki.client_context(trust=new_ca)
        ) as c:
            assert c.call("ApiVersions")["error"] == 0
        with pytest.raises(ssl.SSLCertVerificationError):
            WireClient(tls_broker.address("secure"), ssl_context=pki.client_context())
        # ... and the connection made before goes on.
        assert old.call("Metadata", topics=None)["error"] == 0


def test_a_certificate_that_does_not_load_on_sighup_keeps_the_running_one(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    pki.keyfile.write_text("not a key\n")
    os.kill(tls_broker.pid, signal.SIGHUP)
    assert tls_broker.log_shows("event=tls_reload_failed")
    with WireClient(tls_broker.address("secure"), ssl_context=pki.client_context()) as c:
        assert c.call("ApiVersions")["error"] == 0
