"""Metadata (v0-12): the cluster as Kafka's clients see it.

A single broker is every partition's leader (node 0, leader epoch 0) and its only
replica; Kafka's leader epoch is not kept. Topic ids (KIP-516, Metadata v10+) are the
topics' own, kept in their meta files; Produce and Fetch stay below the versions that
name topics by id.

Metadata v12 may ask for topics by id, as librdkafka does for the topic ids of a
KIP-848 assignment it has not seen: the broker is asked for every topic it may show
the caller and the answer keeps the ones asked for, an id of none of them answered
UNKNOWN_TOPIC_ID (so it tells nothing of topics the caller may not describe). A
lookup by id is rare (a client's cache holds the ids of what it subscribed to), and
this keeps the translation pure.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from broker.kafka.api import Exchange, KafkaApi, Translated, Values
from protocol import messages as m
from protocol.errors import ErrorCode

CLUSTER_ID = "minibroker"
NODE_ID = 0
LEADER_EPOCH = 0
UNKNOWN_TOPIC_ID = 100
"""Kafka's error for a topic id it does not know (the native protocol has no ids)."""


class ById(NamedTuple):
    """A v12 request naming topics by id: the ids asked for, and any names beside them."""

    ids: tuple[bytes, ...]
    names: frozenset[str]


def translate_metadata(
    req: Any, version: int, _ex: Exchange
) -> m.Request | Translated[ById | None]:
    if req.topics is not None and any(t.name is None for t in req.topics):
        ids = tuple(dict.fromkeys(t.topic_id.bytes for t in req.topics if t.name is None))
        names = frozenset(t.name for t in req.topics if t.name is not None)
        return Translated(m.MetadataRequest(topics=None, allow_auto_create=False), ById(ids, names))
    topics = None if req.topics is None else [t.name for t in req.topics]
    if version == 0 and not topics:
        topics = None  # v0 asks for every topic with an empty list
    return m.MetadataRequest(
        topics=topics, allow_auto_create=getattr(req, "allow_auto_topic_creation", True)
    )


def answer_metadata(r: m.MetadataResponse, _version: int, asked: ById | None) -> Values:
    if asked is not None:
        r = _by_id(r, asked)
    return {
        "brokers": [{"node_id": b.id, "host": b.host, "port": b.port} for b in r.brokers],
        "cluster_id": CLUSTER_ID,
        "controller_id": NODE_ID,
        "topics": [
            {
                "error_code": t.error,
                "name": t.name or None,  # "": an id not found (v12 only)
                "topic_id": uuid.UUID(bytes=t.topic_id) if t.topic_id else None,
                "partitions": [
                    {
                        "error_code": p.error,
                        "partition_index": p.partition,
                        "leader_id": p.leader,
                        "leader_epoch": LEADER_EPOCH,
                        "replica_nodes": [p.leader],
                        "isr_nodes": [p.leader],
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ],
    }


def _by_id(r: m.MetadataResponse, asked: ById) -> m.MetadataResponse:
    """The answer for every topic cut to the ones asked for by id or name."""
    by_id = {t.topic_id: t for t in r.topics if t.topic_id}
    by_name = {t.name: t for t in r.topics}
    topics = [
        by_id.get(i) or m.TopicMetadata("", error=UNKNOWN_TOPIC_ID, topic_id=i) for i in asked.ids
    ]
    topics += [
        by_name.get(n) or m.TopicMetadata(n, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        for n in sorted(asked.names)
    ]
    return m.MetadataResponse(brokers=r.brokers, topics=topics)


METADATA = KafkaApi(3, "Metadata", 0, 12, translate_metadata, answer_metadata)
APIS = (METADATA,)
