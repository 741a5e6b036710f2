"""One log segment: a `.log` file of stamped batches, kept open, and its indexes.

The indexes live in memory (offset_index.py) and go to `.index`/`.timeindex` files when
the segment stops being active and at close; a reopened log loads them after a clean
shutdown and rebuilds them from the log (recovery.py) otherwise.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path

from broker.storage.fileio import fsync_dir, write_atomic
from broker.storage.offset_index import (
    OFFSET_ENTRY_BYTES,
    TIME_ENTRY_BYTES,
    IndexCorruptError,
    OffsetIndex,
    SegmentIndex,
    TimeIndex,
)
from broker.storage.recovery import SegmentScan, scan_segment
from protocol.batch import (
    HEADER_BYTES_MAX,
    LENGTH_PREFIX_BYTES,
    MAGIC,
    MAGIC_V2,
    OFFSET,
    BatchHeader,
    iter_records,
    read_header,
    scan_batches,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"  # aborted transactions, written by broker/partitions/partition.py
INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
SEGMENT_SUFFIXES = (LOG_SUFFIX, *INDEX_SUFFIXES)

# A batch is two pieces of one pwritev (its offset stamp, the rest): IOV_MAX bounds a call.
APPEND_BATCHES_MAX = os.sysconf("SC_IOV_MAX") // 2
# Header walks read this much per pread: several small batches' headers in one call.
_HEADER_WINDOW_BYTES = 4096
LEADER_EPOCH = (0).to_bytes(4, "big")
"""partition_leader_epoch (bytes 12..15) of every v2 batch appended."""
_READ_CHUNK_BYTES = 1 << 20


class StorageError(Exception):
    """An OSError while writing the log (disk full, EFBIG, EIO). Raised after any partial
    write was undone, so nothing half-written is visible."""


class CorruptBatchError(Exception):
    """A stored batch failed its CRC when read: damage at rest. It is never served."""


def file_name(offset: int, suffix: str) -> str:
    return f"{offset:020d}{suffix}"


class Segment:
    """The batches of offsets [base_offset, next_offset) in one `.log` file of `size_bytes`.

    Not thread-safe: one event-loop thread appends and reads; a flusher thread only
    fdatasyncs `fd`."""

    __slots__ = (
        "base_offset",
        "checked_from",
        "directory",
        "fd",
        "first_append_ms",
        "index",
        "index_dirty",
        "index_interval_bytes",
        "next_offset",
        "segment_index_bytes",
        "size_bytes",
    )

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        fd: int,
        *,
        index_interval_bytes: int,
        segment_index_bytes: int,
        first_append_ms: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.fd = fd
        self.index_interval_bytes = index_interval_bytes
        self.segment_index_bytes = segment_index_bytes
        self.size_bytes = os.fstat(fd).st_size
        # Batches at or past this position had their CRC checked by this process (a
        # recovery scan, or validation before they were appended); reads below it check
        # what they serve, so damage at rest from before the start is never sent on.
        self.checked_from = self.size_bytes
        self.next_offset = base_offset
        self.index = self._empty_index()
        self.index_dirty = True  # the files do not match `index` until written or loaded
        # When the first batch went in, for segment_ms; meaningful once size_bytes > 0. A
        # reopened segment uses its first batch's max timestamp (capped at now), as Kafka does.
        self.first_append_ms = first_append_ms

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        segment_index_bytes: int,
        now_ms: int,
    ) -> Segment:
        """A new, empty segment whose file name is durable when this returns."""
        path = directory / file_name(base_offset, LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fsync_dir(directory)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(
            directory,
            base_offset,
            fd,
            index_interval_bytes=index_interval_bytes,
            segment_index_bytes=segment_index_bytes,
            first_append_ms=now_ms,
        )

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        segment_index_bytes: int,
        now_ms: int,
    ) -> Segment:
        """An existing segment, not yet usable: call `load_indexes` or `recover` next."""
        fd = os.open(directory / file_name(base_offset, LOG_SUFFIX), os.O_RDWR | os.O_CLOEXEC)
        return cls(
            directory,
            base_offset,
            fd,
            index_interval_bytes=index_interval_bytes,
            segment_index_bytes=segment_index_bytes,
            first_append_ms=now_ms,
        )

    def _empty_index(self) -> SegmentIndex:
        return SegmentIndex.empty(
            self.base_offset,
            index_interval_bytes=self.index_interval_bytes,
            segment_index_bytes=self.segment_index_bytes,
        )

    def _path(self, suffix: str) -> Path:
        return self.directory / file_name(self.base_offset, suffix)

    # -- writing --------------------------------------------------------------------------

    def append(
        self,
        batches: Sequence[bytes | memoryview],
        headers: Sequence[BatchHeader],
        base_offset: int,
        now_ms: int,
    ) -> list[int]:
        """Write `batches`, the first stamped with `base_offset` and each next one with the
        offset after its predecessor, at the end of the file in one call, index them, and
        return the offsets they were stamped with.

        One write for many batches is the point: a write that starts or ends inside a
        page costs the kernel about as much as a whole batch's copy (docs/benchmark-notes.md).
        On OSError the file is cut back to its previous size and StorageError raised with
        the in-memory state untouched; reads never go past `size_bytes` in any case."""
        assert 0 < len(batches) == len(headers) <= APPEND_BATCHES_MAX, len(batches)
        assert base_offset == self.next_offset, (base_offset, self.next_offset)
        start = self.size_bytes
        pieces: list[bytes | memoryview] = []
        entries: list[tuple[int, int, int]] = []  # position, base offset, max timestamp
        position, offset = start, base_offset
        for batch, header in zip(batches, headers, strict=True):
            size = header.size_bytes
            assert len(batch) == size, (len(batch), size)
            if header.magic == MAGIC_V2:
                # Kafka's leader writes its leader epoch into every v2 batch it appends
                # (outside the CRC); a single broker's is its first, 0.
                pieces += (OFFSET.pack(offset) + batch[8:12] + LEADER_EPOCH, memoryview(batch)[16:])
            else:
                pieces += (OFFSET.pack(offset), memoryview(batch)[8:])
            entries.append((position, offset, header.max_timestamp))
            position += size
            offset += header.last_offset_delta + 1
        try:
            written = os.pwritev(self.fd, pieces, start)
            if written != position - start:
                self._finish_short_write(b"".join(pieces), written, start)
        except OSError as exc:
            with suppress(OSError):
                os.ftruncate(self.fd, start)
            raise StorageError(f"append to {self._path(LOG_SUFFIX)}: {exc}") from exc
        if start == 0:
            self.first_append_ms = now_ms
        self.size_bytes = position
        self.next_offset = offset
        add = self.index.add
        for entry in entries:
            add(*entry)
        self.index_dirty = True
        return [stamped for _, stamped, _ in entries]

    def _finish_short_write(self, data: bytes, written: int, position: int) -> None:
        """Write the rest after a short write; the next call reports why it was short."""
        view = memoryview(data)
        while written < len(view):
            count = os.pwrite(self.fd, view[written:], position + written)
            if count == 0:
                raise OSError(errno.EIO, "write made no progress")
            written += count

    def write_indexes(self) -> None:
        """Write both index files durably, after recording the max timestamp in the time
        index so a reopened segment knows it without scanning."""
        self.index.finalize()
        write_atomic(self._path(INDEX_SUFFIX), self.index.offsets.to_bytes())
        write_atomic(self._path(TIME_INDEX_SUFFIX), self.index.times.to_bytes())
        self.index_dirty = False

    # -- loading --------------------------------------------------------------------------

    def load_indexes(self, next_offset: int | None, now_ms: int) -> bool:
        """Trust the log and load the index files. False, changing nothing, when a file is
        missing or fails a check; the caller then recovers the segment instead.

        `next_offset` is the next segment's base offset; None for the last segment, whose
        end is found by walking the batches after the newest index entry."""
        try:
            offsets = OffsetIndex.from_bytes(
                self.base_offset,
                self._path(INDEX_SUFFIX).read_bytes(),
                self.segment_index_bytes // OFFSET_ENTRY_BYTES,
            )
            times = TimeIndex.from_bytes(
                self._path(TIME_INDEX_SUFFIX).read_bytes(),
                self.segment_index_bytes // TIME_ENTRY_BYTES,
            )
        except (FileNotFoundError, IndexCorruptError):
            return False
        index = SegmentIndex(offsets, times, self.index_interval_bytes)
        if self.size_bytes == 0:
            if len(offsets) or len(times) or next_offset not in (None, self.base_offset):
                return False
            self.index = index
            self.next_offset = self.base_offset
            self.index_dirty = False
            return True
        tail_start = offsets.last_position
        if tail_start + HEADER_BYTES_MAX > self.size_bytes:
            return False
        # Every segment's tail is walked, not only the last one's: bytes after its last
        # batch (junk appended, a torn copy) would otherwise be served as a batch.
        walked = self._walk_tail(offsets.last_offset, tail_start, times.last_timestamp)
        if walked is None or next_offset not in (None, walked):
            return False
        next_offset = walked
        first_time, last_time = times.first_offset, times.last_offset
        if first_time is None or last_time is None:
            return False  # a segment with data always has its final time entry
        if not (self.base_offset <= first_time and last_time < next_offset):
            return False
        self.index = index
        self.next_offset = next_offset
        self.index_dirty = False
        self.first_append_ms = min(self._read_header(0).max_timestamp, now_ms)
        return True

    def _walk_tail(self, offset: int, position: int, max_timestamp: int) -> int | None:
        """The offset after the batches from `position` to the end of the file, which must
        be whole, CRC-valid, start at `offset`, and not raise the max timestamp."""
        tail = self._read_at(position, self.size_bytes - position)
        end = 0
        for at, header in scan_batches(tail):
            if header.base_offset != offset or header.max_timestamp > max_timestamp:
                return None
            offset = header.next_offset
            end = at + header.size_bytes
        return offset if end == len(tail) else None

    def recover(self, now_ms: int) -> SegmentScan:
        """Rebuild the indexes by validating every batch, and cut the file after the last
        valid one."""
        index = self._empty_index()
        if self.size_bytes == 0:
            scan = scan_segment(b"", index)
        else:
            with (
                mmap.mmap(self.fd, self.size_bytes, access=mmap.ACCESS_READ) as data,
                memoryview(data) as view,
            ):
                scan = scan_segment(view, index)
        assert scan.valid_bytes <= self.size_bytes
        if scan.valid_bytes < self.size_bytes:
            os.ftruncate(self.fd, scan.valid_bytes)
        self.size_bytes = scan.valid_bytes
        self.checked_from = 0
        self.next_offset = scan.next_offset
        self.index = scan.index
        self.index_dirty = True
        if scan.valid_bytes:
            self.first_append_ms = min(self._read_header(0).max_timestamp, now_ms)
        return scan

    # -- reading --------------------------------------------------------------------------

    def _read_at(self, position: int, size: int) -> bytes:
        data = os.pread(self.fd, size, position)
        assert len(data) == size, (position, size, len(data))
        return data

    def _read_header(self, position: int) -> BatchHeader:
        """The header of the batch at `position`, of either format (a whole batch is
        longer than HEADER_BYTES_MAX, so the read stays inside the file)."""
        return read_header(self._read_at(position, HEADER_BYTES_MAX))

    def _headers(self, start: tuple[int, int]) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from `start` (an index entry: the offset and
        position of a batch) to the end.

        The CRC does not cover base_offset, batch_length or magic, so a header that does
        not follow on from the one before is damage at rest when it lies below
        `checked_from` (CorruptBatchError, answered as a storage error) and a broken
        invariant above it."""
        expected, position = start
        end = self.size_bytes
        while position < end:
            window = self._read_at(position, min(_HEADER_WINDOW_BYTES, end - position))
            at = 0
            while at + HEADER_BYTES_MAX <= len(window):
                header = read_header(window, at)
                if not (
                    header.magic in (MAGIC, MAGIC_V2)
                    and header.batch_length >= HEADER_BYTES_MAX - LENGTH_PREFIX_BYTES
                    and header.base_offset == expected
                    and position + at + header.size_bytes <= end
                ):
                    where = f"{self._path(LOG_SUFFIX)}: position {position + at}"
                    if position + at >= self.checked_from:
                        raise AssertionError(f"{where}: {header}")
                    raise CorruptBatchError(f"{where}: a batch header that does not follow on")
                yield position + at, header
                expected = header.next_offset
                at += header.size_bytes
            assert at > 0, (position, end)
            position += at

    def locate(self, offset: int) -> tuple[int, BatchHeader]:
        """Position and header of the batch holding `offset`: from the newest index entry at
        or below it, a walk of at most about one index interval of headers."""
        assert self.base_offset <= offset < self.next_offset, (offset, self.base_offset)
        for position, header in self._headers(self.index.offsets.lookup(offset)):
            if header.last_offset >= offset:
                return position, header
        raise AssertionError(f"offset {offset} not found in segment {self.base_offset}")

    def read(self, offset: int, max_bytes: int, upper_offset: int) -> bytes:
        """Whole batches from the one holding `offset`: at most `max_bytes` but at least
        one, none whose base offset is at or above `upper_offset`."""
        position, first = self.locate(offset)
        if first.base_offset >= upper_offset:
            return b""
        size = max(first.size_bytes, min(max_bytes, self.size_bytes - position))
        data = self._read_at(position, size)
        end = first.size_bytes
        while end + HEADER_BYTES_MAX <= size:
            header = read_header(data, end)
            if (
                header.size_bytes < HEADER_BYTES_MAX
                or end + header.size_bytes > size
                or header.base_offset >= upper_offset
            ):
                break
            end += header.size_bytes
        if position < self.checked_from:
            end = self._intact_bytes(position, data[:end], first.base_offset)
        return data if end == size else data[:end]

    def _intact_bytes(self, position: int, data: bytes, base_offset: int) -> int:
        """How many bytes of the whole batches in `data` (read at `position`, starting with
        the batch of `base_offset`) pass their CRC and follow on in offsets;
        CorruptBatchError when the first does not, for nothing could be served."""
        intact = 0
        expected = base_offset
        for at, header in scan_batches(data):
            if position + at >= self.checked_from:
                return len(data)  # checked before: validated when appended
            if header.base_offset != expected:
                break
            expected = header.next_offset
            intact = at + header.size_bytes
        if intact == 0:
            raise CorruptBatchError(
                f"{self._path(LOG_SUFFIX)}: the batch at position {position} fails its CRC"
            )
        return intact

    def span(
        self, offset: int, max_bytes: int, upper_offset: int
    ) -> tuple[int, int, int, int, int]:
        """(position, length, record count, next offset, magics) of the batches `read`
        would return, found from their headers alone: what a zero-copy send needs,
        without the bytes. `magics` has bit m set when a batch of magic m is among them
        (the kafka listener sends a span of v2 batches alone as it lies)."""
        position, first = self.locate(offset)
        length = records = magics = 0
        next_offset = first.base_offset
        if first.base_offset >= upper_offset:
            return position, 0, 0, next_offset, 0
        # Damage past the first batch ends the span there: what precedes it is served,
        # and the damaged batch is refused when it is fetched itself.
        with suppress(CorruptBatchError):
            for _, header in self._headers((first.base_offset, position)):
                if header.base_offset >= upper_offset or (
                    length and length + header.size_bytes > max_bytes
                ):
                    break
                length += header.size_bytes
                records += header.record_count
                next_offset = header.next_offset
                magics |= 1 << header.magic
        if length and position < self.checked_from:
            # Below the checked mark the bytes are read once to check them; above it (all
            # that this process appended) the send stays zero-copy.
            data = self._read_at(position, length)
            intact = self._intact_bytes(position, data, first.base_offset)
            if intact < length:
                kept = [h for _, h in scan_batches(self._read_at(position, intact))]
                records = sum(h.record_count for h in kept)
                next_offset = kept[-1].next_offset
                magics = sum({1 << h.magic for h in kept})
                length = intact
        return position, length, records, next_offset, magics

    def batches(self, position: int) -> Iterator[tuple[BatchHeader, bytes]]:
        """Each batch from `position` to the end, read a chunk of many batches at a time."""
        end = self.size_bytes
        while position < end:
            chunk = self._read_at(position, min(_READ_CHUNK_BYTES, end - position))
            at = 0
            while at + HEADER_BYTES_MAX <= len(chunk):
                header = read_header(chunk, at)
                if at + header.size_bytes > len(chunk):
                    break
                yield header, chunk[at : at + header.size_bytes]
                at += header.size_bytes
            if at == 0:  # one batch larger than a chunk
                assert len(chunk) >= HEADER_BYTES_MAX, (position, end)
                header = read_header(chunk)
                yield header, self._read_at(position, header.size_bytes)
                at = header.size_bytes
            position += at

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset here whose record timestamp is >= `timestamp_ms`, or None.

        Starts at the time index's newest entry at or below the target: no batch before
        it reaches the target, so no earlier record can."""
        start = self.index.times.lookup(timestamp_ms)
        for at, header in self._headers(
            self.index.offsets.lookup(self.base_offset if start is None else start)
        ):
            if header.max_timestamp < timestamp_ms:
                continue
            if header.base_timestamp >= timestamp_ms:
                return header.base_offset
            batch = self._read_at(at, header.size_bytes)
            for record in iter_records(batch, 0, header):
                if record.timestamp >= timestamp_ms:
                    return record.offset
        return None

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        os.close(self.fd)

    def delete(self) -> None:
        """Close and remove the files, the log first: a crash in between leaves only index
        files without a log, which opening the partition removes."""
        self.close()
        for suffix in SEGMENT_SUFFIXES:
            self._path(suffix).unlink(missing_ok=True)
