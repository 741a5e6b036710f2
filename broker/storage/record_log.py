"""A durable record log: CRC-framed records, group fdatasync, torn-tail recovery, compaction.

The transaction coordinator's `transactions/txn.wal` and the committed offsets'
`groups/offsets.wal` are both this file format; what a record's body means is
the business of the module that owns the file (broker/transactions/log.py,
broker/groups/offset_state.py). Layout of every record:

| size | field                                 |
|-----:|---------------------------------------|
|    4 | body_length, uint32 big-endian        |
|    4 | crc32 (zlib) of the body              |
|    n | msgpack body                          |

Records are written with pwrite at once and made durable by `durable`, where one
fdatasync serves every record written before it starts (group commit). Recovery
reads records until the end; a torn or corrupt last record is cut (it was never
answered), while a bad record followed by good ones means damage at rest and
stops the broker: guessing could undo an answered change. Compaction replaces the
file, atomically (write_atomic), with records of the whole state, once it has
grown past `max_bytes` and twice its last compacted size.

A store that must stop at the first doubt syncs and compacts with
`durable_or_refuse` and `compact_or_refuse`: once either failed (the file's state
on disk, or which file the handle is, is then unknown) its log refuses every
write until a restart reads the file again.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgpack

from broker.storage import sync_threads
from broker.storage.data_dir import DataDirError
from broker.storage.fileio import fsync_dir, write_atomic

log = logging.getLogger(f"minibroker.{__name__}")

_HEAD = struct.Struct(">II")
RECORD_BYTES_MAX = 256 * 1024 * 1024  # a record larger than this is damage, not data


class RecordLogError(DataDirError):
    """A record log is damaged before its end; the broker will not start on it."""


def encode_record(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return _HEAD.pack(len(data), zlib.crc32(data)) + data


def scan_records(
    data: bytes, path: Path, error: type[RecordLogError] = RecordLogError
) -> Iterator[tuple[Any, int]]:
    """(body, end) of each intact record of a log file's bytes, in order, up to the
    first bad one; `error` when a bad record is followed by bytes that hold a good one."""
    position = 0
    while position < len(data):
        parsed = _parse_at(data, position)
        if parsed is None:
            if any(_parse_at(data, later) for later in range(position + 1, len(data))):
                raise error(
                    f"{path}: record at byte {position} is corrupt but a later record is "
                    "intact; restore the file from a backup"
                )
            return
        yield parsed
        position = parsed[1]


def _parse_at(data: bytes, position: int) -> tuple[Any, int] | None:
    """(body, end) of a good record at `position`, or None."""
    if position + _HEAD.size > len(data):
        return None
    length, crc = _HEAD.unpack_from(data, position)
    end = position + _HEAD.size + length
    if length > RECORD_BYTES_MAX or end > len(data):
        return None
    raw = data[position + _HEAD.size : end]
    if zlib.crc32(raw) != crc:
        return None
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False), end
    except Exception:  # msgpack raises several unrelated types for bad input
        return None


class RecordLog:
    """One open log file; appends are written at once and made durable in shared rounds.

    `error` is the exception raised on damage, so the broker's refusal names the log."""

    error: type[RecordLogError] = RecordLogError
    failure_event: str | None = None
    """What a log that refuses writes (`durable_or_refuse`, `compact_or_refuse`) logs
    its failures as: event=<failure_event>_sync_failed or _compaction_failed."""

    def __init__(self, directory: Path, file_name: str, max_bytes: int) -> None:
        self.directory = directory
        self.path = directory / file_name
        self.max_bytes = max_bytes
        self._fd = -1
        self._written = 0
        self._flushed = 0
        self._compacted_bytes = 0
        self._round: anyio.Event | None = None
        self._round_error: OSError | None = None
        self.failed: OSError | None = None  # the failure that made it refuse writes

    def open(self, replay: Callable[[Any], None]) -> int:
        """Open (or create) the file, give every record's body to `replay` in order, cut
        a torn tail, and return how many records there were. One body at a time: the
        decoded file is never in memory whole."""
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        intact = count = 0
        for body, end in scan_records(data, self.path, self.error):
            replay(body)
            intact = end
            count += 1
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if intact < len(data):
            log.warning("event=record_log_tail_cut path=%s bytes=%d", self.path, len(data) - intact)
            os.ftruncate(self._fd, intact)
            os.fsync(self._fd)
        fsync_dir(self.directory)
        self._written = self._flushed = self._compacted_bytes = intact
        return count

    @property
    def size_bytes(self) -> int:
        return self._written

    def write(self, body: Any) -> int:
        """Write one record now (not yet durable); return the size the file must reach
        on disk for it to be. A failed write leaves the file as before and raises, and
        so does a write after the log refused writes (`failed`)."""
        if self.failed is not None:
            raise OSError(
                f"{self.path} failed earlier ({self.failed}): after an earlier write failed, "
                "none is taken until the broker restarts"
            )
        data = encode_record(body)
        position = self._written
        try:
            view = memoryview(data)
            while view:
                view = view[os.pwrite(self._fd, view, position + len(data) - len(view)) :]
        except OSError:
            os.ftruncate(self._fd, position)
            raise
        self._written = position + len(data)
        return self._written

    def is_durable(self, end: int) -> bool:
        """True once the file is fdatasynced up to `end`. An `end` past what was written
        dates from before a compaction, which starts only once everything is synced."""
        return self._flushed >= min(end, self._written)

    async def durable(self, end: int) -> None:
        """Return once the file is fdatasynced up to `end` (see `is_durable`); one sync
        serves every record written before it starts. Raises OSError when the sync
        fails."""
        while not self.is_durable(end):
            current = self._round
            if current is not None:
                await current.wait()
                if self._round_error is not None and not self.is_durable(end):
                    raise self._round_error
                continue
            self._round = done = anyio.Event()
            target = self._written
            self._round_error = None
            try:
                (error,) = await sync_threads.fdatasync_each([self._fd])
                if error:
                    raise OSError(error, f"fdatasync of {self.path}: {os.strerror(error)}")
                self._flushed = max(self._flushed, target)
            except OSError as exc:
                self._round_error = exc
                raise
            finally:
                self._round = None
                done.set()

    async def append(self, body: Any) -> None:
        """Write one record and wait until it is durable."""
        await self.durable(self.write(body))

    def append_now(self, body: Any) -> None:
        """Write one record and fdatasync it on this thread: for recovery, before serving."""
        end = self.write(body)
        os.fdatasync(self._fd)
        self._flushed = max(self._flushed, end)

    def wants_compaction(self) -> bool:
        return (
            self._round is None
            and self._written == self._flushed
            and self._written > max(self.max_bytes, 2 * self._compacted_bytes)
        )

    def compact(self, bodies: Iterable[Any]) -> None:
        """Replace the file with `bodies`, records of the whole current state.

        Only between rounds, and only when every record written so far is applied to
        the state `bodies` come from: the old file may then go."""
        assert self._round is None and self._written == self._flushed
        data = b"".join(encode_record(body) for body in bodies)
        write_atomic(self.path, data)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        self._written = self._flushed = self._compacted_bytes = len(data)
        log.info("event=record_log_compacted path=%s bytes=%d", self.path, len(data))

    async def durable_or_refuse(self, end: int) -> None:
        """`durable`; should the sync fail, the log refuses writes from then on, as the
        file's state on disk is unknown, and raises. Once it refused, a record not known
        durable then never is: a later fdatasync that succeeds does not say the pages
        the failed one dropped reached the disk."""
        if self.failed is not None and not self.is_durable(end):
            raise OSError(f"{self.path} failed earlier ({self.failed}): not known durable")
        try:
            await self.durable(end)
        except OSError as exc:
            self._refuse_writes(exc, "sync")
            raise

    def compact_or_refuse(self, bodies: Iterable[Any]) -> None:
        """`compact`; should it fail, the log refuses writes rather than raising: every
        record is durable either way, but the handle may no longer be the file's."""
        try:
            self.compact(bodies)
        except OSError as exc:
            self._refuse_writes(exc, "compaction")

    def _refuse_writes(self, exc: OSError, step: str) -> None:
        assert self.failure_event is not None, "only a log that names its failures refuses"
        self.failed = exc
        log.error(
            "event=%s_%s_failed path=%s error=%r", self.failure_event, step, self.path, str(exc)
        )

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
