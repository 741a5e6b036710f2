"""The connections on AnyIO: accepted on every listener, read, run in order, answered.

Each connection has a reader that decodes frames and runs requests strictly
in order, and a writer that sends replies in that same order. A request whose
answer waits only for the disk (an acks=-1 Produce's batches, a TxnOffsetCommit
written and in force: `DurableReply`, `SyncedReply`) holds up no request behind
it: the reader goes on while the writer waits for that answer's turn. The reader may
run ahead of the writer (pipelining) by up to
`max_inflight_requests_per_connection` requests and
`queued_max_response_bytes` bytes of answers; past either it
stops reading and TCP pushes back on the client. Both bounds matter: the send
blocks on both backends, but answers built ahead of it wait in the queue, and a
few hundred unread Fetch answers are gigabytes.

When the writer is idle, the reader sends a read's whole-frame answers itself
with one non-blocking send, and leaves the writer only what the socket did not
take: it saves a task switch per read. On asyncio, connections are
`asyncio_stream.ReadAheadStream`s, whose transport keeps reading while the
reader works; there the reader sends only when nothing more has arrived, the
transport holds nothing unsent, the connection has authenticated and the read
held more than Produce runs, so a pipelining client's answers still wait for the
loop's turn and its next requests come in larger reads. Bytes that wait already
(on trio after a read cut at its size, on asyncio whatever the read-ahead holds)
are read after the loop's turn without a cancel scope for the timeout, and a
read's requests enter a shielding scope only when one may await: a run of Produce
requests never does. A trio cancel scope costs about what a batch's decode does
(docs/benchmark-notes.md, "broker").

The broker serves each of its listeners (config `listeners`, or the one plaintext
listener at host:port). A `tls`/`sasl_tls` connection is handshaken first
(`tls.py`) and never sent from files with sendfile; on a `sasl_*` listener every
request passes the session's SASL state before it runs (broker/api/security.py,
broker/security/sasl.py).

The server knows the APIs by what it asks of them (`Dispatcher`, `Sessions`) and by
what a request comes to (broker/api/outcomes.py); the composition root, broker/app.py,
hands it the ones it built.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, cast

import anyio
from anyio.abc import ByteStream, SocketListener, SocketStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from anyio.streams.tls import TLSStream

from broker.api import (
    DISK_FAILURES,
    Answer,
    DurableReply,
    NoAnswer,
    Outcome,
    SplicedReply,
    SyncedReply,
)
from broker.clock import monotonic_ms
from broker.config import BrokerConfig, Listener
from broker.kafka import KafkaCodec
from broker.metrics import BrokerMetrics
from broker.network import asyncio_stream, limits, tls
from broker.network.asyncio_stream import ReadAheadStream
from broker.network.listeners import Listeners, Served
from broker.security import Admission, SaslPolicy, Session, canonical_host
from protocol.errors import ErrorCode, ProtocolError
from protocol.framing import FrameDecoder, FrameError, FrameTooLarge, OtherProtocol, frame
from protocol.messages import (
    REQUEST_TYPES,
    ProduceRequest,
    Request,
    RequestRefused,
    Response,
    decode_request,
    encode_response,
    error_response,
)

log = logging.getLogger(f"minibroker.{__name__}")

RECEIVE_BYTES = 256 * 1024
# A Fetch answer's record bytes read from a log file at a time, where they cannot go
# with sendfile (TLS): one TLS send's worth of memory, not the whole answer.
COPY_CHUNK_BYTES = 256 * 1024
# Accept failures that mean "not now" (out of descriptors or memory, a peer gone before
# its accept): the listener logs, waits and accepts again instead of ending the broker.
ACCEPT_RETRY_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}
)
ACCEPT_RETRY_MS = 100
# One read from an asyncio connection's read-ahead: a pipelining client's whole window
# (64 batches of 16 KiB) at once, as much as the read-ahead holds by default. At 1 MiB,
# 64 frames of Kafka's v2 batches (1.025 MiB) no longer fit: every read cut a frame,
# and the reader's turns fell from about 25 batches to 13 (docs/benchmark-notes.md,
# "kafka"). Its frames are decoded inflight_max at a time, so a read of tiny requests
# costs the read, not a frame view per request.
READ_AHEAD_RECEIVE_BYTES = 2 * 1024 * 1024
# Longest run of one connection's requests before the others get the event
# loop: a read can hold hundreds of requests, each up to max_entries_per_request.
TURN_S = 0.01
# Fetch answers whose batches are converted (codec.convert) at a time, each in a worker
# thread: each holds up to fetch_max_bytes twice (read, converted) meanwhile.
CONVERSIONS_MAX = 2
# Most topic and partition entries (about one batch each) one run of Produce requests
# takes before the reader looks at the clock again; one request alone may name up to
# max_entries_per_request.
RUN_ENTRIES_MAX = 512


@dataclass(frozen=True, slots=True)
class AwaitingDurability:
    """An answer the writer sends once what it rests on is on disk: an acks=-1 Produce's
    batches, or the records of a change already in force (`SyncedReply`)."""

    cid: int
    started_s: float
    api: str
    reply: DurableReply | SyncedReply


@dataclass(frozen=True, slots=True)
class SplicedFrame:
    """A Fetch answer whose record bytes the writer sends from the log files."""

    pieces: list[bytes | int]
    reply: SplicedReply
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Decoded:
    """A request decoded ahead of its turn, back in the backlog."""

    request: Request | bytes | NoAnswer | CloseConnection


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """The request cannot be answered at all: close (docs/protocol.md section 1)."""

    reason: str


class Codec(Protocol):
    """A listener's wire protocol: a frame body in, the broker's request (or, when the
    protocol answers it alone, the response frame) out; the broker's response out as a
    frame. FrameError from `decode`: close the connection."""

    def decode(self, body: bytes | memoryview) -> Request | bytes: ...

    def encode(self, response: Response, cid: int) -> bytes: ...

    def pieces(self, reply: SplicedReply, cid: int) -> list[bytes | int]: ...

    def converts(self, outcome: Outcome) -> bool:
        """Whether `outcome` must go through `convert` (in a worker thread) first."""
        ...

    def convert(self, outcome: Outcome) -> Outcome: ...

    def on_authenticated(self) -> None:
        """The connection has authenticated (SASL)."""
        ...


class MinibrokerCodec:
    """This broker's own protocol (docs/protocol.md): msgpack frames."""

    @staticmethod
    def decode(body: bytes | memoryview) -> Request:
        try:
            return decode_request(body)
        except FrameError:
            kafka = _kafka_request_head(body)
            if kafka is None:
                raise
            raise OtherProtocol(
                "kafka", f"a Kafka request (API key {kafka[0]} v{kafka[1]})"
            ) from None

    @staticmethod
    def converts(_outcome: Outcome) -> bool:
        return False  # batches go out as they are stored

    @staticmethod
    def convert(outcome: Outcome) -> Outcome:
        return outcome

    @staticmethod
    def encode(response: Response, cid: int) -> bytes:
        return frame(encode_response(response, cid))

    @staticmethod
    def pieces(reply: SplicedReply, cid: int) -> list[bytes | int]:
        return reply.pieces(cid)

    @staticmethod
    def on_authenticated() -> None:
        """Nothing: every request goes through the broker's judge (Admission)."""


MINIBROKER = MinibrokerCodec()
_KAFKA_HEAD = struct.Struct(">hhih")


def _kafka_request_head(body: bytes | memoryview) -> tuple[int, int] | None:
    """(API key, version) when `body`, which is no msgpack request, reads as a Kafka
    request header: a small API key and version, a correlation id, a client id that
    fits (null, or a string within the frame)."""
    if len(body) < _KAFKA_HEAD.size:
        return None
    key, version, _correlation_id, client_id_bytes = _KAFKA_HEAD.unpack_from(body)
    fits = -1 <= client_id_bytes <= len(body) - _KAFKA_HEAD.size
    return (key, version) if 0 <= key < 256 and 0 <= version < 64 and fits else None


Reply = bytes | SplicedFrame | AwaitingDurability
"""One request's answer on its way from the reader to the writer: a whole frame,
a frame with file spans, or a frame still waiting for its fsync."""


@dataclass(eq=False)
class Connection:
    """One client connection and what its unsent answers hold of the broker."""

    peer: str
    inflight_max: int
    unsent_bytes_max: int
    session: Session
    codec: Codec = MINIBROKER
    tls: bool = False
    read_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    """The whole connection's: cancelled to close it for another (`limits.py`), with a
    deadline until it has authenticated on a sasl_* listener."""
    authenticated: bool = True
    """False until SASL succeeds (a sasl_* listener) or the TLS handshake does (tls)."""
    evicted: bool = False
    handshake_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    turn: anyio.Event = field(default_factory=anyio.Event)
    """Set when `limits.AuthenticationTurns` hands the connection a turn."""
    inflight: int = 0  # requests read whose answers are not yet sent
    unsent_bytes: int = 0  # bytes of those answers, as far as they are built
    room: anyio.Event = field(default_factory=anyio.Event)

    def full(self) -> bool:
        """Whether the reader must stop until the writer sends something."""
        return self.inflight >= self.inflight_max or self.unsent_bytes >= self.unsent_bytes_max

    def sent(self, count: int, size_bytes: int) -> None:
        self.inflight -= count
        self.unsent_bytes -= size_bytes
        self.room.set()


class Dispatcher(Protocol):
    """What the connections need of the APIs (broker/api/dispatch.py's `Apis`)."""

    def appends_together(self, request: Request) -> bool: ...

    async def handle(self, request: Request, session: Session) -> Outcome: ...

    def produce_many(self, reqs: list[ProduceRequest], session: Session) -> list[Outcome]: ...


class Sessions(Protocol):
    """Who each connection is (broker/api/security.py's `Authentication`)."""

    def session(
        self, listener: Listener, peer_host: str, advertised: tuple[str, int]
    ) -> Session: ...

    def certificate_authenticated(self, session: Session, principal: str) -> None: ...


class Server:
    """The connections of every listener: accepted, read, run in order, answered."""

    def __init__(
        self,
        config: BrokerConfig,
        metrics: BrokerMetrics,
        apis: Dispatcher,
        sessions: Sessions,
        listeners: Listeners,
        served: list[Served],
    ) -> None:
        self.config = config
        """The settings in force: SIGHUP replaces it."""
        self.metrics = metrics
        self.apis = apis
        self.sessions = sessions
        self.listeners = listeners
        self.served = served
        self.connections: set[Connection] = set()
        self.limits = _limits(config)
        self.turns: limits.AuthenticationTurns[Connection] = limits.AuthenticationTurns(
            config.max_authenticating_connections, config.authentication_turn_ms
        )
        self._turn_awaited = anyio.Event()
        metrics.set_authentication_turns_source(
            lambda name: (self.turns.holding(name), self.turns.waiting(name))
        )
        self._converting = anyio.CapacityLimiter(CONVERSIONS_MAX)
        self._serve_scope = anyio.CancelScope()
        self._stopping = False

    def stop(self) -> None:
        """Stop accepting: connections from now on are refused."""
        self._stopping = True
        self._serve_scope.cancel()

    async def drain(self) -> None:
        """Stop reading, let in-flight replies go out, within the shutdown deadline."""
        for conn in list(self.connections):
            conn.handshake_scope.cancel()
            conn.read_scope.cancel()
        with anyio.move_on_after(self.config.shutdown_timeout_ms / 1000 * 0.8):
            while self.connections:
                await anyio.sleep(0.01)
        if self.connections:
            log.warning("event=drain_timeout connections=%d", len(self.connections))

    async def serve(self, connections: anyio.abc.TaskGroup) -> None:
        """Accept on every listener until `stop`; each connection runs in `connections`,
        outside this scope, so that stopping accepting cancels no reply waiting for its
        fsync."""
        with self._serve_scope:
            async with contextlib.AsyncExitStack() as stack:
                for served in self.served:
                    await stack.enter_async_context(served.sockets)
                # The sockets close once every accept has ended.
                accepting = await stack.enter_async_context(anyio.create_task_group())
                accepting.start_soon(self._hand_on_turns)
                for served in self.served:
                    for sub in cast(list[SocketListener], served.sockets.listeners):
                        if self.config.backend == "asyncio":
                            accept: Callable[[], Awaitable[ByteStream]] = functools.partial(
                                asyncio_stream.accept,
                                sub.extra(anyio.abc.SocketAttribute.raw_socket),
                                self.config.read_ahead_max_bytes,
                            )
                        else:
                            accept = sub.accept
                        accepting.start_soon(self._accept_forever, accept, served, connections)

    async def _accept_forever(
        self,
        accept: Callable[[], Awaitable[ByteStream]],
        served: Served,
        connections: anyio.abc.TaskGroup,
    ) -> None:
        while True:
            try:
                stream = await accept()
            except (OSError, anyio.BrokenResourceError) as exc:
                # anyio's trio listener wraps the OSError; asyncio's accept raises it.
                cause = exc if isinstance(exc, OSError) else exc.__cause__
                if not isinstance(cause, OSError) or cause.errno not in ACCEPT_RETRY_ERRNOS:
                    raise
                log.error(
                    "event=accept_failed error=%r retry_in_ms=%d", str(cause), ACCEPT_RETRY_MS
                )
                await anyio.sleep(ACCEPT_RETRY_MS / 1000)
                continue
            connections.start_soon(self._connection, stream, served)

    async def _connection(self, stream: ByteStream, served: Served) -> None:
        peer = _peer(stream)
        host = _peer_host(stream)
        listener = served.listener
        admitted = (
            limits.Refused("shutting_down")
            if self._stopping
            else self.limits.admit(listener.name, host)
        )
        if isinstance(admitted, limits.Refused):
            log.warning(
                "event=connection_refused listener=%s peer=%s reason=%s",
                listener.name,
                peer,
                admitted.reason,
            )
            await stream.aclose()
            return
        for victim in admitted:
            # Not authenticated yet: its room goes to a connection that needs it.
            log.warning(
                "event=connection_evicted listener=%s peer=%s reason=%r",
                victim.session.listener,
                victim.peer,
                f"not authenticated, and the oldest such connection when {listener.name} "
                "or the broker was at its max_connections",
            )
            victim.evicted = True
            victim.scope.cancel()
        session = self.sessions.session(listener, host, served.advertised)
        conn = Connection(
            peer,
            self.config.max_inflight_requests_per_connection,
            self.config.queued_max_response_bytes,
            session,
            codec=self._codec(listener),
            tls=listener.tls,
            authenticated=not (listener.sasl or listener.tls),
        )
        self.connections.add(conn)
        self.limits.opened(conn, listener.name, host, authenticated=conn.authenticated)
        self.metrics.connection_opened(listener.name)
        timeout_ms = self.config.sasl_authentication_timeout_ms
        if listener.sasl:
            conn.scope.deadline = anyio.current_time() + timeout_ms / 1000
        try:
            with conn.scope:
                if listener.tls:
                    secured = await self._handshake(stream, conn)
                    if secured is None:
                        return
                    stream = secured
                    if not listener.sasl:
                        self._authenticated(conn)
                # Bounded by conn.full() in the reader, in requests and bytes, not items.
                send, receive = anyio.create_memory_object_stream[list[Reply]](float("inf"))
                async with stream, anyio.create_task_group() as tg:
                    tg.start_soon(self._writer, stream, receive, conn, tg.cancel_scope)
                    async with send:
                        await self._reader(stream, send, conn)
            if conn.scope.cancelled_caught and not conn.evicted:
                log.warning(
                    "event=connection_closed peer=%s reason=%r",
                    peer,
                    f"not authenticated within sasl_authentication_timeout_ms={timeout_ms}",
                )
        except Exception:
            # The peer's trouble is never the listener's: whatever one connection
            # raises ends that connection only.
            log.exception("event=connection_failed peer=%s", peer)
        finally:
            self.connections.discard(conn)
            self.limits.closed(conn)
            _wake(self.turns.leave(conn, monotonic_ms()))
            self.metrics.connection_closed(listener.name)

    def _authenticated(self, conn: Connection) -> None:
        """`conn` has authenticated: no deadline, and it keeps its room."""
        conn.authenticated = True
        conn.scope.deadline = math.inf
        self.limits.authenticated(conn)
        _wake(self.turns.leave(conn, monotonic_ms()))
        conn.codec.on_authenticated()

    async def _take_turn(self, conn: Connection) -> None:
        """Wait until `conn`, not yet authenticated, may run its next handshake or SASL
        step (`limits.AuthenticationTurns`): a turn freed, or one that ran out handed on
        by `_hand_on_turns`."""
        listener = conn.session.listener
        while True:
            granted, others = self.turns.ask(conn, listener, monotonic_ms())
            _wake(others)
            if granted:
                return
            conn.turn = anyio.Event()
            if self.turns.waiting(listener) == 1:
                # The listener's first waiter: its turns' ends now count for the timer.
                self._turn_awaited.set()
            await conn.turn.wait()

    async def _hand_on_turns(self) -> None:
        """Hand the authentication turns that ran out to the connections waiting, at
        each turn's end: one timer for every waiter, which wait without one (hundreds of
        waiters each with a deadline made a storm of wake-ups)."""
        turns = self.turns
        while True:
            self._turn_awaited = anyio.Event()
            expiry_ms = turns.next_expiry_ms()
            wait_s = math.inf if expiry_ms is None else max(0, expiry_ms - monotonic_ms()) / 1000
            with anyio.move_on_after(wait_s):
                await self._turn_awaited.wait()
            _wake(turns.expire(monotonic_ms()))

    def _codec(self, listener: Listener) -> Codec:
        """What the listener's connections speak (its `protocol`)."""
        if listener.protocol == "kafka":
            mechanisms = SaslPolicy.of(self.config, listener).offered if listener.sasl else ()
            return KafkaCodec(mechanisms, self.config.default_partitions, sasl=listener.sasl)
        return MINIBROKER

    async def _handshake(self, raw: ByteStream, conn: Connection) -> ByteStream | None:
        """`raw` secured by TLS, its principal taken from a client certificate on a
        listener without SASL; None, with `raw` closed, when the handshake failed or the
        broker began to stop first."""
        assert self.listeners.tls_context is not None
        listener = conn.session.listener
        secured: ByteStream | None = None
        try:
            with conn.handshake_scope:
                await self._take_turn(conn)
                secured = await tls.handshake(
                    raw, self.listeners.tls_context, self.config.tls_handshake_timeout_ms
                )
        except tls.HandshakeFailed as exc:
            # Plaintext sent to a TLS port, a certificate refused, a client that stalls.
            log.warning(
                "event=tls_handshake_failed listener=%s peer=%s reason=%r",
                listener,
                conn.peer,
                str(exc),
            )
            self.metrics.tls_handshake_failed(listener)
        finally:
            if secured is None:
                await anyio.aclose_forcefully(raw)
        if secured is not None and conn.session.sasl is None:
            principal = tls.certificate_principal(secured)
            if principal is not None:
                self.sessions.certificate_authenticated(conn.session, principal)
        return secured

    async def _reader(
        self, stream: ByteStream, send: MemoryObjectSendStream[list[Reply]], conn: Connection
    ) -> None:
        frame_bytes_max = self.config.max_frame_bytes
        preauth_bytes_max = self.config.sasl_server_max_receive_bytes
        decoder = FrameDecoder(frame_bytes_max)
        apis = self.apis
        # Only a plain trio socket: asyncio's transport buffers what it cannot send at
        # once, and a send on its socket could overtake those bytes; a wrapping stream
        # (TLS) would be bypassed.
        sock = (
            stream.extra(anyio.abc.SocketAttribute.raw_socket)
            if self.config.backend == "trio" and isinstance(stream, SocketStream)
            else None
        )
        receive_bytes = (
            READ_AHEAD_RECEIVE_BYTES if isinstance(stream, ReadAheadStream) else RECEIVE_BYTES
        )
        receive = tls.receiver(stream) if isinstance(stream, TLSStream) else stream.receive
        # Bytes that wait already are read without an await, so without a cancel scope
        # for the timeout: on trio after a read that found more than it could take, on
        # asyncio whenever the read-ahead holds some.
        read_ahead = stream if isinstance(stream, ReadAheadStream) else None
        last_read_full = False
        # Whether the reader gave the event loop a turn since its last read.
        turned = False
        # When the reader must give the loop a turn again: TURN_S after it last did. It
        # holds across reads and groups, since frames that wait already and answers
        # sent from here may run many groups without an await.
        turn_end_s = time.perf_counter() + TURN_S
        idle_s = self.config.connections_max_idle_ms / 1000
        receive_ms = self.config.request_receive_timeout_ms
        # Time left for the request that has partly arrived. Only time spent
        # waiting for its bytes counts: while back-pressure stops reading, the
        # delay is the broker's, not the client's.
        receive_left_s = receive_ms / 1000
        # Frame bodies waiting for in-flight room, and the request a run read ahead.
        backlog: deque[bytes | memoryview | Decoded] = deque()
        # Shutdown cancels only the waits (for bytes, for room); a request already
        # taken from the backlog runs to completion and its reply is queued
        # (shielded), so in-flight work finishes as SIGTERM promises.
        with conn.read_scope:
            while True:
                while conn.full():
                    conn.room = anyio.Event()
                    await conn.room.wait()
                if not backlog:
                    partial = decoder.buffered_bytes > 0
                    waited_from_s = anyio.current_time()
                    # The frames a read holds come out inflight_max at a time, so a
                    # read of many small requests is not a view per request while the
                    # connection waits for room (no new bytes until they are taken).
                    data: bytes | list[bytes] = b""
                    if not decoder.frames_waiting:
                        if not conn.authenticated:
                            await self._take_turn(conn)
                        received: bytes | list[bytes] | None = None
                        if conn.authenticated and (
                            read_ahead.buffered_bytes > 0
                            if read_ahead is not None
                            else last_read_full and sock is not None
                        ):
                            # The event loop's turn every read takes (the other connections,
                            # this one's writer), unless the answers' hand-over just took it.
                            if turned:
                                await anyio.lowlevel.checkpoint_if_cancelled()
                            else:
                                await anyio.lowlevel.checkpoint()
                            received = (
                                read_ahead.receive_nowait(receive_bytes)
                                if read_ahead is not None
                                else _receive_now(cast(socket.socket, sock), receive_bytes)
                            )
                        if received is None:
                            with anyio.move_on_after(
                                receive_left_s if partial else idle_s
                            ) as timer:
                                received = await _receive(receive, receive_bytes)
                            if timer.cancelled_caught and partial:
                                log.warning(
                                    "event=connection_closed peer=%s reason=%r",
                                    conn.peer,
                                    "request not received whole within "
                                    f"request_receive_timeout_ms={receive_ms} "
                                    f"({decoder.buffered_bytes} bytes of it arrived)",
                                )
                                return
                            if timer.cancelled_caught:
                                log.info("event=connection_idle_closed peer=%s", conn.peer)
                                return
                            if received is None:
                                return
                        # A read cut at its size leaves more in the socket (trio's).
                        last_read_full = (
                            isinstance(received, bytes) and len(received) >= receive_bytes
                        )
                        turned = False
                        turn_end_s = time.perf_counter() + TURN_S
                        data = received
                    # Before SASL completes, only frames as small as authentication needs.
                    unauthenticated = conn.session.sasl is not None and (
                        conn.session.sasl.principal is None
                    )
                    decoder.frame_bytes_max = (
                        min(frame_bytes_max, preauth_bytes_max)
                        if unauthenticated
                        else frame_bytes_max
                    )
                    try:
                        messages = decoder.feed_views(data, conn.inflight_max)
                    except FrameError as exc:
                        reason = str(exc)
                        if isinstance(exc, FrameTooLarge) and exc.limit < frame_bytes_max:
                            reason = (
                                f"frame of {exc.length} bytes before authentication exceeds "
                                f"sasl_server_max_receive_bytes {exc.limit}"
                            )
                        log.warning("event=connection_closed peer=%s reason=%r", conn.peer, reason)
                        return
                    if messages or not partial:
                        receive_left_s = receive_ms / 1000  # any bytes left begin a new request
                    else:
                        receive_left_s -= anyio.current_time() - waited_from_s
                    backlog.extend(messages)
                # A request taken from the backlog runs to completion and its reply is
                # queued: whatever may await (a request's own work, the turn's end)
                # runs shielded from the cancellations meant for the waits. A run of
                # Produce requests never awaits, so a read of those enters no scope.
                with _LazyShield() as shield:
                    # Replies of one read go to the writer together: one send()
                    # for the lot instead of one per request.
                    group: list[Reply] = []
                    # Whether the read held only runs of Produce requests, which is what
                    # a pipelining client sends.
                    produce_only = True
                    # As the read began: the answer that completes a login is not sent
                    # from here either.
                    authenticated = conn.authenticated
                    close: CloseConnection | None = None
                    while backlog and not conn.full():
                        if time.perf_counter() > turn_end_s:
                            shield.on()
                            await anyio.lowlevel.checkpoint()
                            turn_end_s = time.perf_counter() + TURN_S
                        first = self._decode(backlog.popleft(), conn)
                        if isinstance(first, CloseConnection):
                            close = first
                            break
                        if isinstance(first, bytes | NoAnswer):
                            replies: list[Reply | NoAnswer] = [first]
                        elif apis.appends_together(first):
                            run = self._run_from(first, backlog, apis, conn)
                            replies = self._produce_run(cast(list[ProduceRequest], run), conn)
                        else:
                            produce_only = False
                            shield.on()
                            replies = await self._dispatch(first, apis, conn)
                        for reply in replies:
                            if not isinstance(reply, NoAnswer):
                                group.append(reply)
                                conn.inflight += 1
                                conn.unsent_bytes += _size_bytes(reply)
                        sasl = conn.session.sasl
                        if sasl is not None and not conn.authenticated and sasl.principal:
                            self._authenticated(conn)
                        if sasl is not None and sasl.closed:
                            # Its answer (58) goes out first; nothing after it is run.
                            close = CloseConnection("authentication failed")
                            break
                    if group and send.statistics().tasks_waiting_receive:
                        # The writer waits with nothing unsent: this read's answers may go
                        # out now. On asyncio not a read of Produce runs, nor while more
                        # has arrived: answered after the loop's turn, a pipelining client
                        # refills its window in larger reads (answered at once, the
                        # broker's CPU per acks=1 batch rose 15%); nor before
                        # authentication: logins sped up so took the loop's turns from
                        # authenticated clients (a probe's p99 during login storms +5 → +9
                        # to +13 ms).
                        if sock is not None:
                            group = _send_now(sock.send, self._encode_ready(group, conn), conn)
                        elif (
                            read_ahead is not None
                            and not produce_only
                            and authenticated
                            and not read_ahead.buffered_bytes
                        ):
                            group = _send_now(
                                read_ahead.send_nowait, self._encode_ready(group, conn), conn
                            )
                    if group:
                        if sock is None:
                            # The event loop's turn before the hand-over, as a send to the
                            # writer takes it: the writer sends these answers at the
                            # reader's next turn, after its next read has run, so a
                            # pipelining client's next requests come in fewer, larger
                            # reads (sooner answers cost asyncio 5% more CPU per batch).
                            try:
                                await anyio.lowlevel.checkpoint()
                            except anyio.get_cancelled_exc_class():
                                _hand_over(send, group)
                                raise
                            turned = True
                            turn_end_s = time.perf_counter() + TURN_S
                        if not _hand_over(send, group):
                            return  # the writer found the peer gone
                    if close is not None:
                        log.warning(
                            "event=connection_closed peer=%s reason=%r", conn.peer, close.reason
                        )
                        return

    def _decode(
        self, item: bytes | memoryview | Decoded, conn: Connection
    ) -> Request | bytes | NoAnswer | CloseConnection:
        """The request in a frame body, or the error frame that answers it (or nothing,
        for a refused acks=0 Produce), or why the connection must close."""
        if isinstance(item, Decoded):
            return item.request
        started = time.perf_counter()
        codec = conn.codec
        try:
            request = codec.decode(item)
        except OtherProtocol as exc:
            return CloseConnection(self._spoken_elsewhere(exc, conn))
        except FrameError as exc:
            return CloseConnection(str(exc))
        except RequestRefused as exc:
            code, message = exc.code, exc.message
            if exc.api in REQUEST_TYPES:
                # Before authentication, even a malformed request learns only that.
                refusal = self._admit(exc.api, exc.cid, conn, started)
                if refusal is not None:
                    return refusal
            self.metrics.observe_request(exc.api, code, time.perf_counter() - started)
            return codec.encode(error_response(code, message), exc.cid)
        if isinstance(request, bytes):
            return request  # the protocol answered it alone
        if conn.session.sasl is not None:
            refusal = self._admit(request.api, request.cid, conn, started, request)
            if refusal is not None:
                return refusal
        limit = self.config.max_entries_per_request
        if request.entry_count() > limit:
            code = ErrorCode.INVALID_REQUEST
            self.metrics.observe_request(request.api, code, time.perf_counter() - started)
            message = (
                f"request names more than max_entries_per_request={limit} topics and partitions"
            )
            return codec.encode(error_response(code, message), request.cid)
        return request

    def _spoken_elsewhere(self, exc: OtherProtocol, conn: Connection) -> str:
        """Why a client of the other protocol is closed, and which listener speaks it."""
        listener = conn.session.listener
        own = next((s.listener.protocol for s in self.served if s.listener.name == listener), "")
        speaking = [
            f"{s.listener.name!r} at {s.listener.host}:{s.port}"
            for s in self.served
            if s.listener.protocol == exc.protocol
        ]
        where = f"listener {' and '.join(speaking)} speaks it" if speaking else "no listener does"
        return (
            f"{exc} on listener {listener!r}, which speaks {own}'s protocol; "
            f"the client speaks {exc.protocol}'s: {where}"
        )

    def _admit(
        self,
        api: str,
        cid: int,
        conn: Connection,
        started: float,
        request: Request | None = None,
    ) -> bytes | NoAnswer | CloseConnection | None:
        """None when the connection's session lets the request run; else its refusal
        (SASL_AUTHENTICATION_FAILED before authentication) or the close after the
        session's end (docs/protocol.md section 7)."""
        sasl = conn.session.sasl
        if sasl is None:
            return None
        admission = sasl.admit(api, monotonic_ms())
        if admission is Admission.ANSWER:
            return None
        if admission is Admission.CLOSE:
            return CloseConnection(
                "SASL session ended (connections_max_reauth_ms) without re-authentication"
            )
        code = ErrorCode.SASL_AUTHENTICATION_FAILED
        self.metrics.observe_request(api, code, time.perf_counter() - started)
        if request is not None and not request.expects_answer():
            return NoAnswer()  # a Produce with acks=0 (section 4): a refusal neither
        message = f"authenticate first: listener {conn.session.listener!r} takes SaslAuthenticate"
        return conn.codec.encode(error_response(code, message), cid)

    def _run_from(
        self,
        first: Request,
        backlog: deque[bytes | memoryview | Decoded],
        apis: Dispatcher,
        conn: Connection,
    ) -> list[Request]:
        """`first`, a Produce that appends together, and the ones right behind it: their
        batches of one partition then take one write instead of one each. The request
        that ends the run goes back to the front of the backlog, decoded."""
        run = [first]
        entries = first.entry_count()
        room = conn.inflight_max - conn.inflight
        while backlog and len(run) < room and entries < RUN_ENTRIES_MAX:
            item = self._decode(backlog.popleft(), conn)
            if not isinstance(item, Request) or not apis.appends_together(item):
                backlog.appendleft(item if isinstance(item, Decoded) else Decoded(item))
                break
            run.append(item)
            entries += item.entry_count()
        return run

    def _produce_run(
        self, requests: list[ProduceRequest], conn: Connection
    ) -> list[Reply | NoAnswer]:
        """Run Produce requests that append together (`_run_from`) and turn each outcome
        into what the writer sends: no await, so nothing can stop it halfway."""
        started = time.perf_counter()
        try:
            outcomes = self.apis.produce_many(requests, conn.session)
        except Exception as exc:
            return self._failed(requests, exc, started, conn)
        codec = conn.codec
        # A run's requests finish together; an answer to send now (acks=1), the common
        # outcome, is encoded here. A Produce's outcome is never converted
        # (codec.converts is for Fetch answers).
        elapsed_s = time.perf_counter() - started
        api = requests[0].api
        observe = self.metrics.observe_request
        replies: list[Reply | NoAnswer] = []
        for request, outcome in zip(requests, outcomes, strict=True):
            if type(outcome) is Answer:
                response = outcome.response
                observe(api, response.error, elapsed_s)
                replies.append(codec.encode(response, request.cid))
            else:
                replies.append(self._reply(request, outcome, started, codec))
        return replies

    async def _dispatch(
        self, request: Request, apis: Dispatcher, conn: Connection
    ) -> list[Reply | NoAnswer]:
        """Run one request and turn its outcome into what the writer sends."""
        started = time.perf_counter()
        try:
            outcome = await apis.handle(request, conn.session)
        except Exception as exc:
            return self._failed([request], exc, started, conn)
        codec = conn.codec
        if codec.converts(outcome):
            # Stored batches in another form (a kafka listener's Fetch of batches
            # written natively): CPU in proportion to the answer, off the event loop
            # and a few at a time, so one client's Fetch stalls no one else.
            outcome = await anyio.to_thread.run_sync(
                codec.convert, outcome, limiter=self._converting
            )
        return [self._reply(request, outcome, started, codec)]

    def _failed(
        self, requests: Sequence[Request], exc: Exception, started: float, conn: Connection
    ) -> list[Reply | NoAnswer]:
        """The answers to requests whose API raised `exc` (called in its `except`)."""
        if isinstance(exc, ProtocolError):
            return [self._refusal(r, exc.code, exc.message, started, conn) for r in requests]
        if isinstance(exc, DISK_FAILURES):
            # A file the request had to write (producer ids, a topic) could not be: the
            # disk's trouble, said as Kafka says it, not an internal error.
            api = requests[0].api
            log.error("event=storage_error api=%s peer=%s error=%r", api, conn.peer, str(exc))
            code = ErrorCode.KAFKA_STORAGE_ERROR
            return [self._refusal(r, code, f"storage: {exc}", started, conn) for r in requests]
        log.exception("event=request_failed api=%s peer=%s", requests[0].api, conn.peer)
        code = ErrorCode.UNKNOWN_SERVER_ERROR
        return [self._refusal(r, code, "internal error", started, conn) for r in requests]

    def _refusal(
        self, request: Request, code: ErrorCode, message: str, started: float, conn: Connection
    ) -> bytes:
        self.metrics.observe_request(request.api, code, time.perf_counter() - started)
        return conn.codec.encode(error_response(code, message), request.cid)

    def _reply(
        self, request: Request, result: Outcome, started: float, codec: Codec
    ) -> Reply | NoAnswer:
        """What the writer sends for a request's outcome."""
        cid = request.cid
        api = request.api
        if isinstance(result, (DurableReply, SyncedReply)):  # a tuple: the faster test
            return AwaitingDurability(cid, started, api, result)
        if isinstance(result, Answer):
            self.metrics.observe_request(api, result.response.error, time.perf_counter() - started)
            return codec.encode(result.response, cid)
        self.metrics.observe_request(api, 0, time.perf_counter() - started)
        if isinstance(result, SplicedReply):
            try:
                pieces = codec.pieces(result, cid)
                size_bytes = sum(
                    len(p) if isinstance(p, bytes) else result.spans[p].length for p in pieces
                )
                return SplicedFrame(pieces, result, size_bytes)
            except BaseException:
                result.close()
                raise
        return result

    def _encode_ready(self, group: list[Reply], conn: Connection) -> list[Reply]:
        """`group`, each answer whose sync is already done encoded: a commit's Produce
        answer, durable once the EndTxn behind it returns, then goes out with EndTxn's
        from the reader rather than at the writer's next turn."""
        return [
            self._encode_awaited(r, r.reply.response, conn)
            if type(r) is AwaitingDurability and r.reply.ready()
            else r
            for r in group
        ]

    def _encode_awaited(
        self, reply: AwaitingDurability, response: Response, conn: Connection
    ) -> bytes:
        """The frame of an answer that waited for its sync (`response`, once complete)."""
        self.metrics.observe_request(
            reply.api, response.error, time.perf_counter() - reply.started_s
        )
        data = conn.codec.encode(response, reply.cid)
        conn.unsent_bytes += len(data)  # counted from now, when it takes memory
        return data

    async def _writer(
        self,
        stream: ByteStream,
        receive: MemoryObjectReceiveStream[list[Reply]],
        conn: Connection,
        connection_scope: anyio.CancelScope,
    ) -> None:
        try:
            await self._write_replies(stream, receive, conn)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            # A peer that reset or vanished with replies pending: drop the
            # connection (the reader too) and keep serving everyone else.
            log.info("event=connection_lost peer=%s reason=%r", conn.peer, type(exc).__name__)
            connection_scope.cancel()
        finally:
            _close_unsent(_drain(receive))
            receive.close()

    async def _write_replies(
        self,
        stream: ByteStream,
        receive: MemoryObjectReceiveStream[list[Reply]],
        conn: Connection,
    ) -> None:
        pending: list[bytes] = []
        async for group in receive:
            for i, reply in enumerate(group):
                if isinstance(reply, bytes):
                    pending.append(reply)
                    continue
                if isinstance(reply, SplicedFrame):
                    if pending:
                        await self._flush(stream, pending, conn)
                    try:
                        await _send_spliced(stream, reply, zero_copy=not conn.tls)
                    except BaseException:
                        _close_unsent([group[i + 1 :]])
                        raise
                    conn.sent(1, reply.size_bytes)
                    continue
                if pending and not reply.reply.ready():
                    await self._flush(stream, pending, conn)
                pending.append(self._encode_awaited(reply, await reply.reply.complete(), conn))
            if pending and not receive.statistics().current_buffer_used:
                await self._flush(stream, pending, conn)
        if pending:
            await self._flush(stream, pending, conn)

    @staticmethod
    async def _flush(stream: ByteStream, pending: list[bytes], conn: Connection) -> None:
        data = b"".join(pending) if len(pending) > 1 else pending[0]
        await stream.send(data)
        conn.sent(len(pending), len(data))
        pending.clear()


async def _send_spliced(stream: ByteStream, frame: SplicedFrame, *, zero_copy: bool) -> None:
    """Send a Fetch reply: msgpack pieces through the stream, record bytes straight
    from the log files with os.sendfile (zero-copy; trio sends unbuffered, so the
    two never overtake each other). Without `zero_copy` (TLS, which must encrypt
    them) the record bytes are read from the files and sent through the stream."""
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    try:
        for piece in frame.pieces:
            if isinstance(piece, bytes):
                await stream.send(piece)
                continue
            span = frame.reply.spans[piece]
            position, remaining = span.position, span.length
            while remaining and not zero_copy:
                chunk = os.pread(span.fd, min(remaining, COPY_CHUNK_BYTES), position)
                if not chunk:
                    raise anyio.BrokenResourceError("log file shorter than its span")
                await stream.send(chunk)
                position += len(chunk)
                remaining -= len(chunk)
            while remaining:
                try:
                    sent = os.sendfile(sock.fileno(), span.fd, position, remaining)
                except BlockingIOError:
                    await anyio.wait_writable(sock)
                    continue
                if not sent:
                    raise anyio.BrokenResourceError("log file shorter than its span")
                position += sent
                remaining -= sent
    finally:
        frame.reply.close()


def _send_now(send: Callable[[bytes], int], group: list[Reply], conn: Connection) -> list[Reply]:
    """Send a read's answers from the reader, while the writer waits with nothing unsent
    (so nothing older can be overtaken): one non-blocking `send` (a trio socket's, or
    the asyncio transport's `send_nowait`) when they are all whole frames. Returns what
    is left for the writer."""
    if not all(isinstance(reply, bytes) for reply in group):
        return group
    frames = cast(list[bytes], group)
    try:
        sent = send(b"".join(frames))
    except OSError:  # full (BlockingIOError) or broken: the writer waits, or meets it too
        return group
    whole, left = 0, sent
    while whole < len(frames) and len(frames[whole]) <= left:
        left -= len(frames[whole])
        whole += 1
    conn.sent(whole, sent)
    if whole == len(frames):
        return []
    # The frame the socket took part of stays one answer in flight until its rest is sent.
    rest: list[Reply] = [frames[whole][left:]]
    return rest + group[whole + 1 :]


class _LazyShield:
    """A shielding cancel scope entered only when something in it may await: `on()`
    shields the rest of the block. A trio cancel scope costs about as much as a
    batch's decode, so a read of Produce runs, which never await, enters none."""

    __slots__ = ("_scope",)

    def __init__(self) -> None:
        self._scope: anyio.CancelScope | None = None

    def __enter__(self) -> _LazyShield:
        return self

    def on(self) -> None:
        if self._scope is None:
            self._scope = anyio.CancelScope(shield=True)
            self._scope.__enter__()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        return self._scope is not None and bool(self._scope.__exit__(kind, exc, traceback))


def _hand_over(send: MemoryObjectSendStream[list[Reply]], group: list[Reply]) -> bool:
    """Queue a read's answers for the writer (never full: its buffer is unbounded);
    False, with their files closed, when the writer is gone."""
    try:
        send.send_nowait(group)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        _close_unsent([group])
        return False
    return True


def _receive_now(sock: socket.socket, max_bytes: int) -> bytes | None:
    """Up to `max_bytes` of what waits on a non-blocking socket; None when nothing does,
    or at its end or an error, which the awaited receive then meets itself."""
    try:
        return sock.recv(max_bytes) or None
    except OSError:
        return None


def _wake(conns: list[Connection]) -> None:
    """Tell connections that `limits.AuthenticationTurns` handed a turn."""
    for conn in conns:
        conn.turn.set()


def _size_bytes(reply: Reply) -> int:
    """What a queued reply counts against queued_max_response_bytes."""
    if isinstance(reply, bytes):
        return len(reply)
    if isinstance(reply, SplicedFrame):
        return reply.size_bytes
    return 0  # an answer waiting for its fsync is counted once the writer builds it


def _drain(receive: MemoryObjectReceiveStream[list[Reply]]) -> list[list[Reply]]:
    groups = []
    while True:
        try:
            groups.append(receive.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return groups


def _close_unsent(groups: list[list[Reply]]) -> None:
    """Release the file descriptors of Fetch replies that will never be sent."""
    for group in groups:
        for reply in group:
            if isinstance(reply, SplicedFrame):
                reply.reply.close()


async def _receive(receive: Callable[[int], Awaitable[bytes]], max_bytes: int) -> bytes | None:
    try:
        return await receive(max_bytes)
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        return None


def _limits(config: BrokerConfig) -> limits.ConnectionLimits[Connection]:
    """The connection limits the settings declare; overrides' addresses in the spelling
    the connections' own take (canonical_host)."""
    overrides = {}
    for entry in config.max_connections_per_ip_overrides:
        address, _, count = entry.rpartition(":")
        with contextlib.suppress(ValueError):  # a name is compared as it is
            address = canonical_host(address)
        overrides[address] = int(count)
    per_listener = {
        listener.name: listener.max_connections
        for listener in config.effective_listeners()
        if listener.max_connections
    }
    return limits.ConnectionLimits(
        config.max_connections, per_listener, config.max_connections_per_ip, overrides
    )


def _peer_host(stream: ByteStream) -> str:
    """The client's address alone, as ACLs name hosts: an IP address in the one spelling
    decisions compare (canonical_host), anything else as it is."""
    try:
        address = stream.extra(anyio.abc.SocketAttribute.remote_address)
    except Exception:
        return "unknown"
    host = str(address[0]) if isinstance(address, tuple) else str(address)
    try:
        return canonical_host(host)
    except ValueError:
        return host


def _peer(stream: ByteStream) -> str:
    try:
        address = stream.extra(anyio.abc.SocketAttribute.remote_address)
    except Exception:
        return "unknown"
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
