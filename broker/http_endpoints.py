"""The broker's operations endpoint: `/metrics`, `/healthz`, `/readyz` over HTTP/1.1.

A deliberately tiny server on AnyIO, so it runs in the broker's own event loop
under trio and asyncio alike and needs no dependency:

- ``GET /metrics`` - the Prometheus text exposition of `BrokerMetrics`;
- ``GET /healthz`` - 200 ``ok`` as long as the process serves at all (liveness);
- ``GET /readyz``  - 200 ``ready`` once ``is_ready()`` is true (log recovery
  finished), else 503 ``not ready`` (readiness);
- any other path 404, any method but GET (and HEAD, which RFC 9110 asks every
  server that answers GET to answer too) 405 with ``Allow: GET, HEAD``.

One request per connection (``Connection: close``): scrapers and probes open a
connection per request anyway. The request head is capped at
`MAX_REQUEST_BYTES` (431 beyond), must arrive within `READ_TIMEOUT_S` (the
connection is dropped otherwise), and at most `MAX_CONCURRENT` connections are
served at once, so a slow or hostile peer on the metrics port cannot pin the
broker's memory or its event loop. A request body, if any, is ignored.

Rendering runs on the event loop thread, which is also the thread that updates
the metrics, as `broker.metrics` requires.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus

from broker.metrics import BrokerMetrics

__all__ = ["MAX_REQUEST_BYTES", "READ_TIMEOUT_S", "serve_http"]

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_CONCURRENT = 32
LINGER_S = 1.0
LINGER_BYTES = 1 << 20

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_TEXT = "text/plain; charset=utf-8"


class _BadRequest(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


async def serve_http(
    host: str,
    port: int,
    metrics: BrokerMetrics,
    is_ready: Callable[[], bool],
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled. Reports the bound port (the real one when `port` is 0)
    through ``task_status.started``: ``port = await tg.start(serve_http, ...)``."""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
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
        try:
            with anyio.fail_after(READ_TIMEOUT_S):
                head = await _read_head(stream)
            method, path = _parse_request_line(head)
            status, content_type, body, extra = _route(method, path, metrics, is_ready)
        except _BadRequest as exc:
            status, content_type, body, extra = exc.status, _TEXT, _REASONS[exc.status].encode(), {}
            method = "GET"
        except TimeoutError:
            return  # a peer that does not finish its request in time gets nothing
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return  # the peer went away first
        except Exception:
            log.exception("event=http_handler_failed")
            status, content_type, body, extra = 500, _TEXT, b"internal error\n", {}
            method = "GET"
        lines = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Cache-Control: no-store",
            "Connection: close",
            *(f"{k}: {v}" for k, v in extra.items()),
        ]
        response = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if method != "HEAD":
            response += body
        try:
            with anyio.fail_after(WRITE_TIMEOUT_S):
                await stream.send(response)
            if status >= 400:
                await _linger(stream)
        except (TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass


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


async def _read_head(stream: SocketStream) -> bytes:
    """Bytes up to the blank line that ends the request head (HTTP/1.0 and 1.1)."""
    buf = bytearray()
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            return bytes(buf[:end])
        if len(buf) >= MAX_REQUEST_BYTES:
            raise _BadRequest(431)
        try:
            chunk = await stream.receive(MAX_REQUEST_BYTES)
        except anyio.EndOfStream:
            # Some clients send a bare "GET / HTTP/1.0\n\n"; accept LF-only heads at EOF.
            if b"\n\n" in buf:
                return bytes(buf[: buf.find(b"\n\n")])
            raise
        buf += chunk
        if len(buf) > MAX_REQUEST_BYTES and buf.find(b"\r\n\r\n", 0, MAX_REQUEST_BYTES) < 0:
            raise _BadRequest(431)


def _parse_request_line(head: bytes) -> tuple[str, str]:
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        raise _BadRequest(400)
    try:
        method = parts[0].decode("ascii")
        target = parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise _BadRequest(400) from None
    if not method.isalpha() or not method.isupper():
        raise _BadRequest(400)
    # origin-form ("/metrics?x=y") or absolute-form ("http://host:port/metrics")
    if target.startswith(("http://", "https://")):
        slash = target.find("/", target.find("//") + 2)
        target = target[slash:] if slash >= 0 else "/"
    path = target.split("?", 1)[0].split("#", 1)[0]
    return method, path


def _route(
    method: str, path: str, metrics: BrokerMetrics, is_ready: Callable[[], bool]
) -> tuple[int, str, bytes, dict[str, str]]:
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
