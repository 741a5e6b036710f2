"""The broker's operations endpoint: `/metrics`, `/healthz`, `/readyz` over HTTP/1.1.

A tiny server on AnyIO, so it runs in the broker's own event loop under trio and
asyncio alike; `h11` turns the bytes into request events and the response events
back into bytes, so no HTTP is parsed here by hand:

- ``GET /metrics`` - the Prometheus text exposition of `BrokerMetrics`;
- ``GET /healthz`` - 200 ``ok`` as long as the process serves at all (liveness);
- ``GET /readyz``  - 200 ``ready`` once ``is_ready()`` is true (log recovery
  finished), else 503 ``not ready`` (readiness);
- any other path 404, any method but GET (and HEAD, which RFC 9110 asks every
  server that answers GET to answer too) 405 with ``Allow: GET, HEAD``; a request
  h11 refuses (a bad request line, an HTTP/1.1 request without ``Host``) 400.

`MetricsAccess` secures it as Prometheus's exporters do (their web configuration):
TLS on every path when the broker has a certificate for it, and HTTP basic auth
against bcrypt hashes on /metrics (401 with ``WWW-Authenticate: Basic`` without the
right credentials). The probes stay open: Kubernetes and Docker health checks
cannot send credentials, and they show no more than "ok" and "ready". bcrypt is
slow on purpose, so it runs in a worker thread, one check at a time, and a
successful check is remembered for `AUTH_CACHE_S`: a scrape every 15 s costs one
bcrypt a minute, not one per scrape.

Why not prometheus-client's own `start_http_server`: it serves from a wsgiref
thread, so the scrape would read the broker's lock-free counters and its
partition state off the event loop thread, which `broker.metrics` forbids, and
wsgiref sets no limit on a request's size or time. The exposition itself is still
prometheus-client's (`BrokerMetrics.render`).

One request per connection (``Connection: close``): scrapers and probes open a
connection per request, or come back after longer than a keep-alive connection
would be worth holding open. The request head is capped at `MAX_REQUEST_BYTES`
(431 beyond), must arrive within `READ_TIMEOUT_S` (the connection is dropped
otherwise), and at most `MAX_CONCURRENT` connections are served at once, so a
slow or hostile peer on the metrics port cannot pin the broker's memory or its
event loop. A request body, if any, is ignored.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import bcrypt
import h11
from anyio.abc import ByteStream, Listener, SocketAttribute, SocketStream, TaskStatus

from broker.metrics import BrokerMetrics
from broker.network import tls

__all__ = [
    "AUTH_CACHE_S",
    "MAX_REQUEST_BYTES",
    "READ_TIMEOUT_S",
    "BasicAuth",
    "MetricsAccess",
    "serve_http",
]

log = logging.getLogger(f"minibroker.{__name__}")

MAX_REQUEST_BYTES = 8192
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_CONCURRENT = 32
LINGER_S = 1.0
LINGER_BYTES = 1 << 20

AUTH_CACHE_S = 60.0
_TEXT = "text/plain; charset=utf-8"
_CHALLENGE = {"WWW-Authenticate": 'Basic realm="minibroker", charset="UTF-8"'}
_PROTECTED = frozenset({"/metrics"})

# status, Content-Type, body, extra headers
_Answer = tuple[int, str, bytes, dict[str, str]]


class BasicAuth:
    """HTTP basic auth against bcrypt hashes (`metrics_basic_auth_users`).

    Every user and password checked takes a bcrypt, a wrong one too: an unknown user is
    checked against a hash no password has, of the largest configured cost, so the time
    of an answer does not say whether the user exists (a header that is not basic auth
    at all is refused without one). A success is remembered per user as an HMAC of the
    credentials under a key of this process, compared in constant time, for
    `AUTH_CACHE_S`; a failure is never remembered."""

    def __init__(self, users: Sequence[tuple[str, str]]) -> None:
        self._users = {user: hashed.encode("ascii") for user, hashed in users}
        cost = max(int(hashed[4:6]) for _, hashed in users)
        # A salt of that cost and a hash no password produces: checkpw only reads the salt.
        self._unknown = bcrypt.gensalt(cost) + b"." * 31
        self._key = os.urandom(32)
        self._remembered: dict[str, tuple[bytes, float]] = {}
        # One bcrypt at a time: guesses cannot take more than one core from the broker.
        self._limiter = anyio.CapacityLimiter(1)

    async def check(self, authorization: bytes | None) -> bool:
        """Whether an ``Authorization`` header's value names a user with its password."""
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self._users.get(user)
        digest = hmac.new(self._key, user.encode() + b"\0" + password, hashlib.sha256).digest()
        now = time.monotonic()
        remembered = self._remembered.get(user)
        if (
            hashed is not None
            and remembered is not None
            and remembered[1] > now
            and hmac.compare_digest(remembered[0], digest)
        ):
            return True
        async with self._limiter:
            ok = await anyio.to_thread.run_sync(_checkpw, password, hashed or self._unknown)
        if ok and hashed is not None:
            self._remembered[user] = (digest, now + AUTH_CACHE_S)
            return True
        return False


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # bcrypt takes at most 72 bytes, and no NUL in some versions
        return False


def _basic_credentials(authorization: bytes | None) -> tuple[str, bytes] | None:
    """(user, password) of ``Basic base64(user:password)`` (RFC 7617), else None."""
    if authorization is None:
        return None
    scheme, _, encoded = authorization.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
        user, colon, password = decoded.partition(b":")
        name = user.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (name, password) if colon else None


@dataclass
class MetricsAccess:
    """How the metrics server secures its connections: TLS when `tls_context` is set (read
    at each connection, so SIGHUP can replace it) and basic auth on /metrics when `users`
    is."""

    tls_context: ssl.SSLContext | None = None
    users: BasicAuth | None = None


async def serve_http(
    listener: Listener[SocketStream],
    metrics: BrokerMetrics,
    is_ready: Callable[[], bool],
    access: MetricsAccess | None = None,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on `listener` until cancelled, secured as `access` says (plain HTTP, open to
    all, without it). Reports the port it listens on (the real one when it was bound to
    port 0) through ``task_status.started``:
    ``port = await tg.start(serve_http, listener, ...)``."""
    limiter = anyio.CapacityLimiter(MAX_CONCURRENT)
    access = access or MetricsAccess()

    async def handle(stream: SocketStream) -> None:
        async with limiter:
            secured = await _secure(stream, access)
            if secured is not None:
                await _handle(secured, metrics, is_ready, access)

    async with listener:
        bound = listener.extra(SocketAttribute.local_port)
        task_status.started(bound)
        await listener.serve(handle)


async def _secure(stream: SocketStream, access: MetricsAccess) -> ByteStream | None:
    """`stream`, or a TLS stream over it when the server speaks TLS; None (closed) when
    the handshake fails: a scraper speaking plain HTTP, a certificate it refuses."""
    context = access.tls_context
    if context is None:
        return stream
    try:
        return await tls.handshake(stream, context, int(READ_TIMEOUT_S * 1000))
    except tls.HandshakeFailed as exc:
        peer = stream.extra(SocketAttribute.remote_address, "?")
        log.warning("event=metrics_tls_handshake_failed peer=%s reason=%r", peer, str(exc))
        await anyio.aclose_forcefully(stream)
        return None


async def _handle(
    stream: ByteStream,
    metrics: BrokerMetrics,
    is_ready: Callable[[], bool],
    access: MetricsAccess,
) -> None:
    async with stream:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
        try:
            with anyio.fail_after(READ_TIMEOUT_S):
                request = await _read_request(stream, conn)
        except h11.RemoteProtocolError as exc:
            request = None
            status = exc.error_status_hint
            answer: _Answer = (status, _TEXT, f"{HTTPStatus(status).phrase}\n".encode(), {})
        except TimeoutError:
            return  # a peer that does not finish its request in time gets nothing
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return  # the peer went away first
        else:
            if request is None:
                return  # connected and closed without a request
            answer = await _answer(request, metrics, is_ready, access)
        status, content_type, body, extra = answer
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("Connection", "close"),
            *extra.items(),
        ]
        response = conn.send(
            h11.Response(status_code=status, reason=HTTPStatus(status).phrase, headers=headers)
        )
        # h11 frames a HEAD response as bodiless and refuses Data for it.
        if request is None or request.method != b"HEAD":
            response += conn.send(h11.Data(data=body))
        response += conn.send(h11.EndOfMessage())
        try:
            with anyio.fail_after(WRITE_TIMEOUT_S):
                await stream.send(response)
            if status >= 400:
                await _linger(stream)
        except (TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass


async def _read_request(stream: ByteStream, conn: h11.Connection) -> h11.Request | None:
    """The request head, or None if the peer closed before sending any byte.

    Raises `h11.RemoteProtocolError` for a malformed or oversized head, and for one
    cut short by the peer's EOF; its ``error_status_hint`` is the status to answer."""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            return event
        if isinstance(event, h11.ConnectionClosed):
            return None
        try:
            data = await stream.receive(MAX_REQUEST_BYTES)
        except anyio.EndOfStream:
            data = b""  # h11's signal for EOF
        conn.receive_data(data)


async def _answer(
    request: h11.Request,
    metrics: BrokerMetrics,
    is_ready: Callable[[], bool],
    access: MetricsAccess,
) -> _Answer:
    # origin-form ("/metrics?x=y") or absolute-form ("http://host:port/metrics");
    # h11 has already checked that the target is visible ASCII.
    try:
        path = urlsplit(request.target.decode("ascii")).path or "/"
    except ValueError:  # e.g. a malformed IPv6 host in an absolute-form target
        return 400, _TEXT, b"Bad Request\n", {}
    if access.users is not None and path in _PROTECTED:
        values = [value for name, value in request.headers if name == b"authorization"]
        if len(values) > 1 or not await access.users.check(values[0] if values else None):
            return 401, _TEXT, b"unauthorized\n", _CHALLENGE
    try:
        return _route(request.method.decode("ascii"), path, metrics, is_ready)
    except Exception:
        log.exception("event=http_handler_failed")
        return 500, _TEXT, b"internal error\n", {}


async def _linger(stream: ByteStream) -> None:
    """Half-close and discard what the peer still sends, briefly, before closing.

    Closing a socket with unread request bytes makes the kernel send RST, which can
    destroy our error response before the peer reads it (the classic "lingering
    close" problem of HTTP servers). Bounded in time and bytes."""
    with contextlib.suppress(NotImplementedError):  # TLS cannot half-close: just drain
        await stream.send_eof()
    with anyio.move_on_after(LINGER_S):
        drained = 0
        while drained < LINGER_BYTES:
            try:
                drained += len(await stream.receive(65536))
            except anyio.EndOfStream:
                break


def _route(method: str, path: str, metrics: BrokerMetrics, is_ready: Callable[[], bool]) -> _Answer:
    if path not in ("/metrics", "/healthz", "/readyz"):
        return 404, _TEXT, b"not found\n", {}
    if method not in ("GET", "HEAD"):
        return 405, _TEXT, b"method not allowed\n", {"Allow": "GET, HEAD"}
    if path == "/metrics":
        body, content_type = metrics.render()
        return 200, content_type, body, {}
    if path == "/healthz":
        return 200, _TEXT, b"ok\n", {}
    if is_ready():
        return 200, _TEXT, b"ready\n", {}
    return 503, _TEXT, b"not ready\n", {}
