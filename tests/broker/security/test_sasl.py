"""SASL on the real broker, both backends (docs/protocol.md section 7): SCRAM-SHA-256/512
and PLAIN with scramp's client, what is refused and whether the connection stays,
re-authentication and expiry, the audit trail, the SCRAM credential APIs, and a
credential write that survives kill -9."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scramp import ScramClient

from harness.broker_process import BrokerProcess
from harness.wire import AuthenticationError, WireClient
from tests.security_fixtures import Pki, listeners, metric, wait_for

USERS = {"admin": "admin-secret", "alice": "alice-pw", "bob": "bob-pw"}
BOOTSTRAP = ",".join(f"{user}:{password}" for user, password in USERS.items())
FAILURE = "Authentication failed: invalid credentials or malformed message"
DELAY_MS = 300


def sasl_broker(
    tmp_path: Path, backend: str, settings: str = "", pki: Pki | None = None, **env: str
) -> BrokerProcess:
    tls = pki.settings() if pki else ""
    extra = listeners(("sasl_tls", "sasl_tls")) if pki else ""
    config = (
        tls
        + 'sasl_mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]\n'
        + f"authentication_failure_delay_ms = {DELAY_MS}\n"
        + settings
        + listeners(("sasl", "sasl_plaintext"))
        + extra
    )
    return BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=config,
        env={"MINIBROKER_BOOTSTRAP_USERS": BOOTSTRAP, **env},
    ).start()


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    proc = sasl_broker(tmp_path, backend)
    try:
        yield proc
    finally:
        proc.kill()


def client(broker: BrokerProcess, listener: str = "sasl") -> WireClient:
    return WireClient(broker.address(listener), timeout_s=10)


def assert_failed_and_closed(c: WireClient, response: dict[str, object], since_s: float) -> None:
    """58 with the one message, answered after the delay, then the connection closed."""
    assert response["error"] == 58
    assert response["error_message"] == FAILURE
    assert time.monotonic() - since_s >= DELAY_MS / 1000 * 0.9
    assert c.is_closed_by_peer()


def test_before_authentication_only_api_versions_and_sasl_authenticate(
    broker: BrokerProcess,
) -> None:
    with client(broker) as c:
        for api, fields in (
            ("Metadata", {"topics": None}),
            ("CreateTopics", {"topics": [{"name": "t", "partitions": 1, "config": None}]}),
            ("DescribeUserScramCredentials", {"users": None}),
            # Malformed: before authentication it learns no more than that it must log in.
            ("Produce", {"acks": "all"}),
        ):
            r = c.call(api, **fields)
            assert r["error"] == 58, (api, r)
        # A Produce with acks=0 gets no answer, even a refusal: the next one is ApiVersions'.
        c.send("Produce", acks=0, timeout_ms=1000, transactional_id=None, topics=[])
        versions = c.call("ApiVersions")
        assert versions["error"] == 0
        assert {"SaslAuthenticate", "DescribeUserScramCredentials"} <= versions["apis"].keys()
        # The connection stayed open through all of that, and authenticates now.
        assert c.authenticate("alice", "alice-pw")["error"] == 0
        assert c.call("Metadata", topics=None)["error"] == 0


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_authenticates(broker: BrokerProcess, mechanism: str) -> None:
    with client(broker) as c:
        final = c.authenticate("alice", "alice-pw", mechanism)  # checks server-final too
        assert final["auth_bytes"].startswith(b"v=")
        assert final["session_lifetime_ms"] == 0
        assert c.create_topic("t") == 0
    assert broker.log_shows(
        f"event=authentication listener=sasl mechanism='{mechanism}' principal='User:alice' "
        "peer=127.0.0.1 result=success"
    )
    assert (
        metric(
            broker,
            "minibroker_authentications_total",
            {"listener": "sasl", "mechanism": mechanism, "result": "success"},
        )
        == 1
    )


@pytest.mark.parametrize(("user", "password"), [("alice", "Wr0ng-7f3a"), ("nobody", "alice-pw")])
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_and_unknown_user_get_the_same_answer(
    broker: BrokerProcess, mechanism: str, user: str, password: str
) -> None:
    with client(broker) as c:
        scram = ScramClient([mechanism], user, password)
        first = c.sasl(mechanism, scram.get_client_first().encode())
        assert first["error"] == 0  # an unknown user gets a server-first like anyone
        scram.set_server_first(first["auth_bytes"].decode())
        since = time.monotonic()
        final = c.sasl(mechanism, scram.get_client_final().encode())
        assert_failed_and_closed(c, final, since)
    assert broker.log_shows(f"principal='User:{user}' peer=127.0.0.1 result=failure")
    assert password not in broker.log_text()


def test_plain_needs_tls_unless_allowed(broker: BrokerProcess) -> None:
    with client(broker) as c:
        r = c.sasl("PLAIN", b"\0alice\0alice-pw")
        assert r["error"] == 33 and "allow_plain_without_tls" in r["error_message"]
        assert c.authenticate("alice", "alice-pw")["error"] == 0  # still open
    # allow_plain_without_tls is reloadable.
    assert broker.config is not None
    broker.config_path.write_text("allow_plain_without_tls = true\n" + broker.config)
    os.kill(broker.pid, signal.SIGHUP)
    assert broker.log_shows("allow_plain_without_tls=True")
    with client(broker) as c:
        assert c.authenticate("bob", "bob-pw", "PLAIN")["session_lifetime_ms"] == 0
        assert c.call("Metadata", topics=None)["error"] == 0
    # A wrong password fails as SCRAM's does.
    with client(broker) as c:
        since = time.monotonic()
        assert_failed_and_closed(c, c.sasl("PLAIN", b"\0bob\0N0pe-91c2"), since)
    assert "N0pe-91c2" not in broker.log_text() and "bob-pw" not in broker.log_text()


def test_plain_on_a_tls_listener(tmp_path: Path, backend: str) -> None:
    pki = Pki.create(tmp_path / "pki")
    proc = sasl_broker(tmp_path, backend, pki=pki)
    try:
        with WireClient(proc.address("sasl_tls"), ssl_context=pki.client_context()) as c:
            assert c.call("Metadata", topics=None)["error"] == 58
            assert c.authenticate("alice", "alice-pw", "PLAIN")["error"] == 0
            assert c.call("Metadata", topics=None)["error"] == 0
        with WireClient(proc.address("sasl_tls"), ssl_context=pki.client_context()) as c:
            assert c.authenticate("bob", "bob-pw", "SCRAM-SHA-512")["error"] == 0
    finally:
        proc.kill()


def test_an_unknown_mechanism_is_33_and_the_connection_stays(broker: BrokerProcess) -> None:
    with client(broker) as c:
        r = c.sasl("GSSAPI", b"")
        assert r["error"] == 33
        assert "SCRAM-SHA-256" in r["error_message"]
        assert c.authenticate("alice", "alice-pw", "SCRAM-SHA-512")["error"] == 0
    assert broker.log_shows("mechanism='GSSAPI' principal='' peer=127.0.0.1 result=unsupported")


def test_a_replayed_client_final_is_refused(broker: BrokerProcess) -> None:
    with client(broker) as c:
        scram = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
        first = c.sasl("SCRAM-SHA-256", scram.get_client_first().encode())
        scram.set_server_first(first["auth_bytes"].decode())
        client_final = scram.get_client_final().encode()
        assert c.sasl("SCRAM-SHA-256", client_final)["error"] == 0
    with client(broker) as c:
        # A fresh server nonce: the recorded proof is worth nothing.
        again = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
        assert c.sasl("SCRAM-SHA-256", again.get_client_first().encode())["error"] == 0
        since = time.monotonic()
        assert_failed_and_closed(c, c.sasl("SCRAM-SHA-256", client_final), since)


def test_channel_binding_is_refused(broker: BrokerProcess) -> None:
    with client(broker) as c:
        since = time.monotonic()
        r = c.sasl("SCRAM-SHA-256", b"p=tls-unique,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL")
        assert_failed_and_closed(c, r, since)


def test_reauthentication_starts_a_new_lifetime_and_expiry_closes(
    tmp_path: Path, backend: str
) -> None:
    lifetime_ms = 3000
    proc = sasl_broker(tmp_path, backend, f"connections_max_reauth_ms = {lifetime_ms}\n")
    try:
        with client(proc) as c:
            authenticated_at = time.monotonic()
            assert c.authenticate("alice", "alice-pw")["session_lifetime_ms"] == lifetime_ms
            time.sleep(lifetime_ms / 1000 / 2)
            again = c.authenticate("alice", "alice-pw", "SCRAM-SHA-512")
            assert again["session_lifetime_ms"] == lifetime_ms
            reauthenticated_at = time.monotonic()
            # Past the first session's end, the second one still serves.
            time.sleep(max(0.0, authenticated_at + lifetime_ms / 1000 + 0.2 - time.monotonic()))
            assert time.monotonic() < reauthenticated_at + lifetime_ms / 1000
            assert c.call("Metadata", topics=None)["error"] == 0
            # Past its end, the first request is not answered: the connection closes.
            time.sleep(max(0.0, reauthenticated_at + lifetime_ms / 1000 + 0.1 - time.monotonic()))
            c.send("Metadata", topics=None)
            assert c.is_closed_by_peer()
        assert proc.log_shows("result=reauthenticated")
        assert proc.log_shows("SASL session ended")
    finally:
        proc.kill()


def test_reauthentication_as_another_principal_fails(broker: BrokerProcess) -> None:
    with client(broker) as c:
        c.authenticate("alice", "alice-pw")
        since = time.monotonic()
        with pytest.raises(AuthenticationError) as info:
            c.authenticate("bob", "bob-pw")
        assert_failed_and_closed(c, info.value.response, since)
    assert broker.log_shows("re-authentication as User:bob, not User:alice")


def test_sasl_on_a_listener_without_it_is_33(tmp_path: Path, backend: str) -> None:
    proc = BrokerProcess(tmp_path / "data", backend=backend).start()
    try:
        with WireClient(proc.bootstrap) as c:
            r = c.sasl("SCRAM-SHA-256", b"n,,n=alice,r=abc")
            assert r["error"] == 33 and "does not take SASL" in r["error_message"]
            assert c.call("Metadata", topics=None)["error"] == 0
    finally:
        proc.kill()


# ------------------------------------------------------------------ SCRAM credentials


def upsertion(user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, object]:
    """KIP-554: the client computes the salted password; the password stays here."""
    salt = os.urandom(16)
    digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, 4096)
    return {
        "user": user,
        "mechanism": mechanism,
        "iterations": 4096,
        "salt": salt,
        "salted_password": salted,
    }


def test_credentials_are_described_and_altered(broker: BrokerProcess) -> None:
    with client(broker) as admin:
        admin.authenticate("admin", "admin-secret")
        described = admin.call("DescribeUserScramCredentials", users=None)
        assert described["error"] == 0
        assert [r["user"] for r in described["results"]] == ["admin", "alice", "bob"]
        assert described["results"][1]["credentials"] == [
            {"mechanism": "SCRAM-SHA-256", "iterations": 8192},
            {"mechanism": "SCRAM-SHA-512", "iterations": 8192},
        ]
        with client(broker) as alice:
            alice.authenticate("alice", "alice-pw")
            altered = admin.call(
                "AlterUserScramCredentials",
                deletions=[{"user": "alice", "mechanism": "SCRAM-SHA-512"}],
                upsertions=[upsertion("alice", "new-pw"), upsertion("carol", "carol-pw")],
            )
            assert [(r["user"], r["error"]) for r in altered["results"]] == [
                ("alice", 0),
                ("carol", 0),
            ]
            # A changed credential does not end a session already authenticated.
            assert alice.call("Metadata", topics=None)["error"] == 0
        assert (
            admin.call("DescribeUserScramCredentials", users=["nobody"])["results"][0]["error"]
            == 91
        )
    with client(broker) as c:
        c.authenticate("alice", "new-pw")
    with client(broker) as c:
        c.authenticate("carol", "carol-pw")
    with client(broker) as c, pytest.raises(AuthenticationError):
        c.authenticate("alice", "new-pw", "SCRAM-SHA-512")  # deleted


def test_a_credential_written_before_kill_9_is_whole_after_restart(
    tmp_path: Path, backend: str
) -> None:
    proc = sasl_broker(tmp_path, backend, MINIBROKER_CRASH_AT="credentials_altered")
    try:
        with client(proc) as admin:
            admin.authenticate("admin", "admin-secret")
            admin.send(
                "AlterUserScramCredentials",
                deletions=[],
                upsertions=[
                    upsertion("dave", "dave-pw"),
                    upsertion("dave", "dave-pw", "SCRAM-SHA-512"),
                ],
            )
            assert admin.is_closed_by_peer()  # killed between the write and the answer
        assert proc.proc is not None
        assert proc.proc.wait(10) == -signal.SIGKILL
        assert proc.env is not None
        del proc.env["MINIBROKER_CRASH_AT"]
        proc.start()
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            with client(proc) as c:
                assert c.authenticate("dave", "dave-pw", mechanism)["error"] == 0
        # Bootstrap runs only on an empty store: admin's password is still the first one.
        with client(proc) as c:
            c.authenticate("admin", "admin-secret")
    finally:
        proc.kill()


def test_bootstrap_users_never_reach_the_log(broker: BrokerProcess) -> None:
    assert broker.log_shows("event=credentials_bootstrapped users=['admin', 'alice', 'bob']")
    for password in USERS.values():
        assert password not in broker.log_text()
    assert wait_for(lambda: (broker.data_dir / "security" / "credentials.wal").exists())


def test_bad_bootstrap_users_stop_the_start_without_showing_the_password(tmp_path: Path) -> None:
    env = {**os.environ, "MINIBROKER_BOOTSTRAP_USERS": "admin:ok-pw,S3cret-nobody-named"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--metrics-port",
            "-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 3, r.stderr
    assert "entry 2 of MINIBROKER_BOOTSTRAP_USERS is not name:password" in r.stderr
    assert "S3cret" not in r.stderr and "ok-pw" not in r.stderr
