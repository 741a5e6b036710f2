"""The producer's I/O: one task that drains the sans-IO accumulator onto a connection.

Modelled on Kafka's Sender. Each round it expires old batches, asks for a
producer id or an epoch bump when the accumulator says so, drains sendable
batches into Produce requests (at most max_in_flight_requests_per_connection
outstanding on one connection), and sleeps until the accumulator's next
deadline or a wakeup. Answers come back through the connection's callbacks and
are fed to the accumulator; batches it reports finished are signalled here,
outside its lock. An answer wakes the sender only when the accumulator has
something for it (`sender_needed`), so a caller waiting for the answer runs
first.

A transactional producer's own requests (InitProducerId, EndTxn, PrepareTxn)
are not part of the loop: the caller's task sends them with `request`, on the
same connection, once the accumulator says no batch is unfinished. The one
exception is a commit's first EndTxn, which names each partition's last
sequence and goes out in the same write as the last Produce requests
(`request_behind_batches`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from functools import partial
from typing import Any

import anyio
import anyio.abc

from client._portal import threadsafe_caller
from client.accumulator import ProducerBatch, RecordAccumulator, monotonic_ms
from client.config import ProducerConfig
from client.connection import Connection, Reconnector, ResponseCallback
from client.errors import (
    FENCING_CODES,
    AuthenticationFailedError,
    ConnectionLostError,
    MinibrokerError,
    MinibrokerTimeoutError,
    error_for,
)
from protocol.errors import RETRIABLE, ErrorCode
from protocol.framing import DEFAULT_FRAME_BYTES_MAX
from protocol.messages import (
    InitProducerIdRequest,
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    Request,
)

log = logging.getLogger(f"minibroker.{__name__}")


class Sender:
    """Runs the accumulator's decisions over the network; see the module doc."""

    def __init__(self, config: ProducerConfig, accumulator: RecordAccumulator) -> None:
        self.config = config
        self.acc = accumulator
        self._connector = Reconnector(
            config.servers,
            client_id=config.client_id,
            timeout_s=config.request_timeout_ms / 1000,
            max_response_bytes=DEFAULT_FRAME_BYTES_MAX,
            backoff_ms=config.reconnect_backoff_ms,
            backoff_max_ms=config.reconnect_backoff_max_ms,
            security=config.security,
        )
        self._conn: Connection | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._produce_in_flight = 0
        self._loop_thread: int | None = None
        self._call_soon: Any = None
        self._wakeup_event: anyio.Event | None = None
        self._space_event: anyio.Event | None = None
        # A request to send behind the batches (request_behind_batches) and its callback.
        self._trailer: tuple[Callable[[], Request | None], ResponseCallback] | None = None
        self._done: anyio.Event | None = None
        self._latency_sum_ms = 0.0
        self._latency_max_ms = 0.0
        self._latency_count = 0

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Run the sender in `tg` (on the current event loop)."""
        self._tg = tg
        self._loop_thread = threading.get_ident()
        self._call_soon = threadsafe_caller()
        self._wakeup_event = anyio.Event()
        self._done = anyio.Event()
        tg.start_soon(self._run, name="minibroker-sender")

    async def wait_done(self) -> None:
        """Wait until the sender has returned (closed accumulator, nothing unfinished)."""
        assert self._done is not None
        await self._done.wait()

    async def aclose(self) -> None:
        await self._connector.aclose()

    def wake(self) -> None:
        """Nudge the sender; from any thread, without waiting (the accumulator's wakeup)."""
        if self._loop_thread is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._set_wakeup()
        else:
            self._call_soon(self._set_wakeup)

    def _set_wakeup(self) -> None:
        if self._wakeup_event is not None:
            self._wakeup_event.set()

    async def connection(self, *, block: bool) -> Connection | None:
        """The current connection; with `block`, wait (backing off) until there is one, or
        raise NoBrokersAvailable while none was ever reached (Reconnector)."""
        assert self._tg is not None
        conn = await self._connector.get(self._tg, block=block, fail_unreached=block)
        if conn is not self._conn:
            self._conn = conn
            if conn is not None:
                self._produce_in_flight = 0
        return conn

    async def request(
        self, request: Request, deadline_ms: float, retriable: Collection[int] = RETRIABLE
    ) -> Any:
        """Send `request` from the caller's task and return its answer, resending it across
        lost connections and `retriable` errors (with backoff) until `deadline_ms`.

        For the transactional requests, which are safe to repeat: a repeated EndTxn
        gets the first one's answer, a repeated PrepareTxn error 0. Other errors are
        returned in the answer, for the caller to classify."""
        cfg = self.config
        attempts = 0
        cause: object = "no answer"  # of the last attempt that failed, for the timeout
        while True:
            remaining_s = (deadline_ms - monotonic_ms()) / 1000
            if remaining_s > 0:
                try:
                    with anyio.fail_after(remaining_s):
                        conn = await self.connection(block=True)
                        assert conn is not None
                        response = await conn.request(request, cfg.request_timeout_ms / 1000)
                except TimeoutError:
                    if self._conn is None or self._conn.closed:
                        cause = self._connector.last_error or cause
                except ConnectionLostError as exc:
                    cause = exc
                else:
                    if response.error not in retriable:
                        return response
                    cause = ErrorCode.name_of(response.error)
            remaining_s = (deadline_ms - monotonic_ms()) / 1000
            if remaining_s <= 0:
                raise MinibrokerTimeoutError(
                    f"{request.api} not completed within max_block_ms ({cause})"
                ) from (cause if isinstance(cause, BaseException) else None)
            attempts += 1
            backoff_ms = min(cfg.retry_backoff_ms * 2 ** (attempts - 1), cfg.retry_backoff_max_ms)
            await anyio.sleep(min(backoff_ms / 1000, remaining_s))

    async def request_behind_batches(
        self, make: Callable[[], Request | None], timeout_s: float
    ) -> Any | None:
        """Send the request `make` builds, once every batch is sent, in the same write as
        the transaction's last Produce requests (an EndTxn that then shares the batches'
        fsync round): its answer, or None when `make` had nothing to send (the transaction
        manager had no sequences to name: a batch failed), there was no answer within
        `timeout_s`, or the connection was lost."""
        done = anyio.Event()
        outcome: list[Any] = []

        def on_answer(response: Any | None, error: BaseException | None) -> None:
            outcome.append(response)
            done.set()

        self._trailer = (make, on_answer)
        self._set_wakeup()
        try:
            with anyio.move_on_after(timeout_s):
                await done.wait()
        finally:
            # Not sent (no connection within the time, or the caller was cancelled):
            # it must not go out later, behind batches of what comes next.
            if self._trailer is not None and self._trailer[1] is on_answer:
                self._trailer = None
        return outcome[0] if outcome else None

    def _take_trailer(self) -> tuple[Request, ResponseCallback] | None:
        """The request waiting to go behind the batches, once none waits to be sent."""
        if self._trailer is None or not self.acc.all_sent():
            return None
        make, on_answer = self._trailer
        self._trailer = None
        request = make()
        if request is None:
            on_answer(None, None)
            return None
        return request, on_answer

    async def wait_for_space(self, deadline_ms: float) -> None:
        """Wait until some batch finished (freeing buffer memory) or `deadline_ms`; raises
        once max_block_ms is up. Returns at once when appends fail anyway (closed, fatal)."""
        if self.acc.fatal_error is not None or self.acc.closed:
            return
        remaining = deadline_ms - monotonic_ms()
        if remaining <= 0:
            raise MinibrokerTimeoutError(
                f"no buffer space within max_block_ms (buffer_memory {self.config.buffer_memory})"
            )
        if self._space_event is None:
            self._space_event = anyio.Event()
        with anyio.move_on_after(remaining / 1000):
            await self._space_event.wait()

    def finish(self, done: list[ProducerBatch]) -> None:
        """Signal finished batches (events, callbacks) outside the accumulator lock."""
        for batch in done:
            batch.notify()
        if done and self._space_event is not None:
            self._space_event.set()
            self._space_event = None

    def connect_error(self) -> BaseException | None:
        """Why there is no connection now (the last attempt's error), or None when there is."""
        return None if self._connector.connected else self._connector.last_error

    def metrics(self) -> dict[str, float]:
        """The sender's part of the producer's metrics: request latency and connections."""
        count = self._latency_count
        return {
            "request_latency_avg_ms": self._latency_sum_ms / count if count else 0.0,
            "request_latency_max_ms": self._latency_max_ms,
            "requests_in_flight": self._produce_in_flight,
            "connection_failures": self._connector.total_failures,
        }

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        # Never raise: this task shares the caller's task group, whose code a crash would cancel.
        try:
            await self._loop()
        except AuthenticationFailedError as exc:
            # Fatal, as in Kafka's producer: every record fails with it, and so does every
            # later send (the Reconnector keeps it); nothing is left to send.
            self.finish(self.acc.fail_all(exc, fatal=True))
        except Exception as exc:
            log.exception("producer sender failed")
            error = MinibrokerError(f"producer sender failed: {exc!r}")
            self.finish(self.acc.fail_all(error, fatal=True))
        finally:
            self._loop_thread = None  # nothing left to wake
            assert self._done is not None
            self._done.set()

    async def _loop(self) -> None:
        acc = self.acc
        cfg = self.config
        max_in_flight = cfg.max_in_flight_requests_per_connection
        while True:
            self._wakeup_event = anyio.Event()
            now = monotonic_ms()
            self.finish(acc.expire(now, self.connect_error()))
            if acc.closed and acc.unfinished == 0:
                return
            conn = await self.connection(block=False)
            can_send = False
            if conn is not None:
                request = acc.producer_id_request()
                if request is not None:
                    await self._init_producer_id(conn, *request)
                    continue
                capacity = max_in_flight - self._produce_in_flight
                drained = acc.drain(now, capacity) if capacity > 0 else []
                trailer = self._take_trailer()
                if drained or trailer is not None:
                    await self._send_produce(conn, drained, trailer)
                can_send = not conn.closed and self._produce_in_flight < max_in_flight
            deadline = acc.next_deadline(now, can_send)
            if conn is None:
                retry_at = max(self._connector.next_attempt_ms, now + cfg.reconnect_backoff_ms)
                deadline = min(deadline, retry_at)
            timeout = (deadline - monotonic_ms()) / 1000
            if timeout > 0:
                with anyio.move_on_after(timeout):
                    await self._wakeup_event.wait()

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
            self.acc.set_producer_id(response.producer_id, response.producer_epoch)
            log.info("producer id %s epoch %s", response.producer_id, response.producer_epoch)
        elif error in FENCING_CODES:
            self.finish(self.acc.fail_all(error_for(error, "InitProducerId"), fatal=True))
        elif error == ErrorCode.UNKNOWN_PRODUCER_ID and producer_id >= 0:
            self.acc.reset_producer_id()
        elif error in RETRIABLE:
            await anyio.sleep(cfg.retry_backoff_ms / 1000)
        else:
            self.finish(self.acc.fail_all(error_for(error, "InitProducerId"), fatal=True))

    async def _send_produce(
        self,
        conn: Connection,
        drained: list[list[ProducerBatch]],
        trailer: tuple[Request, ResponseCallback] | None = None,
    ) -> None:
        """One Produce request per list of batches, all in one write (Connection.send_many),
        with `trailer` behind them."""
        acc = self.acc
        cfg = self.config
        pid, epoch, compression = acc.producer_id, acc.producer_epoch, acc.compression
        transactional = acc.transactional
        acks = cfg.acks_int
        timeout_s = cfg.request_timeout_ms / 1000
        items: list[tuple[Request, ResponseCallback | None]] = []
        for batches in drained:
            by_topic: dict[str, list[ProducePartition]] = {}
            for batch in batches:
                by_topic.setdefault(batch.topic, []).append(
                    ProducePartition(
                        batch.partition,
                        memoryview(batch.wire(pid, epoch, compression, transactional)),
                    )
                )
            request = ProduceRequest(
                acks=acks,
                timeout_ms=cfg.request_timeout_ms,
                topics=[ProduceTopic(topic, parts) for topic, parts in by_topic.items()],
                transactional_id=cfg.transactional_id,
            )
            acc.metrics["requests_sent"] += 1
            if acks == 0:
                items.append((request, None))
                continue
            self._produce_in_flight += 1
            items.append((request, partial(self._on_produce_answer, batches, monotonic_ms())))
        if trailer is not None:
            items.append(trailer)
        sent = await conn.send_many(items, timeout_s)
        if acks == 0:
            for batches in drained:
                if sent:
                    self.finish(acc.on_sent_without_ack(batches))
                else:
                    self.finish(acc.on_connection_lost(batches, monotonic_ms(), "send failed"))

    def _on_produce_answer(
        self,
        batches: list[ProducerBatch],
        sent_ms: float,
        response: ProduceResponse | None,
        error: BaseException | None,
    ) -> None:
        self._produce_in_flight -= 1
        now = monotonic_ms()
        acc = self.acc
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
        self.finish(done)
        if self._trailer is not None or acc.sender_needed():
            self._set_wakeup()
