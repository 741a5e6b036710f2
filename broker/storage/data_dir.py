"""The data directory's own bookkeeping: lock, format version, clean-shutdown marker.

A second broker on the same directory would interleave appends and corrupt
every log, so the directory is locked with flock for the process's lifetime.
The marker file tells the next start whether recovery must validate log tails;
a directory no broker has recovered yet has none, and nothing to validate.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import os
from pathlib import Path

from broker.storage.fileio import fsync_dir, write_atomic

FORMAT_VERSION = 1
LOCK_FILE = ".lock"
VERSION_FILE = "format_version"
CLEAN_SHUTDOWN_FILE = ".clean_shutdown"


class DataDirError(RuntimeError):
    """The data directory cannot be used; the message says why and what to do."""


class PreviousShutdown(enum.Enum):
    """How the broker that last used the data dir stopped, as the start logs it."""

    NONE = "none"  # a new data dir: no broker got as far as recovering it
    CLEAN = "clean"
    UNCLEAN = "unclean"  # killed or crashed: recovery validates the log tails


class DataDir:
    """An exclusively locked data directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None

    def acquire(self) -> PreviousShutdown:
        """Lock the directory and check its format; return how the last broker stopped."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataDirError(f"cannot create data dir {self.path}: {exc.strerror}") from exc
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise DataDirError(f"data dir {self.path} is not writable by this user")
        try:
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DataDirError(f"cannot open lock file in {self.path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                holder = self._read_holder()
                raise DataDirError(
                    f"data dir {self.path} is locked by another running broker{holder}; "
                    "stop it or choose another --data-dir"
                ) from exc
            raise DataDirError(f"cannot lock data dir {self.path}: {exc.strerror}") from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        self._check_version()
        # Nothing but the lock and the version: no broker got as far as recovery here
        # (a new data dir, or only starts refused before it, such as for a port in use).
        if all(p.name in (LOCK_FILE, VERSION_FILE) for p in self.path.iterdir()):
            return PreviousShutdown.NONE
        if (self.path / CLEAN_SHUTDOWN_FILE).exists():
            return PreviousShutdown.CLEAN
        return PreviousShutdown.UNCLEAN

    def _read_holder(self) -> str:
        try:
            pid = (self.path / LOCK_FILE).read_text().strip()
        except OSError:
            return ""
        return f" (pid {pid})" if pid else ""

    def _check_version(self) -> None:
        version_file = self.path / VERSION_FILE
        if not version_file.exists():
            if any(p.name not in (LOCK_FILE,) for p in self.path.iterdir()):
                raise DataDirError(
                    f"data dir {self.path} holds files but no {VERSION_FILE}: "
                    "not a minibroker data dir, refusing to touch it"
                )
            write_atomic(version_file, f"{FORMAT_VERSION}\n".encode())
            return
        try:
            text = version_file.read_bytes().decode("ascii").strip()
        except UnicodeDecodeError:
            text = "<damaged: not text>"
        if text != str(FORMAT_VERSION):
            raise DataDirError(
                f"{version_file} says format version {text!r}; this broker reads version "
                f"{FORMAT_VERSION}. Use a matching minibroker release or a new data dir."
            )

    def begin_run(self) -> None:
        """From here on a crash is unclean: remove the marker before accepting writes."""
        marker = self.path / CLEAN_SHUTDOWN_FILE
        if marker.exists():
            marker.unlink()
            # A lost unlink would make the next start after a crash trust torn tails.
            fsync_dir(self.path)

    def mark_clean_shutdown(self) -> None:
        write_atomic(self.path / CLEAN_SHUTDOWN_FILE, b"")

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
