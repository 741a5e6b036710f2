"""The sync Consumer's lookups (topics, partitions, offsets) made on the caller's thread
over a blocking connection of their own (client/connection.py `DirectRequests`), against
the real broker on both backends: answered without the event loop, and every failure
made good, or said, as the event loop's connection does."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from client import Consumer, MinibrokerTimeoutError, Producer, TopicPartition
from client.connection import BlockingConnection
from client.errors import ConnectionLostError, UnknownTopicError
from harness.broker_process import BrokerProcess
from protocol.framing import DEFAULT_FRAME_BYTES_MAX, FrameDecoder, frame
from protocol.messages import (
    APIS,
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
    Request,
    TopicMetadata,
    decode_request,
    encode_response,
)

HOLD_S = 5.0


@contextlib.contextmanager
def event_loop_held(consumer: Consumer) -> Iterator[None]:
    """The consumer's event loop stuck in a callback for the block: whatever needs the loop
    waits, until HOLD_S have passed, which then fails the test."""
    held, release = threading.Event(), threading.Event()
    waited_out: list[bool] = []

    def hold() -> None:
        held.set()
        if not release.wait(HOLD_S):
            waited_out.append(True)

    consumer._thread._loop.call_soon_threadsafe(hold)
    assert held.wait(10)
    try:
        yield
    finally:
        release.set()
    assert not waited_out, "a lookup waited for the event loop"


def produce(broker: BrokerProcess, topic: str, count: int) -> TopicPartition:
    with Producer(broker.bootstrap) as producer:
        producer.send_batch(topic, [b"%d" % i for i in range(count)], partition=0).get(10)
    return TopicPartition(topic, 0)


def test_lookups_are_answered_on_the_callers_thread(broker: BrokerProcess) -> None:
    tp = produce(broker, "looked-up", 3)
    with Consumer(tp, bootstrap_servers=broker.bootstrap) as consumer:
        assert consumer.topics() == {"looked-up"}  # the event loop's connection is up
        with event_loop_held(consumer):
            assert consumer.topics() == {"looked-up"}
            assert consumer.partitions_for_topic("looked-up") == {0}
            assert consumer.beginning_offsets([tp]) == {tp: 0}
            assert consumer.end_offsets([tp]) == {tp: 3}
            with pytest.raises(UnknownTopicError):  # errors read as through the loop
                consumer.partitions_for_topic("no-such-topic")


def test_a_lost_direct_connection_is_made_good_through_the_event_loop(
    broker: BrokerProcess,
) -> None:
    tp = produce(broker, "lost", 2)
    with Consumer(tp, bootstrap_servers=broker.bootstrap) as consumer:
        assert consumer.topics() == {"lost"}
        with event_loop_held(consumer):
            assert consumer.end_offsets([tp]) == {tp: 2}
        direct = consumer._direct._conn
        assert direct is not None and direct._sock is not None
        direct._sock.shutdown(socket.SHUT_RDWR)  # as a connection the broker dropped
        assert consumer.end_offsets([tp]) == {tp: 2}  # retried through the event loop
        with event_loop_held(consumer):  # and the next lookup has a new connection
            assert consumer.partitions_for_topic("lost") == {0}
        assert consumer._direct._conn is not direct


@pytest.mark.parametrize("path", ["caller's thread", "event loop"])
def test_a_broker_that_stops_answering_times_out_as_before(
    broker: BrokerProcess, path: str
) -> None:
    """request_timeout_ms bounds the whole call, and the error names it and the cause,
    the same on either path (the event loop's: its connection's receive deadline)."""
    with Consumer(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=1_000, fetch_max_wait_ms=100
    ) as consumer:
        consumer.topics()
        consumer.topics()

        def topics() -> set[str]:
            if path == "event loop":
                return consumer._thread.call(consumer._core.topics)
            return consumer.topics()

        os.kill(broker.pid, signal.SIGSTOP)
        try:
            with pytest.raises(MinibrokerTimeoutError) as caught:
                topics()
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert str(caught.value) == (
            f"Metadata failed within request_timeout_ms=1000: {broker.bootstrap}: request timed out"
        )
        assert consumer.topics() == set()


def test_a_broker_that_stops_answering_while_the_lookup_connects_times_out_once(
    broker: BrokerProcess,
) -> None:
    """A lookup whose own connection is opened while the broker hangs (the kernel still
    accepts it) gives up at request_timeout_ms, not once more through the event loop."""
    with Consumer(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=1_000, fetch_max_wait_ms=100
    ) as consumer:
        consumer.topics()  # the event loop's connection; the lookup's is opened next
        assert consumer._direct._conn is None
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(MinibrokerTimeoutError, match="request timed out"):
                consumer.topics()
            took_s = time.monotonic() - started
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert took_s < 1.9  # a second request_timeout_ms would make it 2 s at least
        assert consumer.topics() == set()


# --------------------------------------------------------------------------- the connection


@contextlib.contextmanager
def scripted_broker(answer: Callable[[Request, socket.socket], None]) -> Iterator[tuple[str, int]]:
    """A broker on loopback for one connection: it answers ApiVersions as a broker does
    and hands every other request to `answer`, which writes what it likes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        decoder = FrameDecoder()
        with conn, contextlib.suppress(OSError):  # the client's close may reset it
            while data := conn.recv(65536):
                for body in decoder.feed_bodies(data):
                    request = decode_request(body)
                    if isinstance(request, ApiVersionsRequest):
                        versions = ApiVersionsResponse(apis={api: [1, 1] for api in APIS})
                        conn.sendall(frame(encode_response(versions, request.cid)))
                    else:
                        answer(request, conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[:2]
    finally:
        listener.close()
        thread.join(10)  # each test closes its connection, which ends the thread


def blocking_connection(address: tuple[str, int], **settings: Any) -> BlockingConnection:
    return BlockingConnection.open(
        *address,
        client_id=None,
        tls=None,
        max_response_bytes=settings.get("max_response_bytes", DEFAULT_FRAME_BYTES_MAX),
        deadline=time.monotonic() + 10,
    )


def metadata(request: Request, topics: int = 1) -> bytes:
    answer = MetadataResponse(topics=[TopicMetadata(f"topic-{i:06d}") for i in range(topics)])
    return frame(encode_response(answer, request.cid))


def cut(conn: socket.socket, data: bytes) -> None:
    """Send `data` and close the connection's sending side: an answer cut short."""
    conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


def test_an_answer_longer_than_a_read_is_received_whole() -> None:
    with scripted_broker(lambda r, conn: conn.sendall(metadata(r, 40_000))) as address:
        conn = blocking_connection(address)
        response = conn.request(MetadataRequest(topics=None), time.monotonic() + 10)
        assert len(response.topics) == 40_000 and response.topics[-1].name == "topic-039999"
        conn.close()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (lambda r, conn: cut(conn, metadata(r)[:-3]), "closed by the broker"),
        (lambda r, conn: cut(conn, metadata(r)[:2]), "closed by the broker"),
        (lambda r, conn: conn.sendall(metadata(r) + b"\0"), "bytes after the answer"),
        (lambda r, conn: conn.sendall(frame(encode_response(MetadataResponse(), 99))), "cid 99"),
        (lambda r, conn: conn.sendall(frame(b"\xc1")), "not a MetadataResponse"),
        (lambda r, conn: conn.sendall(metadata(r, 10_000)), "exceeds max_frame_bytes 65536"),
    ],
)
def test_a_bad_answer_closes_the_connection_and_says_why(
    answer: Callable[[Request, socket.socket], None], said: str
) -> None:
    with scripted_broker(answer) as address:
        conn = blocking_connection(address, max_response_bytes=65536)
        with pytest.raises(ConnectionLostError, match=said):
            conn.request(MetadataRequest(topics=None), time.monotonic() + 10)
        with pytest.raises(ConnectionLostError, match="closed"):
            conn.request(MetadataRequest(topics=None), time.monotonic() + 10)


def test_an_answer_later_than_the_deadline_is_a_timeout() -> None:
    with scripted_broker(lambda r, conn: None) as address:
        conn = blocking_connection(address)
        with pytest.raises(ConnectionLostError, match="request timed out"):
            conn.request(MetadataRequest(topics=None), time.monotonic() + 0.05)


def test_a_deadline_already_passed_is_a_timeout_without_a_request() -> None:
    asked: list[Request] = []
    with scripted_broker(lambda r, conn: asked.append(r)) as address:
        conn = blocking_connection(address)
        with pytest.raises(ConnectionLostError, match="request timed out"):
            conn.request(MetadataRequest(topics=None), time.monotonic())
        with pytest.raises(ConnectionLostError, match="closed"):
            conn.request(MetadataRequest(topics=None), time.monotonic() + 10)
    assert asked == []
