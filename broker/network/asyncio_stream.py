"""Client connections on asyncio: a transport that keeps reading while the broker works.

anyio's asyncio stream resumes the transport's reading for each `receive`,
pauses it again after, and hands over one `data_received` chunk per call: two
`epoll_ctl` calls and a loop iteration per chunk, which is most of what asyncio
cost per pipelined batch beyond trio (docs/benchmark-notes.md, rounds five and
six of issue 14). Here the protocol keeps reading until `read_ahead_max_bytes`
bytes wait, and a `receive` takes everything that waits, up to its `max_bytes`.
Writes wait until the transport has handed every byte to the kernel, as
anyio's do, so a writer that counts a reply as sent once `send` returns holds
no hidden buffer.

trio needs none of this: its `receive` is one `recv` call on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

import anyio
import anyio.abc
from anyio.abc import SocketAttribute


class ReadAheadProtocol(asyncio.Protocol):
    """Buffers what arrives, up to `read_ahead_max_bytes`; then pauses the transport."""

    def __init__(self, read_ahead_max_bytes: int) -> None:
        assert read_ahead_max_bytes > 0
        self.read_ahead_max_bytes = read_ahead_max_bytes
        self.chunks: deque[bytes] = deque()
        self.buffered_bytes = 0
        self.reading = True
        self.readable = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.at_eof = False
        self.exception: Exception | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        # Pause writing as soon as anything is buffered: `send` then waits for the drain.
        self.transport.set_write_buffer_limits(0)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(bytes(data))
        self.buffered_bytes += len(data)
        self.readable.set()
        if self.buffered_bytes >= self.read_ahead_max_bytes and self.reading:
            assert self.transport is not None
            self.transport.pause_reading()
            self.reading = False

    def take(self, max_bytes: int) -> bytes:
        """Up to `max_bytes` of what has arrived (at least one byte: call when some has)."""
        parts = self.take_chunks(max_bytes)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def take_chunks(self, max_bytes: int) -> list[bytes]:
        """As `take`, the chunks as they arrived (the last one cut to fit), not joined."""
        assert self.chunks and max_bytes > 0
        parts: list[bytes] = []
        size = 0
        while self.chunks and size < max_bytes:
            chunk = self.chunks.popleft()
            room = max_bytes - size
            if len(chunk) > room:
                self.chunks.appendleft(chunk[room:])
                chunk = chunk[:room]
            parts.append(chunk)
            size += len(chunk)
        self.buffered_bytes -= size
        if not self.chunks:
            self.readable.clear()
        if not self.reading and self.buffered_bytes < self.read_ahead_max_bytes:
            assert self.transport is not None
            self.transport.resume_reading()
            self.reading = True
        return parts

    def eof_received(self) -> bool:
        self.at_eof = True
        self.readable.set()
        return True  # half-close: answers may still go out

    def connection_lost(self, exc: Exception | None) -> None:
        self.exception = exc
        self.at_eof = True
        self.readable.set()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()


class ReadAheadStream(anyio.abc.ByteStream):
    """The anyio byte stream over a `ReadAheadProtocol` connection."""

    def __init__(self, transport: asyncio.Transport, protocol: ReadAheadProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closed = False
        self._fd: int = transport.get_extra_info("socket").fileno()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        # Bytes that are waiting must not hide a cancellation: it is how a shutdown's
        # drain stops the reader of a client that keeps sending.
        await anyio.lowlevel.checkpoint_if_cancelled()
        protocol = self._protocol
        while not protocol.chunks:
            if self._closed:
                raise anyio.ClosedResourceError
            if protocol.exception is not None:
                raise anyio.BrokenResourceError from protocol.exception
            if protocol.at_eof:
                raise anyio.EndOfStream
            await protocol.readable.wait()
        return protocol.take(max_bytes)

    @property
    def buffered_bytes(self) -> int:
        """Bytes that have arrived and wait for a receive."""
        return self._protocol.buffered_bytes

    def receive_nowait(self, max_bytes: int = 65536) -> list[bytes] | None:
        """Up to `max_bytes` of what has arrived, without waiting, as the chunks that
        came (`FrameDecoder.feed_views` takes them as if joined, without the copy);
        None when nothing has (or the stream ended or broke: `receive` says which)."""
        protocol = self._protocol
        if self._closed or not protocol.chunks:
            return None
        return protocol.take_chunks(max_bytes)

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._check_writable()
        self._transport.write(item)
        if not self._protocol.writable.is_set():
            await self._protocol.writable.wait()
            self._check_writable()

    def send_nowait(self, data: bytes) -> int:
        """Write `data` to the socket at once, as a non-blocking `socket.send` does: the
        bytes the kernel took, which may be fewer, the rest left to the caller; raises
        BlockingIOError while the transport holds bytes not yet sent (they go first)
        and OSError if the connection broke. Nothing is left in the transport, so the
        writer that counts what this took as sent holds no hidden buffer."""
        if (
            self._closed
            or not self._protocol.writable.is_set()
            or self._transport.get_write_buffer_size()
        ):
            raise BlockingIOError
        try:
            self._check_writable()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise BrokenPipeError from exc
        return os.write(self._fd, data)

    def _check_writable(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._protocol.exception is not None:
            raise anyio.BrokenResourceError from self._protocol.exception
        if self._transport.is_closing():
            raise anyio.BrokenResourceError

    async def send_eof(self) -> None:
        with contextlib.suppress(OSError):
            self._transport.write_eof()

    async def aclose(self) -> None:
        self._closed = True
        self._transport.abort()
        await anyio.lowlevel.checkpoint()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        transport = self._transport
        return {
            SocketAttribute.family: lambda: transport.get_extra_info("socket").family,
            SocketAttribute.local_address: lambda: transport.get_extra_info("sockname")[:2],
            SocketAttribute.remote_address: lambda: transport.get_extra_info("peername")[:2],
        }


async def accept(sock: socket.socket, read_ahead_max_bytes: int) -> ReadAheadStream:
    """The next connection on the listening `sock` (one of anyio's listener's, which
    still closes it), as a `ReadAheadStream`."""
    loop = asyncio.get_running_loop()
    try:
        client, _address = await loop.sock_accept(sock)
    except asyncio.CancelledError:
        # A cancelled sock_accept can leave the socket registered (bpo-41317), and the
        # listener closes it next.
        with contextlib.suppress(ValueError, NotImplementedError):
            loop.remove_reader(sock)
        raise
    try:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport, protocol = await loop.connect_accepted_socket(
            partial(ReadAheadProtocol, read_ahead_max_bytes), client
        )
    except BaseException:
        client.close()
        raise
    return ReadAheadStream(transport, protocol)
