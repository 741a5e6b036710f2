"""Kafka's own client against a real broker's kafka listener: an idempotent producer
with acks=all, and a consumer with manually assigned partitions and manual commits."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAuthorizationFailedError
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.structs import OffsetAndMetadata

from client import Consumer, Producer
from harness.broker_process import BrokerProcess
from harness.kafka_requests import fetch_request, produce_request
from harness.wire import WireClient, fetched_values
from tests.kafka.conftest import TwoListeners

RECORDS = 20


def test_kafka_python_produces_idempotently_and_reads_back(two_listeners: TwoListeners) -> None:
    address = two_listeners.kafka
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        assert admin._client.check_version() == (2, 8)  # what it reads from ApiVersions
        admin.create_topics([NewTopic("orders", 2, 1)])
        assert set(admin.list_topics()) == {"orders"}
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=address, enable_idempotence=True, acks="all")
    try:
        sent = [
            producer.send("orders", key=b"k%d" % i, value=b"v%d" % i, headers=[("n", b"%d" % i)])
            for i in range(RECORDS)
        ]
        producer.flush(timeout=30)
        offsets = [(m.partition, m.offset) for m in (f.get(timeout=30) for f in sent)]
    finally:
        producer.close()
    assert sorted(offsets) == sorted({(p, o) for p, o in offsets})  # each record once

    consumer = KafkaConsumer(
        bootstrap_servers=address,
        group_id="audit",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    try:
        partitions = [TopicPartition("orders", p) for p in (0, 1)]
        consumer.assign(partitions)
        got = {}
        for record in consumer:
            got[record.key] = (record.value, record.headers, (record.partition, record.offset))
            if len(got) == RECORDS:
                break
        consumer.commit({tp: OffsetAndMetadata(5, "", -1) for tp in partitions})
        committed = [consumer.committed(tp) for tp in partitions]
    finally:
        consumer.close()
    assert got == {b"k%d" % i: (b"v%d" % i, [("n", b"%d" % i)], offsets[i]) for i in range(RECORDS)}
    assert committed == [5, 5]


def test_our_sdk_reads_what_a_kafka_client_wrote(two_listeners: TwoListeners) -> None:
    producer = KafkaProducer(bootstrap_servers=two_listeners.kafka, acks="all")
    try:
        producer.send("mixed", value=b"from kafka").get(timeout=30)
    finally:
        producer.close()
    with Consumer(
        ("mixed", 0), bootstrap_servers=two_listeners.minibroker, auto_offset_reset="earliest"
    ) as ours:
        records = []
        for _ in range(20):
            records += [r for batch in ours.poll(timeout_ms=500).values() for r in batch]
            if records:
                break
    assert [(r.offset, r.value) for r in records] == [(0, b"from kafka")]


def test_kafka_python_reads_what_our_sdk_wrote(two_listeners: TwoListeners) -> None:
    """Our magic-1 batches reach a Kafka consumer converted to v2, beside v2 ones."""
    with Producer(bootstrap_servers=two_listeners.minibroker, acks="all") as ours:
        for i in range(3):
            ours.send("mixed", value=b"ours %d" % i, key=b"k", headers=[("h", b"1")])
        ours.flush(30)
    producer = KafkaProducer(bootstrap_servers=two_listeners.kafka, acks="all")
    try:
        producer.send("mixed", value=b"theirs").get(timeout=30)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=two_listeners.kafka,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    try:
        consumer.assign([TopicPartition("mixed", 0)])
        got = [(r.offset, r.key, r.value, r.headers) for r in consumer]
    finally:
        consumer.close()
    assert got == [
        (0, b"k", b"ours 0", [("h", b"1")]),
        (1, b"k", b"ours 1", [("h", b"1")]),
        (2, b"k", b"ours 2", [("h", b"1")]),
        (3, None, b"theirs", []),
    ]


SECURED = """\
authorizer = true
super_users = ["User:admin"]
sasl_mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
allow_plain_without_tls = true
[[listeners]]
name = "minibroker"
host = "127.0.0.1"
port = 0
security = "sasl_plaintext"
[[listeners]]
name = "kafka"
host = "127.0.0.1"
port = 0
security = "sasl_plaintext"
protocol = "kafka"
"""


def test_sasl_and_acls_hold_for_kafkas_clients(tmp_path: Path, backend: str) -> None:
    """SCRAM and PLAIN through SaslHandshake and SaslAuthenticate, and the ACLs the
    minibroker listener applies: alice may write the topic she was granted, bob not."""
    env = {"MINIBROKER_BOOTSTRAP_USERS": "admin:admin-pw,alice:alice-pw,bob:bob-pw"}
    broker = BrokerProcess(tmp_path / "data", backend=backend, config=SECURED, env=env).start()
    try:
        with WireClient(broker.address("minibroker")) as admin:
            admin.authenticate("admin", "admin-pw")
            assert admin.create_topic("payments", 1) == 0
            grant = {
                "resource_type": "topic",
                "resource_name": "payments",
                "pattern_type": "literal",
                "principal": "User:alice",
                "host": "*",
                "operation": "write",
                "permission": "allow",
            }
            assert admin.call("CreateAcls", creations=[grant])["results"] == [
                {"error": 0, "message": None}
            ]

        def producer(user: str, mechanism: str) -> KafkaProducer:
            return KafkaProducer(
                bootstrap_servers=broker.address("kafka"),
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=mechanism,
                sasl_plain_username=user,
                sasl_plain_password=f"{user}-pw",
                acks="all",
                max_block_ms=10_000,
                retries=0,
            )

        alice = producer("alice", "SCRAM-SHA-512")
        try:
            written = alice.send("payments", value=b"paid").get(timeout=30)
        finally:
            alice.close()
        bob = producer("bob", "PLAIN")
        try:
            with pytest.raises(KafkaError) as refused:
                bob.send("payments", value=b"stolen").get(timeout=30)
        finally:
            bob.close()
        with WireClient(broker.address("minibroker")) as admin:
            admin.authenticate("admin", "admin-pw")
            values = fetched_values(admin.fetch("payments", 0, 0)["records"])
    finally:
        broker.kill()
    assert written.offset == 0
    assert isinstance(refused.value, TopicAuthorizationFailedError)
    assert values == [(0, b"paid")]


def _call(sock: socket.socket, message: ApiMessage, response: Any, version: int) -> Any:
    """One request on a raw connection, its answer read by kafka-python's classes."""
    message.with_header(correlation_id=11, client_id="raw")
    body = bytes(message.encode(header=True))
    sock.sendall(struct.pack(">i", len(body)) + body)
    (length,) = struct.unpack(">i", _exactly(sock, 4))
    return response[version].decode(_exactly(sock, length), header=True)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def test_a_batch_comes_back_as_a_kafka_broker_would_serve_it(two_listeners: TwoListeners) -> None:
    """Stored as it arrived: only base_offset and partition leader epoch (0, outside
    the CRC) are the broker's, as on a Kafka leader."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(3):
        builder.append(i, 1_700_000_000_000 + i, b"k", b"value %d" % i, [("h", b"1")])
    batch = bytes(builder.build())
    host, port = two_listeners.kafka.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        produced = _call(
            sock,
            produce_request("raw", batch),
            ProduceResponse,
            9,
        )
        assert produced.responses[0].partition_responses[0].error_code == 3  # no topic yet
        admin = KafkaAdminClient(bootstrap_servers=two_listeners.kafka)
        try:
            admin.create_topics([NewTopic("raw", 1, 1)])
        finally:
            admin.close()
        for offset in (0, 3):
            produce = produce_request("raw", batch)
            answer = _call(sock, produce, ProduceResponse, 9).responses[0].partition_responses[0]
            assert (answer.error_code, answer.base_offset) == (0, offset)
        # acks=0: no answer at all, so the next frame read is the Fetch's.
        silent = produce_request("raw", batch, acks=0)
        silent.with_header(correlation_id=12, client_id="raw")
        body = bytes(silent.encode(header=True))
        sock.sendall(struct.pack(">i", len(body)) + body)
        fetched = _call(
            sock,
            fetch_request("raw"),
            FetchResponse,
            12,
        )
    assert fetched.header.correlation_id == 11
    partition = fetched.responses[0].partitions[0]
    assert (partition.error_code, partition.high_watermark) == (0, 9)
    epoch_0 = struct.pack(">i", 0)
    assert bytes(partition.records) == b"".join(
        struct.pack(">q", offset) + batch[8:12] + epoch_0 + batch[16:] for offset in (0, 3, 6)
    )


def test_bytes_that_are_no_kafka_request_close_that_connection_only(
    two_listeners: TwoListeners,
) -> None:
    host, port = two_listeners.kafka.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as bad:
        bad.sendall(struct.pack(">ihhi", 8, 999, 0, 1))  # an API key Kafka does not have
        assert bad.recv(1) == b""
    with socket.create_connection((host, int(port)), timeout=30) as good:
        answer = _call(good, ApiVersionsRequest[3](), ApiVersionsResponse, 3)
    assert answer.error_code == 0 and answer.header.correlation_id == 11
