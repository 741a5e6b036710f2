"""Metadata (v0-11): the cluster as Kafka's clients see it.

A single broker is every partition's leader (node 0, leader epoch 0) and its only
replica; Kafka's leader epoch is not kept. Topic ids (KIP-516, Metadata v10+) are the
topics' own, kept in their meta files; Produce and Fetch stay below the versions that
name topics by id.
"""

from __future__ import annotations

import uuid
from typing import Any

from broker.kafka.api import Exchange, KafkaApi, Values
from protocol import messages as m

CLUSTER_ID = "minibroker"
NODE_ID = 0
LEADER_EPOCH = 0


def translate_metadata(req: Any, version: int, _ex: Exchange) -> m.Request:
    topics = None if req.topics is None else [t.name for t in req.topics]
    if version == 0 and not topics:
        topics = None  # v0 asks for every topic with an empty list
    return m.MetadataRequest(
        topics=topics, allow_auto_create=getattr(req, "allow_auto_topic_creation", True)
    )


def answer_metadata(r: m.MetadataResponse, _version: int, _asked: None) -> Values:
    return {
        "brokers": [{"node_id": b.id, "host": b.host, "port": b.port} for b in r.brokers],
        "cluster_id": CLUSTER_ID,
        "controller_id": NODE_ID,
        "topics": [
            {
                "error_code": t.error,
                "name": t.name,
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


METADATA = KafkaApi(3, "Metadata", 0, 11, translate_metadata, answer_metadata)
APIS = (METADATA,)
