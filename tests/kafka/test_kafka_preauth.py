"""Every Kafka API before authentication on a SASL kafka listener (issue 39, item 7):
each version of each API the listener serves, sent as the smallest request Kafka's
specs allow, gets a response that reads whole as its own (version, correlation id) or
a clean close, and the broker logs no traceback and no error."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.serial import entity_reader

from broker.kafka import SERVED, KafkaCodec
from broker.kafka.entities import response_class
from harness.broker_process import BrokerProcess
from protocol import messages as m
from tests.reliability.fuzz_targets import kafka_before_authentication, smallest_kafka_request
from tests.security_fixtures import broker_with_alice

CONFIG = """\
sasl_mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
authentication_failure_delay_ms = 0
[[listeners]]
name = "kafka"
host = "127.0.0.1"
port = 0
security = "sasl_plaintext"
protocol = "kafka"
"""
BEFORE_AUTHENTICATION = {17, 18, 36}  # SaslHandshake, ApiVersions, SaslAuthenticate
SASL_AUTHENTICATION_FAILED = 58
EVERY_VERSION = [
    (api.key, version) for api in SERVED for version in range(api.min_version, api.max_version + 1)
]


@pytest.fixture
def sasl_kafka(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    with broker_with_alice(tmp_path / "data", backend, CONFIG) as proc:
        yield proc


def smallest_request(key: int, version: int, correlation_id: int) -> bytes:
    """The frame of the least request of (key, version) a client may send."""
    body = smallest_kafka_request(key, version, correlation_id)
    return struct.pack(">i", len(body)) + body


def answer(sock: socket.socket) -> bytes | None:
    """One response frame's body, or None when the broker closed the connection."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    return _exactly(sock, struct.unpack(">i", head)[0])


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def test_every_api_before_authentication_is_answered_or_closed(sasl_kafka: BrokerProcess) -> None:
    host, port = sasl_kafka.address("kafka").rsplit(":", 1)
    sock: socket.socket | None = None
    answered, closed = [], []
    try:
        for correlation_id, (key, version) in enumerate(EVERY_VERSION, 1):
            if sock is None:
                sock = socket.create_connection((host, int(port)), timeout=15)
            sock.sendall(smallest_request(key, version, correlation_id))
            body = answer(sock)
            if body is None:
                closed.append((key, version))
                sock.close()
                sock = None
                continue
            cls = response_class(key, version)
            header, used = entity_reader(cls.__header_schema__)(body, 0)  # type: ignore[attr-defined]
            response, size = entity_reader(cls)(body, used)
            end = used + size
            assert header.correlation_id == correlation_id, (key, version)
            assert end == len(body), f"API {key} v{version}: {len(body) - end} bytes left over"
            if key not in BEFORE_AUTHENTICATION and hasattr(response, "error_code"):
                # Refused in its own response, as every API is there.
                assert response.error_code == SASL_AUTHENTICATION_FAILED, (key, version)
            answered.append((key, version))
    finally:
        if sock is not None:
            sock.close()
    assert answered, "at least ApiVersions is answered"
    # The broker took every one of them without a traceback or an error of its own.
    log = sasl_kafka.log_text()
    assert "Traceback" not in log
    assert "event=connection_failed" not in log and "event=request_failed" not in log
    assert "level=error" not in log.lower()


@pytest.mark.parametrize(("key", "version"), EVERY_VERSION)
def test_the_codec_encodes_a_refusal_of_every_api(key: int, version: int) -> None:
    """The pure half: whatever an API's request becomes, its refusal before the handler
    (58 before authentication) is encoded as the API's own response, read whole."""
    codec = KafkaCodec(("SCRAM-SHA-256",), default_partitions=1)
    request = codec.decode(smallest_request(key, version, 9)[4:])
    if isinstance(request, bytes):
        return  # the listener answered it alone
    if not request.expects_answer():
        return
    refused = m.Response(error=SASL_AUTHENTICATION_FAILED, message="authenticate first")
    frame = codec.encode(refused, request.cid)
    cls = response_class(key, version)
    header, used = entity_reader(cls.__header_schema__)(frame, 4)  # type: ignore[attr-defined]
    response, size = entity_reader(cls)(frame, 4 + used)
    assert header.correlation_id == 9 and 4 + used + size == len(frame)
    if hasattr(response, "error_code"):
        assert response.error_code == SASL_AUTHENTICATION_FAILED


@pytest.mark.parametrize(("key", "version"), EVERY_VERSION)
def test_the_fuzz_target_takes_every_api_and_its_truncations(key: int, version: int) -> None:
    """The fuzz target of the same path (tests/reliability/fuzz_targets.py) raises
    nothing on each API's least request, nor on any truncation of it."""
    body = smallest_kafka_request(key, version, 3)
    for end in range(len(body) + 1):
        kafka_before_authentication(body[:end])
