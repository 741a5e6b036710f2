"""A producer's writes: Produce (v3-9; Kafka 2.8 is the last release whose Produce names
topics rather than topic ids, and Kafka 4.0 reads magic 2 only, from v3, KIP-896).
InitProducerId, which librdkafka needs with Produce v3+ to enable idempotence, is in
transactions.py.

Both ends of Produce are written by hand for the hot path, each held to its kio-built
reference by tests: `read_produce` reads the request straight into the broker's, each
batch a view of the frame (the reference: kio's reader, which copies every batch, then
`translate_produce`; tests/kafka/test_kafka_produce_reader.py), and a connection's
`ProduceReader` skips what its producer's last request said already; `produce_response`
writes the answer (the reference: `answer_produce` through kio's writer;
tests/kafka/test_kafka_wire.py).
"""

from __future__ import annotations

import functools
import struct
from typing import Any

from broker.kafka.api import Exchange, KafkaApi, Values, ms
from broker.kafka.wire import (
    I16,
    I32,
    I64,
    array,
    framed,
    header,
    nullable_string,
    read_uvarint,
    string,
)
from protocol import messages as m
from protocol.framing import FrameError

_PARTITION = struct.Struct(">ihqq")  # index, error, base offset, append time
FLEXIBLE = 9
_HEADER = struct.Struct(">hhih")  # API key, version, correlation id, client id's length
_CLIENT_ID_AT = 8  # where the client id's length begins, after the correlation id
_ACKS_TIMEOUT = struct.Struct(">hi")
_ACKS_TIMEOUT_COUNT = struct.Struct(">hii")  # and the topics' count
_INDEX_SIZE = struct.Struct(">ii")  # a partition's index and its records' length
_NO_TAGS_3 = bytes(3)  # the partition's, the topic's and the request's empty tagged fields


def translate_produce(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.ProduceRequest(
        acks=req.acks,
        timeout_ms=ms(req.timeout),
        transactional_id=req.transactional_id,
        topics=[
            m.ProduceTopic(
                t.name,
                [
                    m.ProducePartition(p.index, memoryview(p.records or b""))
                    for p in t.partition_data
                ],
            )
            for t in req.topic_data
        ],
    )


class ProduceReader:
    """`read_produce` for one connection. A producer's requests of one batch differ only
    in the correlation id, the batch and its length: the reader keeps the bytes of the
    last such request from its client id to its records' length, and a request of the
    same version with the same bytes there takes that request's fields without reading
    them again (1.4 against 2.7 µs in process at v7). Reading is a function of the
    bytes, so the request is the one `read_produce` makes; any other is read whole, and
    so is one whose rest does not read, for `read_produce`'s refusal."""

    __slots__ = ("_fields", "_same", "_version")

    def __init__(self) -> None:
        self._version = -1
        self._same = b""
        """The last one-batch request's bytes from its client id to its records' length."""
        self._fields: tuple[str | None, str | None, int, int, str, int] = (None, None, 0, 0, "", 0)
        """Its client id, transactional id, acks, timeout, topic and partition."""

    def __call__(self, body: bytes | memoryview, version: int) -> m.ProduceRequest:
        view = body if type(body) is memoryview else memoryview(body)
        if version == self._version:
            at = _CLIENT_ID_AT + len(self._same)
            if view[_CLIENT_ID_AT:at] == self._same:
                try:
                    records = _one_batch(view, at, version >= FLEXIBLE)
                except (struct.error, IndexError, ValueError):
                    pass  # read whole, for its refusal
                else:
                    client_id, transactional_id, acks, timeout_ms, name, index = self._fields
                    return m.ProduceRequest(
                        acks=acks,
                        timeout_ms=timeout_ms,
                        transactional_id=transactional_id,
                        topics=[m.ProduceTopic(name, [m.ProducePartition(index, records)])],
                        client_id=client_id,
                    )
        request, records_at = _read(view, version)
        self._version = -1
        if len(request.topics) == 1 and len(request.topics[0].partitions) == 1:
            topic = request.topics[0]
            self._version = version
            self._same = bytes(view[_CLIENT_ID_AT:records_at])
            self._fields = (
                request.client_id,
                request.transactional_id,
                request.acks,
                request.timeout_ms,
                topic.topic,
                topic.partitions[0].partition,
            )
        return request


def _one_batch(view: memoryview, at: int, flexible: bool) -> memoryview:
    """The records whose length is at `at`, the last field a request of one batch has
    (in v9, but for three empty tagged field sections): ValueError where `_read` would
    not read them so (null records too), or struct.error or IndexError."""
    if flexible:
        size, at = read_uvarint(view, at)
        size -= 1
    else:
        (size,) = I32.unpack_from(view, at)
        at += 4
    if not 0 <= size <= len(view) - at:
        raise ValueError(f"records of {size} bytes")
    if flexible and view[at + size : at + size + 3] != _NO_TAGS_3:
        raise ValueError("after the records, not the three empty tagged field sections")
    return view[at : at + size]


def read_produce(body: bytes | memoryview, version: int) -> m.ProduceRequest:
    """The broker's Produce (its client id included) in a Produce v3-9 frame body, each
    batch a view of `body`: what kio's reader and `translate_produce` make of it, without
    kio's entities or its copy of every batch. FrameError for bytes that are no such
    request, where kio's reader fails, and also where kio reads what Kafka refuses (a
    null topic or partition array, which `translate_produce` cannot take, or a tagged
    field Produce does not have) or what cannot fit in the frame (an array's count
    beyond its bytes, which kio would try to allocate), and for a topic or partition
    named twice (docs/protocol.md section 1)."""
    view = body if type(body) is memoryview else memoryview(body)
    return _read(view, version)[0]


def _read(view: memoryview, version: int) -> tuple[m.ProduceRequest, int]:
    """`read_produce`'s request, and where its last partition's records' length lies."""
    try:
        return _read_flexible(view) if version >= FLEXIBLE else _read_legacy(view)
    except (struct.error, IndexError, ValueError) as exc:  # short, bad UTF-8, an entry twice
        raise FrameError(f"Kafka request cannot be decoded: Produce v{version}: {exc}") from None


def _read_legacy(view: memoryview) -> tuple[m.ProduceRequest, int]:
    """Produce v3-8 after request header v1: int16-long strings, int32-long arrays. The
    hot path of librdkafka's producers (v7), so written out in place: 2.6 against 3.0
    µs for one batch through the helpers the flexible versions use."""
    end = len(view)
    _key, _version, _correlation_id, size = _HEADER.unpack_from(view)
    at = _HEADER.size
    client_id = None
    if size != -1:
        client_id = _text(view, at, size, end)
        at += size
    (size,) = I16.unpack_from(view, at)
    at += 2
    transactional_id = None
    if size != -1:
        transactional_id = _text(view, at, size, end)
        at += size
    acks, timeout_ms, count = _ACKS_TIMEOUT_COUNT.unpack_from(view, at)
    at += _ACKS_TIMEOUT_COUNT.size
    topics = []
    records_at = 0
    if not 0 <= count <= end - at:
        raise _bad_count(count, end - at)
    for _ in range(count):
        (size,) = I16.unpack_from(view, at)
        name = _text(view, at + 2, size, end)
        at += 2 + size
        (count,) = I32.unpack_from(view, at)
        at += 4
        partitions = []
        if not 0 <= count <= end - at:
            raise _bad_count(count, end - at)
        for _ in range(count):
            index, size = _INDEX_SIZE.unpack_from(view, at)
            records_at = at + 4
            at += 8
            if size < 0 or at + size > end:
                records, at = _records(view, at, size, end)
            else:
                records = view[at : at + size]
                at += size
            partitions.append(m.ProducePartition(index, records))
        topics.append(m.ProduceTopic(name, partitions))
    request = m.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        transactional_id=transactional_id,
        topics=topics,
        client_id=client_id,
    )
    return request, records_at


def _read_flexible(view: memoryview) -> tuple[m.ProduceRequest, int]:
    """Produce v9 after request header v2: compact strings and arrays (their length + 1
    as an unsigned varint, 0 for null), a tagged field section after each structure."""
    end = len(view)
    _key, _version, _correlation_id, size = _HEADER.unpack_from(view)
    client_id, at = _string(view, _HEADER.size, size, end)  # the header's is int16-long
    at = _no_tagged_fields(view, at)
    size, at = read_uvarint(view, at)
    transactional_id, at = _string(view, at, size - 1, end)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(view, at)
    count, at = read_uvarint(view, at + 6)
    topics = []
    records_at = 0
    for _ in range(_count(count - 1, view, at)):
        size, at = read_uvarint(view, at)
        name = _text(view, at, size - 1, end)
        at += size - 1
        count, at = read_uvarint(view, at)
        partitions = []
        for _ in range(_count(count - 1, view, at)):
            (index,) = I32.unpack_from(view, at)
            records_at = at + 4
            size, at = read_uvarint(view, records_at)
            records, at = _records(view, at, size - 1, end)
            at = _no_tagged_fields(view, at)
            partitions.append(m.ProducePartition(index, records))
        at = _no_tagged_fields(view, at)
        topics.append(m.ProduceTopic(name, partitions))
    _no_tagged_fields(view, at)
    request = m.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        transactional_id=transactional_id,
        topics=topics,
        client_id=client_id,
    )
    return request, records_at


def _string(view: memoryview, at: int, size: int, end: int) -> tuple[str | None, int]:
    """The nullable string of `size` bytes (-1: null) at `at`, and where it ends."""
    if size == -1:
        return None, at
    return _text(view, at, size, end), at + size


def _text(view: memoryview, at: int, size: int, end: int) -> str:
    """The string of `size` bytes at `at`: a negative size (null, where the field has
    none, or less) or one past the frame's end is no string."""
    if size < 0 or at + size > end:
        raise ValueError(f"a string of {size} bytes at {at} of a {end}-byte frame")
    return str(view[at : at + size], "utf-8")


def _records(view: memoryview, at: int, size: int, end: int) -> tuple[memoryview, int]:
    """The records of `size` bytes at `at` as a view (null: none), and where they end."""
    if size < 0:
        if size != -1:
            raise ValueError(f"records of {size} bytes")
        return view[at:at], at
    if at + size > end:
        raise ValueError(f"records of {size} bytes past the frame's end")
    return view[at : at + size], at + size


def _count(count: int, view: memoryview, at: int) -> int:
    """An array's count, checked: never null (Kafka's Produce has no nullable array), and
    at most one item per byte left, as every item takes at least one."""
    if not 0 <= count <= len(view) - at:
        raise _bad_count(count, len(view) - at)
    return count


def _bad_count(count: int, left: int) -> ValueError:
    if count == -1:
        return ValueError("a null array")
    return ValueError(f"an array of {count} items in {left} bytes")


def _no_tagged_fields(view: memoryview, at: int) -> int:
    """Past an empty tagged field section: Produce v9 and its header have no tagged
    fields, and kio refuses any it does not know."""
    count, at = read_uvarint(view, at)
    if count:
        raise ValueError(f"{count} tagged fields where Produce has none")
    return at


def answer_produce(r: m.ProduceResponse, _version: int, _asked: None) -> Values:
    return {
        "responses": [
            {
                "name": t.topic,
                "partition_responses": [
                    {
                        "index": p.partition,
                        "error_code": p.error,
                        "base_offset": p.base_offset,
                        "log_append_time": p.log_append_time_ms,
                        "log_start_offset": p.log_start_offset,
                        "error_message": p.message,
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


def produce_response(response: m.ProduceResponse, version: int, correlation_id: int) -> bytes:
    """The Produce v3-9 response frame of `response`. The answer of one partition
    without a message, a producer's usual one, is the bytes its shape always has around
    the correlation id and the partition's numbers (`_one_partition`, cached); any other
    is written field by field."""
    if len(response.topics) == 1:
        topic = response.topics[0]
        if len(topic.partitions) == 1 and topic.partitions[0].message is None:
            p = topic.partitions[0]
            length, before, after = _one_partition(version, topic.topic)
            numbers = _PARTITION.pack(p.partition, p.error, p.base_offset, p.log_append_time_ms)
            if version >= 5:
                numbers += I64.pack(p.log_start_offset)
            return b"".join((length, I32.pack(correlation_id), before, numbers, after))
    return _field_by_field(response, version, correlation_id)


@functools.lru_cache(maxsize=1024)
def _one_partition(version: int, topic: str) -> tuple[bytes, bytes, bytes]:
    """The fixed bytes of a Produce answer of one partition of `topic` without a
    message: the frame's length prefix, the bytes between the correlation id and the
    partition's numbers, and the bytes after them."""
    flexible = version >= FLEXIBLE
    before = bytearray(b"\x00" if flexible else b"")  # the header's tagged fields
    array(before, 1, flexible)
    string(before, topic, flexible)
    array(before, 1, flexible)
    after = bytearray()
    if version >= 8:
        array(after, 0, flexible)  # record_errors
        nullable_string(after, None, flexible)
    if flexible:
        after += b"\x00\x00"  # the partition's and the topic's tagged fields
    after += I32.pack(0)  # throttle_time_ms
    if flexible:
        after.append(0)
    numbers = _PARTITION.size + (I64.size if version >= 5 else 0)
    length = I32.size + len(before) + numbers + len(after)
    return I32.pack(length), bytes(before), bytes(after)


def _field_by_field(response: m.ProduceResponse, version: int, correlation_id: int) -> bytes:
    flexible = version >= FLEXIBLE
    out = bytearray(header(correlation_id, flexible))
    array(out, len(response.topics), flexible)
    for topic in response.topics:
        string(out, topic.topic, flexible)
        array(out, len(topic.partitions), flexible)
        for p in topic.partitions:
            out += _PARTITION.pack(p.partition, p.error, p.base_offset, p.log_append_time_ms)
            if version >= 5:
                out += I64.pack(p.log_start_offset)
            if version >= 8:
                array(out, 0, flexible)  # record_errors
                nullable_string(out, p.message, flexible)
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    out += I32.pack(0)  # throttle_time_ms
    if flexible:
        out.append(0)
    return framed(out)


PRODUCE = KafkaApi(0, "Produce", 3, 9, translate_produce, answer_produce, reader=ProduceReader)
APIS = (PRODUCE,)
