"""Small durable-file primitives shared by every module that persists state."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

_CRC = struct.Struct(">I")
TMP_SUFFIX = ".tmp"  # recovery deletes leftovers of a write that crashed


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def seal(body: bytes) -> bytes:
    """`body` followed by its CRC32, so a reader can tell a torn or rotten file."""
    return body + _CRC.pack(zlib.crc32(body))


def unseal(data: bytes) -> bytes | None:
    """The body of a sealed file, or None when its CRC does not match."""
    if len(data) < _CRC.size:
        return None
    body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
    return body if zlib.crc32(body) == crc else None
