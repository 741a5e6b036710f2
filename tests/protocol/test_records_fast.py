"""The C record count (protocol/_records_fast.c) against msgspec, its reference.

The C walk may answer only what msgspec would: whenever it returns a count,
msgspec decodes the same bytes to that many records. Tried: random records of
every int width, bin width, nil and headers, encoded canonically and with wider
array and int encodings than needed; then the same bytes truncated, extended,
with a byte flipped or a length field rewritten (a length that runs past the
end, a record count that lies). It must also answer, not defer, for the plain
arrays every client sends, or the broker keeps paying msgspec's price.
"""

from __future__ import annotations

import struct

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.records import RecordColumns, _strict, count_plain_records, count_records

try:
    import protocol._records_fast as built
except ImportError:  # pragma: no cover - make test builds it; the check below says so
    built = None

ints = st.one_of(
    st.integers(0, 127),
    st.integers(-32, -1),
    st.integers(-(2**63), 2**64 - 1),
)
blobs = st.one_of(st.none(), st.binary(max_size=300))
headers = st.one_of(
    st.none(),
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=2),
)
records = st.lists(st.tuples(ints, blobs, blobs, headers), max_size=40)
plain_records = st.lists(st.tuples(ints, blobs, blobs, st.none()), max_size=40)


def reference(data: bytes) -> int | None:
    """msgspec's answer: the count, or None when it refuses the bytes."""
    try:
        return len(_strict.decode(data))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def wide_array(n: int, items: list[bytes], width: int) -> bytes:
    """An array header of 16 or 32 bits even where a shorter one would do."""
    head = b"\xdc" + struct.pack(">H", n) if width == 16 else b"\xdd" + struct.pack(">I", n)
    return head + b"".join(items)


def agrees(data: bytes) -> None:
    fast = count_plain_records(data)
    if fast >= 0:
        assert reference(data) == fast, data.hex()


def test_the_extension_is_built() -> None:
    """make test installs with a C compiler: the broker must not fall back silently."""
    assert built is not None, "protocol/_records_fast.c was not built (pip install -e . needs gcc)"
    assert count_plain_records is built.count_plain_records


@given(plain_records)
def test_plain_arrays_are_counted_in_c(rows: list[tuple[int, bytes | None, bytes | None, None]]):
    data = msgpack.packb(rows, use_bin_type=True)
    assert count_plain_records(data) == len(rows)
    assert count_records(data) == len(rows)


def test_column_encoded_batches_are_counted_in_c() -> None:
    values = [bytes([i % 256]) * (i * 7 % 300) for i in range(500)]
    keys = [b"k%d" % i for i in range(500)]
    for columns in (RecordColumns(values), RecordColumns(values, keys)):
        data = columns.encode()
        assert count_plain_records(data) == 500
        assert count_plain_records(memoryview(data)) == 500
        assert count_plain_records(bytearray(data)) == 500


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_never_accepts_what_msgspec_refuses(rows: list[tuple], data: st.DataObject) -> None:
    encoded = msgpack.packb(rows, use_bin_type=True)
    agrees(encoded)
    assert count_records(encoded) == len(rows)
    items = [msgpack.packb(row, use_bin_type=True) for row in rows]
    for width in (16, 32):
        agrees(wide_array(len(rows), items, width))
        agrees(wide_array(len(rows) + 1, items, width))
        if rows:
            agrees(wide_array(len(rows) - 1, items, width))
    if encoded:
        cut = data.draw(st.integers(0, len(encoded) - 1))
        agrees(encoded[:cut])
        agrees(encoded + data.draw(st.binary(min_size=1, max_size=4)))
        flipped = bytearray(encoded)
        flipped[cut] ^= data.draw(st.integers(1, 255))
        agrees(bytes(flipped))
        flipped[cut] = data.draw(st.sampled_from([0xC4, 0xC5, 0xC6, 0xDC, 0xDD, 0xCF, 0xFF]))
        agrees(bytes(flipped))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x91",
        b"\x91\x94",
        b"\x91\x94\x00\xc0\xc0",
        b"\x91\x94\x00\xc0\xc0\xc0\xc0",  # a byte after the array
        b"\x91\x93\x00\xc0\xc0",  # a 3-array
        b"\x91\x94\xc3\xc0\xc0\xc0",  # a bool for the delta
        b"\x91\x94\xcb" + bytes(8) + b"\xc0\xc0\xc0",  # a float for the delta
        b"\x91\x94\x00\xa1x\xc0\xc0",  # a str key
        b"\x91\x94\x00\xc0\xc4\x05ab\xc0",  # a bin that runs past the end
        b"\x91\x94\x00\xc0\xc6\xff\xff\xff\xffab\xc0",  # a 4 GiB bin in a few bytes
        b"\xdd\xff\xff\xff\xff\x94\x00\xc0\xc0\xc0",  # a count that lies
        b"\x91\x94\x00\xc0\xc0\x90",  # headers [] go to msgspec, which accepts them
        b"\x81\x00\x00",  # a map
    ],
)
def test_damaged_and_unusual_arrays(data: bytes) -> None:
    agrees(data)
    if data in (b"\x91\x94\x00\xc0\xc0\x90",):
        assert count_plain_records(data) == -1
        assert count_records(data) == 1
    else:
        assert count_plain_records(data) == -1
