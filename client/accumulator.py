"""The producer's sans-IO core: batching, sequence numbers, retries and epoch bumps.

Modelled on Kafka's RecordAccumulator and TransactionManager. Nothing here
touches a socket or an event loop: callers pass `now_ms` (a monotonic clock in
milliseconds), get back batches to send and the next deadline to wake up at,
and report each outcome. (`append`, on the caller's hot path, reads the
injected `clock` instead, and only when it opens a batch.) So every retry and
recovery path is testable with a fake clock and no sleeps.

Idempotence, per partition:

- A batch gets its base sequence when it is first drained, and keeps it on
  every retry, so a retry of an appended batch is answered as a duplicate.
- Batches of a partition go out in sequence order. Responses on one connection
  come back in request order, so when one batch fails, every later in-flight
  batch of that partition will fail too (the broker sees a sequence gap). The
  partition is then "broken": nothing more is sent for it until its in-flight
  count drops to zero, and the failed batches are re-queued in sequence order.
- OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID on a partition that was
  not broken means the broker lost or never had our state (KIP-360). So does a
  batch failing for good after it got a sequence (a hole). Either way the whole
  producer bumps its epoch: first every batch whose outcome is unknown (its
  connection dropped, or it timed out or met a storage error) is retried with its
  old epoch and sequence until the broker answers success/duplicate (appended) or
  OUT_OF_ORDER/UNKNOWN_PRODUCER_ID (never appended: an appended retry would have
  been recognised as a duplicate); then, with nothing in flight,
  InitProducerId(pid, epoch) gives epoch + 1 and every unacknowledged batch is
  re-sequenced from 0. Nothing is lost (rejected batches are resent) and nothing
  is duplicated (a batch that may have been appended is resolved before its
  sequence changes).
- INVALID_PRODUCER_EPOCH and PRODUCER_FENCED are fatal for every batch.

Transactions: a `transactional` accumulator stamps every batch transactional and
asks its transaction manager (`TransactionGate`, client/transaction_manager.py)
what the transaction decides for its batches: whether a batch that failed for
good makes it abortable, whether queued batches may expire, whether a failed
batch is retried. There is no KIP-360 bump inside a transaction (an
InitProducerId would abort it on the broker). INVALID_PRODUCER_ID_MAPPING is
fatal too.

Thread safety: `append` runs on the caller's thread (the sync face's hot path)
while the rest runs on the I/O thread, so every method takes `lock`, but for
the ones the transaction manager calls while it holds it (they say so). Batch
completion (events, callbacks) happens outside the lock, in `ProducerBatch.notify`.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import anyio
import msgpack

from client.errors import (
    FENCING_CODES,
    TXN_FATAL_CODES,
    ConnectionLostError,
    DeliveryTimeoutError,
    MinibrokerError,
    MinibrokerTimeoutError,
    RecordTooLargeError,
    TransactionAbortedError,
    error_for,
)
from client.types import BatchMetadata, RecordMetadata
from protocol.batch import (
    HEADER_BYTES,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    SEQUENCE_MODULUS,
    encode_batch,
    with_sequence,
)
from protocol.compression import Compression
from protocol.errors import RETRIABLE, ErrorCode
from protocol.records import (
    HEADER_OVERHEAD,
    NIL,
    RECORD_OVERHEAD,
    VALUE_HEADS,
    Headers,
    join_records,
    record_parts,
)

log = logging.getLogger(f"minibroker.{__name__}")

_tuple_new = tuple.__new__
# Guards a batch's lazily made done_event: a waiter and `notify` race to it.
_event_lock = threading.Lock()

# Answers after which the batch may be in the log although the broker reported a failure.
MAYBE_APPENDED = frozenset({ErrorCode.REQUEST_TIMED_OUT, ErrorCode.KAFKA_STORAGE_ERROR})

DeliveryCallback = Callable[[BaseException | None, RecordMetadata], object]


def monotonic_ms() -> float:
    """The clock of the producer's deadlines: monotonic, in milliseconds."""
    return time.monotonic() * 1000.0


class BufferFull(Exception):
    """buffer_memory is used up; the caller blocks (up to max_block_ms) and retries."""

    def __init__(self, size: int) -> None:
        super().__init__(f"no buffer space for {size} bytes")
        self.size = size


def headers_size(headers: Headers) -> int:
    """Upper bound of the encoded size of a record's headers (4 bytes per str char)."""
    if not headers:
        return 0
    return sum(HEADER_OVERHEAD + len(name) * 4 + len(data) for name, data in headers)


def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """The bytes a record is accounted for in batch_size (an upper bound of its encoding)."""
    size = RECORD_OVERHEAD + headers_size(headers)
    if key is not None:
        size += len(key)
    if value is not None:
        size += len(value)
    return size


class ProducerBatch:
    """Records bound for one partition that travel, succeed or fail together."""

    __slots__ = (
        "_async_event",
        "attempts",
        "base_offset",
        "base_ts",
        "callbacks",
        "created_ms",
        "done_callbacks",
        "done_event",
        "encoded",
        "error",
        "finished",
        "first_index",
        "in_flight",
        "limit",
        "max_ts",
        "order",
        "parent",
        "partition",
        "parts",
        "payload",
        "pieces",
        "record_count",
        "reserved",
        "retry_at_ms",
        "sealed",
        "sequence",
        "size",
        "stamp",
        "topic",
        "unresolved",
    )

    def __init__(self, topic: str, partition: int, base_ts: int, created_ms: float) -> None:
        self.topic = topic
        self.partition = partition
        # The records' msgpack encoding, framed record by record as they are appended
        # (protocol.records.record_parts) and joined once; parts[0] is the array header's.
        self.parts: list[bytes] = [b""]
        self.payload: bytes | None = None  # pre-encoded records (send_batch)
        self.record_count = 0
        self.max_ts = base_ts
        self.size = HEADER_BYTES
        self.reserved = 0  # bytes of buffer_memory held until the batch finishes
        # The bytes the batch may fill: its reservation, raised while the partition's
        # pipeline is full (adaptive batching, RecordAccumulator._grow).
        self.limit = 0
        self.base_ts = base_ts
        self.created_ms = created_ms
        self.sealed = False
        self.sequence: int | None = None
        # Sequence order within the partition: a count, and for a split batch's pieces
        # fractions after their parent's (so a retried piece goes back among them in order).
        self.order: float | None = None
        self.encoded: bytes | None = None
        self.stamp: tuple[int, int, int] | None = None
        self.attempts = 0
        self.retry_at_ms = 0.0
        self.in_flight = False
        self.unresolved = False
        self.callbacks: list[tuple[int, int, DeliveryCallback]] | None = None
        self.finished = False
        self.base_offset = -1
        self.error: BaseException | None = None
        self.done_event: threading.Event | None = None  # made by the first `wait`
        self._async_event: anyio.Event | None = None
        # RecordHandle.add_done_callback's, under _event_lock: added from any thread.
        self.done_callbacks: list[Callable[[], object]] | None = None
        # A batch split on MESSAGE_TOO_LARGE: its pieces carry its records and finish it;
        # each piece knows its parent and the parent's index of its first record.
        self.pieces: list[ProducerBatch] | None = None
        self.parent: ProducerBatch | None = None
        self.first_index = 0

    def __repr__(self) -> str:
        return (
            f"<ProducerBatch {self.topic}-{self.partition} n={self.record_count} "
            f"seq={self.sequence} attempts={self.attempts}>"
        )

    def wire(
        self, producer_id: int, producer_epoch: int, compression: int, transactional: bool = False
    ) -> bytes:
        """The batch bytes stamped with the current producer id, epoch and sequence."""
        sequence = NO_SEQUENCE if self.sequence is None else self.sequence
        stamp = (producer_id, producer_epoch, sequence)
        if self.encoded is not None and self.stamp is not None and stamp != self.stamp:
            if self.stamp[0] == producer_id:
                self.encoded = with_sequence(self.encoded, producer_epoch, sequence)
            else:
                self.encoded = None
        if self.encoded is None:
            records = self.payload
            if records is None:
                records = join_records(self.parts, self.record_count)
            self.encoded = encode_batch(
                records,
                record_count=self.record_count,
                base_timestamp=self.base_ts,
                max_timestamp=self.max_ts,
                compression=compression,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=sequence,
                transactional=transactional,
            )
        self.stamp = stamp
        return self.encoded

    def record_metadata(self, index: int, timestamp_ms: int) -> RecordMetadata:
        batch = self
        if self.pieces is not None:  # split: the piece that carried record `index`
            batch = next(p for p in reversed(self.pieces) if p.first_index <= index)
            index -= batch.first_index
        offset = batch.base_offset + index if batch.base_offset >= 0 else -1
        return RecordMetadata(self.topic, self.partition, offset, timestamp_ms)

    def batch_metadata(self) -> BatchMetadata:
        return BatchMetadata(self.topic, self.partition, self.base_offset, self.record_count)

    def notify(self) -> None:
        """Wake waiters and run delivery callbacks; once, after the batch finished."""
        with _event_lock:
            event = self.done_event
            done_callbacks, self.done_callbacks = self.done_callbacks, None
        if event is not None:
            event.set()
        if self._async_event is not None:
            self._async_event.set()
        if self.callbacks:
            error = self.error
            for index, timestamp_ms, callback in self.callbacks:
                try:
                    callback(error, self.record_metadata(index, timestamp_ms))
                except Exception:
                    log.exception("on_delivery callback raised")
        for done in done_callbacks or ():
            _run_done_callback(done)

    def add_done_callback(self, callback: Callable[[], object]) -> bool:
        """Have `notify` call `callback`; False, keeping nothing, if the batch has finished
        (`finished` is set before `notify` takes the lock, so one of the two sees the other)."""
        with _event_lock:
            if self.finished:
                return False
            if self.done_callbacks is None:
                self.done_callbacks = []
            self.done_callbacks.append(callback)
            return True

    def wait(self, timeout: float | None) -> None:
        """Block until the batch finished. Few batches are waited for one by one, so the
        threading.Event (a lock and a condition) is made here rather than per batch."""
        if self.finished:
            return
        with _event_lock:
            event = self.done_event
            if event is None:
                event = self.done_event = threading.Event()
        # `finished` is set before `notify` reads the event: one of the two sees the other.
        if not self.finished and not event.wait(timeout):
            raise MinibrokerTimeoutError(f"delivery not confirmed within {timeout} s")

    async def wait_async(self) -> None:
        """Wait on the event loop thread, where `notify` runs."""
        if not self.finished:
            if self._async_event is None:
                self._async_event = anyio.Event()
            await self._async_event.wait()


def _run_done_callback(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception:
        log.exception("done callback raised")


class RecordHandle(tuple):  # a 3-tuple: the cheapest object CPython can allocate
    """The pending metadata of one `send()`: (batch, index, timestamp_ms), not a future
    per record.

    `.get(timeout)` blocks for the RecordMetadata (sync face); `await handle`
    waits for it on the event loop (async face). Both raise the delivery error."""

    __slots__ = ()

    def done(self) -> bool:
        return self[0].finished

    def get(self, timeout: float | None = None) -> RecordMetadata:
        batch: ProducerBatch = self[0]
        batch.wait(timeout)
        if batch.error is not None:
            raise batch.error
        return batch.record_metadata(self[1], self[2])

    def exception(self) -> BaseException | None:
        batch: ProducerBatch = self[0]
        return batch.error if batch.finished else None

    def add_done_callback(self, fn: Callable[[RecordHandle], object]) -> None:
        """Call `fn(handle)` once the record's batch has finished, delivered or not: on the
        producer's I/O thread as the answer is handled, or at once on this thread if it has
        finished already; an exception it raises is logged either way (concurrent.futures
        .Future's rules; kafka-python's add_callback and add_errback). One per batch times
        every record of it, as they finish together."""
        done = functools.partial(fn, self)
        if not self[0].add_done_callback(done):
            _run_done_callback(done)

    def __await__(self) -> Any:
        return self._wait().__await__()

    async def _wait(self) -> RecordMetadata:
        batch: ProducerBatch = self[0]
        await batch.wait_async()
        if batch.error is not None:
            raise batch.error
        return batch.record_metadata(self[1], self[2])

    def __repr__(self) -> str:
        return f"<RecordHandle {self[0]!r} index={self[1]}>"


class BatchFuture:
    """The pending outcome of one `send_batch()`: every wire batch it became."""

    __slots__ = ("batches",)

    def __init__(self, batches: list[ProducerBatch]) -> None:
        self.batches = batches

    def done(self) -> bool:
        return all(b.finished for b in self.batches)

    def get(self, timeout: float | None = None) -> list[BatchMetadata]:
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in self.batches:
            batch.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._result()

    def __await__(self) -> Any:
        return self._wait().__await__()

    async def _wait(self) -> list[BatchMetadata]:
        for batch in self.batches:
            await batch.wait_async()
        return self._result()

    def _result(self) -> list[BatchMetadata]:
        for batch in self.batches:
            if batch.error is not None:
                raise batch.error
        return [b.batch_metadata() for b in self.batches]


class TransactionGate(Protocol):
    """What a transactional accumulator asks its transaction manager, under `lock`."""

    @property
    def aborting(self) -> bool:
        """Whether the transaction is lost, so a failed batch is neither retried nor split."""

    @property
    def commit_landed(self) -> bool:
        """Whether a commit naming the last sequences landed: every batch is written."""

    def may_expire(self) -> bool:
        """Whether queued batches may expire (not while a commit is in doubt)."""

    def batch_failed(self, error: BaseException, done: list[ProducerBatch]) -> None:
        """A batch failed for good: the transaction decides what that costs it."""

    def fenced(self) -> None:
        """The producer became unusable (fatal error)."""


class _PartitionState:
    __slots__ = (
        "broken",
        "in_flight",
        "last_sequence",
        "next_order",
        "next_sequence",
        "open",
        "queue",
        "topic",
    )

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.queue: deque[ProducerBatch] = deque()  # not in flight; the open batch is last
        self.open: ProducerBatch | None = None
        self.in_flight = 0
        self.broken = False
        self.next_sequence = 0
        # The last sequence given out at this epoch; None before the first.
        self.last_sequence: int | None = None
        self.next_order = 0


class RecordAccumulator:
    """Batches records per partition and decides what to send when; see the module doc."""

    def __init__(
        self,
        *,
        batch_size: int = 16384,
        buffer_memory: int = 32 * 1024 * 1024,
        linger_ms: float = 0,
        max_request_size: int = 1024 * 1024,
        retries: int = 2**31 - 1,
        delivery_timeout_ms: float = 120_000,
        retry_backoff_ms: float = 100,
        retry_backoff_max_ms: float = 1000,
        adaptive_batching: bool = True,
        max_in_flight: int = 5,
        idempotent: bool = True,
        transactional: bool = False,
        compression: int = Compression.NONE,
        clock: Callable[[], float] = monotonic_ms,
        wakeup: Callable[[], None] = lambda: None,
        on_batch_full: Callable[[str, int], None] = lambda topic, partition: None,
    ) -> None:
        self.lock = threading.Lock()
        # Signalled, when someone waits on it, as buffer memory frees up or appends start
        # failing: the sync face's send() waits here on the caller's thread.
        self._space = threading.Condition(self.lock)
        self._space_waiters = 0
        self.clock = clock
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.linger_ms = linger_ms
        self.max_request_size = max_request_size
        # The most bytes a batch may grow to: max_request_size, lowered under the size of
        # any batch the broker refused as too large (its message_max_bytes is smaller).
        self._grow_max = max_request_size
        self.retries = retries
        self.delivery_timeout_ms = delivery_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.adaptive_batching = adaptive_batching
        # Batches of one partition in flight at most: one per request, so the sender's
        # max_in_flight_requests_per_connection.
        self.max_in_flight = max_in_flight
        self.idempotent = idempotent
        self.transactional = transactional
        self.compression = compression
        # Called under the lock when a batch became sendable before the sender's planned wakeup.
        self.wakeup = wakeup
        self.on_batch_full = on_batch_full

        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        # A transactional producer asks for its id in init_transactions(), not on start.
        self._needs_producer_id = idempotent and not transactional
        self._bump_needed = False
        self.fatal_error: MinibrokerError | None = None
        self.closed = False
        # Why appends fail: fatal error, closed, or (transactional) no transaction begun,
        # which the transaction manager says (`refuse`).
        self._refused: MinibrokerError | None = None
        self._txn: TransactionGate | None = None  # set by the transaction manager

        self._topics: dict[str, dict[int, _PartitionState]] = {}
        self._states: list[_PartitionState] = []
        self._drain_index = 0
        self._buffered = 0
        self._incomplete: set[ProducerBatch] = set()
        self._in_flight = 0
        self._flushing = 0
        self._sender_wake_at = -math.inf

        self.metrics: dict[str, float] = {
            "records_sent": 0,
            "record_bytes_sent": 0,
            "batches_sent": 0,
            "requests_sent": 0,
            "batch_retries": 0,
            "record_errors": 0,
            "epoch_bumps": 0,
            "transactions_committed": 0,
            "transactions_aborted": 0,
        }

    # ------------------------------------------------------------------ appending

    def append(
        self,
        topic: str,
        partition: int,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        on_delivery: DeliveryCallback | None,
    ) -> RecordHandle:
        """Add one record to its partition's open batch (the hot path of send()).

        Raises BufferFull when a new batch would not fit in buffer_memory."""
        size = RECORD_OVERHEAD
        if value is not None:
            size += len(value)
        if key is not None:
            size += len(key)
        if headers:
            size = record_size(key, value, headers)
        # acquire/release rather than `with`: 0.1 µs less per record on CPython 3.11.
        lock = self.lock
        lock.acquire()
        try:
            if self._refused is not None:
                raise self._refused
            try:
                state = self._topics[topic][partition]
            except KeyError:
                state = self._new_state(topic, partition)
            batch = state.open
            if batch is None or (batch.size + size > batch.limit and not self._grow(state, size)):
                batch = self._open_batch(state, topic, partition, timestamp_ms, size)
            delta = timestamp_ms - batch.base_ts
            parts = batch.parts
            if key is None and headers is None and value is not None and 0 <= delta < 0x80:
                # record_parts' keyless case, inline: the hot path of send()
                parts += (VALUE_HEADS[len(value) << 7 | delta], value, NIL)
            else:
                parts += record_parts(delta, key, value, headers)
            index = batch.record_count
            batch.record_count = index + 1
            if timestamp_ms > batch.max_ts:
                batch.max_ts = timestamp_ms
            batch.size = filled = batch.size + size
            if on_delivery is not None:
                if batch.callbacks is None:
                    batch.callbacks = []
                batch.callbacks.append((index, timestamp_ms, on_delivery))
            if filled + size > batch.limit and not self._grow(state, size):
                self._seal(state, batch)
            return _tuple_new(RecordHandle, (batch, index, timestamp_ms))
        finally:
            lock.release()

    def _open_batch(
        self, state: _PartitionState, topic: str, partition: int, timestamp_ms: int, size: int
    ) -> ProducerBatch:
        """A new open batch for the partition, with buffer memory reserved for it.

        Memory is reserved per batch (batch_size, or the record's size if larger), as
        Kafka's BufferPool does, so the per-record path does no accounting."""
        if size + HEADER_BYTES > self.max_request_size:
            raise RecordTooLargeError(
                f"record of {size} bytes exceeds max_request_size {self.max_request_size}"
            )
        reserve = max(self.batch_size, size + HEADER_BYTES)
        if self._buffered + reserve > self.buffer_memory:
            raise BufferFull(reserve)
        if state.open is not None:
            self._seal(state, state.open)
        now_ms = self.clock()
        batch = ProducerBatch(topic, partition, timestamp_ms, now_ms)
        batch.reserved = batch.limit = reserve
        self._buffered += reserve
        state.open = batch
        state.queue.append(batch)
        self._incomplete.add(batch)
        if now_ms + self.linger_ms < self._sender_wake_at:
            self._sender_wake_at = -math.inf
            self.wakeup()
        return batch

    def _grow(self, state: _PartitionState, size: int) -> bool:
        """Let the partition's open batch take `size` more bytes than its limit, by up to
        another batch_size (and max_request_size in all), when its pipeline is full: every
        batch that the sender can have in flight for it is in flight or queued ahead, so a
        new batch would only wait behind them. The open batch then carries what arrives
        meanwhile, and each round trip (an fsync at acks=all) carries more bytes.

        Kafka's producer never grows a batch past batch.size; with adaptive_batching off
        neither does this one. At low load the pipeline is never full: nothing changes."""
        batch = state.open
        if not self.adaptive_batching or batch is None:
            return False
        if state.in_flight + len(state.queue) - 1 < self.max_in_flight:
            return False
        step = min(self.batch_size, self._grow_max - batch.limit)
        if batch.size + size > batch.limit + step or self._buffered + step > self.buffer_memory:
            return False
        batch.limit += step
        batch.reserved += step
        self._buffered += step
        # Full by batch_size's measure: the sticky partitioner moves on as from a sealed batch.
        self.on_batch_full(batch.topic, batch.partition)
        return True

    def append_encoded(
        self,
        topic: str,
        partition: int,
        payload: bytes,
        record_count: int,
        timestamp_ms: int,
        on_delivery: DeliveryCallback | None = None,
    ) -> ProducerBatch:
        """Queue an already encoded run of records (a send_batch chunk) as its own batch.

        `on_delivery(error, metadata of its first record)` runs once it finishes."""
        size = HEADER_BYTES + len(payload)
        with self.lock:
            if self._refused is not None:
                raise self._refused
            if size > self.max_request_size:
                raise RecordTooLargeError(
                    f"batch of {size} bytes exceeds max_request_size {self.max_request_size}"
                )
            if self._buffered + size > self.buffer_memory:
                raise BufferFull(size)
            try:
                state = self._topics[topic][partition]
            except KeyError:
                state = self._new_state(topic, partition)
            if state.open is not None:
                self._seal(state, state.open)
            batch = ProducerBatch(topic, partition, timestamp_ms, self.clock())
            batch.payload = payload
            batch.record_count = record_count
            batch.size = batch.reserved = batch.limit = size
            batch.sealed = True
            if on_delivery is not None:
                batch.callbacks = [(0, timestamp_ms, on_delivery)]
            state.queue.append(batch)
            self._incomplete.add(batch)
            self._buffered += size
            if self._sender_wake_at > batch.created_ms:
                self._sender_wake_at = -math.inf
                self.wakeup()
            return batch

    def wait_for_space(self, reserve: int, timeout_s: float) -> bool:
        """Block the calling thread until a new batch of `reserve` bytes fits in
        buffer_memory or appends are refused (closed, fatal); False after `timeout_s`.

        For a caller that is not on the event loop: the sync face's send() waits
        here instead of crossing to the I/O thread and back for every batch."""
        with self.lock:
            self._space_waiters += 1
            try:
                return self._space.wait_for(
                    lambda: (
                        self._refused is not None or self._buffered + reserve <= self.buffer_memory
                    ),
                    max(timeout_s, 0.0),
                )
            finally:
                self._space_waiters -= 1

    def _new_state(self, topic: str, partition: int) -> _PartitionState:
        state = _PartitionState(topic)
        self._topics.setdefault(topic, {})[partition] = state
        self._states.append(state)
        return state

    def _seal(self, state: _PartitionState, batch: ProducerBatch) -> None:
        """Close `batch` to appends: it is sendable now, linger or not."""
        batch.sealed = True
        if state.open is batch:
            state.open = None
            self.on_batch_full(batch.topic, batch.partition)
        if self._sender_wake_at > batch.created_ms:
            self._sender_wake_at = -math.inf
            self.wakeup()

    # ------------------------------------------------------------------ draining

    def drain(self, now_ms: float, max_requests: int) -> list[list[ProducerBatch]]:
        """Take the batches to send now, as up to `max_requests` produce requests.

        Each request holds at most one batch per partition and at most
        max_request_size bytes. Drained batches are in flight until `on_response`
        or `on_connection_lost` reports them back."""
        with self.lock:
            self._sender_wake_at = -math.inf
            if self._needs_producer_id or self.fatal_error is not None:
                return []
            requests: list[list[ProducerBatch]] = []
            states = self._states
            count = len(states)
            while len(requests) < max_requests:
                request: list[ProducerBatch] = []
                request_bytes = 0
                for i in range(count):
                    state = states[(self._drain_index + i) % count]
                    batch = self._sendable_head(state, now_ms)
                    if batch is None or (
                        request and request_bytes + batch.size > self.max_request_size
                    ):
                        continue
                    state.queue.popleft()
                    if state.open is batch:
                        state.open = None
                        batch.sealed = True
                    if batch.order is None:
                        batch.order = state.next_order
                        state.next_order += 1
                        if self.idempotent:
                            batch.sequence = state.next_sequence
                            state.last_sequence = (
                                state.next_sequence + batch.record_count - 1
                            ) % SEQUENCE_MODULUS
                            state.next_sequence = (state.last_sequence + 1) % SEQUENCE_MODULUS
                    batch.in_flight = True
                    batch.attempts += 1
                    if batch.attempts > 1:
                        self.metrics["batch_retries"] += 1
                    state.in_flight += 1
                    self._in_flight += 1
                    request.append(batch)
                    request_bytes += batch.size
                if not request:
                    break
                self._drain_index = (self._drain_index + 1) % max(count, 1)
                requests.append(request)
            return requests

    def _sendable_head(self, state: _PartitionState, now_ms: float) -> ProducerBatch | None:
        if not state.queue or state.broken:
            return None
        batch = state.queue[0]
        if self._bump_needed and not batch.unresolved:
            return None
        if batch.retry_at_ms > now_ms:
            return None
        if not self._is_lingering_over(batch, now_ms):
            return None
        return batch

    def _is_lingering_over(self, batch: ProducerBatch, now_ms: float) -> bool:
        return (
            batch.sealed
            or batch.limit > self.batch_size  # grew: full by batch_size's measure
            or self._flushing > 0
            or self.closed
            or batch.created_ms + self.linger_ms <= now_ms
        )

    def next_deadline(self, now_ms: float, can_send: bool = True) -> float:
        """The monotonic ms at which the sender should next call `drain`/`expire`.

        With `can_send` False (no connection or in-flight limit reached) batches
        becoming ready do not matter, only expiry; appends then skip waking the
        sender, which a response or reconnect will wake instead."""
        with self.lock:
            deadline = math.inf
            if self.fatal_error is None:
                expiry = self.delivery_timeout_ms if self._expiring() else math.inf
                for state in self._states:
                    if not state.queue:
                        continue
                    head = state.queue[0]
                    deadline = min(deadline, head.created_ms + expiry)
                    if can_send and not state.broken and not self._needs_producer_id:
                        if self._bump_needed and not head.unresolved:
                            continue
                        ready = head.retry_at_ms
                        if not (
                            head.sealed
                            or head.limit > self.batch_size
                            or self._flushing
                            or self.closed
                        ):
                            ready = max(ready, head.created_ms + self.linger_ms)
                        deadline = min(deadline, ready)
            self._sender_wake_at = deadline if can_send else -math.inf
            return max(deadline, now_ms) if deadline != math.inf else math.inf

    def sender_needed(self) -> bool:
        """Whether an answer must wake the sender: False only while it sleeps on a
        deadline appends know of (so they wake it when they need it), nothing waits to
        be sent, and no producer id, epoch bump or shutdown needs it. A wake for nothing
        cost a waiting caller (`flush()`, a commit) the sender's turn, about 40 µs,
        which ran before the caller's task."""
        with self.lock:
            return (
                self._sender_wake_at == -math.inf
                or self.closed
                or self.fatal_error is not None
                or self._needs_producer_id
                or self._bump_needed
                # Every unfinished batch in flight: none queued (a split's parent counts
                # as queued; a batch finished while in flight, by a fatal error or a
                # close, makes the counts differ too, and those wake it anyway).
                or len(self._incomplete) != self._in_flight
            )

    # ------------------------------------------------------------------ outcomes

    def on_response(
        self,
        batch: ProducerBatch,
        error: int,
        base_offset: int,
        now_ms: float,
        message: str | None = None,
    ) -> list[ProducerBatch]:
        """Apply the broker's answer for one batch; returns the batches now finished."""
        with self.lock:
            state = self._landed(batch)
            if batch.finished:
                return []
            done: list[ProducerBatch] = []
            if error != ErrorCode.NONE and self._txn is not None and self._txn.commit_landed:
                self._fail(batch, error_for(error, f"produce to {batch.topic}", message), done)
            elif error == ErrorCode.NONE or (
                error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and self.idempotent
            ):
                # DUPLICATE_SEQUENCE_NUMBER: appended long ago; the offset is no longer known.
                offset = base_offset if error == ErrorCode.NONE else -1
                self._finish(batch, None, offset, done)
            elif error in FENCING_CODES or (self.transactional and error in TXN_FATAL_CODES):
                self._fail_everything(error_for(error, "produce", message), done)
            elif (
                self.idempotent
                and not self.transactional
                and error
                in (
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    ErrorCode.UNKNOWN_PRODUCER_ID,
                )
            ):
                if not state.broken:
                    log.info(
                        "%s for %s-%s seq %s: bumping the epoch (KIP-360)",
                        ErrorCode.name_of(error),
                        batch.topic,
                        batch.partition,
                        batch.sequence,
                    )
                    self._bump_needed = True
                state.broken = True
                batch.unresolved = False
                self._retry(state, batch, now_ms, error, message, backoff=False, done=done)
            elif error == ErrorCode.MESSAGE_TOO_LARGE and self._split(state, batch):
                # Nothing was appended; the pieces take its sequence range, so the later
                # batches' sequences still follow on and no epoch bump is needed.
                state.broken = True
            elif error in RETRIABLE:
                state.broken = True
                # These may leave the batch appended; other retriable errors reject it before
                # the log is touched, which says nothing about earlier attempts either way.
                if error in MAYBE_APPENDED:
                    batch.unresolved = True
                self._retry(state, batch, now_ms, error, message, backoff=True, done=done)
            else:
                state.broken = True
                self._fail(batch, error_for(error, f"produce to {batch.topic}", message), done)
            if state.in_flight == 0:
                state.broken = False
            return done

    def on_connection_lost(
        self, batches: Sequence[ProducerBatch], now_ms: float, reason: str
    ) -> list[ProducerBatch]:
        """The request carrying `batches` got no answer: outcome unknown, retry them."""
        with self.lock:
            done: list[ProducerBatch] = []
            for batch in batches:
                state = self._landed(batch)
                if batch.finished:
                    continue
                state.broken = True
                batch.unresolved = True
                self._retry(state, batch, now_ms, None, reason, backoff=True, done=done)
            for batch in batches:
                state = self._topics[batch.topic][batch.partition]
                if state.in_flight == 0:
                    state.broken = False
            return done

    def on_sent_without_ack(self, batches: Sequence[ProducerBatch]) -> list[ProducerBatch]:
        """acks=0: a batch is done once written; its offset stays unknown (-1)."""
        with self.lock:
            done: list[ProducerBatch] = []
            for batch in batches:
                self._landed(batch)
                if not batch.finished:
                    self._finish(batch, None, -1, done)
            return done

    def expire(self, now_ms: float, cause: BaseException | None = None) -> list[ProducerBatch]:
        """Fail queued batches older than delivery_timeout_ms (creation to now); `cause`,
        why they could not be sent (the connection's error), is named and chained."""
        with self.lock:
            done: list[ProducerBatch] = []
            if not self._expiring():
                return done
            limit = now_ms - self.delivery_timeout_ms
            for state in self._states:
                queue = state.queue
                while queue and queue[0].created_ms <= limit:
                    batch = queue.popleft()
                    if state.open is batch:
                        state.open = None
                    error = DeliveryTimeoutError(
                        f"{batch.record_count} record(s) for {batch.topic}-{batch.partition} "
                        f"not acknowledged within delivery_timeout_ms={self.delivery_timeout_ms}"
                        f" after {batch.attempts} attempt(s)"
                        + ("" if cause is None else f"; {cause}")
                    )
                    error.__cause__ = cause
                    self._fail(batch, error, done)
            return done

    def _expiring(self) -> bool:
        """Whether batches expire now (expire() and next_deadline() alike): not while the
        transaction manager holds a commit in doubt."""
        return self._txn is None or self._txn.may_expire()

    def fail_all(self, error: MinibrokerError, *, fatal: bool = False) -> list[ProducerBatch]:
        """Finish every unfinished batch with `error`; `fatal` also refuses all later records."""
        with self.lock:
            if fatal:
                self.set_fatal(error)
            done: list[ProducerBatch] = []
            self._fail_everything(error, done)
            return done

    def _landed(self, batch: ProducerBatch) -> _PartitionState:
        state = self._topics[batch.topic][batch.partition]
        if batch.in_flight:
            batch.in_flight = False
            state.in_flight -= 1
            self._in_flight -= 1
        return state

    def _retry(
        self,
        state: _PartitionState,
        batch: ProducerBatch,
        now_ms: float,
        error: int | None,
        message: str | None,
        *,
        backoff: bool,
        done: list[ProducerBatch],
    ) -> None:
        if self._txn is not None and self._txn.aborting:
            self._finish(batch, TransactionAbortedError("the transaction was aborted"), -1, done)
            return
        if batch.attempts > self.retries:
            reason = (
                ConnectionLostError(f"produce to {batch.topic}-{batch.partition}: {message}")
                if error is None
                else error_for(error, f"produce to {batch.topic}", message)
            )
            self._fail(batch, reason, done)
            return
        if backoff:
            delay = self.retry_backoff_ms * 2 ** (batch.attempts - 1)
            batch.retry_at_ms = now_ms + min(delay, self.retry_backoff_max_ms)
        else:
            batch.retry_at_ms = now_ms
        # Back into the queue in sequence order: ahead of later batches and of new ones.
        queue = state.queue
        position = len(queue)
        for i, queued in enumerate(queue):
            if queued.order is None or queued.order > batch.order:  # type: ignore[operator]
                position = i
                break
        queue.insert(position, batch)

    def _split(self, state: _PartitionState, batch: ProducerBatch) -> bool:
        """Requeue the records of `batch`, refused as larger than the broker's
        message_max_bytes, as pieces of at most batch_size (Kafka's splitAndReenqueue);
        False when it cannot be split (one record, a send_batch chunk, a piece already,
        a transaction being aborted). The pieces take its place in the partition's order
        and, one after the other, its sequence range; it finishes when they all have.
        Batches grow no larger than this one from now on."""
        if (
            batch.record_count < 2
            or batch.payload is not None
            or batch.parent is not None
            or (self._txn is not None and self._txn.aborting)
        ):
            return False
        records = msgpack.unpackb(join_records(batch.parts, batch.record_count), raw=False)
        pieces: list[ProducerBatch] = []
        piece: ProducerBatch | None = None
        for index, (delta, key, value, headers) in enumerate(records):
            size = record_size(key, value, headers)
            if piece is None or piece.size + size > self.batch_size:
                piece = ProducerBatch(batch.topic, batch.partition, batch.base_ts, batch.created_ms)
                piece.parent, piece.first_index = batch, index
                piece.sealed = True
                pieces.append(piece)
            piece.parts += record_parts(delta, key, value, headers)
            piece.record_count += 1
            piece.size += size
            piece.max_ts = max(piece.max_ts, batch.base_ts + delta)
        if len(pieces) < 2:
            return False
        log.info(
            "MESSAGE_TOO_LARGE for %s-%s: %d records (%d bytes) split into %d batches",
            batch.topic,
            batch.partition,
            batch.record_count,
            batch.size,
            len(pieces),
        )
        self._grow_max = min(self._grow_max, batch.size - 1)
        sequence = batch.sequence
        assert batch.order is not None
        for number, piece in enumerate(pieces):
            piece.order = batch.order + number / len(pieces)
            piece.limit = piece.size
            if sequence is not None:
                piece.sequence = sequence
                sequence = (sequence + piece.record_count) % SEQUENCE_MODULUS
            self._incomplete.add(piece)
        batch.pieces = pieces
        batch.parts, batch.encoded = [b""], None
        queue = state.queue
        order = batch.order
        position = next(
            (i for i, q in enumerate(queue) if q.order is None or q.order > order), len(queue)
        )
        for offset, piece in enumerate(pieces):
            queue.insert(position + offset, piece)
        return True

    def _finish(
        self,
        batch: ProducerBatch,
        error: BaseException | None,
        base_offset: int,
        done: list[ProducerBatch],
    ) -> None:
        batch.finished = True
        batch.error = error
        batch.base_offset = base_offset
        batch.encoded = None
        batch.payload = None
        self._incomplete.discard(batch)
        self._buffered -= batch.reserved
        if self._space_waiters:
            self._space.notify_all()
        if batch.pieces is not None:
            pass  # split: its pieces were counted
        elif error is None:
            self.metrics["records_sent"] += batch.record_count
            self.metrics["record_bytes_sent"] += batch.size
            self.metrics["batches_sent"] += 1
        else:
            self.metrics["record_errors"] += batch.record_count
        done.append(batch)
        parent = batch.parent
        if parent is not None and not parent.finished:
            assert parent.pieces is not None
            if all(piece.finished for piece in parent.pieces):
                first_error = next((p.error for p in parent.pieces if p.error is not None), None)
                self._finish(parent, first_error, parent.pieces[0].base_offset, done)

    def _fail(self, batch: ProducerBatch, error: BaseException, done: list[ProducerBatch]) -> None:
        txn = self._txn
        if txn is not None:
            if txn.commit_landed:
                self._finish(batch, None, -1, done)  # written, whatever befell this resend
                return
            self._finish(batch, error, -1, done)
            txn.batch_failed(error, done)
            return
        if self.idempotent and batch.sequence is not None:
            # Its sequence range is now a hole the broker will never see filled.
            self._bump_needed = True
        self._finish(batch, error, -1, done)

    def fail_queued(self, error: MinibrokerError, done: list[ProducerBatch]) -> None:
        """Fail every batch not in flight with `error` (the transaction manager holds `lock`)."""
        for state in self._states:
            while state.queue:
                batch = state.queue.popleft()
                if state.open is batch:
                    state.open = None
                self._finish(batch, error, -1, done)

    def set_fatal(self, error: MinibrokerError) -> None:
        """Refuse every later record with `error` (the caller holds `lock`)."""
        self.fatal_error = self._refused = error
        if self._txn is not None:
            self._txn.fenced()
        if self._space_waiters:
            self._space.notify_all()

    def _fail_everything(self, error: MinibrokerError, done: list[ProducerBatch]) -> None:
        if error.code in (TXN_FATAL_CODES if self.transactional else FENCING_CODES):
            self.set_fatal(error)
        for state in self._states:
            state.queue.clear()
            state.open = None
        for batch in list(self._incomplete):
            self._finish(batch, error, -1, done)

    # ------------------------------------------------------------------ producer id

    def producer_id_request(self) -> tuple[int, int] | None:
        """(producer_id, epoch) to send in InitProducerId now, or None when none is due.

        (-1, -1) asks for a new id; the current pair asks for an epoch bump,
        which is only due once nothing is in flight and no outcome is unknown."""
        with self.lock:
            if self.fatal_error is not None:
                return None
            if self._needs_producer_id:
                return (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
            if not self._bump_needed or self._in_flight:
                return None
            for state in self._states:
                if state.queue and state.queue[0].unresolved:
                    return None
            return (self.producer_id, self.producer_epoch)

    def set_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """Adopt a new id or epoch: sequences restart at 0 on every partition."""
        with self.lock:
            if self.producer_id >= 0:
                self.metrics["epoch_bumps"] += 1
            self.adopt(producer_id, producer_epoch)

    def adopt(self, producer_id: int, producer_epoch: int) -> None:
        """Take the id and epoch, sequences restarting at 0 (the caller holds `lock`)."""
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._needs_producer_id = False
        self._bump_needed = False
        for state in self._states:
            sequence = 0
            state.last_sequence = None
            for batch in state.queue:
                if batch.sequence is not None:
                    batch.sequence = sequence
                    batch.unresolved = False
                    batch.retry_at_ms = 0.0
                    state.last_sequence = (sequence + batch.record_count - 1) % SEQUENCE_MODULUS
                    sequence = (state.last_sequence + 1) % SEQUENCE_MODULUS
            state.next_sequence = sequence
            state.broken = False

    def reset_producer_id(self) -> None:
        """Ask for a brand new producer id (the broker no longer knows ours)."""
        with self.lock:
            self._needs_producer_id = True

    # ------------------------------------------------------------------ for transactions

    def attach_transactions(self, gate: TransactionGate) -> None:
        """Ask `gate`, the transaction manager, about the batches (it holds `lock`)."""
        self._txn = gate

    def refuse(self, error: MinibrokerError | None) -> None:
        """Refuse appends with `error`, or accept them (the caller holds `lock`)."""
        self._refused = error
        if error is not None and self._space_waiters:
            self._space.notify_all()

    def set_ending(self, ending: bool) -> None:
        """A transaction starts or stops ending: its batches go out without lingering
        meanwhile (the caller holds `lock`)."""
        if ending:
            self._flushing += 1
            self._sender_wake_at = -math.inf
            self.wakeup()
        else:
            self._flushing -= 1

    def unfinished_batches(self) -> list[ProducerBatch]:
        """The batches not finished yet (the caller holds `lock`)."""
        return list(self._incomplete)

    def last_sequences(self) -> dict[tuple[str, int], int] | None:
        """Each partition's last sequence at this epoch when every batch was sent and no
        epoch bump or fatal error stands in the way, else None (the caller holds `lock`)."""
        if (
            self.fatal_error is not None
            or self._bump_needed
            or any(state.queue for state in self._states)
        ):
            return None
        return {
            (topic, partition): state.last_sequence
            for topic, states in self._topics.items()
            for partition, state in states.items()
            if state.last_sequence is not None
        }

    def finish_as_written(self, done: list[ProducerBatch]) -> None:
        """Finish every unanswered batch as written, offset unknown (-1), and send nothing
        more: a commit naming the last sequences landed (the caller holds `lock`)."""
        for state in self._states:
            state.queue.clear()
            state.open = None
        for batch in list(self._incomplete):
            if batch.pieces is None and not batch.finished:
                self._finish(batch, None, -1, done)

    # ------------------------------------------------------------------ flush / close

    def begin_flush(self) -> list[ProducerBatch]:
        """Make every batch sendable now; returns the batches to wait for."""
        with self.lock:
            self._flushing += 1
            self._sender_wake_at = -math.inf
            self.wakeup()
            return list(self._incomplete)

    def end_flush(self) -> None:
        with self.lock:
            self._flushing -= 1

    def close(self) -> None:
        """Refuse new records; what is buffered goes out without lingering."""
        with self.lock:
            self.closed = True
            if self.fatal_error is None:
                self._refused = MinibrokerError("producer is closed")
            if self._space_waiters:
                self._space.notify_all()
            self._sender_wake_at = -math.inf
            self.wakeup()

    def all_sent(self) -> bool:
        """Whether no batch waits to be sent (each unfinished one is in flight)."""
        with self.lock:
            return not any(state.queue for state in self._states)

    def incomplete(self) -> list[ProducerBatch]:
        """The batches not finished yet."""
        with self.lock:
            return list(self._incomplete)

    @property
    def unfinished(self) -> int:
        with self.lock:
            return len(self._incomplete)

    @property
    def buffered_bytes(self) -> int:
        return self._buffered
