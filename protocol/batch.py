"""Record batch codec: the unit that is produced, validated, stored and fetched.

| at | size | field             | notes                                                  |
|---:|-----:|-------------------|--------------------------------------------------------|
|  0 |    8 | base_offset       | int64; the client writes 0, the broker overwrites it   |
|  8 |    4 | batch_length      | int32, bytes after this field (batch = 12 + length)    |
| 12 |    4 | crc               | uint32, zlib.crc32 of bytes [16, end)                  |
| 16 |    1 | magic             | uint8, 1                                               |
| 17 |    1 | attributes        | bits 0-2 compression, bit 4 transactional, bit 5 control |
| 18 |    4 | last_offset_delta | int32, record_count - 1                                |
| 22 |    8 | base_timestamp    | int64 ms, first record                                 |
| 30 |    8 | max_timestamp     | int64 ms                                               |
| 38 |    8 | producer_id       | int64, -1 when not idempotent                          |
| 46 |    2 | producer_epoch    | int16, -1 when not idempotent                          |
| 48 |    4 | base_sequence     | int32, -1 when not idempotent                          |
| 52 |    4 | record_count      | int32, >= 1                                            |
| 56 |   .. | records           | msgpack array of record_count records (records.py),    |
|    |      |                   | compressed as a whole when bits 0-2 say so             |

All integers are big-endian. The same bytes lie on disk and travel on the wire:
the broker validates (decoding the records to count them) and stamps
``base_offset`` but never re-encodes records. Every batch is made by
`encode_batch` around an array from protocol/records.py.

A log may also hold Kafka's v2 batches (magic 2, protocol/batch_v2.py), stored as
they arrived. The functions here that read a batch look at byte 16 and hand a v2
batch to batch_v2, so the broker's storage, recovery, producer state and
transactions need not know which format a batch is in; magic 1 pays one byte compare.
"""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterator, Sequence
from typing import Any, TypeVar

import msgpack

try:
    # zlib's CRC-32, computed with carry-less multiply: 0.4 µs for 16 KiB where
    # zlib takes 4-6, a tenth of the broker's CPU per batch. Platforms without an
    # isal wheel get the same values from zlib.
    from isal.isal_zlib import crc32 as crc32
except ImportError:
    from zlib import crc32 as crc32

from protocol.batch_header import (
    COMPRESSION_MASK,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_FLAG,
    LENGTH_PREFIX_BYTES,
    MAGIC,
    MAGIC_AT,
    MAGIC_V2,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    SEQUENCE_MODULUS,
    TRANSACTIONAL_FLAG,
    BatchError,
    BatchHeader,
    Record,
    check_batch_length,
    check_codec,
    check_producer_and_size,
)
from protocol.batch_v2 import (
    HEADER_V2_BYTES,
    control_type_v2,
    crc_v2,
    decode_records_v2,
    iter_records_v2,
    read_header_v2,
    validate_v2,
    with_sequence_v2,
)
from protocol.compression import (
    DECOMPRESSED_BYTES_MAX,
    MAGIC1_CODECS,
    Compression,
    compress,
    decompress,
)
from protocol.errors import ErrorCode, ProtocolError
from protocol.records import Headers, RecordColumns, count_records, encode_rows

try:
    from protocol._records_fast import plain_header
except ImportError:  # not built here: validate_reference decides every batch
    _T = TypeVar("_T", bound=tuple[Any, ...])

    def plain_header(
        batch: bytes | bytearray | memoryview, max_bytes: int, header_type: type[_T], /
    ) -> _T | None:
        return None


HEADER = struct.Struct(">qiIBBiqqqhii")
HEADER_BYTES = HEADER.size  # 56: magic 1's header
HEADER_BYTES_MAX = HEADER_V2_BYTES  # 61: enough to read the header of either format
CRC_START = 16
OFFSET = struct.Struct(">q")
LENGTH = struct.Struct(">i")

assert HEADER_BYTES == 56
# Every whole batch of either format is longer than the larger header (a record takes
# 6 bytes or more in both), so a reader that has HEADER_BYTES_MAX bytes at a batch's
# start may decode its header whatever its magic.
assert HEADER_BYTES_MAX == 61 > HEADER_BYTES

__all__ = [
    "COMPRESSION_MASK",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CONTROL_FLAG",
    "CRC_START",
    "HEADER",
    "HEADER_BYTES",
    "HEADER_BYTES_MAX",
    "LENGTH",
    "LENGTH_PREFIX_BYTES",
    "MAGIC",
    "MAGIC_AT",
    "MAGIC_V2",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "OFFSET",
    "SEQUENCE_MODULUS",
    "TRANSACTIONAL_FLAG",
    "BatchError",
    "BatchHeader",
    "Record",
    "build_batch",
    "build_batch_from_columns",
    "build_control_batch",
    "control_type",
    "crc32",
    "decode_records",
    "encode_batch",
    "iter_records",
    "read_header",
    "scan_batches",
    "validate",
    "with_sequence",
]


def encode_batch(
    records: bytes,
    *,
    record_count: int,
    base_timestamp: int,
    max_timestamp: int,
    compression: int = Compression.NONE,
    transactional: bool = False,
    control: bool = False,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
) -> bytes:
    """A whole batch around an encoded records array (protocol/records.py), compressed
    here when `compression` says so: the header, lengths and CRC are then always right."""
    if compression not in MAGIC1_CODECS:
        raise ValueError(f"compression {compression} has no magic-1 code")
    payload = compress(compression, records) if compression != Compression.NONE else records
    attributes = (
        (compression & COMPRESSION_MASK)
        | (TRANSACTIONAL_FLAG if transactional else 0)
        | (CONTROL_FLAG if control else 0)
    )
    body = HEADER.pack(
        0,
        HEADER_BYTES - LENGTH_PREFIX_BYTES + len(payload),
        0,
        MAGIC,
        attributes,
        record_count - 1,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    crc = crc32(payload, crc32(memoryview(body)[CRC_START:]))
    return body[:12] + struct.pack(">I", crc) + body[CRC_START:] + payload


def build_batch(
    records: Sequence[tuple[int, bytes | None, bytes | None, Headers]], **stamp: Any
) -> bytes:
    """One batch of `records` given as (timestamp_ms, key, value, headers); `stamp` takes
    encode_batch's keywords from `compression` on."""
    if not records:
        raise ValueError("a batch holds at least one record")
    base_timestamp = records[0][0]
    return encode_batch(
        encode_rows(
            [(ts - base_timestamp, key, value, hs or None) for ts, key, value, hs in records]
        ),
        record_count=len(records),
        base_timestamp=base_timestamp,
        max_timestamp=max(r[0] for r in records),
        **stamp,
    )


def build_batch_from_columns(
    values: list[bytes | None],
    keys: list[bytes | None] | None,
    timestamp_ms: int,
    *,
    headers: list[Headers] | None = None,
    **stamp: Any,
) -> bytes:
    """One batch of whole columns that share one timestamp, through the column fast path."""
    if not values:
        raise ValueError("a batch holds at least one record")
    return encode_batch(
        RecordColumns(values, keys, headers).encode(),
        record_count=len(values),
        base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms,
        **stamp,
    )


def build_control_batch(
    control_type: int, *, producer_id: int, producer_epoch: int, timestamp_ms: int
) -> bytes:
    """A transaction marker: one record whose key is [0, type] and whose value is nil."""
    key = msgpack.packb([0, control_type])
    return build_batch(
        [(timestamp_ms, key, None, None)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        transactional=True,
        control=True,
    )


def with_sequence(batch: bytes, producer_epoch: int, base_sequence: int) -> bytes:
    """The same batch re-stamped with a new epoch and base sequence, CRC redone.

    Clients use this to re-sequence unacknowledged batches after an epoch bump
    without encoding their records again."""
    if batch[MAGIC_AT] == MAGIC_V2:
        return with_sequence_v2(batch, producer_epoch, base_sequence)
    buf = bytearray(batch)
    struct.pack_into(">hi", buf, 46, producer_epoch, base_sequence)
    struct.pack_into(">I", buf, 12, crc32(memoryview(buf)[CRC_START:]))
    return bytes(buf)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at `pos` of either format; the caller has checked that
    HEADER_BYTES_MAX bytes are there, or that the batch there is magic 1 and 56 are."""
    if buf[pos + MAGIC_AT] == MAGIC_V2:
        return read_header_v2(buf, pos)
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def validate(buf: bytes | bytearray | memoryview, *, max_bytes: int | None = None) -> BatchHeader:
    """Check that `buf` is exactly one well-formed batch and return its header, as
    `validate_reference` does. The common batch, uncompressed plain records, is
    accepted by one C call (`plain_header`, protocol/_records_fast.c) and the CRC:
    half the reference's time for 16 KiB (docs/benchmark-notes.md, "broker"). Every
    other batch, and every refusal, is the reference's."""
    header = plain_header(buf, -1 if max_bytes is None else max_bytes, BatchHeader)
    if header is not None and crc32(memoryview(buf)[CRC_START:]) == header.crc:
        return header
    return validate_reference(buf, max_bytes=max_bytes)


def validate_reference(
    buf: bytes | bytearray | memoryview, *, max_bytes: int | None = None
) -> BatchHeader:
    """Check that `buf` is exactly one well-formed batch and return its header.

    Raises BatchError with the error code docs/protocol.md section 2 assigns to
    each failure, checked in the order listed there. The records are decoded
    strictly (protocol/records.py) and must be exactly record_count records: a
    header that lies about its count would shift every later offset.
    `max_bytes` bounds the batch and also its records once decompressed, so a
    small body that inflates to gigabytes is refused before it is inflated.
    Kafka's v2 batches (magic 2 at byte 16) are checked by batch_v2.validate_v2."""
    if len(buf) > MAGIC_AT and buf[MAGIC_AT] == MAGIC_V2:
        return validate_v2(buf, max_bytes=max_bytes)
    inflated_max = DECOMPRESSED_BYTES_MAX if max_bytes is None else max_bytes
    size = len(buf)
    if size < HEADER_BYTES:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, f"batch truncated: {size} bytes < header")
    header = BatchHeader._make(HEADER.unpack_from(buf))
    check_batch_length(header, size)
    if crc32(memoryview(buf)[CRC_START:]) != header.crc:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, "CRC mismatch")
    if (
        header.magic != MAGIC
        or header.record_count < 1
        or header.last_offset_delta != header.record_count - 1
    ):
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"magic={header.magic} record_count={header.record_count} "
            f"last_offset_delta={header.last_offset_delta}",
        )
    check_codec(header)
    records = memoryview(buf)[HEADER_BYTES:]
    try:
        if header.compression != Compression.NONE:
            records = memoryview(decompress(header.compression, records, inflated_max))
        count = count_records(records)
    except (ValueError, ProtocolError) as exc:
        raise BatchError(ErrorCode.INVALID_RECORD, f"records undecodable: {exc}") from None
    if count != header.record_count:
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"record_count {header.record_count} but the records array holds {count}",
        )
    check_producer_and_size(header, size, max_bytes)
    return header


def scan_batches(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = True
) -> Generator[tuple[int, BatchHeader], None, None]:
    """Yield (position, header) of each whole, valid batch in a byte run.

    Stops silently at the first truncated or invalid batch: a fetch response's
    tail and a torn log tail both end that way, and the caller decides what the
    stopping point means (`pos + size` of the last yielded batch). Batches of both
    formats may follow one another; each is checked against its own CRC."""
    view = memoryview(buf)
    end = len(view)
    while pos + HEADER_BYTES <= end:
        magic = view[pos + MAGIC_AT]
        if magic == MAGIC:
            header = BatchHeader._make(HEADER.unpack_from(view, pos))
            header_bytes = HEADER_BYTES
        elif magic == MAGIC_V2 and pos + HEADER_V2_BYTES <= end:
            header = read_header_v2(view, pos)
            header_bytes = HEADER_V2_BYTES
        else:
            return
        size = header.batch_length + LENGTH_PREFIX_BYTES
        if header.batch_length < header_bytes - LENGTH_PREFIX_BYTES or pos + size > end:
            return
        if header.record_count < 1:
            return
        if (
            check_crc
            and (
                crc32(view[pos + CRC_START : pos + size])
                if magic == MAGIC
                else crc_v2(view, pos, header)
            )
            != header.crc
        ):
            return
        yield pos, header
        pos += size


def decode_records(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> list[Any]:
    """The records of the batch at `pos`, decompressed, each [timestamp_delta, key, value,
    headers]: magic 1's msgpack arrays as they are, a v2 batch's parsed into that shape."""
    if header.magic == MAGIC_V2:
        return [list(row) for row in decode_records_v2(buf, pos, header)]
    payload = memoryview(buf)[pos + HEADER_BYTES : pos + header.size_bytes]
    if header.compression != Compression.NONE:
        payload = memoryview(decompress(header.compression, payload))
    try:
        records = msgpack.unpackb(payload, use_list=True, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, f"records undecodable: {exc}") from exc
    if not isinstance(records, list) or len(records) != header.record_count:
        raise BatchError(
            ErrorCode.CORRUPT_MESSAGE,
            f"batch declares {header.record_count} records but holds "
            f"{len(records) if isinstance(records, list) else 'no array'}",
        )
    return records


def iter_records(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> Iterator[Record]:
    """Records of the batch at `pos` with their absolute offsets and timestamps."""
    if header.magic == MAGIC_V2:
        yield from iter_records_v2(buf, pos, header)
        return
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    for i, (delta, key, value, headers) in enumerate(decode_records(buf, pos, header)):
        yield Record(
            base_offset + i,
            base_ts + delta,
            key,
            value,
            [(h[0], h[1]) for h in headers] if headers else None,
        )


def control_type(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> int:
    """CONTROL_ABORT or CONTROL_COMMIT for the control batch at `pos`."""
    if header.magic == MAGIC_V2:
        return control_type_v2(buf, pos, header)
    key = decode_records(buf, pos, header)[0][1]
    return int(msgpack.unpackb(key)[1])
