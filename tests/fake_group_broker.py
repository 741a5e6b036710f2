"""An in-process fake broker for the consumer's group tests: the group layer, faked.

Records live in memory (`append`); Metadata, ListOffsets and Fetch serve them
as real batches. The group side is a KIP-848 coordinator small enough to read:
members are named on join, the target assignment is round-robin over the
members in join order, and a partition is handed to its new owner only once no
other member's heartbeat lists it as owned (so no partition ever has two
owners); a member's epoch moves with its assignment, a wrong epoch is fenced, and
committed offsets are kept in a dict. Tests can script errors per api
(`errors`), act before an answer (`hooks`), mark offsets unstable (`unstable`)
and drop members (`expire`).

It lets the client be tested before, and beside, the real broker's coordinator,
with control over what the real one only does on timers.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from client.types import TopicPartition
from protocol.batch import build_batch
from protocol.errors import ErrorCode
from protocol.framing import FrameDecoder, frame
from protocol.messages import (
    APIS,
    ApiVersionsResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopicResponse,
    GroupTopicPartitions,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchPartition,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopic,
    PartitionError,
    PartitionMetadata,
    Request,
    Response,
    TopicMetadata,
    TopicPartitionErrors,
    decode_request,
    encode_response,
)

E = ErrorCode
HEARTBEAT_INTERVAL_MS = 40


@dataclass
class Member:
    member_id: str
    epoch: int = 1
    subscription: list[str] = field(default_factory=list)
    owned: set[TopicPartition] = field(default_factory=set)
    sent: set[TopicPartition] | None = None  # the assignment last sent


class FakeGroupBroker:
    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions
        self.logs: dict[TopicPartition, list[bytes]] = {
            TopicPartition(t, p): [] for t, n in partitions.items() for p in range(n)
        }
        self.members: dict[str, Member] = {}
        self.offsets: dict[TopicPartition, tuple[int, str | None]] = {}
        self.unstable: dict[TopicPartition, int] = {}  # answers of 88 still to give
        self.errors: dict[str, list[int]] = {}  # api -> error codes to answer, in order
        self.hooks: dict[str, Callable[[Request], None]] = {}  # api -> called before answering
        self.seen: list[Request] = []
        self.joins = 0
        self.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS
        self.port = 0
        self._data = anyio.Event()

    # ------------------------------------------------------------------ for the tests

    def append(self, topic: str, partition: int, values: list[bytes]) -> None:
        self.logs[TopicPartition(topic, partition)].extend(values)
        self._data.set()
        self._data = anyio.Event()

    def expire(self, member_id: str) -> None:
        """The session timed out: the member is gone, its partitions free."""
        self.members.pop(member_id, None)

    def owners(self) -> dict[TopicPartition, list[str]]:
        out: dict[TopicPartition, list[str]] = {}
        for m in self.members.values():
            for tp in m.owned:
                out.setdefault(tp, []).append(m.member_id)
        return out

    def requests(self, api: str) -> list[Any]:
        return [r for r in self.seen if r.api == api]

    # ------------------------------------------------------------------ serving

    async def answer(self, request: Request) -> Response:
        if request.api == "ApiVersions":
            return ApiVersionsResponse(apis={api: [1, 1] for api in APIS})
        self.seen.append(request)
        hook = self.hooks.get(request.api)
        if hook is not None:
            hook(request)
        scripted = self.errors.get(request.api)
        if scripted:
            return request.response(error=scripted.pop(0))
        handler = getattr(self, f"_{request.api}")
        return await handler(request)

    async def _Metadata(self, r: MetadataRequest) -> MetadataResponse:
        names = r.topics if r.topics is not None else list(self.partitions)
        return MetadataResponse(
            topics=[
                TopicMetadata(
                    n, partitions=[PartitionMetadata(p) for p in range(self.partitions[n])]
                )
                if n in self.partitions
                else TopicMetadata(n, error=E.UNKNOWN_TOPIC_OR_PARTITION)
                for n in names
            ]
        )

    async def _ListOffsets(self, r: ListOffsetsRequest) -> ListOffsetsResponse:
        return ListOffsetsResponse(
            topics=[
                ListOffsetsTopicResponse(
                    t.topic,
                    [
                        ListOffsetsPartitionResponse(
                            p.partition,
                            offset=0
                            if p.timestamp == -2
                            else len(self.logs[TopicPartition(t.topic, p.partition)]),
                        )
                        for p in t.partitions
                    ],
                )
                for t in r.topics
            ]
        )

    async def _Fetch(self, r: FetchRequest) -> FetchResponse:
        with anyio.move_on_after(r.max_wait_ms / 1000):
            while not any(
                len(self.logs[TopicPartition(t.topic, p.partition)]) > p.fetch_offset
                for t in r.topics
                for p in t.partitions
            ):
                await self._data.wait()
        topics = []
        for t in r.topics:
            parts = []
            for p in t.partitions:
                log = self.logs[TopicPartition(t.topic, p.partition)]
                records = b""
                if p.fetch_offset < len(log):
                    batch = bytearray(
                        build_batch([(0, None, v, None) for v in log[p.fetch_offset :]])
                    )
                    struct.pack_into(">q", batch, 0, p.fetch_offset)
                    records = bytes(batch)
                parts.append(
                    FetchPartitionResponse(
                        p.partition,
                        high_watermark=len(log),
                        last_stable_offset=len(log),
                        log_start_offset=0,
                        records=records,
                    )
                )
            topics.append(FetchTopicResponse(t.topic, parts))
        return FetchResponse(topics=topics)

    async def _ConsumerGroupHeartbeat(
        self, r: ConsumerGroupHeartbeatRequest
    ) -> ConsumerGroupHeartbeatResponse:
        if r.member_epoch == 0 and not r.member_id:
            self.joins += 1
            member = Member(f"m{self.joins}")
            self.members[member.member_id] = member
        elif r.member_id not in self.members:
            return ConsumerGroupHeartbeatResponse(error=E.UNKNOWN_MEMBER_ID)
        else:
            member = self.members[r.member_id]
            if r.member_epoch in (-1, -2):  # -2: a static member's leave, same here
                del self.members[r.member_id]
                return ConsumerGroupHeartbeatResponse(
                    member_id=r.member_id, member_epoch=r.member_epoch
                )
            if r.member_epoch != member.epoch:
                return ConsumerGroupHeartbeatResponse(error=E.FENCED_MEMBER_EPOCH)
        if r.subscribed_topics is not None:
            member.subscription = r.subscribed_topics
        if r.owned is not None:
            member.owned = {TopicPartition(t.topic, p) for t in r.owned for p in t.partitions}
        target = self._target()[member.member_id]
        taken = {tp for m in self.members.values() if m is not member for tp in m.owned}
        assignment = {tp for tp in target if tp not in taken}
        if assignment != member.sent:
            if member.sent is not None:
                member.epoch += 1
            member.sent = assignment
            wire = _wire(assignment)
        else:
            wire = None
        return ConsumerGroupHeartbeatResponse(
            member_id=member.member_id,
            member_epoch=member.epoch,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            assignment=wire,
        )

    def _target(self) -> dict[str, set[TopicPartition]]:
        ids = list(self.members)
        target: dict[str, set[TopicPartition]] = {i: set() for i in ids}
        topics = sorted({t for m in self.members.values() for t in m.subscription})
        tps = [TopicPartition(t, p) for t in topics for p in range(self.partitions.get(t, 0))]
        for i, tp in enumerate(tps):
            target[ids[i % len(ids)]].add(tp)
        return target

    async def _OffsetCommit(self, r: OffsetCommitRequest) -> OffsetCommitResponse:
        error = E.NONE
        if not r.member_id and r.member_epoch == -1:
            if self.members:
                error = E.UNKNOWN_MEMBER_ID
        elif r.member_id not in self.members:
            error = E.UNKNOWN_MEMBER_ID
        elif r.member_epoch != self.members[r.member_id].epoch:
            error = E.STALE_MEMBER_EPOCH
        for t in r.topics:
            for p in t.partitions:
                if not error:
                    self.offsets[TopicPartition(t.topic, p.partition)] = (p.offset, p.metadata)
        return OffsetCommitResponse(
            topics=[
                TopicPartitionErrors(
                    t.topic, [PartitionError(p.partition, error) for p in t.partitions]
                )
                for t in r.topics
            ]
        )

    async def _OffsetFetch(self, r: OffsetFetchRequest) -> OffsetFetchResponse:
        assert r.topics is not None
        topics = []
        for t in r.topics:
            parts = []
            for p in t.partitions:
                tp = TopicPartition(t.topic, p)
                if r.require_stable and self.unstable.get(tp, 0) > 0:
                    self.unstable[tp] -= 1
                    parts.append(OffsetFetchPartition(p, error=E.UNSTABLE_OFFSET_COMMIT))
                    continue
                offset, metadata = self.offsets.get(tp, (-1, None))
                parts.append(OffsetFetchPartition(p, offset, metadata))
            topics.append(OffsetFetchTopic(t.topic, parts))
        return OffsetFetchResponse(topics=topics)

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        decoder = FrameDecoder()
        async with stream:
            try:
                async for data in stream:
                    for body in decoder.feed_bodies(data):
                        request = decode_request(body)
                        response = await self.answer(request)
                        await stream.send(frame(encode_response(response, request.cid)))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return


def _wire(partitions: set[TopicPartition]) -> list[GroupTopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [GroupTopicPartitions(t, ps) for t, ps in by_topic.items()]


@asynccontextmanager
async def running(broker: FakeGroupBroker) -> AsyncIterator[str]:
    """Serve `broker` on loopback for the block; yields its bootstrap address."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    broker.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, broker.serve)
        yield f"127.0.0.1:{broker.port}"
        tg.cancel_scope.cancel()
