"""The asyncio backend's client connections (broker/network/asyncio_stream.py) over real loopback
sockets, on uvloop (what `--backend asyncio` runs) and on the standard loop.

What is tried: a peer that sends several writes before the broker reads, more than
the read-ahead bound, half-closes, never reads what it is sent, or resets.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import pytest

from broker.network import asyncio_stream
from broker.network.asyncio_stream import ReadAheadStream

LIMIT = 64 * 1024

Case = Callable[[ReadAheadStream, anyio.abc.SocketStream], Awaitable[None]]


def run_case(case: Case, use_uvloop: bool) -> None:
    """Accept one connection through asyncio_stream.accept and run `case` on both ends."""

    async def main() -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        sock = listener.listeners[0].extra(anyio.abc.SocketAttribute.raw_socket)
        with anyio.fail_after(10):
            async with (
                listener,
                await anyio.connect_tcp("127.0.0.1", port) as peer,
                await asyncio_stream.accept(sock, LIMIT) as stream,
            ):
                await case(stream, peer)

    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": use_uvloop})


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await anyio.sleep(0.005)


def protocol_of(stream: ReadAheadStream) -> Any:
    return stream._protocol


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_one_receive_takes_every_write_that_arrived_up_to_max_bytes(use_uvloop: bool) -> None:
    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        for part in (b"a" * 1000, b"b" * 2000, b"c" * 3000):
            await peer.send(part)
        await until(lambda: protocol_of(stream).buffered_bytes == 6000)
        assert await stream.receive(2500) == b"a" * 1000 + b"b" * 1500
        assert await stream.receive(1 << 20) == b"b" * 500 + b"c" * 3000
        assert protocol_of(stream).buffered_bytes == 0

    run_case(case, use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_a_cancelled_reader_stops_even_with_bytes_waiting(use_uvloop: bool) -> None:
    """A shutdown's drain cancels the reader of a client that keeps sending: receive
    must not hand it more requests to run because bytes happen to be waiting."""

    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        await peer.send(b"request")
        await until(lambda: protocol_of(stream).buffered_bytes == 7)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await stream.receive()
            raise AssertionError("receive returned in a cancelled scope")
        assert await stream.receive() == b"request"

    run_case(case, use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_reading_pauses_at_the_bound_and_nothing_is_lost(use_uvloop: bool) -> None:
    """The peer sends eight times the bound: the transport stops reading near the bound
    (the rest waits in the kernel), resumes once the broker takes it, and every byte
    arrives in order."""
    sent = b"".join(struct.pack(">I", i) for i in range(2 * LIMIT))  # 8 x LIMIT bytes

    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(peer.send, sent)
            protocol = protocol_of(stream)
            await until(lambda: not protocol.reading)
            await anyio.sleep(0.05)
            assert LIMIT <= protocol.buffered_bytes < 2 * LIMIT + 256 * 1024
            received = b""
            while len(received) < len(sent):
                received += await stream.receive(1 << 20)
            assert protocol.reading
        assert received == sent

    run_case(case, use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_a_half_close_ends_the_stream_after_its_data_and_answers_still_go_out(
    use_uvloop: bool,
) -> None:
    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        await peer.send(b"last request")
        await peer.send_eof()
        assert await stream.receive() == b"last request"
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()
        await stream.send(b"its answer")
        assert await peer.receive() == b"its answer"

    run_case(case, use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_send_returns_only_once_the_kernel_has_the_bytes(use_uvloop: bool) -> None:
    """A peer that does not read: send blocks instead of buffering in the process (the
    writer counts an answer as sent when send returns), and resumes when the peer reads."""
    answer = bytes(range(256)) * (64 * 1024)  # 16 MiB, more than both socket buffers

    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        done = anyio.Event()

        async def send() -> None:
            await stream.send(answer)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            await anyio.sleep(0.3)
            assert not done.is_set()
            received = b""
            while len(received) < len(answer):
                received += await peer.receive(1 << 20)
            await done.wait()
        assert received == answer

    run_case(case, use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_no_send_returns_with_bytes_left_in_the_process(use_uvloop: bool) -> None:
    """Small answers to a peer that does not read, until the kernel's buffers are full:
    every send that returns has handed all its bytes to the kernel."""

    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        transport = stream._transport
        returned = 0
        with anyio.move_on_after(0.5):
            while True:
                await stream.send(b"x" * 1024)
                returned += 1
                assert transport.get_write_buffer_size() == 0, returned
        assert transport.get_write_buffer_size() > 0  # the last send is the one that blocked
        received = 0
        while received < returned * 1024:
            received += len(await peer.receive(1 << 20))

    run_case(case, use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_a_reset_peer_breaks_both_directions(use_uvloop: bool) -> None:
    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        raw = peer.extra(anyio.abc.SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await peer.aclose()  # linger 0: RST
        with pytest.raises((anyio.BrokenResourceError, anyio.EndOfStream)):
            await stream.receive()
        with pytest.raises(anyio.BrokenResourceError):
            for _ in range(100):
                await stream.send(b"x" * 65536)
                await anyio.sleep(0.01)

    run_case(case, use_uvloop)


def test_the_stream_names_its_peer() -> None:
    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        local = peer.extra(anyio.abc.SocketAttribute.local_address)
        assert stream.extra(anyio.abc.SocketAttribute.remote_address) == local

    run_case(case, True)


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_receive_nowait_takes_what_waits_and_never_waits(use_uvloop: bool) -> None:
    """The reader's read without an await (broker/network/server.py): what has arrived,
    up to max_bytes; None when nothing has, and at the end, which `receive` then says."""

    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        assert stream.receive_nowait() is None
        await peer.send(b"a" * 3000)
        await until(lambda: stream.buffered_bytes == 3000)
        assert b"".join(stream.receive_nowait(1000) or []) == b"a" * 1000
        assert b"".join(stream.receive_nowait(1 << 20) or []) == b"a" * 2000
        assert stream.receive_nowait() is None
        await peer.send_eof()
        await until(lambda: protocol_of(stream).at_eof)
        assert stream.receive_nowait() is None
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()

    run_case(case, use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_send_nowait_writes_only_what_the_kernel_takes(use_uvloop: bool) -> None:
    """The reader's shortcut: `send_nowait` writes to the socket at once and returns what
    the kernel took, as a non-blocking `socket.send`; against a peer that does not read,
    once the kernel is full it takes part or raises BlockingIOError, and the transport
    never holds a byte of it (a writer counting it as sent holds no hidden buffer). It
    refuses while the transport holds unsent bytes, which must go first."""
    chunk = b"a" * (256 * 1024)

    async def case(stream: ReadAheadStream, peer: anyio.abc.SocketStream) -> None:
        transport = stream._transport
        assert stream.send_nowait(b"first") == 5
        assert await peer.receive() == b"first"
        taken = 0
        with pytest.raises(BlockingIOError):
            for _ in range(200):
                taken += stream.send_nowait(chunk)
                assert transport.get_write_buffer_size() == 0
        assert taken
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.send, b"b" * 1000)  # the transport keeps what the kernel refuses
            await until(lambda: transport.get_write_buffer_size() > 0)
            with pytest.raises(BlockingIOError):
                stream.send_nowait(b"overtaking")
            received = 0
            while received < taken + 1000:
                received += len(await peer.receive(1 << 20))
        assert stream.send_nowait(b"again") == 5
        assert await peer.receive() == b"again"
        await stream.aclose()
        with pytest.raises(OSError):
            stream.send_nowait(b"closed")

    run_case(case, use_uvloop)
