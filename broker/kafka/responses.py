"""The broker's responses (protocol/messages.py) as the values of Kafka's responses
(entities.build fills the version the request had).

A single broker is every partition's leader (node 0, leader epoch 0) and its only
replica; Kafka's leader epoch and topic ids are not kept (Produce and Fetch stay
below the versions that name topics by id).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from broker.kafka import apis
from broker.kafka.api import RESOURCE_TYPES
from protocol import messages as m

CLUSTER_ID = "minibroker"
NODE_ID = 0
LEADER_EPOCH = 0
SOURCES = {"topic": 1, "broker": 4, "default": 5}
"""DescribeConfigs' sources as Kafka numbers them: DYNAMIC_TOPIC_CONFIG,
STATIC_BROKER_CONFIG (the broker's TOML and flags), DEFAULT_CONFIG."""
_TYPES = {name: code for code, name in RESOURCE_TYPES.items()}

Values = dict[str, Any]
# Produce and Fetch answers go out through hot_path.py's encoders; `produce` and `fetch`
# here are the reference those are held to (tests/kafka/test_kafka_wire.py).
Conversion = Callable[[Any, int, dict[str, Any]], Values]


def api_versions(_r: m.ApiVersionsResponse, _version: int, _extra: dict[str, Any]) -> Values:
    return {"error_code": 0, "api_keys": supported_ranges()}


def supported_ranges() -> list[Values]:
    return [
        {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
        for a in apis.SERVED
    ]


def metadata(r: m.MetadataResponse, _version: int, _extra: dict[str, Any]) -> Values:
    return {
        "brokers": [{"node_id": b.id, "host": b.host, "port": b.port} for b in r.brokers],
        "cluster_id": CLUSTER_ID,
        "controller_id": NODE_ID,
        "topics": [
            {
                "error_code": t.error,
                "name": t.name,
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


def find_coordinator(r: m.MetadataResponse, _version: int, _extra: dict[str, Any]) -> Values:
    broker = r.brokers[0]
    return {"error_code": 0, "node_id": broker.id, "host": broker.host, "port": broker.port}


def produce(r: m.ProduceResponse, _version: int, _extra: dict[str, Any]) -> Values:
    return {
        "responses": [
            {
                "name": t.topic,
                "partition_responses": [
                    {
                        "index": p.partition,
                        "error_code": p.error,
                        "base_offset": p.base_offset,
                        "log_append_time": p.log_append_time_ms,
                        "log_start_offset": p.log_start_offset,
                        "error_message": p.message,
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


def fetch(r: m.FetchResponse, _version: int, _extra: dict[str, Any]) -> Values:
    return {
        "error_code": r.error,
        "session_id": 0,  # no fetch sessions (KIP-227): every Fetch names its partitions
        "responses": [
            {
                "topic": t.topic,
                "partitions": [
                    {
                        "partition_index": p.partition,
                        "error_code": p.error,
                        "high_watermark": p.high_watermark,
                        "last_stable_offset": p.last_stable_offset,
                        "log_start_offset": p.log_start_offset,
                        "aborted_transactions": None
                        if p.aborted_transactions is None
                        else [
                            {"producer_id": a.producer_id, "first_offset": a.first_offset}
                            for a in p.aborted_transactions
                        ],
                        "preferred_read_replica": -1,
                        "records": p.records,
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ],
    }


def list_offsets(r: m.ListOffsetsResponse, _version: int, _extra: dict[str, Any]) -> Values:
    return {
        "topics": [
            {
                "name": t.topic,
                "partitions": [
                    {
                        "partition_index": p.partition,
                        "error_code": p.error,
                        "timestamp": p.timestamp,
                        "offset": p.offset,
                        "leader_epoch": LEADER_EPOCH,
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


def create_topics(r: m.CreateTopicsResponse, _version: int, extra: dict[str, Any]) -> Values:
    answered = {t.name: (t.error, t.message) for t in r.topics}
    answered.update(extra["refused"])
    return {
        "topics": [
            {
                "name": name,
                "error_code": answered[name][0],
                "error_message": answered[name][1],
                "num_partitions": -1,
                "replication_factor": -1,
            }
            for name in extra["order"]
        ]
    }


def delete_topics(r: m.DeleteTopicsResponse, _version: int, _extra: dict[str, Any]) -> Values:
    return {
        "responses": [
            {"name": t.name, "error_code": t.error, "error_message": t.message} for t in r.topics
        ]
    }


def describe_configs(r: m.DescribeConfigsResponse, _version: int, extra: dict[str, Any]) -> Values:
    results = []
    for result, keys in zip(r.results, extra["keys"], strict=True):
        wanted = set(keys) if keys else None  # null or empty: all, as Kafka reads it
        results.append(
            {
                "error_code": result.error,
                "resource_type": _TYPES.get(result.type, 0),
                "resource_name": result.name,
                "configs": [
                    {
                        "name": c.name,
                        "value": c.value,
                        "read_only": c.read_only,
                        "config_source": SOURCES.get(c.source, 0),
                        "is_sensitive": c.sensitive,
                        "synonyms": [],
                    }
                    for c in result.configs
                    if wanted is None or c.name in wanted
                ],
            }
        )
    return {"results": results}


def init_producer_id(r: m.InitProducerIdResponse, _version: int, _extra: dict[str, Any]) -> Values:
    return {
        "error_code": r.error,
        "producer_id": r.producer_id,
        "producer_epoch": r.producer_epoch,
    }


def offset_commit(r: m.OffsetCommitResponse, _version: int, _extra: dict[str, Any]) -> Values:
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


def offset_fetch(r: m.OffsetFetchResponse, _version: int, _extra: dict[str, Any]) -> Values:
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


def sasl_authenticate(
    r: m.SaslAuthenticateResponse, _version: int, _extra: dict[str, Any]
) -> Values:
    return {
        "error_code": r.error,
        "error_message": r.error_message or r.message,
        "auth_bytes": r.auth_bytes,
        "session_lifetime": r.session_lifetime_ms,
    }


CONVERSIONS: dict[int, Conversion] = cast(
    dict[int, Conversion],
    {
        apis.PRODUCE: produce,
        apis.FETCH: fetch,
        apis.LIST_OFFSETS: list_offsets,
        apis.METADATA: metadata,
        apis.OFFSET_COMMIT: offset_commit,
        apis.OFFSET_FETCH: offset_fetch,
        apis.FIND_COORDINATOR: find_coordinator,
        apis.API_VERSIONS: api_versions,
        apis.CREATE_TOPICS: create_topics,
        apis.DELETE_TOPICS: delete_topics,
        apis.INIT_PRODUCER_ID: init_producer_id,
        apis.DESCRIBE_CONFIGS: describe_configs,
        apis.SASL_AUTHENTICATE: sasl_authenticate,
    },
)
"""Every served API but SaslHandshake, which the listener answers itself."""
