"""A consumer group's APIs: FindCoordinator (v0-3), OffsetCommit (v2-8) and OffsetFetch
(v1-7). The group coordinator is this broker; commits are served for consumers outside
any group's membership, a member's come with consumer groups (docs/kafka-compatibility.md).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker.kafka.api import Exchange, KafkaApi, Reply, Values
from protocol import messages as m
from protocol.errors import ErrorCode

NO_GENERATION = -1
"""The generation (and empty member id) of a consumer that commits offsets of
partitions it assigned itself, outside any group's membership."""


def translate_find_coordinator(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    """The group coordinator (key type 0) and the transaction coordinator (1) are this
    broker: a Metadata request without topics answers where it is (and passes
    authentication like any other request)."""
    if getattr(req, "key_type", 0) not in (0, 1):
        return Reply(
            {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": f"no coordinator of key type {req.key_type}",
                "node_id": -1,
            }
        )
    return m.MetadataRequest(topics=[])


def answer_find_coordinator(r: m.MetadataResponse, _version: int, _asked: None) -> Values:
    broker = r.brokers[0]
    return {"error_code": 0, "node_id": broker.id, "host": broker.host, "port": broker.port}


def translate_offset_commit(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    """Commits of a consumer outside any group's membership (generation -1, no member
    id); a group member's commits come with consumer groups (next step)."""
    if req.generation_id_or_member_epoch != NO_GENERATION or req.member_id:
        return Reply(
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {
                                "partition_index": p.partition_index,
                                "error_code": KafkaErrorCode.illegal_generation,
                            }
                            for p in t.partitions
                        ],
                    }
                    for t in req.topics
                ]
            }
        )
    return m.OffsetCommitRequest(
        group_id=req.group_id,
        topics=[
            m.OffsetCommitTopic(
                t.name,
                [
                    m.OffsetCommitPartition(
                        p.partition_index, p.committed_offset, p.committed_metadata
                    )
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ],
    )


def answer_offset_commit(r: m.OffsetCommitResponse, _version: int, _asked: None) -> Values:
    return {
        "topics": [
            {
                "name": t.topic,
                "partitions": [
                    {"partition_index": p.partition, "error_code": p.error} for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


def translate_offset_fetch(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.OffsetFetchRequest(
        group_id=req.group_id,
        topics=None
        if req.topics is None
        else [m.GroupTopicPartitions(t.name, list(t.partition_indexes)) for t in req.topics],
        require_stable=getattr(req, "require_stable", False),
    )


def answer_offset_fetch(r: m.OffsetFetchResponse, _version: int, _asked: None) -> Values:
    return {
        "error_code": r.error,
        "topics": [
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
            for t in r.topics
        ],
    }


OFFSET_COMMIT = KafkaApi(8, "OffsetCommit", 2, 8, translate_offset_commit, answer_offset_commit)
OFFSET_FETCH = KafkaApi(9, "OffsetFetch", 1, 7, translate_offset_fetch, answer_offset_fetch)
FIND_COORDINATOR = KafkaApi(
    10, "FindCoordinator", 0, 3, translate_find_coordinator, answer_find_coordinator
)
APIS = (OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR)
