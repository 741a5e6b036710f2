"""A connection's security: the TLS context and the SASL exchange, and KIP-554's salted
password (docs/protocol.md section 7).

`ConnectionSecurity` is what a client's settings (client/config.py's
`SecurityConfig`) come down to for one connection: an `ssl.SSLContext` or
None, and a SASL mechanism with a user and password or None. It is built once
per client, so a bad CA file or key password fails at construction.

The SASL exchanges are sans-IO: `sasl_client` returns an object that says what
to send next for what the broker answered, and `client/connection.py` carries
the messages in SaslAuthenticate requests. SCRAM runs on `scramp`'s client,
which checks the server-first message and the server-final signature (a broker
that does not hold the user's credential cannot make it); nothing here parses
SCRAM. No secret is ever put in a repr, a log line or an exception message.
"""

from __future__ import annotations

import hashlib
import secrets
import ssl
from dataclasses import dataclass, field
from typing import Protocol

from scramp import ScramClient, ScramException
from scramp.utils import saslprep

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
TLS_PROTOCOLS = frozenset({SSL, SASL_SSL})
SASL_PROTOCOLS = frozenset({SASL_PLAINTEXT, SASL_SSL})

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
SCRAM_MECHANISMS = (SCRAM_SHA_256, SCRAM_SHA_512)
SASL_MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
_HASH_NAMES = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}

# KIP-554 upsertions: the broker takes 4096..16384 iterations and a salt of 12..256 bytes.
ITERATIONS_MIN = 4096
ITERATIONS_MAX = 16384
DEFAULT_ITERATIONS = 8192
"""What `minibroker users add` uses unless told: the broker's bootstrap users' count."""
SALT_BYTES = 32

# KIP-368: re-authenticate at a random point between these fractions of the session's
# lifetime, as Kafka's clients do, so that many connections do not all go at once.
REAUTH_AT_MIN = 0.85
REAUTH_AT_MAX = 0.95


class SaslClient(Protocol):
    """One SASL exchange, client side: `first()` is the first message; `respond(answer)`
    takes the broker's answer to the last message and returns the next one, or None
    when the exchange is complete (after checking the broker's last answer).
    ScramException or ValueError: the broker's answer is refused."""

    def first(self) -> bytes: ...

    def respond(self, answer: bytes) -> bytes | None: ...


class _PlainClient:
    """RFC 4616, one round: empty authzid, the user, the password."""

    def __init__(self, username: str, password: str) -> None:
        self._message = f"\0{username}\0{password}".encode()

    def __repr__(self) -> str:
        return "PlainClient(<hidden>)"

    def first(self) -> bytes:
        return self._message

    def respond(self, answer: bytes) -> bytes | None:
        return None


class _ScramClient:
    """RFC 5802 on scramp: client-first; client-final for the server-first; then the
    server-final's signature is verified. What scramp refuses is a ValueError here."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        try:
            self._client = ScramClient([mechanism], username, password)
        except ScramException:
            raise ValueError(
                "sasl_plain_username or sasl_plain_password holds characters SASLprep prohibits"
            ) from None
        self._step = 0

    def __repr__(self) -> str:
        return f"ScramClient({self._client.mechanism_name}, step={self._step})"

    def first(self) -> bytes:
        message: str = self._client.get_client_first()
        return message.encode()

    def respond(self, answer: bytes) -> bytes | None:
        self._step += 1
        try:
            text = answer.decode("utf-8")
            if self._step == 1:
                self._client.set_server_first(text)
                final: str = self._client.get_client_final()
                return final.encode()
            self._client.set_server_final(text)
        except (ScramException, UnicodeDecodeError) as exc:
            # scramp's messages name what is wrong with the broker's message, never a secret.
            raise ValueError(str(exc)) from None
        return None


@dataclass(frozen=True, slots=True)
class SaslSettings:
    """A SASL mechanism and the user and password it authenticates with."""

    mechanism: str
    username: str
    password: str = field(repr=False)

    def client(self) -> SaslClient:
        """A fresh exchange (each authentication and re-authentication needs its own)."""
        if self.mechanism == PLAIN:
            return _PlainClient(self.username, self.password)
        return _ScramClient(self.mechanism, self.username, self.password)


@dataclass(frozen=True, slots=True)
class ConnectionSecurity:
    """How a client's connections are secured: TLS with this context (None: plaintext)
    and SASL with these settings (None: no SASL)."""

    tls: ssl.SSLContext | None = None
    sasl: SaslSettings | None = None

    @property
    def protocol(self) -> str:
        """Kafka's name for this combination (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)."""
        if self.sasl is None:
            return PLAINTEXT if self.tls is None else SSL
        return SASL_PLAINTEXT if self.tls is None else SASL_SSL

    @property
    def principal(self) -> str | None:
        """Who the broker takes these connections for, as far as the client knows: the
        SASL user, or User:ANONYMOUS on plaintext; None when a TLS listener may take the
        principal from the client's certificate."""
        if self.sasl is not None:
            return f"User:{self.sasl.username}"
        return "User:ANONYMOUS" if self.tls is None else None


PLAINTEXT_SECURITY = ConnectionSecurity()


def tls_context(
    *,
    cafile: str | None,
    certfile: str | None,
    keyfile: str | None,
    password: str | None,
    check_hostname: bool,
) -> ssl.SSLContext:
    """A client TLS context (1.2 or later, the broker's certificate verified): against
    `cafile`, else the system's CAs; with a client certificate (mTLS) from `certfile`
    and `keyfile` (the key decrypted with `password`). ValueError when a file cannot
    be used; its message names the setting and the file, never the password."""
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl_cafile {cafile!r} cannot be used: {_reason(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    if certfile is not None:
        try:
            context.load_cert_chain(certfile, keyfile, password)
        except (OSError, ssl.SSLError) as exc:
            files = certfile if keyfile is None else f"{certfile}, {keyfile}"
            wrong = " (or ssl_password is wrong)" if isinstance(exc, ssl.SSLError) else ""
            raise ValueError(
                f"ssl_certfile/ssl_keyfile {files} cannot be used{wrong}: {_reason(exc)}"
            ) from None
    return context


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """KIP-554's SaltedPassword = Hi(password, salt, iterations) (RFC 5802: PBKDF2 with the
    mechanism's HMAC), after SASLprep as the SCRAM client prepares a password, so that
    logging in with `password` matches. ValueError for an unknown mechanism or a
    password SASLprep prohibits (the message never holds it)."""
    name = _HASH_NAMES.get(mechanism)
    if name is None:
        raise ValueError(f"not a SCRAM mechanism: {mechanism!r} (one of {SCRAM_MECHANISMS})")
    try:
        prepared = saslprep(password)
    except ScramException:
        raise ValueError("the password holds characters SASLprep prohibits") from None
    return hashlib.pbkdf2_hmac(name, prepared.encode("utf-8"), salt, iterations)


def new_salt() -> bytes:
    """A fresh random salt for a SCRAM credential."""
    return secrets.token_bytes(SALT_BYTES)
