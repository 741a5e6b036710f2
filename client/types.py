"""The small value types of the public API, as NamedTuples like kafka-python's, and the
admin helpers' results as frozen dataclasses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from client.errors import MinibrokerError
from client.security import (
    DEFAULT_ITERATIONS,
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    SCRAM_MECHANISMS,
    SCRAM_SHA_256,
)

E = TypeVar("E", bound=Enum)


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
    """One consumed record; headers is a sequence of (str, bytes) pairs, empty when none.

    A header value is None only in records a Kafka client wrote (its format allows it)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]


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


# --------------------------------------------------------------------------- security


class ResourceType(str, Enum):
    """What an ACL is about (docs/protocol.md section 7)."""

    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactional_id"
    CLUSTER = "cluster"


class PatternType(str, Enum):
    """How an ACL's resource name matches: LITERAL (the name, or `*` for every one) or
    PREFIXED (names starting with it). In filters also ANY (either, the name matched
    exactly) and MATCH (every ACL that applies to the literal name)."""

    LITERAL = "literal"
    PREFIXED = "prefixed"
    ANY = "any"
    MATCH = "match"


class AclOperation(str, Enum):
    ALL = "all"
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    DESCRIBE = "describe"
    DESCRIBE_CONFIGS = "describe_configs"
    ALTER_CONFIGS = "alter_configs"
    IDEMPOTENT_WRITE = "idempotent_write"


class AclPermissionType(str, Enum):
    ALLOW = "allow"
    DENY = "deny"


CLUSTER_NAME = "cluster"
"""The cluster resource's one name."""
_PRINCIPAL_PREFIX = "User:"


def _enum(kind: type[E], value: E | str | None, what: str) -> E | None:
    """`value` as a member of `kind`, from the member or its name or value in any case."""
    if value is None or isinstance(value, kind):
        return value
    text = str(value).strip().lower()
    for member in kind:
        if text in (member.value, member.name.lower()):
            return member
    choices = ", ".join(m.value for m in kind)
    raise ValueError(f"{what} must be one of {choices}, got {value!r}")


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """The resources an ACL is about (kafka-python's and confluent-kafka's ResourcePattern):
    a type, a name (`*` for every one, literally), and whether the name is literal or a
    prefix. Strings are accepted for the enums."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __post_init__(self) -> None:
        _set(self, "resource_type", _enum(ResourceType, self.resource_type, "resource_type"))
        _set(self, "pattern_type", _enum(PatternType, self.pattern_type, "pattern_type"))
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise ValueError("an ACL's pattern_type is literal or prefixed (any and match filter)")
        if not self.resource_name:
            raise ValueError("an ACL's resource_name must not be empty")


@dataclass(frozen=True, slots=True)
class ResourcePatternFilter:
    """Which resource patterns a filter matches; None matches any. pattern_type ANY (or
    None): either pattern type, the name compared exactly; MATCH: every pattern that
    applies to the literal name (the literal name, `*`, and prefixes of it)."""

    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern_type: PatternType | None = None

    def __post_init__(self) -> None:
        _set(self, "resource_type", _enum(ResourceType, self.resource_type, "resource_type"))
        _set(self, "pattern_type", _enum(PatternType, self.pattern_type, "pattern_type"))


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL (kafka-python's ACL, confluent-kafka's AclBinding): `principal`
    ("User:alice", or "User:*" for everyone) from `host` (an IP address or "*") may, or
    may not (`permission_type`), do `operation` on the resources of `resource_pattern`."""

    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType
    resource_pattern: ResourcePattern

    def __post_init__(self) -> None:
        if not str(self.principal).startswith(_PRINCIPAL_PREFIX) or self.principal == "User:":
            raise ValueError(f"a principal is User:<name> or User:*, got {self.principal!r}")
        if not self.host:
            raise ValueError("an ACL's host is an IP address or *, not empty")
        _set(self, "operation", _enum(AclOperation, self.operation, "operation"))
        _set(
            self,
            "permission_type",
            _enum(AclPermissionType, self.permission_type, "permission_type"),
        )

    def __str__(self) -> str:
        p = self.resource_pattern
        return (
            f"{self.permission_type.value} {self.principal} {self.operation.value} on "
            f"{p.resource_type.value} {p.resource_name!r} ({p.pattern_type.value}) "
            f"from {self.host}"
        )


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which ACLs to describe or delete (confluent-kafka's AclBindingFilter, kafka-python's
    ACLFilter); every None matches anything, so `AclBindingFilter()` matches every ACL."""

    principal: str | None = None
    host: str | None = None
    operation: AclOperation | None = None
    permission_type: AclPermissionType | None = None
    resource_pattern: ResourcePatternFilter = field(default_factory=ResourcePatternFilter)

    def __post_init__(self) -> None:
        _set(self, "operation", _enum(AclOperation, self.operation, "operation"))
        _set(
            self,
            "permission_type",
            _enum(AclPermissionType, self.permission_type, "permission_type"),
        )


@dataclass(frozen=True, slots=True)
class CreateAclsResult:
    """What `admin.create_acls` did: each binding is created or refused on its own."""

    created: list[AclBinding]
    failed: list[tuple[AclBinding, MinibrokerError]]


@dataclass(frozen=True, slots=True)
class DeleteAclsResult:
    """What one filter of `admin.delete_acls` deleted, or why it was refused."""

    filter: AclBindingFilter
    deleted: list[AclBinding]
    error: MinibrokerError | None = None


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    """One SCRAM credential of a user, as the broker describes it (never a key)."""

    mechanism: str
    iterations: int


@dataclass(frozen=True, slots=True)
class UserScramCredentialsDescription:
    """A user's SCRAM credentials (`admin.describe_user_scram_credentials`)."""

    user: str
    credentials: list[ScramCredentialInfo]


@dataclass(frozen=True, slots=True)
class UserScramCredentialUpsertion:
    """Set `user`'s credential for `mechanism` from `password` (confluent-kafka's shape).

    The password never leaves the client: it sends KIP-554's salted password,
    Hi(password, salt, iterations), with a fresh random salt unless one is given.
    The password and the salt are left out of the repr."""

    user: str
    password: str = field(repr=False)
    mechanism: str = SCRAM_SHA_256
    iterations: int = DEFAULT_ITERATIONS
    salt: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _check_user_mechanism(self.user, self.mechanism)
        if not self.password:
            raise ValueError(f"the password of {self.user!r} must not be empty")
        if not ITERATIONS_MIN <= self.iterations <= ITERATIONS_MAX:
            raise ValueError(
                f"iterations must be {ITERATIONS_MIN} to {ITERATIONS_MAX}, got {self.iterations}"
            )


@dataclass(frozen=True, slots=True)
class UserScramCredentialDeletion:
    """Delete `user`'s credential for `mechanism`."""

    user: str
    mechanism: str = SCRAM_SHA_256

    def __post_init__(self) -> None:
        _check_user_mechanism(self.user, self.mechanism)


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsResult:
    """One user's outcome of `admin.alter_user_scram_credentials` (all of that user's
    alterations were made, or none): `error` is None when they were."""

    user: str
    error: MinibrokerError | None = None


def _check_user_mechanism(user: str, mechanism: str) -> None:
    if not user:
        raise ValueError("a user name must not be empty")
    if mechanism not in SCRAM_MECHANISMS:
        raise ValueError(f"mechanism must be {' or '.join(SCRAM_MECHANISMS)}, got {mechanism!r}")


def _set(obj: object, name: str, value: object) -> None:
    """Normalize a field of a frozen dataclass in its __post_init__."""
    object.__setattr__(obj, name, value)
