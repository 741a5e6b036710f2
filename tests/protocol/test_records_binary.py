"""Arrow binary columns into records arrays: the C encoder (protocol/_records_fast.c)
against the pure-Python path of protocol/records.py, and both against msgpack.

Columns are drawn as Arrow arrays the way Spark's writer hands them over: binary or
large_binary, with nulls and empty values, several chunks cut at random rows, sliced
arrays (a non-zero offset into shared buffers), keys chunked differently from values.
The C path must give the same bytes and the same cut points as the Python one, and
refuse buffers that do not hold what their chunk says instead of reading past them.
"""

from __future__ import annotations

import itertools

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.columns import ArrowColumns, Columns, binary_chunks
from client.errors import RecordTooLargeError
from protocol.records import (
    RECORD_OVERHEAD,
    BinaryChunk,
    binary_record_bounds,
    binary_record_bounds_py,
    count_records,
    encode_binary_records,
    encode_binary_records_py,
)

try:
    import protocol._records_fast as built
except ImportError:  # pragma: no cover - test_records_fast says the extension must build
    built = None

items = st.one_of(st.none(), st.binary(max_size=300), st.just(b"x" * 70_000))
rows = st.lists(items, max_size=60)


@st.composite
def columns(draw: st.DrawFn, values: list[bytes | None]) -> pa.ChunkedArray:
    """`values` as a chunked array: cut at random rows, each chunk sliced out of a
    longer array, binary or large_binary."""
    kind = draw(st.sampled_from([pa.binary(), pa.large_binary()]))
    cuts = sorted(draw(st.lists(st.integers(0, len(values)), max_size=4)))
    bounds = [0, *cuts, len(values)]
    parts = []
    for start, stop in itertools.pairwise(bounds):
        before = draw(st.lists(items, max_size=3))
        after = draw(st.lists(items, max_size=3))
        whole = pa.array(before + values[start:stop] + after, kind)
        parts.append(whole.slice(len(before), stop - start))
    return pa.chunked_array(parts, kind)


def reference(values: list[bytes | None], keys: list[bytes | None] | None) -> bytes:
    packed: bytes = msgpack.packb(
        [[0, None if keys is None else keys[i], v, None] for i, v in enumerate(values)],
        use_bin_type=True,
    )
    return packed


def test_the_column_encoder_is_built() -> None:
    """make test builds the extension: Spark's writer must not fall back silently."""
    assert built is not None
    assert encode_binary_records is built.encode_binary_records
    assert binary_record_bounds is built.binary_record_bounds


@settings(max_examples=300, deadline=None)
@given(rows, st.booleans(), st.data())
def test_c_and_python_encode_the_same_bytes_as_msgpack(
    values: list[bytes | None], keyed: bool, data: st.DataObject
) -> None:
    keys = data.draw(st.lists(items, min_size=len(values), max_size=len(values))) if keyed else None
    value_chunks = binary_chunks(data.draw(columns(values)))
    key_chunks = None if keys is None else binary_chunks(data.draw(columns(keys)))
    start = data.draw(st.integers(0, len(values)))
    stop = data.draw(st.integers(start, len(values)))
    expected = reference(values[start:stop], None if keys is None else keys[start:stop])
    assert encode_binary_records_py(value_chunks, key_chunks, start, stop) == expected
    assert encode_binary_records(value_chunks, key_chunks, start, stop) == expected
    assert count_records(expected) == stop - start


@settings(max_examples=300, deadline=None)
@given(rows, st.booleans(), st.integers(0, 80_000), st.data())
def test_c_and_python_cut_at_the_same_rows_as_columns(
    values: list[bytes | None], keyed: bool, limit: int, data: st.DataObject
) -> None:
    keys = data.draw(st.lists(items, min_size=len(values), max_size=len(values))) if keyed else None
    value_chunks = binary_chunks(data.draw(columns(values)))
    key_chunks = None if keys is None else binary_chunks(data.draw(columns(keys)))
    fast = binary_record_bounds(value_chunks, key_chunks, limit, RECORD_OVERHEAD)
    assert fast == binary_record_bounds_py(value_chunks, key_chunks, limit, RECORD_OVERHEAD)
    try:
        expected = Columns(values, keys).bounds(limit)
    except RecordTooLargeError:
        # The run before the record that does not fit, then that record, empty.
        assert fast and fast[-1][0] == fast[-1][1]
        assert all(fast[i][1] == fast[i + 1][0] for i in range(len(fast) - 1))
        return
    assert fast == expected


def test_arrow_columns_match_list_columns() -> None:
    values = [None if i % 11 == 0 else b"v%d" % i * (i % 40) for i in range(3_000)]
    keys = [None if i % 13 == 0 else b"k%d" % i for i in range(3_000)]
    arrow = ArrowColumns(
        pa.chunked_array([values[:1_000], values[1_000:]], pa.binary()), keys=pa.array(keys)
    )
    listed = Columns(values, keys)
    assert arrow.bounds(16_384) == listed.bounds(16_384)
    for start, stop in listed.bounds(16_384):
        assert arrow.encode(start, stop) == listed.encode(start, stop)
    assert arrow.keys == keys
    picked = [5, 0, 2_999, 1_000]
    assert arrow.select(picked).encode() == listed.select(picked).encode()
    strings = ArrowColumns(pa.array(["é", None, ""]), pa.array(["k", "", None], pa.large_string()))
    assert strings.encode() == Columns([b"\xc3\xa9", None, b""], [b"k", b"", None]).encode()
    fixed = ArrowColumns(pa.array([b"ab", b"cd"], pa.binary(2)))
    assert fixed.encode() == Columns([b"ab", b"cd"]).encode()
    with pytest.raises(RecordTooLargeError):
        ArrowColumns(pa.array([b"x", b"x" * 200])).bounds(100)
    with pytest.raises(TypeError):
        ArrowColumns(pa.array([1, 2]))
    with pytest.raises(ValueError):
        ArrowColumns(pa.array([b"a"]), pa.array([b"k", b"l"]))


@pytest.mark.parametrize(
    "chunk",
    [
        BinaryChunk(3, 0, None, bytes(12), b"", False),  # offsets for 2 rows, not 3
        BinaryChunk(
            2, 0, None, b"\x00\x00\x00\x00\x05\x00\x00\x00\x02\x00\x00\x00", b"abcde", False
        ),
        BinaryChunk(1, 0, None, b"\x00\x00\x00\x00\x09\x00\x00\x00", b"abc", False),  # past data
        BinaryChunk(9, 0, b"\xff", bytes(40), b"", False),  # validity for 8 rows
        BinaryChunk(1, 0, None, b"\xff\xff\xff\xff\x00\x00\x00\x00", b"", False),  # offset -1
        BinaryChunk(-1, 0, None, bytes(4), b"", False),
    ],
)
def test_malformed_buffers_are_refused_not_read(chunk: BinaryChunk) -> None:
    with pytest.raises(ValueError):
        encode_binary_records([chunk], None, 0, max(chunk.length, 0))
    with pytest.raises(ValueError):
        binary_record_bounds([chunk], None, 1 << 20, RECORD_OVERHEAD)


def test_rows_outside_the_column_and_mismatched_keys_are_refused() -> None:
    values = binary_chunks(pa.array([b"a", b"b"]))
    for encode in (encode_binary_records, encode_binary_records_py):
        with pytest.raises(ValueError):
            encode(values, None, 1, 3)
        with pytest.raises(ValueError):
            encode(values, None, 2, 1)
        with pytest.raises(ValueError):
            encode(values, binary_chunks(pa.array([b"k"])), 0, 1)
    with pytest.raises(ValueError):
        binary_record_bounds(values, binary_chunks(pa.array([b"k"])), 100, RECORD_OVERHEAD)


def test_only_the_chunks_a_run_reads_are_checked() -> None:
    """A send is encoded as several runs; each checks the chunks it reads, not all."""
    good = binary_chunks(pa.array([b"a", b"bc"]))[0]
    bad = BinaryChunk(3, 0, None, bytes(12), b"", False)  # offsets for 2 rows, not 3
    assert encode_binary_records([good, bad], None, 0, 2) == reference([b"a", b"bc"], None)
    with pytest.raises(ValueError):
        encode_binary_records([good, bad], None, 1, 3)
    with pytest.raises(ValueError):
        binary_record_bounds([good, bad], None, 1 << 20, RECORD_OVERHEAD)
