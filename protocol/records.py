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
`count_records` is the broker's strict check of what a client sent: msgspec is
its reference, and a C walk (protocol/_records_fast.c) answers first for the
plain shape [int, bin|nil, bin|nil, nil] without building an object per record.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import Any, TypeVar, cast

import msgpack
import msgspec

try:
    from protocol._records_fast import count_plain_records
except ImportError:  # not built here (no C compiler at install): msgspec counts alone

    def count_plain_records(records: bytes | memoryview, /) -> int:
        return -1


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
    """len() of every item, or None when an item is None (no fast path then)."""
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
        """The records array of rows [start, stop), every timestamp_delta 0."""
        if stop is None:
            stop = len(self.values)
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
