"""The Kafka APIs a `kafka` listener answers, and at which versions: one table that
ApiVersions, the request decoder and docs/kafka-compatibility.md all read.

The ranges are Apache Kafka 2.8's, the last release whose Produce and Fetch name
topics rather than topic ids (Produce <= 9, Fetch <= 12), with Kafka 4.0's minimums
(KIP-896: Produce from v3, magic 2 only). kafka-python reads the release from these
ranges (2.8); librdkafka enables idempotence from InitProducerId and Produce v3+.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KafkaApi:
    """One Kafka API served, by Kafka's key and name, and the versions answered."""

    key: int
    name: str
    min_version: int
    max_version: int

    def serves(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
INIT_PRODUCER_ID = 22
DESCRIBE_CONFIGS = 32
SASL_AUTHENTICATE = 36

SERVED: tuple[KafkaApi, ...] = (
    KafkaApi(PRODUCE, "Produce", 3, 9),
    KafkaApi(FETCH, "Fetch", 4, 12),
    KafkaApi(LIST_OFFSETS, "ListOffsets", 1, 6),
    KafkaApi(METADATA, "Metadata", 0, 11),
    KafkaApi(OFFSET_COMMIT, "OffsetCommit", 2, 8),
    KafkaApi(OFFSET_FETCH, "OffsetFetch", 1, 7),
    KafkaApi(FIND_COORDINATOR, "FindCoordinator", 0, 3),
    KafkaApi(SASL_HANDSHAKE, "SaslHandshake", 1, 1),
    KafkaApi(API_VERSIONS, "ApiVersions", 0, 3),
    KafkaApi(CREATE_TOPICS, "CreateTopics", 2, 7),
    KafkaApi(DELETE_TOPICS, "DeleteTopics", 1, 6),
    KafkaApi(INIT_PRODUCER_ID, "InitProducerId", 0, 4),
    KafkaApi(DESCRIBE_CONFIGS, "DescribeConfigs", 1, 4),
    KafkaApi(SASL_AUTHENTICATE, "SaslAuthenticate", 0, 2),
)
BY_KEY = {api.key: api for api in SERVED}

NEXT_STEP: dict[str, str] = {
    "JoinGroup": "consumer groups (classic protocol)",
    "SyncGroup": "consumer groups (classic protocol)",
    "Heartbeat": "consumer groups (classic protocol)",
    "LeaveGroup": "consumer groups (classic protocol)",
    "ConsumerGroupHeartbeat": "consumer groups (KIP-848)",
    "AddPartitionsToTxn": "transactions",
    "AddOffsetsToTxn": "transactions",
    "EndTxn": "transactions",
    "TxnOffsetCommit": "transactions",
}
"""APIs not in ApiVersions yet, answered UNSUPPORTED_VERSION in their own response,
and the step that brings them (docs/kafka-compatibility.md)."""


def markdown_table() -> str:
    """The served APIs as docs/kafka-compatibility.md shows them."""
    rows = [
        "| API | key | versions |",
        "|-----|----:|---------:|",
        *(f"| {a.name} | {a.key} | {a.min_version}-{a.max_version} |" for a in SERVED),
    ]
    return "\n".join(rows) + "\n"
