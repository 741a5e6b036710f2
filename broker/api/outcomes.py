"""What a request comes to, as the connection answers it (docs/protocol.md section 4).

An API returns a response or one of these: an `Answer` to send now, a `DurableReply`
(a Produce with acks=-1, appended at once) to send when the group commit has made its
batches durable, a `SyncedReply` (a change written and in force, a TxnOffsetCommit's
say) to send once its records are synced, a `SplicedReply` (a Fetch whose records go
out with sendfile), or `NoAnswer` (acks=0). The connection runs the requests behind a
`DurableReply` or a `SyncedReply` while it waits, and sends the answers in order. The
network and the Kafka codec know the APIs only by these types, so they live apart
from the APIs that make them.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio

from broker.partitions import FlushFailed
from broker.storage import StorageError
from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.framing import splice_frame

if TYPE_CHECKING:
    from broker.partitions import GroupCommitter, Partition
    from broker.storage import FileSpan

DISK_FAILURES: tuple[type[Exception], ...] = (OSError, StorageError)
"""What an API raises when a file it had to write (producer ids, a topic) could not be:
the disk's trouble, which the connection answers as KAFKA_STORAGE_ERROR."""


class Answer(NamedTuple):
    """A response to send now; the connection encodes it under the request's cid.
    A tuple: built per request, where a frozen dataclass costs 0.4 µs."""

    response: m.Response


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """The request gets no response at all (a Produce with acks=0)."""


class DurableReply:
    """An acks=-1 Produce reply that may only be sent once its batches are on disk."""

    __slots__ = ("_committer", "_durable", "_timeout_ms", "_timeout_s", "response")

    def __init__(
        self,
        committer: GroupCommitter,
        response: m.ProduceResponse,
        durable: list[tuple[Partition, int]],
        timeout_ms: int,
        timeout_s: float,
    ) -> None:
        self._committer = committer
        self.response = response
        self._durable = durable
        self._timeout_ms = timeout_ms
        self._timeout_s = timeout_s

    def ready(self) -> bool:
        """True when completing would not wait: lets the writer batch sends."""
        return all(p.log.flushed_offset > last for p, last in self._durable)

    async def complete(self) -> m.ProduceResponse:
        if self.ready():
            # Most replies of a round find it done: no timeout scope to set up.
            return self.response
        failed: set[int] = set()
        with anyio.move_on_after(self._timeout_s) as scope:
            for partition, last_offset in self._durable:
                try:
                    await self._committer.wait_durable(partition, last_offset)
                except FlushFailed:
                    failed.add(id(partition))
        if failed or scope.cancelled_caught:
            late = {
                id(p): "fsync failed"
                if id(p) in failed
                else f"not durable within timeout_ms={self._timeout_ms}"
                for p, last in self._durable
                if id(p) in failed or p.log.flushed_offset <= last
            }
            by_key = {(p.topic, p.index): id(p) for p, _ in self._durable}
            for t in self.response.topics:
                for r in t.partitions:
                    reason = late.get(by_key.get((t.topic, r.partition), 0))
                    if r.error or reason is None:
                        continue
                    r.error = (
                        ErrorCode.KAFKA_STORAGE_ERROR
                        if reason == "fsync failed"
                        else ErrorCode.REQUEST_TIMED_OUT
                    )
                    r.message = reason
        return self.response


class SyncedReply:
    """A response to a change already written and in force, which may only be sent once
    the records it rests on are durable: `durable` syncs them (filling in the
    response's errors itself should a sync fail), `is_durable` says whether it would
    wait. Until then the connection goes on with the requests behind it."""

    __slots__ = ("_durable", "_is_durable", "response")

    def __init__(
        self,
        response: m.Response,
        is_durable: Callable[[], bool],
        durable: Callable[[], Awaitable[None]],
    ) -> None:
        self.response = response
        self._is_durable = is_durable
        self._durable = durable

    def ready(self) -> bool:
        """True when completing would not wait: lets the writer batch sends."""
        return self._is_durable()

    async def complete(self) -> m.Response:
        if not self._is_durable():
            await self._durable()
        return self.response


def storage_failed(response: m.ProduceResponse, message: str) -> None:
    """Answer KAFKA_STORAGE_ERROR for every batch of `response` appended: what they rest
    on (a transaction's partition add) could not be made durable."""
    for t in response.topics:
        for r in t.partitions:
            if not r.error:
                r.error = ErrorCode.KAFKA_STORAGE_ERROR
                r.message = message


class SplicedReply:
    """A Fetch reply whose record bytes go from the log files with os.sendfile.

    It owns its spans' file descriptors until `close`, which the connection
    calls once the reply is sent or dropped."""

    __slots__ = ("holes", "response", "spans")

    def __init__(self, response: m.FetchResponse, spans: list[FileSpan], holes: list[bytes]):
        self.response = response
        self.spans = spans
        self.holes = holes

    def pieces(self, cid: int) -> list[bytes | int]:
        """The frame as bytes to send and, between them, indexes into `spans`."""
        holes = [(hole, span.length) for hole, span in zip(self.holes, self.spans, strict=True)]
        return splice_frame(m.encode_response(self.response, cid), holes)

    def close(self) -> None:
        for span in self.spans:
            os.close(span.fd)
        self.spans = []


Outcome = Answer | DurableReply | SyncedReply | SplicedReply | NoAnswer
"""What a request comes to: answer now, answer once durable, answer from the
log files, or no answer."""


def as_outcome(result: Any) -> Outcome:
    """An API's result as the connection answers it."""
    if result is None:
        return NoAnswer()
    if isinstance(result, m.Response):
        return Answer(result)
    assert isinstance(result, DurableReply | SyncedReply | SplicedReply | NoAnswer), type(result)
    return result
