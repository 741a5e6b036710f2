"""The hand-written Produce reader (broker/kafka/apis/produce.py `read_produce`) against
its reference, kio's reader then `translate_produce`: the same broker request from the
same bytes for every version served, each batch a view of the frame rather than a
copy, and a refusal (FrameError) wherever the reference fails or makes what Kafka
refuses; and a connection's `ProduceReader`, which skips what the last request said
already, against `read_produce` over sequences of requests. No broker: the codec
alone."""

from __future__ import annotations

import io
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer

from broker.kafka import KafkaCodec
from broker.kafka.apis.produce import ProduceReader, read_produce, translate_produce
from broker.kafka.entities import build, read_request, request_class
from protocol import messages as m
from protocol.framing import FrameError

VERSIONS = range(3, 10)
_int16 = st.integers(-(2**15), 2**15 - 1)
_int32 = st.integers(-(2**31), 2**31 - 1)
_names = st.text(max_size=12)


def kio_body(version: int, correlation_id: int, client_id: str | None, values: Any) -> bytes:
    """A Produce frame body (header and request, no length prefix) as kio writes it."""
    cls = request_class(0, version)
    assert cls is not None
    head: Any = cls.__header_schema__  # type: ignore[attr-defined]
    out = io.BytesIO()
    entity_writer(head)(
        out,
        head(
            request_api_key=0,
            request_api_version=version,
            correlation_id=correlation_id,
            client_id=client_id,
        ),
    )
    entity_writer(cls)(out, build(cls, values))
    return out.getvalue()


def reference(body: bytes, version: int) -> m.ProduceRequest | None:
    """What kio's reader and the translation make of `body`; None where either fails
    (kio's FrameError; the translation's TypeError on a null array kio lets through,
    its ValueError on a topic or partition named twice)."""
    cls = request_class(0, version)
    try:
        header, request = read_request(cls, body)  # type: ignore[arg-type]
        out = translate_produce(request, version, None)  # type: ignore[arg-type]
    except (FrameError, TypeError, ValueError):
        return None
    assert isinstance(out, m.ProduceRequest)
    out.client_id = header.client_id
    return out


def ours(body: bytes, version: int) -> m.ProduceRequest | None:
    try:
        return read_produce(body, version)
    except FrameError:
        return None


@st.composite
def produce_bodies(draw: st.DrawFn) -> tuple[int, bytes]:
    """(version, body) of a well-formed Produce of any version served."""
    version = draw(st.sampled_from(VERSIONS))
    partition = st.fixed_dictionaries(
        {"index": _int32, "records": st.none() | st.binary(max_size=40)}
    )
    topic = st.fixed_dictionaries(
        {
            "name": _names,
            "partition_data": st.lists(partition, max_size=3, unique_by=lambda p: p["index"]),
        }
    )
    values = {
        "transactional_id": draw(st.none() | _names),
        "acks": draw(st.sampled_from([-1, 0, 1]) | _int16),
        "timeout": draw(_int32),
        "topic_data": draw(st.lists(topic, max_size=3, unique_by=lambda t: t["name"])),
    }
    client_id = draw(st.none() | _names)
    return version, kio_body(version, draw(_int32), client_id, values)


@settings(max_examples=200, deadline=None)
@given(case=produce_bodies())
def test_the_reader_makes_what_kio_and_the_translation_make(case: tuple[int, bytes]) -> None:
    version, body = case
    expected = reference(body, version)
    assert expected is not None
    assert read_produce(body, version) == expected


@settings(max_examples=50, deadline=None)
@given(case=produce_bodies())
def test_every_batch_is_a_view_of_the_frame(case: tuple[int, bytes]) -> None:
    version, body = case
    for topic in read_produce(body, version).topics:
        for p in topic.partitions:
            assert p.records.obj is body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=produce_bodies(), data=st.data())
def test_damaged_bytes_are_refused_where_the_reference_refuses_them(
    case: tuple[int, bytes], data: st.DataObject
) -> None:
    """Bytes changed, cut or added anywhere: both read the same request, or both fail.
    Where ours finds an array's count beyond the frame, kio is not asked: in flexible
    versions it allocates that count first (the next test)."""
    version, body = case
    damaged = bytearray(body)
    how = data.draw(st.sampled_from(["change", "cut", "add"]))
    if how == "change":
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(damaged) - 1))
            damaged[at] = data.draw(st.integers(0, 255))
    elif how == "cut":
        damaged = damaged[: data.draw(st.integers(0, len(damaged) - 1))]
    else:
        damaged += data.draw(st.binary(min_size=1, max_size=3))
    try:
        got: m.ProduceRequest | None = read_produce(bytes(damaged), version)
    except FrameError as exc:
        if "items in" in str(exc):
            return
        got = None
    assert got == reference(bytes(damaged), version)


@pytest.mark.parametrize("count", [2**20, 2**32 - 2])
def test_an_array_count_beyond_the_frame_is_refused_before_anything_is_allocated(
    count: int,
) -> None:
    """kio's reader allocates a compact array's count before reading its items: 2**32
    topics in a 20-byte Produce v9 aborted the broker's process (Rust's out-of-memory
    abort, no exception). Ours refuses it: every item takes at least one byte."""
    varint = bytearray()
    value = count + 1
    while value >= 0x80:
        varint.append(value & 0x7F | 0x80)
        value >>= 7
    varint.append(value)
    body = struct.pack(">hhih", 0, 9, 1, -1) + b"\x00" + b"\x00" + struct.pack(">hi", 1, 0)
    with pytest.raises(FrameError, match="items in"):
        read_produce(body + bytes(varint), 9)


@pytest.mark.parametrize("version", [7, 9])
def test_a_topic_or_partition_named_twice_closes_the_connection(version: int) -> None:
    """The reference's translation raised ValueError out of the codec for these."""
    twice_topic = [
        {"name": "t", "partition_data": [{"index": 0, "records": b""}]},
        {"name": "t", "partition_data": [{"index": 1, "records": b""}]},
    ]
    twice_partition = [
        {"name": "t", "partition_data": [{"index": 0, "records": b""}, {"index": 0}]},
    ]
    for topics in (twice_topic, twice_partition):
        values = {"acks": 1, "timeout": 10, "topic_data": topics}
        with pytest.raises(FrameError, match="listed twice"):
            KafkaCodec((), 1).decode(kio_body(version, 1, "c", values))


@pytest.mark.parametrize("version", [7, 9])
def test_a_null_topic_array_closes_the_connection(version: int) -> None:
    """kio reads it as None, which the reference's translation could not iterate;
    Kafka refuses a null where its Produce has a non-nullable array."""
    head = struct.pack(">hhih", 0, version, 1, -1) + (b"\x00" if version >= 9 else b"")
    txn = b"\x00" if version >= 9 else struct.pack(">h", -1)
    null = b"\x00" if version >= 9 else struct.pack(">i", -1)
    with pytest.raises(FrameError, match="null array"):
        KafkaCodec((), 1).decode(head + txn + struct.pack(">hi", 1, 0) + null)


def _damaged(body: bytes, data: st.DataObject) -> bytes:
    """`body` with bytes changed after its API key and version, cut, or added to."""
    damaged = bytearray(body)
    how = data.draw(st.sampled_from(["change", "cut", "add"]))
    if how == "change":
        for _ in range(data.draw(st.integers(1, 3))):
            damaged[data.draw(st.integers(4, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    elif how == "cut":
        damaged = damaged[: data.draw(st.integers(4, len(damaged) - 1))]
    else:
        damaged += data.draw(st.binary(min_size=1, max_size=3))
    return bytes(damaged)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from(VERSIONS), data=st.data())
def test_a_connections_reader_reads_each_request_as_read_produce_does(
    version: int, data: st.DataObject
) -> None:
    """One producer's requests of one batch (another correlation id and batch each time),
    now and then with another field, in another shape, or damaged: the connection's
    reader makes of each what `read_produce` makes of it alone."""
    fields = {
        "client_id": data.draw(st.none() | _names),
        "transactional_id": data.draw(st.none() | _names),
        "acks": data.draw(st.sampled_from([-1, 0, 1])),
        "timeout": data.draw(_int32),
        "name": data.draw(_names),
        "index": data.draw(_int32),
    }
    reader = ProduceReader()
    for _ in range(data.draw(st.integers(2, 8))):
        kind = data.draw(st.sampled_from(["same", "same", "changed", "other", "damaged"]))
        if kind == "changed":
            name = data.draw(st.sampled_from(sorted(fields)))
            strategy = {"acks": _int16, "timeout": _int32, "index": _int32}.get(name, _names)
            fields[name] = data.draw(strategy)
        values = {
            "transactional_id": fields["transactional_id"],
            "acks": fields["acks"],
            "timeout": fields["timeout"],
            "topic_data": [
                {
                    "name": fields["name"],
                    "partition_data": [
                        {"index": fields["index"], "records": data.draw(st.binary(max_size=30))}
                    ],
                }
            ],
        }
        body = kio_body(version, data.draw(_int32), fields["client_id"], values)
        if kind == "other":
            _, body = data.draw(produce_bodies().filter(lambda case: case[0] == version))
        elif kind == "damaged":
            body = _damaged(body, data)
        try:
            expected: m.ProduceRequest | None = read_produce(body, version)
        except FrameError:
            expected = None
        try:
            got: m.ProduceRequest | None = reader(body, version)
        except FrameError:
            got = None
        assert got == expected


def test_a_v9_request_like_the_last_but_for_a_tagged_field_is_refused() -> None:
    """The reader takes the last request's fields only where the rest reads as
    `read_produce` reads it: in v9, the empty tagged field sections after the records."""
    batch = {"index": 0, "records": b"batch"}
    values = {"acks": 1, "timeout": 10, "topic_data": [{"name": "t", "partition_data": [batch]}]}
    body = kio_body(9, 1, "c", values)
    assert body.endswith(b"batch" + bytes(3))
    reader = ProduceReader()
    assert reader(body, 9) == read_produce(body, 9)
    tagged = body[:-3] + b"\x01\x00\x01x" + bytes(2)  # one tagged field in the partition
    with pytest.raises(FrameError, match="tagged fields"):
        reader(tagged, 9)
    assert reader(body, 9).topics[0].partitions[0].records == b"batch"
