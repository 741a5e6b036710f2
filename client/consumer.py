"""The consumer: prefetching fetch loop, manual assignment or a consumer group.

`AsyncConsumer` runs on AnyIO. A background task keeps one Fetch in flight
for every assigned partition whose buffer has room (at most
PREFETCH_PER_PARTITION fetched byte runs per partition), so the network and
the broker work while the caller processes records; `getmany` only decodes.
Control requests (ListOffsets, Metadata, the group's heartbeats and offsets)
use a second connection so they never queue behind a long-polling Fetch.

Without `group_id`, `assign`/`seek` and offsets are the caller's, and topics
named at construction are assigned all their partitions (new ones picked up
when metadata shows them). With `group_id`, named topics are subscribed: the
broker shares their partitions among the group's members (KIP-848; heartbeats
in client/coordinator.py, decisions in client/group_membership.py), committed
offsets are where a new partition starts, and `commit()` stores them. Rebalance
callbacks run inside the application's poll, as in Kafka: a partition is given
up only after `on_partitions_revoked` returned (and, with enable_auto_commit,
its position was committed), and records of a revoked partition are never
returned after that callback.

`Consumer` is the same core on a daemon thread's event loop, driven only through
its public methods, with kafka-python's `poll()` and iteration; its rebalance
callbacks are plain functions run on the caller's thread, which waits for the core
in `PortalThread.call_serving` meanwhile.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Protocol, TypeVar

import anyio
import anyio.abc

from client._portal import PortalThread
from client.accumulator import monotonic_ms
from client.config import BROKER_SIDE_GROUP_SETTINGS, ConsumerConfig
from client.connection import Connection, DirectRequests, Reconnector
from client.coordinator import ConsumerCoordinator, normalize_offsets
from client.errors import (
    AuthenticationFailedError,
    ConnectionLostError,
    IllegalStateError,
    MinibrokerError,
    MinibrokerTimeoutError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    UnknownTopicError,
    denial,
    error_for,
)
from client.fetcher import FetchedRecords, gc_paused
from client.group_membership import Changes, MemberState
from client.replies import (
    Lookup,
    check,
    list_offsets_request,
    metadata_request,
    offsets,
    partition_count,
)
from client.types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    TopicPartition,
)
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
    MetadataResponse,
    Request,
)

log = logging.getLogger(f"minibroker.{__name__}")

PREFETCH_PER_PARTITION = 2
# Records the sync Consumer takes from its I/O thread per crossing (bounded memory, few calls).
REFILL_RECORDS = 20_000
# How often topics named at construction are looked up again while they have no partitions.
TOPIC_RETRY_S = 0.5

T = TypeVar("T")

Assignable = str | TopicPartition | tuple[str, int]
Partitions = frozenset[TopicPartition]
Offsets = Mapping[TopicPartition, int | OffsetAndMetadata]
CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], BaseException | None], object]


class ConsumerRebalanceListener:
    """Callbacks around a rebalance of a subscribed consumer (Kafka's and aiokafka's
    ConsumerRebalanceListener); subclass it and override what you need.

    They run inside the application's poll (`getmany`/`poll`/iteration), never
    concurrently with its processing. On `AsyncConsumer` they may be coroutines
    (`async def`); on `Consumer` they are plain methods run on the polling thread.

    - `on_partitions_revoked(revoked)`: before the partitions are given up; their
      records are no longer returned, their positions still commit (with
      enable_auto_commit they were committed just before this call).
    - `on_partitions_assigned(assigned)`: after new partitions were added and before
      any of their records is returned; `seek()` here picks where they start.
    - `on_partitions_lost(lost)`: the member was fenced, so the partitions may
      already be another member's and commits would be refused. The default calls
      `on_partitions_revoked`, as Kafka's does.

    An exception from a callback is raised from the poll, after the rebalance step
    it belongs to was completed."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> Any:
        return None

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> Any:
        return None

    def on_partitions_lost(self, lost: set[TopicPartition]) -> Any:
        return self.on_partitions_revoked(lost)


def _callback(
    listener: ConsumerRebalanceListener, step: str
) -> Callable[[set[TopicPartition]], Any]:
    if step == "lost":
        return listener.on_partitions_lost
    if step == "revoke":
        return listener.on_partitions_revoked
    return listener.on_partitions_assigned


def _steps(changes: Changes) -> list[tuple[str, Partitions]]:
    """A rebalance's steps in Kafka's order: lost first, then revoked, then assigned."""
    steps = (("lost", changes.lost), ("revoke", changes.revoke), ("assign", changes.assign))
    return [(step, partitions) for step, partitions in steps if partitions]


class HeldRecords(Protocol):
    """Records a face took from the consumer and has not returned to the application
    yet (the sync Consumer's local buffer): commits count only what it received."""

    def unreturned(self) -> dict[TopicPartition, int]:
        """The offset of each partition's first record held."""

    def give_back(self, partitions: Partitions) -> dict[TopicPartition, int]:
        """Drop the records held of `partitions`: the offset of each one's first."""


class AsyncConsumer:
    """Kafka-style consumer for asyncio, uvloop and trio programs (aiokafka-like API)."""

    def __init__(
        self,
        *assigned: Assignable,
        topics: Iterable[str] | None = None,
        listener: ConsumerRebalanceListener | None = None,
        bootstrap_servers: str | Sequence[str] = "127.0.0.1:9092",
        held: HeldRecords | None = None,
        **config: Any,
    ) -> None:
        """Topic names (positional or `topics=`) are subscribed with a `group_id`, else
        assigned all their partitions; TopicPartitions are assigned. `held` is for a face
        that hands records out itself, holding some back (the sync Consumer): what is
        held is not consumed, for commits and rebalances."""
        for name, where in BROKER_SIDE_GROUP_SETTINGS.items():
            if name in config:
                raise ValueError(
                    f"{name} is not a consumer setting under KIP-848's consumer protocol: "
                    f"it is {where}"
                )
        self.config = cfg = ConsumerConfig(bootstrap_servers=bootstrap_servers, **config)
        names = [t for t in assigned if isinstance(t, str)] + list(topics or ())
        partitions = [TopicPartition(*t) for t in assigned if not isinstance(t, str)]
        self._unresolved = [] if cfg.group_id else names
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int | None] = {}
        self._fetch_offsets: dict[TopicPartition, int] = {}
        self._buffers: dict[TopicPartition, deque[FetchedRecords]] = {}
        self._errors: dict[TopicPartition, MinibrokerError] = {}
        # Fetch offsets the broker called out of range, until auto_offset_reset moved them.
        self._out_of_range: dict[TopicPartition, int] = {}
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
                security=cfg.security,
            )

        self._fetch_connector = connector()
        self._control_connector = connector()
        self._tg: anyio.abc.TaskGroup | None = None
        self._data_event: anyio.Event | None = None
        self._fetch_wakeup: anyio.Event | None = None
        self._state = "new"
        self._fatal: MinibrokerError | None = None
        # The group's side; None without group_id.
        self._coordinator = (
            None
            if cfg.group_id is None
            else ConsumerCoordinator(
                cfg,
                self._control_connector,
                partial(self._control, checked=False),
                self._on_group_change,
            )
        )
        self._listener = listener or ConsumerRebalanceListener()
        self._revoking: set[TopicPartition] = (
            set()
        )  # still assigned, no longer fetched nor returned
        self._from_committed: set[TopicPartition] = set()  # to start at the committed offset
        self._next_auto_commit_ms = monotonic_ms() + cfg.auto_commit_interval_ms
        self._auto_committed: dict[TopicPartition, int] = {}
        self._held = held
        if names and cfg.group_id:
            if partitions:
                raise ValueError("name topics to subscribe or partitions to assign, not both")
            self.subscribe(names, listener)
        for tp in partitions:
            self._add(tp)

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
        if self._coordinator is not None:
            self._coordinator.start(self._tg)

    async def stop(self) -> None:
        """Leave the group (revoking its partitions: commit with enable_auto_commit, then
        on_partitions_revoked) or commit a manual assignment's positions, then close."""
        if self._state != "running":
            self._state = "closed"
            return
        if self._coordinator is not None and self._fatal is None:
            with anyio.move_on_after(self.config.request_timeout_ms / 1000):
                await self._close_group()
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

    def subscribe(
        self, topics: Iterable[str], listener: ConsumerRebalanceListener | None = None
    ) -> None:
        """Join the group (`group_id`) for `topics`, or change the subscription: the broker
        assigns this member a share of their partitions, through the listener's callbacks."""
        coordinator = self._require_group("subscribe()")
        if self._assignment and not coordinator.is_member:
            raise IllegalStateError("subscribe() after assign(): unsubscribe() or assign([]) first")
        if listener is not None:
            self._listener = listener
        coordinator.membership.subscribe(list(topics), monotonic_ms())
        coordinator.wake()

    async def unsubscribe(self) -> None:
        """Give up every partition (auto-commit, then on_partitions_revoked) and leave the group."""
        coordinator = self._require_group("unsubscribe()")
        if coordinator.is_member:
            await self._rebalance(self._leaving_changes())
            await coordinator.leave()

    def subscription(self) -> set[str]:
        """The subscribed topics (empty when not subscribed)."""
        if self._coordinator is None:
            return set()
        return set(self._coordinator.membership.subscription)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """Group id, member id and epoch, for `producer.send_offsets_to_transaction()`."""
        coordinator = self._require_group("group_metadata()")
        m = coordinator.membership
        if not coordinator.is_member:
            return ConsumerGroupMetadata(coordinator.group_id)
        return ConsumerGroupMetadata(coordinator.group_id, m.member_id, m.member_epoch)

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume exactly these partitions (replacing any previous assignment). With a
        `group_id` they start at the group's committed offsets and commit as member "" with
        epoch -1 (allowed while the group has no members)."""
        if self._coordinator is not None and self._coordinator.is_member:
            raise IllegalStateError("assign() while subscribed: unsubscribe() first")
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

    async def commit(self, offsets: Offsets | None = None) -> None:
        """Commit `offsets` ({partition: offset of the NEXT record to read, or
        OffsetAndMetadata}), by default the position of every assigned partition; returns
        once they are durable. CommitFailedError when the group refuses this member
        (fenced, or no longer a member: its partitions may be someone else's)."""
        coordinator = self._require_group("commit()")
        chosen = self._consumed_positions() if offsets is None else offsets
        await coordinator.commit(normalize_offsets(chosen), as_member=coordinator.is_member)

    def commit_async(
        self, offsets: Offsets | None = None, callback: CommitCallback | None = None
    ) -> None:
        """Start a commit and return at once; `callback(offsets, error or None)` runs when
        it is done, on the event loop. Commits are sent in call order."""
        coordinator = self._require_group("commit_async()")
        self._check_running()
        chosen = normalize_offsets(self._consumed_positions() if offsets is None else offsets)
        assert self._tg is not None
        self._tg.start_soon(self._commit_in_background, coordinator, chosen, callback)

    async def committed(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        """The group's committed offset for `partition` (the next record to read), or None.
        Under read_committed it waits (up to request_timeout_ms) for an open transaction
        holding an offset of that partition to end."""
        coordinator = self._require_group("committed()")
        tp = TopicPartition(*partition)
        found = await coordinator.committed(
            [tp], require_stable=self.config.read_committed, retry=True
        )
        committed = found.get(tp)
        return None if committed is None else committed.offset

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
        return await self.look_up(self.offsets_lookup(partitions, TIMESTAMP_LATEST))

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, int]:
        return await self.look_up(self.offsets_lookup(partitions, TIMESTAMP_EARLIEST))

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
        return await self.look_up(self.partitions_lookup(topic))

    async def topics(self) -> set[str]:
        return await self.look_up(topics_lookup())

    # ------------------------------------------------------------------ lookups

    @property
    def control_connector(self) -> Reconnector:
        """The connection of the requests that are not fetches (the group's among them)."""
        return self._control_connector

    def partitions_lookup(self, topic: str) -> Lookup[set[int]]:
        """`topic`'s partition numbers; UnknownTopicError when it does not exist."""

        def read(response: MetadataResponse) -> set[int]:
            count = partition_count(response, topic, self.config.security.principal)
            if count is None:
                raise UnknownTopicError(topic)
            return set(range(count))

        return Lookup(self._metadata_request(topic), read)

    def offsets_lookup(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timestamp: int
    ) -> Lookup[dict[TopicPartition, int]]:
        """The offsets of `partitions` at `timestamp` (-1 latest, -2 earliest)."""
        return Lookup(list_offsets_request(partitions, timestamp, self._isolation), offsets)

    async def look_up(self, lookup: Lookup[T], deadline: float | None = None) -> T:
        """`lookup` made on the control connection, retried across reconnects as `_control`
        does until `deadline` (time.monotonic(); request_timeout_ms from now if None)."""
        response = await self._control(lookup.request, checked=False, deadline=deadline)
        return lookup.answer(response)

    # ------------------------------------------------------------------ consuming

    @property
    def rebalance_due(self) -> bool:
        """Whether the next poll has partitions to lose, revoke or take (`poll_group`)."""
        return self._coordinator is not None and self._coordinator.rebalance_due

    async def poll_group(self) -> None:
        """What each poll does for the group before it returns records, as Kafka's does:
        restart max_poll_interval_ms, go through a due rebalance with the listener's
        callbacks, auto-commit when due. `getmany` calls it; a face that hands out records
        it holds calls it before it does."""
        coordinator = self._coordinator
        if coordinator is None:
            return
        coordinator.membership.polled(monotonic_ms())
        if coordinator.rebalance_due:
            await self._rebalance(coordinator.membership.pending())
        if self._auto_commit_due():
            self._auto_commit(self._consumed_positions())

    async def getmany(
        self,
        *partitions: TopicPartition,
        timeout_ms: float = 0,
        max_records: int | None = None,
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records fetched so far, waiting up to `timeout_ms` for the first one.

        At most `max_records` (default max_poll_records) in total, taken
        round-robin across partitions; limited to `partitions` when given. A subscribed
        consumer runs its rebalance callbacks and auto-commits here, as Kafka's poll does."""
        self._check_running()
        limit = max_records or self.config.max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            await self.poll_group()
            # A fatal error may have come while waiting (the fetcher's too, without a group).
            self._check_running()
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
        if self._coordinator is not None:
            self._from_committed.add(tp)

    def _remove(self, tp: TopicPartition) -> None:
        self._positions.pop(tp, None)
        self._buffers.pop(tp, None)
        self._fetch_offsets.pop(tp, None)
        self._errors.pop(tp, None)
        self._out_of_range.pop(tp, None)
        self._from_committed.discard(tp)
        self._revoking.discard(tp)
        self._epochs[tp] = self._epochs.get(tp, 0) + 1

    def _set_position(self, tp: TopicPartition, offset: int) -> None:
        self._positions[tp] = offset
        self._fetch_offsets[tp] = offset
        self._buffers[tp].clear()
        self._errors.pop(tp, None)
        self._out_of_range.pop(tp, None)
        self._from_committed.discard(tp)
        self._epochs[tp] += 1
        self._wake_fetcher()

    # ------------------------------------------------------------------ the group

    def _require_group(self, call: str) -> ConsumerCoordinator:
        if self._coordinator is None:
            raise IllegalStateError(f"{call} needs a group_id")
        return self._coordinator

    def _on_group_change(self) -> None:
        """The heartbeat task learnt something the application's poll must act on."""
        assert self._coordinator is not None
        fatal = self._coordinator.membership.fatal_error
        if fatal is not None and self._fatal is None:
            self._fatal = fatal
        self._notify_data()

    def _consumed_positions(self) -> dict[TopicPartition, int]:
        """What a commit without offsets stores: the position of every assigned partition,
        moved back to the first record a face holds."""
        positions = {tp: p for tp in self._assignment if (p := self._positions.get(tp)) is not None}
        if self._held is not None:
            positions.update(self._held.unreturned())
        return positions

    def _leaving_changes(self) -> Changes:
        """What leaving the group does to the owned partitions: lost when fenced, else revoked."""
        assert self._coordinator is not None
        m = self._coordinator.membership
        if m.state is MemberState.FENCED:
            return Changes(lost=m.owned)
        return Changes(revoke=m.owned)

    async def _rebalance(self, changes: Changes) -> None:
        """Go through `changes` with the listener's callbacks (awaited when coroutines).
        Records a face holds of partitions given up come again from the core first, so
        positions and commits count only what the application received."""
        gone = changes.lost | changes.revoke
        if gone and self._held is not None:
            self._rewind(self._held.give_back(gone))
        failure: BaseException | None = None
        for step, partitions in _steps(changes):
            await self._start_step(step, partitions)
            try:
                outcome = _callback(self._listener, step)(set(partitions))
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception as exc:
                log.exception("rebalance callback for %s failed", step)
                failure = failure or exc
            self._finish_step(step, partitions)
        if failure is not None:
            raise failure

    async def _start_step(self, step: str, partitions: Partitions) -> None:
        """Before a rebalance callback. Revoked and lost partitions are no longer fetched,
        and their buffered records are dropped; revoked ones (not lost ones: the member was
        fenced) have their positions committed first with enable_auto_commit. Assigned
        partitions are added, to start at their committed offsets."""
        if step == "assign":
            for tp in sorted(partitions):
                self._add(tp)
            self._wake_fetcher()
            return
        for tp in partitions:
            if tp in self._positions:
                self._revoking.add(tp)
                self._buffers[tp].clear()
                self._fetch_offsets.pop(tp, None)
                self._epochs[tp] += 1
        if step == "revoke" and self.config.enable_auto_commit:
            positions = self._consumed_positions()
            owned = {tp: positions[tp] for tp in partitions if tp in positions}
            try:
                await self._commit_group(owned)
            except MinibrokerError as exc:
                log.warning("auto-commit before revoking %s failed: %s", sorted(partitions), exc)

    def _finish_step(self, step: str, partitions: Partitions) -> None:
        """After a rebalance callback: tell the group (the next heartbeat releases revoked
        partitions and acknowledges assigned ones)."""
        assert self._coordinator is not None
        m = self._coordinator.membership
        now = monotonic_ms()
        if step == "assign":
            m.assigned(partitions, now)
        else:
            for tp in partitions:
                self._remove(tp)
                if tp in self._assignment:
                    self._assignment.remove(tp)
            if step == "lost":
                m.lost_handled(now)
            else:
                m.revoked(partitions, now)
        self._coordinator.wake()

    def _rewind(self, positions: dict[TopicPartition, int]) -> None:
        """A face hands back records it took but never returned: they come again."""
        for tp, offset in positions.items():
            if tp in self._positions:
                self._set_position(tp, offset)

    async def _commit_group(self, offsets: Offsets) -> None:
        assert self._coordinator is not None
        await self._coordinator.commit(
            normalize_offsets(offsets), as_member=self._coordinator.is_member
        )

    def _auto_commit_due(self) -> bool:
        """Whether auto_commit_interval_ms has passed since the last auto-commit (restarts it)."""
        if not self.config.enable_auto_commit or self._coordinator is None:
            return False
        now = monotonic_ms()
        if now < self._next_auto_commit_ms:
            return False
        self._next_auto_commit_ms = now + self.config.auto_commit_interval_ms
        return True

    def _auto_commit(self, positions: dict[TopicPartition, int]) -> None:
        """Commit what polls returned, asynchronously, where it moved since the last time."""
        assert self._coordinator is not None
        membership = self._coordinator.membership
        changed = {tp: p for tp, p in positions.items() if self._auto_committed.get(tp) != p}
        if not changed or (self._coordinator.is_member and not membership.member_id):
            return
        self._auto_committed.update(changed)
        assert self._tg is not None
        self._tg.start_soon(
            self._commit_in_background, self._coordinator, normalize_offsets(changed), None
        )

    async def _commit_in_background(
        self,
        coordinator: ConsumerCoordinator,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        callback: CommitCallback | None,
    ) -> None:
        error: MinibrokerError | None = None
        try:
            await coordinator.commit(offsets, as_member=coordinator.is_member)
        except MinibrokerError as exc:
            error = exc
            if callback is None:
                log.warning("asynchronous commit failed: %s", exc)
        if callback is not None:
            try:
                callback(offsets, error)
            except Exception:
                log.exception("commit callback failed")

    async def _close_group(self) -> None:
        """On stop: leave the group, or commit a manual assignment's positions."""
        assert self._coordinator is not None
        coordinator = self._coordinator
        if coordinator.is_member:
            with contextlib.suppress(Exception):  # logged by _rebalance; closing goes on
                await self._rebalance(self._leaving_changes())
            await coordinator.leave()
        elif self.config.enable_auto_commit and self._assignment:
            try:
                await self._commit_group(self._consumed_positions())
            except MinibrokerError as exc:
                log.warning("auto-commit on close failed: %s", exc)

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
        order = [
            tp for tp in self._assignment if (not only or tp in only) and tp not in self._revoking
        ]
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
        except AuthenticationFailedError as exc:
            self._fatal = exc  # every poll raises it from now on
            self._notify_data()
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
                pending = [
                    tp
                    for tp in self._assignment
                    if self._positions.get(tp) is None and tp not in self._revoking
                ]
                if pending:
                    targets = pending
                    await self._reset_positions(pending)
                targets = [
                    tp
                    for tp in self._assignment
                    if self._positions.get(tp) is not None
                    and tp not in self._errors
                    and tp not in self._revoking
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
            except AuthenticationFailedError:
                raise  # fatal for the whole consumer, not for these partitions: see _fetcher
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
            position = self._positions.get(tp)
            if position is None or tp in self._revoking:
                continue  # unassigned, reset or being revoked while the connection was awaited
            offset = self._fetch_offsets.setdefault(tp, position)
            sent[tp] = (offset, self._epochs[tp])
            by_topic.setdefault(tp.topic, []).append(
                FetchPartition(tp.partition, offset, cfg.max_partition_fetch_bytes)
            )
        if not sent:
            return
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
                        self._out_of_range[tp] = offset
                elif part.error in RETRIABLE:
                    backoff = True
                else:
                    why = denial(part.error, cfg.security.principal, "read", topic)
                    self._errors[tp] = error_for(part.error, f"fetch {topic}-{part.partition}", why)
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

    def _metadata_request(self, topic: str) -> MetadataRequest:
        return metadata_request(topic, allow_auto_create=self.config.allow_auto_create_topics)

    async def _partition_count(self, topic: str) -> int | None:
        response = await self._control(self._metadata_request(topic))
        return partition_count(response, topic, self.config.security.principal)

    async def _reset_positions(self, tps: list[TopicPartition]) -> None:
        """Positions for partitions that have none: the group's committed offset for a new
        partition of a group, else (or when there is none) auto_offset_reset."""
        from_group = [tp for tp in tps if tp in self._from_committed]
        if from_group:
            assert self._coordinator is not None
            committed = await self._coordinator.committed(
                from_group, require_stable=self.config.read_committed
            )
            for tp, found in committed.items():
                self._from_committed.discard(tp)
                if found is not None and tp in self._positions and self._positions[tp] is None:
                    self._set_position(tp, found.offset)
        rest = [tp for tp in tps if tp in self._positions and self._positions[tp] is None]
        if not rest:
            return
        policy = self.config.auto_offset_reset
        if policy == "none":
            why = "no committed offset" if from_group else "no position"
            for tp in rest:
                self._errors[tp] = NoOffsetForPartitionError(tp.topic, tp.partition, why)
            return
        timestamp = TIMESTAMP_EARLIEST if policy == "earliest" else TIMESTAMP_LATEST
        for tp, offset in (await self._list_offsets(rest, timestamp)).items():
            if tp in self._positions and self._positions[tp] is None:  # not sought meanwhile
                lost = self._out_of_range.pop(tp, None)
                self._set_position(tp, offset)
                if lost is not None:
                    # Records are skipped or read again: worth a warning, unlike Kafka's INFO.
                    log.warning(
                        "offset %d is out of range for %s-%d: reset to %d, the %s offset "
                        "(auto_offset_reset=%r)",
                        lost,
                        tp.topic,
                        tp.partition,
                        offset,
                        policy,
                        policy,
                    )

    async def _list_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timestamp: int
    ) -> dict[TopicPartition, int]:
        return await self.look_up(self.offsets_lookup(partitions, timestamp))

    async def _control(
        self, request: Request, *, checked: bool = True, deadline: float | None = None
    ) -> Any:
        """One request on the control connection, retried across reconnects until
        `deadline` (time.monotonic(); request_timeout_ms from now if None); a top-level
        error raises when `checked`. NoBrokersAvailable when no broker was ever reached
        (client.connection.Reconnector)."""
        assert self._tg is not None, "consumer is not started"
        timeout_s = self.config.request_timeout_ms / 1000
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        while True:
            try:
                conn = self._control_connector.current
                if conn is None or conn.closed:
                    # Bounded only when it must connect: a timed scope costs 13-17 µs.
                    with anyio.fail_after(max(deadline - time.monotonic(), 0)):
                        conn = await self._control_connector.get(self._tg, fail_unreached=True)
                assert conn is not None
                response = await conn.request(request, timeout_s)
            except (ConnectionLostError, TimeoutError) as exc:
                if time.monotonic() >= deadline:
                    # A bare timeout says nothing; the connection error behind it does.
                    cause = self._control_connector.last_error or exc
                    raise self.timed_out(request, cause) from cause
                await anyio.sleep(self.config.retry_backoff_ms / 1000)
                continue
            if checked:
                check(response, request.api)
            return response

    def timed_out(self, request: Request, cause: BaseException) -> MinibrokerTimeoutError:
        """What a control request that failed until its deadline raises, `cause` its last
        failure."""
        return MinibrokerTimeoutError(
            f"{request.api} failed within request_timeout_ms="
            f"{self.config.request_timeout_ms}: {cause or 'timed out'}"
        )


def topics_lookup() -> Lookup[set[str]]:
    """The names of every topic. A new request each time: encoding sets its envelope in
    place, and two threads may encode at once."""
    return Lookup(
        MetadataRequest(topics=None),
        lambda response: {t.name for t in response.topics if not t.error},
    )


class _LocalRecords:
    """The sync Consumer's records taken from the core and not returned yet, as entries
    [partition, records, index of the next one]. The core reads and drops them
    (HeldRecords) only while the application's thread waits for it."""

    def __init__(self) -> None:
        self.entries: deque[list[Any]] = deque()

    def unreturned(self, only: Partitions | None = None) -> dict[TopicPartition, int]:
        first: dict[TopicPartition, int] = {}
        for tp, records, index in self.entries:
            if index < len(records) and tp not in first and (only is None or tp in only):
                first[tp] = records[index].offset
        return first

    def give_back(self, partitions: Partitions | None = None) -> dict[TopicPartition, int]:
        """Drop the entries of `partitions` (all by default); the offsets they start at."""
        rewind = self.unreturned(partitions)
        keep: deque[list[Any]] = deque()
        for entry in self.entries:
            if partitions is None or entry[0] in partitions:
                entry[2] = len(entry[1])  # ends it for an iteration in progress
            else:
                keep.append(entry)
        self.entries.clear()
        self.entries.extend(keep)
        return rewind


class _OnPollingThread(ConsumerRebalanceListener):
    """A sync Consumer's listener, its callbacks run on the thread that polls: that
    thread waits in `call_serving` while the core goes through the rebalance."""

    def __init__(self, listener: ConsumerRebalanceListener, thread: PortalThread) -> None:
        self._listener = listener
        self._thread = thread

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._run(self._listener.on_partitions_revoked, revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._run(self._listener.on_partitions_assigned, assigned)

    async def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        await self._run(self._listener.on_partitions_lost, lost)

    async def _run(
        self, callback: Callable[[set[TopicPartition]], Any], partitions: set[TopicPartition]
    ) -> None:
        if inspect.isawaitable(await self._thread.on_caller(callback, partitions)):
            raise TypeError("the sync Consumer's rebalance callbacks are plain functions")


def _seek_back(core: AsyncConsumer, positions: dict[TopicPartition, int]) -> None:
    """On the I/O thread: records handed back come again, for partitions still assigned."""
    assigned = core.assignment()
    for tp, offset in positions.items():
        if tp in assigned:
            core.seek(tp, offset)


class Consumer:
    """The synchronous consumer: `AsyncConsumer` on a private daemon thread.

    kafka-python's surface: `poll()`, iteration (ending after
    consumer_timeout_ms without records), `assign`/`seek`/`position`,
    `end_offsets`/`beginning_offsets`, `partitions_for_topic`, `close`, and with a
    `group_id` `subscribe`/`unsubscribe`, `commit`/`commit_async`/`committed`,
    `group_metadata`. Rebalance callbacks are plain functions, run on the thread
    that polls.

    Records cross from the I/O thread REFILL_RECORDS at a time into a local
    buffer that `poll()` and iteration serve from, so a poll of 500 records
    does not pay a cross-thread call. Records there are not consumed yet: the
    positions that commit (and a revoked partition's) are those of the records
    actually returned."""

    def __init__(
        self,
        *assigned: Assignable,
        topics: Iterable[str] | None = None,
        listener: ConsumerRebalanceListener | None = None,
        bootstrap_servers: str | Sequence[str] = "127.0.0.1:9092",
        **config: Any,
    ) -> None:
        self._thread = PortalThread("minibroker-consumer")
        self._portal = self._thread.portal
        self._held = _LocalRecords()
        self._local = self._held.entries
        self._closed = False
        try:
            # Built on the I/O thread, so that its AnyIO locks and events belong to that
            # thread's event loop even when the caller runs inside another one (trio).
            self._core = core = self._thread.call(
                partial(
                    AsyncConsumer,
                    *assigned,
                    topics=topics,
                    listener=self._on_polling_thread(listener),
                    bootstrap_servers=bootstrap_servers,
                    held=self._held,
                    **config,
                )
            )
            self.config = core.config
            self._direct = DirectRequests(core.control_connector)
            self._lifetime, self._events = self._portal.start_task(self._run_core)
        except BaseException:
            self._thread.close()
            raise

    async def _run_core(
        self, *, task_status: anyio.abc.TaskStatus[tuple[anyio.Event, anyio.Event]]
    ) -> None:
        """The core from start to stop in this one task, as its task group needs: it
        stops once the first event handed back at start is set, then sets the second."""
        release, stopped = anyio.Event(), anyio.Event()
        try:
            async with self._core:
                task_status.started((release, stopped))
                await release.wait()
        finally:
            stopped.set()

    async def _stop_core(self) -> None:
        release, stopped = self._events
        release.set()
        await stopped.wait()

    def _on_polling_thread(
        self, listener: ConsumerRebalanceListener | None
    ) -> ConsumerRebalanceListener | None:
        return None if listener is None else _OnPollingThread(listener, self._thread)

    # ------------------------------------------------------------------ the group

    def subscribe(
        self, topics: Iterable[str], listener: ConsumerRebalanceListener | None = None
    ) -> None:
        """See AsyncConsumer.subscribe; the listener's methods are plain functions here."""
        self._thread.call(self._core.subscribe, list(topics), self._on_polling_thread(listener))

    def unsubscribe(self) -> None:
        """Give up every partition (auto-commit, then on_partitions_revoked) and leave."""
        self._thread.call_serving(self._core.unsubscribe)

    def subscription(self) -> set[str]:
        return self._thread.call(self._core.subscription)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._thread.call(self._core.group_metadata)

    def commit(self, offsets: Offsets | None = None) -> None:
        """See AsyncConsumer.commit: by default the positions of the records returned so far."""
        self._thread.call(self._core.commit, offsets)

    def commit_async(
        self, offsets: Offsets | None = None, callback: CommitCallback | None = None
    ) -> None:
        """Start a commit and return; `callback(offsets, error or None)` runs on the I/O thread."""
        self._thread.call(self._core.commit_async, offsets, callback)

    def committed(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        return self._thread.call(self._core.committed, partition)

    def _group_work(self) -> None:
        """What Kafka's poll does for the group: rebalance callbacks and auto-commit."""
        self._thread.call_serving(self._core.poll_group)

    def _give_back(self) -> None:
        """Return every local record not yet handed out to the core, so that positions
        and commits count only what the application received."""
        rewind = self._held.give_back()
        if rewind:
            self._thread.call(_seek_back, self._core, rewind)

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        self._drop_pending()
        self._thread.call(self._core.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._thread.call(self._core.assignment)

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        self._drop_pending()
        self._thread.call(self._core.seek, partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._drop_pending()
        self._thread.call(self._core.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._drop_pending()
        self._thread.call(self._core.seek_to_end, *partitions)

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        tp = TopicPartition(*partition)
        for entry in self._local:
            if entry[0] == tp:
                return entry[1][entry[2]].offset
        return self._thread.call(self._core.position, tp)

    def end_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, int]:
        return self._look_up(self._core.offsets_lookup(list(partitions), TIMESTAMP_LATEST))

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, int]:
        return self._look_up(self._core.offsets_lookup(list(partitions), TIMESTAMP_EARLIEST))

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        return self._thread.call(self._core.offsets_for_times, timestamps)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._look_up(self._core.partitions_lookup(topic))

    def topics(self) -> set[str]:
        return self._look_up(topics_lookup())

    def _look_up(self, lookup: Lookup[T]) -> T:
        """`lookup` made on this thread when it can be (client.connection.DirectRequests),
        else through the event loop with what is left of the same request_timeout_ms."""
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        if not self._closed:
            try:
                response = self._direct.request(lookup.request, deadline)
            except ConnectionLostError as exc:
                raise self._core.timed_out(lookup.request, exc) from exc
            if response is not None:
                return lookup.answer(response)
        return self._thread.call(self._core.look_up, lookup, deadline)

    def poll(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition (at most max_records, default max_poll_records), waiting up
        to `timeout_ms` for the first. A subscribed consumer runs its rebalance callbacks
        and auto-commits here, as Kafka's poll does."""
        limit = max_records or self.config.max_poll_records
        local = self._local
        if local:
            self._group_work()
        else:
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
        """Take records from the core, waiting up to `timeout_ms`, after the group's work
        (a rebalance's callbacks run on this thread meanwhile)."""
        take = partial(
            self._core.getmany, timeout_ms=timeout_ms, max_records=max(at_least, REFILL_RECORDS)
        )
        for tp, records in self._thread.call_serving(take).items():
            self._local.append([tp, records, 0])

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records one by one; ends after consumer_timeout_ms without any (like kafka-python).

        A generator, cheaper per record than `__next__` (which `next(consumer)` uses)."""
        local = self._local
        while True:
            if local and self._core.rebalance_due:
                self._group_work()
            if not local:
                try:
                    self._wait_for_records()
                except StopIteration:
                    return
            entry = local[0]
            records = entry[1]
            last = len(records) - 1
            # entry[2] is the shared cursor: progress survives a `break` in the caller's
            # loop, and a seek (which empties the buffer) ends this entry at once.
            while (index := entry[2]) < last:
                entry[2] = index + 1
                yield records[index]
            # Off the buffer before the caller has its last record: a `break` there must
            # not leave a used-up entry for poll(), position() or next().
            if local and local[0] is entry:
                local.popleft()
            if entry[2] == last:
                entry[2] = last + 1
                yield records[last]

    def __next__(self) -> ConsumerRecord:
        local = self._local
        if local and self._core.rebalance_due:
            self._group_work()
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
        """Records buffered locally are stale after a seek or reassignment: hand them back."""
        self._give_back()

    def close(self) -> None:
        """Leave the group (revoking: auto-commit, then on_partitions_revoked on this thread)
        or commit a manual assignment's positions (enable_auto_commit), then stop."""
        if self._closed:
            return
        self._closed = True
        self._direct.close()
        try:
            self._thread.call_serving(self._stop_core)
            self._lifetime.result()
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
