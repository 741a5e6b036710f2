"""The idempotent producer: one async core on AnyIO, and a sync face that wraps it.

`AsyncProducer` runs inside the caller's asyncio, uvloop or trio program. Its
sender task drains the sans-IO `RecordAccumulator` into Produce requests (at
most max_in_flight_requests_per_connection outstanding on one connection),
feeds the answers back, reconnects, and asks for producer ids and epoch bumps
when the accumulator says so.

`Producer` is the same core on a daemon thread's event loop. Its `send()` is
the hot path: it appends to the thread-safe accumulator on the caller's thread
and returns a `RecordHandle` (a batch and an index, no future per record); the
event loop is only touched when the sender has to be woken.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from client._portal import PortalThread, threadsafe_caller
from client.accumulator import (
    HEADER_BYTES,
    BatchFuture,
    BufferFull,
    DeliveryCallback,
    Headers,
    ProducerBatch,
    RecordAccumulator,
    RecordHandle,
)
from client.columns import Columns, to_bytes, to_column
from client.config import ProducerConfig
from client.connection import Connection, Reconnector
from client.errors import (
    FENCING_CODES,
    ConnectionLostError,
    MinibrokerError,
    MinibrokerTimeoutError,
    error_for,
)
from client.partitioner import Partitioner
from client.replies import metadata_request, partition_count
from client.types import BatchMetadata, RecordMetadata
from protocol.errors import RETRIABLE, ErrorCode
from protocol.framing import DEFAULT_FRAME_BYTES_MAX
from protocol.messages import (
    InitProducerIdRequest,
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
)

log = logging.getLogger(f"minibroker.{__name__}")

SlowPath = Callable[..., RecordHandle]

# Retry the metadata of a topic being auto-created this often while send() waits for it.
METADATA_RETRY_S = 0.05


class _MetadataMissing(Exception):
    """The partition count of a topic is not known yet (or `partition` is beyond it)."""


def _headers(headers: Any) -> list[tuple[str, bytes]]:
    items = headers.items() if isinstance(headers, dict) else headers
    return [
        (name, value if value.__class__ is bytes else to_bytes(value, "header value"))
        for name, value in items
    ]


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


class AsyncProducer:
    """Kafka-style idempotent producer for asyncio, uvloop and trio programs.

    Use `async with AsyncProducer(...) as p` (or `await start()` ... `await
    stop()` in the same task). Settings are Kafka's, see `ProducerConfig`."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "127.0.0.1:9092", **config: Any):
        self.config = ProducerConfig(bootstrap_servers=bootstrap_servers, **config)
        cfg = self.config
        self._partitioner = Partitioner(cfg.partitioner)
        self._acc = RecordAccumulator(
            batch_size=cfg.batch_size,
            buffer_memory=cfg.buffer_memory,
            linger_ms=cfg.linger_ms,
            max_request_size=cfg.max_request_size,
            retries=cfg.retries,
            delivery_timeout_ms=cfg.delivery_timeout_ms,
            retry_backoff_ms=cfg.retry_backoff_ms,
            retry_backoff_max_ms=cfg.retry_backoff_max_ms,
            idempotent=bool(cfg.enable_idempotence),
            compression=cfg.compression,
            clock=_monotonic_ms,
            wakeup=self._wake,
            on_batch_full=self._on_batch_full,
        )
        self._partition_counts: dict[str, int] = {}
        self._append = self._make_append(self._raise_slow_path)
        self._connector = Reconnector(
            cfg.servers,
            client_id=cfg.client_id,
            timeout_s=cfg.request_timeout_ms / 1000,
            max_response_bytes=DEFAULT_FRAME_BYTES_MAX,
            backoff_ms=cfg.reconnect_backoff_ms,
            backoff_max_ms=cfg.reconnect_backoff_max_ms,
        )
        self._conn: Connection | None = None
        self._produce_in_flight = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._loop_thread: int | None = None
        self._call_soon: Any = None
        self._wakeup_event: anyio.Event | None = None
        self._space_event: anyio.Event | None = None
        self._sender_done: anyio.Event | None = None
        self._latency_sum_ms = 0.0
        self._latency_max_ms = 0.0
        self._latency_count = 0
        self._state = "new"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect and start the sender; call `stop()` from the same task afterwards."""
        if self._state != "new":
            raise MinibrokerError(f"producer cannot start: it is {self._state}")
        self._state = "running"
        self._loop_thread = threading.get_ident()
        self._call_soon = threadsafe_caller()
        self._wakeup_event = anyio.Event()
        self._sender_done = anyio.Event()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._sender, name="minibroker-sender")

    async def stop(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (waiting up to `timeout` s), then close.

        Records still undelivered at the timeout fail with MinibrokerError."""
        await self._drain(timeout)
        if self._state != "drained":
            self._state = "closed"
            return
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._connector.aclose()
        self._state = "closed"
        await self._tg.__aexit__(None, None, None)

    async def _drain(self, timeout: float | None) -> None:
        """The part of stop() that may run in any task: refuse new records, deliver the rest."""
        if self._state != "running":
            return
        self._state = "closing"
        self._acc.close()
        assert self._sender_done is not None
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            await self._sender_done.wait()
        self._finish(self._acc.fail_all(MinibrokerError("producer closed before delivery")))
        self._state = "drained"

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ sending

    async def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers | dict[str, bytes] = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> RecordHandle:
        """Queue one record; `await` the returned handle for its RecordMetadata.

        Waits for topic metadata on first use of a topic and for buffer space
        when buffer_memory is used up (up to max_block_ms each)."""
        deadline = _monotonic_ms() + self.config.max_block_ms
        while True:
            try:
                return self._append(
                    topic, value, key, partition, headers, timestamp_ms, on_delivery
                )
            except _MetadataMissing:
                await self._load_metadata(topic, partition, deadline)
            except BufferFull:
                await self._wait_for_space(deadline)

    @staticmethod
    def _raise_slow_path(reason: Exception, *_args: Any) -> RecordHandle:
        raise reason

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers | dict[str, bytes] = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        handle = await self.send(topic, value, key, partition, headers, timestamp_ms)
        return await handle

    async def send_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        partition: int | None = None,
        headers: Sequence[Headers] | None = None,
        on_delivery: BatchCallback | None = None,
    ) -> BatchFuture:
        """Queue many records at once (lists or Arrow arrays), encoded per wire batch in C.

        `on_delivery(error, [BatchMetadata, ...] or None)` runs once all of them finished."""
        deadline = _monotonic_ms() + self.config.max_block_ms
        batches: list[ProducerBatch] = []
        for reason in self._batch_steps(
            topic, values, keys, partition, headers, on_delivery, batches
        ):
            if isinstance(reason, BufferFull):
                await self._wait_for_space(deadline)
            else:
                await self._load_metadata(topic, partition, deadline)
        return BatchFuture(batches)

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until all of it is acknowledged or failed."""
        batches = self._acc.begin_flush()
        try:
            with anyio.fail_after(math.inf if timeout is None else timeout):
                for batch in batches:
                    await batch.wait_async()
        except TimeoutError:
            raise MinibrokerTimeoutError(f"flush did not complete within {timeout} s") from None
        finally:
            self._acc.end_flush()

    async def partitions_for(self, topic: str) -> set[int]:
        count = self._partition_counts.get(topic)
        if count is None:
            await self._load_metadata(topic, None, _monotonic_ms() + self.config.max_block_ms)
            count = self._partition_counts[topic]
        return set(range(count))

    def metrics(self) -> dict[str, float]:
        """Counters of this producer (Kafka-like names): records, retries, latency, buffer."""
        acc = self._acc
        m = dict(acc.metrics)
        batches = m["batches_sent"]
        m["batch_size_avg"] = m["records_sent"] / batches if batches else 0.0
        m["request_latency_avg_ms"] = (
            self._latency_sum_ms / self._latency_count if self._latency_count else 0.0
        )
        m["request_latency_max_ms"] = self._latency_max_ms
        m["requests_in_flight"] = self._produce_in_flight
        m["buffer_available_bytes"] = acc.buffer_memory - acc.buffered_bytes
        m["producer_id"] = acc.producer_id
        m["producer_epoch"] = acc.producer_epoch
        m["connection_failures"] = self._connector.total_failures
        return m

    # ------------------------------------------------------------------ shared with the sync face

    def _make_append(self, slow_path: SlowPath) -> Callable[..., RecordHandle]:
        """send()'s hot path as one closure with send()'s signature, thread-safe, non-blocking.

        When the topic's metadata is missing (or the partition is beyond it) or the
        buffer is full, it returns `slow_path(reason, *normalized arguments)`, which
        either raises (the async face then awaits) or blocks and retries (the sync
        face). A closure over locals instead of a method saves a Python call layer
        and the attribute lookups on the path every record takes."""
        counts = self._partition_counts
        choose = self._partitioner.partition
        append = self._acc.append
        time_ns = time.time_ns

        def send(
            topic: str,
            value: Any = None,
            key: Any = None,
            partition: int | None = None,
            headers: Any = None,
            timestamp_ms: int | None = None,
            on_delivery: DeliveryCallback | None = None,
        ) -> RecordHandle:
            if value is not None and value.__class__ is not bytes:
                value = to_bytes(value, "value")
            if key is not None and key.__class__ is not bytes:
                key = to_bytes(key, "key")
            headers = _headers(headers) if headers else None
            count = counts.get(topic)
            if count is None or (partition is not None and not 0 <= partition < count):
                return slow_path(
                    _MetadataMissing(),
                    topic,
                    value,
                    key,
                    partition,
                    headers,
                    timestamp_ms,
                    on_delivery,
                )
            try:
                return append(
                    topic,
                    choose(topic, key, count) if partition is None else partition,
                    time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms,
                    key,
                    value,
                    headers,
                    on_delivery,
                )
            except BufferFull as full:
                return slow_path(
                    full, topic, value, key, partition, headers, timestamp_ms, on_delivery
                )

        return send

    def _batch_steps(
        self,
        topic: str,
        values: Any,
        keys: Any,
        partition: int | None,
        headers: Sequence[Headers] | None,
        on_delivery: BatchCallback | None,
        batches: list[ProducerBatch],
    ) -> Iterator[_MetadataMissing | BufferFull]:
        """send_batch() as steps, for both faces: plan the wire batches, append them to
        the accumulator and to `batches`. Yields the reason whenever it has to wait
        (`_MetadataMissing` or `BufferFull`); the caller waits its way and resumes it."""
        while True:
            try:
                chunks = self._plan_batch(topic, values, keys, partition, headers)
                break
            except _MetadataMissing as missing:
                yield missing
        callbacks = _batch_callbacks(chunks, on_delivery)
        for chunk, callback in zip(chunks, callbacks, strict=True):
            while True:
                try:
                    batches.append(self._append_chunk(topic, *chunk, callback))
                    break
                except BufferFull as full:
                    yield full

    def _plan_batch(
        self,
        topic: str,
        values: Any,
        keys: Any,
        partition: int | None,
        headers: Sequence[Headers] | None,
    ) -> list[tuple[int, bytes, int, int]]:
        """Split and encode a send_batch call: [(partition, payload, record_count, timestamp)].

        Keyed records go to their key's partition; keyless ones fill one wire batch
        per sticky partition, which then moves on, as for send()."""
        count = self._partition_counts.get(topic)
        if count is None or (partition is not None and not 0 <= partition < count):
            raise _MetadataMissing
        columns = Columns(
            to_column(values, "values"),
            None if keys is None else to_column(keys, "keys"),
            None if headers is None else [_headers(h) if h else None for h in headers],
        )
        timestamp = time.time_ns() // 1_000_000
        limit = self.config.max_request_size - HEADER_BYTES
        if partition is None and columns.keys is not None:
            rows: dict[int, list[int]] = {}
            for i, key in enumerate(columns.keys):
                rows.setdefault(self._partitioner.partition(topic, key, count), []).append(i)
            chunks = []
            for p, selected in rows.items():
                part = columns.select(selected)
                for start, stop in part.bounds(limit):
                    chunks.append((p, part.encode(start, stop), stop - start, timestamp))
            return chunks
        chunks = []
        for start, stop in columns.bounds(limit):
            p = partition
            if p is None:
                p = self._partitioner.partition(topic, None, count)
                self._partitioner.batch_full(topic, p, count)
            chunks.append((p, columns.encode(start, stop), stop - start, timestamp))
        return chunks

    def _append_chunk(
        self,
        topic: str,
        partition: int,
        payload: bytes,
        record_count: int,
        timestamp: int,
        callback: DeliveryCallback | None,
    ) -> ProducerBatch:
        return self._acc.append_encoded(
            topic, partition, payload, record_count, timestamp, callback
        )

    def _on_batch_full(self, topic: str, partition: int) -> None:
        count = self._partition_counts.get(topic)
        if count:
            self._partitioner.batch_full(topic, partition, count)

    def _wake(self) -> None:
        """Nudge the sender; from any thread, without waiting."""
        if self._state not in ("running", "closing"):
            return
        if threading.get_ident() == self._loop_thread:
            self._set_wakeup()
        else:
            self._call_soon(self._set_wakeup)

    def _set_wakeup(self) -> None:
        if self._wakeup_event is not None:
            self._wakeup_event.set()

    # ------------------------------------------------------------------ metadata and space

    async def _load_metadata(self, topic: str, partition: int | None, deadline_ms: float) -> None:
        """Learn `topic`'s partition count (auto-creating it when the broker allows),
        trying until `deadline_ms` (max_block_ms after send() was called)."""
        while True:
            count = None
            with anyio.move_on_after(max(deadline_ms - _monotonic_ms(), 0) / 1000):
                count = await self._fetch_partition_count(topic)
            if count is not None and (partition is None or partition < count):
                self._partition_counts[topic] = count
                return
            if _monotonic_ms() >= deadline_ms:
                if count is None:
                    raise MinibrokerTimeoutError(
                        f"topic {topic!r} not available within max_block_ms"
                    )
                raise MinibrokerError(
                    f"partition {partition} of {topic!r} does not exist ({count} partitions)",
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                )
            await anyio.sleep(METADATA_RETRY_S)

    async def _fetch_partition_count(self, topic: str) -> int | None:
        try:
            conn = await self._connection(block=True)
            assert conn is not None
            response = await conn.request(
                metadata_request(topic, allow_auto_create=True),
                self.config.request_timeout_ms / 1000,
            )
        except ConnectionLostError:
            return None
        return partition_count(response, topic)

    def _space_wait_ms(self, deadline_ms: float) -> float:
        """How long both faces may still wait for buffer space; raises once max_block_ms is up."""
        remaining = deadline_ms - _monotonic_ms()
        if remaining <= 0:
            raise MinibrokerTimeoutError(
                f"no buffer space within max_block_ms (buffer_memory {self.config.buffer_memory})"
            )
        return remaining

    async def _wait_for_space(self, deadline_ms: float) -> None:
        if self._acc.fatal_error is not None or self._acc.closed:
            return  # the next append raises the reason
        remaining = self._space_wait_ms(deadline_ms)
        if self._space_event is None:
            self._space_event = anyio.Event()
        with anyio.move_on_after(remaining / 1000):
            await self._space_event.wait()

    # ------------------------------------------------------------------ the sender

    async def _sender(self) -> None:
        # Never raise: this task shares the caller's task group, whose code a crash would cancel.
        try:
            await self._sender_loop()
        except Exception as exc:
            log.exception("producer sender failed")
            error = MinibrokerError(f"producer sender failed: {exc!r}")
            self._finish(self._acc.fail_all(error, fatal=True))
        finally:
            assert self._sender_done is not None
            self._sender_done.set()

    async def _sender_loop(self) -> None:
        acc = self._acc
        cfg = self.config
        max_in_flight = cfg.max_in_flight_requests_per_connection
        while True:
            self._wakeup_event = anyio.Event()
            now = _monotonic_ms()
            self._finish(acc.expire(now))
            if acc.closed and acc.unfinished == 0:
                return
            conn = await self._connection(block=False)
            can_send = False
            if conn is not None:
                request = acc.producer_id_request()
                if request is not None:
                    await self._init_producer_id(conn, *request)
                    continue
                capacity = max_in_flight - self._produce_in_flight
                if capacity > 0:
                    for batches in acc.drain(now, capacity):
                        await self._send_produce(conn, batches)
                can_send = not conn.closed and self._produce_in_flight < max_in_flight
            deadline = acc.next_deadline(now, can_send)
            if conn is None:
                retry_at = max(self._connector.next_attempt_ms, now + cfg.reconnect_backoff_ms)
                deadline = min(deadline, retry_at)
            timeout = (deadline - _monotonic_ms()) / 1000
            if timeout > 0:
                with anyio.move_on_after(timeout):
                    await self._wakeup_event.wait()

    async def _connection(self, *, block: bool) -> Connection | None:
        assert self._tg is not None
        conn = await self._connector.get(self._tg, block=block)
        if conn is not self._conn:
            self._conn = conn
            if conn is not None:
                self._produce_in_flight = 0
        return conn

    async def _init_producer_id(self, conn: Connection, producer_id: int, epoch: int) -> None:
        cfg = self.config
        request = InitProducerIdRequest(
            transactional_id=cfg.transactional_id,
            transaction_timeout_ms=cfg.transaction_timeout_ms if cfg.transactional_id else None,
            producer_id=producer_id,
            producer_epoch=epoch,
        )
        try:
            response = await conn.request(request, cfg.request_timeout_ms / 1000)
        except ConnectionLostError:
            return
        error = response.error
        if error == ErrorCode.NONE:
            self._acc.set_producer_id(response.producer_id, response.producer_epoch)
            log.info("producer id %s epoch %s", response.producer_id, response.producer_epoch)
        elif error in FENCING_CODES:
            self._finish(self._acc.fail_all(error_for(error, "InitProducerId"), fatal=True))
        elif error == ErrorCode.UNKNOWN_PRODUCER_ID and producer_id >= 0:
            self._acc.reset_producer_id()
        elif error in RETRIABLE:
            await anyio.sleep(cfg.retry_backoff_ms / 1000)
        else:
            self._finish(self._acc.fail_all(error_for(error, "InitProducerId"), fatal=True))

    async def _send_produce(self, conn: Connection, batches: list[ProducerBatch]) -> None:
        acc = self._acc
        pid, epoch, compression = acc.producer_id, acc.producer_epoch, acc.compression
        by_topic: dict[str, list[ProducePartition]] = {}
        for batch in batches:
            by_topic.setdefault(batch.topic, []).append(
                ProducePartition(batch.partition, batch.wire(pid, epoch, compression))
            )
        request = ProduceRequest(
            acks=self.config.acks_int,
            timeout_ms=self.config.request_timeout_ms,
            topics=[ProduceTopic(topic, parts) for topic, parts in by_topic.items()],
            transactional_id=self.config.transactional_id,
        )
        timeout_s = self.config.request_timeout_ms / 1000
        acc.metrics["requests_sent"] += 1
        if self.config.acks_int == 0:
            if await conn.send(request, None, timeout_s):
                self._finish(acc.on_sent_without_ack(batches))
            else:
                self._finish(acc.on_connection_lost(batches, _monotonic_ms(), "send failed"))
            return
        self._produce_in_flight += 1
        callback = partial(self._on_produce_answer, batches, _monotonic_ms())
        await conn.send(request, callback, timeout_s)

    def _on_produce_answer(
        self,
        batches: list[ProducerBatch],
        sent_ms: float,
        response: ProduceResponse | None,
        error: BaseException | None,
    ) -> None:
        self._produce_in_flight -= 1
        now = _monotonic_ms()
        acc = self._acc
        if response is None:
            done = acc.on_connection_lost(batches, now, str(error))
        else:
            latency = now - sent_ms
            self._latency_sum_ms += latency
            self._latency_count += 1
            self._latency_max_ms = max(self._latency_max_ms, latency)
            top_error = response.error
            results: dict[tuple[str, int], ProducePartitionResponse] = {
                (entry.topic, part.partition): part
                for entry in response.topics
                for part in entry.partitions
            }
            done = []
            for batch in batches:
                result = results.get((batch.topic, batch.partition))
                if top_error:
                    done += acc.on_response(batch, top_error, -1, now, response.message)
                elif result is None:
                    done += acc.on_connection_lost([batch], now, "partition missing in response")
                else:
                    done += acc.on_response(
                        batch, result.error, result.base_offset, now, result.message
                    )
        self._finish(done)
        self._set_wakeup()

    def _finish(self, done: list[ProducerBatch]) -> None:
        """Signal finished batches (events, callbacks) outside the accumulator lock."""
        for batch in done:
            batch.notify()
        if done and self._space_event is not None:
            self._space_event.set()
            self._space_event = None


BatchCallback = Callable[[BaseException | None, list[BatchMetadata] | None], object]


def _batch_callbacks(
    chunks: list[tuple[int, bytes, int, int]], on_delivery: BatchCallback | None
) -> list[DeliveryCallback | None]:
    """One callback per wire batch; the last to finish calls `on_delivery` once.

    Wire batches finish on the I/O thread, possibly while later ones are still
    being appended on the caller's, hence the lock."""
    if on_delivery is None:
        return [None] * len(chunks)
    lock = threading.Lock()
    results: list[BatchMetadata | BaseException | None] = [None] * len(chunks)
    remaining = [len(chunks)]

    def bind(index: int, record_count: int) -> DeliveryCallback:
        def finished(error: BaseException | None, first: RecordMetadata) -> None:
            results[index] = error or BatchMetadata(
                first.topic, first.partition, first.offset, record_count
            )
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            on_delivery(failure, None if failure else results)  # type: ignore[arg-type]

        return finished

    return [bind(i, chunk[2]) for i, chunk in enumerate(chunks)]


def _close_at_exit(ref: weakref.ref[Producer]) -> None:
    producer = ref()
    if producer is not None:
        producer.close(producer.config.delivery_timeout_ms / 1000)


class Producer:
    """The synchronous producer: `AsyncProducer` on a private daemon thread.

    `send()` never crosses threads on the fast path; `get()` on its handle,
    `flush()` and `close()` block the caller. Also a context manager."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "127.0.0.1:9092", **config: Any):
        self._core = core = AsyncProducer(bootstrap_servers, **config)
        self.config = core.config
        self._acc = core._acc
        # The hot path: a closure with send()'s signature shadows the method below
        # (unless a subclass overrides send()).
        if type(self).send is Producer.send:
            self.send = core._make_append(self._send_slow)  # type: ignore[method-assign]
        self._thread = PortalThread("minibroker-producer")
        self._portal = self._thread.portal
        self._closed = False
        try:
            self._cm = self._portal.wrap_async_context_manager(core)
            self._cm.__enter__()
        except BaseException:
            self._thread.close()
            raise
        # Like kafka-python: records still buffered at interpreter exit are delivered first
        # (bounded by delivery_timeout_ms); the I/O thread is a daemon and would just die.
        self._close_at_exit_hook = partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._close_at_exit_hook)

    def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers | dict[str, bytes] = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> RecordHandle:
        """Queue one record; `.get(timeout)` on the handle waits for its RecordMetadata.

        `on_delivery(error, metadata)` runs once, on the producer's I/O thread.
        (Instances use the equivalent closure installed in __init__.)"""
        append = self._core._make_append(self._send_slow)
        return append(topic, value, key, partition, headers, timestamp_ms, on_delivery)

    def _send_slow(self, reason: Exception, *args: Any) -> RecordHandle:
        """Block for metadata or buffer space (up to max_block_ms), then append."""
        deadline = _monotonic_ms() + self.config.max_block_ms
        topic, partition = args[0], args[3]
        while True:
            self._block_for(reason, topic, partition, deadline)
            try:
                return self._core._append(*args)
            except (_MetadataMissing, BufferFull) as again:
                reason = again

    def send_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        partition: int | None = None,
        headers: Sequence[Headers] | None = None,
        on_delivery: BatchCallback | None = None,
    ) -> BatchFuture:
        """Queue many records (lists of bytes/str/None or Arrow arrays) with one call.

        Records are encoded on the calling thread, one msgpack call per wire
        batch of up to max_request_size bytes; `get()` returns one
        BatchMetadata per wire batch, and `on_delivery(error, metadata list or
        None)` runs once, on the I/O thread, when all of them finished."""
        deadline = _monotonic_ms() + self.config.max_block_ms
        batches: list[ProducerBatch] = []
        steps = self._core._batch_steps(
            topic, values, keys, partition, headers, on_delivery, batches
        )
        for reason in steps:
            self._block_for(reason, topic, partition, deadline)
        return BatchFuture(batches)

    def _block_for(
        self, reason: Exception, topic: str, partition: int | None, deadline: float
    ) -> None:
        """Block until what `reason` says is missing may be there: metadata or buffer space."""
        if isinstance(reason, _MetadataMissing):
            self._portal.call(self._core._load_metadata, topic, partition, deadline)
        else:
            assert isinstance(reason, BufferFull)
            remaining = self._core._space_wait_ms(deadline)
            self._acc.wait_for_space(reason.size, remaining / 1000)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and block until all of it is acknowledged or failed."""
        batches = self._acc.begin_flush()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            for batch in batches:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                batch.wait(remaining)
        except MinibrokerTimeoutError:
            raise MinibrokerTimeoutError(f"flush did not complete within {timeout} s") from None
        finally:
            self._acc.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (up to `timeout` s), then stop the I/O thread."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_at_exit_hook)
        try:
            self._portal.call(self._core._drain, timeout)
            self._cm.__exit__(None, None, None)
        finally:
            self._thread.close()

    def metrics(self) -> dict[str, float]:
        return self._core.metrics()

    def partitions_for(self, topic: str) -> set[int]:
        return self._portal.call(self._core.partitions_for, topic)

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["AsyncProducer", "BatchFuture", "BatchMetadata", "Producer", "RecordHandle"]
