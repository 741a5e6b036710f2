"""The Kafka APIs a `kafka` listener answers, and at which versions: one table, gathered
from the API families' modules beside this one (each declares its `APIS`), that
ApiVersions, the request decoder and docs/kafka-compatibility.md all read. ApiVersions,
whose answer is this table, is declared here.

The ranges are Apache Kafka 2.8's, the last release whose Produce and Fetch name
topics rather than topic ids (Produce <= 9, Fetch <= 12), with Kafka 4.0's minimums
(KIP-896: Produce from v3, magic 2 only). kafka-python reads the release from these
ranges (2.8); librdkafka enables idempotence from InitProducerId and Produce v3+.

A new API family is a module here declaring `APIS`, added to `_FAMILIES`.
"""

from __future__ import annotations

from typing import Any

from broker.kafka.api import Exchange, KafkaApi, Values
from broker.kafka.apis import (
    admin,
    consumer_groups,
    fetch,
    group_offsets,
    groups,
    metadata,
    produce,
    sasl,
    transactions,
)
from protocol import messages as m


def translate_api_versions(_req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.ApiVersionsRequest()


def answer_api_versions(_r: m.ApiVersionsResponse, _version: int, _asked: None) -> Values:
    return {"error_code": 0, "api_keys": supported_ranges()}


API_VERSIONS = KafkaApi(18, "ApiVersions", 0, 3, translate_api_versions, answer_api_versions)

_FAMILIES = (
    produce,
    transactions,
    fetch,
    metadata,
    groups,
    group_offsets,
    consumer_groups,
    admin,
    sasl,
)
SERVED: tuple[KafkaApi[Any], ...] = tuple(
    sorted((API_VERSIONS, *(api for f in _FAMILIES for api in f.APIS)), key=lambda a: a.key)
)
BY_KEY: dict[int, KafkaApi[Any]] = {api.key: api for api in SERVED}
assert len(BY_KEY) == len(SERVED), "two modules declare one API key"


def supported_ranges() -> list[Values]:
    """The served APIs as ApiVersions lists them."""
    return [
        {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
        for a in SERVED
    ]


def markdown_table() -> str:
    """The served APIs as docs/kafka-compatibility.md shows them."""
    rows = [
        "| API | key | versions |",
        "|-----|----:|---------:|",
        *(f"| {a.name} | {a.key} | {a.min_version}-{a.max_version} |" for a in SERVED),
    ]
    return "\n".join(rows) + "\n"
