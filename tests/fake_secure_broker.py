"""An in-process fake broker for the client's TLS and SASL tests: the listener's security, faked.

It answers ApiVersions, SaslAuthenticate and Metadata (no topics) as a `sasl_*`
listener of docs/protocol.md section 7 does: until a connection has
authenticated, Metadata is refused with SASL_AUTHENTICATION_FAILED(58); a
failed attempt is answered 58 and the connection closed; sessions last
`lifetime_ms` and a request after the end closes the connection unanswered.
The SCRAM and PLAIN checks are the broker's own (`broker.security.scram`), so
the client's exchange is tested against the real server side. With `tls`, the
listener wraps connections in TLS (certificates from trustme).

Tests read what happened in `seen` (api names per connection), `bodies` (every
request's bytes) and `connections`, and can spoil the server-final signature
(`forge_server_final`). AlterUserScramCredentials is answered as done for every
user, so that what the client sends can be checked.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.tls import TLSListener

from broker.security.scram import (
    PLAIN,
    AuthenticationFailed,
    ScramCredential,
    ScramExchange,
    authenticate_plain,
    credential_from_password,
)
from protocol.errors import ErrorCode
from protocol.framing import FrameDecoder, FrameError, frame
from protocol.messages import (
    APIS,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    ApiVersionsResponse,
    MetadataResponse,
    Request,
    Response,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    decode_request,
    encode_response,
)

MOCK_SECRET = b"fake-broker-mock-secret-32-bytes"


@dataclass
class FakeSecureBroker:
    users: dict[str, str] = field(default_factory=dict)  # name -> password
    mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512", PLAIN)
    lifetime_ms: int = 0
    tls: ssl.SSLContext | None = None
    forge_server_final: bool = False
    connections: int = 0
    seen: list[list[str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    authentications: list[float] = field(default_factory=list)  # monotonic times
    port: int = 0
    _credentials: dict[tuple[str, str], ScramCredential] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for user, password in self.users.items():
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                self._credentials[(user, mechanism)] = credential_from_password(
                    mechanism, password, 4096
                )

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._credentials.get((user, mechanism))

    async def serve(self, stream: anyio.abc.ByteStream) -> None:
        self.connections += 1
        seen: list[str] = []
        self.seen.append(seen)
        decoder = FrameDecoder(1 << 20)
        user: str | None = None
        expires_at: float | None = None
        exchange: ScramExchange | None = None
        async with stream:
            try:
                while True:
                    data = await stream.receive()
                    for body in decoder.feed_bodies(data):
                        request = decode_request(body)
                        seen.append(request.api)
                        self.bodies.append(body)
                        if expires_at is not None and time.monotonic() >= expires_at:
                            return  # the session ran out: closed, unanswered
                        if request.api != "SaslAuthenticate":
                            exchange = None
                        if isinstance(request, SaslAuthenticateRequest):
                            response, exchange, done = await self._authenticate(request, exchange)
                            if response.error == ErrorCode.SASL_AUTHENTICATION_FAILED:
                                await stream.send(frame(encode_response(response, request.cid)))
                                return
                            if done is not None:
                                if user is not None and done != user:
                                    return
                                user = done
                                self.authentications.append(time.monotonic())
                                expires_at = (
                                    time.monotonic() + self.lifetime_ms / 1000
                                    if self.lifetime_ms
                                    else None
                                )
                        else:
                            response = self._answer(request, authenticated=user is not None)
                        await stream.send(frame(encode_response(response, request.cid)))
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError, FrameError):
                return

    async def _authenticate(
        self, request: SaslAuthenticateRequest, exchange: ScramExchange | None
    ) -> tuple[SaslAuthenticateResponse, ScramExchange | None, str | None]:
        """(answer, the SCRAM exchange between its rounds, the user once authenticated)."""
        failed = SaslAuthenticateResponse(
            error=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message="Authentication failed"
        )
        lifetime = self.lifetime_ms
        try:
            if exchange is not None and exchange.mechanism == request.mechanism:
                final = exchange.server_final(request.auth_bytes)
                if self.forge_server_final:
                    final = b"v=" + b"A" * 44
                assert exchange.user is not None
                return (
                    SaslAuthenticateResponse(auth_bytes=final, session_lifetime_ms=lifetime),
                    None,
                    exchange.user,
                )
            if request.mechanism not in self.mechanisms:
                return (
                    SaslAuthenticateResponse(
                        error=ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                        error_message=f"enabled: {', '.join(self.mechanisms)}",
                    ),
                    None,
                    None,
                )
            if request.mechanism == PLAIN:
                user = await anyio.to_thread.run_sync(
                    authenticate_plain, request.auth_bytes, self.lookup, MOCK_SECRET
                )
                return SaslAuthenticateResponse(session_lifetime_ms=lifetime), None, user
            exchange = ScramExchange(request.mechanism, self.lookup, MOCK_SECRET)
            first = exchange.server_first(request.auth_bytes)
            return SaslAuthenticateResponse(auth_bytes=first), exchange, None
        except AuthenticationFailed:
            return failed, None, None

    def _answer(self, request: Request, *, authenticated: bool) -> Response:
        if request.api == "ApiVersions":
            return ApiVersionsResponse(apis={api: [1, 1] for api in APIS})
        if not authenticated and self.users:
            return Response(error=ErrorCode.SASL_AUTHENTICATION_FAILED)
        if isinstance(request, AlterUserScramCredentialsRequest):
            users = [a.user for a in [*request.deletions, *request.upsertions]]
            return AlterUserScramCredentialsResponse(
                results=[AlterUserScramCredentialsResult(user) for user in dict.fromkeys(users)]
            )
        return MetadataResponse(brokers=[], topics=[])


@asynccontextmanager
async def running(broker: FakeSecureBroker) -> AsyncIterator[str]:
    """Serve `broker` on loopback for the block; yields its bootstrap address."""
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1")
    broker.port = tcp.extra(anyio.abc.SocketAttribute.local_port)
    listener: anyio.abc.Listener[anyio.abc.ByteStream] = (
        tcp if broker.tls is None else TLSListener(tcp, broker.tls, standard_compatible=False)
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, broker.serve)
        yield f"127.0.0.1:{broker.port}"
        tg.cancel_scope.cancel()
