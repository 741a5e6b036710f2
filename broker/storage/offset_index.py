"""Sparse offset and time indexes of one log segment: in memory, with their file encoding.

Pure: values and bytes in, values and bytes out. segment.py owns the files.

- `.index`: (relative offset uint32, file position uint32) per entry. Offsets are stored
  relative to the segment's base offset so they fit 32 bits, as in Kafka.
- `.timeindex`: (max timestamp so far int64, offset int64) per entry.

Entries are kept in `array`s (8 bytes per number, not a Python object each), so a 1 GiB
segment's index costs about as much memory as its file.
"""

from __future__ import annotations

import operator
import sys
from array import array
from bisect import bisect_right

UINT32_MAX = 2**32 - 1
OFFSET_ENTRY_BYTES = 8
TIME_ENTRY_BYTES = 16
MIN_TIMESTAMP = -(2**63)  # below every int64 timestamp: "no batch yet"

_U32 = "I"
_I64 = "q"
_LITTLE_ENDIAN = sys.byteorder == "little"

assert array(_U32).itemsize * 2 == OFFSET_ENTRY_BYTES
assert array(_I64).itemsize * 2 == TIME_ENTRY_BYTES


class IndexCorruptError(ValueError):
    """An index file fails its sanity check; the caller rebuilds the index from the log."""


def _interleave(typecode: str, first: array[int], second: array[int]) -> bytes:
    """Big-endian (first[i], second[i]) pairs, packed in C rather than one struct call each."""
    pairs = array(typecode, bytes(2 * len(first) * first.itemsize))
    pairs[0::2] = first
    pairs[1::2] = second
    if _LITTLE_ENDIAN:
        pairs.byteswap()
    return pairs.tobytes()


def _deinterleave(typecode: str, data: bytes, entry_bytes: int) -> tuple[array[int], array[int]]:
    if len(data) % entry_bytes:
        raise IndexCorruptError(f"{len(data)} bytes is not a whole number of {entry_bytes}")
    pairs = array(typecode)
    pairs.frombytes(data)
    if _LITTLE_ENDIAN:
        pairs.byteswap()
    return pairs[0::2], pairs[1::2]


def _strictly_increasing(values: array[int]) -> bool:
    return all(map(operator.lt, values, values[1:]))


class OffsetIndex:
    """Sparse map offset -> file position of the batch starting at that offset.

    `lookup` gives a position at or before the batch holding an offset; the reader walks
    batch headers forward from there, at most about one index interval."""

    __slots__ = ("_positions", "_relative_offsets", "base_offset", "max_entries")

    def __init__(
        self,
        base_offset: int,
        max_entries: int,
        relative_offsets: array[int] | None = None,
        positions: array[int] | None = None,
    ) -> None:
        self.base_offset = base_offset
        self.max_entries = max_entries
        self._relative_offsets = array(_U32) if relative_offsets is None else relative_offsets
        self._positions = array(_U32) if positions is None else positions
        assert len(self._relative_offsets) == len(self._positions)

    def __len__(self) -> int:
        return len(self._positions)

    @property
    def is_full(self) -> bool:
        return len(self._positions) >= self.max_entries

    @property
    def last_offset(self) -> int:
        """Offset of the newest entry; the base offset when there is none."""
        return self.base_offset + (self._relative_offsets[-1] if self._positions else 0)

    @property
    def last_position(self) -> int:
        """Position of the newest entry; 0 (the first batch) when there is none."""
        return self._positions[-1] if self._positions else 0

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        assert 0 <= relative <= UINT32_MAX, (offset, self.base_offset)
        assert 0 <= position <= UINT32_MAX, position
        assert not self._positions or (
            relative > self._relative_offsets[-1] and position > self._positions[-1]
        ), (offset, position)
        self._relative_offsets.append(relative)
        self._positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the newest entry at or below `offset`; (base, 0) if none."""
        i = bisect_right(self._relative_offsets, offset - self.base_offset)
        if i == 0:
            return self.base_offset, 0
        return self.base_offset + self._relative_offsets[i - 1], self._positions[i - 1]

    def to_bytes(self) -> bytes:
        return _interleave(_U32, self._relative_offsets, self._positions)

    @classmethod
    def from_bytes(cls, base_offset: int, data: bytes, max_entries: int) -> OffsetIndex:
        """Decode an `.index` file; raise IndexCorruptError unless entries strictly increase.

        The caller still checks the newest entry against the log (segment.py)."""
        relative_offsets, positions = _deinterleave(_U32, data, OFFSET_ENTRY_BYTES)
        if not (_strictly_increasing(relative_offsets) and _strictly_increasing(positions)):
            raise IndexCorruptError("offset index entries do not strictly increase")
        return cls(base_offset, max_entries, relative_offsets, positions)


class TimeIndex:
    """Sparse map max-timestamp-so-far -> offset of the first batch that reached it.

    Every batch before that offset has a smaller max timestamp, so a search for the first
    record at or after T may start at the batch of the newest entry with timestamp <= T."""

    __slots__ = ("_offsets", "_timestamps", "max_entries")

    def __init__(
        self,
        max_entries: int,
        timestamps: array[int] | None = None,
        offsets: array[int] | None = None,
    ) -> None:
        self.max_entries = max_entries
        self._timestamps = array(_I64) if timestamps is None else timestamps
        self._offsets = array(_I64) if offsets is None else offsets
        assert len(self._timestamps) == len(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def is_full(self) -> bool:
        return len(self._offsets) >= self.max_entries

    @property
    def last_timestamp(self) -> int:
        return self._timestamps[-1] if self._timestamps else MIN_TIMESTAMP

    @property
    def last_offset(self) -> int | None:
        return self._offsets[-1] if self._offsets else None

    @property
    def first_offset(self) -> int | None:
        return self._offsets[0] if self._offsets else None

    def append(self, timestamp: int, offset: int) -> None:
        assert timestamp > self.last_timestamp, (timestamp, self.last_timestamp)
        assert not self._offsets or offset > self._offsets[-1], (offset, self._offsets[-1])
        self._timestamps.append(timestamp)
        self._offsets.append(offset)

    def lookup(self, timestamp: int) -> int | None:
        """Offset of the newest entry with timestamp <= `timestamp`; None when there is none."""
        i = bisect_right(self._timestamps, timestamp)
        return self._offsets[i - 1] if i else None

    def to_bytes(self) -> bytes:
        return _interleave(_I64, self._timestamps, self._offsets)

    @classmethod
    def from_bytes(cls, data: bytes, max_entries: int) -> TimeIndex:
        """Decode a `.timeindex` file; raise IndexCorruptError unless entries strictly increase."""
        timestamps, offsets = _deinterleave(_I64, data, TIME_ENTRY_BYTES)
        if not (_strictly_increasing(timestamps) and _strictly_increasing(offsets)):
            raise IndexCorruptError("time index entries do not strictly increase")
        return cls(max_entries, timestamps, offsets)


class SegmentIndex:
    """Both indexes of a segment, its running max timestamp, and the rule for when a batch
    gets an entry. Appends and recovery share it, so a rebuilt index equals the original."""

    __slots__ = (
        "index_interval_bytes",
        "max_timestamp",
        "max_timestamp_offset",
        "offsets",
        "times",
    )

    def __init__(self, offsets: OffsetIndex, times: TimeIndex, index_interval_bytes: int) -> None:
        self.offsets = offsets
        self.times = times
        self.index_interval_bytes = index_interval_bytes
        self.max_timestamp = times.last_timestamp
        last = times.last_offset
        self.max_timestamp_offset = offsets.base_offset if last is None else last

    @classmethod
    def empty(
        cls, base_offset: int, *, index_interval_bytes: int, segment_index_bytes: int
    ) -> SegmentIndex:
        return cls(
            OffsetIndex(base_offset, segment_index_bytes // OFFSET_ENTRY_BYTES),
            TimeIndex(segment_index_bytes // TIME_ENTRY_BYTES),
            index_interval_bytes,
        )

    @property
    def is_full(self) -> bool:
        return self.offsets.is_full or self.times.is_full

    @property
    def room(self) -> int:
        """Batches that may still be added before `is_full`: each adds at most one entry
        to each index."""
        return min(
            self.offsets.max_entries - len(self.offsets), self.times.max_entries - len(self.times)
        )

    def add(self, position: int, base_offset: int, max_timestamp: int) -> None:
        """Account for the batch just written at `position`.

        An entry goes in once index_interval_bytes have been written since the last entry
        (Kafka's rule), so a reader walks at most about one interval of headers."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.max_timestamp_offset = base_offset
        if position - self.offsets.last_position >= self.index_interval_bytes:
            self.offsets.append(base_offset, position)
            if self.max_timestamp > self.times.last_timestamp:
                self.times.append(self.max_timestamp, self.max_timestamp_offset)

    def finalize(self) -> None:
        """Record the segment's max timestamp in the time index (past `is_full`: the file
        may hold one entry more) so a reopened log knows it without a scan, as in Kafka."""
        if self.max_timestamp > self.times.last_timestamp:
            self.times.append(self.max_timestamp, self.max_timestamp_offset)
