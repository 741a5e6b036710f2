"""The security APIs and who each connection is: each connection's Session,
SaslAuthenticate, the SCRAM credential APIs, the ACL APIs, and the audit trail of
authentications (docs/protocol.md section 7).

They sit with the other APIs, registered in the one table the same way, rather than
in `broker/security/`, which keeps the decisions and the stores and knows nothing of
the event loop, the metrics or the crash points these need.

`broker/security/sasl.py` decides (pure); this module does what the decisions need
of the world: PLAIN's password check (a PBKDF2) in a worker thread, the delay
before a failure is answered, the credential store, the clock, one audit line per
authentication on the `minibroker.audit` logger and the metrics. The network asks,
after each request, whether the session's authentication failed, and closes the
connection once the answer is out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from broker.clock import monotonic_ms
from broker.config import BrokerConfig, Listener
from broker.crash_points import crash_point
from broker.logs import AUDIT_LOGGER
from broker.metrics import BrokerMetrics
from broker.security import (
    FAILURE_MESSAGE,
    AclBinding,
    AclFilter,
    AclStore,
    Authenticated,
    AuthenticationFailed,
    Challenge,
    CheckPlain,
    CredentialStore,
    Failed,
    SaslPolicy,
    SaslState,
    Session,
    Unsupported,
    authenticate_plain,
    validate_filter,
)
from protocol import messages as m
from protocol.errors import ErrorCode

PLAIN_CHECKS_MAX = 4
"""PLAIN checks running at once: each is a PBKDF2 of thousands of HMACs, and a flood
of attempts must not take every worker thread (and core) from the rest."""
MECHANISM_SHOWN_CHARS = 32  # of a mechanism name a client made up, in the audit line


class Authentication:
    """The broker's side of authentication for every listener."""

    def __init__(
        self,
        config: BrokerConfig,
        credentials: CredentialStore,
        metrics: BrokerMetrics,
        acls: AclStore | None,
    ) -> None:
        """`acls` is the ACL store when `authorizer` is on (None: the ACL APIs answer
        SECURITY_DISABLED)."""
        self.config = config
        """The settings in force: SIGHUP replaces it (the SASL settings are reloadable)."""
        self.credentials = credentials
        self.metrics = metrics
        self.acls = acls
        self.audit = logging.getLogger(AUDIT_LOGGER)
        self._listeners = {listener.name: listener for listener in config.effective_listeners()}
        self._plain_checks = anyio.CapacityLimiter(PLAIN_CHECKS_MAX)

    def session(self, listener: Listener, peer_host: str, advertised: tuple[str, int]) -> Session:
        """A new connection's session: anonymous, with a SASL state on sasl_* listeners."""
        sasl = (
            SaslState(self.credentials.lookup, self.credentials.mock_secret)
            if listener.sasl
            else None
        )
        return Session(listener.name, peer_host, advertised=advertised, sasl=sasl)

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        return {
            "SaslAuthenticate": self.sasl_authenticate,
            "DescribeUserScramCredentials": self.describe_credentials,
            "AlterUserScramCredentials": self.alter_credentials,
            "CreateAcls": lambda req, _session: self.create_acls(req),
            "DescribeAcls": lambda req, _session: self.describe_acls(req),
            "DeleteAcls": lambda req, _session: self.delete_acls(req),
        }

    # ---------------------------------------------------------------- SaslAuthenticate

    async def sasl_authenticate(
        self, request: m.SaslAuthenticateRequest, session: Session
    ) -> m.SaslAuthenticateResponse:
        """One SaslAuthenticate from `session`'s connection; on failure the answer comes
        after authentication_failure_delay_ms and `session.sasl.closed` is set."""
        listener = self._listeners[session.listener]
        state = session.sasl
        if state is None:
            self._audit(session, request.mechanism, None, "unsupported_mechanism", "no SASL")
            return m.SaslAuthenticateResponse(
                error=ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                error_message=f"listener {listener.name!r} (security={listener.security}) "
                "does not take SASL",
            )
        policy = SaslPolicy.of(self.config, listener)
        step = state.authenticate(request.mechanism, request.auth_bytes, policy, monotonic_ms())
        if isinstance(step, CheckPlain):
            step = await self._check_plain(state, step, policy)
        if isinstance(step, Challenge):
            return m.SaslAuthenticateResponse(auth_bytes=step.auth_bytes)
        if isinstance(step, Authenticated):
            session.principal = step.principal
            result = "reauthenticated" if step.reauthenticated else "success"
            self._audit(session, request.mechanism, step.principal, result, "")
            return m.SaslAuthenticateResponse(
                auth_bytes=step.auth_bytes, session_lifetime_ms=step.session_lifetime_ms
            )
        if isinstance(step, Unsupported):
            self._audit(session, request.mechanism, None, "unsupported_mechanism", step.message)
            return m.SaslAuthenticateResponse(
                error=ErrorCode.UNSUPPORTED_SASL_MECHANISM, error_message=step.message
            )
        claimed = None if step.user is None else f"User:{step.user}"
        self._audit(session, request.mechanism, claimed, "failure", step.reason)
        await anyio.sleep(self.config.authentication_failure_delay_ms / 1000)
        return m.SaslAuthenticateResponse(
            error=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=FAILURE_MESSAGE
        )

    async def _check_plain(
        self, state: SaslState, step: CheckPlain, policy: SaslPolicy
    ) -> Authenticated | Failed:
        store = self.credentials
        try:
            user: str | None = await anyio.to_thread.run_sync(
                authenticate_plain,
                step.message,
                store.lookup,
                store.mock_secret,
                limiter=self._plain_checks,
            )
            reason = ""
        except AuthenticationFailed as exc:
            user, reason = None, exc.reason
        return state.plain_checked(user, reason, policy, monotonic_ms())

    def certificate_authenticated(self, session: Session, principal: str) -> None:
        """A TLS client certificate named the session's principal."""
        session.principal = principal
        self._audit(session, "TLS", principal, "success", "")

    def _audit(
        self, session: Session, mechanism: str, principal: str | None, result: str, reason: str
    ) -> None:
        self.metrics.authentication(session.listener, mechanism, result)
        shown = mechanism[:MECHANISM_SHOWN_CHARS]
        # Client-chosen text (a mechanism, a user name) is quoted: it cannot forge fields.
        self.audit.info(
            "event=authentication listener=%s mechanism=%r principal=%r peer=%s result=%s "
            "reason=%r",
            session.listener,
            shown,
            principal or "",
            session.peer_host,
            result,
            reason,
        )

    # ---------------------------------------------------------------- SCRAM credentials

    def describe_credentials(
        self, request: m.DescribeUserScramCredentialsRequest, _session: Session
    ) -> m.DescribeUserScramCredentialsResponse:
        return self.credentials.describe(request)

    async def alter_credentials(
        self, request: m.AlterUserScramCredentialsRequest, _session: Session
    ) -> m.AlterUserScramCredentialsResponse:
        """Durable before the answer; a crash point sits between the two."""
        response = await self.credentials.alter(request)
        crash_point("credentials_altered")
        return response

    # ---------------------------------------------------------------- ACLs

    async def create_acls(self, req: m.CreateAclsRequest) -> m.CreateAclsResponse:
        if self.acls is None:
            return m.CreateAclsResponse(
                error=ErrorCode.SECURITY_DISABLED,
                message=_SECURITY_DISABLED,
                results=[
                    m.AclCreationResult(ErrorCode.SECURITY_DISABLED, _SECURITY_DISABLED)
                    for _ in req.creations
                ],
            )
        results = await self.acls.create([_binding(b) for b in req.creations])
        return m.CreateAclsResponse(
            results=[m.AclCreationResult(r.error, r.message) for r in results]
        )

    def describe_acls(self, req: m.DescribeAclsRequest) -> m.DescribeAclsResponse:
        if self.acls is None:
            return m.DescribeAclsResponse(
                error=ErrorCode.SECURITY_DISABLED, message=_SECURITY_DISABLED
            )
        acl_filter = _filter(req.filter)
        invalid = validate_filter(acl_filter)
        if invalid is not None:
            return m.DescribeAclsResponse(error=ErrorCode.INVALID_REQUEST, message=invalid)
        return m.DescribeAclsResponse(
            bindings=[m.AclBinding(*b) for b in self.acls.authorizer.describe(acl_filter)]
        )

    async def delete_acls(self, req: m.DeleteAclsRequest) -> m.DeleteAclsResponse:
        if self.acls is None:
            return m.DeleteAclsResponse(
                error=ErrorCode.SECURITY_DISABLED,
                message=_SECURITY_DISABLED,
                results=[m.AclDeletionResult(ErrorCode.SECURITY_DISABLED) for _ in req.filters],
            )
        results = await self.acls.delete([_filter(f) for f in req.filters])
        return m.DeleteAclsResponse(
            results=[
                m.AclDeletionResult(r.error, [m.AclBinding(*b) for b in r.deleted]) for r in results
            ]
        )


_SECURITY_DISABLED = "the authorizer is off (setting authorizer = false)"


def _binding(wire: m.AclBinding) -> AclBinding:
    return AclBinding(*msgspec.structs.astuple(wire))


def _filter(wire: m.AclBindingFilter) -> AclFilter:
    return AclFilter(*msgspec.structs.astuple(wire))
