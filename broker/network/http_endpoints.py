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

import logging
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit

import anyio
import h11
from anyio.abc import Listener, SocketAttribute, SocketStream, TaskStatus

from broker.metrics import BrokerMetrics

__all__ = ["MAX_REQUEST_BYTES", "READ_TIMEOUT_S", "serve_http"]

log = logging.getLogger(f"minibroker.{__name__}")

MAX_REQUEST_BYTES = 8192
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_CONCURRENT = 32
LINGER_S = 1.0
LINGER_BYTES = 1 << 20

_TEXT = "text/plain; charset=utf-8"

# status, Content-Type, body, extra headers
_Answer = tuple[int, str, bytes, dict[str, str]]


async def serve_http(
    listener: Listener[SocketStream],
    metrics: BrokerMetrics,
    is_ready: Callable[[], bool],
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on `listener` until cancelled. Reports the port it listens on (the real one
    when it was bound to port 0) through ``task_status.started``:
    ``port = await tg.start(serve_http, listener, ...)``."""
    limiter = anyio.CapacityLimiter(MAX_CONCURRENT)

    async def handle(stream: SocketStream) -> None:
        async with limiter:
            await _handle(stream, metrics, is_ready)

    async with listener:
        bound = listener.extra(SocketAttribute.local_port)
        task_status.started(bound)
        await listener.serve(handle)


async def _handle(
    stream: SocketStream, metrics: BrokerMetrics, is_ready: Callable[[], bool]
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
            answer = _answer(request, metrics, is_ready)
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


async def _read_request(stream: SocketStream, conn: h11.Connection) -> h11.Request | None:
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


def _answer(request: h11.Request, metrics: BrokerMetrics, is_ready: Callable[[], bool]) -> _Answer:
    # origin-form ("/metrics?x=y") or absolute-form ("http://host:port/metrics");
    # h11 has already checked that the target is visible ASCII.
    try:
        path = urlsplit(request.target.decode("ascii")).path or "/"
    except ValueError:  # e.g. a malformed IPv6 host in an absolute-form target
        return 400, _TEXT, b"Bad Request\n", {}
    try:
        return _route(request.method.decode("ascii"), path, metrics, is_ready)
    except Exception:
        log.exception("event=http_handler_failed")
        return 500, _TEXT, b"internal error\n", {}


async def _linger(stream: SocketStream) -> None:
    """Half-close and discard what the peer still sends, briefly, before closing.

    Closing a socket with unread request bytes makes the kernel send RST, which can
    destroy our error response before the peer reads it (the classic "lingering
    close" problem of HTTP servers). Bounded in time and bytes."""
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
