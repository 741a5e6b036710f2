"""The consumer's C decode and send_batch's C encode of list columns, each against its
Python reference (protocol/_records_fast.c, protocol/records.py).

`plain_rows` against `plain_rows_py`: both must give the same rows for the same
bytes, or both None (the consumer's columnar decode then judges the array).
Tried: random records of every int width, bin width, nil, empty and non-empty
headers, encoded canonically and with wider array encodings, every skip, offsets
and timestamps at int64's edges; then the same bytes truncated, extended, with a
byte flipped or a length field rewritten. It must also decide, not defer, for the
arrays every producer writes.

`v2_records_from_plain` against `encode_records_v2` of the decoded rows: the kafka
listener's conversion of plain magic-1 records to v2 gives the reference's bytes,
whole batches included (`to_v2` with and without the C path), or None for what
the reference must convert (headers, damaged arrays).

`bytes_lengths` against `bytes_lengths_py`: every item's length when all are bytes,
else None.

`encode_list_records` against `RecordColumns.encode_py`: the same bytes for every
run of random lists of bytes or None, keyed or not, and None (the reference
decides) for anything else in them.
"""

from __future__ import annotations

import gc
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.batch_convert
from protocol.batch import build_batch
from protocol.batch_convert import to_v2
from protocol.batch_v2 import encode_records_v2, v2_records_from_plain
from protocol.compression import Compression
from protocol.records import (
    RecordColumns,
    bytes_lengths,
    bytes_lengths_py,
    encode_list_records,
    plain_rows,
    plain_rows_py,
)

try:
    import protocol._records_fast as built
except ImportError:  # pragma: no cover - make test builds it; test_records_fast.py says so
    built = None

pytestmark = pytest.mark.skipif(built is None, reason="protocol/_records_fast.c not built")


class Row(tuple[Any, ...]):
    """A tuple subclass, as the consumer's ConsumerRecord is (protocol/ knows no client type)."""

    __slots__ = ()


NO_HEADERS: tuple[Any, ...] = ()
TOPIC = "topic"
ints = st.one_of(st.integers(0, 127), st.integers(-32, -1), st.integers(-(2**63), 2**64 - 1))
blobs = st.one_of(st.none(), st.binary(max_size=300))
headers = st.one_of(
    st.none(),
    st.just([]),
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), min_size=1, max_size=2),
)
records = st.lists(st.tuples(ints, blobs, blobs, headers), max_size=40)
plain = st.lists(
    st.tuples(st.integers(-(2**63), 2**63 - 1), blobs, blobs, st.none()), min_size=1, max_size=20
)
int64s = st.one_of(st.integers(0, 2**40), st.integers(-(2**63), 2**63 - 1))


def both(data: bytes, count: int, skip: int = 0, base_offset: int = 0, base_ts: int = 0) -> Any:
    """The C answer, after checking that the reference gives the same one."""
    args = (data, count, skip, Row, TOPIC, 3, base_offset, base_ts, NO_HEADERS)
    fast = plain_rows(*args)
    slow = plain_rows_py(*args)
    assert fast == slow, data.hex()
    if fast is not None:
        assert all(type(row) is Row for row in fast)
    return fast


def test_the_extension_decodes() -> None:
    assert plain_rows is built.plain_rows  # type: ignore[union-attr]


def test_column_encoded_batches_are_decoded_in_c() -> None:
    values = [bytes([i % 256]) * (i * 7 % 300) for i in range(500)]
    keys = [b"k%d" % i for i in range(500)]
    for columns, key_of in (
        (RecordColumns(values), lambda i: None),
        (RecordColumns(values, keys), keys.__getitem__),
    ):
        data = columns.encode()
        rows = both(data, 500, 0, 1_000, 1_700_000_000_000)
        assert rows == [
            (TOPIC, 3, 1_000 + i, 1_700_000_000_000, key_of(i), v, ()) for i, v in enumerate(values)
        ]
        assert both(data, 500, 498, 1_000, 1_700_000_000_000) == rows[498:]
        assert plain_rows(memoryview(data), 500, 0, Row, TOPIC, 3, 0, 0, ()) is not None
        assert plain_rows(data, 499, 0, Row, TOPIC, 3, 0, 0, ()) is None  # the count must match


def test_rows_are_left_to_the_collector_only_when_they_can_hold_a_cycle() -> None:
    data = RecordColumns([b"v"] * 3).encode()
    rows = plain_rows(data, 3, 0, Row, TOPIC, 0, 0, 0, NO_HEADERS)
    assert rows is not None and not any(gc.is_tracked(row) for row in rows)
    shared: list[Any] = []
    rows = plain_rows(data, 3, 0, Row, TOPIC, 0, 0, 0, shared)
    assert rows is not None and all(gc.is_tracked(row) for row in rows)


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_c_and_reference_agree(rows: list[tuple[Any, ...]], data: st.DataObject) -> None:
    encoded = msgpack.packb(rows, use_bin_type=True)
    skip = data.draw(st.integers(-2, len(rows) + 2))
    base_offset, base_ts = data.draw(int64s), data.draw(int64s)
    both(encoded, len(rows), skip, base_offset, base_ts)
    both(encoded, len(rows) + 1, skip)
    items = [msgpack.packb(row, use_bin_type=True) for row in rows]
    for width in (16, 32):
        head = (
            b"\xdc" + struct.pack(">H", len(rows))
            if width == 16
            else b"\xdd" + struct.pack(">I", len(rows))
        )
        both(head + b"".join(items), len(rows), skip)
    if encoded:
        cut = data.draw(st.integers(0, len(encoded) - 1))
        both(encoded[:cut], len(rows))
        both(encoded + data.draw(st.binary(min_size=1, max_size=4)), len(rows))
        flipped = bytearray(encoded)
        flipped[cut] ^= data.draw(st.integers(1, 255))
        both(bytes(flipped), len(rows))
        flipped[cut] = data.draw(st.sampled_from([0xC4, 0xC5, 0xC6, 0xDC, 0xDD, 0xCF, 0xFF]))
        both(bytes(flipped), len(rows))


@settings(deadline=None)
@given(plain)
def test_plain_arrays_are_decided(rows: list[tuple[Any, ...]]) -> None:
    decoded = both(msgpack.packb(rows, use_bin_type=True), len(rows))
    assert decoded == [(TOPIC, 3, i, delta, k, v, ()) for i, (delta, k, v, _) in enumerate(rows)]


@pytest.mark.parametrize(
    ("data", "base_offset", "base_ts"),
    [
        (b"", 0, 0),
        (b"\x91", 0, 0),
        (b"\x91\x94\x00\xc0\xc0", 0, 0),
        (b"\x91\x94\x00\xc0\xc0\xc0\xc0", 0, 0),  # a byte after the array
        (b"\x91\x93\x00\xc0\xc0", 0, 0),  # a 3-array
        (b"\x91\x94\xc3\xc0\xc0\xc0", 0, 0),  # a bool for the delta
        (b"\x91\x94\xcb" + bytes(8) + b"\xc0\xc0\xc0", 0, 0),  # a float for the delta
        (b"\x91\x94\xcf" + b"\xff" * 8 + b"\xc0\xc0\xc0", 0, 0),  # a delta beyond int64
        (b"\x91\x94\x01\xc0\xc0\xc0", 0, 2**63 - 1),  # a timestamp beyond int64
        (b"\x92\x94\x00\xc0\xc0\xc0\x94\x00\xc0\xc0\xc0", 2**63 - 1, 0),  # an offset beyond
        (b"\x91\x94\x00\xa1x\xc0\xc0", 0, 0),  # a str key
        (b"\x91\x94\x00\xc0\xc4\x05ab\xc0", 0, 0),  # a bin that runs past the end
        (b"\x91\x94\x00\xc0\xc6\xff\xff\xff\xffab\xc0", 0, 0),  # a 4 GiB bin in a few bytes
        (b"\xdd\xff\xff\xff\xff\x94\x00\xc0\xc0\xc0", 0, 0),  # a count that lies
        (b"\x91\x94\x00\xc0\xc0\x80", 0, 0),  # headers {}
        (b"\x81\x00\x00", 0, 0),  # a map
    ],
)
def test_damaged_and_unusual_arrays_are_left_to_the_caller(
    data: bytes, base_offset: int, base_ts: int
) -> None:
    count = data[0] & 0x0F if data and data[0] & 0xF0 == 0x90 else 1
    assert both(data, count, 0, base_offset, base_ts) is None


def test_empty_headers_are_no_headers() -> None:
    assert both(b"\x91\x94\x05\xc0\xc4\x01a\x90", 1, 0, 7, 10) == [
        (TOPIC, 3, 7, 15, None, b"a", ())
    ]


columns = st.lists(st.one_of(st.none(), st.binary(max_size=70_000)), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(columns, st.booleans(), st.data())
def test_list_columns_encode_as_the_reference_does(
    values: list[bytes | None], keyed: bool, data: st.DataObject
) -> None:
    keys = (
        data.draw(
            st.lists(
                st.one_of(st.none(), st.binary(max_size=300)),
                min_size=len(values),
                max_size=len(values),
            )
        )
        if keyed
        else None
    )
    start = data.draw(st.integers(0, len(values) - 1))
    stop = data.draw(st.integers(start + 1, len(values)))  # the reference needs a record
    reference = RecordColumns(values, keys).encode_py(start, stop)
    assert encode_list_records(values, keys, start, stop) == reference
    assert RecordColumns(values, keys).encode(start, stop) == reference
    assert msgpack.unpackb(reference) == [
        [0, None if keys is None else keys[i], values[i], None] for i in range(start, stop)
    ]


def test_list_columns_of_other_types_are_left_to_the_reference() -> None:
    assert encode_list_records([b"a", "b"], None, 0, 2) is None
    assert encode_list_records([b"a", bytearray(b"b")], None, 0, 2) is None
    assert encode_list_records([b"a"], ["k"], 0, 1) is None
    assert encode_list_records([b"a", "b"], None, 0, 1) is not None  # only the run is read
    assert encode_list_records([b"a"], None, 1, 1) == b"\x90"
    with pytest.raises(ValueError):
        encode_list_records([b"a"], None, 0, 2)
    with pytest.raises(ValueError):
        encode_list_records([b"a"], [b"k", b"l"], 0, 1)
    with pytest.raises(TypeError):
        encode_list_records((b"a",), None, 0, 1)


def test_the_extension_encodes_lists() -> None:
    assert encode_list_records is built.encode_list_records  # type: ignore[union-attr]


def v2_reference(data: bytes, count: int) -> bytes | None:
    """encode_records_v2 of the rows plain_rows_py decodes, or None where it defers."""
    rows = plain_rows_py(data, count, 0, Row, TOPIC, 0, 0, 0, NO_HEADERS)
    if rows is None:
        return None
    return encode_records_v2([(r[3], r[4], r[5], None) for r in rows])


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_v2_conversion_agrees_with_the_reference(
    rows: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    encoded = msgpack.packb(rows, use_bin_type=True)
    assert v2_records_from_plain(encoded, len(rows)) == v2_reference(encoded, len(rows))
    if encoded:
        cut = data.draw(st.integers(0, len(encoded) - 1))
        flipped = bytearray(encoded)
        flipped[cut] ^= data.draw(st.integers(1, 255))
        for damaged in (encoded[:cut], bytes(flipped), encoded + b"\xc0"):
            assert v2_records_from_plain(damaged, len(rows)) == v2_reference(damaged, len(rows))


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4, Compression.ZSTD])
def test_whole_batches_convert_as_the_reference_does(
    codec: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = [
        (1_000 + i % 3, None if i % 4 else b"k%d" % i, b"v" * (i % 200), None) for i in range(300)
    ]
    batch = build_batch(plain, compression=codec, producer_id=7, producer_epoch=2, base_sequence=5)
    fast = to_v2(batch)
    with monkeypatch.context() as patched:
        patched.setattr(protocol.batch_convert, "v2_records_from_plain", lambda *args: None)
        assert to_v2(batch) == fast
    assert (
        v2_records_from_plain(b"\x91\x94\x00\xc0\xc0\x91\x92\xa1n\xc4\x01v", 1) is None
    )  # headers


items = st.one_of(
    st.binary(max_size=400), st.none(), st.text(max_size=3), st.builds(bytearray, st.binary())
)


@given(st.lists(items, max_size=30), st.lists(st.binary(max_size=70_000), max_size=5))
def test_lengths_agree_with_the_reference(mixed: list[Any], blobs: list[bytes]) -> None:
    for column in (mixed, blobs, [*blobs, None]):
        assert bytes_lengths(column) == bytes_lengths_py(column)
    assert bytes_lengths(blobs) == [len(b) for b in blobs]
    with pytest.raises(TypeError):
        bytes_lengths(tuple(blobs))  # type: ignore[arg-type]
