"""The small value types of the public API, as NamedTuples like kafka-python's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple


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


class OffsetAndMetadata(NamedTuple):
    """A committed offset: the offset of the NEXT record to read (Kafka's meaning), and an
    optional string stored with it."""

    offset: int
    metadata: str | None = None


class ConsumerGroupMetadata(NamedTuple):
    """Who commits: what `consumer.group_metadata()` hands to
    `producer.send_offsets_to_transaction()` so the broker can fence a stale member.
    A consumer with manual assignment commits as member "" with epoch -1."""

    group_id: str
    member_id: str = ""
    member_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TxnHandle:
    """A prepared transaction, as `prepare_transaction()` returns it: what any process needs
    to commit or abort it with `admin.commit_transactions` / `abort_transactions`.

    Plain values only, so it pickles (Spark ships it from executor to driver) and
    goes through JSON with `to_dict()` / `from_dict()`."""

    transactional_id: str
    producer_id: int
    producer_epoch: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TxnHandle:
        return cls(
            str(data["transactional_id"]), int(data["producer_id"]), int(data["producer_epoch"])
        )


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition of `admin.describe_topic`: its leader and its offsets' range."""

    partition: int
    leader: int
    beginning_offset: int  # -1 when the broker did not answer for the partition
    end_offset: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """What `admin.describe_topic` returns (the shape of kafka-python's describe_topics)."""

    topic: str
    partitions: list[PartitionDescription]


CONFIG_RESOURCE_TYPES = ("topic", "broker")
ALTER_CONFIG_OPS = ("set", "delete")


@dataclass(frozen=True, slots=True)
class ConfigResource:
    """A topic or the broker whose settings `admin.describe_configs` and
    `admin.incremental_alter_configs` name (confluent-kafka's ConfigResource):
    `ConfigResource("topic", "orders")`, `ConfigResource("broker", "0")`."""

    type: str
    name: str

    def __post_init__(self) -> None:
        if self.type not in CONFIG_RESOURCE_TYPES:
            raise ValueError(
                f"config resource type {self.type!r}: expected one of {CONFIG_RESOURCE_TYPES}"
            )


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One setting as the broker describes it. `value` is None for a sensitive one;
    `source` is "topic" (the topic's override), "broker" (the broker's settings) or
    "default"; a `read_only` one changes only with a restart."""

    name: str
    value: str | None
    source: str
    read_only: bool
    sensitive: bool


@dataclass(frozen=True, slots=True)
class ConfigDescription:
    """What `admin.describe_configs` returns per resource: every setting it has."""

    resource: ConfigResource
    entries: list[ConfigEntry]

    def get(self, name: str) -> ConfigEntry | None:
        """The entry of setting `name`, or None when the resource has no such setting."""
        return next((e for e in self.entries if e.name == name), None)


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    """One change of `admin.incremental_alter_configs` (confluent-kafka's
    AlterConfigOpType): `AlterConfigOp("retention.ms", "set", "3600000")` sets an
    override, `AlterConfigOp("retention.ms", "delete")` drops it (the broker's value
    applies again)."""

    name: str
    op: str
    value: str | None = None

    def __post_init__(self) -> None:
        if self.op not in ALTER_CONFIG_OPS:
            raise ValueError(f"config op {self.op!r}: expected one of {ALTER_CONFIG_OPS}")
        if self.op == "set" and self.value is None:
            raise ValueError(f"setting {self.name!r} needs a value")


class CommitTxnsResult(NamedTuple):
    """The outcome of `admin.commit_transactions` / `abort_transactions`.

    `already_committed`: the app version asked for was at or below the recorded one,
    so nothing was committed (the listed transactions still open were aborted).
    `txn_app_version`: the app's recorded version after the call, -1 without an app."""

    already_committed: bool
    txn_app_version: int
