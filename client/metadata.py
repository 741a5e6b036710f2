"""The producer's partition counts: what send() needs to pick a partition, cached per topic.

A topic's count is learnt once, with a Metadata request; while the topic does not
exist, it is asked again until the caller's deadline (max_block_ms after its
send()), as Kafka's producer waits for a topic's metadata. With
allow_auto_create_topics (Kafka's default) the producer lets the broker create a
missing topic, and says so in a warning: a mistyped topic name must not pass
unseen. A partition number the topic does not have fails at once, and a broker
that was never reached fails as soon as the Reconnector gives up on it. The hot
path reads `counts` directly.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from client.accumulator import monotonic_ms
from client.connection import Connection
from client.errors import (
    ConnectionLostError,
    MinibrokerTimeoutError,
    UnknownPartitionError,
)
from client.replies import metadata_request, partition_count

log = logging.getLogger(f"minibroker.{__name__}")

# Retry the metadata of a topic being auto-created this often while send() waits for it.
METADATA_RETRY_S = 0.05


class PartitionCounts:
    """Partition count per topic, loaded on demand over the producer's connection."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Connection | None]],
        connect_error: Callable[[], BaseException | None],
        *,
        request_timeout_s: float,
        max_block_ms: float,
        allow_auto_create: bool,
    ) -> None:
        self.counts: dict[str, int] = {}
        self._connect = connect
        self._connect_error = connect_error
        self._timeout_s = request_timeout_s
        self._max_block_ms = max_block_ms
        self._allow_auto_create = allow_auto_create
        self._lost: ConnectionLostError | None = None  # the last request's, for the timeout

    async def load(self, topic: str, partition: int | None, deadline_ms: float) -> int:
        """`topic`'s partition count, trying until `deadline_ms`.

        UnknownPartitionError at once when the topic lacks `partition`;
        NoBrokersAvailable when no broker was ever reached (Reconnector);
        MinibrokerTimeoutError, naming what was seen, when the topic never showed up
        or the broker could not be reached again."""
        self._lost = None
        while True:
            count = None
            with anyio.move_on_after(max(deadline_ms - monotonic_ms(), 0) / 1000):
                count = await self._fetch(topic)
            if count is not None:
                if partition is not None and not 0 <= partition < count:
                    raise UnknownPartitionError(topic, partition, count)
                self.counts[topic] = count
                return count
            if monotonic_ms() >= deadline_ms:
                raise self._timeout(topic)
            await anyio.sleep(METADATA_RETRY_S)

    async def _fetch(self, topic: str) -> int | None:
        """The count, or None while the topic does not exist or the connection failed.

        An auto-creating request comes only after a plain one said the topic is missing,
        so that the producer knows it was this request that created it."""
        try:
            conn = await self._connect()
            assert conn is not None
            plain = metadata_request(topic, allow_auto_create=False)
            count = partition_count(
                await conn.request(plain, self._timeout_s), topic, conn.principal
            )
            if count is not None or not self._allow_auto_create:
                return count
            creating = metadata_request(topic, allow_auto_create=True)
            count = partition_count(
                await conn.request(creating, self._timeout_s), topic, conn.principal
            )
        except ConnectionLostError as exc:
            self._lost = exc
            return None
        self._lost = None
        if count is not None:
            log.warning(
                "topic %r did not exist: the broker created it with %d partition%s "
                "(allow_auto_create_topics=False prevents this)",
                topic,
                count,
                "" if count == 1 else "s",
            )
        return count

    def _timeout(self, topic: str) -> MinibrokerTimeoutError:
        """What max_block_ms ran out on: the connection, or the topic's absence."""
        within = f"within max_block_ms={self._max_block_ms:g}"
        cause = self._connect_error() or self._lost
        if cause is not None:
            error = MinibrokerTimeoutError(f"{cause} {within}")
            error.__cause__ = cause
            return error
        why = (
            "the broker does not create topics (its auto_create_topics is off)"
            if self._allow_auto_create
            else "allow_auto_create_topics=False"
        )
        return MinibrokerTimeoutError(f"topic {topic!r} does not exist {within}; {why}")
