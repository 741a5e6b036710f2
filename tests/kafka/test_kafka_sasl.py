"""SASL on a `sasl_plaintext` kafka listener, against a real broker on each backend: PLAIN
is neither offered nor taken where it would travel in clear, librdkafka (confluent-kafka)
logs in with SCRAM-SHA-512, and a SaslHandshake v0 takes its rounds as bare frames."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import scramp
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

from tests.security_fixtures import broker_with_alice

SASL_HANDSHAKE = 17
UNSUPPORTED_SASL_MECHANISM = 33
# PLAIN is enabled, but not allowed without TLS (allow_plain_without_tls is off).
SCRAM_ONLY_IN_CLEAR = """\
sasl_mechanisms = ["SCRAM-SHA-512", "PLAIN"]
[[listeners]]
name = "kafka"
host = "127.0.0.1"
port = 0
security = "sasl_plaintext"
protocol = "kafka"
"""


@pytest.fixture
def kafka_sasl(tmp_path: Path, backend: str) -> Iterator[str]:
    with broker_with_alice(tmp_path / "data", backend, SCRAM_ONLY_IN_CLEAR) as broker:
        yield broker.address("kafka")


def _connect(address: str) -> socket.socket:
    host, port = address.split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _call(sock: socket.socket, message: ApiMessage, response: Any, version: int) -> Any:
    message.with_header(correlation_id=7, client_id="sasl-test")
    _send(sock, bytes(message.encode(header=True)))
    return response[version].decode(_receive(sock), header=True)


def _send(sock: socket.socket, body: bytes) -> None:
    sock.sendall(struct.pack(">i", len(body)) + body)


def _receive(sock: socket.socket) -> bytes:
    (length,) = struct.unpack(">i", _exactly(sock, 4))
    return _exactly(sock, length)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed by the broker")
        data += chunk
    return data


def test_plain_is_neither_offered_nor_taken_without_tls(kafka_sasl: str) -> None:
    """A client asking for PLAIN learns it is refused before it sends its password."""
    with _connect(kafka_sasl) as sock:
        plain = _call(sock, SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse, 1)
        assert plain.error_code == UNSUPPORTED_SASL_MECHANISM
        assert plain.mechanisms == ["SCRAM-SHA-512"]
        scram = _call(
            sock, SaslHandshakeRequest[1](mechanism="SCRAM-SHA-512"), SaslHandshakeResponse, 1
        )
        assert scram.error_code == 0
        assert scram.mechanisms == ["SCRAM-SHA-512"]


def test_api_versions_lists_the_sasl_handshake_v0_librdkafka_looks_for(kafka_sasl: str) -> None:
    with _connect(kafka_sasl) as sock:
        answer = _call(sock, ApiVersionsRequest[3](), ApiVersionsResponse, 3)
    ranges = {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys}
    assert ranges[SASL_HANDSHAKE] == (0, 1)


def test_confluent_kafka_logs_in_with_scram_sha_512(kafka_sasl: str) -> None:
    topic = f"paid-{uuid.uuid4().hex[:8]}"
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": kafka_sasl,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "alice-pw",
        }
    )
    delivered: list[confluent_kafka.Message] = []
    producer.produce(topic, b"paid", on_delivery=lambda err, msg: delivered.append(err or msg))
    assert producer.flush(30) == 0
    assert len(delivered) == 1
    assert isinstance(delivered[0], confluent_kafka.Message), delivered[0]
    assert delivered[0].offset() == 0


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_logs_in_with_scram_sha_512(kafka_sasl: str) -> None:
    """Debian's kcat 1.7.1 (its librdkafka wants SaslHandshake v0 listed) produces and
    reads back over SASL; it could not log in before (issue 39)."""
    topic = f"kcat-{uuid.uuid4().hex[:8]}"
    login = [
        *("-b", kafka_sasl, "-X", "security.protocol=SASL_PLAINTEXT"),
        *("-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", "sasl.username=alice"),
        *("-X", "sasl.password=alice-pw"),
    ]
    kcat = shutil.which("kcat")
    assert kcat is not None
    produced = subprocess.run(
        [kcat, *login, "-P", "-t", topic, "-p", "0"],
        input="paid\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [kcat, *login, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-f", "%o %s\n"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == "0 paid\n"


def _bare_round(sock: socket.socket, data: str) -> str:
    _send(sock, data.encode())
    return _receive(sock).decode()


def test_a_v0_handshake_takes_the_rounds_as_bare_frames(kafka_sasl: str) -> None:
    """KIP-43's framing: after SaslHandshake v0, SCRAM's two rounds with no Kafka header;
    then the connection is authenticated and speaks Kafka again."""
    with _connect(kafka_sasl) as sock:
        handshake = SaslHandshakeRequest[0](mechanism="SCRAM-SHA-512")
        assert _call(sock, handshake, SaslHandshakeResponse, 0).error_code == 0
        scram = scramp.ScramClient(["SCRAM-SHA-512"], "alice", "alice-pw")
        scram.set_server_first(_bare_round(sock, scram.get_client_first()))
        scram.set_server_final(_bare_round(sock, scram.get_client_final()))  # checks it
        metadata = _call(sock, MetadataRequest[1](topics=None), MetadataResponse, 1)
        assert [b.node_id for b in metadata.brokers] == [0]


def test_a_failed_bare_round_closes_the_connection(kafka_sasl: str) -> None:
    with _connect(kafka_sasl) as sock:
        handshake = SaslHandshakeRequest[0](mechanism="SCRAM-SHA-512")
        assert _call(sock, handshake, SaslHandshakeResponse, 0).error_code == 0
        scram = scramp.ScramClient(["SCRAM-SHA-512"], "alice", "wrong-pw")
        scram.set_server_first(_bare_round(sock, scram.get_client_first()))
        with pytest.raises(ConnectionError):
            _bare_round(sock, scram.get_client_final())
