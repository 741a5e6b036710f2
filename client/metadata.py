"""The producer's partition counts: what send() needs to pick a partition, cached per topic.

A topic's count is learnt once, with a Metadata request that lets the broker
auto-create the topic; while the topic does not exist yet (or has fewer
partitions than asked for), the request is retried until the caller's deadline
(max_block_ms after its send()). The hot path reads `counts` directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from client.accumulator import monotonic_ms
from client.connection import Connection
from client.errors import ConnectionLostError, MinibrokerError, MinibrokerTimeoutError
from client.replies import metadata_request, partition_count
from protocol.errors import ErrorCode

# Retry the metadata of a topic being auto-created this often while send() waits for it.
METADATA_RETRY_S = 0.05


class PartitionCounts:
    """Partition count per topic, loaded on demand over the producer's connection."""

    def __init__(
        self, connect: Callable[[], Awaitable[Connection | None]], request_timeout_s: float
    ) -> None:
        self.counts: dict[str, int] = {}
        self._connect = connect
        self._timeout_s = request_timeout_s

    async def load(self, topic: str, partition: int | None, deadline_ms: float) -> int:
        """`topic`'s partition count once it has `partition`, trying until `deadline_ms`.

        Raises MinibrokerTimeoutError when the topic never showed up, and
        UNKNOWN_TOPIC_OR_PARTITION when it did but without that partition."""
        while True:
            count = None
            with anyio.move_on_after(max(deadline_ms - monotonic_ms(), 0) / 1000):
                count = await self._fetch(topic)
            if count is not None and (partition is None or 0 <= partition < count):
                self.counts[topic] = count
                return count
            if monotonic_ms() >= deadline_ms:
                if count is None:
                    raise MinibrokerTimeoutError(
                        f"topic {topic!r} not available within max_block_ms"
                    )
                raise MinibrokerError(
                    f"partition {partition} of {topic!r} does not exist ({count} partitions)",
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                )
            await anyio.sleep(METADATA_RETRY_S)

    async def _fetch(self, topic: str) -> int | None:
        try:
            conn = await self._connect()
            assert conn is not None
            response = await conn.request(
                metadata_request(topic, allow_auto_create=True), self._timeout_s
            )
        except ConnectionLostError:
            return None
        return partition_count(response, topic)
