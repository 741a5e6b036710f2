"""The SDK, the command line and their security against the real broker process, on both
backends: TLS (certificates from trustme) and SASL listeners with bootstrap users
(MINIBROKER_BOOTSTRAP_USERS), re-authentication, the authorizer and its ACLs, SCRAM
users made and removed over the wire (docs/protocol.md section 7).

The broker's side of these (listeners, SaslAuthenticate, the credential and ACL APIs)
comes with the harness's `config` settings file; without it the tests skip."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from client import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    Consumer,
    MinibrokerError,
    NoBrokersAvailable,
    Producer,
    TopicPartition,
    admin,
)
from client.config import AdminConfig
from client.types import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from harness.broker_process import BrokerProcess

if "config" not in BrokerProcess.__dataclass_fields__:
    pytest.skip(
        "the harness cannot give the broker a settings file yet (listeners come with the "
        "broker's side of issue 26)",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[3]
ADMIN_SECRET = "admin-Secret-1"
ALICE_SECRET = "alice-Secret-2"
USERS = f"admin:{ADMIN_SECRET},alice:{ALICE_SECRET}"


@dataclass
class Secured:
    """A broker with a plaintext, a sasl_plaintext, a tls and a sasl_tls listener."""

    broker: BrokerProcess
    ca_file: str
    tmp: Path

    def admin(self, **settings: Any) -> AdminConfig:
        return AdminConfig(bootstrap_servers=self.broker.address("sasl"), **sasl("admin", settings))

    def sasl_settings(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> dict:
        return sasl(user, {"sasl_plain_password": password, "sasl_mechanism": mechanism})

    def tls_settings(self, **more: Any) -> dict[str, Any]:
        return {"security_protocol": "SSL", "ssl_cafile": self.ca_file, **more}

    def by_name(self, listener: str) -> str:
        """The listener's address by the name its certificate carries."""
        return f"localhost:{self.broker.listener_ports[listener]}"


def sasl(user: str, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": user,
        "sasl_plain_password": ADMIN_SECRET if user == "admin" else ALICE_SECRET,
        **settings,
    }


def settings_file(tmp: Path, ca: trustme.CA, **extra: str) -> str:
    cert = ca.issue_cert("localhost")  # not 127.0.0.1: connecting by address is a mismatch
    cert.cert_chain_pems[0].write_to_path(str(tmp / "broker.pem"))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(tmp / "broker.pem"), append=True)
    cert.private_key_pem.write_to_path(str(tmp / "broker.key"))
    lines = [
        f'tls_certfile = "{tmp / "broker.pem"}"',
        f'tls_keyfile = "{tmp / "broker.key"}"',
        'sasl_mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]',
        "authorizer = true",
        'super_users = ["User:admin"]',
        "authentication_failure_delay_ms = 50",
        *(f"{key} = {value}" for key, value in extra.items()),
    ]
    for name, security in (
        ("plain", "plaintext"),
        ("sasl", "sasl_plaintext"),
        ("tls", "tls"),
        ("sasl_tls", "sasl_tls"),
    ):
        lines += [
            "[[listeners]]",
            f'name = "{name}"',
            'host = "127.0.0.1"',
            "port = 0",
            f'security = "{security}"',
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def start(tmp_path: Path, backend: str, ca: trustme.CA, **extra: str) -> Secured:
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=settings_file(tmp_path, ca, **extra),
        env={"MINIBROKER_BOOTSTRAP_USERS": USERS},
    ).start()
    return Secured(broker, str(ca_file), tmp_path)


@pytest.fixture
def secured(tmp_path: Path, backend: str, ca: trustme.CA) -> Iterator[Secured]:
    s = start(tmp_path, backend, ca)
    try:
        yield s
    finally:
        s.broker.kill()


def allow(principal: str, operation: str, kind: str, name: str, **more: Any) -> AclBinding:
    return AclBinding(
        principal,
        "*",
        AclOperation(operation),
        AclPermissionType.ALLOW,
        ResourcePattern(ResourceType(kind), name, PatternType(more.get("pattern", "literal"))),
    )


def round_trip(bootstrap: str, topic: str, **settings: Any) -> list[bytes | None]:
    with Producer(bootstrap, **settings) as p:
        for i in range(3):
            p.send(topic, f"v{i}".encode(), partition=0).get(timeout=10)
    with Consumer(
        TopicPartition(topic, 0),
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=2000,
        **settings,
    ) as c:
        return [r.value for r in c]


# --------------------------------------------------------------------------- authentication


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_scram_produce_and_consume(secured: Secured, mechanism: str) -> None:
    admin.create_topic(secured.admin(), "scram", 1)
    got = round_trip(
        secured.broker.address("sasl"),
        "scram",
        **secured.sasl_settings("admin", ADMIN_SECRET, mechanism),
    )
    assert got == [b"v0", b"v1", b"v2"]


def test_tls_and_sasl_tls_with_plain(secured: Secured) -> None:
    admin.create_topic(secured.admin(), "tls", 1)
    admin.create_acls(
        secured.admin(),
        [allow("User:ANONYMOUS", "all", "topic", "tls")],
    )
    assert round_trip(secured.by_name("tls"), "tls", **secured.tls_settings()) == [
        b"v0",
        b"v1",
        b"v2",
    ]
    over_tls = {
        **secured.sasl_settings("admin", ADMIN_SECRET, "PLAIN"),
        **secured.tls_settings(security_protocol="SASL_SSL"),
    }
    assert len(round_trip(secured.by_name("sasl_tls"), "tls", **over_tls)) == 6


def test_plain_is_refused_without_tls_and_says_so(secured: Secured) -> None:
    with pytest.raises(AuthenticationFailedError, match="does not accept SASL mechanism PLAIN"):
        admin.list_topics(
            AdminConfig(
                bootstrap_servers=secured.broker.address("sasl"),
                **secured.sasl_settings("admin", ADMIN_SECRET, "PLAIN"),
            )
        )


def test_wrong_credentials_fail_at_once_everywhere(secured: Secured) -> None:
    bootstrap = secured.broker.address("sasl")
    wrong = secured.sasl_settings("alice", "not-" + ALICE_SECRET)
    started = time.monotonic()
    with pytest.raises(AuthenticationFailedError) as caught:
        admin.list_topics(AdminConfig(bootstrap_servers=bootstrap, **wrong))
    assert f"authentication of 'alice' with SCRAM-SHA-512 at {bootstrap} failed" in str(
        caught.value
    )
    with Producer(bootstrap, max_block_ms=60_000, **wrong) as p:
        with pytest.raises(AuthenticationFailedError):
            p.send("t", b"x")
        with pytest.raises(AuthenticationFailedError):  # kept: not tried again
            p.send("t", b"x")
    with pytest.raises(AuthenticationFailedError):
        Consumer("t", bootstrap_servers=bootstrap, **wrong).close()
    assert time.monotonic() - started < 10  # not max_block_ms: one refusal each
    assert ALICE_SECRET not in secured.broker.log_text()


def test_a_client_without_sasl_at_a_sasl_listener_learns_why(secured: Secured) -> None:
    with pytest.raises(AuthenticationFailedError, match="requires SASL authentication"):
        admin.list_topics(secured.broker.address("sasl"))


def test_the_sync_consumers_lookups_over_tls_and_at_sasl_listeners(secured: Secured) -> None:
    """The sync Consumer's lookups take a connection of their own on the caller's thread
    (client/connection.py DirectRequests), with the same TLS context and so the same
    principal; with SASL they stay on the event loop's authenticated connection, and a
    consumer without SASL at a SASL listener is told why, every time."""
    admin.create_topic(secured.admin(), "looked", 1)
    admin.create_acls(secured.admin(), [allow("User:ANONYMOUS", "describe", "topic", "looked")])
    with Consumer(bootstrap_servers=secured.by_name("tls"), **secured.tls_settings()) as c:
        assert c.topics() == {"looked"}
        assert c.partitions_for_topic("looked") == {0}
        assert c._direct._conn is not None
    sasl_address = secured.broker.address("sasl")
    admin_sasl = secured.sasl_settings("admin", ADMIN_SECRET)
    with Consumer(bootstrap_servers=sasl_address, **admin_sasl) as c:
        assert c.topics() == c.topics() == {"looked"}
        assert c._direct._conn is None
    with Consumer(bootstrap_servers=sasl_address) as c:
        for _ in range(2):
            with pytest.raises(AuthenticationFailedError, match="requires SASL authentication"):
                c.topics()


def test_a_certificate_for_another_name_is_refused(secured: Secured) -> None:
    """The broker's certificate names localhost: connecting by address fails the hostname
    check, at once and for good, unless the check is turned off."""
    address = secured.broker.address("tls")
    started = time.monotonic()
    with pytest.raises(AuthenticationFailedError, match="certificate verify failed") as caught:
        admin.list_topics(AdminConfig(bootstrap_servers=address, **secured.tls_settings()))
    assert time.monotonic() - started < 5 and caught.value.mechanism == "TLS"
    unchecked = secured.tls_settings(ssl_check_hostname=False)
    assert admin.list_topics(AdminConfig(bootstrap_servers=address, **unchecked)) == []


def test_mtls_client_certificate_names_the_principal(
    tmp_path: Path, backend: str, ca: trustme.CA
) -> None:
    """tls_client_auth = "required": without a certificate the client says what it
    suspects; with one (its key encrypted, ssl_password) it is User:<CN>, which the
    ACLs then allow."""
    from cryptography.hazmat.primitives import serialization

    key_secret = "client-Key-Secret"
    client = ca.issue_cert("app-client.example.com", common_name="app-client")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    key = serialization.load_pem_private_key(client.private_key_pem.bytes(), None)
    (tmp_path / "client.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(key_secret.encode()),
        )
    )
    ca.cert_pem.write_to_path(str(tmp_path / "clients-ca.pem"))
    s = start(
        tmp_path,
        backend,
        ca,
        tls_cafile=f'"{tmp_path / "clients-ca.pem"}"',
        tls_client_auth='"required"',
    )
    try:
        address = s.by_name("tls")
        with pytest.raises(MinibrokerError, match="want a client certificate"):
            admin.list_topics(AdminConfig(bootstrap_servers=address, **s.tls_settings()))
        with (
            Producer(address, **s.tls_settings()) as p,
            pytest.raises(NoBrokersAvailable, match="want a client certificate"),
        ):
            p.send("mtls", b"x")
        admin.create_topic(s.admin(), "mtls", 1)
        admin.create_acls(s.admin(), [allow("User:app-client", "all", "topic", "mtls")])
        with_cert = s.tls_settings(
            ssl_certfile=str(tmp_path / "client.pem"),
            ssl_keyfile=str(tmp_path / "client.key"),
            ssl_password=key_secret,
        )
        assert round_trip(address, "mtls", **with_cert) == [b"v0", b"v1", b"v2"]
        assert "principal='User:app-client'" in s.broker.log_text()
    finally:
        s.broker.kill()


def test_reauthentication_is_invisible(
    tmp_path: Path, backend: str, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    """Sessions of 4 s: a producer and a consumer go on for 10 s on their connections,
    each authenticating again before its session ends (at 85-95% of it: 200-600 ms early,
    room for a loaded machine's late event loop), so none is closed."""
    caplog.set_level(logging.INFO, logger="minibroker.client")
    s = start(tmp_path, backend, ca, connections_max_reauth_ms="4000")
    try:
        admin.create_topic(s.admin(), "reauth", 1)
        settings = s.sasl_settings("admin", ADMIN_SECRET)
        bootstrap = s.broker.address("sasl")
        sent: list[bytes] = []
        with (
            Producer(bootstrap, **settings) as p,
            Consumer(
                TopicPartition("reauth", 0),
                bootstrap_servers=bootstrap,
                auto_offset_reset="earliest",
                **settings,
            ) as c,
        ):
            got: list[bytes | None] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                value = f"{len(sent)}".encode()
                p.send("reauth", value).get(timeout=10)
                sent.append(value)
                for records in c.poll(timeout_ms=100).values():
                    got += [r.value for r in records]
                time.sleep(0.05)
            while len(got) < len(sent):
                for records in c.poll(timeout_ms=1000).values():
                    got += [r.value for r in records]
            lost = [
                r.getMessage()
                for r in caplog.records
                if " closed: " in r.getMessage() and "closed by the client" not in r.getMessage()
            ]
            assert lost == []
        assert got == sent and len(sent) > 20
        # The producer's connection and the consumer's two, two or three times each.
        again = [line for line in s.broker.log_lines if "result=reauthenticated" in line]
        assert len(again) >= 6, s.broker.log_text()
        assert ADMIN_SECRET not in caplog.text
    finally:
        s.broker.kill()


# --------------------------------------------------------------------------- authorization


def test_acls_round_trip(secured: Secured) -> None:
    target = secured.admin()
    bindings = [
        allow("User:alice", "read", "topic", "orders"),
        allow("User:alice", "write", "topic", "ord", pattern="prefixed"),
        allow("User:bob", "describe", "group", "*"),
    ]
    created = admin.create_acls(target, bindings)
    assert created.created == bindings and created.failed == []
    assert sorted(admin.describe_acls(target), key=str) == sorted(bindings, key=str)
    alice = admin.describe_acls(target, AclBindingFilter(principal="User:alice"))
    assert sorted(alice, key=str) == sorted(bindings[:2], key=str)
    applying = admin.describe_acls(
        target,
        AclBindingFilter(
            resource_pattern=ResourcePatternFilter(ResourceType.TOPIC, "orders", PatternType.MATCH)
        ),
    )
    assert sorted(applying, key=str) == sorted(bindings[:2], key=str)
    (result,) = admin.delete_acls(
        target, [AclBindingFilter(resource_pattern=ResourcePatternFilter(ResourceType.GROUP))]
    )
    assert result.deleted == [bindings[2]] and result.error is None
    assert len(admin.describe_acls(target)) == 2


def test_alice_needs_acls(secured: Secured) -> None:
    admin.create_topic(secured.admin(), "orders", 1)
    alice = secured.sasl_settings("alice", ALICE_SECRET)
    bootstrap = secured.broker.address("sasl")
    with pytest.raises(AuthorizationFailedError, match="CLUSTER_AUTHORIZATION_FAILED"):
        admin.describe_acls(AdminConfig(bootstrap_servers=bootstrap, **alice))
    with (
        Producer(bootstrap, max_block_ms=3000, **alice) as p,
        pytest.raises(AuthorizationFailedError, match="TOPIC_AUTHORIZATION_FAILED"),
    ):
        p.send("orders", b"x", partition=0).get(timeout=10)
    admin.create_acls(secured.admin(), [allow("User:alice", "write", "topic", "orders")])
    with Producer(bootstrap, **alice) as p:
        assert p.send("orders", b"x", partition=0).get(timeout=10).offset >= 0


def test_acl_apis_without_the_authorizer_say_it_is_off(tmp_path: Path, backend: str) -> None:
    broker = BrokerProcess(tmp_path / "data", backend=backend, config="authorizer = false\n")
    broker.start()
    try:
        with pytest.raises(MinibrokerError, match=r"describe ACLs: SECURITY_DISABLED \(the"):
            admin.describe_acls(broker.bootstrap)
    finally:
        broker.kill()


# --------------------------------------------------------------------------- SCRAM users


def test_users_made_changed_and_removed_over_the_wire(secured: Secured) -> None:
    target = secured.admin()
    bootstrap = secured.broker.address("sasl")
    results = admin.alter_user_scram_credentials(
        target, [UserScramCredentialUpsertion("carol", "carol-1", "SCRAM-SHA-256", 4096)]
    )
    assert [(r.user, r.error) for r in results] == [("carol", None)]
    described = {d.user: d for d in admin.describe_user_scram_credentials(target)}
    assert [(c.mechanism, c.iterations) for c in described["carol"].credentials] == [
        ("SCRAM-SHA-256", 4096)
    ]
    assert set(described) >= {"admin", "alice", "carol"}
    carol = {**secured.sasl_settings("carol", "carol-1", "SCRAM-SHA-256")}
    admin.list_topics(AdminConfig(bootstrap_servers=bootstrap, **carol))  # logs in
    admin.alter_user_scram_credentials(
        target, [UserScramCredentialDeletion("carol", "SCRAM-SHA-256")]
    )
    assert admin.describe_user_scram_credentials(target, ["carol"]) == []
    with pytest.raises(AuthenticationFailedError):
        admin.list_topics(AdminConfig(bootstrap_servers=bootstrap, **carol))
    (missing,) = admin.alter_user_scram_credentials(
        target, [UserScramCredentialDeletion("carol", "SCRAM-SHA-256")]
    )
    assert missing.error is not None and "RESOURCE_NOT_FOUND" in str(missing.error)


# --------------------------------------------------------------------------- the command line


def cli(secured: Secured, *args: str, stdin: bytes = b"", config: str | None = None) -> Any:
    config_file = secured.tmp / "client.toml"
    if config is None:
        config_file.write_text(
            'security_protocol = "SASL_SSL"\n'
            f'ssl_cafile = "{secured.ca_file}"\n'
            'sasl_mechanism = "SCRAM-SHA-256"\n'
            'sasl_plain_username = "admin"\n'
            f'sasl_plain_password = "{ADMIN_SECRET}"\n'
        )
    else:
        config_file.write_text(config)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker_cli",
            *args,
            "--bootstrap-server",
            secured.by_name("sasl_tls"),
            "--client-config",
            str(config_file),
        ],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )


def test_cli_users_and_acls_with_a_client_config(secured: Secured) -> None:
    added = cli(secured, "users", "add", "dave", "--password-stdin", stdin=b"dave-Secret\n")
    assert added.returncode == 0, added.stderr
    listed = cli(secured, "users", "list", "dave")
    assert listed.stdout.decode().splitlines() == [
        "USER\tMECHANISM\tITERATIONS",
        "dave\tSCRAM-SHA-256\t8192",
        "dave\tSCRAM-SHA-512\t8192",
    ]
    granted = cli(
        secured,
        "acls",
        "add",
        "--allow-principal",
        "User:dave",
        "--operation",
        "Describe",
        "--operation",
        "Create",
        "--cluster",
    )
    assert granted.returncode == 0, granted.stderr
    assert "Added 2 ACL(s)" in granted.stdout.decode()
    dave = (
        'security_protocol = "SASL_SSL"\n'
        f'ssl_cafile = "{secured.ca_file}"\n'
        'sasl_mechanism = "SCRAM-SHA-512"\n'
        'sasl_plain_username = "dave"\n'
        'sasl_plain_password = "dave-Secret"\n'
    )
    assert cli(secured, "topics", "create", "daves", config=dave).returncode == 0
    listing = cli(secured, "acls", "list", "--cluster").stdout.decode()
    assert "User:dave\t*\tdescribe\tallow\tcluster\tcluster\tliteral" in listing
    removed = cli(
        secured,
        "acls",
        "remove",
        "--cluster",
        "--allow-principal",
        "User:dave",
        "--operation",
        "create",
    )
    assert removed.returncode == 0 and "Removed 1 ACL(s)" in removed.stdout.decode()
    gone = cli(secured, "users", "remove", "dave")
    assert gone.returncode == 0, gone.stderr
    refused = cli(secured, "topics", "list", config=dave)
    assert refused.returncode == 1
    assert b"authentication of 'dave' with SCRAM-SHA-512" in refused.stderr
    assert b"dave-Secret" not in refused.stderr + refused.stdout
    assert ADMIN_SECRET not in secured.broker.log_text()


def test_denials_read_the_same_in_produce_consume_and_the_sdk(secured: Secured) -> None:
    """`User:X may not OPERATION RESOURCE 'name'`, as the broker words it, also where
    the broker's answer carries only the code (Metadata's topics, Fetch's partitions);
    a group denial is said once, by the exception, not also by a logger."""
    admin.create_topic(secured.admin(), "orders", 1)
    alice = (
        'security_protocol = "SASL_SSL"\n'
        f'ssl_cafile = "{secured.ca_file}"\n'
        'sasl_mechanism = "SCRAM-SHA-512"\n'
        'sasl_plain_username = "alice"\n'
        f'sasl_plain_password = "{ALICE_SECRET}"\n'
        "max_block_ms = 3000\n"
    )
    produced = cli(secured, "produce", "orders", stdin=b"x\n", config=alice)
    assert produced.returncode == 1
    assert b"(User:alice may not describe topic 'orders')" in produced.stderr, produced.stderr
    admin.create_acls(secured.admin(), [allow("User:alice", "write", "topic", "orders")])
    consumed = cli(secured, "consume", "orders", "--from-beginning", config=alice)
    assert consumed.returncode == 1
    assert consumed.stderr.decode().splitlines() == [
        "minibroker: fetch orders-0: TOPIC_AUTHORIZATION_FAILED "
        "(User:alice may not read topic 'orders')"
    ]
    admin.create_acls(secured.admin(), [allow("User:alice", "read", "topic", "orders")])
    group_denied = subprocess.run(
        [sys.executable, "-c", _GROUP_DENIED, secured.broker.address("sasl"), ALICE_SECRET],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert group_denied.stdout.splitlines() == [
        "consumer group 'billing' heartbeat: GROUP_AUTHORIZATION_FAILED "
        "(User:alice may not read group 'billing')"
    ]
    assert group_denied.stderr == ""


# An application with no logging configured: a denied group is raised, and only raised.
_GROUP_DENIED = """
import sys
from client import Consumer
bootstrap, password = sys.argv[1:]
with Consumer(
    "orders", bootstrap_servers=bootstrap, group_id="billing", consumer_timeout_ms=10000,
    security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
    sasl_plain_username="alice", sasl_plain_password=password,
) as consumer:
    try:
        list(consumer)
    except Exception as exc:
        print(exc)
"""
