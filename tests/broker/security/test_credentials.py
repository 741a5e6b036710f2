"""SCRAM credentials (docs/protocol.md section 7): the per-user rules of
AlterUserScramCredentials and DescribeUserScramCredentials (broker/security/credentials.py),
the durable store across reopen and a torn tail (broker/security/credential_store.py), and
the bootstrap users of MINIBROKER_BOOTSTRAP_USERS."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest
from scramp import ScramClient

from broker.security import (
    BOOTSTRAP_ENV,
    AuthenticationFailed,
    BootstrapError,
    CredentialStore,
    ScramExchange,
    authenticate_plain,
)
from broker.security import credentials as c
from broker.security.credential_store import CredentialLogError
from broker.security.scram import SCRAM_SHA_256, SCRAM_SHA_512
from broker.storage import RecordLog
from protocol import messages as m
from protocol.errors import ErrorCode

SALT = b"0123456789abcdef"


def upsert(
    user: str,
    password: str = "pw",
    mechanism: str = SCRAM_SHA_256,
    iterations: int = 4096,
    salt: bytes = SALT,
) -> m.ScramCredentialUpsertion:
    """KIP-554's upsertion, computed as a client does: Hi(password, salt, iterations)."""
    name = "sha512" if mechanism == SCRAM_SHA_512 else "sha256"
    salted = hashlib.pbkdf2_hmac(name, password.encode(), salt, iterations)
    return m.ScramCredentialUpsertion(user, mechanism, iterations, salt, salted)


def delete(user: str, mechanism: str = SCRAM_SHA_256) -> m.ScramCredentialDeletion:
    return m.ScramCredentialDeletion(user, mechanism)


def applied(
    state: c.CredentialState,
    deletions: list[m.ScramCredentialDeletion] = [],  # noqa: B006  (never mutated)
    upsertions: list[m.ScramCredentialUpsertion] = [],  # noqa: B006
) -> dict[str, tuple[int, str | None]]:
    """Alter `state` as the store would once the record is durable; {user: (error, message)}."""
    results, record = c.alter(state, deletions, upsertions)
    if record is not None:
        state.apply(record)
    return {r.user: (r.error, r.message) for r in results}


def errors(results: dict[str, tuple[int, str | None]]) -> dict[str, int]:
    return {user: error for user, (error, _) in results.items()}


def with_users(*names: str) -> c.CredentialState:
    state = c.CredentialState()
    applied(state, upsertions=[upsert(n) for n in names])
    return state


# --------------------------------------------------------------------------- the rules


def test_iterations_must_be_4096_to_16384() -> None:
    state = c.CredentialState()
    results = applied(
        state,
        upsertions=[
            upsert("low", iterations=4095),
            upsert("min", iterations=4096),
            upsert("max", iterations=16384),
            upsert("high", iterations=16385),
        ],
    )
    assert errors(results) == {
        "low": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "min": 0,
        "max": 0,
        "high": ErrorCode.UNACCEPTABLE_CREDENTIAL,
    }
    assert sorted(state.users) == ["max", "min"]
    assert state.lookup("max", SCRAM_SHA_256) is not None
    stored = state.lookup("max", SCRAM_SHA_256)
    assert stored is not None and stored.iterations == 16384


def test_a_user_and_mechanism_named_twice_is_duplicate_and_left_unchanged() -> None:
    state = with_users("alice", "bob", "erin")
    before = state.lookup("alice", SCRAM_SHA_256)
    erin_before = state.lookup("erin", SCRAM_SHA_256)
    results = applied(
        state,
        deletions=[delete("alice"), delete("carol")],
        upsertions=[
            upsert("alice", "new"),  # deleted and upserted: the same user and mechanism
            upsert("dave", mechanism=SCRAM_SHA_256),  # both mechanisms of one user: fine
            upsert("dave", mechanism=SCRAM_SHA_512),
            upsert("bob", "new-bob"),
            upsert("erin", "new-erin", mechanism=SCRAM_SHA_256),
            upsert("erin", "again", mechanism=SCRAM_SHA_256),
        ],
    )
    assert list(results) == ["alice", "carol", "dave", "bob", "erin"]  # in the order named
    assert errors(results) == {
        "alice": ErrorCode.DUPLICATE_RESOURCE,
        "carol": ErrorCode.RESOURCE_NOT_FOUND,
        "dave": 0,
        "bob": 0,
        "erin": ErrorCode.DUPLICATE_RESOURCE,
    }
    assert state.lookup("alice", SCRAM_SHA_256) == before
    assert state.lookup("erin", SCRAM_SHA_256) == erin_before
    assert state.lookup("dave", SCRAM_SHA_256) is not None
    assert state.lookup("dave", SCRAM_SHA_512) is not None
    assert state.lookup("bob", SCRAM_SHA_256) != with_users("bob").lookup("bob", SCRAM_SHA_256)


def test_one_refused_alteration_leaves_the_users_others_undone() -> None:
    state = with_users("alice")
    before = state.lookup("alice", SCRAM_SHA_256)
    results = applied(
        state,
        deletions=[delete("alice", SCRAM_SHA_512)],  # alice has no SHA-512 credential
        upsertions=[upsert("alice", "new", mechanism=SCRAM_SHA_256)],
    )
    assert errors(results) == {"alice": ErrorCode.RESOURCE_NOT_FOUND}
    assert state.lookup("alice", SCRAM_SHA_256) == before


def test_deleting_what_does_not_exist_is_not_found() -> None:
    state = with_users("alice")
    results = applied(state, deletions=[delete("alice", SCRAM_SHA_512), delete("nobody")])
    assert errors(results) == {
        "alice": ErrorCode.RESOURCE_NOT_FOUND,
        "nobody": ErrorCode.RESOURCE_NOT_FOUND,
    }
    assert errors(applied(state, deletions=[delete("alice")])) == {"alice": 0}
    assert state.users == {}  # a user with no credential left is gone


@pytest.mark.parametrize(
    ("upsertion", "code"),
    [
        (upsert(""), ErrorCode.UNACCEPTABLE_CREDENTIAL),
        (upsert("Ⅸ"), ErrorCode.UNACCEPTABLE_CREDENTIAL),  # SASLprep makes it "IX"
        (upsert("x", mechanism="SCRAM-SHA-1"), ErrorCode.UNSUPPORTED_SASL_MECHANISM),
        (upsert("x", salt=b"short"), ErrorCode.UNACCEPTABLE_CREDENTIAL),
        (upsert("x", salt=b"s" * 257), ErrorCode.UNACCEPTABLE_CREDENTIAL),
        (
            m.ScramCredentialUpsertion("x", SCRAM_SHA_512, 4096, SALT, b"32 bytes, not 64" * 2),
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
        ),
    ],
)
def test_unusable_upsertions_are_refused_per_user(
    upsertion: m.ScramCredentialUpsertion, code: ErrorCode
) -> None:
    state = c.CredentialState()
    results = applied(state, upsertions=[upsertion, upsert("fine")])
    assert errors(results) == {upsertion.user: code, "fine": 0}
    assert results[upsertion.user][1]  # a message says what was wrong
    assert list(state.users) == ["fine"]


def test_deletion_rules_name_the_mechanism_and_the_user() -> None:
    state = with_users("alice")
    results = applied(state, deletions=[delete(""), delete("alice", "MD5")])
    assert errors(results) == {
        "": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "alice": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
    }


def test_the_store_holds_at_most_users_max(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c, "USERS_MAX", 2)
    state = with_users("a")
    results = applied(state, upsertions=[upsert("a", "again"), upsert("b"), upsert("c")])
    assert errors(results) == {"a": 0, "b": 0, "c": ErrorCode.POLICY_VIOLATION}


def test_the_record_holds_keys_never_the_salted_password() -> None:
    upsertion = upsert("alice", "secret-pw")
    _, record = c.alter(c.CredentialState(), [], [upsertion])
    assert record is not None
    [(user, mechanism, salt, iterations, stored_key, server_key)] = record[1]
    assert (user, mechanism, salt, iterations) == ("alice", SCRAM_SHA_256, SALT, 4096)
    assert upsertion.salted_password not in (stored_key, server_key)
    _, nothing = c.alter(c.CredentialState(), [delete("nobody")], [])
    assert nothing is None  # nothing to write when nothing changes


def test_describe() -> None:
    state = with_users("bob", "alice")
    applied(state, upsertions=[upsert("carol", mechanism=SCRAM_SHA_512, iterations=8192)])
    applied(state, upsertions=[upsert("carol", mechanism=SCRAM_SHA_256, iterations=5000)])
    everyone = c.describe(state, None)
    assert [r.user for r in everyone] == ["alice", "bob", "carol"]
    assert everyone[2].credentials == [
        m.ScramCredentialInfo(SCRAM_SHA_256, 5000),
        m.ScramCredentialInfo(SCRAM_SHA_512, 8192),
    ]
    named = c.describe(state, ["carol", "zed", "bob", "bob"])
    assert [(r.user, r.error) for r in named] == [
        ("carol", 0),
        ("zed", ErrorCode.RESOURCE_NOT_FOUND),
        ("bob", ErrorCode.DUPLICATE_RESOURCE),
    ]
    assert c.describe(state, []) == []


def test_malformed_records_are_refused_without_echoing_keys() -> None:
    state = with_users("alice")
    good = dict(state.users)
    for bad in (
        ["alter", [["alice", "SCRAM-SHA-1", SALT, 4096, b"k" * 32, b"k" * 32]], []],
        ["alter", [["alice", SCRAM_SHA_256, SALT, 4096, b"k" * 31, b"k" * 32]], []],
        ["alter", [["alice", SCRAM_SHA_256, SALT, 100, b"k" * 32, b"k" * 32]], []],
        ["alter", [[7, SCRAM_SHA_256, SALT, 4096, b"k" * 32, b"k" * 32]], []],
        ["secret", b"short"],
        ["nonsense"],
    ):
        with pytest.raises(c.CredentialStateError) as caught:
            state.apply(bad)
        assert "kkkk" not in str(caught.value)
    assert state.users == good  # nothing changed


# --------------------------------------------------------------------------- the store


def authenticates(store: CredentialStore, user: str, password: str, mech: str) -> bool:
    """A whole SCRAM exchange against the store, driven by scramp's client."""
    client = ScramClient([mech], user, password)
    exchange = ScramExchange(mech, store.lookup, store.mock_secret)
    try:
        first = exchange.server_first(client.get_client_first().encode())
        client.set_server_first(first.decode())
        exchange.server_final(client.get_client_final().encode())
    except AuthenticationFailed:
        return False
    return exchange.user == user


def records_in(path: Path) -> list[Any]:
    bodies: list[Any] = []
    log = RecordLog(path.parent, path.name, 1 << 20)
    log.open(bodies.append)
    log.close()
    return bodies


def test_the_store_round_trips_across_reopen(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path)
    store.open()
    assert store.log.path == tmp_path / "security" / "credentials.wal"
    secret = store.mock_secret

    async def main() -> None:
        answer = await store.alter(
            m.AlterUserScramCredentialsRequest(
                deletions=[],
                upsertions=[upsert("alice", "pw-a"), upsert("bob", "pw-b", SCRAM_SHA_512)],
            )
        )
        assert [(r.user, r.error) for r in answer.results] == [("alice", 0), ("bob", 0)]
        gone = await store.alter(
            m.AlterUserScramCredentialsRequest(
                deletions=[delete("bob", SCRAM_SHA_512)], upsertions=[]
            )
        )
        assert gone.results[0].error == 0

    anyio.run(main)
    store.close()
    again = CredentialStore(tmp_path)
    again.open()
    assert again.mock_secret == secret  # an unknown user looks the same after a restart
    assert again.state.users == store.state.users and list(again.state.users) == ["alice"]
    assert authenticates(again, "alice", "pw-a", SCRAM_SHA_256)
    assert not authenticates(again, "alice", "wrong", SCRAM_SHA_256)
    assert not authenticates(again, "bob", "pw-b", SCRAM_SHA_512)
    described = again.describe(m.DescribeUserScramCredentialsRequest(users=None))
    assert [(r.user, r.credentials) for r in described.results] == [
        ("alice", [m.ScramCredentialInfo(SCRAM_SHA_256, 4096)])
    ]
    again.close()


def test_a_torn_last_record_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path)
    store.open()

    async def main() -> None:
        for user in ("alice", "bob"):
            await store.alter(
                m.AlterUserScramCredentialsRequest(deletions=[], upsertions=[upsert(user)])
            )

    anyio.run(main)
    store.close()
    path = store.log.path
    whole = path.read_bytes()
    assert [body[0] for body in records_in(path)] == ["secret", "alter", "alter"]
    for cut in (1, 10, 40):  # a crash during the last write
        path.write_bytes(whole[:-cut])
        torn = CredentialStore(tmp_path)
        torn.open()
        assert list(torn.state.users) == ["alice"]
        assert torn.mock_secret == store.mock_secret
        torn.close()
        assert len(path.read_bytes()) < len(whole) - cut  # the torn tail is gone from the file
    data = bytearray(whole)
    data[12] ^= 0xFF  # inside the first record: damage at rest, not a torn write
    path.write_bytes(bytes(data))
    with pytest.raises(CredentialLogError, match=r"credentials\.wal: record at byte 0"):
        CredentialStore(tmp_path).open()


def test_a_failed_sync_changes_nothing_and_stops_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CredentialStore(tmp_path)
    store.open()

    async def failing(end: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.log, "durable", failing)
    request = m.AlterUserScramCredentialsRequest(deletions=[], upsertions=[upsert("alice")])

    async def main() -> None:
        with pytest.raises(OSError):
            await store.alter(request)
        assert store.state.users == {}
        monkeypatch.undo()
        with pytest.raises(OSError, match="earlier write"):
            await store.alter(request)

    anyio.run(main)
    store.close()


def test_the_log_is_compacted_to_the_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.security import credential_store

    monkeypatch.setattr(credential_store, "LOG_MAX_BYTES", 2048)
    store = CredentialStore(tmp_path)
    store.open()

    async def main() -> None:
        for i in range(40):
            await store.alter(
                m.AlterUserScramCredentialsRequest(
                    deletions=[], upsertions=[upsert(f"u{i % 4}", f"pw{i}")]
                )
            )

    anyio.run(main)
    store.close()
    path = store.log.path
    assert len(records_in(path)) < 20  # rewritten as the state: 41 records otherwise
    again = CredentialStore(tmp_path)
    again.open()
    assert again.state.users == store.state.users and again.mock_secret == store.mock_secret
    assert authenticates(again, "u3", "pw39", SCRAM_SHA_256)
    again.close()


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_creates_both_mechanisms_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CredentialStore(tmp_path)
    store.open()
    assert store.bootstrap({}) == []  # unset: nothing
    environ = {BOOTSTRAP_ENV: "admin:s3cret:with-colon, alice:pw-alice"}
    with caplog.at_level(logging.DEBUG, logger="minibroker"):
        assert store.bootstrap(environ) == ["admin", "alice"]
    assert "s3cret" not in caplog.text and "pw-alice" not in caplog.text
    for mech in (SCRAM_SHA_256, SCRAM_SHA_512):
        credential = store.lookup("admin", mech)
        assert credential is not None and credential.iterations == 8192
        assert authenticates(store, "admin", "s3cret:with-colon", mech)
    assert authenticate_plain(b"\0admin\0s3cret:with-colon", store.lookup, store.mock_secret)
    store.close()
    again = CredentialStore(tmp_path)
    again.open()
    assert again.bootstrap({BOOTSTRAP_ENV: "other:pw"}) == []  # the store has users
    assert "other" not in again.state.users
    again.close()


def test_bootstrap_parsing() -> None:
    parsed = c.parse_bootstrap_users("  a:1,b:x:y,c:z  ")
    assert [(u.user, u.password) for u in parsed] == [("a", "1"), ("b", "x:y"), ("c", "z")]
    assert c.parse_bootstrap_users("") == [] and c.parse_bootstrap_users("   ") == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("alice:pw1,hunter2", "entry 2 of MINIBROKER_BOOTSTRAP_USERS is not name:password"),
        ("alice:pw1,", "entry 2"),
        (":hunter2", "entry 1"),
        ("alice:pw1,alice:hunter2", "user 'alice'"),
        ("alice:", "user 'alice'"),
        ("alice:hunter2\u0007", "SASLprep"),
        ("alice:hunter2\udcff", "SASLprep"),  # a byte the environment could not decode
        ("alice:hunter2" + "x" * 300, "1..255 bytes"),
        ("Ⅸ:hunter2", "SASLprep form"),
        ("a" * 256 + ":hunter2", "1..255 characters"),
    ],
)
def test_bad_bootstrap_entries_say_which_without_the_password(value: str, says: str) -> None:
    with pytest.raises(BootstrapError) as caught:
        c.parse_bootstrap_users(value)
    assert says in str(caught.value)
    assert "hunter2" not in str(caught.value) and "pw1" not in str(caught.value)


def test_bootstrap_refuses_more_than_users_max(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c, "USERS_MAX", 2)
    with pytest.raises(BootstrapError, match="at most 2"):
        c.parse_bootstrap_users("a:1,b:2,c:3")


def test_the_credentials_directory_is_the_brokers_alone(tmp_path: Path) -> None:
    """StoredKey and ServerKey allow a dictionary attack and posing as the broker."""
    store = CredentialStore(tmp_path)
    store.open()
    store.close()
    assert stat.S_IMODE(os.stat(store.log.directory).st_mode) == 0o700


def test_a_failed_compaction_keeps_the_change_and_stops_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CredentialStore(tmp_path)
    store.open()

    def failing(bodies: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store.log, "wants_compaction", lambda: True)
    monkeypatch.setattr(store.log, "compact", failing)

    async def main() -> None:
        request = m.AlterUserScramCredentialsRequest(deletions=[], upsertions=[upsert("alice")])
        answer = await store.alter(request)  # durable before the compaction was tried
        assert answer.results[0].error == 0 and "alice" in store.state.users
        with pytest.raises(OSError, match="earlier write"):
            await store.alter(request)

    anyio.run(main)
    store.close()
    again = CredentialStore(tmp_path)
    again.open()
    assert list(again.state.users) == ["alice"]
    again.close()
