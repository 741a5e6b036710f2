"""Batch payload codecs, and the compression code each record batch format gives them.

`Compression` names a codec once for both formats: minibroker's batch (magic 1)
and Kafka's v2 batch (magic 2) number the same codecs differently in bits 0-2 of
their attributes, and `CODECS_BY_MAGIC` maps each format's code to a codec.
gzip comes from the standard library; zstd, lz4 and snappy from the `zstandard`,
`lz4` and `cramjam` packages, which are dependencies so every broker can read
every batch. Snappy reaches us only in Kafka's batches (magic 1 has no code for it).
"""

from __future__ import annotations

import struct
import threading
import zlib
from enum import IntEnum

import cramjam
import lz4.frame
import zstandard

from protocol.errors import ErrorCode, ProtocolError

GZIP_WBITS = 31  # zlib's way of asking for the gzip container
DECOMPRESSED_BYTES_MAX = 64 * 1024 * 1024


class Compression(IntEnum):
    """A codec. Values 0-3 are also magic 1's codes (stored on disk, so fixed)."""

    NONE = 0
    GZIP = 1
    ZSTD = 2
    LZ4 = 3
    SNAPPY = 4

    @classmethod
    def parse(cls, name: str | int | None) -> Compression:
        """Accept Kafka's `compression_type` spellings the SDK can write: none, gzip,
        zstd, lz4 (the SDK writes magic 1, which has no code for snappy)."""
        if name is None:
            return cls.NONE
        if isinstance(name, int):
            if name not in MAGIC1_CODECS:
                raise ValueError(f"compression code {name} is not one of 0-3")
            return cls(name)
        codec = cls.__members__.get(name.strip().upper())
        if codec is None or codec not in MAGIC1_CODECS:
            raise ValueError(f"compression_type {name!r} is not one of none, gzip, zstd, lz4")
        return codec


UNKNOWN_CODEC = -1
"""What a header's `compression` says for a code its format does not define."""

# Bits 0-2 of the attributes, index = code. Magic 1: 0 none, 1 gzip, 2 zstd, 3 lz4.
MAGIC1_CODECS: tuple[int, ...] = (
    Compression.NONE,
    Compression.GZIP,
    Compression.ZSTD,
    Compression.LZ4,
    *(UNKNOWN_CODEC,) * 4,
)
# Kafka's v2 batch: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
KAFKA_CODECS: tuple[int, ...] = (
    Compression.NONE,
    Compression.GZIP,
    Compression.SNAPPY,
    Compression.LZ4,
    Compression.ZSTD,
    *(UNKNOWN_CODEC,) * 3,
)
KAFKA_CODES: dict[int, int] = {codec: code for code, codec in enumerate(KAFKA_CODECS) if codec >= 0}
"""Kafka's v2 code of each codec: the inverse of KAFKA_CODECS."""

# Snappy as Java's Kafka client writes it: xerial's stream of length-prefixed raw blocks.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
XERIAL_VERSION = 1
XERIAL_BLOCK = struct.Struct(">i")
XERIAL_BLOCK_BYTES = 32 * 1024  # xerial's default block size


class _ZstdContexts(threading.local):
    """zstd contexts per thread: they may not be shared between threads, and making one
    costs more than decompressing a 16 KiB batch (about 8 µs against 2)."""

    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(level=3)
        self.decompressor = zstandard.ZstdDecompressor()


_zstd = _ZstdContexts()


def compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, GZIP_WBITS)
        return c.compress(data) + c.flush()
    if codec == Compression.ZSTD:
        return _zstd.compressor.compress(data)
    if codec == Compression.LZ4:
        compressed: bytes = lz4.frame.compress(data)
        return compressed
    if codec == Compression.SNAPPY:
        return _snappy_xerial(data)
    raise ProtocolError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression code {codec}")


def decompress(
    codec: int, data: bytes | memoryview, max_bytes: int = DECOMPRESSED_BYTES_MAX
) -> bytes:
    """Inflate a payload, refusing one that is cut short or would grow past `max_bytes`.

    The bound holds whatever the payload claims: a zstd frame that declares its
    size is checked before anything is allocated, and gzip and lz4 stop at it."""
    try:
        if codec == Compression.GZIP:
            gz = zlib.decompressobj(GZIP_WBITS)
            out = gz.decompress(data, max_bytes)
            if not gz.eof:
                raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, _cut_or_over(max_bytes))
            return out
        if codec == Compression.ZSTD:
            declared = zstandard.frame_content_size(data)
            if declared > max_bytes:
                raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, _cut_or_over(max_bytes))
            return _zstd.decompressor.decompress(data, max_output_size=max_bytes)
        if codec == Compression.LZ4:
            lz = lz4.frame.LZ4FrameDecompressor()
            inflated: bytes = lz.decompress(data, max_length=max_bytes)
            if not lz.eof:
                raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, _cut_or_over(max_bytes))
            return inflated
        if codec == Compression.SNAPPY:
            return _snappy_decompress(memoryview(data), max_bytes)
    except ProtocolError:
        raise
    except Exception as exc:  # each codec raises its own error types
        raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, f"cannot decompress: {exc}") from exc
    if codec == Compression.NONE:
        return bytes(data)
    raise ProtocolError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression code {codec}")


def _cut_or_over(max_bytes: int) -> str:
    return f"payload truncated or larger than {max_bytes} bytes decompressed"


def _snappy_xerial(data: bytes) -> bytes:
    """`data` in xerial's framing, as Kafka's Java client writes snappy."""
    view = memoryview(data)
    out = [XERIAL_HEADER.pack(XERIAL_MAGIC, XERIAL_VERSION, XERIAL_VERSION)]
    for start in range(0, len(data), XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_BYTES]))
        out += (XERIAL_BLOCK.pack(len(block)), block)
    return b"".join(out)


def _snappy_decompress(data: memoryview, max_bytes: int) -> bytes:
    """Snappy in xerial's framing or as one raw block: Kafka's broker reads both (xerial's
    SnappyInputStream falls back to a raw block), and librdkafka writes raw blocks.

    Each raw block declares its inflated length up front; that is checked against what
    is left of `max_bytes` before the block is inflated."""
    if bytes(data[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        return _snappy_block(data, max_bytes)
    if len(data) < XERIAL_HEADER.size:
        raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, "snappy stream header truncated")
    out: list[bytes] = []
    pos = XERIAL_HEADER.size
    left = max_bytes
    while pos < len(data):
        if pos + XERIAL_BLOCK.size > len(data):
            raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, "snappy block length truncated")
        (length,) = XERIAL_BLOCK.unpack_from(data, pos)
        pos += XERIAL_BLOCK.size
        if length < 0 or pos + length > len(data):
            raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, f"snappy block of {length} bytes cut")
        block = _snappy_block(data[pos : pos + length], left)
        left -= len(block)
        out.append(block)
        pos += length
    return b"".join(out)


def _snappy_block(block: memoryview, max_bytes: int) -> bytes:
    declared = _uvarint32(block)
    if declared > max_bytes:
        raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, _cut_or_over(max_bytes))
    return bytes(cramjam.snappy.decompress_raw(block))


def _uvarint32(block: memoryview) -> int:
    """The inflated length a raw snappy block starts with (an unsigned varint, <= 5 bytes)."""
    value = 0
    for i in range(min(5, len(block))):
        byte = block[i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value
    raise ProtocolError(ErrorCode.CORRUPT_MESSAGE, "snappy block length undecodable")
