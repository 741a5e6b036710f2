"""What the client reads out of the broker's typed answers, written once.

The producer, the consumer and the admin helpers all ask for a topic's
partition count and for offsets; the requests they build and the way an
answer's errors become exceptions live here so all three agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from client.errors import denial, error_for
from client.types import TopicPartition
from protocol.errors import RETRIABLE, ErrorCode
from protocol.messages import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataResponse,
    Request,
    Response,
)

T = TypeVar("T")


def check(response: Response, context: str) -> None:
    """Raise the exception for a top-level error of `response`."""
    if response.error:
        raise error_for(response.error, context, response.message)


@dataclass(frozen=True, slots=True)
class Lookup(Generic[T]):
    """A request and what its answer is read as: made by a core on its event loop, or by a
    sync face on the caller's thread (client/connection.py `DirectRequests`), and read
    the same way by both."""

    request: Request
    read: Callable[[Any], T]

    def answer(self, response: Response) -> T:
        """The value `response` holds; a top-level error raises (`check`)."""
        check(response, self.request.api)
        return self.read(response)


def metadata_request(topic: str, *, allow_auto_create: bool) -> MetadataRequest:
    return MetadataRequest(topics=[topic], allow_auto_create=allow_auto_create)


def partition_count(
    response: MetadataResponse, topic: str, principal: str | None = None
) -> int | None:
    """How many partitions `topic` has, or None while it does not (yet) exist or the
    broker answers with a retriable error; other errors raise (a denial naming
    `principal`, the connection's)."""
    check(response, f"metadata for {topic!r}")
    entry = response.topic(topic)
    if entry is None:
        return None
    if entry.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION or entry.error in RETRIABLE:
        return None
    if entry.error:
        why = denial(entry.error, principal, "describe", topic)
        raise error_for(entry.error, f"metadata for {topic!r}", why)
    return len(entry.partitions) or None


def list_offsets_request(
    partitions: Iterable[TopicPartition | tuple[str, int]], timestamp: int, isolation_level: int
) -> ListOffsetsRequest:
    """One ListOffsets for every partition at `timestamp` (-1 latest, -2 earliest)."""
    by_topic: dict[str, list[ListOffsetsPartition]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(ListOffsetsPartition(partition, timestamp))
    return ListOffsetsRequest(
        topics=[ListOffsetsTopic(topic, parts) for topic, parts in by_topic.items()],
        isolation_level=isolation_level,
    )


def offsets(response: ListOffsetsResponse) -> dict[TopicPartition, int]:
    """The offset per partition of a ListOffsets answer; a partition's error raises."""
    check(response, "list offsets")
    result: dict[TopicPartition, int] = {}
    for entry in response.topics:
        for part in entry.partitions:
            tp = TopicPartition(entry.topic, part.partition)
            if part.error:
                raise error_for(part.error, f"list offsets of {tp.topic}-{tp.partition}")
            result[tp] = part.offset
    return result
