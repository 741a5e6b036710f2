"""Kafka's v2 record batch (magic 2): what Kafka's clients produce and fetch.

| at | size | field                  | notes                                              |
|---:|-----:|------------------------|----------------------------------------------------|
|  0 |    8 | base_offset            | int64                                              |
|  8 |    4 | batch_length           | int32, bytes after this field                      |
| 12 |    4 | partition_leader_epoch | int32, not covered by the CRC                      |
| 16 |    1 | magic                  | int8, 2                                            |
| 17 |    4 | crc                    | uint32, CRC-32C (Castagnoli) of bytes [21, end)    |
| 21 |    2 | attributes             | bits 0-2 compression (0 none 1 gzip 2 snappy 3 lz4 |
|    |      |                        | 4 zstd), 3 timestamp type, 4 transactional,        |
|    |      |                        | 5 control, 6 delete horizon                        |
| 23 |    4 | last_offset_delta      | int32                                              |
| 27 |    8 | base_timestamp         | int64 ms                                           |
| 35 |    8 | max_timestamp          | int64 ms                                           |
| 43 |    8 | producer_id            | int64                                              |
| 51 |    2 | producer_epoch         | int16                                              |
| 53 |    4 | base_sequence          | int32                                              |
| 57 |    4 | record_count           | int32                                              |
| 61 |   .. | records                | compressed as a whole when bits 0-2 say so         |

A record: length varint, attributes int8, timestamp_delta varlong, offset_delta
varint, key (varint length, -1 = null, then bytes), value (the same), a varint
header count, then headers (varint length + UTF-8 key, varint length + value,
-1 = null). Varints are zigzag, at most 5 bytes (varlong 10), as Kafka writes them.
A control record's key is int16 version 0 + int16 type (0 ABORT, 1 COMMIT), its
value int16 version 0 + int32 coordinator epoch.

The header decodes into the same `BatchHeader` as magic 1, so the log code does not
care which format a batch is in; protocol/batch.py dispatches here on byte 16.
Validation is as strict as magic 1's: every record is parsed, its length must match
its bytes, its offset_delta its index, and nothing may trail the last one.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from protocol.batch_header import (
    CONTROL_FLAG,
    LENGTH_PREFIX_BYTES,
    MAGIC_V2,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TRANSACTIONAL_FLAG,
    BatchError,
    BatchHeader,
    Record,
    check_batch_length,
    check_codec,
    check_producer_and_size,
)
from protocol.compression import (
    DECOMPRESSED_BYTES_MAX,
    KAFKA_CODES,
    Compression,
    compress,
    decompress,
)
from protocol.errors import ErrorCode, ProtocolError

HEADER_V2 = struct.Struct(">qiibIhiqqqhii")
HEADER_V2_BYTES = HEADER_V2.size  # 61
CRC_V2_AT = 17
CRC_V2_START = 21
SEQUENCE_V2_AT = 51  # producer_epoch int16, then base_sequence int32
NO_PARTITION_LEADER_EPOCH = -1

LOG_APPEND_TIME_FLAG = 0x08
CONTROL_KEY = struct.Struct(">hh")  # version, type
CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator epoch

VARINT_BYTES_MAX = 5
VARLONG_BYTES_MAX = 10

assert HEADER_V2_BYTES == 61

HeadersV2 = Sequence[tuple[str, bytes | None]] | None
RowV2 = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]
"""A parsed record: (timestamp_delta, key, value, headers or None when it has none)."""

try:
    from protocol._records_fast import (
        crc32c,
        v2_records_parse,
        v2_records_valid,
    )
    from protocol._records_fast import (  # re-exported: batch_convert's conversion
        v2_records_from_plain as v2_records_from_plain,
    )
except ImportError:  # not built here: the Python walk below decides alone
    # The crc32c package imports importlib.metadata, and with it socket: only here.
    from crc32c import crc32c

    def v2_records_valid(records: bytes | memoryview, record_count: int, /) -> bool:
        return False

    def v2_records_from_plain(records: bytes | memoryview, record_count: int, /) -> bytes | None:
        return None

    def v2_records_parse(records: bytes | memoryview, record_count: int, /) -> list[RowV2] | None:
        return None


def read_header_v2(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the v2 header at `pos`; the caller has checked 61 bytes are there."""
    (
        base_offset,
        batch_length,
        _leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    ) = HEADER_V2.unpack_from(buf, pos)
    return BatchHeader(
        base_offset,
        batch_length,
        crc,
        magic,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )


def crc_v2(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> int:
    """The CRC-32C the v2 batch at `pos` should carry."""
    result: int = crc32c(memoryview(buf)[pos + CRC_V2_START : pos + header.size_bytes])
    return result


def validate_v2(
    buf: bytes | bytearray | memoryview, *, max_bytes: int | None = None
) -> BatchHeader:
    """Check that `buf` is exactly one well-formed v2 batch and return its header.

    The checks and their codes follow docs/protocol.md section 2 in its order; `max_bytes`
    bounds the batch and its records once decompressed, as for magic 1."""
    inflated_max = DECOMPRESSED_BYTES_MAX if max_bytes is None else max_bytes
    size = len(buf)
    if size < HEADER_V2_BYTES:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, f"batch truncated: {size} bytes < header")
    header = read_header_v2(buf)
    check_batch_length(header, size)
    if crc_v2(buf, 0, header) != header.crc:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, "CRC-32C mismatch")
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"record_count={header.record_count} last_offset_delta={header.last_offset_delta}",
        )
    check_codec(header)
    try:
        check_records_v2(_payload(buf, 0, header, inflated_max), header.record_count)
    except (ValueError, ProtocolError) as exc:
        raise BatchError(ErrorCode.INVALID_RECORD, f"records undecodable: {exc}") from None
    check_producer_and_size(header, size, max_bytes)
    return header


def _payload(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    max_bytes: int = DECOMPRESSED_BYTES_MAX,
) -> bytes | memoryview:
    """The records bytes of the batch at `pos`, inflated when compressed."""
    body = memoryview(buf)[pos + HEADER_V2_BYTES : pos + header.size_bytes]
    codec = header.compression
    if codec == Compression.NONE:
        return body
    return decompress(codec, body, max_bytes)


def _varint(data: bytes, pos: int, limit: int, max_bytes: int) -> tuple[int, int]:
    """The zigzag varint at `pos` (at most `max_bytes` bytes, none at or past `limit`) and
    the position after it."""
    value = shift = 0
    stop = min(limit, pos + max_bytes)
    while pos < stop:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
    raise ValueError(f"varint cut or longer than {max_bytes} bytes")


def parse_records_v2(
    data: bytes | memoryview, record_count: int, *, keep: bool = True
) -> list[RowV2]:
    """The `record_count` records in `data`, strictly: each record's length must be its
    bytes, its offset_delta its index, header keys UTF-8, and nothing may follow the last.

    Raises ValueError on anything else. With `keep` false the records are only checked
    (no key, value or header objects are made) and an empty list is returned."""
    try:
        return _parse(bytes(data), record_count, keep)
    except IndexError:  # a field read past the end: a cut record
        raise ValueError("record cut short") from None


def _parse(data: bytes, record_count: int, keep: bool) -> list[RowV2]:
    rows: list[RowV2] = []
    end = len(data)
    pos = 0
    for index in range(record_count):
        if pos >= end:
            raise ValueError(f"{record_count} records declared, {index} present")
        byte = data[pos]
        if byte < 0x80:  # one-byte varints: the common case, read inline
            length = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            length, pos = _varint(data, pos, end, VARINT_BYTES_MAX)
        stop = pos + length
        if length < 6 or stop > end:  # attributes and five one-byte varints at least
            raise ValueError(f"record {index}: length {length} with {end - pos} bytes left")
        pos += 1  # attributes: unused by Kafka's record format
        byte = data[pos]
        if byte < 0x80:
            delta = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            delta, pos = _varint(data, pos, stop, VARLONG_BYTES_MAX)
        byte = data[pos]
        if byte < 0x80:
            offset_delta = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            offset_delta, pos = _varint(data, pos, stop, VARINT_BYTES_MAX)
        if offset_delta != index:
            raise ValueError(f"record {index} has offset_delta {offset_delta}")
        key_length, pos = _varint(data, pos, stop, VARINT_BYTES_MAX)
        key = None
        if key_length >= 0:
            if pos + key_length > stop:
                raise ValueError(f"record {index}: key of {key_length} bytes cut")
            if keep:
                key = data[pos : pos + key_length]
            pos += key_length
        elif key_length != -1:
            raise ValueError(f"record {index}: key length {key_length}")
        value_length, pos = _varint(data, pos, stop, VARINT_BYTES_MAX)
        value = None
        if value_length >= 0:
            if pos + value_length > stop:
                raise ValueError(f"record {index}: value of {value_length} bytes cut")
            if keep:
                value = data[pos : pos + value_length]
            pos += value_length
        elif value_length != -1:
            raise ValueError(f"record {index}: value length {value_length}")
        header_count, pos = _varint(data, pos, stop, VARINT_BYTES_MAX)
        headers: list[tuple[str, bytes | None]] | None = None
        if header_count:
            headers, pos = _headers(data, pos, stop, header_count, index)
        if pos != stop:
            raise ValueError(f"record {index}: {stop - pos} bytes after its last field")
        if keep:
            rows.append((delta, key, value, headers))
    if pos != end:
        raise ValueError(f"{end - pos} bytes after record {record_count - 1}")
    return rows


def _headers(
    data: bytes, pos: int, stop: int, count: int, index: int
) -> tuple[list[tuple[str, bytes | None]], int]:
    # Each header takes at least two bytes: a bound on count before any list grows.
    if count < 0 or pos + 2 * count > stop:
        raise ValueError(f"record {index}: header count {count}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        name_length, pos = _varint(data, pos, stop, VARINT_BYTES_MAX)
        if name_length < 0 or pos + name_length > stop:
            raise ValueError(f"record {index}: header key length {name_length}")
        name = data[pos : pos + name_length].decode()
        pos += name_length
        value_length, pos = _varint(data, pos, stop, VARINT_BYTES_MAX)
        value = None
        if value_length >= 0:
            if pos + value_length > stop:
                raise ValueError(f"record {index}: header value of {value_length} bytes cut")
            value = data[pos : pos + value_length]
            pos += value_length
        elif value_length != -1:
            raise ValueError(f"record {index}: header value length {value_length}")
        headers.append((name, value))
    return headers, pos


def check_records_v2(data: bytes | memoryview, record_count: int) -> None:
    """Raise ValueError unless `data` is exactly `record_count` well-formed records.

    The C walk (protocol/_records_fast.c) answers for valid records; when it refuses,
    the reference walk here runs, to say why (and to decide, were the two to differ)."""
    if not v2_records_valid(data, record_count):
        parse_records_v2(data, record_count, keep=False)


def decode_records_v2(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> list[RowV2]:
    """The parsed records of the v2 batch at `pos`, decompressed; CORRUPT_MESSAGE when
    they do not parse (a batch served from a log was validated when appended).
    The C walk parses first; the reference runs where it declines, to decide and say why."""
    payload = _payload(buf, pos, header)
    rows = v2_records_parse(payload, header.record_count)
    if rows is not None:
        return rows
    try:
        return parse_records_v2(payload, header.record_count)
    except ValueError as exc:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, f"records undecodable: {exc}") from exc


def iter_records_v2(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> list[Record]:
    """Records of the v2 batch at `pos` with absolute offsets and timestamps: under
    log-append time (attributes bit 3) every record has the batch's max_timestamp,
    as Kafka's clients read it."""
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    log_append = header.attributes & LOG_APPEND_TIME_FLAG
    return [
        Record(
            base_offset + i,
            header.max_timestamp if log_append else base_ts + delta,
            key,
            value,
            headers,
        )
        for i, (delta, key, value, headers) in enumerate(decode_records_v2(buf, pos, header))
    ]


def control_type_v2(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> int:
    """CONTROL_ABORT or CONTROL_COMMIT for the v2 control batch at `pos`."""
    key = decode_records_v2(buf, pos, header)[0][1]
    if key is None or len(key) < CONTROL_KEY.size:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, "control record without a type")
    return int(CONTROL_KEY.unpack_from(key)[1])


def with_sequence_v2(batch: bytes, producer_epoch: int, base_sequence: int) -> bytes:
    """The same v2 batch re-stamped with a new epoch and base sequence, CRC-32C redone."""
    buf = bytearray(batch)
    struct.pack_into(">hi", buf, SEQUENCE_V2_AT, producer_epoch, base_sequence)
    struct.pack_into(">I", buf, CRC_V2_AT, crc32c(memoryview(buf)[CRC_V2_START:]))
    return bytes(buf)


def _zigzag(value: int) -> bytes:
    """`value` as Kafka's zigzag varint."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes_field(data: bytes | None) -> bytes:
    return _zigzag(-1) if data is None else _zigzag(len(data)) + data


def encode_records_v2(
    rows: Sequence[tuple[int, bytes | None, bytes | None, HeadersV2]],
) -> bytes:
    """The records field of `rows`, each (timestamp_delta, key, value, headers)."""
    out: list[bytes] = []
    for index, (delta, key, value, headers) in enumerate(rows):
        body = [b"\x00", _zigzag(delta), _zigzag(index), _bytes_field(key), _bytes_field(value)]
        body.append(_zigzag(len(headers) if headers else 0))
        for name, header_value in headers or ():
            body += (_bytes_field(name.encode()), _bytes_field(header_value))
        record = b"".join(body)
        out += (_zigzag(len(record)), record)
    return b"".join(out)


def encode_batch_v2(
    records: Sequence[tuple[int, bytes | None, bytes | None, HeadersV2]],
    *,
    base_offset: int = 0,
    compression: int = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    log_append_time: bool = False,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """One v2 batch of `records` given as (timestamp_ms, key, value, headers).

    base_timestamp and max_timestamp default to the first and the largest record
    timestamp; a converter passes them to keep another batch's exactly. `compression`
    is a `Compression`; snappy is written in xerial's framing, as Java's client does."""
    if not records:
        raise ValueError("a batch holds at least one record")
    if compression not in KAFKA_CODES:
        raise ValueError(f"compression {compression} has no v2 code")
    base_ts = records[0][0] if base_timestamp is None else base_timestamp
    max_ts = max(r[0] for r in records) if max_timestamp is None else max_timestamp
    return seal_batch_v2(
        encode_records_v2([(ts - base_ts, k, v, hs) for ts, k, v, hs in records]),
        len(records),
        base_offset=base_offset,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
        control=control,
        log_append_time=log_append_time,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        partition_leader_epoch=partition_leader_epoch,
    )


def seal_batch_v2(
    records: bytes,
    record_count: int,
    *,
    base_offset: int,
    compression: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
    control: bool,
    log_append_time: bool,
    base_timestamp: int,
    max_timestamp: int,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """One v2 batch around its encoded records field (`encode_records_v2`'s, or the
    C conversion's of magic-1 records), compressed here; header, lengths and CRC-32C
    are then always right."""
    if compression not in KAFKA_CODES:
        raise ValueError(f"compression {compression} has no v2 code")
    payload = compress(compression, records)
    attributes = (
        KAFKA_CODES[compression]
        | (LOG_APPEND_TIME_FLAG if log_append_time else 0)
        | (TRANSACTIONAL_FLAG if transactional else 0)
        | (CONTROL_FLAG if control else 0)
    )
    head = bytearray(
        HEADER_V2.pack(
            base_offset,
            HEADER_V2_BYTES - LENGTH_PREFIX_BYTES + len(payload),
            partition_leader_epoch,
            MAGIC_V2,
            0,
            attributes,
            record_count - 1,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        )
    )
    crc = crc32c(payload, crc32c(memoryview(head)[CRC_V2_START:]))
    struct.pack_into(">I", head, CRC_V2_AT, crc)
    return bytes(head) + payload


def build_control_batch_v2(
    control_type: int,
    *,
    producer_id: int,
    producer_epoch: int,
    timestamp_ms: int,
    coordinator_epoch: int = 0,
    base_offset: int = 0,
) -> bytes:
    """A v2 transaction marker: Kafka's control record for ABORT or COMMIT."""
    return encode_batch_v2(
        [
            (
                timestamp_ms,
                CONTROL_KEY.pack(0, control_type),
                CONTROL_VALUE.pack(0, coordinator_epoch),
                None,
            )
        ],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
    )
