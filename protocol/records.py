"""Records codec: the msgpack array that fills a batch after its 56-byte header.

The records field of a batch (protocol/batch.py) is one msgpack array of
`record_count` records, each itself a 4-array:

| # | field           | msgpack type                 | notes                              |
|--:|-----------------|------------------------------|------------------------------------|
| 0 | timestamp_delta | int                          | ms after the batch's base_timestamp |
| 1 | key             | bin or nil                   |                                    |
| 2 | value           | bin or nil                   |                                    |
| 3 | headers         | nil or array of [str, bin]   | header name, header value          |

Records are encoded here only: `encode_rows` for rows already in that shape,
`record_parts` + `join_records` for the producer's per-record path (each record
framed as it is sent, the batch one join at the end), `RecordColumns.encode` for
whole columns that share one timestamp (send_batch, Spark, bench). The last two
skip msgpack's per-record work in the common case. All give the same bytes for
the same records.
`encode_binary_records` encodes Arrow binary columns (Spark's writer) from
their buffers, `binary_record_bounds` cuts them into runs that fit a request:
in C (protocol/_records_fast.c) without an object per row, in Python through
RecordColumns where the extension is not built.
`count_records` is the broker's strict check of what a client sent: msgspec is
its reference, and a C walk (protocol/_records_fast.c) answers first for the
plain shape [int, bin|nil, bin|nil, nil] without building an object per record.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar, cast

import msgpack
import msgspec

Headers = Sequence[tuple[str, bytes]] | None
Row = tuple[int, bytes | None, bytes | None, Headers]

# Upper bound of a record's msgpack framing: fixarray, int64 delta, two bin headers, nil headers.
RECORD_OVERHEAD = 21
# Upper bound of one header's framing: fixarray, str header, bin header.
HEADER_OVERHEAD = 8

_Columns = TypeVar("_Columns", bound="RecordColumns")

_FIXARRAY4_DELTA0 = b"\x94\x00"
_NIL = NIL = b"\xc0"
# Entries kept in each table of record heads: a few value sizes times 128 deltas fit,
# any number of sizes cannot grow it without bound.
_HEADS_MAX = 4096


def encode_rows(rows: Sequence[Row]) -> bytes:
    """The records array of `rows`, each (timestamp_delta, key, value, headers).

    msgpack packs tuples and lists alike as arrays, so rows and header pairs may be either."""
    packed: bytes = msgpack.packb(rows, use_bin_type=True)
    return packed


class _BinHeaders(dict[int, bytes]):
    """msgpack `bin` headers by length, built on first use."""

    def __missing__(self, length: int) -> bytes:
        if length < 0x100:
            header = b"\xc4" + bytes((length,))
        elif length < 0x10000:
            header = b"\xc5" + struct.pack(">H", length)
        else:
            header = b"\xc6" + struct.pack(">I", length)
        self[length] = header
        return header


class _Prefixes(dict[int, bytes]):
    """The bytes before a value: previous record's nil headers, [0, nil key, bin header]."""

    def __missing__(self, length: int) -> bytes:
        prefix = self[length] = _NIL + _FIXARRAY4_DELTA0 + _NIL + _BIN[length]
        return prefix


class _KeyPrefixes(dict[int, bytes]):
    """The bytes before a key: previous record's nil headers, [0, bin header]."""

    def __missing__(self, length: int) -> bytes:
        prefix = self[length] = _NIL + _FIXARRAY4_DELTA0 + _BIN[length]
        return prefix


_BIN = _BinHeaders()
_VALUE_PREFIX = _Prefixes()
_KEY_PREFIX = _KeyPrefixes()


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


class _Heads(dict[int, bytes]):
    """The bytes of a record before its key (or value), by `length << 7 | delta`, for
    0 <= delta < 128 (a positive fixint): [delta, (nil key,) bin header of `length`."""

    def __init__(self, nil_key: bool) -> None:
        super().__init__()
        self._key = _NIL if nil_key else b""

    def __missing__(self, index: int) -> bytes:
        head = b"\x94" + bytes((index & 0x7F,)) + self._key + _BIN[index >> 7]
        if len(self) < _HEADS_MAX:
            self[index] = head
        return head


# The producer's hot path reads these inline: VALUE_HEADS[len(value) << 7 | delta],
# value, NIL (nil headers) is a keyless record.
VALUE_HEADS = _Heads(nil_key=True)
KEY_HEADS = _Heads(nil_key=False)


def record_parts(
    delta: int, key: bytes | None, value: bytes | None, headers: Headers
) -> tuple[bytes, ...]:
    """One record's 4-array as parts to join (`join_records`): a table head and the raw
    key and value for bytes key and value, small delta and no headers, else msgpack's."""
    if headers is None and 0 <= delta < 0x80 and type(key) is bytes and type(value) is bytes:
        return (KEY_HEADS[len(key) << 7 | delta], key, _BIN[len(value)], value, _NIL)
    packed: bytes = msgpack.packb((delta, key, value, headers), use_bin_type=True)
    return (packed,)


def join_records(parts: list[bytes], count: int) -> bytes:
    """The records array of `count` records whose parts follow `parts[0]`, a slot this
    fills with the array header (so joining again gives the same bytes)."""
    parts[0] = _array_header(count)
    return b"".join(parts)


def _lengths(column: Sequence[bytes | None]) -> list[int] | None:
    """len() of every item, or None when an item is None (no fast path then): in one C
    pass (`bytes_lengths`) for a list of bytes where the extension is built."""
    if type(column) is list:
        lengths = bytes_lengths(column)
        if lengths is not None:
            return lengths
    if None in column:
        return None
    return list(map(len, cast("Sequence[bytes]", column)))


class RecordColumns:
    """Values with optional keys and headers of records that share one timestamp.

    For bytes values with bytes keys or none and no headers, each record is a
    constant prefix plus the raw bytes, so `encode` joins a table of per-length
    prefixes with the data in C, about 3x faster than a tuple per record for
    msgpack; anything else (None values or keys, headers) goes through
    `encode_rows`."""

    __slots__ = ("headers", "key_lengths", "keys", "value_lengths", "values")

    def __init__(
        self,
        values: list[bytes | None],
        keys: list[bytes | None] | None = None,
        headers: list[Headers] | None = None,
    ) -> None:
        n = len(values)
        if keys is not None and len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} values")
        if headers is not None and len(headers) != n:
            raise ValueError(f"{len(headers)} headers for {n} values")
        self.values = values
        self.keys = keys
        self.headers = headers
        self.value_lengths = _lengths(values)
        self.key_lengths = None if keys is None else _lengths(keys)

    def __len__(self) -> int:
        return len(self.values)

    def select(self: _Columns, rows: list[int]) -> _Columns:
        """The given rows only (keyed records split by partition)."""
        return type(self)(
            [self.values[i] for i in rows],
            None if self.keys is None else [self.keys[i] for i in rows],
            None if self.headers is None else [self.headers[i] for i in rows],
        )

    def encode(self, start: int = 0, stop: int | None = None) -> bytes:
        """The records array of rows [start, stop), every timestamp_delta 0: in C
        (`encode_list_records`) for lists without headers where the extension is built,
        else by the joins below, its reference."""
        if stop is None:
            stop = len(self.values)
        if self.headers is None and type(self.values) is list:
            keys = self.keys
            if keys is None or type(keys) is list:
                encoded = encode_list_records(self.values, keys, start, stop)
                if encoded is not None:
                    return encoded
        return self.encode_py(start, stop)

    def encode_py(self, start: int, stop: int) -> bytes:
        """encode's reference: tables of per-length prefixes joined with the data in C
        where every item is bytes, msgpack's packing otherwise."""
        if self.headers is None and self.value_lengths is not None:
            if self.keys is None:
                return self._join_values(start, stop)
            if self.key_lengths is not None:
                return self._join_keyed(start, stop)
        n = stop - start
        return encode_rows(
            list(
                zip(
                    itertools.repeat(0, n),
                    itertools.repeat(None, n) if self.keys is None else self.keys[start:stop],
                    self.values[start:stop],
                    itertools.repeat(None, n) if self.headers is None else self.headers[start:stop],
                    strict=False,
                )
            )
        )

    def _join_values(self, start: int, stop: int) -> bytes:
        assert self.value_lengths is not None
        n = stop - start
        parts: list[Any] = [None] * (2 * n + 1)
        parts[0 : 2 * n : 2] = map(_VALUE_PREFIX.__getitem__, self.value_lengths[start:stop])
        parts[1 : 2 * n : 2] = self.values[start:stop]
        return _join(parts, n)

    def _join_keyed(self, start: int, stop: int) -> bytes:
        assert self.value_lengths is not None and self.key_lengths is not None
        assert self.keys is not None
        n = stop - start
        parts: list[Any] = [None] * (4 * n + 1)
        parts[0 : 4 * n : 4] = map(_KEY_PREFIX.__getitem__, self.key_lengths[start:stop])
        parts[1 : 4 * n : 4] = self.keys[start:stop]
        parts[2 : 4 * n : 4] = map(_BIN.__getitem__, self.value_lengths[start:stop])
        parts[3 : 4 * n : 4] = self.values[start:stop]
        return _join(parts, n)


def _join(parts: list[Any], n: int) -> bytes:
    """Records whose parts begin with a prefix carrying the previous record's nil headers:
    the first prefix loses it (the array header goes there), the last record gets its own."""
    parts[0] = _array_header(n) + parts[0][1:]
    parts[-1] = _NIL
    return b"".join(parts)


class BinaryChunk(NamedTuple):
    """One Arrow binary (or large_binary) array as its buffers, for the column encoder.

    Its `length` rows start at row `offset` of the buffers (a sliced array). Row i
    runs from offsets[offset + i] to offsets[offset + i + 1] in `data`; offsets are
    int32, int64 when `wide`. Row i is null when bit offset + i of `validity` is
    clear (None: no nulls). Buffers are any objects with the buffer protocol
    (pyarrow.Buffer), so protocol/ needs no pyarrow. `data` None holds no bytes."""

    length: int
    offset: int
    validity: Any
    offsets: Any
    data: Any
    wide: bool


BinaryColumn = Sequence[BinaryChunk]


def binary_rows(column: BinaryColumn, start: int, stop: int) -> list[bytes | None]:
    """Rows [start, stop) of a column as bytes-or-None, one object per row: the
    reference the C encoder is tested against, and its stand-in where it is not built."""
    rows: list[bytes | None] = []
    first = 0
    for chunk in column:
        begin, end = max(start - first, 0), min(stop - first, chunk.length)
        first += chunk.length
        if begin >= end:
            continue
        offsets = memoryview(chunk.offsets).cast("B").cast("q" if chunk.wide else "i")
        validity = None if chunk.validity is None else memoryview(chunk.validity).cast("B")
        data = memoryview(b"" if chunk.data is None else chunk.data).cast("B")
        for row in range(chunk.offset + begin, chunk.offset + end):
            if validity is not None and not validity[row >> 3] >> (row & 7) & 1:
                rows.append(None)
            else:
                rows.append(bytes(data[offsets[row] : offsets[row + 1]]))
    return rows


def _rows_of(column: BinaryColumn) -> int:
    return sum(chunk.length for chunk in column)


def encode_binary_records_py(
    values: BinaryColumn, keys: BinaryColumn | None, start: int, stop: int, /
) -> bytes:
    """The records array of rows [start, stop), every timestamp_delta 0 (RecordColumns')."""
    n = _rows_of(values)
    if keys is not None and _rows_of(keys) != n:
        raise ValueError(f"{_rows_of(keys)} keys for {n} values")
    if not 0 <= start <= stop <= n:
        raise ValueError(f"rows [{start}, {stop}) of {n}")
    if start == stop:
        return _array_header(0)  # RecordColumns' fast paths assume a record
    return RecordColumns(
        binary_rows(values, start, stop),
        None if keys is None else binary_rows(keys, start, stop),
    ).encode()


def binary_record_bounds_py(
    values: BinaryColumn, keys: BinaryColumn | None, limit: int, overhead: int, /
) -> list[tuple[int, int]]:
    """[start, stop) runs whose records, each `overhead` plus its key and value bytes,
    add up to at most `limit`; a record alone over `limit` ends the list with an
    empty run (i, i) at its row."""
    n = _rows_of(values)
    sizes = [overhead + (0 if v is None else len(v)) for v in binary_rows(values, 0, n)]
    if keys is not None:
        if _rows_of(keys) != n:
            raise ValueError(f"{_rows_of(keys)} keys for {n} values")
        key_rows = binary_rows(keys, 0, n)
        sizes = [
            size + (0 if k is None else len(k)) for size, k in zip(sizes, key_rows, strict=True)
        ]
    bounds: list[tuple[int, int]] = []
    begin = used = 0
    for i, size in enumerate(sizes):
        if i > begin and used + size <= limit:
            used += size
            continue
        if i > begin:
            bounds.append((begin, i))
        if size > limit:
            bounds.append((i, i))
            return bounds
        begin, used = i, size
    if n > begin:
        bounds.append((begin, n))
    return bounds


def _undecided(records: bytes | memoryview, /) -> int:
    """count_plain_records without the extension: msgspec decides every array."""
    return -1


_INT64 = range(-(2**63), 2**63)


def plain_rows_py(
    records: bytes | memoryview,
    record_count: int,
    skip: int,
    row_type: type[tuple[Any, ...]],
    topic: str,
    partition: int,
    base_offset: int,
    base_timestamp: int,
    no_headers: tuple[Any, ...],
    /,
) -> list[Any] | None:
    """The consumer's rows of a magic-1 records array, the reference of the C decode.

    When the array holds exactly `record_count` records [int, bin|nil, bin|nil,
    nil|[]] (each int, offset and timestamp within int64), the records from index
    `skip` on as `row_type` 7-tuples (topic, partition, offset, timestamp, key,
    value, no_headers); None for anything else, which the caller's own decode
    judges (and refuses with its reason where it is corrupt)."""
    try:
        rows = msgpack.unpackb(records, use_list=False, raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    if type(rows) is not tuple or len(rows) != record_count:
        return None
    if record_count and base_offset + record_count - 1 not in _INT64:
        return None
    out = []
    for i, row in enumerate(rows):
        if type(row) is not tuple or len(row) != 4:
            return None
        delta, key, value, headers = row
        if type(delta) is not int or delta not in _INT64 or base_timestamp + delta not in _INT64:
            return None
        if not (key is None or type(key) is bytes) or not (value is None or type(value) is bytes):
            return None
        if headers is not None and headers != ():
            return None
        if i >= skip:
            record = (topic, partition, base_offset + i, base_timestamp + delta, key, value)
            out.append(tuple.__new__(row_type, (*record, no_headers)))
    return out


def _undecided_list(
    values: list[bytes | None], keys: list[bytes | None] | None, start: int, stop: int, /
) -> None:
    """encode_list_records without the extension: RecordColumns.encode_py does every run."""
    return None


def bytes_lengths_py(column: list[Any], /) -> list[int] | None:
    """len() of every item when every item is exactly bytes, else None: the reference
    of the C pass."""
    if not all(type(item) is bytes for item in column):
        return None
    return list(map(len, column))


def _undecided_lengths(column: list[Any], /) -> None:
    """bytes_lengths without the extension: `_lengths` looks at the column itself."""
    return None


def _undecided_rows(*args: Any) -> None:
    """plain_rows without the extension: the caller's columnar decode does every array."""
    return None


count_plain_records: Callable[[bytes | memoryview], int]
plain_rows: Callable[..., list[Any] | None]
bytes_lengths: Callable[[list[Any]], list[int] | None]
encode_list_records: Callable[
    [list[bytes | None], list[bytes | None] | None, int, int], bytes | None
]
encode_binary_records: Callable[[BinaryColumn, BinaryColumn | None, int, int], bytes]
binary_record_bounds: Callable[[BinaryColumn, BinaryColumn | None, int, int], list[tuple[int, int]]]
try:
    from protocol import _records_fast
except ImportError:  # not built here (no C compiler at install): the Python paths alone
    count_plain_records = _undecided
    plain_rows = _undecided_rows
    bytes_lengths = _undecided_lengths
    encode_list_records = _undecided_list
    encode_binary_records = encode_binary_records_py
    binary_record_bounds = binary_record_bounds_py
else:
    count_plain_records = _records_fast.count_plain_records
    plain_rows = _records_fast.plain_rows
    bytes_lengths = _records_fast.bytes_lengths
    encode_list_records = _records_fast.encode_list_records
    encode_binary_records = _records_fast.encode_binary_records
    binary_record_bounds = _records_fast.binary_record_bounds


class _CheckedRecord(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """A record as the broker checks it: a 4-array of exactly these types.

    Untracked by the cyclic GC (a tree of decoded values cannot form a cycle):
    tuples would be tracked, and a 1 MiB batch of small records then costs the
    broker a GC pass over its whole heap now and then. bytes fields, although
    they copy, measured faster than memoryview fields for 100-byte records."""

    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None


_strict = msgspec.msgpack.Decoder(list[_CheckedRecord])


def count_records(records: bytes | memoryview) -> int:
    """How many well-formed records the array `records` holds, nothing before or after it.

    Raises ValueError (msgspec.DecodeError) on anything else: another type in a
    field, a record that is not a 4-array, a header that is not [str, bin]. The
    C walk decides only what it can accept; every other array goes to msgspec."""
    count = count_plain_records(records)
    return count if count >= 0 else len(_strict.decode(records))
