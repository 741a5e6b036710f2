"""A client at the listener of the other protocol, against a real broker with both
listeners on each backend: Kafka's client at the minibroker listener, minibroker's SDK
at the kafka listener. Each is closed at its first request and fails within seconds
(not after a 30 s timeout); the broker logs one line naming the listener that speaks the
client's protocol, and the SDK's error says the listener may speak Kafka's."""

from __future__ import annotations

import socket
import struct
import time

import kafka
import kafka.errors
import pytest
from kafka.protocol.metadata import ApiVersionsRequest

from client.admin import list_topics
from client.errors import MinibrokerError
from tests.kafka.conftest import TwoListeners

FAST_S = 10.0


def test_the_listening_lines_name_each_listeners_protocol(two_listeners: TwoListeners) -> None:
    log = two_listeners.broker.log_text()
    assert f"port={two_listeners.minibroker.split(':')[1]} protocol=minibroker " in log
    assert f"port={two_listeners.kafka.split(':')[1]} protocol=kafka" in log


def test_a_kafka_client_at_the_minibroker_listener_is_closed_at_once(
    two_listeners: TwoListeners,
) -> None:
    """kafka-python retries a closed bootstrap for its bootstrap_timeout_ms (30 s by
    default): each try is closed at its ApiVersions, and logged as a Kafka client."""
    with pytest.raises(kafka.errors.KafkaTimeoutError):
        kafka.KafkaProducer(bootstrap_servers=two_listeners.minibroker, bootstrap_timeout_ms=2_000)
    assert two_listeners.broker.log_shows("a Kafka request (API key 18 v")  # ApiVersions
    line = next(line for line in two_listeners.broker.log_lines if "a Kafka request" in line)
    assert "on listener 'minibroker', which speaks minibroker's protocol; the client " in line
    assert f"speaks kafka's: listener 'kafka' at {two_listeners.kafka} speaks it" in line
    host, port = two_listeners.minibroker.split(":")
    with socket.create_connection((host, int(port)), timeout=FAST_S) as sock:
        message = ApiVersionsRequest[3]()
        message.with_header(correlation_id=1, client_id="first-contact")
        body = bytes(message.encode(header=True))
        started = time.monotonic()
        sock.sendall(struct.pack(">i", len(body)) + body)
        assert sock.recv(1) == b""  # closed, with no answer
        assert time.monotonic() - started < FAST_S


def test_the_sdk_at_the_kafka_listener_fails_fast_saying_so(two_listeners: TwoListeners) -> None:
    started = time.monotonic()
    with pytest.raises(MinibrokerError, match="may speak Kafka's protocol"):
        list_topics(two_listeners.kafka)
    assert time.monotonic() - started < FAST_S
    assert two_listeners.broker.log_shows(
        "a minibroker request (a msgpack map) on listener 'kafka', which speaks kafka's "
        f"protocol; the client speaks minibroker's: listener 'minibroker' at "
        f"{two_listeners.minibroker} speaks it"
    )
