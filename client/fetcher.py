"""The consumer's sans-IO core: turn one partition's fetched bytes into ConsumerRecords.

A Fetch answer holds whole stored batches starting with the one that contains
the fetch offset, so the records below that offset are skipped here. Control
batches are always dropped; under read_committed so are the batches of aborted
transactions, with Kafka's algorithm over the `aborted_transactions` list.

A batch of plain records (no headers: what producers write) is decoded in C,
`protocol.records.plain_rows`, straight into ConsumerRecords that the cyclic GC
does not track (they cannot form cycles). Any other batch, or every batch where
the extension is not built, is decoded columnar: one msgpack call per batch,
then the ConsumerRecord tuples are built by C-level iterators (zip/map) with no
Python frame per record, and with the cyclic GC paused while they are made
(letting the GC rescan them mid-poll costs a fifth of the consumer's time).

A partition may also hold Kafka's v2 batches (magic 2, written through the
kafka listener), served as they lie: byte 16 of each batch says its format, and
a v2 batch's records are parsed by protocol/batch_v2.py into the same
ConsumerRecords (a header value may then be None, as Kafka allows).
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from itertools import repeat
from operator import add
from typing import Any

import msgpack

from client.errors import CorruptRecordError, MinibrokerError
from client.types import ConsumerRecord
from protocol.batch import (
    CONTROL_ABORT,
    CRC_START,
    HEADER_BYTES,
    LENGTH_PREFIX_BYTES,
    MAGIC,
    MAGIC_AT,
    MAGIC_V2,
    BatchHeader,
    control_type,
    crc32,
    read_header,
)
from protocol.batch_v2 import (
    HEADER_V2_BYTES,
    LOG_APPEND_TIME_FLAG,
    crc_v2,
    decode_records_v2,
)
from protocol.compression import Compression, decompress
from protocol.errors import ProtocolError
from protocol.messages import AbortedTransaction
from protocol.records import plain_rows

_new_record = partial(tuple.__new__, ConsumerRecord)
_NO_HEADERS: tuple[tuple[str, bytes], ...] = ()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while many acyclic tuples are made (nests; restores the caller's
    setting). Without it the collector rescans fresh records mid-poll, about 20% of a poll."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def decode_batch(
    topic: str, partition: int, buf: memoryview, pos: int, header: BatchHeader, first: int
) -> list[ConsumerRecord]:
    """The records of the batch at `pos` whose offset is >= `first`."""
    with gc_paused():
        return _decode(topic, partition, buf, pos, header, first)


def _decode(
    topic: str, partition: int, buf: memoryview, pos: int, header: BatchHeader, first: int
) -> list[ConsumerRecord]:
    if header.magic == MAGIC_V2:
        return _decode_v2(topic, partition, buf, pos, header, first)
    payload: Any = buf[pos + HEADER_BYTES : pos + header.size_bytes]
    base_offset = header.base_offset
    try:
        if header.compression != Compression.NONE:
            payload = decompress(header.compression, payload)
        decoded = plain_rows(
            payload,
            header.record_count,
            first - base_offset,
            ConsumerRecord,
            topic,
            partition,
            base_offset,
            header.base_timestamp,
            _NO_HEADERS,
        )
        if decoded is not None:
            return decoded
        rows = msgpack.unpackb(payload, use_list=False, raw=False)
    except (ValueError, ProtocolError, msgpack.UnpackException) as exc:
        raise CorruptRecordError(topic, partition, base_offset, f"undecodable: {exc}") from exc
    n = header.record_count
    if not isinstance(rows, tuple) or len(rows) != n:
        raise CorruptRecordError(
            topic, partition, base_offset, f"header says {n} records, payload differs"
        )
    skip = first - base_offset
    if skip > 0:
        rows = rows[skip:]
        base_offset = first
        n = len(rows)
        if not n:
            return []
    try:
        deltas, keys, values, headers = zip(*rows, strict=True)
    except (TypeError, ValueError) as exc:
        raise CorruptRecordError(topic, partition, base_offset, "malformed record") from exc
    base_ts = header.base_timestamp
    timestamps: Any = (
        repeat(base_ts, n) if deltas.count(0) == n else map(add, repeat(base_ts), deltas)
    )
    header_column: Any = (
        repeat(_NO_HEADERS, n) if headers.count(None) == n else (h or _NO_HEADERS for h in headers)
    )
    return list(
        map(
            _new_record,
            zip(
                repeat(topic, n),
                repeat(partition, n),
                range(base_offset, base_offset + n),
                timestamps,
                keys,
                values,
                header_column,
                strict=True,
            ),
        )
    )


def _decode_v2(
    topic: str, partition: int, buf: memoryview, pos: int, header: BatchHeader, first: int
) -> list[ConsumerRecord]:
    """A Kafka v2 batch's records from `first` on. Under log-append time (attributes bit
    3) every record's timestamp is the batch's max_timestamp, as Kafka's clients read it."""
    try:
        rows = decode_records_v2(buf, pos, header)
    except ProtocolError as exc:
        raise CorruptRecordError(topic, partition, header.base_offset, exc.message) from exc
    base_offset = header.base_offset
    log_append = header.attributes & LOG_APPEND_TIME_FLAG
    base_ts = header.base_timestamp
    skip = max(first - base_offset, 0)
    return [
        _new_record(
            (
                topic,
                partition,
                base_offset + i,
                header.max_timestamp if log_append else base_ts + delta,
                key,
                value,
                tuple(headers) if headers else _NO_HEADERS,
            )
        )
        for i, (delta, key, value, headers) in enumerate(rows[skip:], skip)
    ]


class FetchedRecords:
    """One partition's fetched byte run, handed out record by record in offset order.

    `next_fetch_offset` is where the following Fetch should start (after the
    last whole batch here), known as soon as this is built, so the consumer can
    prefetch while the caller is still working through these records."""

    __slots__ = (
        "_aborted",
        "_aborted_pids",
        "_batches",
        "_buf",
        "_failure",
        "_index",
        "_pending",
        "_pending_index",
        "_read_committed",
        "next_fetch_offset",
        "partition",
        "position",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        data: bytes,
        fetch_offset: int,
        *,
        aborted_transactions: Sequence[AbortedTransaction] | None = None,
        read_committed: bool = False,
        check_crcs: bool = True,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.position = fetch_offset  # the offset of the next record to hand out
        self._buf = memoryview(data)
        self._batches: list[tuple[int, BatchHeader]] = []
        self._failure: MinibrokerError | None = None
        self._scan(check_crcs)
        self.next_fetch_offset = (
            max(fetch_offset, self._batches[-1][1].next_offset) if self._batches else fetch_offset
        )
        self._index = 0
        self._pending: list[ConsumerRecord] = []
        self._pending_index = 0
        self._read_committed = read_committed
        self._aborted = [(a.first_offset, a.producer_id) for a in aborted_transactions or ()]
        heapq.heapify(self._aborted)
        self._aborted_pids: set[int] = set()

    def _scan(self, check_crcs: bool) -> None:
        """Index whole batches; a whole batch that fails its checks is corruption, a
        trailing partial batch is just where the broker's byte budget ended."""
        buf = self._buf
        end = len(buf)
        pos = 0
        while pos + HEADER_BYTES <= end:
            v2 = buf[pos + MAGIC_AT] == MAGIC_V2
            header_bytes = HEADER_V2_BYTES if v2 else HEADER_BYTES
            if pos + header_bytes > end:
                break
            header = read_header(buf, pos)
            size = header.batch_length + LENGTH_PREFIX_BYTES
            reason = None
            if header.batch_length < header_bytes - LENGTH_PREFIX_BYTES:
                reason = f"batch_length {header.batch_length}"
            elif pos + size > end:
                break
            elif header.magic not in (MAGIC, MAGIC_V2) or header.record_count < 1:
                reason = f"magic {header.magic}, record_count {header.record_count}"
            elif check_crcs and header.crc != (
                crc_v2(buf, pos, header) if v2 else crc32(buf[pos + CRC_START : pos + size])
            ):
                reason = "CRC mismatch"
            if reason is not None:
                self._failure = CorruptRecordError(
                    self.topic, self.partition, header.base_offset, reason
                )
                return
            self._batches.append((pos, header))
            pos += size
        if not self._batches and end:
            self._failure = MinibrokerError(
                f"{self.topic}-{self.partition} at offset {self.position}: no whole batch in "
                f"{end} fetched bytes; raise max_partition_fetch_bytes"
            )

    @property
    def failed(self) -> bool:
        """Whether a corrupt or unreadable batch ends this run (fetching past it is pointless)."""
        return self._failure is not None

    @property
    def exhausted(self) -> bool:
        return (
            self._pending_index >= len(self._pending)
            and self._index >= len(self._batches)
            and self._failure is None
        )

    def take(self, max_records: int) -> list[ConsumerRecord]:
        """Up to `max_records` next records; raises CorruptRecordError on reaching corruption
        (again on every call, until the consumer seeks elsewhere)."""
        out: list[ConsumerRecord] = []
        while len(out) < max_records:
            pending = self._pending
            start = self._pending_index
            if start < len(pending):
                stop = min(len(pending), start + max_records - len(out))
                out += pending[start:stop]
                self._pending_index = stop
                self.position = pending[stop - 1].offset + 1
                continue
            if self._index >= len(self._batches):
                if self._failure is not None and not out:
                    raise self._failure
                break
            pos, header = self._batches[self._index]
            self._index += 1
            if header.next_offset <= self.position or self._skip(pos, header):
                self.position = max(self.position, header.next_offset)
                continue
            self._pending = decode_batch(
                self.topic, self.partition, self._buf, pos, header, self.position
            )
            self._pending_index = 0
        return out

    def _skip(self, pos: int, header: BatchHeader) -> bool:
        """Control batches always; aborted transactional batches under read_committed."""
        if self._read_committed and header.is_idempotent:
            aborted = self._aborted
            while aborted and aborted[0][0] <= header.last_offset:
                self._aborted_pids.add(heapq.heappop(aborted)[1])
            if header.is_control:
                try:
                    kind = control_type(self._buf, pos, header)
                except (ValueError, ProtocolError, msgpack.UnpackException, IndexError) as exc:
                    raise CorruptRecordError(
                        self.topic, self.partition, header.base_offset, "bad control record"
                    ) from exc
                if kind == CONTROL_ABORT:
                    self._aborted_pids.discard(header.producer_id)
                return True
            if header.is_transactional and header.producer_id in self._aborted_pids:
                return True
        return header.is_control
