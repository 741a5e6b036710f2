"""The metrics server's TLS and basic auth: the settings, the cache of good credentials,
and the real broker answering scrapes over HTTPS (certificates from trustme)."""

from __future__ import annotations

import base64
import http.client
import os
import signal
import ssl
from pathlib import Path

import anyio
import bcrypt
import pytest
import trustme

from broker import config as cfg
from broker.network import http_endpoints
from broker.network.http_endpoints import BasicAuth
from harness.broker_process import BrokerProcess, serve_once
from tests.security_fixtures import Pki

PASSWORD = "scrape-me-please"
# Cost 4, bcrypt's least: the tests check behaviour, not strength.
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# --------------------------------------------------------------------------- settings


def test_users_are_a_table_of_bcrypt_hashes() -> None:
    c = cfg.BrokerConfig().with_overrides(
        {"metrics_basic_auth_users": {"prometheus": HASH, "alice": "$2y$" + HASH[4:]}}
    )
    assert c.metrics_basic_auth_users == (("alice", "$2y$" + HASH[4:]), ("prometheus", HASH))
    # Sensitive: DescribeConfigs never shows it.
    (described,) = [d for d in cfg.describe_broker(c) if d.name == "metrics_basic_auth_users"]
    assert described.value is None and described.sensitive
    assert HASH not in repr(c) and "metrics_basic_auth_users" not in repr(c)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["prometheus:" + HASH], "expected a table"),
        ({"prometheus": "plain-password"}, "the hash of user 'prometheus' is not a bcrypt hash"),
        ({"prometheus": HASH[:-1]}, "is not a bcrypt hash"),
        ({"prometheus": "$2b$03$" + HASH[7:]}, "cost 4..31"),
        ({"a:b": HASH}, "user 'a:b' is invalid"),
        ({"": HASH}, "user '' is invalid"),
        ({"p": 12}, "the hash of user 'p'"),
        ({f"u{i}": HASH for i in range(101)}, "at most 100"),
    ],
)
def test_bad_users_are_refused_without_showing_the_hash(value: object, message: str) -> None:
    with pytest.raises(cfg.ConfigError, match=message) as refused:
        cfg.BrokerConfig().with_overrides({"metrics_basic_auth_users": value})
    assert HASH[7:] not in str(refused.value)
    assert "plain-password" not in str(refused.value)


def test_certificate_and_key_go_together() -> None:
    with pytest.raises(cfg.ConfigError, match="go together"):
        cfg.BrokerConfig().with_overrides({"metrics_tls_certfile": "/x.pem"})


def test_a_certificate_that_does_not_load_stops_the_start(tmp_path: Path) -> None:
    settings = tmp_path / "b.toml"
    settings.write_text(
        f'metrics_tls_certfile = "{tmp_path}/none.pem"\nmetrics_tls_keyfile = "{tmp_path}/k"\n'
    )
    r = serve_once(tmp_path / "data", "--config", str(settings), "--metrics-port", "0")
    assert r.returncode == 2, r.stderr
    assert "metrics_tls_certfile=" in r.stderr and "none.pem" in r.stderr


# --------------------------------------------------------------------------- the cache


def test_a_good_password_costs_one_bcrypt_per_cache_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []
    checkpw = http_endpoints._checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return checkpw(password, hashed)

    monkeypatch.setattr(http_endpoints, "_checkpw", counted)
    now = [1000.0]
    monkeypatch.setattr(http_endpoints.time, "monotonic", lambda: now[0])
    auth = BasicAuth((("prometheus", HASH),))
    right = basic("prometheus", PASSWORD).encode()

    async def main() -> list[bool]:
        return [
            await auth.check(right),
            await auth.check(right),  # remembered
            await auth.check(basic("prometheus", "wrong").encode()),  # never remembered
            await auth.check(basic("prometheus", "wrong").encode()),
            await auth.check(basic("nobody", PASSWORD).encode()),  # a bcrypt all the same
            await auth.check(b"Basic !!!"),  # not base64: no bcrypt needed
            await auth.check(basic("prometheus", "x" * 100).encode()),  # over bcrypt's 72
        ]

    assert anyio.run(main) == [True, True, False, False, False, False, False]
    assert calls == [PASSWORD.encode(), b"wrong", b"wrong", PASSWORD.encode(), b"x" * 100]
    now[0] += http_endpoints.AUTH_CACHE_S + 1
    calls.clear()
    assert anyio.run(auth.check, right) is True
    assert calls == [PASSWORD.encode()]  # checked again once the period is over


# --------------------------------------------------------------------------- real broker


def get(
    port: int, path: str, context: ssl.SSLContext | None, authorization: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection("localhost", port, timeout=10, context=context)
        if context is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    )
    try:
        conn.request("GET", path, headers={"Authorization": authorization} if authorization else {})
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read()
    finally:
        conn.close()


def test_scrapes_over_tls_need_the_password(tmp_path: Path, backend: str) -> None:
    pki = Pki.create(tmp_path / "tls")
    settings = (
        f'metrics_tls_certfile = "{pki.certfile}"\n'
        f'metrics_tls_keyfile = "{pki.keyfile}"\n'
        f'metrics_basic_auth_users = {{ prometheus = "{HASH}" }}\n'
    )
    broker = BrokerProcess(tmp_path / "data", backend=backend, config=settings).start()
    try:
        port = broker.metrics_port
        assert port is not None
        trusted = pki.client_context()
        # The probes need no credentials (Kubernetes and Docker cannot send any).
        assert get(port, "/healthz", trusted)[::2] == (200, b"ok\n")
        assert get(port, "/readyz", trusted)[::2] == (200, b"ready\n")
        for authorization in (
            None,
            basic("prometheus", "wrong"),
            basic("nobody", PASSWORD),
            basic("prometheus", PASSWORD + "x"),
            "Bearer " + PASSWORD,
            "Basic " + base64.b64encode(PASSWORD.encode()).decode(),  # no user:
        ):
            status, headers, body = get(port, "/metrics", trusted, authorization)
            assert status == 401, authorization
            assert headers["WWW-Authenticate"].startswith("Basic realm=")
            assert b"minibroker_" not in body
        status, _, body = get(port, "/metrics", trusted, basic("prometheus", PASSWORD))
        assert status == 200 and b"minibroker_build_info" in body
        # Plain HTTP on the TLS port, and a client that does not trust the certificate.
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            get(port, "/healthz", None)
        with pytest.raises(ssl.SSLCertVerificationError):
            get(port, "/metrics", ssl.create_default_context(), basic("prometheus", PASSWORD))
        assert broker.log_shows("event=metrics_tls_handshake_failed")
        # Secrets stay out of the log: neither the password nor the hash.
        assert PASSWORD not in broker.log_text() and HASH not in broker.log_text()
        assert broker.proc is not None and broker.proc.poll() is None
    finally:
        broker.kill()


def test_sighup_reads_the_metrics_certificate_again(tmp_path: Path) -> None:
    """New connections get the new certificate; files that do not load leave it."""
    pki = Pki.create(tmp_path / "tls")
    settings = f'metrics_tls_certfile = "{pki.certfile}"\nmetrics_tls_keyfile = "{pki.keyfile}"\n'
    broker = BrokerProcess(tmp_path / "data", config=settings).start()
    try:
        port = broker.metrics_port
        assert port is not None
        new_ca = trustme.CA()
        pki.issue_server_certificate(new_ca)
        os.kill(broker.pid, signal.SIGHUP)
        assert broker.log_shows("event=metrics_tls_reloaded")
        assert get(port, "/metrics", pki.client_context(trust=new_ca))[0] == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            get(port, "/metrics", pki.client_context())
        pki.keyfile.write_text("not a key\n")
        os.kill(broker.pid, signal.SIGHUP)
        assert broker.log_shows("event=metrics_tls_reload_failed")
        assert get(port, "/healthz", pki.client_context(trust=new_ca))[::2] == (200, b"ok\n")
    finally:
        broker.kill()
