"""SASL authentication, server side: SCRAM-SHA-256/512 and PLAIN, pure
(docs/protocol.md section 7; RFC 5802, RFC 7677, RFC 4616).

The SCRAM messages are parsed and checked by `scramp`, a maintained library, not here:
this module gives it the stored credential of the user a client names and turns
every way an attempt can fail into one `AuthenticationFailed` whose message is
the same, so a client learns nothing from it but "no".

A credential is RFC 5802's (salt, iterations, StoredKey, ServerKey); the broker
keeps no password and no salted password. A user the broker does not know gets a
mock credential derived from the name and a broker secret (as PostgreSQL does):
the exchange runs as for a real user, with a salt that is the same at every try,
and fails at the proof, so a client cannot tell an unknown user from a wrong
password. PLAIN checks its password against the same credential; that
costs one Hi (PBKDF2, thousands of HMACs), which is why `authenticate_plain` is a
plain function that the caller runs in a worker thread.

No IO, no clock, no logging: the caller decides what to write down, and never a
secret (the credential's keys stay out of its repr).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from scramp import ScramException, ScramMechanism
from scramp.core import ClientFinal
from scramp.utils import saslprep

SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
PLAIN = "PLAIN"
_HASHES: dict[str, Callable[..., Any]] = {
    SCRAM_SHA_256: hashlib.sha256,
    SCRAM_SHA_512: hashlib.sha512,
}
SCRAM_MECHANISMS = tuple(_HASHES)
PLAIN_CHECKS = (SCRAM_SHA_512, SCRAM_SHA_256)
"""The credentials a PLAIN password is checked against, the first a user has."""
PLAIN_CHECKED_FIRST = PLAIN_CHECKS[0]

# The contract's bounds on iterations (Kafka's too: RFC 7677's minimum, and a ceiling so
# that one PLAIN attempt or one bootstrap costs bounded CPU).
ITERATIONS_MIN = 4096
ITERATIONS_MAX = 16384
DEFAULT_ITERATIONS = 8192
"""What bootstrap users get, and what a mock credential claims."""
SALT_BYTES_MIN = 12  # scramp refuses a shorter salt at authentication
SALT_BYTES_MAX = 256
SALT_BYTES = 32  # what the broker draws for a salt of its own
SCRAM_MESSAGE_BYTES_MAX = 4096
"""A client-first or client-final message is a few hundred bytes; longer is refused
before it is parsed."""
PLAIN_FIELD_BYTES_MAX = 255  # RFC 4616: authzid, authcid and passwd are 1..255 octets
FAILURE_MESSAGE = "Authentication failed: invalid credentials or malformed message"
"""The one message of every failure (docs/protocol.md section 7)."""


class AuthenticationFailed(Exception):
    """An attempt failed. Its message is always FAILURE_MESSAGE, for the client;
    `reason` says why, for the broker's own log, and never holds a secret."""

    def __init__(self, reason: str) -> None:
        super().__init__(FAILURE_MESSAGE)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """RFC 5802's server-side credential for one user and mechanism."""

    salt: bytes
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)


CredentialLookup = Callable[[str, str], ScramCredential | None]
"""(user, mechanism) -> the stored credential, or None for a user the broker does not
know. `authenticate_plain` calls it from its worker thread: a read of a dict of
immutable credentials is safe there."""


def digest_bytes(mechanism: str) -> int:
    """The digest size of a SCRAM mechanism: the length of its salted password and keys."""
    return int(_HASHES[mechanism]().digest_size)


def credential_from_salted_password(
    mechanism: str, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """KIP-554's upsertion: the client computed SaltedPassword = Hi(password, salt, i);
    the broker keeps StoredKey and ServerKey (RFC 5802 section 3) and drops the rest."""
    digest = _HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    server_key = hmac.new(salted_password, b"Server Key", digest).digest()
    return ScramCredential(salt, iterations, digest(client_key).digest(), server_key)


def credential_from_password(
    mechanism: str, password: str, iterations: int, salt: bytes | None = None
) -> ScramCredential:
    """The credential for a password (SASLprep'd, then Hi), with a fresh salt unless one
    is given. CPU work: one Hi. Raises ValueError for a password SASLprep prohibits."""
    try:
        salt, stored_key, server_key, iterations = ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=iterations, salt=salt
        )
    except ScramException as exc:
        raise ValueError(f"no credential can be made: {exc}") from None
    return ScramCredential(salt, iterations, stored_key, server_key)


def mock_credential(mechanism: str, user: str, secret: bytes) -> ScramCredential:
    """A credential for a user who has none: the same for every attempt (a changing salt
    would give the unknown user away), and unusable without `secret`."""
    digest = _HASHES[mechanism]

    def derive(label: str) -> bytes:
        return hmac.new(secret, f"{label}\0{mechanism}\0{user}".encode(), digest).digest()

    return ScramCredential(
        derive("salt")[:SALT_BYTES], DEFAULT_ITERATIONS, derive("stored"), derive("server")
    )


def sasl_prepared(text: str) -> str | None:
    """A user name or password as SCRAM compares it (SASLprep, RFC 4013), or None when
    SASLprep prohibits it. scramp prepares the name a client sends before the look-up,
    so a stored name must already be in this form to be found."""
    try:
        prepared: str = saslprep(text)
    except ScramException:
        return None
    return prepared


_FIRST, _FINAL, _DONE, _FAILED = "first", "final", "done", "failed"


class ScramExchange:
    """One SCRAM authentication attempt: client-first in, server-first out; client-final
    in, server-final out. Any failure, or a message out of turn (a replayed
    client-final included), raises AuthenticationFailed and ends the attempt: every
    later call fails too.

    No channel binding: a gs2 header of `n` or `y` is accepted and `p=...` refused.
    `server_nonce` is for tests that replay a published exchange; otherwise a fresh
    one is drawn from `secrets` for every attempt.

    One client bug is tolerated, as Kafka 3.8.1 to 3.9 tolerate it: librdkafka before
    2.6.1 (Debian's kcat, and every client built on it) sends as the client-final's
    nonce its own nonce followed by the whole nonce of the server-first, which already
    begins with it (confluentinc/librdkafka#4895). That exact form is taken, and nothing
    else: it still ends with this attempt's fresh server nonce, which the proof covers,
    so a replay fails as before. Kafka 4.0 refuses it."""

    def __init__(
        self,
        mechanism: str,
        lookup: CredentialLookup,
        mock_secret: bytes,
        *,
        server_nonce: str | None = None,
    ) -> None:
        if mechanism not in _HASHES:
            raise ValueError(f"not a SCRAM mechanism: {mechanism!r}")
        self.mechanism = mechanism
        self.user: str | None = None
        """The authenticated user, once server_final has answered."""
        self._lookup = lookup
        self._mock_secret = mock_secret
        self._named: str | None = None
        self._known = False
        self._step = _FIRST
        self._server_nonce = secrets.token_hex() if server_nonce is None else server_nonce
        self._server = ScramMechanism(mechanism).make_server(
            self._credential_of, s_nonce=self._server_nonce
        )

    def __repr__(self) -> str:
        return f"ScramExchange({self.mechanism}, step={self._step}, user={self.user!r})"

    def server_first(self, client_first: bytes) -> bytes:
        """Round 1: the client-first message in, the server-first message out."""
        with self._step_of(_FIRST, then=_FINAL):
            self._server.set_client_first(_text(client_first))
            answer: str = self._server.get_server_first()
        return answer.encode()

    def server_final(self, client_final: bytes) -> bytes:
        """Round 2: the client-final message in, the server-final (`v=...`) out."""
        with self._step_of(_FINAL, then=_DONE):
            text = _text(client_final)
            self._take_librdkafka_nonce(text)
            self._server.set_client_final(text)
            if not self._known:
                # No one can make a proof for a mock credential; said outright all the same.
                raise AuthenticationFailed("unknown user")
            answer: str = self._server.get_server_final()
        self.user = self._named
        return answer.encode()

    def _take_librdkafka_nonce(self, client_final: str) -> None:
        """Let scramp check the client-final against the nonce librdkafka before 2.6.1
        sends, when it is exactly that (the class docstring says why it is safe)."""
        combined = str(self._server.nonce)
        client_nonce = combined[: -len(self._server_nonce)]
        sent = ClientFinal(client_final)["r"]
        if str(sent) == client_nonce + combined:
            self._server.nonce = sent

    def _credential_of(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's auth_fn: the (already SASLprep'd) user's credential, or a mock one."""
        found = self._lookup(user, self.mechanism)
        self._named, self._known = user, found is not None
        if found is None:
            found = mock_credential(self.mechanism, user, self._mock_secret)
        return found.salt, found.stored_key, found.server_key, found.iterations

    @contextmanager
    def _step_of(self, step: str, then: str) -> Iterator[None]:
        """Run `step` if it is the one due; whatever fails in it fails the attempt."""
        if self._step != step:
            self._step = _FAILED
            raise AuthenticationFailed(f"message out of turn (expected {step})")
        self._step = _FAILED  # until the step succeeds
        try:
            yield
        except AuthenticationFailed:
            raise
        # scramp raises ScramException for what it refuses; the others guard against a
        # hostile message reaching a corner it does not check.
        except (ScramException, ValueError, TypeError) as exc:
            raise AuthenticationFailed(f"{self.mechanism}: {exc}") from None
        self._step = then


def _text(message: bytes) -> str:
    if len(message) > SCRAM_MESSAGE_BYTES_MAX:
        raise AuthenticationFailed(f"message of {len(message)} bytes")
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("message is not UTF-8") from None


@dataclass(frozen=True, slots=True)
class UserPassword:
    """A user and a password: PLAIN's message parsed, or a bootstrap user. The password
    stays out of the repr."""

    user: str
    password: str = field(repr=False)


def parse_plain(message: bytes) -> UserPassword:
    """`authzid NUL authcid NUL passwd`; a non-empty authzid must equal authcid (acting
    for another user is not offered). The user name comes out SASLprep'd, as SCRAM's."""
    parts = message.split(b"\0")
    if len(parts) != 3:
        raise AuthenticationFailed("PLAIN: not three NUL-separated fields")
    if any(len(part) > PLAIN_FIELD_BYTES_MAX for part in parts):
        raise AuthenticationFailed("PLAIN: a field is over 255 bytes")
    try:
        authzid, authcid, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        raise AuthenticationFailed("PLAIN: not UTF-8") from None
    user = sasl_prepared(authcid)
    if not user or not password:
        raise AuthenticationFailed("PLAIN: empty or prohibited user name, or empty password")
    if authzid and sasl_prepared(authzid) != user:
        raise AuthenticationFailed("PLAIN: authzid differs from authcid")
    return UserPassword(user, password)


def verify_password(password: str, credential: ScramCredential, mechanism: str) -> bool:
    """Whether `password` is the one `credential` was made from, compared in constant
    time. CPU work: one Hi."""
    try:
        candidate = credential_from_password(
            mechanism, password, credential.iterations, credential.salt
        )
    except ValueError:
        return False
    return hmac.compare_digest(candidate.stored_key, credential.stored_key)


def authenticate_plain(message: bytes, lookup: CredentialLookup, mock_secret: bytes) -> str:
    """The user a PLAIN message authenticates, or AuthenticationFailed. The password is
    checked against the user's SCRAM-SHA-512 credential, else the SCRAM-SHA-256 one;
    an unknown user costs the same Hi (SHA-512, DEFAULT_ITERATIONS: a bootstrap user's)
    against a mock credential. Blocking CPU work: run it in a worker thread."""
    plain = parse_plain(message)
    for mechanism in PLAIN_CHECKS:
        credential = lookup(plain.user, mechanism)
        if credential is not None:
            if not verify_password(plain.password, credential, mechanism):
                raise AuthenticationFailed("PLAIN: wrong password")
            return plain.user
    # The same Hi as for a known user, so the time of the answer does not tell: the
    # mechanism a known user's password is checked with first (every bootstrap user has
    # it), at the iterations a credential gets by default.
    mock = mock_credential(PLAIN_CHECKED_FIRST, plain.user, mock_secret)
    verify_password(plain.password, mock, PLAIN_CHECKED_FIRST)
    raise AuthenticationFailed("PLAIN: unknown user")
