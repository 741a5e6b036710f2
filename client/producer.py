"""The idempotent producer's two faces: `AsyncProducer` on AnyIO, `Producer` on a thread.

`AsyncProducer` runs inside the caller's asyncio, uvloop or trio program: it
picks partitions (with the partition counts of client/metadata.py), appends to
the sans-IO accumulator (client/accumulator.py) and runs the sender task
(client/sender.py) that turns batches into Produce requests.

With a `transactional_id`, both faces also run Kafka's transactions:
`init_transactions()`, then per transaction `begin_transaction()`, sends, and
`commit_transaction()` / `abort_transaction()` (or `transaction()` as a context
manager), or `prepare_transaction()` to hand a `TxnHandle` to whoever commits it.
`send_offsets_to_transaction()` puts a consumer group's offsets in the transaction
(consume-transform-produce exactly once). The state machine is the transaction
manager's (client/transaction_manager.py), which steers the accumulator; the
requests are sent from the caller's task (`Sender.request`).

`Producer` is an `AsyncProducer` on a daemon thread's event loop, driven only
through its public methods. Its `send()` is the hot path: `nonblocking_send`
appends on the caller's thread and returns a `RecordHandle` (a batch, an index
and a timestamp, no future per record); a send that has to wait for buffer
space waits on the caller's thread too, and only the first use of a topic
crosses to the event loop.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from client._portal import PortalThread
from client.accumulator import (
    HEADER_BYTES,
    BatchFuture,
    BufferFull,
    DeliveryCallback,
    Headers,
    ProducerBatch,
    RecordAccumulator,
    RecordHandle,
    monotonic_ms,
    record_size,
)
from client.columns import ArrowColumns, Columns, is_arrow, to_bytes, to_column
from client.config import ProducerConfig
from client.coordinator import commit_errors, commit_topics, normalize_offsets
from client.errors import MinibrokerError, MinibrokerTimeoutError
from client.metadata import PartitionCounts
from client.partitioner import Partitioner
from client.sender import Sender
from client.transaction_manager import TransactionManager
from client.types import (
    BatchMetadata,
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    RecordMetadata,
    TxnHandle,
)
from protocol.errors import RETRIABLE, ErrorCode
from protocol.messages import (
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    PrepareTxnRequest,
    TxnLastSequence,
    TxnLastSequences,
    TxnOffsetCommitRequest,
)

log = logging.getLogger(f"minibroker.{__name__}")
# A commit in doubt is asked again across every retriable error but the one that says the
# broker holds the transaction open without every batch: then the batches' answers decide.
_SETTLE_RETRIABLE = RETRIABLE - {ErrorCode.CONCURRENT_TRANSACTIONS}

SendFunction = Callable[..., RecordHandle]
BatchCallback = Callable[[BaseException | None, list[BatchMetadata] | None], object]


class _WouldBlock(Exception):
    """The async face's nonblocking send met a wait (metadata or buffer space)."""


def _would_block(*_args: Any) -> RecordHandle:
    raise _WouldBlock


def _headers(headers: Any) -> list[tuple[str, bytes]]:
    items = headers.items() if isinstance(headers, dict) else headers
    return [
        (name, value if value.__class__ is bytes else to_bytes(value, "header value"))
        for name, value in items
    ]


class AsyncProducer:
    """Kafka-style idempotent producer for asyncio, uvloop and trio programs.

    Use `async with AsyncProducer(...) as p` (or `await start()` ... `await
    stop()` in the same task). Settings are Kafka's, see `ProducerConfig`."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "127.0.0.1:9092", **config: Any):
        self.config = cfg = ProducerConfig(bootstrap_servers=bootstrap_servers, **config)
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
            adaptive_batching=cfg.adaptive_batching,
            max_in_flight=cfg.max_in_flight_requests_per_connection,
            idempotent=bool(cfg.enable_idempotence),
            transactional=cfg.transactional_id is not None,
            compression=cfg.compression,
            wakeup=lambda: self._sender.wake(),
            on_batch_full=self._on_batch_full,
        )
        self._txn = TransactionManager(self._acc)
        self._sender = Sender(cfg, self._acc)
        self._metadata = PartitionCounts(
            partial(self._sender.connection, block=True),
            self._sender.connect_error,
            request_timeout_s=cfg.request_timeout_ms / 1000,
            max_block_ms=cfg.max_block_ms,
            allow_auto_create=cfg.allow_auto_create_topics,
        )
        self._send_nowait = self.nonblocking_send(_would_block)
        self._tg: anyio.abc.TaskGroup | None = None
        self._state = "new"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect and start the sender; call `stop()` from the same task afterwards."""
        if self._state != "new":
            raise MinibrokerError(f"producer cannot start: it is {self._state}")
        self._state = "running"
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._sender.start(self._tg)

    async def stop(self, timeout: float | None = None) -> None:
        """Refuse new records, deliver what is buffered (waiting up to `timeout` s), close.

        Records still undelivered at the timeout fail with MinibrokerError. A transaction
        still open is aborted first, as Kafka's producer does (a prepared one is left
        to whoever holds its handle)."""
        if self._state != "running":
            self._state = "closed"
            return
        if self._txn.transaction_open:
            with anyio.move_on_after(math.inf if timeout is None else timeout):
                try:
                    await self.abort_transaction()
                except MinibrokerError as exc:
                    log.warning("could not abort the open transaction on close: %s", exc)
        self._state = "closing"
        self._acc.close()
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            await self._sender.wait_done()
        self._sender.finish(self._acc.fail_all(MinibrokerError("producer closed before delivery")))
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._sender.aclose()
        self._state = "closed"
        await self._tg.__aexit__(None, None, None)

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
        when buffer_memory is used up (up to max_block_ms each). Raises
        UnknownPartitionError at once for a partition the topic does not have,
        NoBrokersAvailable when no broker was ever reached (after one reconnect
        backoff cycle, about 1.6 s with the defaults: see client.connection.Reconnector),
        and MinibrokerTimeoutError naming what it saw when max_block_ms runs out."""
        deadline = monotonic_ms() + self.config.max_block_ms
        while True:
            try:
                return self._send_nowait(
                    topic, value, key, partition, headers, timestamp_ms, on_delivery
                )
            except _WouldBlock:
                if self._knows(topic, partition):
                    await self._sender.wait_for_space(deadline)
                else:
                    await self._metadata.load(topic, partition, deadline)

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

    def nonblocking_send(self, fallback: SendFunction) -> SendFunction:
        """send() as a plain function with send()'s arguments, for any thread: it never waits.

        When the record cannot be appended without waiting (the topic's partition
        count is not known yet, or buffer_memory is used up), it returns
        `fallback(topic, value, key, partition, headers, timestamp_ms, on_delivery)`
        instead, with value, key and headers already converted to bytes. The sync
        face installs it as its send(): a closure over locals instead of a method
        saves a call layer and the attribute lookups on the path every record takes."""
        counts = self._metadata.counts
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
                return fallback(topic, value, key, partition, headers, timestamp_ms, on_delivery)
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
            except BufferFull:
                return fallback(topic, value, key, partition, headers, timestamp_ms, on_delivery)

        return send

    def _knows(self, topic: str, partition: int | None) -> bool:
        """Whether the partition count of `topic` is known (and has `partition`)."""
        count = self._metadata.counts.get(topic)
        return count is not None and (partition is None or 0 <= partition < count)

    async def send_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        partition: int | None = None,
        headers: Sequence[Headers] | None = None,
        on_delivery: BatchCallback | None = None,
    ) -> BatchFuture:
        """Queue many records (lists of bytes/str/None or Arrow arrays) with one call.

        Records are encoded one msgpack array per wire batch of up to
        max_request_size bytes; the future's result is one BatchMetadata per
        wire batch, and `on_delivery(error, metadata list or None)` runs once,
        when all of them finished."""
        deadline = monotonic_ms() + self.config.max_block_ms
        while not self._knows(topic, partition):
            await self._metadata.load(topic, partition, deadline)
        chunks = self._plan_batch(topic, values, keys, partition, headers)
        batches: list[ProducerBatch] = []
        for chunk, callback in zip(chunks, _batch_callbacks(chunks, on_delivery), strict=True):
            while True:
                try:
                    batches.append(self._acc.append_encoded(topic, *chunk, callback))
                    break
                except BufferFull:
                    await self._sender.wait_for_space(deadline)
        return BatchFuture(batches)

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
        count = self._metadata.counts[topic]
        columns: Columns | ArrowColumns
        if headers is None and is_arrow(values) and (keys is None or is_arrow(keys)):
            # Encoded from the arrays' buffers: no Python object per row.
            columns = ArrowColumns(values, keys)
        else:
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
            target = partition
            if target is None:
                target = self._partitioner.partition(topic, None, count)
                self._partitioner.batch_full(topic, target, count)
            chunks.append((target, columns.encode(start, stop), stop - start, timestamp))
        return chunks

    def _on_batch_full(self, topic: str, partition: int) -> None:
        count = self._metadata.counts.get(topic)
        if count:
            self._partitioner.batch_full(topic, partition, count)

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until all of it is acknowledged or failed
        (at most delivery_timeout_ms; a record that could not be sent fails with
        DeliveryTimeoutError, chaining the connection's error). MinibrokerTimeoutError
        after `timeout` s, chaining the connection's error when there is no connection."""
        batches = self._acc.begin_flush()
        try:
            with anyio.fail_after(math.inf if timeout is None else timeout):
                for batch in batches:
                    await batch.wait_async()
        except TimeoutError:
            cause = self._sender.connect_error()
            why = "" if cause is None else f": {cause}"
            message = f"flush did not complete within {timeout} s{why}"
            raise MinibrokerTimeoutError(message) from cause
        finally:
            self._acc.end_flush()

    async def partitions_for(self, topic: str) -> set[int]:
        count = self._metadata.counts.get(topic)
        if count is None:
            count = await self._metadata.load(
                topic, None, monotonic_ms() + self.config.max_block_ms
            )
        return set(range(count))

    # ------------------------------------------------------------------ transactions

    async def init_transactions(self) -> None:
        """Bind the producer to its transactional_id (InitProducerId): every older producer
        with the same id is fenced, and its open or prepared transaction aborted.

        Call once after start(); call again after prepare_transaction() to go on
        with a new transaction (only once the prepared one was ended: this aborts
        it otherwise). Fencing raises ProducerFencedError and is fatal."""
        self._check_running()
        cfg = self.config
        self._txn.begin_init()
        response = await self._sender.request(
            InitProducerIdRequest(
                transactional_id=cfg.transactional_id,
                transaction_timeout_ms=cfg.transaction_timeout_ms,
            ),
            self._block_deadline(),
        )
        self._txn.on_init(
            response.error, response.producer_id, response.producer_epoch, response.message
        )

    async def begin_transaction(self) -> None:
        """Start a transaction: send() is accepted until it is committed, aborted or prepared.

        The broker starts it with the first batch; its transaction_timeout_ms runs from there."""
        self._txn.begin_transaction()

    async def commit_transaction(self) -> None:
        """Send every buffered record, wait for all answers, then commit (EndTxn).

        If any record of the transaction failed before the commit went out, nothing is
        committed: this raises TransactionAbortableError and only abort_transaction() is
        possible. After a MinibrokerTimeoutError the outcome is unknown (the broker may
        have committed): call it again to learn it; it is safe to repeat, and nothing
        else is allowed meanwhile."""
        self._check_running()
        txn = self._txn
        pending = txn.begin_commit()
        if pending and txn.commit_in_doubt is None:
            response = await self._sender.request_behind_batches(
                self._end_txn_at_last_sequences, self.config.request_timeout_ms / 1000
            )
            if response is not None and response.error == ErrorCode.NONE:
                await self._on_committed(response)
                return
            if response is not None:
                # Refused, so nothing changed; a batch failed meanwhile counts again.
                self._sender.finish(txn.on_commit_refused())
        if txn.commit_in_doubt is not None:
            await self._settle_commit()
            return
        await _wait_all(pending)
        txn.check_flushed()
        await self._end_transaction(committed=True)

    def _end_txn_at_last_sequences(self) -> EndTxnRequest | None:
        """The EndTxn to send behind the batches, or None when the commit must wait for
        their answers instead (TransactionManager.commit_sequences)."""
        sequences = self._txn.commit_sequences()
        return None if sequences is None else self._end_txn_behind(sequences)

    def _end_txn_behind(self, sequences: dict[tuple[str, int], int]) -> EndTxnRequest:
        """EndTxn(commit) naming each partition's last sequence: the broker commits only
        when its log holds every batch up to them, and otherwise changes nothing
        (CONCURRENT_TRANSACTIONS). Sent right behind the transaction's last Produce
        requests, a commit costs one round trip."""
        acc = self._acc
        transactional_id = self.config.transactional_id
        assert transactional_id is not None
        by_topic: dict[str, list[TxnLastSequence]] = {}
        for (topic, partition), last in sequences.items():
            by_topic.setdefault(topic, []).append(TxnLastSequence(partition, last))
        return EndTxnRequest(
            transactional_id=transactional_id,
            producer_id=acc.producer_id,
            producer_epoch=acc.producer_epoch,
            committed=True,
            last_sequences=[TxnLastSequences(t, parts) for t, parts in by_topic.items()],
        )

    async def _on_committed(self, response: EndTxnResponse) -> None:
        """The EndTxn naming the last sequences committed. A batch whose answer a lost
        connection took is resent and answered as the duplicate it is, with its offset;
        only then does the producer move to the next epoch, under which a resend would
        be a new batch. Bounded by delivery_timeout_ms: a batch that runs out is
        finished as written, its offset unknown."""
        self._txn.on_commit_landed()
        await _wait_all(self._acc.incomplete())
        self._on_end(True, response)

    async def _settle_commit(self) -> None:
        """The EndTxn(commit) sent behind the batches got no answer, so the broker may have
        committed; after that a batch's failure (its resend fenced, or timed out while
        the broker was down) says nothing about the transaction. Ask the same EndTxn
        again (a retry is answered from the transaction's recorded end) until the broker
        says: committed; or not committed for want of a batch (CONCURRENT_TRANSACTIONS),
        after which the batches' own answers decide, as before any commit was sent.
        MinibrokerTimeoutError at max_block_ms leaves the outcome unknown."""
        acc, txn = self._acc, self._txn
        deadline = self._block_deadline()
        attempts = 0
        while (sequences := txn.commit_in_doubt) is not None:
            response = await self._sender.request(
                self._end_txn_behind(sequences), deadline, _SETTLE_RETRIABLE
            )
            if response.error == ErrorCode.NONE:
                await self._on_committed(response)
                return
            if response.error != ErrorCode.CONCURRENT_TRANSACTIONS:
                self._on_end(True, response)
                return
            # Nothing is committed, and nothing will be until this producer asks again.
            # The doubt stays until a batch is known to have failed: another EndTxn sent
            # earlier may still be read behind this one.
            remaining_s = (deadline - monotonic_ms()) / 1000
            with anyio.move_on_after(max(remaining_s, 0)):
                await _wait_all(acc.incomplete())
            if acc.unfinished:
                raise MinibrokerTimeoutError(
                    "commit not completed within max_block_ms: the broker holds the "
                    "transaction open and its batches are still being sent; call "
                    "commit_transaction() again"
                )
            if txn.failed_in_doubt:
                self._sender.finish(txn.on_commit_refused())
                txn.check_flushed()
            attempts += 1
            await anyio.sleep(self._retry_backoff_s(attempts))

    async def abort_transaction(self) -> None:
        """Abort the transaction: records not yet sent fail with TransactionAbortedError,
        records in flight are waited for, then EndTxn(abort). The producer goes on."""
        self._check_running()
        in_flight, done = self._txn.begin_abort()
        self._sender.finish(done)
        await _wait_all(in_flight)
        await self._end_transaction(committed=False)

    async def prepare_transaction(
        self, *, app_id: str | None = None, app_version: int | None = None
    ) -> TxnHandle:
        """Send and wait as commit_transaction() does, then PrepareTxn: the transaction is
        complete but undecided until someone commits or aborts it by the returned
        handle (client.admin.commit_transactions), within transaction_prepared_timeout_ms.

        With `app_id`/`app_version` (the ones the committer will pass) the broker refuses
        the prepare, aborting the transaction, once that app has the version or a later
        one recorded: TransactionAbortableError (INVALID_TXN_STATE), so a writer that
        finishes after its write was committed or aborted leaves nothing open.

        The producer accepts no more records; init_transactions() starts afresh."""
        self._check_running()
        await _wait_all(self._txn.begin_prepare())
        self._txn.check_flushed()
        acc, cfg = self._acc, self.config
        assert cfg.transactional_id is not None
        response = await self._sender.request(
            PrepareTxnRequest(
                transactional_id=cfg.transactional_id,
                producer_id=acc.producer_id,
                producer_epoch=acc.producer_epoch,
                prepared_timeout_ms=cfg.transaction_prepared_timeout_ms,
                txn_app_id=app_id,
                txn_app_version=app_version,
            ),
            self._block_deadline(),
        )
        producer_id, producer_epoch = self._txn.on_prepare(response.error, response.message)
        return TxnHandle(cfg.transactional_id, producer_id, producer_epoch)

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[Any, int | OffsetAndMetadata],
        group_metadata: ConsumerGroupMetadata | str,
    ) -> None:
        """Make committing consumer offsets part of the open transaction (TxnOffsetCommit):
        they become the group's committed offsets when it commits, and vanish if it aborts
        (consume-transform-produce, exactly once).

        `offsets` are {partition: offset of the NEXT record to read}; `group_metadata`
        is `consumer.group_metadata()`, so the broker refuses the commit of a member
        that lost its partitions (a group id alone commits as from outside the group).
        Fencing of this producer raises ProducerFencedError (fatal); a refused member
        raises TxnOffsetCommitFailedError, a CommitFailedError after which the
        transaction can only be aborted."""
        self._check_running()
        self._txn.begin_send_offsets()
        group = (
            ConsumerGroupMetadata(group_metadata)
            if isinstance(group_metadata, str)
            else group_metadata
        )
        acc, cfg = self._acc, self.config
        assert cfg.transactional_id is not None
        remaining = normalize_offsets(offsets)
        deadline = self._block_deadline()
        attempts = 0
        # What the transaction buffered goes out now, without lingering: its produce
        # round then runs while the offsets are committed, not after it, in commit.
        acc.begin_flush()
        try:
            while remaining:
                response = await self._sender.request(
                    TxnOffsetCommitRequest(
                        transactional_id=cfg.transactional_id,
                        producer_id=acc.producer_id,
                        producer_epoch=acc.producer_epoch,
                        group_id=group.group_id,
                        member_id=group.member_id,
                        member_epoch=group.member_epoch,
                        topics=commit_topics(remaining),
                    ),
                    deadline,
                )
                failed = commit_errors(response.error, response.topics, remaining)
                code = next(iter(failed.values()), ErrorCode.NONE)
                if code in RETRIABLE and monotonic_ms() < deadline:
                    remaining = {tp: remaining[tp] for tp in failed}
                    attempts += 1
                    await anyio.sleep(self._retry_backoff_s(attempts))
                    continue
                error, done = self._txn.on_send_offsets(code, response.message)
                self._sender.finish(done)
                if error is not None:
                    raise error
                return
        finally:
            acc.end_flush()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """`async with producer.transaction():` begins a transaction and commits it when the
        block ends; when the block or the commit raises, the transaction is aborted and the
        exception goes on (a failed abort is logged: the broker's timeout then ends it).
        A commit whose outcome is unknown (MinibrokerTimeoutError) is not aborted: call
        commit_transaction() again to learn it."""
        await self.begin_transaction()
        try:
            yield
            await self.commit_transaction()
        except BaseException as exc:
            if self._txn.transaction_open:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self._block_s()):
                    try:
                        await self.abort_transaction()
                    except MinibrokerError as failure:
                        log.warning("could not abort the transaction after %r: %s", exc, failure)
            raise

    async def _end_transaction(self, *, committed: bool) -> None:
        acc, cfg = self._acc, self.config
        assert cfg.transactional_id is not None
        response = await self._sender.request(
            EndTxnRequest(
                transactional_id=cfg.transactional_id,
                producer_id=acc.producer_id,
                producer_epoch=acc.producer_epoch,
                committed=committed,
            ),
            self._block_deadline(),
        )
        self._on_end(committed, response)

    def _on_end(self, committed: bool, response: EndTxnResponse) -> None:
        """Apply EndTxn's answer (raising its error) and signal the batches it finished."""
        self._sender.finish(
            self._txn.on_end(
                committed,
                response.error,
                response.producer_id,
                response.producer_epoch,
                response.message,
            )
        )

    def _check_running(self) -> None:
        if self._state != "running":
            raise MinibrokerError(f"producer is {self._state}: start() it first")

    def _retry_backoff_s(self, attempts: int) -> float:
        cfg = self.config
        backoff = cfg.retry_backoff_ms * 2 ** min(attempts - 1, 20)
        return min(backoff, cfg.retry_backoff_max_ms) / 1000

    def _block_s(self) -> float:
        return self.config.max_block_ms / 1000

    def _block_deadline(self) -> float:
        """Until when a transactional request is retried: max_block_ms, as Kafka does."""
        return monotonic_ms() + self.config.max_block_ms

    def metrics(self) -> dict[str, float]:
        """Counters of this producer (Kafka-like names): records, retries, latency, buffer."""
        acc = self._acc
        m = dict(acc.metrics)
        batches = m["batches_sent"]
        m["batch_size_avg"] = m["records_sent"] / batches if batches else 0.0
        m.update(self._sender.metrics())
        m["buffer_available_bytes"] = acc.buffer_memory - acc.buffered_bytes
        m["producer_id"] = acc.producer_id
        m["producer_epoch"] = acc.producer_epoch
        return m


async def _wait_all(batches: list[ProducerBatch]) -> None:
    for batch in batches:
        await batch.wait_async()


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
        self._thread = PortalThread("minibroker-producer")
        self._portal = self._thread.portal
        self._closed = False
        self._close_timeout: float | None = None
        try:
            # Built on the I/O thread, so that its AnyIO locks and events belong to that
            # thread's event loop even when the caller runs inside another one (trio).
            core = self._thread.call(partial(AsyncProducer, bootstrap_servers, **config))
            self._core = core
            self.config = core.config
            self._lifetime, self._close_requested = self._portal.start_task(
                self._run, name="minibroker-producer"
            )
        except BaseException:
            self._thread.close()
            raise
        # The hot path: a closure with send()'s signature shadows the method below
        # (unless a subclass overrides send()).
        if type(self).send is Producer.send:
            self.send = core.nonblocking_send(self._send_blocking)  # type: ignore[method-assign]
        # Like kafka-python: records still buffered at interpreter exit are delivered first
        # (bounded by delivery_timeout_ms); the I/O thread is a daemon and would just die.
        self._close_at_exit_hook = partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._close_at_exit_hook)

    async def _run(self, *, task_status: anyio.abc.TaskStatus[anyio.Event]) -> None:
        """The core's whole life in one task, as its task group requires: start, then stop
        once `close()` sets the event handed back."""
        close_requested = anyio.Event()
        await self._core.start()
        task_status.started(close_requested)
        await close_requested.wait()
        await self._core.stop(self._close_timeout)

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

        `on_delivery(error, metadata)` runs once, on the producer's I/O thread. Waits
        and raises as AsyncProducer.send does (an unknown partition at once, a broker
        never reached after one reconnect backoff cycle). (Instances use the equivalent
        closure installed in __init__.)"""
        send = self._core.nonblocking_send(self._send_blocking)
        return send(topic, value, key, partition, headers, timestamp_ms, on_delivery)

    def _send_blocking(self, *args: Any) -> RecordHandle:
        """send() that has to wait for metadata or buffer space (up to max_block_ms).

        Buffer space is waited for here, on the caller's thread: a producer that
        outruns the broker blocks once per batch or so, and a round trip through the
        event loop each time cost the I/O thread more than the batch itself."""
        core = self._core
        topic, value, key, partition, headers = args[:5]
        if threading.get_ident() != core._sender._loop_thread:
            reserve = max(core.config.batch_size, record_size(key, value, headers) + HEADER_BYTES)
            deadline = time.monotonic() + core.config.max_block_ms / 1000
            while core._knows(topic, partition):
                if not core._acc.wait_for_space(reserve, deadline - time.monotonic()):
                    raise MinibrokerTimeoutError(
                        "no buffer space within max_block_ms "
                        f"(buffer_memory {core.config.buffer_memory})"
                    )
                try:
                    return core._send_nowait(*args)
                except _WouldBlock:
                    pass
        return self._thread.call(core.send, *args)

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

        Records are encoded one msgpack array per wire batch of up to
        max_request_size bytes; `get()` returns one BatchMetadata per wire
        batch, and `on_delivery(error, metadata list or None)` runs once, on
        the I/O thread, when all of them finished."""
        return self._thread.call(
            self._core.send_batch, topic, values, keys, partition, headers, on_delivery
        )

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and block until all of it is acknowledged or failed;
        see AsyncProducer.flush for the bounds and errors."""
        self._thread.call(self._core.flush, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (up to `timeout` s), then stop the I/O thread."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_at_exit_hook)
        self._close_timeout = timeout
        try:
            self._thread.call(self._close_requested.set)
            self._lifetime.result()
        finally:
            self._thread.close()

    def init_transactions(self) -> None:
        """See AsyncProducer.init_transactions: fence older instances of the transactional id."""
        self._thread.call(self._core.init_transactions)

    def begin_transaction(self) -> None:
        """See AsyncProducer.begin_transaction."""
        # A state change under the accumulator's lock (the transaction manager's too), which
        # any thread may take: no trip to the I/O thread (it cost as much as sending a
        # hundred records).
        self._core._txn.begin_transaction()

    def commit_transaction(self) -> None:
        """Flush, then commit; TransactionAbortableError if any record of it failed."""
        self._thread.call(self._core.commit_transaction)

    def abort_transaction(self) -> None:
        self._thread.call(self._core.abort_transaction)

    def prepare_transaction(
        self, *, app_id: str | None = None, app_version: int | None = None
    ) -> TxnHandle:
        """Flush, then PrepareTxn; the handle lets any process commit or abort it.

        See AsyncProducer.prepare_transaction for `app_id`/`app_version`."""
        return self._thread.call(
            partial(self._core.prepare_transaction, app_id=app_id, app_version=app_version)
        )

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[Any, int | OffsetAndMetadata],
        group_metadata: ConsumerGroupMetadata | str,
    ) -> None:
        """See AsyncProducer.send_offsets_to_transaction: the consumer's offsets commit with
        the transaction, or not at all."""
        self._thread.call(self._core.send_offsets_to_transaction, offsets, group_metadata)

    def transaction(self) -> AbstractContextManager[None]:
        """`with producer.transaction():` commits on normal exit, aborts on an exception."""
        return self._portal.wrap_async_context_manager(self._core.transaction())

    def metrics(self) -> dict[str, float]:
        return self._core.metrics()

    def partitions_for(self, topic: str) -> set[int]:
        return self._thread.call(self._core.partitions_for, topic)

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
