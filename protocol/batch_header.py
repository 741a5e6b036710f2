"""What both record batch formats share: the decoded header, the record, the error.

A partition log holds minibroker's batches (magic 1, protocol/batch.py) and Kafka's
v2 batches (magic 2, protocol/batch_v2.py) side by side, each as it arrived. The
framing the log depends on is the same in both (base_offset at 0, batch_length at 8,
magic at 16), and so are the attribute bits named here, so storage, recovery,
producer state and transactions read either through one `BatchHeader`.
"""

from __future__ import annotations

from typing import NamedTuple

from protocol.compression import KAFKA_CODECS, MAGIC1_CODECS, UNKNOWN_CODEC
from protocol.errors import ErrorCode, ProtocolError

MAGIC = 1
MAGIC_V2 = 2
MAGIC_AT = 16  # the byte that tells the formats apart
LENGTH_PREFIX_BYTES = 12  # base_offset + batch_length: the part not counted in batch_length

COMPRESSION_MASK = 0x07
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
SEQUENCE_MODULUS = 2**31

CONTROL_ABORT = 0
CONTROL_COMMIT = 1


class BatchHeader(NamedTuple):
    """The fixed header of a batch of either format, decoded.

    `crc` is the format's own checksum (zlib's CRC-32 for magic 1, CRC-32C for magic 2)
    and `attributes` its attributes field (uint8, int16); Kafka's partition leader
    epoch is not kept (the broker does not use it)."""

    base_offset: int
    batch_length: int
    crc: int
    magic: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_bytes(self) -> int:
        return LENGTH_PREFIX_BYTES + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        """The codec (a `Compression`), or UNKNOWN_CODEC for a code the format lacks."""
        codecs = MAGIC1_CODECS if self.magic == MAGIC else KAFKA_CODECS
        return codecs[self.attributes & COMPRESSION_MASK]

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def is_idempotent(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.record_count - 1) % SEQUENCE_MODULUS


class Record(NamedTuple):
    """One record as a consumer sees it. Header values are never None in magic 1 but
    may be in Kafka's batches; no headers at all is None in both."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None


class BatchError(ProtocolError):
    """A batch that fails validation; `code` is what the broker answers with."""


# The checks both formats' validate make, in the order docs/protocol.md section 2 lists
# them; each format's own checks (CRC, record count, the records) go in between.


def check_batch_length(header: BatchHeader, size: int) -> None:
    """BatchError(CORRUPT_MESSAGE) unless batch_length counts the `size` bytes held."""
    if header.batch_length + LENGTH_PREFIX_BYTES != size:
        raise BatchError(
            ErrorCode.CORRUPT_MESSAGE,
            f"batch_length {header.batch_length} inconsistent with {size} bytes",
        )


def check_codec(header: BatchHeader) -> None:
    """BatchError(UNSUPPORTED_COMPRESSION_TYPE) for a compression code with no codec."""
    if header.compression == UNKNOWN_CODEC:
        raise BatchError(
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
            f"compression code {header.attributes & COMPRESSION_MASK}",
        )


def check_producer_and_size(header: BatchHeader, size: int, max_bytes: int | None) -> None:
    """BatchError(INVALID_RECORD) for an idempotent data batch without an epoch and a
    base sequence, then BatchError(MESSAGE_TOO_LARGE) for `size` over `max_bytes`."""
    if (
        header.producer_id != NO_PRODUCER_ID
        and not header.is_control
        and (header.producer_epoch < 0 or header.base_sequence < 0)
    ):
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"idempotent batch with epoch {header.producer_epoch} "
            f"and base_sequence {header.base_sequence}",
        )
    if max_bytes is not None and size > max_bytes:
        raise BatchError(
            ErrorCode.MESSAGE_TOO_LARGE, f"batch of {size} bytes over message_max_bytes {max_bytes}"
        )
