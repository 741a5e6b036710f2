"""Stored batches as a Kafka consumer reads them: v2 batches as they lie, our own
magic-1 batches (written through the minibroker listener) converted to v2.

A partition log keeps each batch as it arrived, so a Fetch through the kafka listener
meets both formats only where both kinds of producer wrote to one partition. The log's
file spans say which magics they hold (found from the headers the span walks anyway),
so a span of v2 batches alone still goes out with sendfile; only a span holding
magic-1 batches is read and converted.
"""

from __future__ import annotations

import struct

from protocol.batch import LENGTH_PREFIX_BYTES, MAGIC_AT, MAGIC_V2
from protocol.batch_convert import to_v2

ONLY_V2 = 1 << MAGIC_V2
"""A span's `magics` when every batch in it is Kafka's v2."""
LEADER_EPOCH_AT = 12
LEADER_EPOCH = struct.pack(">i", 0)
"""What the log stamps into every v2 batch it appends (broker/storage/segment.py): a
single broker's first leader epoch. A converted batch carries the same."""
_LENGTH = struct.Struct(">i")


def as_v2(data: bytes) -> bytes:
    """`data` (whole batches, as a log read returns them) with every magic-1 batch in
    v2 form; `data` itself when it holds v2 batches alone."""
    batches = _batches(data)
    if all(data[start + MAGIC_AT] == MAGIC_V2 for start, _ in batches):
        return data
    out = []
    for start, end in batches:
        batch = memoryview(data)[start:end]
        if batch[MAGIC_AT] == MAGIC_V2:
            out.append(bytes(batch))
            continue
        converted = to_v2(batch)
        out.append(converted[:LEADER_EPOCH_AT] + LEADER_EPOCH + converted[LEADER_EPOCH_AT + 4 :])
    return b"".join(out)


def only_v2(data: bytes) -> bool:
    """Whether every whole batch in `data` is already Kafka's v2 (`as_v2` returns `data`
    itself): a walk of the length fields, no copy."""
    return all(data[start + MAGIC_AT] == MAGIC_V2 for start, _ in _batches(data))


def _batches(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each whole batch in `data`, from the length fields alone."""
    spans = []
    at = 0
    while at + MAGIC_AT < len(data):
        end = at + LENGTH_PREFIX_BYTES + _LENGTH.unpack_from(data, 8 + at)[0]
        if not at < end <= len(data):
            break
        spans.append((at, end))
        at = end
    return spans
