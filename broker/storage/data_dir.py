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


# What an OS error on the data dir's files means, and what to do about it. No quote
# marks: the refusal is logged as reason='...'.
_FIXES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: (
        "has no space left on its filesystem",
        "free space there, or move data_dir (--data-dir) to a larger filesystem",
    ),
    errno.EDQUOT: ("is over the disk quota of its user", "free space there, or raise the quota"),
    errno.EACCES: (
        "is not writable by this user",
        "give the directory to the user the broker runs as (chown -R), or choose another "
        "--data-dir",
    ),
    errno.EROFS: (
        "is on a read-only filesystem",
        "remount it read-write, or move data_dir (--data-dir)",
    ),
    errno.EFBIG: (
        "holds a file this process may not grow",
        "raise the file-size limit (ulimit -f, or LimitFSIZE= in the systemd unit)",
    ),
    errno.EMFILE: (
        "needs more open files than this process may have",
        "raise the open-file limit (ulimit -n, or LimitNOFILE= in the systemd unit)",
    ),
    errno.EIO: (
        "is on a disk that reports I/O errors",
        "check the disk (dmesg, SMART); restore the data dir from a backup if it fails",
    ),
}
_FIXES[errno.EPERM] = _FIXES[errno.EACCES]


def cannot_use(path: Path, exc: BaseException) -> DataDirError:
    """A failure of the data dir's files (an OSError, or an error caused by one) as the
    refusal to start: what is wrong with the directory and what to do about it."""
    cause: BaseException | None = exc
    while cause is not None and not (isinstance(cause, OSError) and cause.errno):
        cause = cause.__cause__
    return _refusal(path, cause.errno if isinstance(cause, OSError) else None, str(exc))


def _refusal(path: Path, code: int | None, detail: str) -> DataDirError:
    if code not in _FIXES:
        return DataDirError(f"cannot use data dir {path}: {detail}")
    problem, fix = _FIXES[code]
    return DataDirError(f"data dir {path} {problem}{f' ({detail})' if detail else ''}; {fix}")


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
            raise cannot_use(self.path, exc) from exc
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise _refusal(self.path, errno.EACCES, "")
        try:
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise cannot_use(self.path, exc) from exc
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
        self._lock_fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._check_version()
        except OSError as exc:
            self.release()
            raise cannot_use(self.path, exc) from exc
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
