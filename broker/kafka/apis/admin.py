"""The administrator's APIs: CreateTopics (v2-7), DeleteTopics (v1-6) and
DescribeConfigs (v1-4, topics and the broker)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker.kafka.api import Exchange, KafkaApi, Reply, Translated, Values
from protocol import messages as m
from protocol.errors import ErrorCode

RESOURCE_TYPES = {2: "topic", 4: "broker"}
"""Kafka's DescribeConfigs resource types, by the broker's names for them."""
_TYPES = {name: code for code, name in RESOURCE_TYPES.items()}
SOURCES = {"topic": 1, "broker": 4, "default": 5}
"""DescribeConfigs' sources as Kafka numbers them: DYNAMIC_TOPIC_CONFIG,
STATIC_BROKER_CONFIG (the broker's TOML and flags), DEFAULT_CONFIG."""


@dataclass(frozen=True, slots=True)
class TopicsAsked:
    """What a CreateTopics answer needs beyond the broker's: the topics refused here
    (name -> code, message), never sent to the broker, and the order they were asked in."""

    refused: dict[str, tuple[int, str]]
    order: list[str]


@dataclass(frozen=True, slots=True)
class ConfigsAsked:
    """What a DescribeConfigs answer needs beyond the broker's: each resource's keys
    asked for (null or empty: all)."""

    keys: list[Any]


def translate_create_topics(req: Any, _version: int, ex: Exchange) -> Translated[TopicsAsked]:
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
    asked = TopicsAsked(refused, [t.name for t in req.topics])
    return Translated(m.CreateTopicsRequest(topics=topics), asked)


def answer_create_topics(r: m.CreateTopicsResponse, _version: int, asked: TopicsAsked) -> Values:
    answered = {t.name: (t.error, t.message) for t in r.topics}
    answered.update(asked.refused)
    ids = {t.name: uuid.UUID(bytes=t.topic_id) for t in r.topics if t.topic_id}
    return {
        "topics": [
            {
                "name": name,
                "topic_id": ids.get(name),
                "error_code": answered[name][0],
                "error_message": answered[name][1],
                "num_partitions": -1,
                "replication_factor": -1,
            }
            for name in asked.order
        ]
    }


def translate_delete_topics(req: Any, version: int, _ex: Exchange) -> m.Request:
    names = list(req.topic_names) if version < 6 else [t.name or "" for t in req.topics]
    return m.DeleteTopicsRequest(topics=names)


def answer_delete_topics(r: m.DeleteTopicsResponse, _version: int, _asked: None) -> Values:
    return {
        "responses": [
            {"name": t.name, "error_code": t.error, "error_message": t.message} for t in r.topics
        ]
    }


def translate_describe_configs(
    req: Any, _version: int, _ex: Exchange
) -> Translated[ConfigsAsked] | Reply:
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
    request = m.DescribeConfigsRequest(
        resources=[
            m.ConfigResource(RESOURCE_TYPES[r.resource_type], r.resource_name)
            for r in req.resources
        ]
    )
    return Translated(request, ConfigsAsked([r.configuration_keys for r in req.resources]))


def answer_describe_configs(
    r: m.DescribeConfigsResponse, _version: int, asked: ConfigsAsked
) -> Values:
    results = []
    for result, keys in zip(r.results, asked.keys, strict=True):
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


CREATE_TOPICS: KafkaApi[TopicsAsked] = KafkaApi(
    19, "CreateTopics", 2, 7, translate_create_topics, answer_create_topics
)
DELETE_TOPICS = KafkaApi(20, "DeleteTopics", 1, 6, translate_delete_topics, answer_delete_topics)
DESCRIBE_CONFIGS: KafkaApi[ConfigsAsked] = KafkaApi(
    32, "DescribeConfigs", 1, 4, translate_describe_configs, answer_describe_configs
)
APIS = (CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS)
