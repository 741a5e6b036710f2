"""The small value types of the public API, as NamedTuples like kafka-python's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where one record landed; offset is -1 when acks=0 or for an old duplicate."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class BatchMetadata(NamedTuple):
    """Where one wire batch of a `send_batch` call landed: offsets base_offset.. +record_count."""

    topic: str
    partition: int
    base_offset: int
    record_count: int


class ConsumerRecord(NamedTuple):
    """One consumed record; headers is a sequence of (str, bytes) pairs, empty when none."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
