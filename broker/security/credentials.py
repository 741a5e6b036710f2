"""SCRAM credentials, and the records that change them, pure (docs/protocol.md section 7:
DescribeUserScramCredentials, AlterUserScramCredentials, bootstrap users).

State: per user, per mechanism, RFC 5802's credential (salt, iterations, StoredKey,
ServerKey; broker/security/scram.py), and the broker's mock secret, from which the
credentials of unknown users are made up. Every change is one record, a msgpack
list whose first item names its kind; broker/security/credential_store.py appends
them to `security/credentials.wal` and replaying the file in order rebuilds the
state:

| kind     | fields after the kind                                                 |
|----------|-----------------------------------------------------------------------|
| "secret" | mock_secret (bin), written once, when the file is created             |
| "alter"  | [[user, mechanism, salt, iterations, stored_key, server_key], ...]    |
|          | (set), [[user, mechanism], ...] (deleted): one AlterUserScram-        |
|          | Credentials request, the bootstrap users, or compaction's whole state |

One request is one record, so a crash leaves all of it or none. `alter` and
`describe` judge a request against the state and return the per-user results
(and, for alter, the record to write); nothing changes until the store applies
the record it made durable. No IO: bootstrap's salts come from `secrets`, and
its Hi is CPU work that the store does once, before serving.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from broker.security.scram import (
    DEFAULT_ITERATIONS,
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    PLAIN_FIELD_BYTES_MAX,
    SALT_BYTES_MAX,
    SALT_BYTES_MIN,
    SCRAM_MECHANISMS,
    ScramCredential,
    UserPassword,
    credential_from_password,
    credential_from_salted_password,
    digest_bytes,
    sasl_prepared,
)
from protocol import messages as m
from protocol.errors import ErrorCode

SECRET = "secret"
ALTER = "alter"
SECRET_BYTES = 32
USERS_MAX = 10_000
"""Users the store holds at most: each costs memory and a line in every Describe of all."""


class CredentialStateError(ValueError):
    """A persisted record that does not decode to a consistent change."""


class BootstrapError(ValueError):
    """MINIBROKER_BOOTSTRAP_USERS cannot be used; the message names the entry, never a
    password."""


class CredentialState:
    """Every user's SCRAM credentials, and the mock secret."""

    def __init__(self) -> None:
        self.users: dict[str, dict[str, ScramCredential]] = {}
        self.mock_secret: bytes | None = None

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        """A scram.CredentialLookup: one dict read, safe from a worker thread."""
        return self.users.get(user, {}).get(mechanism)

    def apply(self, record: Any) -> None:
        """Apply one record (new, or read back from the log); CredentialStateError when it
        is malformed, before anything changed."""
        try:
            kind = record[0]
            if kind == SECRET:
                _, secret = record
                if not isinstance(secret, bytes) or len(secret) < SECRET_BYTES:
                    raise ValueError("a secret is at least 32 bytes")
                self.mock_secret = secret
            elif kind == ALTER:
                _, upserted, deleted = record
                sets = [_decode_credential(item) for item in upserted]
                drops = [(_str(user), _mechanism(mech)) for user, mech in deleted]
                for user, mechanism, credential in sets:
                    self.users.setdefault(user, {})[mechanism] = credential
                for user, mechanism in drops:
                    held = self.users.get(user, {})
                    held.pop(mechanism, None)
                    if not held:
                        self.users.pop(user, None)
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (TypeError, ValueError, IndexError) as exc:
            # The record is not echoed: it holds keys.
            raise CredentialStateError(f"credentials record: {exc}") from exc

    def snapshot(self) -> list[list[Any]]:
        """The records of the whole state, for compaction."""
        assert self.mock_secret is not None
        credentials = [
            (user, mechanism, credential)
            for user, held in self.users.items()
            for mechanism, credential in held.items()
        ]
        return [secret_record(self.mock_secret), alter_record(credentials, [])]


def secret_record(secret: bytes) -> list[Any]:
    return [SECRET, secret]


def alter_record(
    upserted: list[tuple[str, str, ScramCredential]], deleted: list[tuple[str, str]]
) -> list[Any]:
    return [
        ALTER,
        [
            [user, mech, c.salt, c.iterations, c.stored_key, c.server_key]
            for user, mech, c in upserted
        ],
        [[user, mech] for user, mech in deleted],
    ]


def _decode_credential(item: Any) -> tuple[str, str, ScramCredential]:
    user, mechanism, salt, iterations, stored_key, server_key = item
    mechanism = _mechanism(mechanism)
    size = digest_bytes(mechanism)
    if not (isinstance(salt, bytes) and SALT_BYTES_MIN <= len(salt) <= SALT_BYTES_MAX):
        raise ValueError("bad salt")
    if not all(isinstance(k, bytes) and len(k) == size for k in (stored_key, server_key)):
        raise ValueError("bad key")
    if type(iterations) is not int or not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise ValueError("bad iterations")
    return _str(user), mechanism, ScramCredential(salt, iterations, stored_key, server_key)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    return value


def _mechanism(value: Any) -> str:
    if value not in SCRAM_MECHANISMS:
        raise ValueError(f"unknown mechanism {value!r}")
    return str(value)


# ------------------------------------------------------------------ AlterUserScramCredentials


def _result(user: str, code: ErrorCode, message: str) -> m.AlterUserScramCredentialsResult:
    return m.AlterUserScramCredentialsResult(user, code, message)


def _judge_deletion(
    state: CredentialState, d: m.ScramCredentialDeletion
) -> m.AlterUserScramCredentialsResult | None:
    """The refusal of one deletion, or None when it may go ahead."""
    if not d.user:
        return _result(d.user, ErrorCode.UNACCEPTABLE_CREDENTIAL, "user name is empty")
    if d.mechanism not in SCRAM_MECHANISMS:
        return _result(d.user, ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism")
    if state.lookup(d.user, d.mechanism) is None:
        return _result(d.user, ErrorCode.RESOURCE_NOT_FOUND, "no such credential to delete")
    return None


def _judge_upsertion(u: m.ScramCredentialUpsertion) -> m.AlterUserScramCredentialsResult | None:
    """The refusal of one upsertion, or None when it may go ahead."""
    refuse = ErrorCode.UNACCEPTABLE_CREDENTIAL
    if not u.user:
        return _result(u.user, refuse, "user name is empty")
    if sasl_prepared(u.user) != u.user:
        # scramp prepares the name a client sends (SASLprep) before the look-up: a name
        # not in that form could never log in.
        return _result(u.user, refuse, "user name is not in SASLprep form (RFC 4013)")
    if u.mechanism not in SCRAM_MECHANISMS:
        return _result(u.user, ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism")
    if not ITERATIONS_MIN <= u.iterations <= ITERATIONS_MAX:
        return _result(u.user, refuse, f"iterations must be {ITERATIONS_MIN}..{ITERATIONS_MAX}")
    if not SALT_BYTES_MIN <= len(u.salt) <= SALT_BYTES_MAX:
        return _result(u.user, refuse, f"salt must be {SALT_BYTES_MIN}..{SALT_BYTES_MAX} bytes")
    size = digest_bytes(u.mechanism)
    if len(u.salted_password) != size:
        return _result(u.user, refuse, f"salted_password must be {size} bytes for {u.mechanism}")
    return None


def alter(
    state: CredentialState,
    deletions: list[m.ScramCredentialDeletion],
    upsertions: list[m.ScramCredentialUpsertion],
) -> tuple[list[m.AlterUserScramCredentialsResult], list[Any] | None]:
    """Judge one AlterUserScramCredentials: a result per user named, in the order first
    named, and the record that makes the accepted changes (None when there are none).

    Each user stands alone and is all or nothing: one refused alteration leaves every
    alteration of that user undone. A user and mechanism named twice (two upsertions,
    or an upsertion and a deletion) is DUPLICATE_RESOURCE for the user, as in Kafka;
    both mechanisms of one user in one request are fine (kafka-configs sends them so).
    The record carries StoredKey and ServerKey, never the salted password."""
    per_user: dict[str, list[m.ScramCredentialDeletion | m.ScramCredentialUpsertion]] = {}
    alterations_named: list[m.ScramCredentialDeletion | m.ScramCredentialUpsertion] = [
        *deletions,
        *upsertions,
    ]
    for alteration in alterations_named:
        per_user.setdefault(alteration.user, []).append(alteration)
    results: list[m.AlterUserScramCredentialsResult] = []
    deleted: list[tuple[str, str]] = []
    upserted: list[tuple[str, str, ScramCredential]] = []
    users = len(state.users)
    for user, alterations in per_user.items():
        pairs = Counter(a.mechanism for a in alterations)
        if any(count > 1 for count in pairs.values()):
            twice = "a user's credential for one mechanism may be altered once per request"
            results.append(_result(user, ErrorCode.DUPLICATE_RESOURCE, twice))
            continue
        refusal = next(
            filter(
                None,
                (
                    _judge_deletion(state, a)
                    if isinstance(a, m.ScramCredentialDeletion)
                    else _judge_upsertion(a)
                    for a in alterations
                ),
            ),
            None,
        )
        adds = [a for a in alterations if isinstance(a, m.ScramCredentialUpsertion)]
        new_user = bool(adds) and user not in state.users
        if refusal is None and new_user and users >= USERS_MAX:
            refusal = _result(
                user, ErrorCode.POLICY_VIOLATION, f"the broker holds {USERS_MAX} users"
            )
        if refusal is not None:
            results.append(refusal)
            continue
        users += new_user
        deleted += [(a.user, a.mechanism) for a in alterations if a not in adds]
        upserted += [
            (
                u.user,
                u.mechanism,
                credential_from_salted_password(
                    u.mechanism, u.salt, u.salted_password, u.iterations
                ),
            )
            for u in adds
        ]
        results.append(m.AlterUserScramCredentialsResult(user))
    record = alter_record(upserted, deleted) if upserted or deleted else None
    return results, record


# --------------------------------------------------------------- DescribeUserScramCredentials


def describe(
    state: CredentialState, users: list[str] | None
) -> list[m.DescribeUserScramCredentialsResult]:
    """Each named user's mechanisms and iterations (nil: every user, by name), never a
    key. An unknown user is RESOURCE_NOT_FOUND; one named twice DUPLICATE_RESOURCE, as
    in Kafka."""
    names = sorted(state.users) if users is None else users
    counts = Counter(names)
    results = []
    for user in counts:  # in the order first named, each once
        held = state.users.get(user)
        if counts[user] > 1:
            results.append(m.DescribeUserScramCredentialsResult(user, ErrorCode.DUPLICATE_RESOURCE))
        elif held is None:
            results.append(m.DescribeUserScramCredentialsResult(user, ErrorCode.RESOURCE_NOT_FOUND))
        else:
            infos = [m.ScramCredentialInfo(mech, held[mech].iterations) for mech in sorted(held)]
            results.append(m.DescribeUserScramCredentialsResult(user, credentials=infos))
    return results


# --------------------------------------------------------------------------- bootstrap


def parse_bootstrap_users(value: str) -> list[UserPassword]:
    """MINIBROKER_BOOTSTRAP_USERS: `name:password` pairs separated by commas, spaces
    around a pair ignored (a password may hold ':' but not ',', and neither starts nor
    ends with a space). BootstrapError names a bad entry by its place and, once its
    name is known, its user; never its password."""
    if not value.strip():
        return []
    entries = [entry.strip() for entry in value.split(",")]
    if len(entries) > USERS_MAX:
        raise BootstrapError(f"{len(entries)} entries, at most {USERS_MAX}")
    users: list[UserPassword] = []
    seen: set[str] = set()
    for place, entry in enumerate(entries, 1):
        name, colon, password = entry.partition(":")
        where = f"entry {place} of MINIBROKER_BOOTSTRAP_USERS"
        if not colon:
            # The entry is not echoed: it may be a password whose name was forgotten.
            raise BootstrapError(f"{where} is not name:password")
        if not name or len(name) > m.IDENTIFIER_CHARS_MAX or sasl_prepared(name) != name:
            raise BootstrapError(
                f"{where}: the user name must be 1..{m.IDENTIFIER_CHARS_MAX} characters in "
                "SASLprep form (RFC 4013)"
            )
        who = f"{where} (user {name!r})"
        if name in seen:
            raise BootstrapError(f"{who} names the user a second time")
        if sasl_prepared(password) is None:  # before encoding: it may hold a lone surrogate
            raise BootstrapError(f"{who}: the password holds a character SASLprep prohibits")
        if not password or len(password.encode()) > PLAIN_FIELD_BYTES_MAX:
            raise BootstrapError(f"{who}: the password must be 1..{PLAIN_FIELD_BYTES_MAX} bytes")
        seen.add(name)
        users.append(UserPassword(name, password))
    return users


def bootstrap_record(users: list[UserPassword]) -> list[Any]:
    """The record creating `users` with SCRAM-SHA-256 and SCRAM-SHA-512 credentials at
    the contract's 8192 iterations, each with a fresh salt. CPU work: two Hi a user."""
    return alter_record(
        [
            (u.user, mechanism, credential_from_password(mechanism, u.password, DEFAULT_ITERATIONS))
            for u in users
            for mechanism in SCRAM_MECHANISMS
        ],
        [],
    )
