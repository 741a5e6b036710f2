"""send_batch's columns: from lists or Arrow arrays, cut into wire batches.

Lists are encoded by protocol.records.RecordColumns (its C-level join fast
path). Arrow binary and string arrays without headers go to ArrowColumns, which
hands their buffers to protocol.records.encode_binary_records: no Python object
per row (Spark's writer sends millions of rows this way). What is added here is
the client's side: turning what callers pass into columns, and cutting them into
runs that fit max_request_size by the same size accounting the accumulator uses
for send().
"""

from __future__ import annotations

import bisect
import itertools
from operator import add
from typing import Any

from client.accumulator import headers_size
from client.errors import RecordTooLargeError
from protocol.records import (
    RECORD_OVERHEAD,
    BinaryChunk,
    RecordColumns,
    binary_record_bounds,
    bytes_lengths,
    encode_binary_records,
)


def is_arrow(data: Any) -> bool:
    """Whether `data` is an Arrow array or chunked array (duck-typed: pyarrow is optional)."""
    return hasattr(data, "to_pylist") and hasattr(data, "type")


def _arrow_binary(data: Any, what: str) -> Any:
    """An Arrow array of binary or large_binary: strings as their UTF-8 bytes (no copy),
    fixed-size binary widened to binary."""
    import pyarrow as pa

    kind = data.type
    if pa.types.is_string(kind) or pa.types.is_fixed_size_binary(kind):
        return data.cast(pa.binary())
    if pa.types.is_large_string(kind):
        return data.cast(pa.large_binary())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return data
    raise TypeError(f"{what} must be a binary or string Arrow array, not {kind}")


def to_column(data: Any, what: str) -> list[bytes | None]:
    """A column of bytes-or-None as a list, from a list/tuple or an Arrow (chunked) array."""
    if is_arrow(data):
        return list(_arrow_binary(data, what).to_pylist())
    items = data if isinstance(data, list) else list(data)
    # All bytes, the common case, in one C pass where the extension is built.
    if type(items) is list and bytes_lengths(items) is not None:
        return items
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


class Columns(RecordColumns):
    """Values with optional keys and headers, cut into wire batches and encoded."""

    __slots__ = ()

    def record_sizes(self) -> Any:
        """Upper bounds of each record's encoded size, as the accumulator counts them."""
        values = self.values
        sizes: Any = (
            iter(self.value_lengths)
            if self.value_lengths is not None
            else (0 if v is None else len(v) for v in values)
        )
        if self.keys is not None:
            key_sizes = self.key_lengths or [0 if k is None else len(k) for k in self.keys]
            sizes = map(add, sizes, key_sizes)
        if self.headers is not None:
            sizes = map(add, sizes, map(headers_size, self.headers))
        return map(RECORD_OVERHEAD.__add__, sizes)

    def bounds(self, limit: int) -> list[tuple[int, int]]:
        """[start, stop) row ranges whose records add up to at most `limit` bytes each."""
        lengths = self.value_lengths
        n = len(self.values)
        if (
            lengths
            and self.keys is None
            and self.headers is None
            and lengths.count(lengths[0]) == n
        ):
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


class ArrowColumns:
    """Arrow binary values with optional Arrow binary keys, no headers: send_batch's
    columns encoded straight from the arrays' buffers (protocol.records'
    encode_binary_records), with Columns' interface for the producer."""

    __slots__ = ("_key_chunks", "_keys", "_value_chunks", "key_array", "value_array")

    def __init__(self, values: Any, keys: Any = None) -> None:
        self.value_array = _arrow_binary(values, "values")
        self.key_array = None if keys is None else _arrow_binary(keys, "keys")
        if self.key_array is not None and len(self.key_array) != len(self.value_array):
            raise ValueError(f"{len(self.key_array)} keys for {len(self.value_array)} values")
        self._value_chunks = binary_chunks(self.value_array)
        self._key_chunks = None if self.key_array is None else binary_chunks(self.key_array)
        self._keys: list[bytes | None] | None = None

    def __len__(self) -> int:
        return len(self.value_array)

    @property
    def keys(self) -> list[bytes | None] | None:
        """The keys as bytes, made on first use: only the key partitioner reads them."""
        if self.key_array is None:
            return None
        if self._keys is None:
            self._keys = self.key_array.to_pylist()
        return self._keys

    def select(self, rows: list[int]) -> ArrowColumns:
        """The given rows only (keyed records split by partition)."""
        import pyarrow as pa

        take = pa.array(rows, pa.int64())
        return ArrowColumns(
            self.value_array.take(take),
            None if self.key_array is None else self.key_array.take(take),
        )

    def bounds(self, limit: int) -> list[tuple[int, int]]:
        """[start, stop) row ranges whose records add up to at most `limit` bytes each,
        each record counted as Columns.record_sizes counts it."""
        bounds = binary_record_bounds(self._value_chunks, self._key_chunks, limit, RECORD_OVERHEAD)
        if bounds and bounds[-1][0] == bounds[-1][1]:
            raise RecordTooLargeError(
                f"record {bounds[-1][0]} of send_batch exceeds max_request_size ({limit} bytes "
                "of records)"
            )
        return bounds

    def encode(self, start: int = 0, stop: int | None = None) -> bytes:
        """The records array of rows [start, stop), every timestamp_delta 0."""
        return encode_binary_records(
            self._value_chunks, self._key_chunks, start, len(self) if stop is None else stop
        )


def binary_chunks(array: Any) -> tuple[BinaryChunk, ...]:
    """The buffers of every chunk of an Arrow binary or large_binary (chunked) array."""
    import pyarrow as pa

    wide = pa.types.is_large_binary(array.type)
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    chunked = []
    for chunk in chunks:
        validity, offsets, data = chunk.buffers()
        chunked.append(BinaryChunk(len(chunk), chunk.offset, validity, offsets, data, wide))
    return tuple(chunked)
