"""The append-only log of one partition: a directory of segments, modelled on Kafka's LocalLog.

    <base_offset:020d>.log        batches as produced, base_offset stamped; never re-encoded
    <base_offset:020d>.index      sparse (relative offset u32, position u32), see offset_index.py
    <base_offset:020d>.timeindex  sparse (max timestamp so far i64, offset i64)
    <base_offset:020d>.txnindex   aborted transactions whose marker lies in the segment
    <offset:020d>.snapshot        producer-state snapshots, opaque bytes to the log
    recovery-point                offset below which everything was fsynced, with a CRC

Writes never fsync on the append path: a group-commit flusher asks `sync_targets`, fdatasyncs
those fds in a worker thread and reports back with `mark_flushed`. The recovery point follows
`flushed_offset` to disk on roll and close, and again once the flusher has passed a roll (at
most one write per segment); after a crash, opening the log validates every batch from the
segment holding it onward and cuts what is torn or corrupt, so that is the active segment
whenever the flusher keeps up.
"""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

from broker.config import SETTINGS, TOPIC_SETTINGS
from broker.storage.fileio import TMP_SUFFIX, write_atomic
from broker.storage.offset_index import UINT32_MAX
from broker.storage.recovery import RecoveryReport, decode_recovery_point, encode_recovery_point
from broker.storage.segment import (
    APPEND_BATCHES_MAX,
    INDEX_SUFFIXES,
    LOG_SUFFIX,
    SEGMENT_SUFFIXES,
    CorruptBatchError,
    Segment,
    StorageError,
    file_name,
)
from protocol.batch import BatchHeader

__all__ = [
    "CorruptBatchError",
    "LogConfig",
    "OffsetOutOfRange",
    "PartitionLog",
    "RecoveryReport",
    "StorageError",
]

RECOVERY_POINT_FILE = "recovery-point"

log = logging.getLogger(f"minibroker.{__name__}")
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 3
OFFSET_LIMIT = 2**63  # above every int64 offset


def _default(name: str) -> int:
    default: int = SETTINGS[name].default
    return default


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-partition log settings: the topic-overridable settings of broker.config, whose
    declarations give the defaults and bounds; -1 = unlimited where allowed."""

    segment_bytes: int = _default("segment_bytes")
    segment_ms: int = _default("segment_ms")
    retention_bytes: int = _default("retention_bytes")
    retention_ms: int = _default("retention_ms")
    index_interval_bytes: int = _default("index_interval_bytes")
    segment_index_bytes: int = _default("segment_index_bytes")

    def __post_init__(self) -> None:
        for f in fields(self):
            SETTINGS[f.name].check(getattr(self, f.name))


# A topic override that LogConfig did not carry would be accepted and then ignored.
assert {f.name for f in fields(LogConfig)} == {s.name for s in TOPIC_SETTINGS.values()}


class FileSpan(NamedTuple):
    """Stored batches as a file range: `fd` is the span's own, to be closed after use."""

    fd: int
    position: int
    length: int
    record_count: int
    next_offset: int
    magics: int
    """Bit m set when a batch of magic m lies in the span."""


class OffsetOutOfRange(ValueError):
    """A fetch offset below log_start_offset or above log_end_offset."""


class PartitionLog:
    """The segments of one partition directory, oldest first; the last one is active.

    Used from one event-loop thread, except that a flusher thread may fdatasync the fds
    `sync_targets` returned while appends go on."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[Segment],
        *,
        flushed_offset: int,
        recovery: RecoveryReport,
    ) -> None:
        assert segments
        self.directory = directory
        self.config = config
        self._segments = segments
        self._base_offsets = [segment.base_offset for segment in segments]
        self.log_end_offset = segments[-1].next_offset
        self.size_bytes = sum(segment.size_bytes for segment in segments)
        self.flushed_offset = flushed_offset
        # The recovery point on disk (or the offset recovery started from, which is no later).
        self.recovery_point = flushed_offset
        self.recovery = recovery
        # Called with the new base offset after a roll and before the new segment gets data.
        self.on_roll: Callable[[int], None] | None = None
        assert self._base_offsets == sorted(set(self._base_offsets))
        assert self.log_start_offset <= flushed_offset <= self.log_end_offset

    @classmethod
    def open(
        cls, directory: Path, config: LogConfig, *, clean_shutdown: bool, now_ms: int
    ) -> PartitionLog:
        """Open (or create) the log in `directory`.

        After a clean shutdown the segments and index files are trusted, except that an
        index file that is missing or fails a sanity check makes that segment recover.
        Otherwise every segment from the one holding the recovery point onward is
        validated batch by batch: a torn or corrupt tail is cut, later segments deleted,
        indexes rebuilt, and producer snapshots past the new log end deleted."""
        started = time.monotonic()
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob("*" + TMP_SUFFIX):
            leftover.unlink()
        base_offsets = sorted(_offsets_of(directory, LOG_SUFFIX))
        for suffix in INDEX_SUFFIXES:
            for orphan in set(_offsets_of(directory, suffix)) - set(base_offsets):
                (directory / file_name(orphan, suffix)).unlink()

        recovery_point = None
        if not clean_shutdown:
            recovery_point = _read_recovery_point(directory)
        scan_from = _scan_from(base_offsets, recovery_point, clean_shutdown)

        segments: list[Segment] = []
        truncated_bytes = segments_scanned = batches_scanned = segments_deleted = 0
        for i, base_offset in enumerate(base_offsets):
            segment = Segment.open(
                directory,
                base_offset,
                index_interval_bytes=config.index_interval_bytes,
                segment_index_bytes=config.segment_index_bytes,
                now_ms=now_ms,
            )
            segments.append(segment)
            next_base = base_offsets[i + 1] if i + 1 < len(base_offsets) else None
            if base_offset < scan_from and segment.load_indexes(next_base, now_ms):
                continue
            size_bytes = segment.size_bytes
            scan = segment.recover(now_ms)
            truncated_bytes += size_bytes - scan.valid_bytes
            segments_scanned += 1
            batches_scanned += scan.batch_count
            # Later segments go only when this one no longer reaches them: bytes cut
            # after its last whole batch (junk, a torn copy) cost no offsets.
            if next_base is not None and scan.next_offset != next_base:
                for later in base_offsets[i + 1 :]:
                    for suffix in SEGMENT_SUFFIXES:
                        (directory / file_name(later, suffix)).unlink(missing_ok=True)
                    segments_deleted += 1
                break
        if not segments:
            segments.append(
                Segment.create(
                    directory,
                    0,
                    index_interval_bytes=config.index_interval_bytes,
                    segment_index_bytes=config.segment_index_bytes,
                    now_ms=now_ms,
                )
            )
        # Rebuilt indexes of inactive segments go to disk now: nothing rewrites them later,
        # and the recovery point may move past them before the next close.
        for segment in segments[:-1]:
            if segment.index_dirty:
                segment.write_indexes()

        log_end_offset = segments[-1].next_offset
        for offset, path in _snapshots(directory):
            if offset > log_end_offset:
                path.unlink()
        if clean_shutdown:
            flushed_offset = log_end_offset
        else:
            flushed_offset = min(max(recovery_point or 0, segments[0].base_offset), log_end_offset)
        report = RecoveryReport(
            truncated_bytes=truncated_bytes,
            segments_scanned=segments_scanned,
            batches_scanned=batches_scanned,
            segments_deleted=segments_deleted,
            duration_ms=(time.monotonic() - started) * 1000,
        )
        return cls(directory, config, segments, flushed_offset=flushed_offset, recovery=report)

    @property
    def log_start_offset(self) -> int:
        return self._base_offsets[0]

    @property
    def segment_bases(self) -> list[int]:
        """Base offsets of the segments, oldest first (a copy)."""
        return list(self._base_offsets)

    # -- append path ----------------------------------------------------------------------

    def append(self, batch: bytes, header: BatchHeader, now_ms: int) -> int:
        """Append one validated batch at log_end_offset and return the offset assigned.

        Raises StorageError, with the log as before the call, when the write fails."""
        return self.append_leading([batch], [header], now_ms)[0]

    def append_leading(
        self, batches: Sequence[bytes | memoryview], headers: Sequence[BatchHeader], now_ms: int
    ) -> list[int]:
        """Append the leading validated batches that one write can take, at least one, and
        return the offsets assigned to them; the caller calls again with the rest.

        Rolls first when the active segment is full by bytes, age or index, and stops
        the write where appending one by one would roll, so each call sees the state
        the batches before it left (a roll snapshots the producer state). Raises
        StorageError, with the log as before the call, when the roll or write fails."""
        if self._rolls_first(headers[0], now_ms):
            self.roll(now_ms)
        segment = self._segments[-1]
        # Within one write only the bytes and the offsets can fill the segment: the age
        # was judged above, and each batch adds at most one index entry.
        end = 1
        end_max = min(len(batches), max(1, segment.index.room), APPEND_BATCHES_MAX)
        size_bytes = headers[0].size_bytes
        next_offset = self.log_end_offset + headers[0].last_offset_delta + 1
        while end < end_max and not self._past_segment(
            segment, segment.size_bytes + size_bytes, next_offset, headers[end]
        ):
            size_bytes += headers[end].size_bytes
            next_offset += headers[end].last_offset_delta + 1
            end += 1
        offsets = segment.append(batches[:end], headers[:end], self.log_end_offset, now_ms)
        assert segment.next_offset == next_offset, (segment.next_offset, next_offset)
        self.log_end_offset = next_offset
        self.size_bytes += size_bytes
        return offsets

    def _rolls_first(self, header: BatchHeader, now_ms: int) -> bool:
        """Whether appending the batch of `header` now starts a new segment first: the
        active one is full by bytes, age or index."""
        segment = self._segments[-1]
        return bool(segment.size_bytes) and (
            now_ms - segment.first_append_ms > self.config.segment_ms
            or segment.index.is_full
            or self._past_segment(segment, segment.size_bytes, self.log_end_offset, header)
        )

    def appends_beside_unflushed(self, header: BatchHeader, now_ms: int) -> bool:
        """Whether the batch of `header`, appended now, lands in the one segment that holds
        everything not yet flushed: then no fsync round can make it durable without
        them, since recovery cuts a torn segment at its first bad batch."""
        return self.flushed_offset >= self._base_offsets[-1] and not self._rolls_first(
            header, now_ms
        )

    def _past_segment(
        self, segment: Segment, size_bytes: int, base_offset: int, header: BatchHeader
    ) -> bool:
        """Whether the batch of `header`, appended at `base_offset` to `segment` holding
        `size_bytes`, would overflow it in bytes or in offsets relative to its base."""
        return (
            size_bytes + header.size_bytes > self.config.segment_bytes
            or base_offset + header.last_offset_delta - segment.base_offset > UINT32_MAX
        )

    def roll(self, now_ms: int) -> None:
        """Start a new active segment at log_end_offset; nothing to do while the active one
        is empty. The old segment's indexes and the recovery point go to disk here; its data
        is fsynced by the flusher like any other, not here."""
        old = self._segments[-1]
        if not old.size_bytes:
            return
        try:
            old.write_indexes()
            new = Segment.create(
                self.directory,
                self.log_end_offset,
                index_interval_bytes=self.config.index_interval_bytes,
                segment_index_bytes=self.config.segment_index_bytes,
                now_ms=now_ms,
            )
        except OSError as exc:
            raise StorageError(f"roll of {self.directory} at {self.log_end_offset}: {exc}") from exc
        self._segments.append(new)
        self._base_offsets.append(new.base_offset)
        self._write_recovery_point(self.flushed_offset)
        if self.on_roll is not None:
            self.on_roll(new.base_offset)

    # -- read path ------------------------------------------------------------------------

    def _segment_index(self, offset: int) -> int:
        i = bisect_right(self._base_offsets, offset) - 1
        assert i >= 0, (offset, self.log_start_offset)
        return i

    def read(self, fetch_offset: int, max_bytes: int, upper_offset: int | None = None) -> bytes:
        """Stored batches from the one holding fetch_offset, whole, up to max_bytes but at
        least one, none starting at or above upper_offset; from one segment per call."""
        segment, limit = self._segment_for_read(fetch_offset, upper_offset)
        return b"" if segment is None else segment.read(fetch_offset, max_bytes, limit)

    def span(
        self, fetch_offset: int, max_bytes: int, upper_offset: int | None = None
    ) -> FileSpan | None:
        """Where the bytes `read` would return lie: for sending them with os.sendfile.

        The span holds its own duplicate of the segment's fd, so retention may delete
        the segment meanwhile; the caller closes it."""
        segment, limit = self._segment_for_read(fetch_offset, upper_offset)
        if segment is None:
            return None
        position, length, records, next_offset, magics = segment.span(
            fetch_offset, max_bytes, limit
        )
        if not length:
            return None
        return FileSpan(os.dup(segment.fd), position, length, records, next_offset, magics)

    def _segment_for_read(
        self, fetch_offset: int, upper_offset: int | None
    ) -> tuple[Segment | None, int]:
        if not self.log_start_offset <= fetch_offset <= self.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {fetch_offset} not in [{self.log_start_offset}, {self.log_end_offset}]"
            )
        limit = self.log_end_offset if upper_offset is None else upper_offset
        if fetch_offset == self.log_end_offset:
            return None, limit
        return self._segments[self._segment_index(fetch_offset)], limit

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp is >= timestamp_ms; None if there is none."""
        for segment in self._segments:
            if segment.index.max_timestamp >= timestamp_ms:
                offset = segment.offset_for_timestamp(timestamp_ms)
                if offset is not None:
                    return offset
        return None

    def batches_from(self, offset: int) -> Iterator[tuple[BatchHeader, bytes]]:
        """Every stored batch whose last offset is >= offset, in order."""
        offset = max(offset, self.log_start_offset)
        if offset >= self.log_end_offset:
            return
        i = self._segment_index(offset)
        first = self._segments[i]
        yield from first.batches(first.locate(offset)[0])
        for segment in self._segments[i + 1 :]:
            yield from segment.batches(0)

    # -- durability -----------------------------------------------------------------------

    def sync_targets(self) -> tuple[list[int], int]:
        """(fds of segments holding data not known flushed, log_end_offset now).

        fdatasync of those fds covers every offset below the returned one, whatever is
        appended meanwhile; segments with unflushed data are never deleted, so the fds stay
        valid."""
        fds = []
        for segment in reversed(self._segments):
            if segment.next_offset <= self.flushed_offset:
                break
            fds.append(segment.fd)
        return fds, self.log_end_offset

    def mark_flushed(self, offset: int) -> None:
        """Everything below `offset` is on disk. When that reaches a later segment than the
        recovery point does, the point moves there: recovery after a crash then starts at
        the active segment instead of the one before a roll (whose point was written
        before the flusher had synced it). A failed write leaves the older point, which
        costs only a longer recovery."""
        assert offset <= self.log_end_offset, (offset, self.log_end_offset)
        self.flushed_offset = max(self.flushed_offset, offset)
        bases = self._base_offsets
        if bisect_right(bases, self.flushed_offset) > bisect_right(bases, self.recovery_point):
            try:
                self._write_recovery_point(self.flushed_offset)
            except StorageError as exc:
                log.error(
                    "event=recovery_point_not_written directory=%s error=%r",
                    self.directory,
                    str(exc),
                )

    def flush(self) -> None:
        """fdatasync every segment holding unflushed data, now, on this thread."""
        fds, offset = self.sync_targets()
        try:
            for fd in fds:
                os.fdatasync(fd)
        except OSError as exc:
            raise StorageError(f"flush of {self.directory}: {exc}") from exc
        self.mark_flushed(offset)

    def _write_recovery_point(self, offset: int) -> None:
        try:
            write_atomic(self.directory / RECOVERY_POINT_FILE, encode_recovery_point(offset))
        except OSError as exc:
            raise StorageError(f"recovery point of {self.directory}: {exc}") from exc
        self.recovery_point = offset

    # -- retention ------------------------------------------------------------------------

    def apply_retention(self, now_ms: int) -> int:
        """Delete the oldest segments while the log is over retention_bytes or the segment's
        newest timestamp is older than retention_ms; never the active one, nor one holding
        unflushed data (the flusher may be syncing its fd). Returns how many went."""
        retention_bytes, retention_ms = self.config.retention_bytes, self.config.retention_ms
        deleted = 0
        while len(self._segments) > 1:
            oldest = self._segments[0]
            if oldest.next_offset > self.flushed_offset:
                break
            over_bytes = retention_bytes >= 0 and self.size_bytes > retention_bytes
            too_old = retention_ms >= 0 and now_ms - oldest.index.max_timestamp > retention_ms
            if not (over_bytes or too_old):
                break
            del self._segments[0], self._base_offsets[0]
            self.size_bytes -= oldest.size_bytes
            try:
                oldest.delete()
            except OSError as exc:
                raise StorageError(f"retention of {self.directory}: {exc}") from exc
            deleted += 1
        return deleted

    # -- producer-state snapshots ---------------------------------------------------------

    def write_snapshot(self, offset: int, data: bytes) -> None:
        """Store a snapshot taken at `offset` durably, keeping the newest SNAPSHOTS_KEPT."""
        try:
            write_atomic(self.directory / file_name(offset, SNAPSHOT_SUFFIX), data)
            for _, path in self.snapshots()[SNAPSHOTS_KEPT:]:
                path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"snapshot of {self.directory} at {offset}: {exc}") from exc

    def snapshots(self) -> list[tuple[int, Path]]:
        """(offset, path) of each snapshot file, newest first."""
        return _snapshots(self.directory)

    def read_snapshot(self, path: Path) -> bytes:
        return path.read_bytes()

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, write index files and the recovery point, close the files; the files
        are closed even when a write fails, so a full disk leaks no descriptor."""
        try:
            self.flush()
            try:
                for segment in self._segments:
                    if segment.index_dirty:
                        segment.write_indexes()
            except OSError as exc:
                raise StorageError(f"indexes of {self.directory}: {exc}") from exc
            self._write_recovery_point(self.log_end_offset)
        finally:
            for segment in self._segments:
                segment.close()

    def close_files(self) -> None:
        """Close the segment files and write nothing: the partition's directory is being
        deleted (DeleteTopics), so flushing it or its indexes would be wasted work."""
        for segment in self._segments:
            segment.close()


def _offsets_of(directory: Path, suffix: str) -> list[int]:
    """The offsets that name the files `<offset:020d><suffix>` in directory."""
    return [
        int(path.name[: -len(suffix)])
        for path in directory.glob("*" + suffix)
        if path.name[: -len(suffix)].isdigit()
    ]


def _snapshots(directory: Path) -> list[tuple[int, Path]]:
    offsets = sorted(_offsets_of(directory, SNAPSHOT_SUFFIX), reverse=True)
    return [(offset, directory / file_name(offset, SNAPSHOT_SUFFIX)) for offset in offsets]


def _read_recovery_point(directory: Path) -> int | None:
    try:
        return decode_recovery_point((directory / RECOVERY_POINT_FILE).read_bytes())
    except FileNotFoundError:
        return None


def _scan_from(base_offsets: list[int], recovery_point: int | None, clean_shutdown: bool) -> int:
    """Base offset of the first segment to validate batch by batch: the one holding the
    recovery point; every segment when it is unknown; none after a clean shutdown."""
    if clean_shutdown:
        return OFFSET_LIMIT
    if recovery_point is None or not base_offsets:
        return -1
    return base_offsets[max(bisect_right(base_offsets, recovery_point) - 1, 0)]
