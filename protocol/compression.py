"""Batch payload codecs, keyed by the compression bits of a batch's attributes.

gzip comes from the standard library; zstd and lz4 from the `zstandard` and
`lz4` packages, which are dependencies so every broker can read every batch.
"""

from __future__ import annotations

import zlib
from enum import IntEnum

import lz4.frame
import zstandard

from protocol.errors import ErrorCode, ProtocolError

GZIP_WBITS = 31  # zlib's way of asking for the gzip container
DECOMPRESSED_BYTES_MAX = 64 * 1024 * 1024


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    ZSTD = 2
    LZ4 = 3

    @classmethod
    def known(cls) -> frozenset[int]:
        return _KNOWN

    @classmethod
    def parse(cls, name: str | int | None) -> Compression:
        """Accept Kafka's `compression_type` spellings: none, gzip, zstd, lz4."""
        if name is None:
            return cls.NONE
        if isinstance(name, int):
            return cls(name)
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(
                f"compression_type {name!r} is not one of none, gzip, zstd, lz4"
            ) from None


_KNOWN = frozenset(int(c) for c in Compression)
_zstd_compressor = zstandard.ZstdCompressor(level=3)


def compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, GZIP_WBITS)
        return c.compress(data) + c.flush()
    if codec == Compression.ZSTD:
        return _zstd_compressor.compress(data)
    if codec == Compression.LZ4:
        compressed: bytes = lz4.frame.compress(data)
        return compressed
    raise ProtocolError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression code {codec}")


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    """Inflate a payload, refusing one that would grow past DECOMPRESSED_BYTES_MAX."""
    try:
        if codec == Compression.GZIP:
            d = zlib.decompressobj(GZIP_WBITS)
            out = d.decompress(data, DECOMPRESSED_BYTES_MAX)
            if d.unconsumed_tail:
                raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, "gzip payload too large")
            return out
        if codec == Compression.ZSTD:
            return zstandard.ZstdDecompressor().decompress(
                data, max_output_size=DECOMPRESSED_BYTES_MAX
            )
        if codec == Compression.LZ4:
            decompressed: bytes = lz4.frame.decompress(data)
            return decompressed
    except ProtocolError:
        raise
    except Exception as exc:  # each codec raises its own error types
        raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, f"cannot decompress: {exc}") from exc
    if codec == Compression.NONE:
        return bytes(data)
    raise ProtocolError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression code {codec}")
