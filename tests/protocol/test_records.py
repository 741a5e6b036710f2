"""The one records encoder and the broker's strict records check (protocol/records.py).

Encoding: every path (rows, the column fast path, the accumulator, send_batch's
columns) gives the same bytes, and the bytes of before the encoders were merged.
Validation: a batch is accepted only when its records decode to exactly
record_count well-formed records, compressed or not, and a compressed body that
would inflate past the bound is refused without being inflated.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Callable

import lz4.frame
import msgpack
import pytest
import zstandard

from client.accumulator import RecordAccumulator
from client.columns import Columns
from protocol.batch import (
    CONTROL_COMMIT,
    BatchError,
    build_batch,
    build_batch_from_columns,
    build_control_batch,
    encode_batch,
    validate,
)
from protocol.compression import MAGIC1_CODECS, Compression, compress, decompress
from protocol.errors import ErrorCode, ProtocolError
from protocol.records import RecordColumns, encode_rows

MiB = 1024 * 1024

# sha256 of batches built by the four encoders this module replaced (main at c2e5e23).
GOLDEN = [
    (
        lambda: build_batch(
            [
                (1000, b"k", b"v", [("h", b"x")]),
                (1005, None, b"w" * 300, None),
                (999, b"k2", None, None),
            ],
            producer_id=7,
            producer_epoch=2,
            base_sequence=40,
        ),
        "f954706123e762d4aa64c18ce566d01175bafd1bff144f9d35cc13d636f1ad09",
    ),
    (
        lambda: build_batch_from_columns(
            [b"a" * 20, b"b" * 70000, b""], [b"k1", b"k2" * 200, b"k3"], 123
        ),
        "e9a6da5f19020dcf84fe2978328936f7fa1b93a8a090fc8e38fbe221c50db6b4",
    ),
    (
        lambda: build_batch_from_columns(
            [b"x" * 100] * 40,
            None,
            5,
            producer_id=1,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),
        "fb5e7ad9156c8f81c37a0312c542043ef322bd6c179d25702c33d641e31c1c5f",
    ),
    (
        lambda: build_control_batch(
            CONTROL_COMMIT, producer_id=3, producer_epoch=1, timestamp_ms=5
        ),
        "9f7ed0fe69230ba86ee0e30545eec0d29a2cd72707e99caefe3611f650217645",
    ),
]


@pytest.mark.parametrize(("build", "digest"), GOLDEN)
def test_batches_are_byte_identical_to_the_replaced_encoders(
    build: Callable[[], bytes], digest: str
) -> None:
    assert hashlib.sha256(build()).hexdigest() == digest


COLUMN_CASES = [
    ([b"v" * (i * 37 % 300) for i in range(500)], None, None),  # the values-only join
    ([b"v%d" % i for i in range(500)], [b"k%d" % i for i in range(500)], None),  # keyed join
    ([None, b"a", b"b" * 70_000], [b"k1", None, b"k3"], None),  # None: the row path
    ([b"a", b"b"], None, [[("h", b"x"), ("i", b"")], None]),  # headers: the row path
]


@pytest.mark.parametrize(("values", "keys", "headers"), COLUMN_CASES)
def test_the_column_path_and_the_row_path_give_the_same_bytes(
    values: list, keys: list | None, headers: list | None
) -> None:
    rows = [
        (0, None if keys is None else keys[i], v, None if headers is None else headers[i])
        for i, v in enumerate(values)
    ]
    columns = RecordColumns(values, keys, headers)
    assert columns.encode() == encode_rows(rows)
    assert columns.encode(1, 3) == encode_rows(rows[1:3])
    batch = build_batch_from_columns(values, keys, 77, headers=headers)
    assert batch == build_batch([(77 + delta, k, v, h) for delta, k, v, h in rows])
    assert validate(batch).record_count == len(values)


def test_the_producer_paths_give_the_same_bytes_as_build_batch() -> None:
    acc = RecordAccumulator(batch_size=100_000, clock=lambda: 0.0)
    acc.set_producer_id(9, 1)
    acc.append("t", 0, 1_000, b"k", b"v1", [("h", b"x")], None)
    acc.append("t", 0, 1_003, None, b"v2", None, None)
    acc.append_encoded("t", 1, Columns([b"a", b"bb"]).encode(0, 2), 2, 2_000)
    [[by_send, by_send_batch]] = acc.drain(0, 1)
    assert by_send.wire(9, 1, Compression.GZIP) == build_batch(
        [(1_000, b"k", b"v1", [("h", b"x")]), (1_003, None, b"v2", None)],
        producer_id=9,
        producer_epoch=1,
        base_sequence=0,
        compression=Compression.GZIP,
    )
    assert by_send_batch.wire(9, 1, Compression.NONE) == build_batch_from_columns(
        [b"a", b"bb"], None, 2_000, producer_id=9, producer_epoch=1, base_sequence=0
    )


# --------------------------------------------------------------------------- validation


def lying(records: list | bytes, record_count: int, compression: int = Compression.NONE) -> bytes:
    """A batch with a correct header and CRC around `records`, claiming `record_count`."""
    payload = records if isinstance(records, bytes) else msgpack.packb(records)
    return encode_batch(
        payload,
        record_count=record_count,
        base_timestamp=0,
        max_timestamp=0,
        compression=compression,
    )


def refused(batch: bytes, max_bytes: int | None = MiB) -> str:
    with pytest.raises(BatchError) as info:
        validate(batch, max_bytes=max_bytes)
    assert info.value.code == ErrorCode.INVALID_RECORD
    return info.value.message


OK = [0, b"k", b"v", [["h", b"x"]]]


@pytest.mark.parametrize("codec", MAGIC1_CODECS[:4])
@pytest.mark.parametrize(
    ("records", "record_count"),
    [
        ([], 2**31 - 1),  # the defect: offsets would jump by 2^31
        ([OK, OK], 3),  # count too high
        ([OK, OK, OK], 2),  # count too low
        ([[0, None, b"v"]], 1),  # record not a 4-array
        ([[0, None, b"v", None, None]], 1),
        ([b"not a record"], 1),
        ([[0, "key as str", b"v", None]], 1),  # key a str
        ([[0, None, "value as str", None]], 1),
        ([[0.5, None, b"v", None]], 1),  # timestamp_delta not an int
        ([[0, None, b"v", [["h"]]]], 1),  # headers malformed
        ([[0, None, b"v", [[b"h", b"x"]]]], 1),
        ([[0, None, b"v", [["h", "x"]]]], 1),
        ([[0, None, b"v", {"h": b"x"}]], 1),
        ([[0, None, b"v", b"headers"]], 1),
    ],
)
def test_records_that_are_not_record_count_well_formed_records_are_refused(
    codec: int, records: list, record_count: int
) -> None:
    refused(lying(records, record_count, codec))


def test_bytes_around_the_records_array_are_refused() -> None:
    assert "trailing" in refused(lying(msgpack.packb([OK]) + b"\xc0", 1))
    refused(lying(msgpack.packb([OK])[:-1], 1))
    refused(lying(b"", 1))


def test_well_formed_records_pass_with_every_codec() -> None:
    records = [[0, None, None, None], [5, b"", b"v", []], OK]
    for codec in MAGIC1_CODECS[:4]:
        assert validate(lying(records, 3, codec), max_bytes=MiB).record_count == 3


BOMB_RECORDS = msgpack.packb([[0, None, b"\0" * (4 * MiB), None]])


@pytest.mark.parametrize(
    "body",
    [
        gzip.compress(BOMB_RECORDS),
        zstandard.ZstdCompressor().compress(BOMB_RECORDS),  # declares its size
        zstandard.ZstdCompressor(write_content_size=False).compress(BOMB_RECORDS),
        lz4.frame.compress(BOMB_RECORDS),
    ],
    ids=["gzip", "zstd", "zstd-unsized", "lz4"],
)
def test_a_compressed_body_inflating_past_max_bytes_is_refused(body: bytes) -> None:
    codec = {0x1F: Compression.GZIP, 0x28: Compression.ZSTD, 0x04: Compression.LZ4}[body[0]]
    batch = encode_batch(body, record_count=1, base_timestamp=0, max_timestamp=0)
    batch = bytearray(batch)
    batch[17] = codec  # the body is compressed already: only the attributes say so
    batch[12:16] = zlib.crc32(batch[16:]).to_bytes(4, "big")
    assert len(batch) < 64 * 1024
    refused(bytes(batch), max_bytes=MiB)
    assert validate(bytes(batch), max_bytes=8 * MiB).record_count == 1


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.ZSTD, Compression.LZ4])
def test_decompress_stops_at_the_bound_and_refuses_a_cut_payload(codec: int) -> None:
    data = b"abc" * 1000
    body = compress(codec, data)
    assert decompress(codec, body, len(data)) == data
    for bad in (body[:-4], compress(codec, data + b"d")):
        with pytest.raises(ProtocolError):
            decompress(codec, bad, len(data))
