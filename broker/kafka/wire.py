"""The two answers on a Kafka client's hot path, Produce (v3-9) and Fetch (v4-12),
written by hand. kio's encoders are Python that checks every value's type: about
30 µs for a Produce answer of one partition and 60 for a Fetch one, where these
take 1-2. (Its decoders are native code: a hand-written reader of Produce requests
was no faster, and is not here.)

Kafka's JSON specs stay the reference: tests/kafka/test_kafka_wire.py holds these
bytes equal to what kio writes for the same values, for every version served.
"""

from __future__ import annotations

import struct

from protocol import messages as m

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_PRODUCE_PARTITION = struct.Struct(">ihqq")  # index, error, base offset, append time
_FETCH_PARTITION = struct.Struct(">ihqq")  # index, error, high watermark, stable offset
_ABORTED = struct.Struct(">qq")
PRODUCE_FLEXIBLE = 9
FETCH_FLEXIBLE = 12


def produce_response(response: m.ProduceResponse, version: int, correlation_id: int) -> bytes:
    """The Produce v3-9 response frame of `response`."""
    flexible = version >= PRODUCE_FLEXIBLE
    out = bytearray(_header(correlation_id, flexible))
    _array(out, len(response.topics), flexible)
    for topic in response.topics:
        _string(out, topic.topic, flexible)
        _array(out, len(topic.partitions), flexible)
        for p in topic.partitions:
            out += _PRODUCE_PARTITION.pack(
                p.partition, p.error, p.base_offset, p.log_append_time_ms
            )
            if version >= 5:
                out += _I64.pack(p.log_start_offset)
            if version >= 8:
                _array(out, 0, flexible)  # record_errors
                _nullable_string(out, p.message, flexible)
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    out += _I32.pack(0)  # throttle_time_ms
    if flexible:
        out.append(0)
    return _framed(out)


def fetch_response(
    response: m.FetchResponse, version: int, correlation_id: int, records: list[bytes]
) -> bytes:
    """The Fetch v4-12 response frame of `response`, each partition's records from
    `records` (the same order: already in Kafka's v2 form)."""
    flexible = version >= FETCH_FLEXIBLE
    out = bytearray(_header(correlation_id, flexible))
    out += _I32.pack(0)  # throttle_time_ms
    if version >= 7:
        out += _I16.pack(response.error)
        out += _I32.pack(0)  # session_id: no fetch sessions
    _array(out, len(response.topics), flexible)
    batches = iter(records)
    for topic in response.topics:
        _string(out, topic.topic, flexible)
        _array(out, len(topic.partitions), flexible)
        for p in topic.partitions:
            out += _FETCH_PARTITION.pack(
                p.partition, p.error, p.high_watermark, p.last_stable_offset
            )
            if version >= 5:
                out += _I64.pack(p.log_start_offset)
            aborted = p.aborted_transactions
            if aborted is None:
                out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                _array(out, len(aborted), flexible)
                for a in aborted:
                    out += _ABORTED.pack(a.producer_id, a.first_offset)
                    if flexible:
                        out.append(0)
            if version >= 11:
                out += _I32.pack(-1)  # preferred_read_replica
            data = next(batches)
            _length(out, len(data), flexible)
            out += data
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    if flexible:
        out.append(0)
    return _framed(out)


def _header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0, or v1 (with an empty tagged field section) when flexible."""
    return _I32.pack(correlation_id) + (b"\x00" if flexible else b"")


def _framed(out: bytearray) -> bytes:
    return _I32.pack(len(out)) + out


def _uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _length(out: bytearray, length: int, flexible: bool) -> None:
    """The length before an array's items or a bytes field's bytes."""
    if flexible:
        _uvarint(out, length + 1)
    else:
        out += _I32.pack(length)


def _array(out: bytearray, count: int, flexible: bool) -> None:
    _length(out, count, flexible)


def _string(out: bytearray, text: str, flexible: bool) -> None:
    data = text.encode()
    if flexible:
        _uvarint(out, len(data) + 1)
    else:
        out += _I16.pack(len(data))
    out += data


def _nullable_string(out: bytearray, text: str | None, flexible: bool) -> None:
    if text is not None:
        _string(out, text, flexible)
    elif flexible:
        out.append(0)
    else:
        out += _I16.pack(-1)
