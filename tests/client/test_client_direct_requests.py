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
from collections.abc import Iterator

import pytest

from client import Consumer, MinibrokerTimeoutError, Producer, TopicPartition
from client.errors import UnknownTopicError
from harness.broker_process import BrokerProcess

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


def test_a_broker_that_stops_answering_times_out_as_before(broker: BrokerProcess) -> None:
    """request_timeout_ms bounds the whole call, and the error names it and the cause,
    as the event loop's retries say it."""
    with Consumer(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=1_000, fetch_max_wait_ms=100
    ) as consumer:
        consumer.topics()
        consumer.topics()
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            with pytest.raises(MinibrokerTimeoutError) as caught:
                consumer.topics()
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert str(caught.value) == (
            f"Metadata failed within request_timeout_ms=1000: {broker.bootstrap}: request timed out"
        )
        assert consumer.topics() == set()
