"""`minibroker acls` / `users` and `--client-config`, run in-process against
tests/fake_secure_broker.py (the real broker's runs are in test_security_clients.py)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal

import minibroker_cli
from protocol.messages import AlterUserScramCredentialsRequest, decode_request
from tests.fake_secure_broker import FakeSecureBroker, running

SECRET = "cli-pa55word"
ADMIN_SECRET = "admin-pa55word"


@pytest.fixture
def fake() -> Iterator[tuple[FakeSecureBroker, str]]:
    """A SASL fake with user `admin`, on its own event loop thread."""
    with start_blocking_portal() as portal:
        broker = portal.call(lambda: FakeSecureBroker(users={"admin": ADMIN_SECRET}))
        with portal.wrap_async_context_manager(running(broker)) as bootstrap:
            yield broker, bootstrap


@pytest.fixture
def client_config(tmp_path: Path) -> str:
    path = tmp_path / "client.toml"
    path.write_text(
        'security_protocol = "SASL_PLAINTEXT"\n'
        'sasl_mechanism = "SCRAM-SHA-256"\n'
        'sasl_plain_username = "admin"\n'
        f'sasl_plain_password = "{ADMIN_SECRET}"\n'
    )
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str = "") -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", io.StringIO(stdin))
        code = minibroker_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def alterations(broker: FakeSecureBroker) -> list[AlterUserScramCredentialsRequest]:
    found = [decode_request(b) for b in broker.bodies if b"AlterUserScramCredentials" in b]
    return [r for r in found if isinstance(r, AlterUserScramCredentialsRequest)]


def test_users_add_with_the_password_on_stdin_over_sasl(
    fake: tuple[FakeSecureBroker, str], client_config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    broker, bootstrap = fake
    code, out, err = run(
        capsys,
        "users",
        "add",
        "alice",
        "--password-stdin",
        "--iterations",
        "4096",
        "--bootstrap-server",
        bootstrap,
        "--client-config",
        client_config,
        stdin=SECRET + "\n",
    )
    assert code == 0, err
    assert out == "Set the SCRAM-SHA-256, SCRAM-SHA-512 credentials of alice (4096 iterations).\n"
    (request,) = alterations(broker)
    assert [(u.user, u.mechanism, u.iterations) for u in request.upsertions] == [
        ("alice", "SCRAM-SHA-256", 4096),
        ("alice", "SCRAM-SHA-512", 4096),
    ]
    assert not any(SECRET.encode() in body for body in broker.bodies)
    assert broker.seen[0][:3] == ["ApiVersions", "SaslAuthenticate", "SaslAuthenticate"]


def test_users_add_asks_twice_on_the_terminal(
    fake: tuple[FakeSecureBroker, str],
    client_config: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker, bootstrap = fake
    answers = iter([SECRET, SECRET, SECRET, "typo"])
    prompts: list[str] = []

    def getpass(prompt: str) -> str:
        prompts.append(prompt)
        return next(answers)

    monkeypatch.setattr("getpass.getpass", getpass)
    args = ("users", "add", "alice", "--mechanism", "SCRAM-SHA-512")
    where = ("--bootstrap-server", bootstrap, "--client-config", client_config)
    code, _, err = run(capsys, *args, *where)
    assert code == 0, err
    assert prompts == ["Password for alice: ", "Again: "]
    code, _, err = run(capsys, *args, *where)
    assert code == 2 and err == "minibroker: the two passwords differ\n"
    assert len(alterations(broker)) == 1


def test_client_config_names_only_client_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('security_protocol = "SSL"\nsasl_password = "x"\n')
    code, _, err = run(capsys, "topics", "list", "--client-config", str(path))
    assert code == 2
    assert (
        "sasl_password is not a setting of the SDK's producer, consumer or admin helpers; "
        "did you mean 'ssl_password'?" in err
    )
    path.write_text('security_protocol = "SASL_SSL"\nsasl_mechanism = "PLAIN"\n')
    code, _, err = run(capsys, "users", "list", "--client-config", str(path))
    assert code == 2 and "needs sasl_plain_username and sasl_plain_password" in err
    path.write_text("security_protocol = \n")
    code, _, err = run(capsys, "acls", "list", "--client-config", str(path))
    assert code == 2 and "not TOML" in err


def test_wrong_credentials_are_one_line_and_exit_1(
    fake: tuple[FakeSecureBroker, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, bootstrap = fake
    path = tmp_path / "wrong.toml"
    path.write_text(
        'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
        'sasl_plain_username = "admin"\nsasl_plain_password = "not-it"\n'
    )
    code, out, err = run(
        capsys, "topics", "list", "--bootstrap-server", bootstrap, "--client-config", str(path)
    )
    assert code == 1 and out == ""
    assert err.startswith(f"minibroker: authentication of 'admin' with PLAIN at {bootstrap} failed")
    assert err.count("\n") == 1 and "not-it" not in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("acls", "add", "--topic", "t", "--operation", "read"), "acls add needs a resource"),
        (
            ("acls", "remove", "--topic", "t"),
            "that removes every ACL of the resource; say --force",
        ),
        (("acls", "remove", "--allow-principal", "User:a"), "acls remove needs a resource"),
        (
            ("acls", "add", "--topic", "t", "--allow-principal", "alice", "--operation", "read"),
            "a principal is User:<name> or User:*",
        ),
    ],
)
def test_acl_usage_errors(
    argv: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, *argv, "--bootstrap-server", "127.0.0.1:1")
    assert code == 2 and says in err, err


def test_operations_as_kafka_acls_spells_them(capsys: pytest.CaptureFixture[str]) -> None:
    from client.cli import _operation

    assert [_operation(o).value for o in ("Read", "IdempotentWrite", "describe_configs")] == [
        "read",
        "idempotent_write",
        "describe_configs",
    ]
    with pytest.raises(SystemExit):
        run(capsys, "acls", "add", "--operation", "Reed")
    assert "unknown operation 'Reed'" in capsys.readouterr().err
