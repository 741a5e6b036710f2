"""The pieces of Kafka's wire format that the hand-written encoders of
broker/kafka/apis/ (Produce and Fetch answers, the hot path) are made of, and the
unsigned varint its readers share. kio's
encoders are Python that checks every value's type: about 30 µs for a Produce answer
of one partition and 60 for a Fetch one, where the hand-written ones take 1-2. (Its
decoders are native code; Produce's request is read by hand all the same, in
apis/produce.py, to leave each batch a view of the frame and skip the translation.)

Kafka's JSON specs stay the reference: tests/kafka/test_kafka_wire.py holds the
hand-written bytes equal to what kio writes for the same values, for every version
served.
"""

from __future__ import annotations

import struct

I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")


def header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0, or v1 (with an empty tagged field section) when flexible."""
    return I32.pack(correlation_id) + (b"\x00" if flexible else b"")


def framed(out: bytearray) -> bytes:
    return I32.pack(len(out)) + out


def uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def length(out: bytearray, size: int, flexible: bool) -> None:
    """The length before an array's items or a bytes field's bytes."""
    if flexible:
        uvarint(out, size + 1)
    else:
        out += I32.pack(size)


def array(out: bytearray, count: int, flexible: bool) -> None:
    length(out, count, flexible)


def string(out: bytearray, text: str, flexible: bool) -> None:
    data = text.encode()
    if flexible:
        uvarint(out, len(data) + 1)
    else:
        out += I16.pack(len(data))
    out += data


def nullable_string(out: bytearray, text: str | None, flexible: bool) -> None:
    if text is not None:
        string(out, text, flexible)
    elif flexible:
        out.append(0)
    else:
        out += I16.pack(-1)


VARINT_BYTES_MAX = 5


def read_uvarint(view: bytes | memoryview, at: int) -> tuple[int, int]:
    """The unsigned varint at `at` (at most 5 bytes, as Kafka reads them) and where it
    ends; ValueError for a longer one, IndexError past the end."""
    if view[at] < 0x80:
        return view[at], at + 1
    value = shift = 0
    for i in range(at, at + VARINT_BYTES_MAX):
        byte = view[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise ValueError("a varint longer than 5 bytes")
