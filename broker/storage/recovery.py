"""Crash recovery of a segment, as pure functions over its bytes.

`scan_segment` finds the longest prefix of whole, CRC-valid batches whose offsets follow on
from the segment's base offset, and rebuilds the segment's indexes from it. Everything after
that prefix is a torn write or corruption and gets truncated by the caller. The offset
continuity check matters: the CRC does not cover base_offset (bytes [0, 8)).

Also the `recovery-point` file's encoding: offset + CRC, so a torn or garbled file is
detected and answered with a full scan instead of trusted.
"""

from __future__ import annotations

import struct
from contextlib import closing
from dataclasses import dataclass

from broker.storage.fileio import seal, unseal
from broker.storage.offset_index import UINT32_MAX, SegmentIndex
from protocol.batch import scan_batches

_OFFSET = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """What survives of one segment: the first `valid_bytes`, holding `batch_count` batches
    of offsets [base_offset, next_offset), with their rebuilt indexes."""

    valid_bytes: int
    batch_count: int
    next_offset: int
    index: SegmentIndex


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening a partition log did; zeros after a clean shutdown with sound indexes."""

    truncated_bytes: int
    segments_scanned: int
    batches_scanned: int
    segments_deleted: int
    duration_ms: float


def scan_segment(data: bytes | memoryview, index: SegmentIndex) -> SegmentScan:
    """Validate the batches of one segment's bytes in order, filling the empty `index`.

    Stops at the first batch that is truncated, fails its CRC or header checks, does not
    start at the expected offset, or would overflow the index's 32-bit relative offsets."""
    assert len(index.offsets) == 0 and len(index.times) == 0
    base_offset = index.offsets.base_offset
    next_offset = base_offset
    valid_bytes = 0
    batch_count = 0
    with closing(scan_batches(data)) as batches:
        for position, header in batches:
            if (
                header.base_offset != next_offset
                or header.last_offset_delta != header.record_count - 1
                or header.last_offset - base_offset > UINT32_MAX
                or position > UINT32_MAX
            ):
                break
            index.add(position, header.base_offset, header.max_timestamp)
            next_offset = header.next_offset
            valid_bytes = position + header.size_bytes
            batch_count += 1
    assert valid_bytes <= len(data)
    return SegmentScan(valid_bytes, batch_count, next_offset, index)


def encode_recovery_point(offset: int) -> bytes:
    assert offset >= 0, offset
    return seal(_OFFSET.pack(offset))


def decode_recovery_point(data: bytes) -> int | None:
    """The offset stored in a `recovery-point` file; None when it is torn or corrupt."""
    body = unseal(data)
    if body is None or len(body) != _OFFSET.size:
        return None
    (offset,) = _OFFSET.unpack(body)
    return offset if offset >= 0 else None
