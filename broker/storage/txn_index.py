"""The aborted-transaction index of one partition, pure logic over values and bytes.

A read_committed Fetch must tell the client which producers' batches in the
returned range belong to aborted transactions (docs/protocol.md section 5). The
index holds one entry per ABORT marker: (last_offset = the marker's offset,
producer_id, first_offset = the transaction's first batch on this partition),
sorted by last_offset because markers are appended in offset order.

On disk the entries live beside the segment holding their marker, as Kafka's
`.txnindex` files do, so retention deletes them with their segment:

| size | field                                                       |
|-----:|-------------------------------------------------------------|
|    n | msgpack array of [last_offset, producer_id, first_offset]   |
|    4 | crc32 (zlib) of the array bytes (broker/storage/fileio.py `seal`)   |

A segment's file is written whole when the segment is rolled and on clean
shutdown; what the active segment gained since its last write is rebuilt on
recovery by replaying the log from the producer-state snapshot.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import NamedTuple

import msgpack

from broker.storage.fileio import seal, unseal


class TxnIndexError(ValueError):
    """A `.txnindex` file that fails its CRC or does not hold well-formed entries."""


class AbortedTxn(NamedTuple):
    last_offset: int
    producer_id: int
    first_offset: int


class AbortedIndex:
    """Every aborted transaction of the partition whose marker is still in the log."""

    __slots__ = ("_entries", "_lasts")

    def __init__(self, entries: list[AbortedTxn] | None = None) -> None:
        self._entries: list[AbortedTxn] = sorted(entries or [])
        self._lasts = [e.last_offset for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, producer_id: int, first_offset: int, last_offset: int) -> None:
        assert first_offset < last_offset, (first_offset, last_offset)
        assert not self._lasts or self._lasts[-1] < last_offset, "markers come in offset order"
        self._entries.append(AbortedTxn(last_offset, producer_id, first_offset))
        self._lasts.append(last_offset)

    def overlapping(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of every aborted transaction with data in
        [start_offset, end_offset): its marker at or after start, its first batch before end."""
        i = bisect_left(self._lasts, start_offset)
        return [
            (e.producer_id, e.first_offset)
            for e in self._entries[i:]
            if e.first_offset < end_offset
        ]

    def between(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The entries whose marker lies in [start_offset, end_offset): one segment's."""
        return self._entries[
            bisect_left(self._lasts, start_offset) : bisect_left(self._lasts, end_offset)
        ]

    def drop_from(self, offset: int) -> None:
        """Forget entries whose marker is at or after `offset` (they are about to be replayed)."""
        i = bisect_left(self._lasts, offset)
        del self._entries[i:], self._lasts[i:]

    def drop_before(self, offset: int) -> None:
        """Forget entries whose marker is below `offset`: retention deleted their segment."""
        i = bisect_right(self._lasts, offset - 1)
        del self._entries[:i], self._lasts[:i]


def encode_entries(entries: list[AbortedTxn]) -> bytes:
    return seal(msgpack.packb([list(e) for e in entries]))


def decode_entries(data: bytes, base_offset: int, next_base: int | None) -> list[AbortedTxn]:
    """The entries of a `.txnindex` file for the segment [base_offset, next_base)."""
    body = unseal(data)
    if body is None:
        raise TxnIndexError("txnindex fails its CRC")
    try:
        items = msgpack.unpackb(body)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise TxnIndexError(f"txnindex is not msgpack: {exc}") from exc
    if not isinstance(items, list):
        raise TxnIndexError("txnindex is not an array")
    out: list[AbortedTxn] = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 3 and all(type(v) is int for v in item)):
            raise TxnIndexError(f"txnindex entry is not three integers: {item!r}")
        entry = AbortedTxn(*item)
        in_segment = base_offset <= entry.last_offset and (
            next_base is None or entry.last_offset < next_base
        )
        ordered = not out or out[-1].last_offset < entry.last_offset
        if not (in_segment and ordered and 0 <= entry.first_offset < entry.last_offset):
            raise TxnIndexError(f"txnindex entry {item!r} does not fit segment {base_offset}")
        out.append(entry)
    return out
