"""Unit tests of the pure protocol package: frames, messages, record batches."""

from __future__ import annotations

import itertools
import struct
import zlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import messages as m
from protocol.batch import (
    CONTROL_COMMIT,
    BatchError,
    build_batch,
    build_batch_from_columns,
    build_control_batch,
    control_type,
    iter_records,
    scan_batches,
    validate,
    with_sequence,
)
from protocol.compression import MAGIC1_CODECS, Compression
from protocol.errors import ErrorCode
from protocol.framing import FrameDecoder, FrameError, FrameTooLarge, encode_frame

records_strategy = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        st.one_of(st.none(), st.binary(max_size=20)),
        st.one_of(st.none(), st.binary(max_size=200)),
        st.one_of(
            st.none(), st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3)
        ),
    ),
    min_size=1,
    max_size=20,
)


@pytest.mark.parametrize("codec", MAGIC1_CODECS[:4])
@given(records=records_strategy)
def test_batch_round_trip(codec: Compression, records: list) -> None:
    batch = build_batch(
        records, producer_id=7, producer_epoch=2, base_sequence=40, compression=codec
    )
    header = validate(batch)
    assert (header.record_count, header.producer_id, header.producer_epoch) == (len(records), 7, 2)
    assert header.base_sequence == 40 and header.compression == codec
    assert header.max_timestamp == max(r[0] for r in records)
    got = list(iter_records(batch, 0, header))
    assert [(r.timestamp, r.key, r.value, r.headers or None) for r in got] == [
        (ts, k, v, [tuple(h) for h in hs] if hs else None) for ts, k, v, hs in records
    ]
    assert [r.offset for r in got] == list(range(len(records)))


def test_columns_path_matches_the_record_path() -> None:
    values = [b"a" * 100, None, b"c"]
    keys = [b"k1", b"k2", None]
    a = build_batch_from_columns(values, keys, 123)
    b = build_batch([(123, k, v, None) for k, v in zip(keys, values, strict=True)])
    assert a == b


def test_with_sequence_restamps_and_keeps_crc_valid() -> None:
    batch = build_batch(
        [(1, None, b"x", None)] * 3, producer_id=1, producer_epoch=0, base_sequence=0
    )
    again = with_sequence(batch, 4, 99)
    header = validate(again)
    assert (header.producer_epoch, header.base_sequence, header.last_sequence) == (4, 99, 101)
    assert header.last_sequence == (99 + 3 - 1)
    wrapped = validate(with_sequence(batch, 0, 2**31 - 2))
    assert wrapped.last_sequence == 0


def test_control_batch() -> None:
    batch = build_control_batch(CONTROL_COMMIT, producer_id=3, producer_epoch=1, timestamp_ms=5)
    header = validate(batch)
    assert header.is_control and header.is_transactional
    assert control_type(batch, 0, header) == CONTROL_COMMIT


def _restamp(buf: bytearray) -> bytes:
    struct.pack_into(">I", buf, 12, zlib.crc32(bytes(buf[16:])))
    return bytes(buf)


def test_every_truncation_and_every_flipped_byte_is_caught() -> None:
    batch = build_batch([(1, b"k", b"value", [("h", b"v")])] * 4)
    for cut in range(len(batch)):
        with pytest.raises(BatchError) as info:
            validate(batch[:cut])
        assert info.value.code == ErrorCode.CORRUPT_MESSAGE
    for i in range(12, len(batch)):  # base_offset and batch_length are not CRC-covered
        flipped = bytearray(batch)
        flipped[i] ^= 0x01
        with pytest.raises(BatchError):
            validate(bytes(flipped))


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "code"),
    [
        (16, ">B", 0, ErrorCode.INVALID_RECORD),  # magic
        (52, ">i", 0, ErrorCode.INVALID_RECORD),  # record_count < 1
        (18, ">i", 7, ErrorCode.INVALID_RECORD),  # last_offset_delta
        (52, ">i", 9, ErrorCode.INVALID_RECORD),  # record_count disagrees with the records array
        (17, ">B", 6, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
    ],
)
def test_header_checks_answer_the_contract_codes(
    offset: int, fmt: str, value: int, code: ErrorCode
) -> None:
    buf = bytearray(build_batch([(1, None, b"v", None)] * 3))
    struct.pack_into(fmt, buf, offset, value)
    if offset == 52 and value == 9:
        struct.pack_into(">i", buf, 18, 8)
    with pytest.raises(BatchError) as info:
        validate(_restamp(buf))
    assert info.value.code == code


def test_idempotent_batch_needs_non_negative_epoch_and_sequence() -> None:
    batch = build_batch([(1, None, b"v", None)], producer_id=5, producer_epoch=-1, base_sequence=0)
    with pytest.raises(BatchError) as info:
        validate(batch)
    assert info.value.code == ErrorCode.INVALID_RECORD


def test_message_too_large() -> None:
    batch = build_batch([(1, None, b"v" * 1000, None)])
    with pytest.raises(BatchError) as info:
        validate(batch, max_bytes=500)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_scan_batches_stops_at_a_torn_tail() -> None:
    a = build_batch([(1, None, b"a", None)])
    b = build_batch([(2, None, b"b", None)] * 2)
    stream = a + b
    for cut in range(len(stream) + 1):
        found = [pos for pos, _ in scan_batches(stream[:cut])]
        expected = [p for p, size in ((0, len(a)), (len(a), len(stream))) if size <= cut]
        assert found == expected


@given(
    messages=st.lists(
        st.dictionaries(
            st.text(max_size=5), st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=50)
        ),
        max_size=5,
    )
)
def test_frames_fed_byte_at_a_time(messages: list[dict]) -> None:
    stream = b"".join(encode_frame(msg) for msg in messages)
    decoder = FrameDecoder()
    out = []
    for i in range(len(stream)):
        out.extend(decoder.feed(stream[i : i + 1]))
    assert out == messages
    assert decoder.buffered_bytes == 0


def test_frame_decoder_refuses_large_length_before_the_body() -> None:
    decoder = FrameDecoder(frame_bytes_max=1024)
    with pytest.raises(FrameTooLarge):
        decoder.feed(struct.pack(">I", 1025))
    assert decoder.buffered_bytes == 4  # nothing of the body was waited for


def test_frame_decoder_rejects_garbage() -> None:
    with pytest.raises(FrameError):
        FrameDecoder().feed(struct.pack(">I", 1) + b"\xc1")


def _body(message: dict) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def _refusal(message: dict) -> m.RequestRefused:
    with pytest.raises(m.RequestRefused) as caught:
        m.decode_request(_body(message))
    assert caught.value.cid == message["cid"]
    return caught.value


def test_decode_request_answers_what_protocol_md_says() -> None:
    """Section 1: unknown api or version -> 35; missing, mistyped or duplicated
    fields -> 42; no map or no valid cid -> the connection closes (FrameError)."""
    unsupported = [
        {"api": "Nope", "v": 1, "cid": 1},
        {"api": "Produce", "v": 9, "cid": 1},
        {"api": "Metadata", "v": 2, "cid": 1, "topics": None},
    ]
    for message in unsupported:
        assert _refusal(message).code == ErrorCode.UNSUPPORTED_VERSION, message
    invalid = {
        "no acks": {"api": "Produce", "v": 1, "cid": 1, "topics": []},
        "bool for int": {"api": "Produce", "v": 1, "cid": 1, "acks": True, "topics": []},
        "float for int": {"api": "Produce", "v": 1, "cid": 1, "acks": 1.0, "topics": []},
        "no v": {"api": "Metadata", "cid": 4},
        "no api": {"v": 1, "cid": 4},
        "isolation 2": {"api": "Fetch", "v": 1, "cid": 1, "topics": [], "isolation_level": 2},
        "str for bin": {
            "api": "Produce",
            "v": 1,
            "cid": 1,
            "acks": 1,
            "topics": [{"topic": "t", "partitions": [{"partition": 0, "records": "x"}]}],
        },
        "topic twice": {"api": "Metadata", "v": 1, "cid": 1, "topics": ["a", "b", "a"]},
        "partition twice": {
            "api": "Fetch",
            "v": 1,
            "cid": 1,
            "topics": [
                {
                    "topic": "t",
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0},
                        {"partition": 0, "fetch_offset": 9},
                    ],
                }
            ],
        },
        "empty instance id": {
            "api": "ConsumerGroupHeartbeat",
            "v": 1,
            "cid": 1,
            "group_id": "g",
            "member_id": "",
            "member_epoch": 0,
            "rebalance_timeout_ms": 1,
            "instance_id": "",
        },
        "fetch topic twice": {
            "api": "Fetch",
            "v": 1,
            "cid": 1,
            "topics": [{"topic": "t", "partitions": []}, {"topic": "t", "partitions": []}],
        },
    }
    for what, message in invalid.items():
        assert _refusal(message).code == ErrorCode.INVALID_REQUEST, what
    for closing in (b"\xc1", _body(5), _body({"api": "Metadata", "v": 1}), _body({"cid": -1})):
        with pytest.raises(FrameError):
            m.decode_request(closing)
    assert m.request_cid({"cid": -1}) is None
    assert m.request_cid({"cid": 2**31}) is None
    assert m.request_cid([1]) is None
    assert m.request_cid({"cid": 0}) == 0


ACL = m.AclBinding("topic", "orders", "prefixed", "User:alice", "*", "write", "allow")
ACL_FILTER = m.AclBindingFilter("topic", "orders", "match", None, None, None, "deny")

REQUESTS = [
    m.ApiVersionsRequest(),
    m.MetadataRequest(topics=["a"], allow_auto_create=True),
    m.CreateTopicsRequest(topics=[m.CreatableTopic("t", 3, {"retention.ms": 5})]),
    m.InitProducerIdRequest(
        transactional_id="tx", transaction_timeout_ms=1000, producer_id=5, producer_epoch=2
    ),
    m.ProduceRequest(
        acks=-1, timeout_ms=100, topics=[m.ProduceTopic("t", [m.ProducePartition(0, b"batch")])]
    ),
    m.FetchRequest(
        topics=[m.FetchTopic("t", [m.FetchPartition(0, 5, 100)])],
        max_wait_ms=10,
        min_bytes=1,
        max_bytes=1000,
        isolation_level=1,
    ),
    m.ListOffsetsRequest(topics=[m.ListOffsetsTopic("t", [m.ListOffsetsPartition(0, -2)])]),
    m.EndTxnRequest(transactional_id="tx", producer_id=3, producer_epoch=1, committed=True),
    m.PrepareTxnRequest(
        transactional_id="tx",
        producer_id=3,
        producer_epoch=1,
        prepared_timeout_ms=60_000,
        txn_app_id="sink",
        txn_app_version=4,
    ),
    m.CommitTxnsRequest(
        transactions=[m.TxnRef("a", 1, 0), m.TxnRef("b", 2, 5)],
        committed=True,
        txn_app_id="sink",
        txn_app_version=4,
    ),
    m.ListTransactionsRequest(transactional_id_prefix="spark-", states=["ONGOING", "PREPARED"]),
    m.DescribeTxnAppsRequest(txn_app_ids=["sink"]),
    m.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="",
        member_epoch=0,
        rebalance_timeout_ms=60_000,
        subscribed_topics=["a", "b"],
        owned=[m.GroupTopicPartitions("a", [0, 2])],
        instance_id="worker-1",
    ),
    m.OffsetCommitRequest(
        group_id="g",
        member_id="m-1",
        member_epoch=3,
        topics=[m.OffsetCommitTopic("a", [m.OffsetCommitPartition(0, 42, "meta")])],
    ),
    m.OffsetFetchRequest(group_id="g", topics=None, require_stable=True),
    m.TxnOffsetCommitRequest(
        transactional_id="tx",
        producer_id=3,
        producer_epoch=1,
        group_id="g",
        topics=[m.OffsetCommitTopic("a", [m.OffsetCommitPartition(1, 7)])],
    ),
    m.ListGroupsRequest(),
    m.DescribeGroupsRequest(group_ids=["g", "h"]),
    m.DeleteTopicsRequest(topics=["a", "b"]),
    m.DescribeConfigsRequest(
        resources=[m.ConfigResource("topic", "a"), m.ConfigResource("broker", "0")]
    ),
    m.IncrementalAlterConfigsRequest(
        resources=[
            m.AlterableConfigResource(
                "topic",
                "a",
                [m.AlterConfigOp("retention.ms", "set", "1000"), m.AlterConfigOp("x", "delete")],
            )
        ],
        validate_only=True,
    ),
    m.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=b"n,,n=user,r=abc"),
    m.DescribeUserScramCredentialsRequest(users=["alice"]),
    m.AlterUserScramCredentialsRequest(
        deletions=[m.ScramCredentialDeletion("bob", "SCRAM-SHA-512")],
        upsertions=[
            m.ScramCredentialUpsertion("alice", "SCRAM-SHA-256", 8192, b"s" * 16, b"p" * 32)
        ],
    ),
    m.CreateAclsRequest(creations=[ACL]),
    m.DescribeAclsRequest(filter=ACL_FILTER),
    m.DeleteAclsRequest(filters=[ACL_FILTER, m.AclBindingFilter(*[None] * 7)]),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: r.api)
def test_requests_round_trip_through_the_codec(request_: m.Request) -> None:
    body = m.encode_request(request_, 7, "me")
    wire = msgpack.unpackb(body)
    assert (wire["api"], wire["cid"], wire["v"], wire["client_id"]) == (request_.api, 7, 1, "me")
    assert m.decode_request(body) == request_


def test_every_api_is_declared_with_a_response() -> None:
    assert set(m.APIS) == {r.api for r in REQUESTS}
    for api, cls in m.REQUEST_TYPES.items():
        assert issubclass(cls.response, m.Response), api


RESPONSES = [
    m.DeleteTopicsResponse(topics=[m.DeleteTopicResult("a"), m.DeleteTopicResult("b", 3, "no")]),
    m.DescribeConfigsResponse(
        results=[
            m.DescribeConfigsResult(
                "topic",
                "a",
                configs=[
                    m.ConfigEntry("retention.ms", "1000", "topic"),
                    m.ConfigEntry("tls_keyfile_password", None, "broker", True, True),
                ],
            )
        ]
    ),
    m.IncrementalAlterConfigsResponse(
        results=[m.AlterConfigsResult("topic", "a", 40, "x is not a topic setting")]
    ),
    m.SaslAuthenticateResponse(
        error=58, error_message="no", auth_bytes=b"r=abc,s=c2FsdA==,i=4096", session_lifetime_ms=5
    ),
    m.DescribeUserScramCredentialsResponse(
        results=[
            m.DescribeUserScramCredentialsResult(
                "alice", credentials=[m.ScramCredentialInfo("SCRAM-SHA-256", 8192)]
            ),
            m.DescribeUserScramCredentialsResult("bob", 91),
        ]
    ),
    m.AlterUserScramCredentialsResponse(
        results=[m.AlterUserScramCredentialsResult("alice", 93, "iterations")]
    ),
    m.CreateAclsResponse(results=[m.AclCreationResult(), m.AclCreationResult(42, "bad")]),
    m.DescribeAclsResponse(bindings=[ACL]),
    m.DeleteAclsResponse(results=[m.AclDeletionResult(deleted=[ACL])]),
]


@pytest.mark.parametrize("response", RESPONSES, ids=lambda r: type(r).__name__)
def test_responses_round_trip_through_the_codec(response: m.Response) -> None:
    body = m.encode_response(response, 11)
    assert msgpack.unpackb(body)["cid"] == 11
    assert m.decode_response(body, type(response)) == response


def test_the_security_and_admin_apis_refuse_what_section_1_refuses() -> None:
    invalid = {
        "topic twice": {"api": "DeleteTopics", "topics": ["a", "a"]},
        "unknown resource type": {
            "api": "DescribeConfigs",
            "resources": [{"type": "group", "name": "g"}],
        },
        "resource twice": {
            "api": "DescribeConfigs",
            "resources": [{"type": "topic", "name": "a"}, {"type": "topic", "name": "a"}],
        },
        "alter a broker": {
            "api": "IncrementalAlterConfigs",
            "resources": [{"type": "broker", "name": "0", "ops": []}],
        },
        "unknown op": {
            "api": "IncrementalAlterConfigs",
            "resources": [{"type": "topic", "name": "a", "ops": [{"name": "x", "op": "append"}]}],
        },
        "setting twice": {
            "api": "IncrementalAlterConfigs",
            "resources": [
                {
                    "type": "topic",
                    "name": "a",
                    "ops": [
                        {"name": "x", "op": "delete"},
                        {"name": "x", "op": "set", "value": "1"},
                    ],
                }
            ],
        },
        "str for auth_bytes": {"api": "SaslAuthenticate", "mechanism": "PLAIN", "auth_bytes": "x"},
        "a user name over 255": {"api": "DescribeUserScramCredentials", "users": ["u" * 256]},
        "no salted_password": {
            "api": "AlterUserScramCredentials",
            "deletions": [],
            "upsertions": [
                {"user": "a", "mechanism": "SCRAM-SHA-256", "iterations": 4096, "salt": b"s"}
            ],
        },
        "a filter field missing": {"api": "DescribeAcls", "filter": {"resource_type": "topic"}},
    }
    for what, fields in invalid.items():
        assert _refusal({"v": 1, "cid": 1, **fields}).code == ErrorCode.INVALID_REQUEST, what
    # What section 7 answers per entry or with its own codes stays for the handler.
    for fields in (
        {"api": "SaslAuthenticate", "mechanism": "GSSAPI-OR-ANYTHING-LONGER", "auth_bytes": b""},
        {"api": "DescribeUserScramCredentials", "users": ["", "a", "a"]},
        {
            "api": "AlterUserScramCredentials",
            "deletions": [{"user": "", "mechanism": "MD5"}],
            "upsertions": [],
        },
        {"api": "CreateAcls", "creations": [dict.fromkeys(ACL.__struct_fields__, "bogus")]},
    ):
        assert m.decode_request(_body({"v": 1, "cid": 1, **fields})).api == fields["api"]


def test_secrets_stay_out_of_reprs() -> None:
    plain = m.SaslAuthenticateRequest(mechanism="PLAIN", auth_bytes=b"\0alice\0hunter2")
    upsertion = m.ScramCredentialUpsertion("alice", "SCRAM-SHA-256", 4096, b"s" * 16, b"hunter2")
    request = m.AlterUserScramCredentialsRequest(deletions=[], upsertions=[upsertion])
    for value in (plain, upsertion, request):
        assert "hunter2" not in repr(value) and "<hidden>" in repr(value)
    assert "alice" in repr(request)


def test_responses_decode_leniently() -> None:
    """A newer broker may add fields, and an error answer carries only cid and error."""
    body = _body({"cid": 3, "error": 0, "new_field": [1], "topics": [{"topic": "t"}]})
    response = m.decode_response(body, m.ProduceResponse)
    assert response.cid == 3 and response.topics == [m.ProduceTopicResponse("t", [])]
    refused = m.decode_response(_body({"cid": 4, "error": 42, "message": "bad"}), m.FetchResponse)
    assert (refused.error, refused.message, refused.topics) == (42, "bad", [])
    with pytest.raises(FrameError):
        m.decode_response(_body({"cid": "x"}), m.FetchResponse)


def test_instance_id_is_optional_both_ways() -> None:
    """An older client's heartbeat (no instance_id) is a dynamic member's; an older
    broker's DescribeGroups (no instance_id) describes dynamic members."""
    heartbeat = {
        "api": "ConsumerGroupHeartbeat",
        "v": 1,
        "cid": 1,
        "group_id": "g",
        "member_id": "",
        "member_epoch": 0,
        "rebalance_timeout_ms": 1,
    }
    decoded = m.decode_request(_body(heartbeat))
    assert isinstance(decoded, m.ConsumerGroupHeartbeatRequest) and decoded.instance_id is None
    member = {"member_id": "x", "member_epoch": 1}
    body = _body({"cid": 2, "error": 0, "groups": [{"group_id": "g", "members": [member]}]})
    described = m.decode_response(body, m.DescribeGroupsResponse)
    assert described.groups[0].members[0].instance_id is None


@pytest.mark.parametrize("lengths", [[0], [10], [300], [70_000], [5, 300, 70_000]])
def test_spliced_frame_equals_the_plain_frame(lengths: list[int]) -> None:
    """Splicing file bytes into the holes gives exactly the frame encode_frame makes."""
    from protocol.framing import splice_frame

    payloads = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    placeholders = [b"\x00hole%011d" % i for i in range(len(lengths))]
    message = {"cid": 3, "parts": [{"records": p, "n": i} for i, p in enumerate(placeholders)]}
    pieces = splice_frame(
        msgpack.packb(message, use_bin_type=True), list(zip(placeholders, lengths, strict=True))
    )
    spliced = b"".join(payloads[p] if isinstance(p, int) else p for p in pieces)
    real = {"cid": 3, "parts": [{"records": p, "n": i} for i, p in enumerate(payloads)]}
    assert spliced == encode_frame(real)
    assert FrameDecoder().feed(spliced) == [real]


@pytest.mark.parametrize(
    "fields",
    [
        {"txn_app_id": "sink"},  # a version must come with the app id
        {"txn_app_version": 3},
        {"txn_app_id": "sink", "txn_app_version": -1},
    ],
)
@pytest.mark.parametrize(
    "request_",
    [
        {
            "api": "CommitTxns",
            "committed": True,
            "transactions": [{"transactional_id": "a", "producer_id": 1, "producer_epoch": 0}],
        },
        {
            "api": "PrepareTxn",
            "transactional_id": "a",
            "producer_id": 1,
            "producer_epoch": 0,
            "prepared_timeout_ms": 1000,
        },
    ],
    ids=lambda r: r["api"],
)
def test_app_fields_go_together(request_: dict[str, object], fields: dict[str, object]) -> None:
    body = msgpack.packb({"v": 1, "cid": 9, **request_, **fields})
    with pytest.raises(m.RequestRefused) as refused:
        m.decode_request(body)
    assert refused.value.code == ErrorCode.INVALID_REQUEST and refused.value.cid == 9


def test_list_transactions_refuses_an_unknown_state() -> None:
    body = msgpack.packb(
        {"api": "ListTransactions", "v": 1, "cid": 1, "states": ["ONGOING", "RUNNING"]}
    )
    with pytest.raises(m.RequestRefused) as refused:
        m.decode_request(body)
    assert refused.value.code == ErrorCode.INVALID_REQUEST


@given(
    bodies=st.lists(st.binary(max_size=40), max_size=30),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
    frames_max=st.integers(1, 5),
)
def test_frames_max_hands_out_the_same_bodies_a_few_at_a_time(
    bodies: list[bytes], cuts: list[int], frames_max: int
) -> None:
    """Reads cut anywhere, at most `frames_max` bodies per call, the waiting ones taken
    before the next read: the bodies of an uncapped decoder, in order."""
    stream = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    edges = [0, *sorted(c for c in cuts if c < len(stream)), len(stream)]
    decoder = FrameDecoder()
    out: list[bytes] = []
    for start, stop in itertools.pairwise(edges):
        taken = decoder.feed_views(stream[start:stop], frames_max)
        while True:
            assert len(taken) <= frames_max
            out += map(bytes, taken)
            if not decoder.frames_waiting:
                break
            taken = decoder.feed_views(frames_max=frames_max)
            assert taken, "frames_waiting promised a whole frame"
    assert out == bodies
    assert decoder.buffered_bytes == 0


@given(
    bodies=st.lists(st.binary(max_size=40), max_size=30),
    cuts=st.lists(st.integers(0, 2000), max_size=12),
    groups=st.lists(st.integers(1, 4), max_size=12),
    frames_max=st.one_of(st.none(), st.integers(1, 5)),
)
def test_several_reads_at_once_are_taken_as_if_joined(
    bodies: list[bytes], cuts: list[int], groups: list[int], frames_max: int | None
) -> None:
    """A read-ahead's chunks fed as one list, a few lists in all: the bodies of the
    same bytes fed whole, in order, at most `frames_max` a call, nothing left over."""
    stream = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    edges = [0, *sorted(c for c in cuts if c < len(stream)), len(stream)]
    reads = [stream[start:stop] for start, stop in itertools.pairwise(edges)]
    decoder = FrameDecoder()
    out: list[bytes] = []
    sizes = iter(groups)
    while reads:
        size = next(sizes, len(reads))
        taken = decoder.feed_views(reads[:size], frames_max)
        del reads[:size]
        while True:
            assert frames_max is None or len(taken) <= frames_max
            out += map(bytes, taken)
            if not decoder.frames_waiting:
                break
            taken = decoder.feed_views(frames_max=frames_max)
    assert out == bodies
    assert decoder.buffered_bytes == 0


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 3, 70_000, 300_000]), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 1_200_000), max_size=12),
)
def test_large_frames_split_across_reads_come_out_whole(sizes: list[int], cuts: list[int]) -> None:
    """Frames begun in one read and finished in later ones (a 1 MiB produce in 256 KiB
    reads), cut into long reads kept as views and short ones copied together: each
    body comes out as bytes, equal to what was sent."""
    bodies = [bytes([i % 251]) * size + b"end%d" % i for i, size in enumerate(sizes)]
    stream = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    edges = [0, *sorted(c for c in cuts if c < len(stream)), len(stream)]
    decoder = FrameDecoder()
    out: list[bytes | memoryview] = []
    for start, stop in itertools.pairwise(edges):
        out += decoder.feed_views(stream[start:stop])
        assert decoder.buffered_bytes == (stop - sum(4 + len(b) for b in map(bytes, out)))
    assert [bytes(b) for b in out] == bodies
    assert decoder.buffered_bytes == 0


def test_frames_max_refuses_new_bytes_while_frames_wait() -> None:
    decoder = FrameDecoder()
    assert decoder.feed_views(encode_frame(1) * 3, frames_max=2) == [b"\x01", b"\x01"]
    with pytest.raises(ValueError, match="waiting frames"):
        decoder.feed_views(encode_frame(2), frames_max=2)
    assert decoder.feed_views(frames_max=2) == [b"\x01"]
    assert not decoder.frames_waiting
    with pytest.raises(ValueError, match="at least 1"):
        decoder.feed_views(encode_frame(3), frames_max=0)


def test_frames_max_refuses_a_large_length_among_the_waiting_frames() -> None:
    decoder = FrameDecoder(frame_bytes_max=1024)
    data = encode_frame(1) + encode_frame(2) + struct.pack(">I", 1025)
    assert decoder.feed_views(data, frames_max=1) == [b"\x01"]
    with pytest.raises(FrameTooLarge):
        decoder.feed_views(frames_max=1)
