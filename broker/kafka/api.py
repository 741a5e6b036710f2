"""Kafka requests (kio entities) as the broker's own requests (protocol/messages.py),
so that they run through the same handlers, authorizer and SASL state as the
minibroker listener's.

Each translation returns the broker request, or a `Reply`: what the listener answers
without the handlers (a SaslHandshake, a part of the request the broker does not
serve), as the values of the Kafka response (entities.build).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker.kafka import apis
from protocol import messages as m
from protocol.errors import ErrorCode

NO_GENERATION = -1
"""The generation (and empty member id) of a consumer that commits offsets of
partitions it assigned itself, outside any group's membership."""

RESOURCE_TYPES = {2: "topic", 4: "broker"}
"""Kafka's DescribeConfigs resource types, by the broker's names for them."""


class Reply(NamedTuple):
    """An answer the listener gives itself: the Kafka response's values."""

    values: dict[str, Any]


@dataclass(slots=True)
class Exchange:
    """What a connection's Kafka requests leave for the ones after them."""

    sasl_mechanisms: tuple[str, ...]
    default_partitions: int
    mechanism: str | None = None
    """The mechanism SaslHandshake chose, for the SaslAuthenticate after it."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What the response to the request being translated needs beyond the broker's."""


Translation = Callable[[Any, int, Exchange], "m.Request | Reply"]


def produce(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.ProduceRequest(
        acks=req.acks,
        timeout_ms=_ms(req.timeout),
        transactional_id=req.transactional_id,
        topics=[
            m.ProduceTopic(
                t.name,
                [m.ProducePartition(p.index, p.records or b"") for p in t.partition_data],
            )
            for t in req.topic_data
        ],
    )


def fetch(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.FetchRequest(
        max_wait_ms=_ms(req.max_wait),
        min_bytes=req.min_bytes,
        max_bytes=req.max_bytes,
        isolation_level=req.isolation_level,
        topics=[
            m.FetchTopic(
                t.topic,
                [
                    m.FetchPartition(p.partition, p.fetch_offset, p.partition_max_bytes)
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ],
    )


def list_offsets(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.ListOffsetsRequest(
        isolation_level=getattr(req, "isolation_level", m.ISOLATION_READ_UNCOMMITTED),
        topics=[
            m.ListOffsetsTopic(
                t.name,
                [m.ListOffsetsPartition(p.partition_index, p.timestamp) for p in t.partitions],
            )
            for t in req.topics
        ],
    )


def metadata(req: Any, version: int, _ex: Exchange) -> m.Request:
    topics = None if req.topics is None else [t.name for t in req.topics]
    if version == 0 and not topics:
        topics = None  # v0 asks for every topic with an empty list
    return m.MetadataRequest(
        topics=topics, allow_auto_create=getattr(req, "allow_auto_topic_creation", True)
    )


def find_coordinator(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    """The group coordinator is this broker: a Metadata request without topics answers
    where it is (and passes authentication like any other request)."""
    if getattr(req, "key_type", 0) != 0:
        return Reply(
            {
                "error_code": ErrorCode.UNSUPPORTED_VERSION,
                "error_message": "transaction coordinators are not served yet",
                "node_id": -1,
            }
        )
    return m.MetadataRequest(topics=[])


def create_topics(req: Any, _version: int, ex: Exchange) -> m.Request:
    refused: dict[str, tuple[int, str]] = {}
    topics = []
    for t in req.topics:
        if t.replication_factor not in (-1, 1):
            refused[t.name] = (
                KafkaErrorCode.invalid_replication_factor,
                f"replication factor {t.replication_factor}: this broker keeps one replica",
            )
        elif t.assignments:
            refused[t.name] = (ErrorCode.INVALID_REQUEST, "replica assignments are not served")
        else:
            partitions = ex.default_partitions if t.num_partitions == -1 else t.num_partitions
            config = {c.name: c.value for c in t.configs} or None
            topics.append(m.CreatableTopic(t.name, partitions, config))
    if getattr(req, "validate_only", False):
        refused.update(
            (t.name, (ErrorCode.INVALID_REQUEST, "validate_only is not served")) for t in topics
        )
        topics = []
    ex.extra["refused"] = refused
    ex.extra["order"] = [t.name for t in req.topics]
    return m.CreateTopicsRequest(topics=topics)


def delete_topics(req: Any, version: int, _ex: Exchange) -> m.Request:
    names = list(req.topic_names) if version < 6 else [t.name or "" for t in req.topics]
    return m.DeleteTopicsRequest(topics=names)


def describe_configs(req: Any, _version: int, ex: Exchange) -> m.Request | Reply:
    for r in req.resources:
        if r.resource_type not in RESOURCE_TYPES:
            return Reply(
                {
                    "results": [
                        {
                            "error_code": ErrorCode.INVALID_REQUEST,
                            "error_message": "only topic and broker configs are described",
                            "resource_type": r.resource_type,
                            "resource_name": r.resource_name,
                        }
                        for r in req.resources
                    ]
                }
            )
    ex.extra["keys"] = [r.configuration_keys for r in req.resources]
    return m.DescribeConfigsRequest(
        resources=[
            m.ConfigResource(RESOURCE_TYPES[r.resource_type], r.resource_name)
            for r in req.resources
        ]
    )


def init_producer_id(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    if req.transactional_id is not None:
        return Reply(
            {
                "error_code": ErrorCode.UNSUPPORTED_VERSION,
                "producer_id": -1,
                "producer_epoch": -1,
            }
        )
    return m.InitProducerIdRequest(
        producer_id=getattr(req, "producer_id", -1),
        producer_epoch=getattr(req, "producer_epoch", -1),
    )


def offset_commit(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
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


def offset_fetch(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.OffsetFetchRequest(
        group_id=req.group_id,
        topics=None
        if req.topics is None
        else [m.GroupTopicPartitions(t.name, list(t.partition_indexes)) for t in req.topics],
        require_stable=getattr(req, "require_stable", False),
    )


def sasl_handshake(req: Any, _version: int, ex: Exchange) -> Reply:
    enabled = list(ex.sasl_mechanisms)
    if req.mechanism not in enabled:
        ex.mechanism = None
        return Reply({"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": enabled})
    ex.mechanism = req.mechanism
    return Reply({"error_code": ErrorCode.NONE, "mechanisms": enabled})


def sasl_authenticate(req: Any, _version: int, ex: Exchange) -> m.Request | Reply:
    if ex.mechanism is None:
        return Reply(
            {
                "error_code": KafkaErrorCode.illegal_sasl_state,
                "error_message": "SaslHandshake first: it names the mechanism",
            }
        )
    return m.SaslAuthenticateRequest(mechanism=ex.mechanism, auth_bytes=bytes(req.auth_bytes))


def api_versions(_req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.ApiVersionsRequest()


TRANSLATIONS: dict[int, Translation] = {
    apis.PRODUCE: produce,
    apis.FETCH: fetch,
    apis.LIST_OFFSETS: list_offsets,
    apis.METADATA: metadata,
    apis.OFFSET_COMMIT: offset_commit,
    apis.OFFSET_FETCH: offset_fetch,
    apis.FIND_COORDINATOR: find_coordinator,
    apis.SASL_HANDSHAKE: sasl_handshake,
    apis.API_VERSIONS: api_versions,
    apis.CREATE_TOPICS: create_topics,
    apis.DELETE_TOPICS: delete_topics,
    apis.INIT_PRODUCER_ID: init_producer_id,
    apis.DESCRIBE_CONFIGS: describe_configs,
    apis.SASL_AUTHENTICATE: sasl_authenticate,
}
assert set(TRANSLATIONS) == set(apis.BY_KEY)


def _ms(value: Any) -> int:
    """A kio duration (timedelta) in whole milliseconds."""
    return int(value.total_seconds() * 1000)
