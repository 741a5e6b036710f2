"""The transaction coordinator's durable log: append, group fsync, compaction, recovery.

Every change of a transactional id's state (and every recorded app version) is
one record, appended and fdatasynced before the change is answered; records
hold whole entries, so replaying the file in order and keeping the last record
per id rebuilds the state. Layout of `<data_dir>/transactions/txn.wal`:

| size | field                                                          |
|-----:|----------------------------------------------------------------|
|    4 | body_length, uint32 big-endian                                 |
|    4 | crc32 (zlib) of the body                                       |
|    n | msgpack body: [entries, apps, removed] (broker/txn_state.py    |
|      |   encodes entries and apps; removed lists expired ids)         |

Recovery reads records until the end; a torn or corrupt last record is cut (it
was never answered), while a bad record followed by good ones means damage at
rest and stops the broker: guessing could hand out a fenced epoch again.
Compaction rewrites the file as one record of the whole state (write_atomic),
once it has grown past `transaction_log_max_bytes` and twice its last compacted
size.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import anyio
import msgpack

from broker.data_dir import DataDirError
from broker.fileio import fsync_dir, write_atomic

log = logging.getLogger(f"minibroker.{__name__}")

DIRECTORY = "transactions"
FILE = "txn.wal"
_HEAD = struct.Struct(">II")
RECORD_BYTES_MAX = 256 * 1024 * 1024  # a record larger than this is damage, not data


class TxnLogError(DataDirError):
    """The transaction log is damaged before its end; the broker will not start on it."""


def encode_record(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return _HEAD.pack(len(data), zlib.crc32(data)) + data


def decode_records(data: bytes, path: Path) -> tuple[list[Any], int]:
    """(bodies, length of the intact prefix) of a log file's bytes; TxnLogError when a
    bad record is followed by bytes that hold a good one."""
    bodies: list[Any] = []
    position = 0
    while position < len(data):
        parsed = _parse_at(data, position)
        if parsed is None:
            if any(_parse_at(data, later) for later in range(position + 1, len(data))):
                raise TxnLogError(
                    f"{path}: record at byte {position} is corrupt but a later record is "
                    "intact; restore the file from a backup"
                )
            break
        body, position = parsed
        bodies.append(body)
    return bodies, position


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


class TxnLog:
    """The open log file; appends are written at once and made durable in shared rounds."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory / DIRECTORY
        self.path = self.directory / FILE
        self.max_bytes = max_bytes
        self._fd = -1
        self._written = 0
        self._flushed = 0
        self._compacted_bytes = 0
        self._round: anyio.Event | None = None
        self._round_error: OSError | None = None

    def open(self) -> list[Any]:
        """Open (or create) the file, cut a torn tail, and return every record's body."""
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        bodies, intact = decode_records(data, self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if intact < len(data):
            log.warning("event=txn_log_tail_cut path=%s bytes=%d", self.path, len(data) - intact)
            os.ftruncate(self._fd, intact)
            os.fsync(self._fd)
        fsync_dir(self.directory)
        self._written = self._flushed = self._compacted_bytes = intact
        return bodies

    @property
    def size_bytes(self) -> int:
        return self._written

    def write(self, body: Any) -> int:
        """Write one record now (not yet durable); return the size the file must reach
        on disk for it to be. A failed write leaves the file as before and raises."""
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

    async def durable(self, end: int) -> None:
        """Return once the file is fdatasynced up to `end`; one sync serves every record
        written before it starts. Raises OSError when the sync fails."""
        while self._flushed < end:
            current = self._round
            if current is not None:
                await current.wait()
                if self._round_error is not None and self._flushed < end:
                    raise self._round_error
                continue
            self._round = done = anyio.Event()
            target = self._written
            self._round_error = None
            try:
                await anyio.to_thread.run_sync(os.fdatasync, self._fd)
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

    def compact(self, state: Any) -> None:
        """Replace the file with one record holding `state`, the whole current state.

        Only between rounds: every record written so far is durable and `state`
        includes them, so the old file may go."""
        assert self._round is None and self._written == self._flushed
        data = encode_record(state)
        write_atomic(self.path, data)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        self._written = self._flushed = self._compacted_bytes = len(data)
        log.info("event=txn_log_compacted path=%s bytes=%d", self.path, len(data))

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
