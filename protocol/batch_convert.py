"""Conversion between minibroker's batch (magic 1) and Kafka's v2 batch (magic 2).

A log stores each batch as it arrived, so a Kafka client fetching a topic our SDK
wrote meets magic-1 batches: the kafka listener serves them converted by `to_v2`.
The conversion keeps what a consumer or the producer state can see: base_offset,
the producer fields, the transactional and control flags, base and max timestamps,
and every record (offset, timestamp, key, value, headers). A control batch becomes
the other format's control record for the same type (Kafka's carries coordinator
epoch 0: the broker has no coordinator epochs). The codec stays the same where the
target format has it; snappy, which magic 1 lacks, becomes lz4 unless asked
otherwise (the fast codec of the two formats' common set).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgpack

from protocol.batch import (
    HEADER_BYTES,
    MAGIC,
    MAGIC_AT,
    MAGIC_V2,
    OFFSET,
    BatchError,
    BatchHeader,
    control_type,
    encode_batch,
    iter_records,
    read_header,
    scan_batches,
)
from protocol.batch_v2 import (
    CONTROL_KEY,
    CONTROL_VALUE,
    LOG_APPEND_TIME_FLAG,
    encode_batch_v2,
    seal_batch_v2,
    v2_records_from_plain,
)
from protocol.compression import MAGIC1_CODECS, Compression, decompress
from protocol.errors import ErrorCode, ProtocolError
from protocol.records import Row, encode_rows

SNAPPY_IN_MAGIC1 = Compression.LZ4
"""The codec a snappy v2 batch gets in magic 1, which has no code for snappy."""


def to_v2(batch: bytes | memoryview, *, compression: int | None = None) -> bytes:
    """The v2 form of one whole batch: a v2 batch as it is, a magic-1 batch converted
    (with `compression` instead of its own codec when given)."""
    if batch[MAGIC_AT] == MAGIC_V2:
        return bytes(batch)
    header = read_header(batch)
    codec = header.compression if compression is None else compression
    if not header.is_control:
        converted = _plain_to_v2(batch, header, codec)
        if converted is not None:
            return converted
    rows = [(r.timestamp, r.key, r.value, r.headers) for r in iter_records(batch, 0, header)]
    if header.is_control:
        kind = control_type(batch, 0, header)
        rows = [(rows[0][0], CONTROL_KEY.pack(0, kind), CONTROL_VALUE.pack(0, 0), None)]
    return encode_batch_v2(
        rows,
        base_offset=header.base_offset,
        compression=codec,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.is_transactional,
        control=header.is_control,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
    )


def _plain_to_v2(batch: bytes | memoryview, header: BatchHeader, codec: int) -> bytes | None:
    """A magic-1 batch of plain records (no headers: what the SDK's producers write)
    converted in C, record by record without an object per record; None for any other
    batch, which `to_v2` converts through the decoded records (the reference: the
    same bytes, tests/protocol/test_batch_convert.py)."""
    payload: bytes | memoryview = memoryview(batch)[HEADER_BYTES : header.size_bytes]
    if header.compression != Compression.NONE:
        try:
            payload = decompress(header.compression, payload)
        except ProtocolError:
            return None  # the reference raises its own error for it
    records = v2_records_from_plain(payload, header.record_count)
    if records is None:
        return None
    return seal_batch_v2(
        records,
        header.record_count,
        base_offset=header.base_offset,
        compression=codec,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.is_transactional,
        control=False,
        log_append_time=False,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
    )


def to_magic1(batch: bytes | memoryview, *, snappy_as: int = SNAPPY_IN_MAGIC1) -> bytes:
    """The magic-1 form of one whole batch: a magic-1 batch as it is, a v2 batch converted.

    BatchError(INVALID_RECORD) for a header whose value is null, which magic 1 cannot
    hold. Under log-append time every record has the v2 batch's max_timestamp, as a
    Kafka client reads it; that is the converted batch's base timestamp too."""
    if batch[MAGIC_AT] == MAGIC:
        return bytes(batch)
    header = read_header(batch)
    codec = header.compression
    if codec not in MAGIC1_CODECS:
        codec = snappy_as
    log_append = header.attributes & LOG_APPEND_TIME_FLAG
    base_timestamp = header.max_timestamp if log_append else header.base_timestamp
    records = list(iter_records(batch, 0, header))
    if header.is_control:
        key = msgpack.packb([0, control_type(batch, 0, header)])
        rows: list[Row] = [(records[0].timestamp - base_timestamp, key, None, None)]
    else:
        rows = [
            (r.timestamp - base_timestamp, r.key, r.value, _magic1_headers(r.headers, r.offset))
            for r in records
        ]
    converted = bytearray(
        encode_batch(
            encode_rows(rows),
            record_count=len(rows),
            base_timestamp=base_timestamp,
            max_timestamp=header.max_timestamp,
            compression=codec,
            transactional=header.is_transactional,
            control=header.is_control,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
        )
    )
    OFFSET.pack_into(converted, 0, header.base_offset)  # not covered by the CRC
    return bytes(converted)


def _magic1_headers(
    headers: list[tuple[str, bytes | None]] | None, offset: int
) -> list[tuple[str, bytes]] | None:
    if not headers:
        return None
    out = []
    for name, value in headers:
        if value is None:
            raise BatchError(
                ErrorCode.INVALID_RECORD,
                f"record {offset}: header {name!r} is null, which magic 1 cannot hold",
            )
        out.append((name, value))
    return out


def run_to_v2(buf: bytes | memoryview, *, compression: int | None = None) -> bytes:
    """Every whole batch of a byte run (a log read) in v2 form, in order; a partial
    batch at the end is left off, as a Kafka client would skip it."""
    return b"".join(_each_to_v2(memoryview(buf), compression))


def _each_to_v2(view: memoryview, compression: int | None) -> Iterator[bytes]:
    for pos, header in scan_batches(view, check_crc=False):
        yield to_v2(view[pos : pos + header.size_bytes], compression=compression)
