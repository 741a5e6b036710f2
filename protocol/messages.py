"""Typed requests and responses of wire contract version 1 (docs/protocol.md sections 4-7).

Each message is declared once, below, as a `msgspec.Struct`: its fields, types,
defaults and bounds. Encoding, decoding and validation all derive from these
declarations through one encoder and one decoder per direction, so the broker
and the client share a single codec and never touch raw maps.

| api            | request                                   | response                      |
|----------------|-------------------------------------------|-------------------------------|
| ApiVersions    | -                                         | apis, broker_version,         |
|                |                                           | max_frame_bytes               |
| Metadata       | topics (nil: all), allow_auto_create      | brokers, topics               |
| CreateTopics   | topics [{name, partitions, config}]       | topics [{name, error, msg}]   |
| InitProducerId | transactional_id, transaction_timeout_ms, | producer_id, producer_epoch   |
|                | producer_id, producer_epoch               |                               |
| Produce        | acks, timeout_ms, transactional_id,       | topics [{topic, partitions    |
|                | topics [{topic, partitions [{partition,   | [{partition, error,           |
|                | records}]}]                               | base_offset, ...}]}]          |
| Fetch          | max_wait_ms, min_bytes, max_bytes,        | topics [{topic, partitions    |
|                | isolation_level, topics [{topic,          | [{partition, error,           |
|                | partitions [{partition, fetch_offset,     | high_watermark, ...,          |
|                | partition_max_bytes}]}]                   | records}]}]                   |
| ListOffsets    | isolation_level, topics [{topic,          | topics [{topic, partitions    |
|                | partitions [{partition, timestamp}]}]     | [{partition, error, offset,   |
|                |                                           | timestamp}]}]                 |
| DeleteTopics   | topics [str]                              | topics [{name, error, msg}]   |
| DescribeConfigs | resources [{type, name}]                 | results [{type, name, error,  |
|                |                                           | configs [{name, value, ...}]}] |
| IncrementalAlterConfigs | resources [{type, name, ops      | results [{type, name, error,  |
|                | [{name, op, value}]}], validate_only      | message}]                     |
| EndTxn         | transactional_id, producer_id,            | producer_id, producer_epoch   |
|                | producer_epoch, committed,                | (the next transaction's)      |
|                | last_sequences [{topic, partitions        |                               |
|                | [{partition, last_sequence}]}] (nil)      |                               |
| PrepareTxn     | transactional_id, producer_id,            | -                             |
|                | producer_epoch, prepared_timeout_ms,      |                               |
|                | txn_app_id, txn_app_version               |                               |
| CommitTxns     | transactions [{transactional_id,          | already_committed,            |
|                | producer_id, producer_epoch}], committed, | txn_app_version, transactions |
|                | txn_app_id, txn_app_version               | [{transactional_id, error}]   |
| ListTransactions | transactional_id_prefix, states         | transactions [{...state...}]  |
| DescribeTxnApps | txn_app_ids (nil: all)                   | apps [{txn_app_id,            |
|                |                                           | txn_app_version, committed_ms}] |
| ConsumerGroupHeartbeat | group_id, member_id, member_epoch, | member_id, member_epoch,     |
|                | rebalance_timeout_ms, subscribed_topics,  | heartbeat_interval_ms,        |
|                | owned [{topic, partitions}], instance_id  | assignment [{topic, partitions}] |
| OffsetCommit   | group_id, member_id, member_epoch,        | topics [{topic, partitions    |
|                | topics [{topic, partitions [{partition,   | [{partition, error}]}]        |
|                | offset, metadata}]}]                      |                               |
| TxnOffsetCommit | transactional_id, producer_id,           | as OffsetCommit               |
|                | producer_epoch, + OffsetCommit's fields   |                               |
| OffsetFetch    | group_id, topics [{topic, partitions}]    | topics [{topic, partitions    |
|                | (nil: all), require_stable                | [{partition, offset,          |
|                |                                           | metadata, error}]}]           |
| ListGroups     | -                                         | groups [{group_id, state,     |
|                |                                           | members}]                     |
| DescribeGroups | group_ids                                 | groups [{group_id, error,     |
|                |                                           | state, group_epoch, members}] |
| SaslAuthenticate | mechanism, auth_bytes                   | error_message, auth_bytes,    |
|                |                                           | session_lifetime_ms           |
| DescribeUserScramCredentials | users (nil: all)            | results [{user, error,        |
|                |                                           | credentials [{mechanism,      |
|                |                                           | iterations}]}]                |
| AlterUserScramCredentials | deletions [{user, mechanism}], | results [{user, error,        |
|                | upsertions [{user, mechanism, iterations, | message}]                     |
|                | salt, salted_password}]                   |                               |
| CreateAcls     | creations [binding]                       | results [{error, message}]    |
| DescribeAcls   | filter                                    | bindings [binding]            |
| DeleteAcls     | filters [filter]                          | results [{error, deleted      |
|                |                                           | [binding]}]                   |

The classes below are the whole truth; this table is their summary. Each request class
also declares `requirements`: what it needs from the authorizer, section 7's table as
data (protocol/authorization.py), which the broker enforces and docs/security.md shows.
Every request also carries `api` (the struct's tag), `v` and `cid`, and may carry
`client_id`; every response carries `cid`, `error` and, on failure, `message`.
`decode_request` maps a body to its request or raises: `FrameError` where the
contract says to close the connection, `UnsupportedApi` (35) for an unknown api
or version, `InvalidRequest` (42) for missing, mistyped or duplicated fields.
Responses decode leniently: unknown fields are ignored and missing ones take
their defaults, so a client survives a newer broker adding fields.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, TypeVar, Union

import msgpack
import msgspec

from protocol.authorization import (
    NOTHING,
    Entries,
    EntryNeed,
    Omission,
    Path,
    RequestNeed,
    Requirements,
    markdown_table,
)
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.batch_header import SEQUENCE_MODULUS
from protocol.errors import ErrorCode, ProtocolError
from protocol.framing import FrameError

VERSION = 1
CID_MAX = 2**31 - 1
NO_CID = -1
ABSENT_VERSION = 0  # what a request without `v` decodes to

ISOLATION_READ_UNCOMMITTED = 0
ISOLATION_READ_COMMITTED = 1
TIMESTAMP_LATEST = -1
TIMESTAMP_EARLIEST = -2

IDENTIFIER_CHARS_MAX = 255
Cid = Annotated[int, msgspec.Meta(ge=0, le=CID_MAX)]
# A client's and a transactional id are kept and logged by the broker: bounded, as Kafka's
# topic names are, so one request cannot make the broker store a megabyte of name.
ClientId = Annotated[str, msgspec.Meta(max_length=IDENTIFIER_CHARS_MAX)]
TransactionalId = Annotated[str, msgspec.Meta(min_length=1, max_length=IDENTIFIER_CHARS_MAX)]
Isolation = Annotated[int, msgspec.Meta(ge=ISOLATION_READ_UNCOMMITTED, le=ISOLATION_READ_COMMITTED)]


class InvalidRequest(ProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message)


class UnsupportedApi(ProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNSUPPORTED_VERSION, message)


class RequestRefused(ProtocolError):
    """A request that is answered with an error alone; `cid` says which request and
    `api` names it when the frame did (else "unknown")."""

    def __init__(self, cid: int, error: ProtocolError, api: str = "unknown") -> None:
        super().__init__(error.code, error.message)
        self.cid = cid
        self.api = api


def _unique(names: list[Any], what: str, where: object = None) -> None:
    """docs/protocol.md section 1: a list naming the same topic or partition twice is refused.

    On every decode of the hot path, so the common case costs one set and no
    formatting: the message is built only for a refusal."""
    if len(names) > 1 and len(set(names)) != len(names):
        twice = next(name for name, count in Counter(names).items() if count > 1)
        place = "" if where is None else f" of topic {where!r}"
        raise ValueError(f"{what} {twice!r}{place} listed twice")


# --------------------------------------------------------------------------- requests


class Request(msgspec.Struct, tag_field="api", kw_only=True):
    """The envelope every request shares; subclasses are tagged with their api name and
    declare their response and what they need from the authorizer (section 7's table,
    in protocol/authorization.py's terms)."""

    response: ClassVar[type[Response]]
    requirements: ClassVar[Requirements]
    cid: Cid = NO_CID
    v: int = ABSENT_VERSION
    client_id: ClientId | None = None

    @property
    def api(self) -> str:
        return type(self).__struct_config__.tag  # type: ignore[return-value]

    def entry_count(self) -> int:
        """How many topics and partitions the request names: the work a broker bounds."""
        return 0

    def expects_answer(self) -> bool:
        """Whether the broker answers this request at all (not a Produce with acks=0)."""
        return True


class Response(msgspec.Struct, kw_only=True):
    """The envelope every response shares."""

    cid: int = NO_CID
    error: int = ErrorCode.NONE
    message: str | None = None


class ApiVersionsResponse(Response):
    apis: dict[str, list[int]] = {}
    broker_version: str = ""
    max_frame_bytes: int = 0


class ApiVersionsRequest(Request, tag="ApiVersions"):
    response = ApiVersionsResponse
    requirements = NOTHING


class PartitionMetadata(msgspec.Struct):
    partition: int
    error: int = ErrorCode.NONE
    leader: int = 0


class TopicMetadata(msgspec.Struct):
    name: str
    error: int = ErrorCode.NONE
    partitions: list[PartitionMetadata] = []
    topic_id: bytes = b""  # 16 bytes (Kafka's KIP-516); empty with an error


class BrokerMetadata(msgspec.Struct):
    id: int
    host: str
    port: int


class MetadataResponse(Response):
    brokers: list[BrokerMetadata] = []
    topics: list[TopicMetadata] = []

    def topic(self, name: str) -> TopicMetadata | None:
        return next((t for t in self.topics if t.name == name), None)


class MetadataRequest(Request, tag="Metadata"):
    response = MetadataResponse
    requirements = Requirements(
        (
            EntryNeed(Op.DESCRIBE, Res.TOPIC, ""),
            EntryNeed(
                Op.CREATE, Res.TOPIC, "", when="allow_auto_create", or_cluster=True, creating=True
            ),
            Omission(Op.DESCRIBE, Res.TOPIC, Path("topics[].name"), unless="topics"),
        ),
        Entries(
            "topics",
            "topics",
            lambda name, code, _: TopicMetadata(name, code),
            handled_when_none_left=True,
        ),
    )
    topics: list[str] | None = None
    allow_auto_create: bool = False

    def __post_init__(self) -> None:
        if self.topics is not None:
            _unique(self.topics, "topic")

    def entry_count(self) -> int:
        return len(self.topics or ())


class CreatableTopic(msgspec.Struct):
    name: str
    partitions: int
    config: dict[str, Any] | None = None


class CreateTopicResult(msgspec.Struct):
    name: str
    error: int = ErrorCode.NONE
    message: str | None = None
    topic_id: bytes = b""  # the new topic's id (16 bytes); empty with an error


class CreateTopicsResponse(Response):
    topics: list[CreateTopicResult] = []


class CreateTopicsRequest(Request, tag="CreateTopics"):
    response = CreateTopicsResponse
    requirements = Requirements(
        (EntryNeed(Op.CREATE, Res.TOPIC, "name", or_cluster=True),),
        Entries("topics", "topics", lambda t, code, why: CreateTopicResult(t.name, code, why)),
    )
    topics: list[CreatableTopic]

    def __post_init__(self) -> None:
        _unique([t.name for t in self.topics], "topic")

    def entry_count(self) -> int:
        return len(self.topics)


class InitProducerIdResponse(Response):
    producer_id: int = -1
    producer_epoch: int = -1


class InitProducerIdRequest(Request, tag="InitProducerId"):
    response = InitProducerIdResponse
    requirements = Requirements(
        (
            RequestNeed(
                Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactional_id"), when="transactional_id"
            ),
            RequestNeed(
                Op.IDEMPOTENT_WRITE,
                Res.CLUSTER,
                unless="transactional_id",
                or_any=(Op.WRITE, Res.TOPIC),
            ),
        )
    )
    transactional_id: TransactionalId | None = None
    transaction_timeout_ms: int | None = None
    producer_id: int = -1
    producer_epoch: int = -1


class ProducePartition(msgspec.Struct):
    """One partition's batch. The broker decodes `records` as a view of the frame's body,
    not a copy (a copy cost about 1 µs per 16 KiB batch and 25-30 µs per 1 MiB one); the
    view keeps the read it lies in alive until the request is done with."""

    partition: int
    records: memoryview


class ProduceTopic(msgspec.Struct):
    topic: str
    partitions: list[ProducePartition]

    def __post_init__(self) -> None:
        if len(self.partitions) > 1:
            _unique([p.partition for p in self.partitions], "partition", self.topic)


class ProducePartitionResponse(msgspec.Struct):
    partition: int
    error: int = ErrorCode.NONE
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    duplicate: bool = False
    message: str | None = None


class ProduceTopicResponse(msgspec.Struct):
    topic: str
    partitions: list[ProducePartitionResponse] = []


class ProduceResponse(Response):
    topics: list[ProduceTopicResponse] = []


class ProduceRequest(Request, tag="Produce"):
    response = ProduceResponse
    requirements = Requirements(
        (
            RequestNeed(
                Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactional_id"), when="transactional_id"
            ),
            EntryNeed(Op.WRITE, Res.TOPIC, "topic"),
        ),
        Entries(
            "topics",
            "topics",
            lambda t, code, why: ProduceTopicResponse(
                t.topic,
                [ProducePartitionResponse(p.partition, code, message=why) for p in t.partitions],
            ),
        ),
    )
    acks: int
    topics: list[ProduceTopic]
    timeout_ms: int = 30_000
    transactional_id: TransactionalId | None = None

    def __post_init__(self) -> None:
        # A Produce of one topic, the common one, has nothing to compare.
        if len(self.topics) > 1:
            _unique([t.topic for t in self.topics], "topic")

    def entry_count(self) -> int:
        topics = self.topics
        if len(topics) == 1:
            return 1 + len(topics[0].partitions)
        return len(topics) + sum(len(t.partitions) for t in topics)

    def expects_answer(self) -> bool:
        return self.acks != 0


class FetchPartition(msgspec.Struct):
    partition: int
    fetch_offset: int
    partition_max_bytes: int = 1_048_576


class FetchTopic(msgspec.Struct):
    topic: str
    partitions: list[FetchPartition]

    def __post_init__(self) -> None:
        _unique([p.partition for p in self.partitions], "partition", self.topic)


class AbortedTransaction(msgspec.Struct):
    producer_id: int
    first_offset: int


class FetchPartitionResponse(msgspec.Struct):
    partition: int
    error: int = ErrorCode.NONE
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: list[AbortedTransaction] | None = None
    records: bytes = b""


class FetchTopicResponse(msgspec.Struct):
    topic: str
    partitions: list[FetchPartitionResponse] = []


class FetchResponse(Response):
    topics: list[FetchTopicResponse] = []


class FetchRequest(Request, tag="Fetch"):
    response = FetchResponse
    requirements = Requirements(
        (EntryNeed(Op.READ, Res.TOPIC, "topic"),),
        Entries(
            "topics",
            "topics",
            lambda t, code, _: FetchTopicResponse(
                t.topic, [FetchPartitionResponse(p.partition, code) for p in t.partitions]
            ),
        ),
    )
    topics: list[FetchTopic]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 52_428_800
    isolation_level: Isolation = ISOLATION_READ_UNCOMMITTED

    def __post_init__(self) -> None:
        _unique([t.topic for t in self.topics], "topic")

    def entry_count(self) -> int:
        return len(self.topics) + sum(len(t.partitions) for t in self.topics)


class ListOffsetsPartition(msgspec.Struct):
    partition: int
    timestamp: int


class ListOffsetsTopic(msgspec.Struct):
    topic: str
    partitions: list[ListOffsetsPartition]

    def __post_init__(self) -> None:
        _unique([p.partition for p in self.partitions], "partition", self.topic)


class ListOffsetsPartitionResponse(msgspec.Struct):
    partition: int
    error: int = ErrorCode.NONE
    offset: int = -1
    timestamp: int = -1


class ListOffsetsTopicResponse(msgspec.Struct):
    topic: str
    partitions: list[ListOffsetsPartitionResponse] = []


class ListOffsetsResponse(Response):
    topics: list[ListOffsetsTopicResponse] = []


class ListOffsetsRequest(Request, tag="ListOffsets"):
    """Per partition a timestamp: -1 latest, -2 earliest, else the first offset at or after it."""

    response = ListOffsetsResponse
    requirements = Requirements(
        (EntryNeed(Op.DESCRIBE, Res.TOPIC, "topic"),),
        Entries(
            "topics",
            "topics",
            lambda t, code, _: ListOffsetsTopicResponse(
                t.topic, [ListOffsetsPartitionResponse(p.partition, code) for p in t.partitions]
            ),
        ),
    )
    topics: list[ListOffsetsTopic]
    isolation_level: Isolation = ISOLATION_READ_UNCOMMITTED

    def __post_init__(self) -> None:
        _unique([t.topic for t in self.topics], "topic")

    def entry_count(self) -> int:
        return len(self.topics) + sum(len(t.partitions) for t in self.topics)


# --------------------------------------------------------------------------- topic administration

CONFIG_RESOURCE_TYPES = ("topic", "broker")
"""What DescribeConfigs describes; a broker's name is its Metadata id as a string."""
ConfigResourceType = Annotated[
    str, msgspec.Meta(pattern="^(" + "|".join(CONFIG_RESOURCE_TYPES) + ")$")
]
AlterableResourceType = Annotated[str, msgspec.Meta(pattern="^topic$")]
ConfigSource = Annotated[str, msgspec.Meta(pattern="^(default|broker|topic)$")]
ConfigOp = Annotated[str, msgspec.Meta(pattern="^(set|delete)$")]
# Setting names are the broker's own (docs/configuration.md): short; bounded like ids.
ConfigName = Annotated[str, msgspec.Meta(max_length=IDENTIFIER_CHARS_MAX)]


class DeleteTopicResult(msgspec.Struct):
    name: str
    error: int = ErrorCode.NONE
    message: str | None = None


class DeleteTopicsResponse(Response):
    topics: list[DeleteTopicResult] = []


class DeleteTopicsRequest(Request, tag="DeleteTopics"):
    """Delete topics, each whole or not at all; not while an open transaction holds data."""

    response = DeleteTopicsResponse
    requirements = Requirements(
        (EntryNeed(Op.DELETE, Res.TOPIC, ""),),
        Entries("topics", "topics", lambda name, code, why: DeleteTopicResult(name, code, why)),
    )
    topics: list[str]

    def __post_init__(self) -> None:
        _unique(self.topics, "topic")

    def entry_count(self) -> int:
        return len(self.topics)


class ConfigResource(msgspec.Struct):
    type: ConfigResourceType
    name: str


class ConfigEntry(msgspec.Struct):
    name: str
    value: str | None = None
    source: ConfigSource = "default"
    read_only: bool = False
    sensitive: bool = False


class DescribeConfigsResult(msgspec.Struct):
    type: str
    name: str
    error: int = ErrorCode.NONE
    configs: list[ConfigEntry] = []


class DescribeConfigsResponse(Response):
    results: list[DescribeConfigsResult] = []


class DescribeConfigsRequest(Request, tag="DescribeConfigs"):
    """The settings of topics and of the broker; sensitive values are answered nil."""

    response = DescribeConfigsResponse
    requirements = Requirements(
        (
            EntryNeed(Op.DESCRIBE_CONFIGS, Res.TOPIC, "name", where=("type", "topic")),
            EntryNeed(Op.DESCRIBE_CONFIGS, Res.CLUSTER, where=("type", "broker")),
        ),
        Entries(
            "resources", "results", lambda r, code, _: DescribeConfigsResult(r.type, r.name, code)
        ),
    )
    resources: list[ConfigResource]

    def __post_init__(self) -> None:
        _unique_resources(self.resources)

    def entry_count(self) -> int:
        return len(self.resources)


class AlterConfigOp(msgspec.Struct):
    name: ConfigName
    op: ConfigOp
    value: str | None = None


class AlterableConfigResource(msgspec.Struct):
    type: AlterableResourceType
    name: str
    ops: list[AlterConfigOp]

    def __post_init__(self) -> None:
        _unique([o.name for o in self.ops], "config", self.name)


def _unique_resources(resources: Sequence[ConfigResource | AlterableConfigResource]) -> None:
    _unique([(r.type, r.name) for r in resources], "resource")


class AlterConfigsResult(msgspec.Struct):
    type: str
    name: str
    error: int = ErrorCode.NONE
    message: str | None = None


class IncrementalAlterConfigsResponse(Response):
    results: list[AlterConfigsResult] = []


class IncrementalAlterConfigsRequest(Request, tag="IncrementalAlterConfigs"):
    """Set or delete topic settings, durably, each resource all or nothing."""

    response = IncrementalAlterConfigsResponse
    requirements = Requirements(
        (EntryNeed(Op.ALTER_CONFIGS, Res.TOPIC, "name"),),
        Entries(
            "resources",
            "results",
            lambda r, code, why: AlterConfigsResult(r.type, r.name, code, why),
        ),
    )
    resources: list[AlterableConfigResource]
    validate_only: bool = False

    def __post_init__(self) -> None:
        _unique_resources(self.resources)

    def entry_count(self) -> int:
        return len(self.resources) + sum(len(r.ops) for r in self.resources)


# --------------------------------------------------------------------------- transactions

TXN_STATES = (
    "EMPTY",
    "ONGOING",
    "PREPARED",
    "PREPARE_COMMIT",
    "PREPARE_ABORT",
    "COMPLETE_COMMIT",
    "COMPLETE_ABORT",
)
"""States a transactional id can be in (docs/protocol.md section 5); PREPARE_COMMIT and
PREPARE_ABORT are decided transactions whose markers are still being written."""
TxnState = Annotated[str, msgspec.Meta(pattern="^(" + "|".join(TXN_STATES) + ")$")]


class EndTxnResponse(Response):
    producer_id: int = -1
    producer_epoch: int = -1


SequenceNumber = Annotated[int, msgspec.Meta(ge=0, lt=SEQUENCE_MODULUS)]


class TxnLastSequence(msgspec.Struct):
    partition: int
    last_sequence: SequenceNumber


class TxnLastSequences(msgspec.Struct):
    topic: str
    partitions: list[TxnLastSequence]

    def __post_init__(self) -> None:
        _unique([p.partition for p in self.partitions], "partition", self.topic)


def _topic_entries(topics: Sequence[OffsetCommitTopic | TxnLastSequences]) -> int:
    """How many topics and partitions `topics` names, each topic once (else ValueError)."""
    _unique([t.topic for t in topics], "topic")
    return len(topics) + sum(len(t.partitions) for t in topics)


class EndTxnRequest(Request, tag="EndTxn"):
    """Commit or abort the producer's transaction; answered with the next pid and epoch.

    `last_sequences` (commit only) names, per partition, the sequence the producer's
    last batch there ends at: the broker commits only if its log holds exactly that,
    so a client may send EndTxn right behind its last Produce (section 9)."""

    response = EndTxnResponse
    requirements = Requirements(
        (RequestNeed(Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactional_id")),)
    )
    transactional_id: TransactionalId
    producer_id: int
    producer_epoch: int
    committed: bool
    last_sequences: list[TxnLastSequences] | None = None

    def __post_init__(self) -> None:
        if self.last_sequences is not None and not self.committed:
            raise ValueError("last_sequences go with committed=true only")
        self.entry_count()

    def entry_count(self) -> int:
        return 0 if self.last_sequences is None else _topic_entries(self.last_sequences)


TxnAppVersion = Annotated[int, msgspec.Meta(ge=0)]


def _app_fields_together(app_id: str | None, version: int | None) -> None:
    if (app_id is None) != (version is None):
        raise ValueError("txn_app_id and txn_app_version go together")


class PrepareTxnResponse(Response):
    pass


class PrepareTxnRequest(Request, tag="PrepareTxn"):
    """The writer is done: the transaction waits, up to prepared_timeout_ms, to be ended.

    With `txn_app_id`/`txn_app_version` the writer says under which app version it
    will be committed: once that app has a version at or above it recorded, the
    prepare is refused and the transaction aborted (a late task of a finished write)."""

    response = PrepareTxnResponse
    requirements = Requirements(
        (RequestNeed(Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactional_id")),)
    )
    transactional_id: TransactionalId
    producer_id: int
    producer_epoch: int
    prepared_timeout_ms: int
    txn_app_id: TransactionalId | None = None
    txn_app_version: TxnAppVersion | None = None

    def __post_init__(self) -> None:
        _app_fields_together(self.txn_app_id, self.txn_app_version)


class TxnRef(msgspec.Struct):
    transactional_id: TransactionalId
    producer_id: int
    producer_epoch: int


class TxnResult(msgspec.Struct):
    transactional_id: str
    error: int = ErrorCode.NONE
    message: str | None = None


class CommitTxnsResponse(Response):
    already_committed: bool = False
    txn_app_version: int = -1
    transactions: list[TxnResult] = []


class CommitTxnsRequest(Request, tag="CommitTxns"):
    """End many transactions with one durable decision, optionally recording an app version."""

    response = CommitTxnsResponse
    requirements = Requirements(
        (RequestNeed(Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactions[].transactional_id")),),
        Entries(
            "transactions",
            "transactions",
            lambda t, code, why: TxnResult(t.transactional_id, code, why),
        ),
    )
    transactions: list[TxnRef]
    committed: bool
    txn_app_id: TransactionalId | None = None
    txn_app_version: TxnAppVersion | None = None

    def __post_init__(self) -> None:
        _unique([t.transactional_id for t in self.transactions], "transactional_id")
        _app_fields_together(self.txn_app_id, self.txn_app_version)

    def entry_count(self) -> int:
        return len(self.transactions)


class TxnTopicPartitions(msgspec.Struct):
    topic: str
    partitions: list[int]


class TransactionListing(msgspec.Struct):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    started_ms: int = -1
    timeout_ms: int = -1
    partitions: list[TxnTopicPartitions] = []


class ListTransactionsResponse(Response):
    transactions: list[TransactionListing] = []


class ListTransactionsRequest(Request, tag="ListTransactions"):
    response = ListTransactionsResponse
    requirements = Requirements(
        (Omission(Op.DESCRIBE, Res.TRANSACTIONAL_ID, Path("transactions[].transactional_id")),)
    )
    transactional_id_prefix: str | None = None
    states: list[TxnState] | None = None


class TxnApp(msgspec.Struct):
    txn_app_id: str
    txn_app_version: int
    committed_ms: int


class DescribeTxnAppsResponse(Response):
    apps: list[TxnApp] = []


class DescribeTxnAppsRequest(Request, tag="DescribeTxnApps"):
    response = DescribeTxnAppsResponse
    requirements = Requirements((RequestNeed(Op.DESCRIBE, Res.CLUSTER),))
    txn_app_ids: list[str] | None = None

    def entry_count(self) -> int:
        return len(self.txn_app_ids or ())


# --------------------------------------------------------------------------- consumer groups

GROUP_STATES = ("EMPTY", "ASSIGNING", "RECONCILING", "STABLE", "DEAD")
"""KIP-848's consumer-group states (docs/protocol.md section 6)."""
GroupId = Annotated[str, msgspec.Meta(min_length=1, max_length=IDENTIFIER_CHARS_MAX)]
MemberId = Annotated[str, msgspec.Meta(max_length=IDENTIFIER_CHARS_MAX)]
OffsetMetadata = Annotated[str, msgspec.Meta(max_length=4096)]
InstanceId = Annotated[str, msgspec.Meta(min_length=1, max_length=IDENTIFIER_CHARS_MAX)]
MEMBER_EPOCH_JOIN = 0
MEMBER_EPOCH_LEAVE = -1
MEMBER_EPOCH_LEAVE_STATIC = -2
"""A static member leaves but keeps its partitions for the session timeout, so that its
restart within it moves nothing (KIP-345, KIP-848)."""
MEMBER_EPOCH_NONE = -1
"""A commit with member_id "" and this epoch comes from outside the group (manual assignment)."""
NO_OFFSET = -1


class GroupTopicPartitions(msgspec.Struct):
    topic: str
    partitions: list[int]

    def __post_init__(self) -> None:
        _unique(self.partitions, "partition", self.topic)


class ConsumerGroupHeartbeatResponse(Response):
    member_id: str = ""
    member_epoch: int = -1
    heartbeat_interval_ms: int = -1
    assignment: list[GroupTopicPartitions] | None = None


class ConsumerGroupHeartbeatRequest(Request, tag="ConsumerGroupHeartbeat"):
    """Join (member_id "", epoch 0), stay (current epoch) or leave (epoch -1; a static
    member -2 to keep its partitions); nil lists are unchanged since the previous
    heartbeat. A static member sends its `instance_id` with every heartbeat."""

    response = ConsumerGroupHeartbeatResponse
    # Subscribed topics are judged when the member sends them (on joining and on every
    # change), as Kafka does: a heartbeat with nil `subscribed_topics` keeps what was
    # judged then (docs/protocol.md section 9).
    requirements = Requirements(
        (
            RequestNeed(Op.READ, Res.GROUP, Path("group_id")),
            Omission(Op.DESCRIBE, Res.TOPIC, Path("subscribed_topics[]"), in_response=False),
        )
    )
    group_id: GroupId
    member_id: MemberId
    member_epoch: int
    rebalance_timeout_ms: Annotated[int, msgspec.Meta(ge=0)]
    subscribed_topics: list[str] | None = None
    owned: list[GroupTopicPartitions] | None = None
    instance_id: InstanceId | None = None

    def __post_init__(self) -> None:
        if self.subscribed_topics is not None:
            _unique(self.subscribed_topics, "topic")
        if self.owned is not None:
            _unique([t.topic for t in self.owned], "topic")

    def entry_count(self) -> int:
        owned = self.owned or ()
        subscribed = len(self.subscribed_topics or ())
        return subscribed + len(owned) + sum(len(t.partitions) for t in owned)


class OffsetCommitPartition(msgspec.Struct):
    partition: int
    offset: Annotated[int, msgspec.Meta(ge=0)]
    metadata: OffsetMetadata | None = None


class OffsetCommitTopic(msgspec.Struct):
    topic: str
    partitions: list[OffsetCommitPartition]

    def __post_init__(self) -> None:
        _unique([p.partition for p in self.partitions], "partition", self.topic)


class PartitionError(msgspec.Struct):
    partition: int
    error: int = ErrorCode.NONE


class TopicPartitionErrors(msgspec.Struct):
    topic: str
    partitions: list[PartitionError]


def _partition_errors(topic: OffsetCommitTopic, code: ErrorCode) -> TopicPartitionErrors:
    return TopicPartitionErrors(
        topic.topic, [PartitionError(p.partition, code) for p in topic.partitions]
    )


class OffsetCommitResponse(Response):
    topics: list[TopicPartitionErrors] = []


class OffsetCommitRequest(Request, tag="OffsetCommit"):
    """Commit a group's offsets, durably; member_id "" and epoch -1 for a group with no members."""

    response = OffsetCommitResponse
    requirements = Requirements(
        (RequestNeed(Op.READ, Res.GROUP, Path("group_id")), EntryNeed(Op.READ, Res.TOPIC, "topic")),
        Entries("topics", "topics", lambda t, code, _: _partition_errors(t, code)),
    )
    group_id: GroupId
    topics: list[OffsetCommitTopic]
    member_id: MemberId = ""
    member_epoch: int = MEMBER_EPOCH_NONE

    def __post_init__(self) -> None:
        _topic_entries(self.topics)

    def entry_count(self) -> int:
        return _topic_entries(self.topics)


class TxnOffsetCommitResponse(Response):
    topics: list[TopicPartitionErrors] = []


class TxnOffsetCommitRequest(Request, tag="TxnOffsetCommit"):
    """Offsets that join the producer's transaction: visible on commit, dropped on abort."""

    response = TxnOffsetCommitResponse
    requirements = Requirements(
        (
            RequestNeed(Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactional_id")),
            RequestNeed(Op.READ, Res.GROUP, Path("group_id")),
            EntryNeed(Op.READ, Res.TOPIC, "topic"),
        ),
        Entries("topics", "topics", lambda t, code, _: _partition_errors(t, code)),
    )
    transactional_id: TransactionalId
    producer_id: int
    producer_epoch: int
    group_id: GroupId
    topics: list[OffsetCommitTopic]
    member_id: MemberId = ""
    member_epoch: int = MEMBER_EPOCH_NONE

    def __post_init__(self) -> None:
        _topic_entries(self.topics)

    def entry_count(self) -> int:
        return _topic_entries(self.topics)


class OffsetFetchPartition(msgspec.Struct):
    partition: int
    offset: int = NO_OFFSET
    metadata: str | None = None
    error: int = ErrorCode.NONE


class OffsetFetchTopic(msgspec.Struct):
    topic: str
    partitions: list[OffsetFetchPartition]


class OffsetFetchResponse(Response):
    topics: list[OffsetFetchTopic] = []


class OffsetFetchRequest(Request, tag="OffsetFetch"):
    """A group's committed offsets (nil topics: all of them); offset -1 where none."""

    response = OffsetFetchResponse
    requirements = Requirements(
        (
            RequestNeed(Op.DESCRIBE, Res.GROUP, Path("group_id")),
            Omission(Op.DESCRIBE, Res.TOPIC, Path("topics[].topic")),
        ),
        Entries(
            "topics",
            "topics",
            lambda t, code, _: OffsetFetchTopic(
                t.topic, [OffsetFetchPartition(p, error=code) for p in t.partitions]
            ),
        ),
    )
    group_id: GroupId
    topics: list[GroupTopicPartitions] | None = None
    require_stable: bool = False

    def __post_init__(self) -> None:
        if self.topics is not None:
            _unique([t.topic for t in self.topics], "topic")

    def entry_count(self) -> int:
        topics = self.topics or ()
        return len(topics) + sum(len(t.partitions) for t in topics)


class GroupListing(msgspec.Struct):
    group_id: str
    state: str
    members: int = 0


class ListGroupsResponse(Response):
    groups: list[GroupListing] = []


class ListGroupsRequest(Request, tag="ListGroups"):
    response = ListGroupsResponse
    requirements = Requirements((Omission(Op.DESCRIBE, Res.GROUP, Path("groups[].group_id")),))


class GroupMemberDescription(msgspec.Struct):
    member_id: str
    member_epoch: int
    client_id: str = ""
    subscribed_topics: list[str] = []
    assignment: list[GroupTopicPartitions] = []
    instance_id: str | None = None


class GroupDescription(msgspec.Struct):
    group_id: str
    error: int = ErrorCode.NONE
    state: str = "DEAD"
    group_epoch: int = -1
    members: list[GroupMemberDescription] = []


class DescribeGroupsResponse(Response):
    groups: list[GroupDescription] = []


class DescribeGroupsRequest(Request, tag="DescribeGroups"):
    response = DescribeGroupsResponse
    # Another member's topics are shown only where the caller may describe them, as
    # Metadata shows topics (docs/security.md).
    requirements = Requirements(
        (
            EntryNeed(Op.DESCRIBE, Res.GROUP, ""),
            Omission(
                Op.DESCRIBE, Res.TOPIC, Path("subscribed_topics[]"), within=("groups", "members")
            ),
            Omission(
                Op.DESCRIBE, Res.TOPIC, Path("assignment[].topic"), within=("groups", "members")
            ),
        ),
        Entries("group_ids", "groups", lambda group_id, code, _: GroupDescription(group_id, code)),
    )
    group_ids: list[GroupId]

    def __post_init__(self) -> None:
        _unique(self.group_ids, "group_id")

    def entry_count(self) -> int:
        return len(self.group_ids)


# --------------------------------------------------------------------------- security

# A user is named in principals, logs and the credential store: bounded like an id. Empty
# is left to the handler, which answers it per user as Kafka does.
UserName = Annotated[str, msgspec.Meta(max_length=IDENTIFIER_CHARS_MAX)]
# ACL fields are checked per entry by the handler (an invalid binding is 42 for that
# entry alone); the decoder only bounds them, far above any valid value, so that a
# hostile request cannot make the broker hold a megabyte of name. A principal is
# "User:" and a user name.
AclWord = Annotated[str, msgspec.Meta(max_length=64)]
AclName = Annotated[str, msgspec.Meta(max_length=IDENTIFIER_CHARS_MAX)]
AclPrincipal = Annotated[str, msgspec.Meta(max_length=len("User:") + IDENTIFIER_CHARS_MAX)]


def _repr_hiding(struct: msgspec.Struct, secret: str) -> str:
    """The struct's repr with the `secret` field's value left out, so that no log line,
    traceback or debugger shows a password or what stands in for one."""
    fields = ", ".join(
        f"{name}=<hidden>" if name == secret else f"{name}={getattr(struct, name)!r}"
        for name in struct.__struct_fields__
    )
    return f"{type(struct).__name__}({fields})"


class SaslAuthenticateResponse(Response):
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0


class SaslAuthenticateRequest(Request, tag="SaslAuthenticate"):
    """One round of SASL: PLAIN in one, SCRAM-SHA-256/512 in two consecutive requests.

    Neither field is bounded here: an unknown mechanism is answered 33 and a malformed
    message 58 (section 7), not 42; the SASL code bounds what it parses."""

    response = SaslAuthenticateResponse
    requirements = NOTHING
    mechanism: str
    auth_bytes: bytes

    def __repr__(self) -> str:
        return _repr_hiding(self, "auth_bytes")  # PLAIN carries the password


class ScramCredentialInfo(msgspec.Struct):
    mechanism: str
    iterations: int


class DescribeUserScramCredentialsResult(msgspec.Struct):
    user: str
    error: int = ErrorCode.NONE
    credentials: list[ScramCredentialInfo] = []


class DescribeUserScramCredentialsResponse(Response):
    results: list[DescribeUserScramCredentialsResult] = []


class DescribeUserScramCredentialsRequest(Request, tag="DescribeUserScramCredentials"):
    """Each user's SCRAM mechanisms and iterations (nil: every user), never a key."""

    response = DescribeUserScramCredentialsResponse
    requirements = Requirements(
        (RequestNeed(Op.DESCRIBE, Res.CLUSTER),),
        Entries(
            "users",
            "results",
            lambda user, code, _: DescribeUserScramCredentialsResult(user, code),
            of=lambda r: list(dict.fromkeys(r.users or ())),
        ),
    )
    users: list[UserName] | None = None

    def entry_count(self) -> int:
        return len(self.users or ())


class ScramCredentialDeletion(msgspec.Struct):
    user: UserName
    mechanism: str  # an unknown one is answered per user (33), as Kafka does


class ScramCredentialUpsertion(msgspec.Struct):
    """KIP-554: the client sends Hi(password, salt, iterations), never the password."""

    user: UserName
    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes

    def __repr__(self) -> str:
        return _repr_hiding(self, "salted_password")  # enough to authenticate as the user


class AlterUserScramCredentialsResult(msgspec.Struct):
    user: str
    error: int = ErrorCode.NONE
    message: str | None = None


class AlterUserScramCredentialsResponse(Response):
    results: list[AlterUserScramCredentialsResult] = []


class AlterUserScramCredentialsRequest(Request, tag="AlterUserScramCredentials"):
    """Delete and upsert SCRAM credentials; each user's result stands alone."""

    response = AlterUserScramCredentialsResponse
    requirements = Requirements(
        (RequestNeed(Op.ALTER, Res.CLUSTER),),
        Entries(
            "deletions",
            "results",
            lambda user, code, why: AlterUserScramCredentialsResult(user, code, why),
            of=lambda r: list(
                dict.fromkeys([*(d.user for d in r.deletions), *(u.user for u in r.upsertions)])
            ),
        ),
    )
    deletions: list[ScramCredentialDeletion]
    upsertions: list[ScramCredentialUpsertion]

    def entry_count(self) -> int:
        return len(self.deletions) + len(self.upsertions)


class AclBinding(msgspec.Struct):
    resource_type: AclWord
    resource_name: AclName
    pattern_type: AclWord
    principal: AclPrincipal
    host: AclName
    operation: AclWord
    permission: AclWord


class AclBindingFilter(msgspec.Struct):
    """A binding whose nil fields match anything; pattern_type may also be "any" or "match"."""

    resource_type: AclWord | None
    resource_name: AclName | None
    pattern_type: AclWord | None
    principal: AclPrincipal | None
    host: AclName | None
    operation: AclWord | None
    permission: AclWord | None


class AclCreationResult(msgspec.Struct):
    error: int = ErrorCode.NONE
    message: str | None = None


class CreateAclsResponse(Response):
    results: list[AclCreationResult] = []


class CreateAclsRequest(Request, tag="CreateAcls"):
    response = CreateAclsResponse
    requirements = Requirements(
        (RequestNeed(Op.ALTER, Res.CLUSTER),),
        Entries("creations", "results", lambda _, code, why: AclCreationResult(code, why)),
    )
    creations: list[AclBinding]

    def entry_count(self) -> int:
        return len(self.creations)


class DescribeAclsResponse(Response):
    bindings: list[AclBinding] = []


class DescribeAclsRequest(Request, tag="DescribeAcls"):
    response = DescribeAclsResponse
    requirements = Requirements((RequestNeed(Op.DESCRIBE, Res.CLUSTER),))
    filter: AclBindingFilter


class AclDeletionResult(msgspec.Struct):
    error: int = ErrorCode.NONE
    deleted: list[AclBinding] = []


class DeleteAclsResponse(Response):
    results: list[AclDeletionResult] = []


class DeleteAclsRequest(Request, tag="DeleteAcls"):
    response = DeleteAclsResponse
    requirements = Requirements(
        (RequestNeed(Op.ALTER, Res.CLUSTER),),
        Entries("filters", "results", lambda _, code, __: AclDeletionResult(code)),
    )
    filters: list[AclBindingFilter]

    def entry_count(self) -> int:
        return len(self.filters)


# --------------------------------------------------------------------------- the codec

REQUEST_CLASSES: tuple[type[Request], ...] = (
    ApiVersionsRequest,
    MetadataRequest,
    CreateTopicsRequest,
    InitProducerIdRequest,
    ProduceRequest,
    FetchRequest,
    ListOffsetsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
    EndTxnRequest,
    PrepareTxnRequest,
    CommitTxnsRequest,
    ListTransactionsRequest,
    DescribeTxnAppsRequest,
    ConsumerGroupHeartbeatRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    TxnOffsetCommitRequest,
    ListGroupsRequest,
    DescribeGroupsRequest,
    SaslAuthenticateRequest,
    DescribeUserScramCredentialsRequest,
    AlterUserScramCredentialsRequest,
    CreateAclsRequest,
    DescribeAclsRequest,
    DeleteAclsRequest,
)
REQUEST_TYPES: dict[str, type[Request]] = {
    str(cls.__struct_config__.tag): cls for cls in REQUEST_CLASSES
}
APIS: tuple[str, ...] = tuple(REQUEST_TYPES)


def requirements_table() -> str:
    """What every API needs from the authorizer, as docs/security.md's table shows it."""
    return markdown_table((api, cls.requirements) for api, cls in REQUEST_TYPES.items())


# What a typed decode raises for hostile bytes: bad types, bad msgpack, too deep,
# invalid UTF-8 in a str.
_UNDECODABLE = (msgspec.ValidationError, msgspec.DecodeError, RecursionError, UnicodeDecodeError)
_request_decoder = msgspec.msgpack.Decoder(Union[REQUEST_CLASSES])  # noqa: UP007  (a runtime tuple of types)
_encoder = msgspec.msgpack.Encoder()
R = TypeVar("R", bound=Response)
_response_decoders: dict[type[Response], msgspec.msgpack.Decoder[Any]] = {}


def decode_request(body: bytes | memoryview) -> Request:
    """The typed request in one frame body.

    Raises FrameError (close the connection: not msgpack, not a map, no valid
    cid) or RequestRefused carrying the cid and UNSUPPORTED_VERSION or
    INVALID_REQUEST. The typed decode is the fast path; only a failure pays for
    a second, generic decode to find out which answer docs/protocol.md gives."""
    try:
        request: Request = _request_decoder.decode(body)
    except _UNDECODABLE as exc:
        raise _classify(body, exc) from None
    if request.cid == NO_CID:
        raise FrameError("request has no cid")
    if request.v != VERSION:
        raise RequestRefused(request.cid, _version_error(request.api, request.v), request.api)
    return request


def _version_error(api: str, version: object) -> ProtocolError:
    if version == ABSENT_VERSION or not isinstance(version, int) or isinstance(version, bool):
        return InvalidRequest("missing field 'v'")
    return UnsupportedApi(f"{api} v{version} is not supported (only v{VERSION})")


def _classify(body: bytes | memoryview, exc: Exception) -> Exception:
    try:
        # msgpack, not msgspec: it can carry on past invalid UTF-8, so a request with a
        # cid still gets its INVALID_REQUEST answer.
        message = msgpack.unpackb(
            body, raw=False, strict_map_key=False, unicode_errors="surrogateescape"
        )
    except Exception as undecodable:  # msgpack raises several types for hostile bytes
        return FrameError(f"frame body is not msgpack: {undecodable}")
    cid = request_cid(message)
    if cid is None:
        return FrameError("frame is not a map with a valid cid")
    api = message.get("api")
    if not isinstance(api, str):
        return RequestRefused(cid, InvalidRequest("missing field 'api'"))
    if api not in REQUEST_TYPES:
        return RequestRefused(cid, UnsupportedApi(f"unknown api {api!r}"))
    version = message.get("v", ABSENT_VERSION)
    if version != VERSION or isinstance(version, bool):
        return RequestRefused(cid, _version_error(api, version), api)
    return RequestRefused(cid, InvalidRequest(str(exc)), api)


def request_cid(message: Any) -> int | None:
    """The cid of a decoded map, or None when the frame is not a map with a valid cid:
    the cases where docs/protocol.md says the broker closes the connection."""
    if not isinstance(message, dict):
        return None
    cid = message.get("cid")
    if not isinstance(cid, int) or isinstance(cid, bool) or not 0 <= cid <= CID_MAX:
        return None
    return cid


def encode_request(request: Request, cid: int, client_id: str | None = None) -> bytes:
    """The frame body of `request` under `cid` (sets the envelope fields in place)."""
    request.cid = cid
    request.v = VERSION
    request.client_id = client_id
    return _encoder.encode(request)


def encode_response(response: Response, cid: int) -> bytes:
    """The frame body of `response` answering request `cid`."""
    response.cid = cid
    return _encoder.encode(response)


def decode_response(body: bytes | memoryview, kind: type[R]) -> R:
    """The typed response of `kind` in one frame body; raises FrameError if it is not one."""
    decoder = _response_decoders.get(kind)
    if decoder is None:
        decoder = _response_decoders[kind] = msgspec.msgpack.Decoder(kind)
    try:
        response: R = decoder.decode(body)
    except _UNDECODABLE as exc:
        raise FrameError(f"response is not a {kind.__name__}: {exc}") from None
    return response


def error_response(code: ErrorCode, message: str | None = None) -> Response:
    """A response carrying only an error, for requests that could not be parsed."""
    return Response(error=int(code), message=message)
