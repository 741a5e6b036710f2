"""The SASL state of one connection, pure (docs/protocol.md section 7, "Authentication").

What a connection on a `sasl_*` listener may do, and when: before it has
authenticated, every API but ApiVersions and SaslAuthenticate is refused
(SASL_AUTHENTICATION_FAILED, the connection kept); SaslAuthenticate runs PLAIN in
one round and SCRAM in two consecutive ones; a failure is answered with the one
message and closes the connection; a session lasts `connections_max_reauth_ms`
from its authentication, the client authenticates again on the same connection
before then (KIP-368), as the same principal, and the first request after the
end is not answered: the connection closes.

No IO, no clock: the server passes `now_ms` in, runs PLAIN's password check (one
PBKDF2) in a worker thread when told to (`CheckPlain`), sleeps the failure delay
and closes the socket. The SCRAM messages themselves are `scram.ScramExchange`'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from broker.config import BrokerConfig, Listener
from broker.security.scram import (
    PLAIN,
    AuthenticationFailed,
    CredentialLookup,
    ScramCredential,
    ScramExchange,
    parse_plain,
)

SASL_AUTHENTICATE = "SaslAuthenticate"
BEFORE_AUTHENTICATION = frozenset({"ApiVersions", SASL_AUTHENTICATE})
"""The APIs a connection on a sasl_* listener may call before it has authenticated."""


class Admission(enum.Enum):
    """What the server does with a request before running it."""

    ANSWER = "answer"
    REFUSE = "refuse"
    """SASL_AUTHENTICATION_FAILED(58) without running it; the connection stays."""
    CLOSE = "close"
    """The session has run out: no answer, the connection closes."""


@dataclass(frozen=True, slots=True)
class SaslPolicy:
    """What the settings allow on one listener, read at each SaslAuthenticate (they are
    reloadable)."""

    mechanisms: tuple[str, ...]
    plain_allowed: bool
    """PLAIN on this listener: on TLS, or with allow_plain_without_tls."""
    reauth_ms: int
    """connections_max_reauth_ms: 0 = sessions do not expire."""

    @property
    def offered(self) -> tuple[str, ...]:
        """The mechanisms a handshake lists: PLAIN only where it is allowed, so that no
        client sends a password in clear only to be refused."""
        return tuple(m for m in self.mechanisms if m != PLAIN or self.plain_allowed)

    @classmethod
    def of(cls, config: BrokerConfig, listener: Listener) -> SaslPolicy:
        return cls(
            config.sasl_mechanisms,
            listener.tls or config.allow_plain_without_tls,
            config.connections_max_reauth_ms,
        )


@dataclass(frozen=True, slots=True)
class Challenge:
    """SCRAM's round 1 answered (server-first); round 2 must be the next request."""

    auth_bytes: bytes


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The connection is `principal` now, until `session_lifetime_ms` from now (0: no
    end). `reauthenticated`: it was already, as the same principal."""

    principal: str
    auth_bytes: bytes
    session_lifetime_ms: int
    reauthenticated: bool


@dataclass(frozen=True, slots=True)
class Unsupported:
    """UNSUPPORTED_SASL_MECHANISM(33): the mechanism is unknown or not allowed here; the
    connection stays for another try."""

    message: str


@dataclass(frozen=True, slots=True)
class Failed:
    """SASL_AUTHENTICATION_FAILED(58) with scram.FAILURE_MESSAGE, answered after the
    failure delay; then the connection closes. `reason` and `user` (the name the client
    gave, when it got that far) are for the broker's log, never the client."""

    reason: str
    user: str | None


@dataclass(frozen=True, slots=True)
class CheckPlain:
    """PLAIN's message, to check with scram.authenticate_plain in a worker thread (one
    PBKDF2); its outcome goes to `SaslState.plain_checked`."""

    message: bytes = field(repr=False)


Step = Challenge | Authenticated | Unsupported | Failed | CheckPlain


class SaslState:
    """One connection's authentication: who it is, until when, and a SCRAM exchange
    between its two rounds.

    `lookup` finds a user's stored credential (the credential store's); `mock_secret`
    makes the credentials of unknown users (scram.mock_credential)."""

    def __init__(self, lookup: CredentialLookup, mock_secret: bytes) -> None:
        self._lookup = lookup
        self._mock_secret = mock_secret
        self.principal: str | None = None
        """The authenticated principal, None until the first success."""
        self.expires_at_ms: int | None = None
        """When the session ends (None: never, or not authenticated)."""
        self.closed = False
        """A failure ended the connection: the server closes it after the answer."""
        self._exchange: ScramExchange | None = None
        self._claimed: str | None = None  # the user the attempt's first message named

    def __repr__(self) -> str:
        return f"SaslState(principal={self.principal!r}, expires_at_ms={self.expires_at_ms})"

    def admit(self, api: str, now_ms: int) -> Admission:
        """Whether the request for `api` that arrived at `now_ms` is run, refused or ends
        the connection. Any request but the next SaslAuthenticate abandons a SCRAM
        exchange between its rounds (they are consecutive requests)."""
        if self.expires_at_ms is not None and now_ms >= self.expires_at_ms:
            return Admission.CLOSE
        if api != SASL_AUTHENTICATE:
            self._exchange = None
        if self.principal is None and api not in BEFORE_AUTHENTICATION:
            return Admission.REFUSE
        return Admission.ANSWER

    def authenticate(
        self, mechanism: str, auth_bytes: bytes, policy: SaslPolicy, now_ms: int
    ) -> Step:
        """One SaslAuthenticate request: SCRAM's round 2 when round 1 of the same
        mechanism came just before, else a new attempt (which abandons that round 1)."""
        exchange, self._exchange = self._exchange, None
        if exchange is not None and mechanism == exchange.mechanism:
            try:
                server_final = exchange.server_final(auth_bytes)
            except AuthenticationFailed as exc:
                return self._fail(exc.reason, self._claimed)
            assert exchange.user is not None
            return self._succeed(exchange.user, server_final, policy, now_ms)
        if mechanism not in policy.mechanisms:
            shown = mechanism if len(mechanism) <= 32 else mechanism[:32] + "..."
            return Unsupported(
                f"mechanism {shown!r} is not enabled; enabled: {', '.join(policy.mechanisms)}"
            )
        if mechanism == PLAIN:
            if not policy.plain_allowed:
                return Unsupported(
                    "PLAIN sends the password in clear: refused on a listener without TLS "
                    "(allow_plain_without_tls)"
                )
            try:
                self._claimed = parse_plain(auth_bytes).user
            except AuthenticationFailed:
                self._claimed = None  # the check fails it again, with its reason
            return CheckPlain(auth_bytes)
        self._claimed = None
        exchange = ScramExchange(mechanism, self._recording_lookup, self._mock_secret)
        try:
            server_first = exchange.server_first(auth_bytes)
        except AuthenticationFailed as exc:
            return self._fail(exc.reason, self._claimed)
        self._exchange = exchange
        return Challenge(server_first)

    def plain_checked(
        self, user: str | None, reason: str, policy: SaslPolicy, now_ms: int
    ) -> Authenticated | Failed:
        """The outcome of a `CheckPlain`: the user authenticated, or None and why not."""
        if user is None:
            return self._fail(reason, self._claimed)
        return self._succeed(user, b"", policy, now_ms)

    def _recording_lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        self._claimed = user
        return self._lookup(user, mechanism)

    def _succeed(
        self, user: str, auth_bytes: bytes, policy: SaslPolicy, now_ms: int
    ) -> Authenticated | Failed:
        principal = f"User:{user}"
        again = self.principal is not None
        if again and principal != self.principal:
            return self._fail(f"re-authentication as {principal}, not {self.principal}", user)
        self.principal = principal
        lifetime_ms = policy.reauth_ms
        self.expires_at_ms = now_ms + lifetime_ms if lifetime_ms else None
        return Authenticated(principal, auth_bytes, lifetime_ms, again)

    def _fail(self, reason: str, user: str | None) -> Failed:
        self.closed = True
        return Failed(reason, user)
