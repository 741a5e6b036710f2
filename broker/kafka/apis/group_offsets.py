"""A group's committed offsets as Kafka's admin reads and deletes them: OffsetFetch
(v1-8; v8 names several groups, KIP-709) and OffsetDelete (v0, KIP-496)
(docs/kafka-compatibility.md).

OffsetFetch up to v7 is the broker's own OffsetFetch. From v8 it is a Kafka-only
request answered group by group, each group judged alone (DESCRIBE on the group, its
entry refused GROUP_AUTHORIZATION_FAILED; topics not described are left out, as in
the native OffsetFetch). OffsetDelete needs DELETE on the group and READ on each
topic (docs/protocol.md section 7) and runs on the offsets store, the one both
listeners read, so a deleted offset is gone through either. `GroupOffsetApi`, which
the composition root adds to the broker's APIs, serves both Kafka-only requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from broker.groups import OffsetStore
from broker.kafka.api import Exchange, KafkaApi, Reply, Values
from broker.kafka.kafka_only import KafkaOnlyRequest
from broker.security import Session
from protocol import messages as m
from protocol.authorization import Entries, EntryNeed, Omission, Path, RequestNeed, Requirements
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.errors import ErrorCode, ProtocolError

FIRST_GROUPS_VERSION = 8
"""OffsetFetch's first version naming several groups (KIP-709)."""

# --------------------------------------------------------------------------- the requests


class FetchedGroup(msgspec.Struct):
    group_id: str
    error: int = ErrorCode.NONE
    topics: list[m.OffsetFetchTopic] = msgspec.field(default_factory=list)


class GroupOffsetsAsked(msgspec.Struct):
    group_id: str
    topics: list[m.GroupTopicPartitions] | None


class KafkaOffsetFetchGroupsResponse(m.Response):
    groups: list[FetchedGroup] = msgspec.field(default_factory=list)


class KafkaOffsetFetchGroupsRequest(KafkaOnlyRequest, tag="KafkaOffsetFetchGroups"):
    """OffsetFetch v8+: several groups' committed offsets, each group answered (and
    refused) alone."""

    response = KafkaOffsetFetchGroupsResponse
    requirements = Requirements(
        (
            EntryNeed(Op.DESCRIBE, Res.GROUP, "group_id"),
            Omission(Op.DESCRIBE, Res.TOPIC, Path("topics[].topic"), within=("groups",)),
        ),
        Entries("groups", "groups", lambda g, code, _: FetchedGroup(g.group_id, code)),
    )
    groups: list[GroupOffsetsAsked]
    require_stable: bool

    def entry_count(self) -> int:
        topics = [t for g in self.groups for t in g.topics or ()]
        return len(self.groups) + len(topics) + sum(len(t.partitions) for t in topics)


class OffsetDeleteResponse(m.Response):
    topics: list[m.TopicPartitionErrors] = msgspec.field(default_factory=list)


class OffsetDeleteRequest(KafkaOnlyRequest, tag="OffsetDelete"):
    response = OffsetDeleteResponse
    requirements = Requirements(
        (
            RequestNeed(Op.DELETE, Res.GROUP, Path("group_id")),
            EntryNeed(Op.READ, Res.TOPIC, "topic"),
        ),
        Entries(
            "topics",
            "topics",
            lambda t, code, _: m.TopicPartitionErrors(
                t.topic, [m.PartitionError(p, code) for p in t.partitions]
            ),
        ),
    )
    group_id: str
    topics: list[m.GroupTopicPartitions]

    def entry_count(self) -> int:
        return len(self.topics) + sum(len(t.partitions) for t in self.topics)


class GroupOffsetApi:
    """The Kafka-only offset APIs, on the offsets store."""

    def __init__(self, offsets: OffsetStore) -> None:
        self.offsets = offsets

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        return {
            "KafkaOffsetFetchGroups": lambda req, _session: self.fetch_groups(req),
            "OffsetDelete": lambda req, _session: self.delete(req),
        }

    def fetch_groups(self, req: KafkaOffsetFetchGroupsRequest) -> KafkaOffsetFetchGroupsResponse:
        fetched = []
        for asked in req.groups:
            one = self.offsets.offset_fetch(
                m.OffsetFetchRequest(
                    group_id=asked.group_id, topics=asked.topics, require_stable=req.require_stable
                )
            )
            fetched.append(FetchedGroup(asked.group_id, one.error, one.topics))
        return KafkaOffsetFetchGroupsResponse(groups=fetched)

    async def delete(self, req: OffsetDeleteRequest) -> OffsetDeleteResponse:
        deleted = await self.offsets.delete_offsets(req.group_id, req.topics)
        return OffsetDeleteResponse(
            error=deleted.error, message=deleted.message, topics=deleted.topics
        )


# --------------------------------------------------------------------------- translations


def _topics(named: Iterable[tuple[str, Iterable[int]]]) -> list[m.GroupTopicPartitions]:
    """A Kafka request's (topic, partitions) as the broker's; ValueError when a topic or
    a topic's partition is named twice (INVALID_REQUEST)."""
    out = [m.GroupTopicPartitions(name, list(partitions)) for name, partitions in named]
    _once([t.topic for t in out], "topic")
    for t in out:
        _once(t.partitions, f"partition of topic {t.topic!r}")
    return out


def _fetched(topics: Any) -> list[m.GroupTopicPartitions] | None:
    """An OffsetFetch's topics (None: all of them)."""
    return None if topics is None else _topics((t.name, t.partition_indexes) for t in topics)


def _once(names: list[Any], what: str) -> None:
    if len(set(names)) != len(names):
        raise ValueError(f"a {what} named twice")


def _too_long(*ids: str) -> str | None:
    if any(len(i) > m.IDENTIFIER_CHARS_MAX for i in ids):
        return f"group ids have at most {m.IDENTIFIER_CHARS_MAX} characters"
    return None


def translate_offset_fetch(req: Any, version: int, _ex: Exchange) -> m.Request | Reply:
    """One group up to v7, the broker's own OffsetFetch; several groups from v8. A request
    naming a topic or partition twice, or too long a group id, is refused whole: up to
    v7 by closing the connection (v1 answers no error), from v8 in every group."""
    stable = getattr(req, "require_stable", False)
    if version < FIRST_GROUPS_VERSION:
        try:
            topics = _fetched(req.topics)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
        return m.OffsetFetchRequest(group_id=req.group_id, topics=topics, require_stable=stable)
    try:
        groups = [GroupOffsetsAsked(g.group_id, _fetched(g.topics)) for g in req.groups]
        why = _too_long(*(g.group_id for g in groups))
        if why is not None:
            raise ValueError(why)
        _once([g.group_id for g in groups], "group")
    except ValueError:
        refused = [
            {"group_id": g.group_id, "error_code": ErrorCode.INVALID_REQUEST, "topics": []}
            for g in req.groups
        ]
        return Reply({"groups": refused})
    return KafkaOffsetFetchGroupsRequest(groups=groups, require_stable=stable)


def _fetched_topics(topics: list[m.OffsetFetchTopic]) -> list[Values]:
    return [
        {
            "name": t.topic,
            "partitions": [
                {
                    "partition_index": p.partition,
                    "committed_offset": p.offset,
                    "committed_leader_epoch": -1,
                    "metadata": p.metadata,
                    "error_code": p.error,
                }
                for p in t.partitions
            ],
        }
        for t in topics
    ]


def answer_offset_fetch(
    r: m.OffsetFetchResponse | KafkaOffsetFetchGroupsResponse, _version: int, _asked: None
) -> Values:
    if isinstance(r, KafkaOffsetFetchGroupsResponse):
        return {
            "groups": [
                {"group_id": g.group_id, "error_code": g.error, "topics": _fetched_topics(g.topics)}
                for g in r.groups
            ]
        }
    return {"error_code": r.error, "topics": _fetched_topics(r.topics)}


def translate_offset_delete(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    refused: ErrorCode | None = None
    if not req.group_id:
        refused = ErrorCode.INVALID_GROUP_ID
    elif _too_long(req.group_id) is not None:
        refused = ErrorCode.INVALID_REQUEST
    try:
        topics = _topics((t.name, [p.partition_index for p in t.partitions]) for t in req.topics)
    except ValueError:
        refused = ErrorCode.INVALID_REQUEST
    if refused is not None:
        return Reply({"error_code": refused, "topics": []})
    return OffsetDeleteRequest(group_id=req.group_id, topics=topics)


def answer_offset_delete(r: OffsetDeleteResponse, _version: int, _asked: None) -> Values:
    return {
        "error_code": r.error,
        "topics": [
            {
                "name": t.topic,
                "partitions": [
                    {"partition_index": p.partition, "error_code": p.error} for p in t.partitions
                ],
            }
            for t in r.topics
        ],
    }


OFFSET_FETCH = KafkaApi(9, "OffsetFetch", 1, 8, translate_offset_fetch, answer_offset_fetch)
OFFSET_DELETE = KafkaApi(47, "OffsetDelete", 0, 0, translate_offset_delete, answer_offset_delete)
APIS = (OFFSET_FETCH, OFFSET_DELETE)
