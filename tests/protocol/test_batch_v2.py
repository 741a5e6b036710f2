"""Kafka's v2 record batch (protocol/batch_v2.py) and its conversion to and from ours.

What is tried: encode -> validate -> decode for every codec (snappy in xerial's
framing and as a raw block) with headers, null keys, values and header values;
each way a batch can be wrong, answered with its code and the bytes untouched;
decompression bombs refused before they inflate; kafka-python's own v2 codec
(an independent implementation) reading ours and ours reading its, per codec;
the C record walk against the Python reference on random and damaged records;
random and mutated bytes, which may only raise BatchError; the converters, both
ways, on data and control batches; and the magic-byte dispatch in protocol.batch.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import cramjam
import crc32c
import lz4.frame
import msgpack
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

import protocol.batch_v2 as v2
from protocol.batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    MAGIC,
    MAGIC_V2,
    BatchError,
    Record,
    build_batch,
    build_control_batch,
    control_type,
    decode_records,
    encode_batch,
    iter_records,
    read_header,
    scan_batches,
    validate,
    with_sequence,
)
from protocol.batch_convert import run_to_v2, to_magic1, to_v2
from protocol.batch_v2 import (
    HEADER_V2,
    build_control_batch_v2,
    encode_batch_v2,
    encode_records_v2,
    parse_records_v2,
)
from protocol.compression import KAFKA_CODES, MAGIC1_CODECS, Compression
from protocol.errors import ErrorCode
from protocol.records import encode_rows

try:
    from protocol._records_fast import crc32c as built_crc32c
    from protocol._records_fast import v2_records_parse, v2_records_valid
except ImportError:  # pragma: no cover - the differential tests then say so
    built_crc32c = v2_records_parse = v2_records_valid = None

MiB = 1 << 20
CODECS = list(Compression)
ROWS: list[tuple[int, bytes | None, bytes | None, Any]] = [
    (1_000, b"key", b"value", [("h", b"x"), ("null", None), ("", b"")]),
    (1_003, None, b"no key", None),
    (1_001, b"no value", None, []),
    (999, None, None, [("\u00e9t\u00e9", b"\x00\xff")]),
    (1_002, b"", b"" * 0 + b"v" * 300, None),
]


def records_of(batch: bytes) -> list[Record]:
    return list(iter_records(batch, 0, read_header(batch)))


def expected(rows: list[tuple[int, bytes | None, bytes | None, Any]], base: int = 0) -> list:
    return [
        Record(base + i, ts, k, v, list(hs) if hs else None)
        for i, (ts, k, v, hs) in enumerate(rows)
    ]


def framed(
    records: bytes,
    record_count: int,
    *,
    code: int = 0,
    last_offset_delta: int | None = None,
    producer: tuple[int, int, int] = (-1, -1, -1),
    attributes: int = 0,
) -> bytes:
    """A v2 batch around a records field as given (compressed or not), lengths and CRC-32C
    right: the header may lie about the records, the framing does not."""
    head = bytearray(
        HEADER_V2.pack(
            0,
            HEADER_V2.size - 12 + len(records),
            -1,
            MAGIC_V2,
            0,
            code | attributes,
            record_count - 1 if last_offset_delta is None else last_offset_delta,
            1_000,
            1_000,
            *producer,
            record_count,
        )
    )
    struct.pack_into(">I", head, 17, crc32c.crc32c(bytes(head[21:]) + records))
    return bytes(head) + records


def refused(batch: bytes, code: ErrorCode, max_bytes: int | None = None) -> str:
    before = bytes(batch)
    with pytest.raises(BatchError) as info:
        validate(batch, max_bytes=max_bytes)
    assert info.value.code == code, info.value.message
    assert batch == before  # validation never alters what it checks
    return info.value.message


# -- round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_through_validate_and_decode(codec: Compression) -> None:
    batch = encode_batch_v2(
        ROWS,
        compression=codec,
        producer_id=42,
        producer_epoch=3,
        base_sequence=7,
        transactional=True,
    )
    header = validate(batch, max_bytes=MiB)
    assert (header.magic, header.compression, header.record_count) == (MAGIC_V2, codec, 5)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 7)
    assert (header.base_timestamp, header.max_timestamp) == (1_000, 1_003)
    assert header.is_transactional and not header.is_control
    assert header.crc == crc32c.crc32c(batch[21:])
    assert header.size_bytes == len(batch) and header.last_offset_delta == 4
    assert records_of(batch) == expected(ROWS)
    assert [list(r) for r in decode_records(batch, 0, header)] == [
        [ts - 1_000, k, v, list(hs) if hs else None] for ts, k, v, hs in ROWS
    ]


def test_snappy_is_read_in_xerial_framing_and_as_a_raw_block() -> None:
    records = encode_records_v2([(ts - 1_000, k, v, hs) for ts, k, v, hs in ROWS])
    xerial = encode_batch_v2(ROWS, compression=Compression.SNAPPY)
    assert xerial[61:69] == b"\x82SNAPPY\x00"
    raw = framed(bytes(cramjam.snappy.compress_raw(records)), 5, code=2)
    many_blocks = encode_batch_v2([(1_000, None, bytes(70_000), None)], compression=4)
    for batch in (xerial, raw, many_blocks):
        assert validate(batch).compression == Compression.SNAPPY
    assert records_of(raw) == records_of(xerial) == expected(ROWS)
    assert records_of(many_blocks)[0].value == bytes(70_000)


def test_log_append_time_gives_every_record_the_max_timestamp() -> None:
    batch = encode_batch_v2(ROWS, log_append_time=True, max_timestamp=5_000)
    assert [r.timestamp for r in records_of(batch)] == [5_000] * 5


def test_with_sequence_restamps_a_v2_batch() -> None:
    batch = encode_batch_v2(ROWS, producer_id=1, producer_epoch=0, base_sequence=0)
    header = validate(with_sequence(batch, 4, 99))
    assert (header.producer_epoch, header.base_sequence, header.magic) == (4, 99, MAGIC_V2)


def test_control_batches_of_either_format_say_their_type() -> None:
    for kind in (CONTROL_ABORT, CONTROL_COMMIT):
        ours = build_control_batch(kind, producer_id=5, producer_epoch=1, timestamp_ms=9)
        theirs = build_control_batch_v2(kind, producer_id=5, producer_epoch=1, timestamp_ms=9)
        for batch in (ours, theirs):
            header = validate(batch)
            assert header.is_control and header.is_transactional
            assert control_type(batch, 0, header) == kind
        assert records_of(theirs)[0].key == struct.pack(">hh", 0, kind)
        assert records_of(theirs)[0].value == struct.pack(">hi", 0, 0)


def test_scan_batches_walks_a_run_of_both_formats_and_stops_at_a_bad_crc32c() -> None:
    ours = build_batch([(1, b"k", b"v", None)])
    theirs = encode_batch_v2(ROWS, compression=Compression.ZSTD)
    run = ours + theirs + ours + theirs
    assert [(p, h.magic) for p, h in scan_batches(run)] == [
        (0, MAGIC),
        (len(ours), MAGIC_V2),
        (len(ours + theirs), MAGIC),
        (len(ours + theirs + ours), MAGIC_V2),
    ]
    damaged = bytearray(run)
    damaged[len(ours) + 70] ^= 1
    assert [p for p, _ in scan_batches(bytes(damaged))] == [0]
    assert len(list(scan_batches(bytes(damaged), check_crc=False))) == 4
    assert [p for p, _ in scan_batches(run[:-1])] == [0, len(ours), len(ours + theirs)]
    assert [p for p, _ in scan_batches(run[: len(ours) + 60])] == [0]  # v2 header cut


# -- refusals ----------------------------------------------------------------------------

RECORD = encode_records_v2([(0, b"k", b"v", None)])
TWO = encode_records_v2([(0, b"k", b"v", None), (0, None, b"w", [("h", b"x")])])


def _record(body: bytes) -> bytes:
    """One record of `body` (attributes onwards) with its length prefix."""
    return v2._zigzag(len(body)) + body


def test_framing_errors_are_corrupt_message() -> None:
    batch = encode_batch_v2(ROWS)
    refused(batch[:60], ErrorCode.CORRUPT_MESSAGE)
    refused(batch[:16], ErrorCode.CORRUPT_MESSAGE)
    refused(batch[:-1], ErrorCode.CORRUPT_MESSAGE)
    refused(batch + b"\x00", ErrorCode.CORRUPT_MESSAGE)
    for at in (17, 21, 30, 60, 70, len(batch) - 1):
        damaged = bytearray(batch)
        damaged[at] ^= 0x40
        assert "CRC" in refused(bytes(damaged), ErrorCode.CORRUPT_MESSAGE)
    # The CRC is checked before the codec: a bad CRC with an unknown codec is corrupt.
    unknown = bytearray(framed(RECORD, 1, code=5))
    unknown[-1] ^= 1
    refused(bytes(unknown), ErrorCode.CORRUPT_MESSAGE)


@pytest.mark.parametrize("code", [5, 6, 7])
def test_unknown_codecs_are_unsupported(code: int) -> None:
    refused(framed(RECORD, 1, code=code), ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)


def test_magic_1_still_refuses_codes_4_to_7() -> None:
    rows = encode_rows([(0, b"k", b"v", None)])
    for code in range(4, 8):
        batch = bytearray(encode_batch(rows, record_count=1, base_timestamp=0, max_timestamp=0))
        batch[17] = code
        struct.pack_into(">I", batch, 12, zlib.crc32(batch[16:]))
        refused(bytes(batch), ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)
    with pytest.raises(ValueError):
        encode_batch(rows, record_count=1, base_timestamp=0, max_timestamp=0, compression=4)
    with pytest.raises(ValueError):
        Compression.parse("snappy")


def test_unknown_magic_is_an_invalid_record() -> None:
    batch = bytearray(build_batch([(1, b"k", b"v", None)]))
    for magic in (0, 3, 255):
        batch[16] = magic
        struct.pack_into(">I", batch, 12, zlib.crc32(batch[16:]))
        refused(bytes(batch), ErrorCode.INVALID_RECORD)


@pytest.mark.parametrize(
    ("records", "count", "why"),
    [
        (RECORD, 0, "record_count"),
        (TWO, 3, "declared"),  # count too high
        (TWO, 1, "bytes after record"),  # count too low
        (b"", 1, "declared"),
        (RECORD + b"\x00", 1, "bytes after record"),
        (_record(b"\x00\x00\x02\x02k\x02v\x00"), 1, "offset_delta"),  # offset_delta 1 for 0
        (_record(b"\x00\x00\x00\x02k\x02v\x00") + _record(b"\x00\x00\x00\x00\x00\x00"), 2, ""),
        (_record(b"\x00\x00\x00\x02k\x02v\x00\x00"), 1, "after its last field"),  # long length
        (_record(b"\x00\x00\x00\x02k\x02v")[:-1], 1, ""),  # length past the end
        (b"\x0b\x00\x00\x00\x02k\x02v\x00", 1, "length"),  # length longer than the bytes
        (_record(b"\x00\x00\x00\x03\x02v\x00"), 1, "key length"),  # key length -2
        (_record(b"\x00\x00\x00\x02k\x05\x00"), 1, "value length"),  # value length -3
        (_record(b"\x00\x00\x00\x02k\x02v\x02\x02\xff\xfe\x00"), 1, "utf-8"),  # bad key text
        (_record(b"\x00\x00\x00\x02k\x02v\x01"), 1, "header count"),  # -1 headers
        (_record(b"\x00\x00\x00\x02k\x02v\x02\x01\x00"), 1, "header key length"),
        (_record(b"\x00\x00\x00\x02k\x02v\x02\x02h\x03"), 1, "header value length"),
        (_record(b"\x00\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x00\x00\x00\x00"), 1, "varint"),
        (_record(b"\x00\x00\x00\x80\x80\x80\x80\x80\x01\x00\x00"), 1, "varint"),
        (b"\x80\x80\x80\x80\x80\x01", 1, "varint"),
        (_record(b"\x00\x00\x00\x00\x00"), 1, "length"),  # shorter than any record
    ],
)
def test_records_that_are_not_record_count_well_formed_records_are_invalid(
    records: bytes, count: int, why: str
) -> None:
    batch = framed(records, count, last_offset_delta=max(count - 1, 0))
    message = refused(batch, ErrorCode.INVALID_RECORD)
    assert why.lower() in message.lower()
    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        compressed = framed(v2.compress(codec, records), count, code=KAFKA_CODES[codec])
        refused(compressed, ErrorCode.INVALID_RECORD)


def test_header_fields_that_disagree_are_invalid() -> None:
    refused(framed(TWO, 2, last_offset_delta=0), ErrorCode.INVALID_RECORD)
    refused(framed(RECORD, 1, producer=(5, -1, 0)), ErrorCode.INVALID_RECORD)
    refused(framed(RECORD, 1, producer=(5, 0, -1)), ErrorCode.INVALID_RECORD)
    assert validate(framed(RECORD, 1, producer=(5, 0, 0))).is_idempotent


def test_too_large_is_message_too_large_after_everything_else() -> None:
    batch = encode_batch_v2(ROWS)
    refused(batch, ErrorCode.MESSAGE_TOO_LARGE, max_bytes=len(batch) - 1)
    assert validate(batch, max_bytes=len(batch)).record_count == 5
    refused(framed(TWO, 3), ErrorCode.INVALID_RECORD, max_bytes=10)


BOMB = encode_records_v2([(0, None, bytes(4 * MiB), None)])


@pytest.mark.parametrize(
    "payload",
    [
        gzip.compress(BOMB),
        zstandard.ZstdCompressor().compress(BOMB),
        lz4.frame.compress(BOMB),
        bytes(cramjam.snappy.compress_raw(BOMB)),
        v2.compress(Compression.SNAPPY, BOMB),
    ],
    ids=["gzip", "zstd", "lz4", "snappy-raw", "snappy-xerial"],
)
def test_a_bomb_is_refused_before_it_inflates(payload: bytes) -> None:
    codec = {b"\x1f\x8b": 1, b"\x28\xb5": 4, b"\x04\x22": 3}.get(payload[:2], 2)
    batch = framed(payload, 1, code=codec)
    assert len(batch) < MiB // 4
    with counting_inflation() as inflated:
        refused(batch, ErrorCode.INVALID_RECORD, max_bytes=MiB)
    assert max(inflated, default=0) <= MiB
    assert validate(batch).record_count == 1  # the default bound (64 MiB) lets it through


@contextmanager
def counting_inflation() -> Iterator[list[int]]:
    """The size of everything batch_v2 inflates while the block runs."""
    sizes: list[int] = []
    real = v2.decompress

    def spy(codec: int, data: Any, max_bytes: int = v2.DECOMPRESSED_BYTES_MAX) -> bytes:
        out = real(codec, data, max_bytes)
        sizes.append(len(out))
        return out

    with mock.patch.object(v2, "decompress", spy):
        yield sizes


def test_a_snappy_block_that_lies_about_its_length_is_refused() -> None:
    block = bytearray(cramjam.snappy.compress_raw(RECORD))
    block[0] += 1  # declares one byte more than it holds
    refused(framed(bytes(block), 1, code=2), ErrorCode.INVALID_RECORD)
    xerial = v2.compress(Compression.SNAPPY, RECORD)
    refused(framed(xerial[:-1], 1, code=2), ErrorCode.INVALID_RECORD)
    refused(framed(xerial[:20], 1, code=2), ErrorCode.INVALID_RECORD)
    refused(framed(xerial[:10], 1, code=2), ErrorCode.INVALID_RECORD)


# -- kafka-python's codec, an independent implementation ---------------------------------


class _RawSnappy:
    """python-snappy's block API, from cramjam: kafka-python frames it in xerial itself."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))


@pytest.fixture
def kafka_snappy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_codec, "snappy", _RawSnappy)


KAFKA_PYTHON_CODE = {
    Compression.NONE: 0,
    Compression.GZIP: 1,
    Compression.SNAPPY: 2,
    Compression.LZ4: 3,
    Compression.ZSTD: 4,
}


@pytest.mark.usefixtures("kafka_snappy")
@pytest.mark.parametrize("codec", CODECS)
def test_we_read_what_kafka_python_writes(codec: Compression) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=KAFKA_PYTHON_CODE[codec],
        is_transactional=True,
        producer_id=9,
        producer_epoch=2,
        base_sequence=11,
        batch_size=MiB,
    )
    for i, (ts, key, value, headers) in enumerate(ROWS):
        builder.append(i, timestamp=ts, key=key, value=value, headers=list(headers or ()))
    batch = bytes(builder.build())
    header = validate(batch, max_bytes=MiB)
    assert (header.compression, header.producer_id, header.base_sequence) == (codec, 9, 11)
    assert header.is_transactional
    assert records_of(batch) == expected(ROWS)


@pytest.mark.usefixtures("kafka_snappy")
@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_reads_what_we_write(codec: Compression) -> None:
    batch = encode_batch_v2(
        ROWS, compression=codec, producer_id=9, producer_epoch=2, base_sequence=1
    )
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc()
    assert (theirs.compression_type, theirs.producer_id, theirs.base_sequence) == (
        KAFKA_PYTHON_CODE[codec],
        9,
        1,
    )
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in theirs]
    assert got == [(i, ts, k, v, list(hs or ())) for i, (ts, k, v, hs) in enumerate(ROWS)]


# -- the C walk against the Python reference ---------------------------------------------

texts = st.text(max_size=6)
blobs = st.one_of(st.none(), st.binary(max_size=200))
rows_strategy = st.lists(
    st.tuples(
        st.integers(-(2**40), 2**40),
        blobs,
        blobs,
        st.one_of(st.none(), st.lists(st.tuples(texts, blobs), max_size=3)),
    ),
    min_size=0,
    max_size=20,
)


def reference_accepts(data: bytes, count: int) -> bool:
    try:
        parse_records_v2(data, count, keep=False)
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_strategy, edit=st.integers(0, 6), at=st.integers(0, 10**6), byte=st.integers(0, 255)
)
def test_the_c_walks_agree_with_the_reference(rows: list, edit: int, at: int, byte: int) -> None:
    assert v2_records_parse is not None and v2_records_valid is not None, "C walk not built"
    data = bytearray(encode_records_v2(rows))
    count = len(rows)
    if data:
        at %= len(data)
        if edit == 1:
            data[at] = byte
        elif edit == 2:
            del data[at:]
        elif edit == 3:
            data.insert(at, byte)
        elif edit == 4:
            count += 1
        elif edit == 5:
            count = max(count - 1, 0)
    accepted = reference_accepts(bytes(data), count)
    assert v2_records_valid(bytes(data), count) == accepted
    parsed = v2_records_parse(bytes(data), count)
    if not accepted:
        assert parsed is None
    elif parsed is not None:  # None only for a 10-byte timestamp varlong: rare here
        assert parsed == parse_records_v2(bytes(data), count)
    if edit == 0:
        assert parsed == parse_records_v2(bytes(data), count)
        assert parsed == [(d, k, v, list(hs) if hs else None) for d, k, v, hs in rows]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=5000), split=st.integers(0, 5000))
def test_the_c_crc32c_agrees_with_the_crc32c_package(data: bytes, split: int) -> None:
    assert built_crc32c is not None, "protocol/_records_fast.c is not built"
    assert built_crc32c(data) == crc32c.crc32c(data)
    split = min(split, len(data))
    assert built_crc32c(memoryview(data)[split:], built_crc32c(data[:split])) == crc32c.crc32c(data)
    assert built_crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


@pytest.mark.parametrize("size", [767, 768, 769, 775, 776, 1536, 2311, 16_384, 16_500, 70_000])
def test_the_c_crc32c_of_three_runs_at_once_agrees(size: int) -> None:
    """The SSE 4.2 path sums three 256-byte runs in parallel and joins them: every size
    around a multiple of 768 bytes, and the batch sizes, against the package."""
    data = bytes((i * 131 + size) & 0xFF for i in range(size))
    assert built_crc32c is not None, "protocol/_records_fast.c is not built"
    assert built_crc32c(data) == crc32c.crc32c(data)
    assert built_crc32c(data, 0x1234_5678) == crc32c.crc32c(data, 0x1234_5678)


# -- garbage and mutations ---------------------------------------------------------------

SEEDS = [
    encode_batch_v2(ROWS, compression=c, producer_id=3, producer_epoch=0, base_sequence=0)
    for c in CODECS
]


def _refit(data: bytearray) -> bytes:
    """Lengths and CRC-32C made right again, so a mutation reaches the records."""
    if len(data) >= 61:
        data[16] = MAGIC_V2
        struct.pack_into(">i", data, 8, len(data) - 12)
        struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.sampled_from(SEEDS),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10**6),
    refit=st.booleans(),
    garbage=st.binary(max_size=200),
)
def test_mutated_or_random_bytes_raise_only_batch_error(
    seed: bytes, edits: list, cut: int, refit: bool, garbage: bytes
) -> None:
    data = bytearray(seed)
    for at, byte in edits:
        data[at % len(data)] = byte
    data = data[: max(cut % (len(data) + 1), 0)] if cut % 3 == 0 else data
    candidates = [bytes(data), garbage, b"\x00" * 16 + b"\x02" + garbage]
    if refit:
        candidates = [_refit(bytearray(c)) for c in candidates]
    for candidate in candidates:
        with counting_inflation() as inflated:
            try:
                header = validate(candidate, max_bytes=MiB)
            except BatchError as exc:
                assert isinstance(exc.code, ErrorCode)
                continue
            finally:
                assert max(inflated, default=0) <= MiB
        # What validates also decodes, into exactly record_count records.
        assert len(records_of(candidate)) == header.record_count


# -- conversion --------------------------------------------------------------------------

V1_ROWS = [
    (ts, k, v, [(n, h) for n, h in hs or () if h is not None] or None) for ts, k, v, hs in ROWS
]


@pytest.mark.parametrize("codec", MAGIC1_CODECS[:4])
def test_magic_1_to_v2_and_back_keeps_every_record(codec: int) -> None:
    ours = bytearray(
        build_batch(
            V1_ROWS,
            compression=codec,
            producer_id=4,
            producer_epoch=1,
            base_sequence=20,
            transactional=True,
        )
    )
    struct.pack_into(">q", ours, 0, 1_234)
    theirs = to_v2(bytes(ours))
    header = validate(theirs)
    assert header.magic == MAGIC_V2 and header.compression == codec
    assert header._replace(crc=0, magic=0, attributes=0, batch_length=0) == read_header(
        ours
    )._replace(crc=0, magic=0, attributes=0, batch_length=0)
    assert header.attributes & 0x30 == read_header(ours).attributes & 0x30  # the flag bits
    assert records_of(theirs) == records_of(bytes(ours)) == expected(V1_ROWS, 1_234)
    back = to_magic1(theirs)
    assert validate(back).magic == MAGIC and read_header(back) == read_header(ours)
    assert records_of(back) == records_of(bytes(ours))
    assert to_v2(theirs) == theirs and to_magic1(back) == back
    assert validate(to_v2(bytes(ours), compression=Compression.SNAPPY)).compression == 4


def test_control_batches_convert_to_the_other_formats_control_record() -> None:
    for kind in (CONTROL_ABORT, CONTROL_COMMIT):
        ours = build_control_batch(kind, producer_id=5, producer_epoch=1, timestamp_ms=9)
        theirs = to_v2(ours)
        header = validate(theirs)
        assert header.is_control and header.is_transactional and header.base_sequence == -1
        assert control_type(theirs, 0, header) == kind
        assert records_of(theirs)[0][1:4] == (9, struct.pack(">hh", 0, kind), b"\0" * 6)
        back = to_magic1(theirs)
        assert back == ours
        assert msgpack.unpackb(records_of(back)[0].key) == [0, kind]


def test_v2_to_magic_1_where_magic_1_lacks_something() -> None:
    snappy = encode_batch_v2(V1_ROWS, compression=Compression.SNAPPY)
    assert read_header(to_magic1(snappy)).compression == Compression.LZ4
    assert read_header(to_magic1(snappy, snappy_as=Compression.GZIP)).compression == 1
    assert records_of(to_magic1(snappy)) == records_of(snappy)
    with pytest.raises(BatchError) as info:
        to_magic1(encode_batch_v2(ROWS))
    assert info.value.code == ErrorCode.INVALID_RECORD and "null" in info.value.message
    log_append = encode_batch_v2(V1_ROWS, log_append_time=True, max_timestamp=7_000)
    assert [r.timestamp for r in records_of(to_magic1(log_append))] == [7_000] * 5


def test_a_run_converts_batch_by_batch_and_drops_a_partial_tail() -> None:
    ours = build_batch(V1_ROWS[:2])
    theirs = encode_batch_v2(ROWS, compression=Compression.LZ4)
    run = ours + theirs + ours
    converted = run_to_v2(run + ours[:30])
    assert [h.magic for _, h in scan_batches(converted)] == [MAGIC_V2] * 3
    assert [records_of(converted[p : p + h.size_bytes]) for p, h in scan_batches(converted)] == [
        records_of(b) for b in (ours, theirs, ours)
    ]
