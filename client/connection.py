"""One TCP connection to the broker on AnyIO: pipelined framed requests, answered in order.

The broker answers a connection's requests strictly in the order it received
them (docs/protocol.md section 1), so responses are matched to a FIFO of pending
requests and their cids are checked, not looked up. A response that takes
longer than its request's timeout, a cid that does not match, or a broken
socket closes the connection and fails every pending request with
ConnectionLostError: the outcome of those requests is unknown, and retrying
them is the caller's business (the producer's sequence numbers make that safe).
A connection closed by an authentication failure fails them with that
AuthenticationFailedError instead, which no caller retries.

A secured connection (client/security.py) is opened with TLS, then SASL right
after ApiVersions; when the broker gives the session a lifetime, the
connection authenticates again before it runs out (KIP-368), between requests:
no other request is written during the exchange (its rounds must be
consecutive requests), and requests already in flight are answered before it,
in order, so callers at most see a request wait one exchange. A failed authentication,
first or later, is an AuthenticationFailedError that the Reconnector keeps:
it is never retried.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc

from client.errors import (
    AuthenticationFailedError,
    ConnectionLostError,
    MinibrokerError,
    MinibrokerTimeoutError,
    NoBrokersAvailable,
)
from client.security import (
    PLAINTEXT_SECURITY,
    REAUTH_AT_MAX,
    REAUTH_AT_MIN,
    ConnectionSecurity,
    SaslSettings,
)
from protocol.errors import ErrorCode
from protocol.framing import LENGTH, FrameDecoder, FrameError, FrameTooLarge
from protocol.messages import (
    CID_MAX,
    ApiVersionsRequest,
    ApiVersionsResponse,
    Request,
    Response,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    decode_response,
    encode_request,
)

log = logging.getLogger(f"minibroker.{__name__}")

RECV_BYTES = 256 * 1024
COPY_BYTES_MAX = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
REQUIRED_APIS = ("Metadata", "Produce", "Fetch", "ListOffsets", "InitProducerId")

ResponseCallback = Callable[[Any, BaseException | None], None]
"""Called with the typed response of the request, or None and the error."""


class _Pending:
    __slots__ = ("callback", "cid", "deadline", "kind")

    def __init__(
        self, cid: int, kind: type[Response], callback: ResponseCallback, deadline: float
    ) -> None:
        self.cid = cid
        self.kind = kind
        self.callback = callback
        self.deadline = deadline


class Connection:
    """A framed, pipelined connection; `run` must be running in a task group to get answers."""

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        address: str,
        *,
        client_id: str | None,
        max_response_bytes: int,
        sasl: SaslSettings | None = None,
        timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.address = address
        self.closed = False
        self.max_frame_bytes = 0
        self.auth_error: AuthenticationFailedError | None = None
        """Why the broker refused this connection's credentials (set before it closed)."""
        self.principal: str | None = None
        """Who the broker takes this connection for, when the client knows
        (ConnectionSecurity.principal): what a denial's message names."""
        self.tls_error: ssl.SSLError | None = None
        """What TLS failed on after the handshake (a TLS 1.3 broker refusing our certificate)."""
        self.reauth_at: float | None = None
        """When to authenticate again (anyio.current_time()), or None."""
        self._sasl = sasl
        self._timeout_s = timeout_s
        self._reauth_scope = anyio.CancelScope()
        self._stream = stream
        self._client_id = client_id
        self._decoder = FrameDecoder(max_response_bytes)
        self._pending: deque[_Pending] = deque()
        self._next_cid = 0
        self._send_lock = anyio.Lock(fast_acquire=True)
        self._recv_scope: anyio.CancelScope | None = None
        self._run_scope = anyio.CancelScope()
        self._close_reason = "closed"

    async def send(
        self, request: Request, callback: ResponseCallback | None, timeout_s: float
    ) -> bool:
        """Write `request`; `callback(response, error)` runs once its answer (or failure) comes.

        Returns False when the connection is or became unusable before the frame
        was fully written (the callback then has been called with the error).
        Without a callback no answer is expected (Produce with acks=0)."""
        return await self.send_many([(request, callback)], timeout_s)

    async def send_many(
        self, items: Sequence[tuple[Request, ResponseCallback | None]], timeout_s: float
    ) -> bool:
        """`send` for several requests in order: one lock and as few writes as their sizes
        allow. The lock and the stream's send each let the event loop run, so a
        producer that drained three requests paid that three times with one `send`
        each (issue 14: 26-31% of the client's CPU per record with 4 producers)."""
        if self.closed:
            self._refuse(items)
            return False
        cids, parts = self._encode(items)
        async with self._send_lock:
            return await self._write(items, cids, parts, timeout_s)

    def _encode(
        self, items: Sequence[tuple[Request, ResponseCallback | None]]
    ) -> tuple[list[int], list[bytes]]:
        """The requests' cids and their frames, cut into as few parts as their sizes allow."""
        parts: list[bytes] = []
        small: list[bytes] = []
        cids: list[int] = []
        for request, _ in items:
            cid = self._next_cid
            self._next_cid = 0 if cid >= CID_MAX else cid + 1
            cids.append(cid)
            body = encode_request(request, cid, self._client_id)
            if len(body) < COPY_BYTES_MAX:
                small += (LENGTH.pack(len(body)), body)
                continue
            # A large body goes out after its length prefix rather than being copied behind it.
            if small:
                parts.append(b"".join(small))
                small = []
            parts += (LENGTH.pack(len(body)), body)
        if small:
            parts.append(b"".join(small))
        return cids, parts

    async def _write(
        self,
        items: Sequence[tuple[Request, ResponseCallback | None]],
        cids: list[int],
        parts: list[bytes],
        timeout_s: float,
    ) -> bool:
        """Write encoded requests, their answers expected in order; the send lock is held."""
        if self.closed:
            self._refuse(items)
            return False
        waiting = len(self._pending)
        deadline = anyio.current_time() + timeout_s
        for cid, (request, callback) in zip(cids, items, strict=True):
            if callback is not None:
                self._pending.append(_Pending(cid, request.response, callback, deadline))
        if not waiting and self._pending and self._recv_scope is not None:
            self._recv_scope.deadline = deadline
        try:
            for part in parts:
                await self._stream.send(part)
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._shutdown(f"send failed: {exc!r}")
            return False
        return True

    def _refuse(self, items: Sequence[tuple[Request, ResponseCallback | None]]) -> None:
        error = self._failure()
        for _, callback in items:
            if callback is not None:
                callback(None, error)

    async def request(self, request: Request, timeout_s: float) -> Any:
        """Send `request` and wait for its typed response (of `request.response`)."""
        return await self._request(request, timeout_s, locked=False)

    async def _request(self, request: Request, timeout_s: float, *, locked: bool) -> Any:
        """`request`; with `locked`, the caller holds the send lock (authentication)."""
        done = anyio.Event()
        outcome: list[Any] = []

        def on_answer(response: Response | None, error: BaseException | None) -> None:
            outcome.append(error if error is not None else response)
            done.set()

        if locked:
            items = [(request, on_answer)]
            await self._write(items, *self._encode(items), timeout_s)
        else:
            await self.send(request, on_answer, timeout_s)
        await done.wait()
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    # ------------------------------------------------------------------ SASL

    async def authenticate(self) -> None:
        """Run this connection's SASL exchange, between requests: nothing else is written
        meanwhile, since a SCRAM exchange's two rounds must be consecutive requests.
        Requests in flight are not waited for (as in Kafka's clients): the broker
        answers them first, and a re-authentication so reaches it before the session
        ends. Sets `reauth_at` from the session lifetime the broker answers.
        AuthenticationFailedError when refused; ConnectionLostError when the
        connection fails meanwhile."""
        sasl = self._sasl
        assert sasl is not None
        async with self._send_lock:
            exchange = sasl.client()
            message: bytes | None = exchange.first()
            while message is not None:
                request = SaslAuthenticateRequest(mechanism=sasl.mechanism, auth_bytes=message)
                response: SaslAuthenticateResponse = await self._request(
                    request, self._timeout_s, locked=True
                )
                if response.error:
                    raise self._refused(sasl, response)
                try:
                    # SCRAM's client-final costs one Hi (thousands of HMACs): not on the
                    # event loop, which other connections' I/O shares.
                    message = await anyio.to_thread.run_sync(exchange.respond, response.auth_bytes)
                except ValueError as exc:
                    raise AuthenticationFailedError(
                        f"authentication with {sasl.mechanism} at {self.address}: the broker's "
                        f"answer does not verify ({exc}); it does not hold the credential of "
                        f"{sasl.username!r}, or is not the broker it claims to be",
                        broker=self.address,
                        mechanism=sasl.mechanism,
                    ) from None
        lifetime_ms = response.session_lifetime_ms
        self.reauth_at = (
            anyio.current_time() + lifetime_ms / 1000 * random.uniform(REAUTH_AT_MIN, REAUTH_AT_MAX)
            if lifetime_ms > 0
            else None
        )

    def _refused(
        self, sasl: SaslSettings, response: SaslAuthenticateResponse
    ) -> AuthenticationFailedError:
        said = f": {response.error_message}" if response.error_message else ""
        if response.error == ErrorCode.UNSUPPORTED_SASL_MECHANISM:
            text = (
                f"the broker at {self.address} does not accept SASL mechanism "
                f"{sasl.mechanism} (UNSUPPORTED_SASL_MECHANISM{said})"
            )
        else:
            text = (
                f"authentication of {sasl.username!r} with {sasl.mechanism} at {self.address} "
                f"failed ({ErrorCode.name_of(response.error)}{said})"
            )
        return AuthenticationFailedError(
            text, broker=self.address, mechanism=sasl.mechanism, code=response.error
        )

    async def keep_authenticated(self) -> None:
        """Authenticate again at each `reauth_at` (KIP-368) until the connection closes; a
        refusal closes the connection and is kept in `auth_error`."""
        with self._reauth_scope:
            while self.reauth_at is not None and not self.closed:
                await anyio.sleep_until(self.reauth_at)
                try:
                    await self.authenticate()
                except AuthenticationFailedError as exc:
                    self.auth_error = exc
                    self._shutdown(f"re-authentication failed: {exc}")
                    return
                except ConnectionLostError:
                    return
                log.debug("re-authenticated with %s", self.address)

    async def run(self) -> None:
        """Read responses until the connection fails or `aclose` is called."""
        reason = "closed"
        with self._run_scope:
            try:
                # One scope for every receive, its deadline the oldest pending request's
                # (`_write` sets it when a request goes out with none pending): a scope
                # made per receive cost about 9 µs each, and the deadline changes only
                # when a request is sent or answered.
                with anyio.CancelScope() as scope:
                    self._recv_scope = scope
                    while True:
                        head = self._pending[0].deadline if self._pending else math.inf
                        if scope.deadline != head:
                            scope.deadline = head
                        data = await self._stream.receive(RECV_BYTES)
                        for body in self._decoder.feed_bodies(data):
                            self._dispatch(body)
                # Only the deadline's cancellation ends the loop without an exception.
                self._recv_scope = None
                reason = "request timed out"
            except anyio.EndOfStream:
                reason = "closed by the broker"
            except ssl.SSLError as exc:  # before OSError, its base
                self.tls_error = exc
                reason = f"TLS failed: {_tls_reason(exc)}"
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                reason = f"receive failed: {exc!r}"
            except FrameError as exc:
                reason = f"bad frame: {exc}"
            except _ProtocolViolation as exc:
                reason = str(exc)
        self._shutdown(reason)
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()

    def _dispatch(self, body: bytes) -> None:
        if not self._pending:
            raise _ProtocolViolation("response without a pending request")
        pending = self._pending[0]
        response = decode_response(body, pending.kind)
        if response.cid != pending.cid:
            raise _ProtocolViolation(f"response cid {response.cid!r}, expected {pending.cid}")
        self._pending.popleft()
        if response.error == ErrorCode.SASL_AUTHENTICATION_FAILED and pending.kind is not (
            SaslAuthenticateResponse
        ):
            # The listener wants SASL that this connection did not do (or its session ran
            # out): nothing will be answered until it does, so the connection ends here
            # and the Reconnector raises this from then on.
            self._pending.appendleft(pending)
            self.auth_error = AuthenticationFailedError(
                f"the broker at {self.address} requires SASL authentication (it answered "
                "SASL_AUTHENTICATION_FAILED): set security_protocol SASL_PLAINTEXT or "
                "SASL_SSL and sasl_mechanism"
                if self._sasl is None
                else f"the broker at {self.address} refused a request as unauthenticated "
                "(SASL_AUTHENTICATION_FAILED)",
                broker=self.address,
                mechanism="none" if self._sasl is None else self._sasl.mechanism,
            )
            raise _ProtocolViolation(str(self.auth_error))
        pending.callback(response, None)

    def _shutdown(self, reason: str) -> None:
        """Mark closed and fail every pending request; idempotent."""
        if not self.closed:
            self.closed = True
            self._close_reason = reason
            log.info("connection to %s closed: %s", self.address, reason)
        self._run_scope.cancel()
        self._reauth_scope.cancel()
        error = self._failure()
        while self._pending:
            self._pending.popleft().callback(None, error)

    def _failure(self) -> MinibrokerError:
        """What the requests of this closed connection fail with: the authentication failure
        that closed it (fatal, so no caller retries), else ConnectionLostError."""
        if self.auth_error is not None:
            return self.auth_error
        return ConnectionLostError(f"{self.address}: {self._close_reason}")

    async def aclose(self) -> None:
        self._shutdown("closed by the client")
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()


class _ProtocolViolation(Exception):
    pass


async def open_connection(
    task_group: anyio.abc.TaskGroup,
    host: str,
    port: int,
    *,
    client_id: str | None,
    timeout_s: float,
    max_response_bytes: int,
    security: ConnectionSecurity = PLAINTEXT_SECURITY,
) -> Connection:
    """Connect (with TLS when `security` says so), start the reader in `task_group`, check
    the broker speaks our APIs, and authenticate with SASL when `security` says so (the
    re-authentication task then runs in `task_group` too).

    AuthenticationFailedError when the TLS handshake or the SASL exchange fails;
    ConnectionLostError or MinibrokerTimeoutError when the broker cannot be reached."""
    address = f"{host}:{port}"
    connect_s = min(timeout_s, CONNECT_TIMEOUT_S)
    try:
        with anyio.fail_after(connect_s):
            stream = await _connect(host, port, security.tls)
    except TimeoutError as exc:
        raise MinibrokerTimeoutError(
            f"cannot connect to {address} (no answer within {connect_s:g} s)"
        ) from exc
    except ssl.SSLError as exc:  # before OSError, its base
        raise AuthenticationFailedError(
            f"TLS handshake with {address} failed: {_tls_reason(exc)}",
            broker=address,
            mechanism="TLS",
        ) from exc
    except OSError as exc:
        raise ConnectionLostError(f"cannot connect to {address} ({_reason(exc)})") from exc
    except (anyio.EndOfStream, anyio.BrokenResourceError) as exc:
        raise ConnectionLostError(
            f"cannot connect to {address} (closed during the TLS handshake: is it a TLS "
            "listener? security_protocol SSL and SASL_SSL need one)"
        ) from exc
    conn = Connection(
        stream,
        address,
        client_id=client_id,
        max_response_bytes=max_response_bytes,
        sasl=security.sasl,
        timeout_s=timeout_s,
    )
    conn.principal = security.principal
    task_group.start_soon(conn.run, name=f"minibroker-reader-{address}")
    stage = "ApiVersions"
    try:
        try:
            await _check_versions(conn, timeout_s, security.sasl)
            if security.sasl is not None:
                stage = "SaslAuthenticate"
                await conn.authenticate()
        except ConnectionLostError as exc:
            raise _opening_failed(conn, security, stage, exc) from exc
    except BaseException:
        await conn.aclose()
        raise
    if conn.reauth_at is not None:
        task_group.start_soon(conn.keep_authenticated, name=f"minibroker-reauth-{address}")
    return conn


async def _connect(host: str, port: int, tls: ssl.SSLContext | None) -> anyio.abc.ByteStream:
    if tls is None:
        return await anyio.connect_tcp(host, port)
    # Not standard_compatible: closing must not wait for the broker's close_notify (a
    # dead broker would hang the close), and frames carry their length, so a cut
    # stream is seen without TLS's closing handshake.
    return await anyio.connect_tcp(
        host, port, ssl_context=tls, tls_hostname=host, tls_standard_compatible=False
    )


async def _check_versions(conn: Connection, timeout_s: float, sasl: SaslSettings | None) -> None:
    response = await conn.request(ApiVersionsRequest(), timeout_s)
    conn.max_frame_bytes = _versions_checked(response, conn.address, sasl)


def _versions_checked(
    response: ApiVersionsResponse, address: str, sasl: SaslSettings | None
) -> int:
    """The broker's max_frame_bytes from its ApiVersions answer, once it is known to speak
    the APIs we need (and SASL when `sasl` is set); else the error that says why not."""
    if response.error != ErrorCode.NONE:
        raise MinibrokerError(
            f"ApiVersions to {address} failed: {ErrorCode.name_of(response.error)}",
            response.error,
        )
    missing = [api for api in REQUIRED_APIS if 1 not in _version_range(response.apis.get(api))]
    if missing:
        raise MinibrokerError(
            f"broker at {address} does not support v1 of {', '.join(missing)}",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    if sasl is not None and 1 not in _version_range(response.apis.get("SaslAuthenticate")):
        raise AuthenticationFailedError(
            f"the broker at {address} does not offer SASL (no SaslAuthenticate v1): "
            "is this listener's security sasl_plaintext or sasl_tls?",
            broker=address,
            mechanism=sasl.mechanism,
        )
    return response.max_frame_bytes


def _opening_failed(
    conn: Connection, security: ConnectionSecurity, stage: str, lost: ConnectionLostError
) -> MinibrokerError:
    """What a connection lost before it was ready (while `stage` was being answered)
    means: TLS refused after the handshake (TLS 1.3 checks the client's certificate
    then), a plaintext client at a TLS listener, or a connection lost."""
    address = conn.address
    if conn.tls_error is not None:
        return AuthenticationFailedError(
            f"TLS with {address} failed: {_tls_reason(conn.tls_error)} (the broker refused "
            "the connection: does it want a client certificate, ssl_certfile?)",
            broker=address,
            mechanism="TLS",
        )
    reason = str(lost).removeprefix(address + ": ")
    if stage != "ApiVersions":
        return ConnectionLostError(f"cannot connect to {address} ({reason} during {stage})")
    if security.tls is None:
        return ConnectionLostError(
            f"cannot connect to {address} ({reason} before answering ApiVersions): the "
            "listener may speak Kafka's protocol (protocol = \"kafka\", for Kafka's clients), "
            "not minibroker's; or, if it is a TLS listener, set security_protocol SSL or SASL_SSL"
        )
    # TLS 1.3 checks the client's certificate after the handshake, and a broker that
    # refuses it may just close the connection, without an alert to say why.
    return ConnectionLostError(
        f"cannot connect to {address} ({reason} right after the TLS handshake; does the "
        "broker want a client certificate, ssl_certfile?)"
    )


def _tls_reason(exc: ssl.SSLError) -> str:
    """What TLS said, as "certificate verify failed: Hostname mismatch, ..."."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    text = exc.reason or exc.strerror or str(exc)
    return str(text).replace("_", " ").lower()


def _reason(exc: OSError) -> str:
    """What the network said, as "connection refused": anyio wraps the error of each
    address tried in "All connection attempts failed", whose cause is the last one."""
    while exc.errno is None and isinstance(exc.__cause__, OSError):
        exc = exc.__cause__
    if exc.errno is not None and exc.errno > 0:
        text = os.strerror(exc.errno)
    else:  # a resolver error (negative errno) or none: its own words
        text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _version_range(versions: Any) -> range:
    if isinstance(versions, (list, tuple)) and len(versions) == 2:
        return range(int(versions[0]), int(versions[1]) + 1)
    return range(0)


class Reconnector:
    """The one live connection of a client, reopened on demand with exponential backoff.

    Bootstrap servers are tried in turn; after a failure the next attempt waits
    reconnect_backoff_ms doubling up to reconnect_backoff_max_ms.

    Until a broker has been reached once, a refused address is far more often a
    mistake (a wrong port, a broker not started) than a passing failure, so a caller
    that asks for it (`fail_unreached`) gets NoBrokersAvailable once the attempts of
    one backoff cycle have failed: those until the backoff reaches
    reconnect_backoff_max_ms, and at least one per bootstrap server (with Kafka's
    defaults, 50 ms doubling to 1 s: 6 attempts in about 1.6 s). kafka-python's
    constructor and aiokafka's start() give up on an unreachable bootstrap the same
    way. Once a broker was reached, a lost connection is retried as long as the
    caller waits (max_block_ms, delivery_timeout_ms, request_timeout_ms).

    An AuthenticationFailedError (TLS or SASL refused, at connect or at a later
    re-authentication) is kept: `get` raises it from then on without connecting
    again, so a client with wrong credentials fails at once, every time."""

    def __init__(
        self,
        servers: list[tuple[str, int]],
        *,
        client_id: str | None,
        timeout_s: float,
        max_response_bytes: int,
        backoff_ms: float,
        backoff_max_ms: float,
        security: ConnectionSecurity = PLAINTEXT_SECURITY,
    ) -> None:
        self.servers = servers
        self.security = security
        self.auth_error: AuthenticationFailedError | None = None
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self.backoff_ms = backoff_ms
        self.backoff_max_ms = backoff_max_ms
        self.failures = 0  # consecutive, for the backoff
        self.total_failures = 0
        self.next_attempt_ms = 0.0
        self.current: Connection | None = None
        self.last_error: BaseException | None = None  # for a timeout's message
        self.reached = False  # whether any connection was ever made
        self.unreached_attempts = max(len(servers), _attempts_to_max(backoff_ms, backoff_max_ms))
        self._errors: dict[str, BaseException] = {}  # the last one per server, for the message
        self._first_failure_ms = 0.0
        self._server_index = 0
        self._lock = anyio.Lock()

    @property
    def connected(self) -> bool:
        return self.current is not None and not self.current.closed

    async def get(
        self, task_group: anyio.abc.TaskGroup, *, block: bool = True, fail_unreached: bool = False
    ) -> Connection | None:
        """The live connection, connecting if needed.

        block=True waits out backoffs and failures until a connection is up (the
        caller bounds it with a timeout); block=False returns None instead.
        fail_unreached: raise NoBrokersAvailable instead of waiting on when no broker
        was ever reached and this call's attempt ended the backoff cycle (class doc)."""
        conn = self.current
        if conn is not None and not conn.closed:
            return conn
        self._check_authenticated()
        if not block and self._lock.locked():
            return None  # someone else is connecting (or waiting out a backoff)
        async with self._lock:
            attempted = False
            while True:
                conn = self.current
                if conn is not None and not conn.closed:
                    return conn
                self._check_authenticated()
                if (
                    fail_unreached
                    and attempted
                    and not self.reached
                    and self.failures >= self.unreached_attempts
                ):
                    raise self._unreachable()
                wait_ms = self.next_attempt_ms - time.monotonic() * 1000
                if wait_ms > 0:
                    if not block:
                        return None
                    await anyio.sleep(wait_ms / 1000)
                host, port = self.servers[self._server_index % len(self.servers)]
                attempted = True
                try:
                    self.current = await open_connection(
                        task_group,
                        host,
                        port,
                        client_id=self.client_id,
                        timeout_s=self.timeout_s,
                        max_response_bytes=self.max_response_bytes,
                        security=self.security,
                    )
                    self.failures = 0
                    self.reached = True
                except AuthenticationFailedError as exc:
                    self.auth_error = self.last_error = exc
                    log.info("connect to %s:%s failed for good: %s", host, port, exc)
                    raise
                except (ConnectionLostError, MinibrokerTimeoutError) as exc:
                    self.last_error = exc
                    self._errors[f"{host}:{port}"] = exc
                    if not self.failures:
                        self._first_failure_ms = time.monotonic() * 1000
                    self.failures += 1
                    self.total_failures += 1
                    self._server_index += 1
                    backoff = min(
                        self.backoff_ms * 2 ** min(self.failures - 1, 20), self.backoff_max_ms
                    )
                    self.next_attempt_ms = time.monotonic() * 1000 + backoff
                    log.info(
                        "connect to %s:%s failed (%s); next try in %.0f ms",
                        host,
                        port,
                        exc,
                        backoff,
                    )
                    if not block:
                        return None

    def _check_authenticated(self) -> None:
        """Raise the authentication failure met before, by this connector or by its last
        connection (refused at re-authentication, or wanting SASL it was not given)."""
        if self.auth_error is None and self.current is not None:
            self.auth_error = self.current.auth_error
        if self.auth_error is not None:
            raise self.auth_error

    def _unreachable(self) -> NoBrokersAvailable:
        """'cannot connect to HOST:PORT (connection refused) after 6 attempts in 1.6 s',
        naming each server's last error, with the last one as the cause."""
        seconds = (time.monotonic() * 1000 - self._first_failure_ms) / 1000
        what = " or ".join(
            str(error).removeprefix("cannot connect to ") for error in self._errors.values()
        )
        error = NoBrokersAvailable(
            f"cannot connect to {what} after {self.failures} attempts in {seconds:.1f} s"
        )
        error.__cause__ = self.last_error
        return error

    async def aclose(self) -> None:
        if self.current is not None:
            await self.current.aclose()


def _attempts_to_max(backoff_ms: float, backoff_max_ms: float) -> int:
    """How many failed attempts make the backoff reach its maximum (one at least)."""
    attempts = 1
    backoff = backoff_ms
    while 0 < backoff < backoff_max_ms:
        backoff *= 2
        attempts += 1
    return attempts


class BlockingConnection:
    """A connection used with blocking calls, one request at a time, from one thread at a
    time: the sync faces' lookups made on the caller's thread (`DirectRequests`), with
    no event loop and no thread hop in the path. Opened with the client's TLS context
    and the same ApiVersions check as `open_connection`; it does no SASL. Any failure,
    a timeout among them, closes it and raises ConnectionLostError."""

    def __init__(
        self, sock: socket.socket, address: str, *, client_id: str | None, max_response_bytes: int
    ) -> None:
        self.address = address
        self._sock: socket.socket | None = sock
        self._client_id = client_id
        self._max_response_bytes = max_response_bytes
        self._next_cid = 0

    @classmethod
    def open(
        cls,
        host: str,
        port: int,
        *,
        client_id: str | None,
        tls: ssl.SSLContext | None,
        max_response_bytes: int,
        deadline: float,
    ) -> BlockingConnection:
        """Connect (TLS when `tls` is set) and check the broker's versions by `deadline`
        (time.monotonic()). ConnectionLostError when that fails; MinibrokerError when the
        broker lacks the APIs."""
        address = f"{host}:{port}"
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection(
                (host, port), timeout=min(max(deadline - time.monotonic(), 0), CONNECT_TIMEOUT_S)
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except OSError as exc:  # ssl.SSLError and TimeoutError among them
            if sock is not None:
                sock.close()
            raise ConnectionLostError(f"cannot connect to {address} ({_reason(exc)})") from exc
        conn = cls(sock, address, client_id=client_id, max_response_bytes=max_response_bytes)
        try:
            _versions_checked(conn.request(ApiVersionsRequest(), deadline), address, None)
        except BaseException:
            conn.close()
            raise
        return conn

    def request(self, request: Request, deadline: float) -> Any:
        """Send `request` and wait until `deadline` (time.monotonic()) for its typed answer."""
        sock = self._sock
        if sock is None:
            raise ConnectionLostError(f"{self.address}: closed")
        cid = self._next_cid
        self._next_cid = 0 if cid >= CID_MAX else cid + 1
        body = encode_request(request, cid, self._client_id)
        try:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:  # a timeout of 0 would make the socket non-blocking
                raise TimeoutError
            sock.settimeout(remaining_s)
            sock.sendall(LENGTH.pack(len(body)) + body)
            response = decode_response(self._receive(sock), request.response)
            if response.cid != cid:
                raise _ProtocolViolation(f"response cid {response.cid!r}, expected {cid}")
        except TimeoutError as exc:
            self.close()
            raise ConnectionLostError(f"{self.address}: request timed out") from exc
        except (OSError, FrameError, _ProtocolViolation) as exc:
            self.close()
            raise ConnectionLostError(f"{self.address}: {exc}") from exc
        return response

    def _receive(self, sock: socket.socket) -> memoryview:
        """One answer's body: the first read usually holds it all; the rest of a longer one
        is received into one buffer sized from its length prefix."""
        head = sock.recv(RECV_BYTES)
        while len(head) < LENGTH.size:
            more = sock.recv(RECV_BYTES)
            if not more:
                raise _ProtocolViolation("closed by the broker")
            head += more
        (length,) = LENGTH.unpack_from(head)
        if length > self._max_response_bytes:
            raise FrameTooLarge(length, self._max_response_bytes)
        have = len(head) - LENGTH.size
        if have > length:
            raise _ProtocolViolation("bytes after the answer, with no request pending")
        if have == length:
            return memoryview(head)[LENGTH.size :]
        body = memoryview(bytearray(length))
        body[:have] = memoryview(head)[LENGTH.size :]
        while have < length:
            got = sock.recv_into(body[have:])
            if not got:
                raise _ProtocolViolation("closed by the broker")
            have += got
        return body

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


class DirectRequests:
    """The sync faces' lookups made on the caller's thread, over a `BlockingConnection`
    of their own beside the `Reconnector` whose connection the event loop runs: no
    thread hop and no turn of the loop (docs/benchmark-notes.md, "The sync SDK's round
    trip"). It decides nothing a failure needs: without a connection of the
    Reconnector's to follow, with SASL, while another thread uses it, or when its
    connection fails, `request` returns None and the caller makes the request through
    the event loop, whose connection reconnects, retries, authenticates and says what
    failed, as before."""

    def __init__(self, connector: Reconnector) -> None:
        self._connector = connector
        self._conn: BlockingConnection | None = None
        self._lock = threading.Lock()
        # SASL is left to the event loop's connection: its session would need re-auth.
        self._usable = connector.security.sasl is None
        self._next_open = 0.0  # time.monotonic() before which no connection is opened

    def request(self, request: Request, deadline: float) -> Any | None:
        """The answer to `request`, or None when it cannot be had here (class doc).
        ConnectionLostError when it failed and `deadline` (time.monotonic()) has passed:
        the caller's time is up, as the event loop's retries would have found."""
        if not self._usable or not self._lock.acquire(blocking=False):
            return None
        try:
            conn = self._conn or self._open(deadline)
            if conn is None:
                return None
            response = conn.request(request, deadline)
        except ConnectionLostError as exc:
            log.debug("direct request failed: %s", exc)
            self._conn = None
            if time.monotonic() >= deadline:
                raise
            return None
        finally:
            self._lock.release()
        if response.error == ErrorCode.SASL_AUTHENTICATION_FAILED:
            # The listener wants SASL: the event loop's connection says so to the caller.
            self.close()
            return None
        return response

    def _open(self, deadline: float) -> BlockingConnection | None:
        """A connection to the broker the Reconnector's connection is up with, or None
        (none is up, or opening failed: tried again after reconnect_backoff_max_ms).
        ConnectionLostError when opening failed at `deadline`: no time is left to go
        through the event loop."""
        current = self._connector.current
        if current is None or current.closed or time.monotonic() < self._next_open:
            return None
        host, port = current.address.rsplit(":", 1)
        try:
            self._conn = BlockingConnection.open(
                host,
                int(port),
                client_id=self._connector.client_id,
                tls=self._connector.security.tls,
                max_response_bytes=self._connector.max_response_bytes,
                deadline=deadline,
            )
        except MinibrokerError as exc:  # ConnectionLostError among them
            log.debug("direct connection to %s failed: %s", current.address, exc)
            self._next_open = time.monotonic() + self._connector.backoff_max_ms / 1000
            if isinstance(exc, ConnectionLostError) and time.monotonic() >= deadline:
                raise
            return None
        return self._conn

    def close(self) -> None:
        """Close the connection (once a lookup in progress on another thread has ended);
        from now on every request goes through the event loop."""
        with self._lock:
            self._usable = False
            if self._conn is not None:
                self._conn.close()
                self._conn = None
