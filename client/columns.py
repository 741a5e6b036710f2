"""send_batch's encoder: whole columns of keys and values into msgpack record arrays.

A record on the wire is the msgpack array [0, key, value, headers] (all records
of a send_batch call share one timestamp, so every delta is 0). For the common
case, bytes values with bytes keys or none and no headers, each record is a
constant prefix plus the raw bytes, so a batch is assembled with C-level
`map`/`join` from a table of per-length prefixes, about 3x faster than building
a tuple per record for `msgpack.packb`. Anything else (None values, headers)
goes through `msgpack.packb`. Both produce identical bytes.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from operator import add
from typing import Any

import msgpack

from client.accumulator import RECORD_OVERHEAD, Headers, headers_size
from client.errors import RecordTooLargeError

_FIXARRAY4_DELTA0 = b"\x94\x00"
_NIL = b"\xc0"


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


def to_column(data: Any, what: str) -> list[bytes | None]:
    """A column of bytes-or-None as a list, from a list/tuple or an Arrow (chunked) array."""
    if hasattr(data, "to_pylist"):
        import pyarrow as pa

        kind = data.type
        if pa.types.is_string(kind):
            data = data.cast(pa.binary())
        elif pa.types.is_large_string(kind):
            data = data.cast(pa.large_binary())
        elif not (
            pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or pa.types.is_fixed_size_binary(kind)
        ):
            raise TypeError(f"{what} must be a binary or string Arrow array, not {kind}")
        return data.to_pylist()
    items = data if isinstance(data, list) else list(data)
    if set(map(type, items)) <= {bytes, type(None)}:
        return items
    return [v if v is None or v.__class__ is bytes else to_bytes(v, what) for v in items]


def to_bytes(data: Any, what: str) -> bytes:
    """str as UTF-8, bytearray/memoryview copied; anything else is a TypeError."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, str or None, got {type(data).__name__}")


def _lengths(column: list[bytes | None]) -> list[int] | None:
    """len() of every item, or None when an item is None (no fast path then)."""
    return None if None in column else list(map(len, column))


class Columns:
    """Values with optional keys and headers, cut into wire batches and encoded."""

    __slots__ = ("_key_lengths", "_value_lengths", "headers", "keys", "values")

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
        self._value_lengths = _lengths(values)
        self._key_lengths = None if keys is None else _lengths(keys)

    def select(self, rows: list[int]) -> Columns:
        """The given rows only (keyed records split by partition)."""
        return Columns(
            [self.values[i] for i in rows],
            None if self.keys is None else [self.keys[i] for i in rows],
            None if self.headers is None else [self.headers[i] for i in rows],
        )

    def record_sizes(self) -> Any:
        """Upper bounds of each record's encoded size, as the accumulator counts them."""
        values = self.values
        sizes: Any = (
            iter(self._value_lengths)
            if self._value_lengths is not None
            else (0 if v is None else len(v) for v in values)
        )
        if self.keys is not None:
            key_sizes = self._key_lengths or [0 if k is None else len(k) for k in self.keys]
            sizes = map(add, sizes, key_sizes)
        if self.headers is not None:
            sizes = map(add, sizes, map(headers_size, self.headers))
        return map(RECORD_OVERHEAD.__add__, sizes)

    def bounds(self, limit: int) -> list[tuple[int, int]]:
        """[start, stop) row ranges whose records add up to at most `limit` bytes each."""
        lengths = self._value_lengths
        n = len(self.values)
        if lengths and self.keys is None and self.headers is None and min(lengths) == max(lengths):
            # Fixed-size records (common in bulk loads): the cut points are arithmetic.
            per_batch = limit // (RECORD_OVERHEAD + lengths[0])
            if not per_batch:
                raise RecordTooLargeError(
                    f"records of send_batch exceed max_request_size ({limit} bytes of records)"
                )
            return [(i, min(i + per_batch, n)) for i in range(0, n, per_batch)]
        ends = list(itertools.accumulate(self.record_sizes()))
        bounds = []
        start = 0
        consumed = 0
        while start < len(ends):
            stop = bisect.bisect_right(ends, consumed + limit, lo=start)
            if stop == start:
                raise RecordTooLargeError(
                    f"record {start} of send_batch exceeds max_request_size ({limit} bytes "
                    "of records)"
                )
            bounds.append((start, stop))
            consumed = ends[stop - 1]
            start = stop
        return bounds

    def encode(self, start: int, stop: int) -> bytes:
        """The msgpack array of records [start, stop)."""
        if self.headers is None and self._value_lengths is not None:
            if self.keys is None:
                return self._join_values(start, stop)
            if self._key_lengths is not None:
                return self._join_keyed(start, stop)
        n = stop - start
        return msgpack.packb(
            list(
                zip(
                    itertools.repeat(0, n),
                    itertools.repeat(None, n) if self.keys is None else self.keys[start:stop],
                    self.values[start:stop],
                    itertools.repeat(None, n) if self.headers is None else self.headers[start:stop],
                    strict=False,
                )
            ),
            use_bin_type=True,
        )

    def _join_values(self, start: int, stop: int) -> bytes:
        assert self._value_lengths is not None
        n = stop - start
        parts: list[Any] = [None] * (2 * n + 1)
        parts[0 : 2 * n : 2] = map(_VALUE_PREFIX.__getitem__, self._value_lengths[start:stop])
        parts[1 : 2 * n : 2] = self.values[start:stop]
        return _join(parts, n)

    def _join_keyed(self, start: int, stop: int) -> bytes:
        assert self._value_lengths is not None and self._key_lengths is not None
        assert self.keys is not None
        n = stop - start
        parts: list[Any] = [None] * (4 * n + 1)
        parts[0 : 4 * n : 4] = map(_KEY_PREFIX.__getitem__, self._key_lengths[start:stop])
        parts[1 : 4 * n : 4] = self.keys[start:stop]
        parts[2 : 4 * n : 4] = map(_BIN.__getitem__, self._value_lengths[start:stop])
        parts[3 : 4 * n : 4] = self.values[start:stop]
        return _join(parts, n)


def _join(parts: list[Any], n: int) -> bytes:
    """Records whose parts begin with a prefix carrying the previous record's nil headers:
    the first prefix loses it (the array header goes there), the last record gets its own."""
    parts[0] = _array_header(n) + parts[0][1:]
    parts[-1] = _NIL
    return b"".join(parts)
