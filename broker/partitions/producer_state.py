"""Per-partition idempotent-producer state (docs/protocol.md section 3), pure logic.

For every producer id that wrote to the partition we keep its epoch, the time it
was last seen and the metadata of its last `CACHED_BATCHES` batches. `check`
judges a produced batch against that state without changing it; `apply` records
a batch once the log holds it, and is also how recovery replays the log after
the newest snapshot. `apply_in_order` takes a run's leading next-in-sequence
batches in one step, as `check` and `apply` one by one would. No IO and no
clock: time comes in as `now_ms`.

Decisions the protocol leaves open, fixed here:

- Sequence order is serial-number arithmetic modulo 2^31 (RFC 1982): `a` lies
  before `b` when `b - a` (mod 2^31) is in 1 .. 2^30-1. A batch is answered
  DUPLICATE_SEQUENCE_NUMBER when its last_seq lies before the oldest cached
  first_seq; at 2^30 or more behind it counts as ahead (OUT_OF_ORDER).
- A producer idle longer than `expiration_ms` is forgotten from that moment:
  `check` and `apply` treat it as absent whether or not `expire` has swept it
  yet, so decisions never depend on when the sweep runs.

The cached batches of a producer are contiguous in sequence (apply starts a new
cache whenever a batch does not continue the newest one) and are packed into
one bytes object, 24 bytes per batch, because a broker may hold a million
producers (10,000 per partition, 100 partitions).

The state also knows each producer's open transaction on the partition: the
offset of its first batch, until its COMMIT or ABORT marker. The oldest of them
is the partition's last stable offset. They are kept apart from the idempotence
entries, so expiring or evicting a producer never forgets an open transaction.

It also remembers each producer's last marker here (offset, epoch, COMMIT or ABORT)
until told the marker's decision is durable. EndTxn's decision record in txn.wal
shares an fsync round with the markers, so after a power loss a marker may be all
that is left of the decision, and recovery decides the transaction by it. A replay
only reads the log after the newest snapshot: a segment roll between a marker and
the crash would hide the marker from it, and the transaction would end committed
on one partition and aborted on the others. Kept in the snapshot (version 3), the
marker survives the roll. Forgetting one is safe once its decision is durable
(`forget_marker`, after the shared round; `forget_markers`, after recovery, when
txn.wal has been synced at open and every decision it lacked was written and
synced): from then on txn.wal decides the transaction, and a marker of that pid
and epoch can decide nothing else, because a decision moves the producer to a new
epoch. A marker not yet forgotten is replaced by the producer's next one here,
which is written only once the previous decision is durable: a transaction could
only start after it, or, for a commit decided by its marker alone (one round, its
COMPLETE synced behind the answer), the id's next EndTxn waits for it.

Snapshot layout, all big-endian:

| size | field                                                            |
|-----:|------------------------------------------------------------------|
|    4 | magic b"MBPS"                                                    |
|    2 | version, uint16, 3 (1: no open transactions, 2: no markers;     |
|      |   both still read)                                               |
|    8 | offset, int64: the log end offset the snapshot was taken at      |
|    4 | body_length, uint32                                              |
|    n | msgpack body: [producers, open_transactions, markers];          |
|      |   producers is                                                   |
|      |   [[producer_id, epoch, last_seen_ms, [[first_seq, last_seq,     |
|      |   base_offset, last_offset_delta, max_timestamp] ...]] ...],     |
|      |   least recently used first, batches oldest first;               |
|      |   open_transactions is [[producer_id, first_offset] ...], oldest |
|      |   first; markers is [[producer_id, offset, epoch, control_type]  |
|      |   ...], each producer's last marker whose decision may not be    |
|      |   durable yet, oldest first, control_type 0 ABORT or 1 COMMIT    |
|      |   (version 1: the body is producers alone; version 2:            |
|      |   [producers, open_transactions])                                |
|    4 | crc32 (zlib) of every byte before it                             |
"""

from __future__ import annotations

import struct
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from protocol.batch import CONTROL_ABORT, CONTROL_COMMIT, SEQUENCE_MODULUS, BatchHeader
from protocol.errors import ErrorCode

CACHED_BATCHES = 5
PRODUCER_EPOCH_MAX = 2**15 - 1  # int16 on the wire
RECORD_COUNT_MAX = 2**31 - 1  # int32 on the wire
SEQUENCE_HALF = SEQUENCE_MODULUS // 2

# One cached batch: first_seq, last_offset_delta, base_offset, max_timestamp.
# last_seq is not stored: it is (first_seq + last_offset_delta) mod 2^31.
_CACHED = struct.Struct(">Iiqq")
_CACHED_BYTES = _CACHED.size
_FIRST_SEQ = struct.Struct(">I")  # the leading field of a packed cached batch
_DELTAS = [struct.Struct(">" + "4xi16x" * count) for count in range(CACHED_BATCHES + 1)]
_CACHE_BYTES_MAX = CACHED_BATCHES * _CACHED_BYTES

SNAPSHOT_MAGIC = b"MBPS"
SNAPSHOT_VERSION = 3
SNAPSHOT_VERSIONS_READ = (1, 2, 3)
_SNAPSHOT_HEAD = struct.Struct(">4sHqI")
_SNAPSHOT_CRC = struct.Struct(">I")

assert _CACHED_BYTES == 24
assert _SNAPSHOT_HEAD.size == 18


class SnapshotError(ValueError):
    """Snapshot bytes that are truncated, corrupt or not a snapshot at all."""


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What the state remembers of one appended batch."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset_delta: int
    max_timestamp: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


class Decision(NamedTuple):
    """The verdict of `check`; a rejected batch changes nothing.

    `error` is NONE both for a batch to append and for a duplicate; a duplicate
    carries the cached batch so the broker answers with its base_offset."""

    error: ErrorCode
    duplicate: BatchMetadata | None
    message: str | None


_APPEND = Decision(ErrorCode.NONE, None, None)


class _Producer:
    """One producer's state; `batches` packs the cached batches, oldest first."""

    __slots__ = (
        "batches",
        "cached_records",
        "epoch",
        "lapped",
        "last_offset",
        "last_seen_ms",
        "next_seq",
    )

    def __init__(self, epoch: int, last_seen_ms: int, batches: bytes) -> None:
        self.epoch = epoch
        self.cache(batches, last_seen_ms)

    def cache(self, batches: bytes, now_ms: int) -> None:
        """Hold `batches` (packed, oldest first, 1 to CACHED_BATCHES of them) as the
        cache, the newest of them continuing at next_seq."""
        count = len(batches) // _CACHED_BYTES
        assert 1 <= count <= CACHED_BATCHES and len(batches) == count * _CACHED_BYTES
        first_seq, last_offset_delta, base_offset, _ = _CACHED.unpack_from(
            batches, len(batches) - _CACHED_BYTES
        )
        # The newest cached batch's last offset, for the assert that log offsets only grow.
        self.last_offset = base_offset + last_offset_delta
        self.last_seen_ms = now_ms
        self.batches = batches
        self.next_seq = (first_seq + last_offset_delta + 1) % SEQUENCE_MODULUS
        # When the cache spans a whole lap of sequence numbers, a cached batch can start
        # at next_seq, and rule 3 (duplicate) must be tried before taking it as the next.
        self.cached_records = count + sum(_DELTAS[count].unpack(batches))
        self.lapped = self.cached_records >= SEQUENCE_MODULUS

    def copy(self) -> _Producer:
        twin = _Producer.__new__(_Producer)
        for name in _Producer.__slots__:
            setattr(twin, name, getattr(self, name))
        return twin


class PartitionProducerState:
    """The idempotence state of one partition: producers in least-recently-used order."""

    __slots__ = (
        "_markers",
        "_open_txns",
        "_producers",
        "evicted_total",
        "expiration_ms",
        "expired_total",
        "max_producers",
    )

    def __init__(self, *, max_producers: int, expiration_ms: int) -> None:
        if max_producers < 1:
            raise ValueError(f"max_producers must be at least 1, got {max_producers}")
        if expiration_ms < 0:
            raise ValueError(f"expiration_ms must not be negative, got {expiration_ms}")
        self.max_producers = max_producers
        self.expiration_ms = expiration_ms
        self.expired_total = 0
        self.evicted_total = 0
        self._producers: OrderedDict[int, _Producer] = OrderedDict()
        # producer id -> first offset of its open transaction, oldest first: a batch
        # opens one at the log end, so insertion order is offset order.
        self._open_txns: dict[int, int] = {}
        # producer id -> (offset, epoch, control type) of its last marker whose decision
        # may not be durable yet, oldest first (a marker is appended at the log end).
        self._markers: dict[int, tuple[int, int, int]] = {}

    def __len__(self) -> int:
        """Producer ids held, including idle ones `expire` has not swept yet."""
        return len(self._producers)

    def begin_txn(self, producer_id: int, offset: int) -> None:
        """A transactional batch of `producer_id` now lies at `offset`: its transaction
        is open here from its first such batch on."""
        if producer_id not in self._open_txns:
            assert all(first < offset for first in self._open_txns.values()), offset
            self._open_txns[producer_id] = offset

    def end_txn(
        self, producer_id: int, offset: int, producer_epoch: int, committed: bool
    ) -> int | None:
        """A marker at `offset` ended `producer_id`'s transaction here: its first offset,
        or None when it wrote no batch to this partition. The marker is remembered (see
        the module docstring) until `forget_marker`."""
        assert 0 <= producer_epoch <= PRODUCER_EPOCH_MAX, producer_epoch
        markers = self._markers
        assert not markers or next(reversed(markers.values()))[0] < offset, offset
        markers.pop(producer_id, None)
        markers[producer_id] = (
            offset,
            producer_epoch,
            CONTROL_COMMIT if committed else CONTROL_ABORT,
        )
        first = self._open_txns.pop(producer_id, None)
        assert first is None or first < offset, (first, offset)
        return first

    def last_marker(self, producer_id: int) -> tuple[int, bool] | None:
        """(epoch, committed) of `producer_id`'s last remembered marker here, or None."""
        marker = self._markers.get(producer_id)
        return None if marker is None else (marker[1], marker[2] == CONTROL_COMMIT)

    def forget_marker(self, producer_id: int, producer_epoch: int) -> None:
        """The decision of `producer_id`'s transaction at `producer_epoch` is durable:
        forget its marker here, if that is the one remembered (a pid and an epoch name
        one transaction: a decision moves the producer to the next epoch)."""
        marker = self._markers.get(producer_id)
        if marker is not None and marker[1] == producer_epoch:
            del self._markers[producer_id]

    def forget_markers(self) -> None:
        """Every decision is durable (recovery is over): forget every marker."""
        self._markers.clear()

    @property
    def markers(self) -> dict[int, tuple[int, int, bool]]:
        """producer id -> (offset, epoch, committed) of each remembered marker (a copy)."""
        return {
            pid: (offset, epoch, kind == CONTROL_COMMIT)
            for pid, (offset, epoch, kind) in self._markers.items()
        }

    def in_txn(self, producer_id: int) -> bool:
        """True while `producer_id` has a transaction open here (a marker is due)."""
        return producer_id in self._open_txns

    def in_txn_at(self, producer_id: int, producer_epoch: int) -> bool:
        """True while `producer_id` has a transaction open here whose batches carry
        `producer_epoch`: an ended transaction's marker, written again after a crash,
        is not due where the producer's next transaction (a later epoch) is open. A
        producer whose state was evicted or expired keeps its open transaction, of an
        epoch no longer known: that one is taken to be it, so its marker is written."""
        if producer_id not in self._open_txns:
            return False
        entry = self._producers.get(producer_id)
        return entry is None or entry.epoch == producer_epoch

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction: the last stable offset."""
        return next(iter(self._open_txns.values()), None)

    def describe(self) -> list[tuple[int, int, int, int, int]]:
        """(producer id, epoch, last sequence, last seen ms, first offset of its open
        transaction or -1) of every producer held, least recently used first: what
        Kafka's DescribeProducers shows of a partition."""
        return [
            (
                pid,
                entry.epoch,
                (entry.next_seq - 1) % SEQUENCE_MODULUS,
                entry.last_seen_ms,
                self._open_txns.get(pid, -1),
            )
            for pid, entry in self._producers.items()
        ]

    @property
    def open_txns(self) -> dict[int, int]:
        """producer id -> first offset of each open transaction (a copy)."""
        return dict(self._open_txns)

    def trial(self, producer_id: int) -> PartitionProducerState:
        """A scratch state holding a copy of `producer_id`'s entry alone: `check` and
        `apply` judge that producer's batches on it exactly as here, and this state is
        untouched until the caller applies the batches that were written."""
        scratch = PartitionProducerState(
            max_producers=self.max_producers, expiration_ms=self.expiration_ms
        )
        entry = self._producers.get(producer_id)
        if entry is not None:
            scratch._producers[producer_id] = entry.copy()
        return scratch

    def adopt(self, trial: PartitionProducerState, producer_id: int) -> None:
        """Take `producer_id`'s entry from `trial` once the log holds every batch that
        was applied there: what applying them here one by one would leave."""
        entry = trial._producers[producer_id]
        producers = self._producers
        before = producers.get(producer_id)
        assert before is None or entry.last_offset > before.last_offset, "log offsets only grow"
        producers[producer_id] = entry
        producers.move_to_end(producer_id)
        self.expired_total += trial.expired_total
        while len(producers) > self.max_producers:
            producers.popitem(last=False)
            self.evicted_total += 1
        assert producer_id in producers

    def apply_in_order(
        self, producer_id: int, headers: Iterable[BatchHeader], base_offset: int, now_ms: int
    ) -> tuple[int, int]:
        """Apply the leading `headers` that `check` would take as the next batches, at
        offsets from `base_offset` on, as `apply` one by one would; return how many,
        and the offset after the last of them.

        The hot path of a run of one producer's batches: one cache update for the run
        instead of one per batch. It stops at the first batch that is not the next in
        sequence of the current epoch, or that could make the cache span a lap of
        sequence numbers (then rule 3 comes first); `check` and `apply` take it."""
        entry = self._producers.get(producer_id)
        if entry is None or now_ms - entry.last_seen_ms > self.expiration_ms:
            return 0, base_offset
        epoch, next_seq = entry.epoch, entry.next_seq
        # An upper bound of the records the cache will span: below a lap, no batch
        # taken here can start at a cached sequence number (a lapped cache takes none).
        records = entry.cached_records
        taken: list[tuple[int, int, int, int]] = []
        offset = base_offset
        for header in headers:
            count = header.record_count
            records += count
            if (
                header.base_sequence != next_seq
                or header.producer_epoch != epoch
                or records >= SEQUENCE_MODULUS
            ):
                break
            assert 1 <= count <= RECORD_COUNT_MAX, count
            taken.append((next_seq, count - 1, offset, header.max_timestamp))
            next_seq = (next_seq + count) % SEQUENCE_MODULUS
            offset += count
        if not taken:
            return 0, base_offset
        assert base_offset > entry.last_offset, "log offsets only grow"
        # Only the newest CACHED_BATCHES are kept: only they are packed.
        packed = b"".join(_CACHED.pack(*batch) for batch in taken[-CACHED_BATCHES:])
        entry.cache((entry.batches + packed)[-_CACHE_BYTES_MAX:], now_ms)
        self._producers.move_to_end(producer_id)
        return len(taken), offset

    def epoch_of(self, producer_id: int) -> int | None:
        entry = self._producers.get(producer_id)
        return None if entry is None else entry.epoch

    def last_sequence(self, producer_id: int) -> tuple[int, int] | None:
        """(epoch, last sequence) of `producer_id`'s newest batch here, or None when the
        state holds none of its batches."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return None
        return entry.epoch, (entry.next_seq - 1) % SEQUENCE_MODULUS

    def check(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        record_count: int,
        now_ms: int,
    ) -> Decision:
        """Judge an idempotent batch by rules 2-5 of docs/protocol.md section 3, in order.

        Never mutates. The in-order batch of a known producer, the common case,
        allocates nothing."""
        assert producer_id >= 0, producer_id
        assert producer_epoch <= PRODUCER_EPOCH_MAX, producer_epoch
        assert base_sequence < SEQUENCE_MODULUS, base_sequence
        assert 1 <= record_count <= RECORD_COUNT_MAX, record_count
        if base_sequence < 0 or producer_epoch < 0:
            # Section 2 validation does not cover these; storing them would break the state.
            return Decision(
                ErrorCode.INVALID_RECORD,
                None,
                f"producer {producer_id}: epoch {producer_epoch} and base_sequence "
                f"{base_sequence} must not be negative",
            )
        entry = self._producers.get(producer_id)
        if entry is not None and now_ms - entry.last_seen_ms > self.expiration_ms:
            entry = None
        if entry is None:
            if base_sequence == 0:
                return _APPEND
            return Decision(
                ErrorCode.UNKNOWN_PRODUCER_ID,
                None,
                f"no state for producer {producer_id} on this partition: "
                f"base_sequence must be 0, got {base_sequence}",
            )
        if producer_epoch < entry.epoch:
            return Decision(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                None,
                f"producer {producer_id} epoch {producer_epoch} is older than {entry.epoch}",
            )
        if producer_epoch > entry.epoch:
            if base_sequence == 0:
                return _APPEND
            return Decision(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                None,
                f"producer {producer_id} epoch {producer_epoch} is new (was {entry.epoch}): "
                f"base_sequence must be 0, got {base_sequence}",
            )
        if base_sequence == entry.next_seq and not entry.lapped:
            return _APPEND
        return _check_same_epoch(producer_id, entry, base_sequence, record_count)

    def apply(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        record_count: int,
        base_offset: int,
        max_timestamp: int,
        now_ms: int,
    ) -> None:
        """Record a batch the log now holds at `base_offset` (rule 6).

        Also replays the log on recovery, so it accepts any batch a valid log can
        hold: one that does not continue the producer's newest cached batch
        (new epoch, or state forgotten) starts a new cache instead of failing."""
        assert 1 <= record_count <= RECORD_COUNT_MAX, record_count
        batch = _CACHED.pack(base_sequence, record_count - 1, base_offset, max_timestamp)
        producers = self._producers
        entry = producers.get(producer_id)
        if (
            entry is not None
            and base_sequence == entry.next_seq
            and producer_epoch == entry.epoch
            and now_ms - entry.last_seen_ms <= self.expiration_ms
        ):
            # The next batch of a known producer, the hot path: its id, epoch and
            # sequence equal values the state already holds, so they are in range.
            assert base_offset > entry.last_offset, "log offsets only grow"
            entry.cache((entry.batches + batch)[-_CACHE_BYTES_MAX:], now_ms)
            producers.move_to_end(producer_id)
            return
        assert producer_id >= 0, producer_id
        assert 0 <= producer_epoch <= PRODUCER_EPOCH_MAX, producer_epoch
        assert 0 <= base_sequence < SEQUENCE_MODULUS, base_sequence
        assert base_offset >= 0, base_offset
        if entry is not None and now_ms - entry.last_seen_ms > self.expiration_ms:
            del producers[producer_id]
            self.expired_total += 1
            entry = None
        if entry is not None:
            # A batch that does not continue the cache (the hot path took those).
            assert base_offset > entry.last_offset, "log offsets only grow"
        producers[producer_id] = _Producer(producer_epoch, now_ms, batch)
        producers.move_to_end(producer_id)
        while len(producers) > self.max_producers:
            producers.popitem(last=False)
            self.evicted_total += 1
        assert producer_id in producers

    def restarted(self, now_ms: int) -> None:
        """After a restart every producer counts as seen now, however the broker
        stopped: downtime must not expire a producer whose retry may be on its way."""
        for entry in self._producers.values():
            entry.last_seen_ms = max(entry.last_seen_ms, now_ms)

    def expire(self, now_ms: int) -> int:
        """Forget every producer idle for more than `expiration_ms`; return how many.

        Scans all producers: LRU order follows `now_ms` only while the caller's
        clock never steps back, so it cannot bound the scan."""
        oldest_kept_ms = now_ms - self.expiration_ms
        idle = [
            pid for pid, entry in self._producers.items() if entry.last_seen_ms < oldest_kept_ms
        ]
        for pid in idle:
            del self._producers[pid]
        self.expired_total += len(idle)
        return len(idle)

    def encode_snapshot(self, offset: int) -> bytes:
        """The whole state as self-checking bytes, taken at log end offset `offset`."""
        producers = []
        for pid, entry in self._producers.items():
            batches = [
                [first, (first + delta) % SEQUENCE_MODULUS, base_offset, delta, max_timestamp]
                for first, delta, base_offset, max_timestamp in _CACHED.iter_unpack(entry.batches)
            ]
            assert batches[-1][2] + batches[-1][3] < offset, "snapshot offset below a batch"
            producers.append([pid, entry.epoch, entry.last_seen_ms, batches])
        assert all(first < offset for first in self._open_txns.values()), offset
        open_txns = [[pid, first] for pid, first in self._open_txns.items()]
        markers = [[pid, *marker] for pid, marker in self._markers.items()]
        assert _markers_consistent(markers, self._open_txns, offset), (markers, offset)
        body: bytes = msgpack.packb([producers, open_txns, markers], use_bin_type=True)
        head = _SNAPSHOT_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, offset, len(body))
        crc = zlib.crc32(body, zlib.crc32(head))
        return head + body + _SNAPSHOT_CRC.pack(crc)

    @classmethod
    def decode_snapshot(
        cls, data: bytes, *, max_producers: int, expiration_ms: int
    ) -> tuple[int, PartitionProducerState]:
        """(offset, state) from `encode_snapshot` bytes; SnapshotError when they are not.

        A snapshot with more producers than `max_producers` loses its least
        recently used ones, counted as evictions."""
        size = len(data)
        if size < _SNAPSHOT_HEAD.size + _SNAPSHOT_CRC.size:
            raise SnapshotError(f"snapshot truncated: {size} bytes")
        magic, version, offset, body_length = _SNAPSHOT_HEAD.unpack_from(data)
        if magic != SNAPSHOT_MAGIC:
            raise SnapshotError(f"not a producer-state snapshot: magic {magic!r}")
        body_end = _SNAPSHOT_HEAD.size + body_length
        if size != body_end + _SNAPSHOT_CRC.size:
            raise SnapshotError(f"snapshot of {size} bytes declares a {body_length}-byte body")
        (crc,) = _SNAPSHOT_CRC.unpack_from(data, body_end)
        if zlib.crc32(memoryview(data)[:body_end]) != crc:
            raise SnapshotError("snapshot CRC mismatch")
        if version not in SNAPSHOT_VERSIONS_READ:
            raise SnapshotError(
                f"snapshot version {version} is not one of {SNAPSHOT_VERSIONS_READ}"
            )
        if offset < 0:
            raise SnapshotError(f"snapshot offset {offset} is negative")
        try:
            body = msgpack.unpackb(memoryview(data)[_SNAPSHOT_HEAD.size : body_end])
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise SnapshotError(f"snapshot body is not msgpack: {exc}") from exc
        if version == 1:
            body = [body, []]
        lists = 3 if version >= 3 else 2  # version 2 has no markers
        if not (
            isinstance(body, list) and len(body) == lists and all(isinstance(b, list) for b in body)
        ):
            raise SnapshotError(f"snapshot version {version} body is not {lists} lists")
        producers, open_txns, markers = body if lists == 3 else [*body, []]
        state = cls(max_producers=max_producers, expiration_ms=expiration_ms)
        state._open_txns = _decode_open_txns(open_txns, offset)
        state._markers = _decode_markers(markers, state._open_txns, offset)
        for item in producers:
            pid, entry = _decode_producer(item, offset)
            if pid in state._producers:
                raise SnapshotError(f"producer {pid} appears twice")
            state._producers[pid] = entry
        while len(state._producers) > max_producers:
            state._producers.popitem(last=False)
            state.evicted_total += 1
        return offset, state


def _check_same_epoch(
    producer_id: int, entry: _Producer, base_sequence: int, record_count: int
) -> Decision:
    """Rules 3 and 5 for a batch of the producer's current epoch, off the fast path."""
    last_offset_delta = record_count - 1
    for first, delta, base_offset, max_timestamp in _CACHED.iter_unpack(entry.batches):
        # Equal first_seq and record count is the same as equal (first_seq, last_seq).
        if first == base_sequence and delta == last_offset_delta:
            last_seq = (first + delta) % SEQUENCE_MODULUS
            return Decision(
                ErrorCode.NONE,
                BatchMetadata(first, last_seq, base_offset, delta, max_timestamp),
                None,
            )
    if base_sequence == entry.next_seq:
        return _APPEND
    last_seq = (base_sequence + last_offset_delta) % SEQUENCE_MODULUS
    (oldest_first,) = _FIRST_SEQ.unpack_from(entry.batches)
    if 0 < (oldest_first - last_seq) % SEQUENCE_MODULUS < SEQUENCE_HALF:
        return Decision(
            ErrorCode.DUPLICATE_SEQUENCE_NUMBER,
            None,
            f"producer {producer_id} sequences {base_sequence}..{last_seq} lie before the "
            f"oldest cached batch (first_seq {oldest_first}): already written",
        )
    return Decision(
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        None,
        f"producer {producer_id}: expected base_sequence {entry.next_seq}, got {base_sequence}",
    )


def _decode_producer(item: Any, offset: int) -> tuple[int, _Producer]:
    """One producer of a snapshot body, checked as strictly as `apply` would have built it."""
    if not (isinstance(item, list) and len(item) == 4):
        raise SnapshotError(f"producer entry is not [pid, epoch, last_seen_ms, batches]: {item!r}")
    pid, epoch, last_seen_ms, batches = item
    if not (_is_int(pid) and 0 <= pid < 2**63 and _is_int(last_seen_ms)):
        raise SnapshotError(f"bad producer id or last_seen_ms: {item!r}")
    if not (_is_int(epoch) and 0 <= epoch <= PRODUCER_EPOCH_MAX):
        raise SnapshotError(f"producer {pid}: bad epoch {epoch!r}")
    if not (isinstance(batches, list) and 1 <= len(batches) <= CACHED_BATCHES):
        raise SnapshotError(f"producer {pid}: expected 1..{CACHED_BATCHES} batches")
    packed = bytearray()
    next_seq = next_offset = None
    for batch in batches:
        if not (isinstance(batch, list) and len(batch) == 5 and all(map(_is_int, batch))):
            raise SnapshotError(f"producer {pid}: batch is not five integers: {batch!r}")
        first, last, base_offset, delta, max_timestamp = batch
        valid = (
            0 <= first < SEQUENCE_MODULUS
            and 0 <= delta < RECORD_COUNT_MAX
            and last == (first + delta) % SEQUENCE_MODULUS
            and (next_seq is None or first == next_seq)
            and base_offset >= (0 if next_offset is None else next_offset)
            and base_offset + delta < offset
            and -(2**63) <= max_timestamp < 2**63
        )
        if not valid:
            raise SnapshotError(f"producer {pid}: inconsistent batch {batch!r}")
        packed += _CACHED.pack(first, delta, base_offset, max_timestamp)
        next_seq = (last + 1) % SEQUENCE_MODULUS
        next_offset = base_offset + delta + 1
    return pid, _Producer(epoch, last_seen_ms, bytes(packed))


def _decode_open_txns(items: list[Any], offset: int) -> dict[int, int]:
    open_txns: dict[int, int] = {}
    previous = -1
    for item in items:
        if not (isinstance(item, list) and len(item) == 2 and all(map(_is_int, item))):
            raise SnapshotError(f"open transaction is not [producer_id, first_offset]: {item!r}")
        pid, first = item
        if not (0 <= pid < 2**63 and previous < first < offset) or pid in open_txns:
            raise SnapshotError(f"inconsistent open transaction {item!r}")
        open_txns[pid] = previous = first
    return open_txns


def _decode_markers(
    items: list[Any], open_txns: dict[int, int], offset: int
) -> dict[int, tuple[int, int, int]]:
    for item in items:
        if not (isinstance(item, list) and len(item) == 4 and all(map(_is_int, item))):
            raise SnapshotError(
                f"marker is not [producer_id, offset, epoch, control_type]: {item!r}"
            )
    if not _markers_consistent(items, open_txns, offset):
        raise SnapshotError(f"inconsistent markers {items!r}")
    markers = {pid: (at, epoch, kind) for pid, at, epoch, kind in items}
    assert _markers_consistent([[p, *m] for p, m in markers.items()], open_txns, offset)
    return markers


def _markers_consistent(items: list[Any], open_txns: dict[int, int], offset: int) -> bool:
    """The snapshot invariant of the remembered markers: one per producer, oldest first,
    each below the snapshot offset and before its producer's open transaction (the
    marker ended the previous one), with a valid epoch and control type."""
    previous = -1
    pids = set()
    for pid, at, epoch, kind in items:
        if not (
            0 <= pid < 2**63
            and pid not in pids
            and previous < at < offset
            and 0 <= epoch <= PRODUCER_EPOCH_MAX
            and kind in (CONTROL_ABORT, CONTROL_COMMIT)
            and open_txns.get(pid, offset) > at
        ):
            return False
        pids.add(pid)
        previous = at
    return True


def _is_int(value: Any) -> bool:
    return type(value) is int
