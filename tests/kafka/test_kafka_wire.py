"""The kafka listener's codec, without a broker: Kafka request bytes as kafka-python
builds them in, the broker's requests out; the broker's responses out as bytes
kafka-python reads; refusals and closes as Kafka answers them."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import OffsetCommitRequest
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_response_schema
from kio.schema.index import api_key_map
from kio.serial import entity_reader

from broker.api import Answer, SplicedReply
from broker.kafka import SERVED, KafkaCodec
from broker.kafka.apis import BY_KEY, markdown_table
from broker.kafka.apis.fetch import answer_fetch, fetch_response
from broker.kafka.apis.produce import answer_produce, produce_response
from broker.kafka.entities import build, response_class, write_response
from broker.kafka.records import ONLY_V2
from broker.storage import FileSpan
from harness.kafka_requests import fetch_request, produce_request
from protocol import messages as m
from protocol.batch import build_batch, read_header, scan_batches
from protocol.framing import FrameError

ROOT = Path(__file__).resolve().parents[2]
FetchTopic = FetchRequest.FetchTopic
CommitTopic = OffsetCommitRequest.OffsetCommitRequestTopic
HEAD = struct.Struct(">hhi")


def codec() -> KafkaCodec:
    return KafkaCodec(("SCRAM-SHA-256", "PLAIN"), default_partitions=3)


def request_bytes(message: ApiMessage, correlation_id: int = 7) -> bytes:
    """A request frame body (no length prefix) as kafka-python sends it."""
    message.with_header(correlation_id=correlation_id, client_id="wire-test")
    return bytes(message.encode(header=True))


def metadata_v11(names: list[str] | None, *, allow_auto_topic_creation: bool = False) -> ApiMessage:
    """A Metadata v11 request for the topics `names` (None: all of them)."""
    topics = None
    if names is not None:
        topics = [MetadataRequest.MetadataRequestTopic(topic_id=None, name=n) for n in names]
    message: ApiMessage = MetadataRequest[11](
        topics=topics,
        allow_auto_topic_creation=allow_auto_topic_creation,
        include_topic_authorized_operations=False,
    )
    return message


def response_of(frame: bytes, cls: Any, version: int) -> tuple[int, Any]:
    """(correlation id, response) of a response frame, read by kafka-python."""
    (length,) = struct.unpack_from(">i", frame)
    assert length == len(frame) - 4
    response = cls[version].decode(frame[4:], header=True)
    return response.header.correlation_id, response


def kio_response(frame: bytes, key: int, version: int) -> tuple[int, Any]:
    """(correlation id, response) of a frame, read with kio's own entity."""
    cls = load_response_schema(key, version)
    header, used = entity_reader(cls.__header_schema__)(frame, 4)
    body, _ = entity_reader(cls)(frame, 4 + used)
    return header.correlation_id, body


def v2_batch(values: list[bytes]) -> bytes:
    """A v2 batch as kafka-python's idempotent producer builds it."""
    builder = DefaultRecordBatchBuilder(2, 0, False, 1000, 0, 0, 1 << 20)
    for offset, value in enumerate(values):
        builder.append(offset, 1_700_000_000_000 + offset, b"k", value, [("h", b"v")])
    return bytes(builder.build())


# ------------------------------------------------------------------ the table


def test_the_compatibility_doc_shows_the_served_table() -> None:
    text = (ROOT / "docs" / "kafka-compatibility.md").read_text()
    assert markdown_table() in text, "copy broker.kafka.apis.markdown_table() into the doc"


def test_produce_and_fetch_stop_below_topic_ids_and_start_at_magic_2() -> None:
    assert (BY_KEY[0].min_version, BY_KEY[0].max_version) == (3, 9)
    assert (BY_KEY[1].min_version, BY_KEY[1].max_version) == (4, 12)


# ------------------------------------------------------------------ ApiVersions


def test_api_versions_answers_the_table_under_any_correlation_id() -> None:
    c = codec()
    request = c.decode(request_bytes(ApiVersionsRequest[3](), correlation_id=-5))
    assert isinstance(request, m.ApiVersionsRequest)
    correlation, response = response_of(
        c.encode(m.ApiVersionsResponse(), request.cid), ApiVersionsResponse, 3
    )
    assert correlation == -5 and response.error_code == 0
    ranges = {(k.api_key, k.min_version, k.max_version) for k in response.api_keys}
    assert ranges == {(a.key, a.min_version, a.max_version) for a in SERVED}


def test_an_api_versions_newer_than_served_gets_v0_with_the_ranges() -> None:
    """KIP-511: the header of a version this broker does not know is read as far as
    the correlation id, and the answer is a v0 response the client can always read."""
    body = HEAD.pack(18, 9, 42) + b"\x00\x02me" + b"\x00" + b"unknown future fields"
    correlation, response = response_of(codec().decode(body), ApiVersionsResponse, 0)  # type: ignore[arg-type]
    assert correlation == 42 and response.error_code == 35
    assert {k.api_key: k.max_version for k in response.api_keys}[0] == 9


# ------------------------------------------------------------------ requests in


@pytest.mark.parametrize("version", [3, 7, 9])
def test_produce_becomes_the_brokers_produce_with_the_batch_byte_for_byte(version: int) -> None:
    batch = v2_batch([b"a", b"b"])
    message = produce_request("t", batch, version=version, acks=-1, timeout_ms=1500, partition=2)
    request = codec().decode(request_bytes(message))
    assert isinstance(request, m.ProduceRequest)
    assert (request.acks, request.timeout_ms, request.transactional_id) == (-1, 1500, None)
    assert [
        (t.topic, [(p.partition, p.records) for p in t.partitions]) for t in request.topics
    ] == [("t", [(2, batch)])]
    assert request.client_id == "wire-test"
    header = read_header(request.topics[0].partitions[0].records)
    assert (header.magic, header.producer_id, header.record_count) == (2, 1000, 2)


def test_an_acks_0_produce_leaves_nothing_waiting_for_an_answer() -> None:
    c = codec()
    message = ProduceRequest[9](transactional_id=None, acks=0, timeout_ms=1, topic_data=[])
    request = c.decode(request_bytes(message))
    assert isinstance(request, m.ProduceRequest) and not request.expects_answer()
    with pytest.raises(KeyError):
        c.encode(m.ProduceResponse(), request.cid)


@pytest.mark.parametrize("version", [4, 11, 12])
def test_fetch_becomes_the_brokers_fetch(version: int) -> None:
    fields = {
        "replica_id": -1,
        "max_wait_ms": 250,
        "min_bytes": 10,
        "max_bytes": 4096,
        "isolation_level": 1,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            FetchTopic(
                topic="t",
                partitions=[
                    FetchTopic.FetchPartition(
                        partition=1, fetch_offset=17, partition_max_bytes=1000
                    )
                ],
            )
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    request = codec().decode(request_bytes(FetchRequest[version](**fields)))
    assert request == m.FetchRequest(
        cid=request.cid,  # type: ignore[union-attr]
        client_id="wire-test",
        max_wait_ms=250,
        min_bytes=10,
        max_bytes=4096,
        isolation_level=1,
        topics=[m.FetchTopic("t", [m.FetchPartition(1, 17, 1000)])],
    )


def test_metadata_v0_and_v11_ask_for_all_topics_their_own_way() -> None:
    c = codec()
    v0 = c.decode(request_bytes(MetadataRequest[0](topics=[])))
    v11 = c.decode(request_bytes(metadata_v11(None)))
    named = c.decode(request_bytes(metadata_v11(["t"], allow_auto_topic_creation=True)))
    assert isinstance(v0, m.MetadataRequest) and v0.topics is None and v0.allow_auto_create
    assert isinstance(v11, m.MetadataRequest) and v11.topics is None
    assert not v11.allow_auto_create
    assert isinstance(named, m.MetadataRequest) and named.topics == ["t"]


def offset_commit(generation: int, member_id: str) -> OffsetCommitRequest:
    return OffsetCommitRequest[8](
        group_id="g",
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=None,
        topics=[
            CommitTopic(
                name="t",
                partitions=[
                    CommitTopic.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=12, committed_metadata="m"
                    )
                ],
            )
        ],
    )


def test_a_manually_assigned_consumers_commit_becomes_the_brokers() -> None:
    """Generation -1 and no member id: what kafka-python, aiokafka and librdkafka send
    when a consumer with assigned partitions commits."""
    request = codec().decode(request_bytes(offset_commit(-1, "")))
    assert isinstance(request, m.OffsetCommitRequest)
    assert (request.group_id, request.member_id, request.member_epoch) == ("g", "", -1)
    assert request.topics == [m.OffsetCommitTopic("t", [m.OffsetCommitPartition(0, 12, "m")])]


def test_a_group_members_commit_carries_its_generation() -> None:
    """A classic group member's commit: its member id, and its generation as the epoch
    that the group coordinator checks."""
    request = codec().decode(request_bytes(offset_commit(3, "member-1"), correlation_id=9))
    assert isinstance(request, m.OffsetCommitRequest)
    assert (request.member_id, request.member_epoch) == ("member-1", 3)


# ------------------------------------------------------------------ SASL


def test_sasl_handshake_picks_the_mechanism_for_sasl_authenticate() -> None:
    c = codec()
    refused = c.decode(request_bytes(SaslHandshakeRequest[1](mechanism="GSSAPI")))
    assert isinstance(refused, bytes)
    _, handshake = kio_response(refused, 17, 1)
    assert handshake.error_code.value == 33
    assert handshake.mechanisms == ("SCRAM-SHA-256", "PLAIN")
    early = c.decode(request_bytes(SaslAuthenticateRequest[2](auth_bytes=b"x")))
    assert isinstance(early, bytes)
    assert kio_response(early, 36, 2)[1].error_code.value == 34  # ILLEGAL_SASL_STATE
    c.decode(request_bytes(SaslHandshakeRequest[1](mechanism="PLAIN")))
    request = c.decode(request_bytes(SaslAuthenticateRequest[2](auth_bytes=b"\0u\0pw")))
    assert request == m.SaslAuthenticateRequest(
        cid=request.cid,  # type: ignore[union-attr]
        client_id="wire-test",
        mechanism="PLAIN",
        auth_bytes=b"\0u\0pw",
    )
    answer = c.encode(
        m.SaslAuthenticateResponse(auth_bytes=b"", session_lifetime_ms=60_000),
        request.cid,  # type: ignore[union-attr]
    )
    _, authenticated = kio_response(answer, 36, 2)
    assert authenticated.error_code.value == 0
    assert authenticated.session_lifetime.total_seconds() == 60


# ------------------------------------------------------------------ refusals and closes


def kafka_key(name: str) -> int:
    """The API key of a Kafka API, by its name in Kafka's specs (EndTxn, JoinGroup)."""
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
    return next(k for k, v in api_key_map.items() if v == snake)


@pytest.mark.parametrize("name", ["DescribeQuorum", "DescribeClientQuotas", "DescribeCluster"])
def test_an_api_not_served_answers_unsupported_version(name: str) -> None:
    """In its own response, where that has a top-level error code (as these do)."""
    assert kafka_key(name) not in BY_KEY
    key = kafka_key(name)
    body = HEAD.pack(key, 0, 5) + b"\x00\x00"
    correlation, response = kio_response(codec().decode(body), key, 0)  # type: ignore[arg-type]
    assert correlation == 5 and response.error_code.value == 35


@pytest.mark.parametrize(
    "head",
    [
        HEAD.pack(999, 0, 1),  # a key Kafka does not have
        HEAD.pack(0, 2, 1),  # Produce v2: magic 0/1 messages, not served (KIP-896)
        HEAD.pack(1, 13, 1),  # Fetch v13: topic ids
        b"\x00\x03\x00",  # shorter than a header
    ],
)
def test_what_kafka_would_not_parse_closes_the_connection(head: bytes) -> None:
    with pytest.raises(FrameError):
        codec().decode(head + b"\x00\x00")


def test_every_truncation_of_a_request_closes_or_decodes() -> None:
    whole = request_bytes(produce_request("t", v2_batch([b"x"]), timeout_ms=10))
    for cut in range(len(whole)):
        with pytest.raises(FrameError):
            codec().decode(whole[:cut])


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from([a.key for a in SERVED]), tail=st.binary(max_size=200))
def test_random_bytes_after_a_header_never_crash_the_decoder(key: int, tail: bytes) -> None:
    api = BY_KEY[key]
    body = HEAD.pack(key, api.max_version, 1) + tail
    try:
        out = codec().decode(body)
    except FrameError:
        return
    assert isinstance(out, m.Request | bytes)


# ------------------------------------------------------------------ responses out


def test_metadata_answers_in_kafkas_shape() -> None:
    c = codec()
    request = c.decode(request_bytes(metadata_v11(None)))
    response = m.MetadataResponse(
        brokers=[m.BrokerMetadata(0, "broker.example", 9092)],
        topics=[m.TopicMetadata("t", 0, [m.PartitionMetadata(0), m.PartitionMetadata(1)])],
    )
    _, answer = response_of(c.encode(response, request.cid), MetadataResponse, 11)  # type: ignore[union-attr]
    assert [(b.node_id, b.host, b.port) for b in answer.brokers] == [(0, "broker.example", 9092)]
    assert answer.controller_id == 0
    partitions = answer.topics[0].partitions
    assert [(p.partition_index, p.leader_id, p.replica_nodes) for p in partitions] == [
        (0, 0, [0]),
        (1, 0, [0]),
    ]


@pytest.mark.parametrize("version", [4, 12])
def test_a_fetch_of_v2_batches_goes_from_the_file_as_it_lies(tmp_path: Path, version: int) -> None:
    """The records are not in the frame the codec builds: they are the span, sent with
    sendfile; the length fields count them (int32 in v4, a varint in v12)."""
    stored = v2_batch([b"one", b"two"])
    path = tmp_path / "segment"
    path.write_bytes(b"before" + stored)
    fd = os.open(path, os.O_RDONLY)
    c = codec()
    request = c.decode(request_bytes(fetch_request("t", version=version)))
    placeholder = os.urandom(12) + (0).to_bytes(4, "big")
    span = FileSpan(fd, 6, len(stored), 2, 2, ONLY_V2)
    response = m.FetchResponse(
        topics=[
            m.FetchTopicResponse("t", [m.FetchPartitionResponse(0, 0, 2, 2, 0, None, placeholder)])
        ]
    )
    reply = SplicedReply(response, [span], [placeholder])
    try:
        pieces = c.pieces(reply, request.cid)  # type: ignore[union-attr]
        assert [type(p) for p in pieces] == [bytes, int, bytes]
        frame = b"".join(p if isinstance(p, bytes) else stored for p in pieces)
    finally:
        reply.close()
    _, answer = response_of(frame, FetchResponse, version)
    partition = answer.responses[0].partitions[0]
    assert (partition.high_watermark, bytes(partition.records)) == (2, stored)


def test_a_fetch_of_native_batches_is_converted_apart_from_the_encoding(tmp_path: Path) -> None:
    """A span of our magic-1 batches `converts`: `convert` (which the connection runs in
    a worker thread) reads it, closes it and leaves v2 batches in the answer, so the
    encoding on the event loop converts nothing; a span of v2 batches alone stays one."""
    native = build_batch([(1_700_000_000_000, b"k", b"ours", None)])
    stored = v2_batch([b"theirs"])
    path = tmp_path / "segment"
    path.write_bytes(native + stored)
    fds = [os.open(path, os.O_RDONLY), os.open(path, os.O_RDONLY)]
    holes = [os.urandom(12) + index.to_bytes(4, "big") for index in range(2)]
    spans = [
        FileSpan(fds[0], 0, len(native), 1, 1, 1 << 1),
        FileSpan(fds[1], len(native), len(stored), 1, 2, ONLY_V2),
    ]
    response = m.FetchResponse(
        topics=[
            m.FetchTopicResponse(
                "t",
                [m.FetchPartitionResponse(p, 0, 2, 2, 0, None, holes[p]) for p in range(2)],
            )
        ]
    )
    reply = SplicedReply(response, spans, holes)
    c = codec()
    assert c.converts(reply) and not c.converts(Answer(m.FetchResponse(topics=[])))
    converted = c.convert(reply)
    assert isinstance(converted, SplicedReply) and converted.spans == [spans[1]]
    with pytest.raises(OSError):
        os.fstat(fds[0])  # closed: its bytes are in the answer now
    records = response.topics[0].partitions[0].records
    assert [header.magic for _, header in scan_batches(records)] == [2]
    assert not c.converts(converted)
    converted.close()


# ------------------------------------------------------------------ the hot path's encoders

_ints = st.integers(-(2**31), 2**31 - 1)
_offsets = st.integers(-1, 2**62)
_names = st.text(min_size=1, max_size=20)
_codes = st.sampled_from([0, 1, 3, 6, 29, 45, 46, 47, 56, 58, 87])


@st.composite
def produce_responses(draw: st.DrawFn) -> m.ProduceResponse:
    partition = st.builds(
        m.ProducePartitionResponse,
        partition=_ints,
        error=_codes,
        base_offset=_offsets,
        log_append_time_ms=st.just(-1),
        log_start_offset=_offsets,
        message=st.none() | st.text(max_size=30),
    )
    topic = st.builds(
        m.ProduceTopicResponse, topic=_names, partitions=st.lists(partition, max_size=3)
    )
    return m.ProduceResponse(topics=draw(st.lists(topic, max_size=3)))


@st.composite
def fetch_responses(draw: st.DrawFn) -> m.FetchResponse:
    aborted = st.builds(m.AbortedTransaction, producer_id=_offsets, first_offset=_offsets)
    partition = st.builds(
        m.FetchPartitionResponse,
        partition=_ints,
        error=_codes,
        high_watermark=_offsets,
        last_stable_offset=_offsets,
        log_start_offset=_offsets,
        aborted_transactions=st.none() | st.lists(aborted, max_size=3),
        records=st.sampled_from([b"", v2_batch([b"x"]), v2_batch([b"y", b"z"])]),
    )
    topic = st.builds(
        m.FetchTopicResponse, topic=_names, partitions=st.lists(partition, max_size=3)
    )
    return m.FetchResponse(error=draw(_codes), topics=draw(st.lists(topic, max_size=3)))


@settings(max_examples=200, deadline=None)
@given(response=produce_responses(), version=st.integers(3, 9), correlation=_ints)
def test_the_produce_answer_is_the_bytes_kio_writes(
    response: m.ProduceResponse, version: int, correlation: int
) -> None:
    reference = write_response(
        build(response_class(0, version), answer_produce(response, version, None)), correlation
    )
    assert produce_response(response, version, correlation) == reference


@pytest.mark.parametrize("version", range(3, 10))
@pytest.mark.parametrize("topic", ["t", "tópic-ü"])
def test_a_one_partition_answer_from_its_shape_is_the_bytes_kio_writes(
    version: int, topic: str
) -> None:
    """The usual answer (one partition, no message) comes from its shape's cached bytes:
    again and again with other numbers, each the bytes kio writes."""
    for partition, error, offset in [(0, 0, 0), (7, 47, 123_456_789), (2**31 - 1, 0, -1)]:
        answer = m.ProducePartitionResponse(partition, error, offset, log_start_offset=offset)
        response = m.ProduceResponse(topics=[m.ProduceTopicResponse(topic, [answer])])
        values = answer_produce(response, version, None)
        reference = write_response(build(response_class(0, version), values), -partition)
        assert produce_response(response, version, -partition) == reference


@settings(max_examples=200, deadline=None)
@given(response=fetch_responses(), version=st.integers(4, 12), correlation=_ints)
def test_the_fetch_answer_is_the_bytes_kio_writes(
    response: m.FetchResponse, version: int, correlation: int
) -> None:
    reference = write_response(
        build(response_class(1, version), answer_fetch(response, version, None)), correlation
    )
    records = [p.records for t in response.topics for p in t.partitions]
    assert fetch_response(response, version, correlation, records) == reference
