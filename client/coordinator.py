"""The consumer's group I/O: the heartbeat task, and the OffsetCommit and OffsetFetch requests
of one group (Kafka's ConsumerCoordinator).

`GroupMembership` (client/group_membership.py, pure) decides what to heartbeat and
when; this shell sends it on the consumer's control connection, never the fetch
one, so a long-polling Fetch cannot delay a heartbeat past the session timeout.
What the application must handle (lost, revoked, assigned partitions) is left
for its next poll, which runs the rebalance callbacks: `on_change` wakes it.

Commits go out one at a time, in call order (a FIFO lock), so an asynchronous
commit sent earlier never lands after a later one and moves an offset back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.abc

from client.accumulator import monotonic_ms
from client.config import ConsumerConfig
from client.connection import Connection, Reconnector
from client.errors import (
    MEMBER_ERRORS,
    AuthenticationFailedError,
    CommitFailedError,
    ConnectionLostError,
    MinibrokerError,
    UnstableOffsetCommitError,
    error_for,
)
from client.group_membership import GroupMembership, MemberState, to_wire
from client.types import OffsetAndMetadata, TopicPartition
from protocol.errors import RETRIABLE, ErrorCode
from protocol.messages import (
    MEMBER_EPOCH_NONE,
    NO_OFFSET,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitTopic,
    OffsetFetchRequest,
    Request,
    TopicPartitionErrors,
)

log = logging.getLogger(f"minibroker.{__name__}")

Control = Callable[[Request], Awaitable[Any]]
_ACTIVE = (MemberState.JOINING, MemberState.STABLE)


def commit_topics(offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> list[OffsetCommitTopic]:
    """Offsets as OffsetCommit and TxnOffsetCommit list them."""
    by_topic: dict[str, list[OffsetCommitPartition]] = {}
    for tp, committed in sorted(offsets.items()):
        by_topic.setdefault(tp.topic, []).append(
            OffsetCommitPartition(tp.partition, committed.offset, committed.metadata)
        )
    return [OffsetCommitTopic(topic, parts) for topic, parts in by_topic.items()]


def commit_errors(
    error: int, topics: list[TopicPartitionErrors], sent: Iterable[TopicPartition]
) -> dict[TopicPartition, int]:
    """The failed partitions of an OffsetCommit or TxnOffsetCommit answer and their codes; a
    top-level error fails them all."""
    if error:
        return dict.fromkeys(sent, error)
    return {
        TopicPartition(t.topic, p.partition): p.error
        for t in topics
        for p in t.partitions
        if p.error
    }


class ConsumerCoordinator:
    """One consumer's group: heartbeats in the background, commits and committed offsets."""

    def __init__(
        self,
        config: ConsumerConfig,
        connector: Reconnector,
        control: Control,
        on_change: Callable[[], None],
    ) -> None:
        assert config.group_id is not None and config.rebalance_timeout_ms is not None
        self.group_id = config.group_id
        self.config = config
        self.membership = GroupMembership(
            config.group_id,
            rebalance_timeout_ms=config.rebalance_timeout_ms,
            max_poll_interval_ms=config.max_poll_interval_ms,
            retry_backoff_ms=config.retry_backoff_ms,
            retry_backoff_max_ms=config.retry_backoff_max_ms,
            instance_id=config.group_instance_id,
        )
        self._connector = connector
        self._control = control
        self._on_change = on_change
        self._tg: anyio.abc.TaskGroup | None = None
        self._wakeup: anyio.Event | None = None
        self._conn: Connection | None = None
        self._commit_lock = anyio.Lock()

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self._wakeup = anyio.Event()
        tg.start_soon(self._heartbeats, name=f"minibroker-heartbeat-{self.group_id}")

    def wake(self) -> None:
        """A heartbeat may be due earlier than planned (subscription or ownership changed)."""
        if self._wakeup is not None:
            self._wakeup.set()

    @property
    def rebalance_due(self) -> bool:
        """Whether the application's next poll has partitions to lose, revoke or take."""
        return bool(self.membership.pending())

    @property
    def is_member(self) -> bool:
        """Subscribed (whether or not the broker has named the member yet)."""
        return self.membership.state is not MemberState.UNSUBSCRIBED

    # ------------------------------------------------------------------ heartbeats

    async def _heartbeats(self) -> None:
        # Never raise: this task shares the consumer's task group.
        try:
            await self._heartbeat_loop()
        except AuthenticationFailedError as exc:
            # Its own words, not "heartbeat task failed": the consumer raises it from every poll.
            self.membership.fail(exc)
            self._on_change()
        except Exception as exc:
            log.exception("group %s: heartbeat task failed", self.group_id)
            self.membership.state = MemberState.FATAL
            self.membership.fatal_error = MinibrokerError(f"heartbeat task failed: {exc!r}")
            self._on_change()

    async def _heartbeat_loop(self) -> None:
        m = self.membership
        timeout_s = self.config.request_timeout_ms / 1000
        assert self._tg is not None
        while True:
            self._wakeup = wakeup = anyio.Event()
            conn = None
            if m.state in _ACTIVE:
                conn = await self._connector.get(self._tg)
                if conn is not self._conn:
                    m.connection_changed()
                    self._conn = conn
            request, deadline = m.poll(monotonic_ms())
            if request is None:
                with anyio.move_on_after(max(deadline - monotonic_ms(), 0) / 1000):
                    await wakeup.wait()
                continue
            assert conn is not None
            try:
                response = await conn.request(request, timeout_s)
            except ConnectionLostError as exc:
                log.info("group %s: heartbeat lost (%s)", self.group_id, exc)
                m.on_heartbeat_failed(monotonic_ms())
                continue
            changes = m.on_heartbeat(response, monotonic_ms())
            if changes.fatal is not None:
                # Raised from the next poll: the application says it, once.
                log.info("group %s: %s", self.group_id, changes.fatal)
            if changes or m.state is MemberState.FENCED:
                self._on_change()

    async def leave(self) -> None:
        """Leave the group (epoch -1), best effort within request_timeout_ms."""
        request = self.membership.leave()
        if request is None or self._tg is None:
            return
        timeout_s = self.config.request_timeout_ms / 1000
        with anyio.move_on_after(timeout_s):
            try:
                conn = await self._connector.get(self._tg)
                assert conn is not None
                response = await conn.request(request, timeout_s)
                if response.error:
                    log.info(
                        "group %s: leave answered %s",
                        self.group_id,
                        ErrorCode.name_of(response.error),
                    )
            except (ConnectionLostError, MinibrokerError) as exc:
                log.info("group %s: leave not sent (%s)", self.group_id, exc)

    # ------------------------------------------------------------------ offsets

    async def commit(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], *, as_member: bool
    ) -> None:
        """Commit `offsets` durably, as this member (or from outside the group: member "" and
        epoch -1). Retriable errors are retried within request_timeout_ms, and a
        STALE_MEMBER_EPOCH with the member's newer epoch; CommitFailedError when the group
        refuses this member."""
        if not offsets:
            return
        m = self.membership
        deadline = monotonic_ms() + self.config.request_timeout_ms
        attempts = 0
        async with self._commit_lock:
            remaining = dict(offsets)
            while True:
                if as_member and not m.member_id:
                    raise CommitFailedError(
                        f"commit to group {self.group_id!r} refused: this consumer is not a "
                        "member right now (it was fenced or left, and is rejoining), so the "
                        "partitions may be another member's"
                    )
                member_id, epoch = (
                    (m.member_id, m.member_epoch) if as_member else ("", MEMBER_EPOCH_NONE)
                )
                request = OffsetCommitRequest(
                    group_id=self.group_id,
                    member_id=member_id,
                    member_epoch=epoch,
                    topics=commit_topics(remaining),
                )
                response = await self._control(request)
                failed = commit_errors(response.error, response.topics, remaining)
                if not failed:
                    return
                remaining = {tp: remaining[tp] for tp in failed if tp in remaining}
                code = next(iter(failed.values()))
                newer_epoch = code == ErrorCode.STALE_MEMBER_EPOCH and m.member_epoch != epoch
                if not (code in RETRIABLE or newer_epoch) or monotonic_ms() >= deadline:
                    where = ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(failed))
                    error = error_for(
                        code,
                        f"commit to group {self.group_id!r} ({where})",
                        response.message,
                    )
                    if as_member and code == ErrorCode.FENCED_INSTANCE_ID:
                        m.fail(error)  # another consumer has this one's instance id: for good
                        self._on_change()
                    elif as_member and code in MEMBER_ERRORS:
                        # The member learns what became of it from its next heartbeat.
                        m.heartbeat_soon(monotonic_ms())
                        self.wake()
                    raise error
                attempts += 1
                if not newer_epoch:
                    await anyio.sleep(self._backoff_s(attempts))

    async def committed(
        self, partitions: Iterable[TopicPartition], *, require_stable: bool, retry: bool = False
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset of each partition (None where it has none).

        With `require_stable` a partition whose offsets wait in an open transaction
        raises UnstableOffsetCommitError, or with `retry` is asked again until
        request_timeout_ms (Kafka's KIP-447 behaviour under read_committed)."""
        tps = frozenset(partitions)
        if not tps:
            return {}
        deadline = monotonic_ms() + self.config.request_timeout_ms
        attempts = 0
        while True:
            request = OffsetFetchRequest(
                group_id=self.group_id, topics=to_wire(tps), require_stable=require_stable
            )
            response = await self._control(request)
            try:
                return self._offsets(response, tps)
            except UnstableOffsetCommitError:
                attempts += 1
                if not retry or monotonic_ms() >= deadline:
                    raise
            await anyio.sleep(self._backoff_s(attempts))

    def _offsets(
        self, response: Any, asked: frozenset[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        context = f"committed offsets of group {self.group_id!r}"
        if response.error:
            raise error_for(response.error, context, response.message)
        found: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(asked)
        for entry in response.topics:
            for part in entry.partitions:
                tp = TopicPartition(entry.topic, part.partition)
                if part.error:
                    raise error_for(part.error, f"{context}, {tp.topic}-{tp.partition}")
                if tp in found and part.offset != NO_OFFSET:
                    found[tp] = OffsetAndMetadata(part.offset, part.metadata)
        return found

    def _backoff_s(self, attempts: int) -> float:
        cfg = self.config
        backoff = cfg.retry_backoff_ms * 2 ** min(attempts - 1, 20)
        return min(backoff, cfg.retry_backoff_max_ms) / 1000


def normalize_offsets(
    offsets: Mapping[Any, int | OffsetAndMetadata],
) -> dict[TopicPartition, OffsetAndMetadata]:
    """`{TopicPartition or (topic, partition): offset, OffsetAndMetadata or (offset, metadata)}`
    as one type."""
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for key, value in offsets.items():
        committed = (
            OffsetAndMetadata(*value) if isinstance(value, tuple) else OffsetAndMetadata(value)
        )
        if not isinstance(committed.offset, int) or committed.offset < 0:
            raise ValueError(f"a committed offset is an int >= 0, got {committed.offset!r}")
        out[TopicPartition(*key)] = committed
    return out
