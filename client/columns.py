"""send_batch's columns: from lists or Arrow arrays, cut into wire batches.

Encoding is protocol.records.RecordColumns' (its C-level join fast path); what
is added here is the client's side: turning what callers pass into columns of
bytes, and cutting them into runs that fit max_request_size by the same size
accounting the accumulator uses for send().
"""

from __future__ import annotations

import bisect
import itertools
from operator import add
from typing import Any

from client.accumulator import headers_size
from client.errors import RecordTooLargeError
from protocol.records import RECORD_OVERHEAD, RecordColumns


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
