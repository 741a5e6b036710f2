"""The consumer: manual assignment, caller-owned offsets, prefetching fetch loop.

`AsyncConsumer` runs on AnyIO. A background task keeps one Fetch in flight
for every assigned partition whose buffer has room (at most
PREFETCH_PER_PARTITION fetched byte runs per partition), so the network and
the broker work while the caller processes records; `getmany` only decodes.
Control requests (ListOffsets, Metadata) use a second connection so they never
queue behind a long-polling Fetch.

`Consumer` is the same core on a daemon thread's event loop, with kafka-python's
`poll()` and iteration. Consumer groups are out of scope: `assign`/`seek` and
offsets are the caller's, and topics named at construction are assigned all
their partitions (new ones picked up when metadata shows them).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from client._portal import PortalThread
from client.config import ConsumerConfig
from client.connection import Connection, Reconnector
from client.errors import (
    ConnectionLostError,
    MinibrokerError,
    MinibrokerTimeoutError,
    OffsetOutOfRangeError,
    UnknownTopicError,
    error_for,
)
from client.fetcher import FetchedRecords, gc_paused
from client.replies import check, list_offsets_request, metadata_request, offsets, partition_count
from client.types import ConsumerRecord, TopicPartition
from protocol.errors import RETRIABLE, ErrorCode
from protocol.framing import DEFAULT_FRAME_BYTES_MAX
from protocol.messages import (
    ISOLATION_READ_COMMITTED,
    ISOLATION_READ_UNCOMMITTED,
    TIMESTAMP_EARLIEST,
    TIMESTAMP_LATEST,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    MetadataRequest,
    Request,
)

log = logging.getLogger(f"minibroker.{__name__}")

PREFETCH_PER_PARTITION = 2
# Records the sync Consumer takes from its I/O thread per crossing (bounded memory, few calls).
REFILL_RECORDS = 20_000
# How often topics named at construction are looked up again while they have no partitions.
TOPIC_RETRY_S = 0.5

Assignable = str | TopicPartition | tuple[str, int]


class AsyncConsumer:
    """Kafka-style consumer for asyncio, uvloop and trio programs (aiokafka-like API)."""

    def __init__(
        self,
        *topics: Assignable,
        bootstrap_servers: str | Sequence[str] = "127.0.0.1:9092",
        **config: Any,
    ) -> None:
        self.config = cfg = ConsumerConfig(bootstrap_servers=bootstrap_servers, **config)
        self._unresolved = [t for t in topics if isinstance(t, str)]
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int | None] = {}
        self._fetch_offsets: dict[TopicPartition, int] = {}
        self._buffers: dict[TopicPartition, deque[FetchedRecords]] = {}
        self._errors: dict[TopicPartition, MinibrokerError] = {}
        self._epochs: dict[TopicPartition, int] = {}
        self._rotation = 0
        self._isolation = (
            ISOLATION_READ_COMMITTED if cfg.read_committed else ISOLATION_READ_UNCOMMITTED
        )

        def connector() -> Reconnector:
            return Reconnector(
                cfg.servers,
                client_id=cfg.client_id,
                timeout_s=cfg.request_timeout_ms / 1000,
                max_response_bytes=max(DEFAULT_FRAME_BYTES_MAX, cfg.fetch_max_bytes + 2**20),
                backoff_ms=cfg.reconnect_backoff_ms,
                backoff_max_ms=cfg.reconnect_backoff_max_ms,
            )

        self._fetch_connector = connector()
        self._control_connector = connector()
        self._tg: anyio.abc.TaskGroup | None = None
        self._data_event: anyio.Event | None = None
        self._fetch_wakeup: anyio.Event | None = None
        self._state = "new"
        self._fatal: MinibrokerError | None = None
        for t in topics:
            if not isinstance(t, str):
                self._add(TopicPartition(*t))

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Look up the named topics and start fetching; `stop()` from the same task."""
        if self._state != "new":
            raise MinibrokerError(f"consumer cannot start: it is {self._state}")
        self._state = "running"
        self._fetch_wakeup = anyio.Event()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._resolve_topics()
        except BaseException:
            await self.stop()
            raise
        self._tg.start_soon(self._fetcher, name="minibroker-fetcher")

    async def stop(self) -> None:
        if self._state != "running":
            self._state = "closed"
            return
        self._state = "closed"
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._fetch_connector.aclose()
        await self._control_connector.aclose()
        await self._tg.__aexit__(None, None, None)

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ assignment and offsets

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume exactly these partitions (replacing any previous assignment)."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        self._unresolved = []
        for tp in list(self._assignment):
            if tp not in wanted:
                self._remove(tp)
        self._assignment = []
        for tp in wanted:
            self._add(tp)
        self._wake_fetcher()

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Make `offset` the next record returned for `partition`."""
        tp = TopicPartition(*partition)
        if tp not in self._positions:
            raise MinibrokerError(f"{tp.topic}-{tp.partition} is not assigned")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self._set_position(tp, offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        tps = list(partitions) or list(self._assignment)
        for tp, offset in (await self.beginning_offsets(tps)).items():
            self._set_position(tp, offset)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        tps = list(partitions) or list(self._assignment)
        for tp, offset in (await self.end_offsets(tps)).items():
            self._set_position(tp, offset)

    async def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record to be returned (resolving auto_offset_reset if due)."""
        tp = TopicPartition(*partition)
        if tp not in self._positions:
            raise MinibrokerError(f"{tp.topic}-{tp.partition} is not assigned")
        if self._positions[tp] is None:
            await self._reset_positions([tp])
        position = self._positions[tp]
        if position is None:
            raise self._errors[tp]
        return position

    async def end_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, int]:
        """The offset after the last record (the last stable offset under read_committed)."""
        return await self._list_offsets(partitions, TIMESTAMP_LATEST)

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, int]:
        return await self._list_offsets(partitions, TIMESTAMP_EARLIEST)

    async def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The first offset whose timestamp is at or after each given timestamp (ms)."""
        result: dict[TopicPartition, int] = {}
        for tp, ts in timestamps.items():
            result.update(await self._list_offsets([tp], ts))
        return result

    async def partitions_for_topic(self, topic: str) -> set[int]:
        """The partition numbers of `topic`; UnknownTopicError when it does not exist."""
        count = await self._partition_count(topic)
        if count is None:
            raise UnknownTopicError(topic)
        return set(range(count))

    async def topics(self) -> set[str]:
        response = await self._control(MetadataRequest(topics=None))
        return {t.name for t in response.topics if not t.error}

    # ------------------------------------------------------------------ consuming

    async def getmany(
        self,
        *partitions: TopicPartition,
        timeout_ms: float = 0,
        max_records: int | None = None,
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records fetched so far, waiting up to `timeout_ms` for the first one.

        At most `max_records` (default max_poll_records) in total, taken
        round-robin across partitions; limited to `partitions` when given."""
        self._check_running()
        limit = max_records or self.config.max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            with gc_paused():
                records = self._collect(limit, partitions)
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {}
            if self._data_event is None:
                self._data_event = anyio.Event()
            event = self._data_event
            with anyio.move_on_after(remaining):
                await event.wait()

    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord:
        """The next record, waiting as long as it takes."""
        while True:
            records = await self.getmany(*partitions, timeout_ms=math.inf, max_records=1)
            for batch in records.values():
                return batch[0]

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConsumerRecord]:
        """Records one by one; ends after consumer_timeout_ms without any (like kafka-python)."""
        idle_limit = self.config.consumer_timeout_ms
        idle_since = None
        while True:
            records = await self.getmany(timeout_ms=min(idle_limit, 1000))
            if records:
                for batch in records.values():
                    for record in batch:
                        yield record
                idle_since = None
                continue
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            if (now - idle_since) * 1000 >= idle_limit:
                return

    # ------------------------------------------------------------------ internals

    def _check_running(self) -> None:
        if self._state != "running":
            raise MinibrokerError(f"consumer is {self._state}")
        if self._fatal is not None:
            raise self._fatal

    def _add(self, tp: TopicPartition) -> None:
        if tp in self._positions:
            if tp not in self._assignment:
                self._assignment.append(tp)
            return
        self._assignment.append(tp)
        self._positions[tp] = None
        self._buffers[tp] = deque()
        self._epochs[tp] = self._epochs.get(tp, 0) + 1

    def _remove(self, tp: TopicPartition) -> None:
        self._positions.pop(tp, None)
        self._buffers.pop(tp, None)
        self._fetch_offsets.pop(tp, None)
        self._errors.pop(tp, None)
        self._epochs[tp] = self._epochs.get(tp, 0) + 1

    def _set_position(self, tp: TopicPartition, offset: int) -> None:
        self._positions[tp] = offset
        self._fetch_offsets[tp] = offset
        self._buffers[tp].clear()
        self._errors.pop(tp, None)
        self._epochs[tp] += 1
        self._wake_fetcher()

    def _notify_data(self) -> None:
        if self._data_event is not None:
            self._data_event.set()
            self._data_event = None

    def _wake_fetcher(self) -> None:
        if self._fetch_wakeup is not None:
            self._fetch_wakeup.set()

    def _collect(
        self, limit: int, only: Sequence[TopicPartition]
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        order = [tp for tp in self._assignment if not only or tp in only]
        if not order:
            return out
        start = self._rotation % len(order)
        self._rotation += 1
        count = 0
        freed = False
        for tp in order[start:] + order[:start]:
            buffer = self._buffers[tp]
            while buffer and count < limit:
                fetched = buffer[0]
                try:
                    records = fetched.take(limit - count)
                except MinibrokerError:
                    if out:
                        return out  # hand out what came before; the error comes next time
                    raise
                self._positions[tp] = fetched.position
                if records:
                    out.setdefault(tp, []).extend(records)
                    count += len(records)
                if fetched.exhausted:
                    buffer.popleft()
                    freed = True
            if count >= limit:
                break
        if freed:
            self._wake_fetcher()
        if not out:
            for tp in order:
                error = self._errors.get(tp)
                if error is not None:
                    raise error
        return out

    async def _fetcher(self) -> None:
        # Never raise: this task shares the caller's task group, whose code a crash would cancel.
        try:
            await self._fetch_loop()
        except Exception as exc:
            log.exception("consumer fetcher failed")
            self._fatal = MinibrokerError(f"consumer fetcher failed: {exc!r}")
            self._notify_data()

    async def _fetch_loop(self) -> None:
        cfg = self.config
        resolved_at = time.monotonic()
        while True:
            self._fetch_wakeup = wakeup = anyio.Event()
            if self._unresolved and time.monotonic() - resolved_at >= TOPIC_RETRY_S:
                resolved_at = time.monotonic()
                await self._resolve_topics()
            targets: list[TopicPartition] = []
            try:
                pending = [tp for tp in self._assignment if self._positions.get(tp) is None]
                if pending:
                    targets = pending
                    await self._reset_positions(pending)
                targets = [
                    tp
                    for tp in self._assignment
                    if self._positions.get(tp) is not None
                    and tp not in self._errors
                    and len(self._buffers[tp]) < PREFETCH_PER_PARTITION
                    and not (self._buffers[tp] and self._buffers[tp][-1].failed)
                ]
                if targets:
                    assert self._tg is not None
                    conn = await self._fetch_connector.get(self._tg)
                    assert conn is not None
                    await self._fetch(conn, targets)
                    continue
            except ConnectionLostError:
                await anyio.sleep(cfg.retry_backoff_ms / 1000)
                continue
            except MinibrokerError as exc:
                if not exc.retriable:
                    for tp in targets:
                        self._errors[tp] = exc
                    self._notify_data()
                await anyio.sleep(cfg.retry_backoff_ms / 1000)
                continue
            with anyio.move_on_after(TOPIC_RETRY_S if self._unresolved else math.inf):
                await wakeup.wait()

    async def _fetch(self, conn: Connection, targets: list[TopicPartition]) -> None:
        cfg = self.config
        by_topic: dict[str, list[FetchPartition]] = {}
        sent: dict[TopicPartition, tuple[int, int]] = {}
        for tp in targets:
            offset = self._fetch_offsets.setdefault(tp, self._positions[tp])  # type: ignore[arg-type]
            sent[tp] = (offset, self._epochs[tp])
            by_topic.setdefault(tp.topic, []).append(
                FetchPartition(tp.partition, offset, cfg.max_partition_fetch_bytes)
            )
        request = FetchRequest(
            topics=[FetchTopic(topic, parts) for topic, parts in by_topic.items()],
            max_wait_ms=cfg.fetch_max_wait_ms,
            min_bytes=cfg.fetch_min_bytes,
            max_bytes=cfg.fetch_max_bytes,
            isolation_level=self._isolation,
        )
        response: FetchResponse = await conn.request(
            request, (cfg.request_timeout_ms + cfg.fetch_max_wait_ms) / 1000
        )
        check(response, "fetch")
        backoff = False
        for entry in response.topics:
            topic = entry.topic
            for part in entry.partitions:
                tp = TopicPartition(topic, part.partition)
                if tp not in sent or self._epochs.get(tp) != sent[tp][1]:
                    continue  # unassigned or sought meanwhile: this answer is stale
                offset = sent[tp][0]
                if part.error == ErrorCode.NONE:
                    if part.records:
                        fetched = FetchedRecords(
                            topic,
                            part.partition,
                            part.records,
                            offset,
                            aborted_transactions=part.aborted_transactions,
                            read_committed=cfg.read_committed,
                            check_crcs=cfg.check_crcs,
                        )
                        self._buffers[tp].append(fetched)
                        self._fetch_offsets[tp] = fetched.next_fetch_offset
                elif part.error == ErrorCode.OFFSET_OUT_OF_RANGE:
                    if cfg.auto_offset_reset == "none":
                        self._errors[tp] = OffsetOutOfRangeError(topic, part.partition, offset)
                    else:
                        self._positions[tp] = None
                        self._fetch_offsets.pop(tp, None)
                        self._buffers[tp].clear()
                elif part.error in RETRIABLE:
                    backoff = True
                else:
                    self._errors[tp] = error_for(part.error, f"fetch {topic}-{part.partition}")
        self._notify_data()
        if backoff:
            await anyio.sleep(cfg.retry_backoff_ms / 1000)

    async def _resolve_topics(self) -> None:
        """Assign every partition of the topics named at construction, once they exist."""
        for topic in list(self._unresolved):
            count = await self._partition_count(topic)
            if count:
                self._unresolved.remove(topic)
                for partition in range(count):
                    self._add(TopicPartition(topic, partition))
                self._wake_fetcher()

    async def _partition_count(self, topic: str) -> int | None:
        request = metadata_request(topic, allow_auto_create=False)
        return partition_count(await self._control(request), topic)

    async def _reset_positions(self, tps: list[TopicPartition]) -> None:
        policy = self.config.auto_offset_reset
        if policy == "none":
            for tp in tps:
                self._errors[tp] = MinibrokerError(
                    f"no position for {tp.topic}-{tp.partition} and auto_offset_reset is 'none'"
                )
            return
        timestamp = TIMESTAMP_EARLIEST if policy == "earliest" else TIMESTAMP_LATEST
        for tp, offset in (await self._list_offsets(tps, timestamp)).items():
            if tp in self._positions and self._positions[tp] is None:  # not sought meanwhile
                self._set_position(tp, offset)

    async def _list_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timestamp: int
    ) -> dict[TopicPartition, int]:
        request = list_offsets_request(partitions, timestamp, self._isolation)
        return offsets(await self._control(request))

    async def _control(self, request: Request) -> Any:
        """One request on the control connection, retried across reconnects until timeout."""
        assert self._tg is not None, "consumer is not started"
        timeout_s = self.config.request_timeout_ms / 1000
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with anyio.fail_after(max(deadline - time.monotonic(), 0)):
                    conn = await self._control_connector.get(self._tg)
                assert conn is not None
                response = await conn.request(request, timeout_s)
            except (ConnectionLostError, TimeoutError) as exc:
                if time.monotonic() >= deadline:
                    # A bare timeout says nothing; the connection error behind it does.
                    cause = self._control_connector.last_error or exc
                    raise MinibrokerTimeoutError(
                        f"{request.api} failed within request_timeout_ms="
                        f"{self.config.request_timeout_ms}: {cause or 'timed out'}"
                    ) from exc
                await anyio.sleep(self.config.retry_backoff_ms / 1000)
                continue
            check(response, request.api)
            return response


class Consumer:
    """The synchronous consumer: `AsyncConsumer` on a private daemon thread.

    kafka-python's surface: `poll()`, iteration (ending after
    consumer_timeout_ms without records), `assign`/`seek`/`position`,
    `end_offsets`/`beginning_offsets`, `partitions_for_topic`, `close`.

    Records cross from the I/O thread REFILL_RECORDS at a time into a local
    buffer that `poll()` and iteration serve from, so a poll of 500 records
    does not pay a cross-thread call."""

    def __init__(
        self,
        *topics: Assignable,
        bootstrap_servers: str | Sequence[str] = "127.0.0.1:9092",
        **config: Any,
    ) -> None:
        self._thread = PortalThread("minibroker-consumer")
        self._portal = self._thread.portal
        # Handed over but not yet returned: [partition, records, index of the next one].
        self._local: deque[list[Any]] = deque()
        self._closed = False
        try:
            # Built on the I/O thread, so that its AnyIO locks and events belong to that
            # thread's event loop even when the caller runs inside another one (trio).
            self._core = core = self._portal.call(
                partial(AsyncConsumer, *topics, bootstrap_servers=bootstrap_servers, **config)
            )
            self.config = core.config
            self._cm = self._portal.wrap_async_context_manager(core)
            self._cm.__enter__()
        except BaseException:
            self._thread.close()
            raise

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        self._drop_pending()
        self._portal.call(self._core.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._portal.call(self._core.assignment)

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        self._drop_pending()
        self._portal.call(self._core.seek, partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._drop_pending()
        self._portal.call(self._core.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._drop_pending()
        self._portal.call(self._core.seek_to_end, *partitions)

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        tp = TopicPartition(*partition)
        for entry in self._local:
            if entry[0] == tp:
                return entry[1][entry[2]].offset
        return self._portal.call(self._core.position, tp)

    def end_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, int]:
        return self._portal.call(self._core.end_offsets, list(partitions))

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, int]:
        return self._portal.call(self._core.beginning_offsets, list(partitions))

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        return self._portal.call(self._core.offsets_for_times, timestamps)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._portal.call(self._core.partitions_for_topic, topic)

    def topics(self) -> set[str]:
        return self._portal.call(self._core.topics)

    def poll(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition (at most max_records, default max_poll_records), waiting up
        to `timeout_ms` for the first."""
        limit = max_records or self.config.max_poll_records
        local = self._local
        if not local:
            self._refill(timeout_ms, limit)
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        count = 0
        while local and count < limit:
            entry = local[0]
            tp, records, index = entry
            room = limit - count
            taken = records if not index and len(records) <= room else records[index : index + room]
            if tp in out:
                out[tp] += taken
            else:
                out[tp] = taken
            count += len(taken)
            entry[2] = index + len(taken)
            if entry[2] >= len(records):
                local.popleft()
        return out

    def _refill(self, timeout_ms: float, at_least: int) -> None:
        getmany = partial(
            self._core.getmany, timeout_ms=timeout_ms, max_records=max(at_least, REFILL_RECORDS)
        )
        for tp, records in self._portal.call(getmany).items():
            self._local.append([tp, records, 0])

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records one by one; ends after consumer_timeout_ms without any (like kafka-python).

        A generator, cheaper per record than `__next__` (which `next(consumer)` uses)."""
        local = self._local
        while True:
            if not local:
                try:
                    self._wait_for_records()
                except StopIteration:
                    return
            entry = local[0]
            records = entry[1]
            end = len(records)
            # entry[2] is the shared cursor: progress survives a `break` in the caller's
            # loop, and a seek (which empties the buffer) ends this entry at once.
            while (index := entry[2]) < end:
                entry[2] = index + 1
                yield records[index]
            if local and local[0] is entry:
                local.popleft()

    def __next__(self) -> ConsumerRecord:
        local = self._local
        if not local:
            self._wait_for_records()
        entry = local[0]
        records = entry[1]
        index = entry[2]
        entry[2] = index + 1
        if index + 1 >= len(records):
            local.popleft()
        return records[index]

    def _wait_for_records(self) -> None:
        """Refill the local buffer, or StopIteration after consumer_timeout_ms without records."""
        idle_limit = self.config.consumer_timeout_ms
        idle_since = time.monotonic()
        while not self._local:
            waited_ms = (time.monotonic() - idle_since) * 1000
            if waited_ms >= idle_limit:
                raise StopIteration
            self._refill(min(idle_limit - waited_ms, 1000), REFILL_RECORDS)

    def _drop_pending(self) -> None:
        """Records buffered locally are stale after a seek or reassignment."""
        for entry in self._local:
            entry[2] = len(entry[1])
        self._local.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._cm.__exit__(None, None, None)
        finally:
            self._thread.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
