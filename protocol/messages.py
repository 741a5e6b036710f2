"""Typed requests and responses of wire contract version 1 (PROTOCOL.md section 4).

Each message converts to and from the plain msgpack map that travels in a
frame. `parse_request` turns a decoded map into a request object, raising
`InvalidRequest` (INVALID_REQUEST, 42) for missing or mistyped fields and
`UnsupportedApi` (UNSUPPORTED_VERSION, 35) for an unknown api or version.
Responses are parsed leniently (`from_wire`) because the client must survive a
newer broker adding fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from protocol.errors import ErrorCode, ProtocolError

VERSION = 1
CID_MAX = 2**31 - 1

ISOLATION_READ_UNCOMMITTED = 0
ISOLATION_READ_COMMITTED = 1
TIMESTAMP_LATEST = -1
TIMESTAMP_EARLIEST = -2


class InvalidRequest(ProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message)


class UnsupportedApi(ProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNSUPPORTED_VERSION, message)


_MISSING = object()


def _get(
    d: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING
) -> Any:
    """Field `name` of `d`, checked against `kind`; bool never passes for int."""
    value = d.get(name, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise InvalidRequest(f"missing field {name!r}")
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise InvalidRequest(
            f"field {name!r} must be {_kind_name(kind)}, got {type(value).__name__}"
        )
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def _maps(items: Any, name: str) -> list[dict[str, Any]]:
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise InvalidRequest(f"field {name!r} must be an array of maps")
    return items


def _ints(items: Any, name: str) -> list[int]:
    if not isinstance(items, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in items
    ):
        raise InvalidRequest(f"field {name!r} must be an array of ints")
    return items


# --------------------------------------------------------------------------- requests


@dataclass(slots=True)
class ApiVersionsRequest:
    api: ClassVar[str] = "ApiVersions"

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ApiVersionsRequest:
        return cls()

    def to_wire(self) -> dict[str, Any]:
        return {}


@dataclass(slots=True)
class MetadataRequest:
    api: ClassVar[str] = "Metadata"
    topics: list[str] | None = None
    allow_auto_create: bool = False

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> MetadataRequest:
        topics = d.get("topics")
        if topics is not None and (
            not isinstance(topics, list) or not all(isinstance(t, str) for t in topics)
        ):
            raise InvalidRequest("field 'topics' must be nil or an array of str")
        return cls(topics, _get(d, "allow_auto_create", bool, False))

    def to_wire(self) -> dict[str, Any]:
        return {"topics": self.topics, "allow_auto_create": self.allow_auto_create}


@dataclass(slots=True)
class CreatableTopic:
    name: str
    partitions: int
    config: dict[str, Any] | None = None


@dataclass(slots=True)
class CreateTopicsRequest:
    api: ClassVar[str] = "CreateTopics"
    topics: list[CreatableTopic]

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> CreateTopicsRequest:
        topics = []
        for t in _maps(_get(d, "topics", list), "topics"):
            config = _get(t, "config", dict, None)
            topics.append(CreatableTopic(_get(t, "name", str), _get(t, "partitions", int), config))
        return cls(topics)

    def to_wire(self) -> dict[str, Any]:
        return {
            "topics": [
                {"name": t.name, "partitions": t.partitions, "config": t.config}
                for t in self.topics
            ]
        }


@dataclass(slots=True)
class InitProducerIdRequest:
    api: ClassVar[str] = "InitProducerId"
    transactional_id: str | None = None
    transaction_timeout_ms: int | None = None
    producer_id: int = -1
    producer_epoch: int = -1

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> InitProducerIdRequest:
        return cls(
            _get(d, "transactional_id", str, None),
            _get(d, "transaction_timeout_ms", int, None),
            _get(d, "producer_id", int, -1),
            _get(d, "producer_epoch", int, -1),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "transaction_timeout_ms": self.transaction_timeout_ms,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }


@dataclass(slots=True)
class ProduceRequest:
    """`topics` is [(topic, [(partition, batch bytes)])]: tuples, since this is the hot path."""

    api: ClassVar[str] = "Produce"
    acks: int
    timeout_ms: int
    topics: list[tuple[str, list[tuple[int, bytes]]]]
    transactional_id: str | None = None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ProduceRequest:
        topics = []
        for t in _maps(_get(d, "topics", list), "topics"):
            parts = [
                (_get(p, "partition", int), _get(p, "records", bytes))
                for p in _maps(_get(t, "partitions", list), "partitions")
            ]
            topics.append((_get(t, "topic", str), parts))
        return cls(
            _get(d, "acks", int),
            _get(d, "timeout_ms", int, 30_000),
            topics,
            _get(d, "transactional_id", str, None),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "acks": self.acks,
            "timeout_ms": self.timeout_ms,
            "transactional_id": self.transactional_id,
            "topics": [
                {"topic": topic, "partitions": [{"partition": p, "records": r} for p, r in parts]}
                for topic, parts in self.topics
            ],
        }


@dataclass(slots=True)
class FetchPartition:
    partition: int
    fetch_offset: int
    partition_max_bytes: int


@dataclass(slots=True)
class FetchRequest:
    api: ClassVar[str] = "Fetch"
    topics: list[tuple[str, list[FetchPartition]]]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 52_428_800
    isolation_level: int = ISOLATION_READ_UNCOMMITTED

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> FetchRequest:
        topics = []
        for t in _maps(_get(d, "topics", list), "topics"):
            parts = [
                FetchPartition(
                    _get(p, "partition", int),
                    _get(p, "fetch_offset", int),
                    _get(p, "partition_max_bytes", int, 1_048_576),
                )
                for p in _maps(_get(t, "partitions", list), "partitions")
            ]
            topics.append((_get(t, "topic", str), parts))
        isolation = _get(d, "isolation_level", int, ISOLATION_READ_UNCOMMITTED)
        if isolation not in (ISOLATION_READ_UNCOMMITTED, ISOLATION_READ_COMMITTED):
            raise InvalidRequest(f"isolation_level must be 0 or 1, got {isolation}")
        return cls(
            topics,
            _get(d, "max_wait_ms", int, 500),
            _get(d, "min_bytes", int, 1),
            _get(d, "max_bytes", int, 52_428_800),
            isolation,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "max_wait_ms": self.max_wait_ms,
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "isolation_level": self.isolation_level,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": p.partition,
                            "fetch_offset": p.fetch_offset,
                            "partition_max_bytes": p.partition_max_bytes,
                        }
                        for p in parts
                    ],
                }
                for topic, parts in self.topics
            ],
        }


@dataclass(slots=True)
class ListOffsetsRequest:
    """`topics` is [(topic, [(partition, timestamp)])]; -1 latest, -2 earliest."""

    api: ClassVar[str] = "ListOffsets"
    topics: list[tuple[str, list[tuple[int, int]]]]
    isolation_level: int = ISOLATION_READ_UNCOMMITTED

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ListOffsetsRequest:
        topics = []
        for t in _maps(_get(d, "topics", list), "topics"):
            parts = [
                (_get(p, "partition", int), _get(p, "timestamp", int))
                for p in _maps(_get(t, "partitions", list), "partitions")
            ]
            topics.append((_get(t, "topic", str), parts))
        return cls(topics, _get(d, "isolation_level", int, ISOLATION_READ_UNCOMMITTED))

    def to_wire(self) -> dict[str, Any]:
        return {
            "isolation_level": self.isolation_level,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [{"partition": p, "timestamp": ts} for p, ts in parts],
                }
                for topic, parts in self.topics
            ],
        }


@dataclass(slots=True)
class AddPartitionsToTxnRequest:
    api: ClassVar[str] = "AddPartitionsToTxn"
    transactional_id: str
    producer_id: int
    producer_epoch: int
    topics: list[tuple[str, list[int]]]

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> AddPartitionsToTxnRequest:
        topics = [
            (_get(t, "topic", str), _ints(_get(t, "partitions", list), "partitions"))
            for t in _maps(_get(d, "topics", list), "topics")
        ]
        return cls(
            _get(d, "transactional_id", str),
            _get(d, "producer_id", int),
            _get(d, "producer_epoch", int),
            topics,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "topics": [{"topic": t, "partitions": ps} for t, ps in self.topics],
        }


@dataclass(slots=True)
class EndTxnRequest:
    api: ClassVar[str] = "EndTxn"
    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> EndTxnRequest:
        return cls(
            _get(d, "transactional_id", str),
            _get(d, "producer_id", int),
            _get(d, "producer_epoch", int),
            _get(d, "committed", bool),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "committed": self.committed,
        }


Request = (
    ApiVersionsRequest
    | MetadataRequest
    | CreateTopicsRequest
    | InitProducerIdRequest
    | ProduceRequest
    | FetchRequest
    | ListOffsetsRequest
    | AddPartitionsToTxnRequest
    | EndTxnRequest
)

REQUEST_TYPES: dict[str, type[Any]] = {
    cls.api: cls
    for cls in (
        ApiVersionsRequest,
        MetadataRequest,
        CreateTopicsRequest,
        InitProducerIdRequest,
        ProduceRequest,
        FetchRequest,
        ListOffsetsRequest,
        AddPartitionsToTxnRequest,
        EndTxnRequest,
    )
}


def request_cid(message: Any) -> int | None:
    """The request's cid, or None when the frame is not a map with a valid cid:
    the cases where PROTOCOL.md says the broker closes the connection."""
    if not isinstance(message, dict):
        return None
    cid = message.get("cid")
    if not isinstance(cid, int) or isinstance(cid, bool) or not 0 <= cid <= CID_MAX:
        return None
    return cid


def parse_request(message: dict[str, Any], supported: frozenset[str] | None = None) -> Any:
    """Turn a decoded request map into its typed request.

    `supported` narrows the APIs this broker answers (others get
    UNSUPPORTED_VERSION), so that APIs of later issues can be switched on."""
    api = message.get("api")
    version = message.get("v")
    if not isinstance(api, str):
        raise InvalidRequest("missing field 'api'")
    cls = REQUEST_TYPES.get(api)
    if cls is None or (supported is not None and api not in supported):
        raise UnsupportedApi(f"unknown api {api!r}")
    if not isinstance(version, int) or isinstance(version, bool):
        raise InvalidRequest("missing field 'v'")
    if version != VERSION:
        raise UnsupportedApi(f"{api} v{version} is not supported (only v{VERSION})")
    return cls.from_wire(message)


def request_to_wire(request: Any, cid: int, client_id: str | None = None) -> dict[str, Any]:
    """The full map of a request: its fields plus api, v, cid and client_id."""
    wire = request.to_wire()
    wire["api"] = request.api
    wire["v"] = VERSION
    wire["cid"] = cid
    if client_id is not None:
        wire["client_id"] = client_id
    return wire


# --------------------------------------------------------------------------- responses


@dataclass(slots=True)
class ProducePartitionResponse:
    partition: int
    error: int = ErrorCode.NONE
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    duplicate: bool = False
    message: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "error": int(self.error),
            "base_offset": self.base_offset,
            "log_append_time_ms": self.log_append_time_ms,
            "log_start_offset": self.log_start_offset,
            "duplicate": self.duplicate,
            "message": self.message,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ProducePartitionResponse:
        return cls(
            d["partition"],
            d.get("error", 0),
            d.get("base_offset", -1),
            d.get("log_append_time_ms", -1),
            d.get("log_start_offset", -1),
            bool(d.get("duplicate", False)),
            d.get("message"),
        )


@dataclass(slots=True)
class ProduceResponse:
    topics: list[tuple[str, list[ProducePartitionResponse]]]
    error: int = ErrorCode.NONE

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": int(self.error),
            "topics": [
                {"topic": t, "partitions": [p.to_wire() for p in parts]} for t, parts in self.topics
            ],
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ProduceResponse:
        return cls(
            [
                (t["topic"], [ProducePartitionResponse.from_wire(p) for p in t["partitions"]])
                for t in d.get("topics") or []
            ],
            d.get("error", 0),
        )


@dataclass(slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


@dataclass(slots=True)
class FetchPartitionResponse:
    partition: int
    error: int = ErrorCode.NONE
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: list[AbortedTransaction] | None = None
    records: bytes = b""

    def to_wire(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "error": int(self.error),
            "high_watermark": self.high_watermark,
            "last_stable_offset": self.last_stable_offset,
            "log_start_offset": self.log_start_offset,
            "aborted_transactions": None
            if self.aborted_transactions is None
            else [
                {"producer_id": a.producer_id, "first_offset": a.first_offset}
                for a in self.aborted_transactions
            ],
            "records": self.records,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> FetchPartitionResponse:
        aborted = d.get("aborted_transactions")
        return cls(
            d["partition"],
            d.get("error", 0),
            d.get("high_watermark", -1),
            d.get("last_stable_offset", -1),
            d.get("log_start_offset", -1),
            None
            if aborted is None
            else [AbortedTransaction(a["producer_id"], a["first_offset"]) for a in aborted],
            d.get("records") or b"",
        )


@dataclass(slots=True)
class FetchResponse:
    topics: list[tuple[str, list[FetchPartitionResponse]]]
    error: int = ErrorCode.NONE

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": int(self.error),
            "topics": [
                {"topic": t, "partitions": [p.to_wire() for p in parts]} for t, parts in self.topics
            ],
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> FetchResponse:
        return cls(
            [
                (t["topic"], [FetchPartitionResponse.from_wire(p) for p in t["partitions"]])
                for t in d.get("topics") or []
            ],
            d.get("error", 0),
        )


@dataclass(slots=True)
class PartitionMetadata:
    partition: int
    error: int = ErrorCode.NONE
    leader: int = 0


@dataclass(slots=True)
class TopicMetadata:
    name: str
    error: int = ErrorCode.NONE
    partitions: list[PartitionMetadata] = field(default_factory=list)


@dataclass(slots=True)
class BrokerMetadata:
    id: int
    host: str
    port: int


@dataclass(slots=True)
class MetadataResponse:
    brokers: list[BrokerMetadata]
    topics: list[TopicMetadata]
    error: int = ErrorCode.NONE

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": int(self.error),
            "brokers": [{"id": b.id, "host": b.host, "port": b.port} for b in self.brokers],
            "topics": [
                {
                    "name": t.name,
                    "error": int(t.error),
                    "partitions": [
                        {"partition": p.partition, "error": int(p.error), "leader": p.leader}
                        for p in t.partitions
                    ],
                }
                for t in self.topics
            ],
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> MetadataResponse:
        return cls(
            [BrokerMetadata(b["id"], b["host"], b["port"]) for b in d.get("brokers") or []],
            [
                TopicMetadata(
                    t["name"],
                    t.get("error", 0),
                    [
                        PartitionMetadata(p["partition"], p.get("error", 0), p.get("leader", 0))
                        for p in t.get("partitions") or []
                    ],
                )
                for t in d.get("topics") or []
            ],
            d.get("error", 0),
        )


@dataclass(slots=True)
class CreateTopicResult:
    name: str
    error: int = ErrorCode.NONE
    message: str | None = None


@dataclass(slots=True)
class CreateTopicsResponse:
    topics: list[CreateTopicResult]
    error: int = ErrorCode.NONE

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": int(self.error),
            "topics": [
                {"name": t.name, "error": int(t.error), "message": t.message} for t in self.topics
            ],
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> CreateTopicsResponse:
        return cls(
            [
                CreateTopicResult(t["name"], t.get("error", 0), t.get("message"))
                for t in d.get("topics") or []
            ],
            d.get("error", 0),
        )


@dataclass(slots=True)
class InitProducerIdResponse:
    producer_id: int = -1
    producer_epoch: int = -1
    error: int = ErrorCode.NONE

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": int(self.error),
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> InitProducerIdResponse:
        return cls(d.get("producer_id", -1), d.get("producer_epoch", -1), d.get("error", 0))


@dataclass(slots=True)
class ListOffsetsPartitionResponse:
    partition: int
    error: int = ErrorCode.NONE
    offset: int = -1
    timestamp: int = -1


@dataclass(slots=True)
class ListOffsetsResponse:
    topics: list[tuple[str, list[ListOffsetsPartitionResponse]]]
    error: int = ErrorCode.NONE

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": int(self.error),
            "topics": [
                {
                    "topic": t,
                    "partitions": [
                        {
                            "partition": p.partition,
                            "error": int(p.error),
                            "offset": p.offset,
                            "timestamp": p.timestamp,
                        }
                        for p in parts
                    ],
                }
                for t, parts in self.topics
            ],
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ListOffsetsResponse:
        return cls(
            [
                (
                    t["topic"],
                    [
                        ListOffsetsPartitionResponse(
                            p["partition"],
                            p.get("error", 0),
                            p.get("offset", -1),
                            p.get("timestamp", -1),
                        )
                        for p in t["partitions"]
                    ],
                )
                for t in d.get("topics") or []
            ],
            d.get("error", 0),
        )


@dataclass(slots=True)
class ApiVersionsResponse:
    apis: dict[str, list[int]]
    broker_version: str
    max_frame_bytes: int
    error: int = ErrorCode.NONE

    def to_wire(self) -> dict[str, Any]:
        return {
            "error": int(self.error),
            "apis": self.apis,
            "broker_version": self.broker_version,
            "max_frame_bytes": self.max_frame_bytes,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ApiVersionsResponse:
        return cls(
            d.get("apis") or {},
            d.get("broker_version", ""),
            d.get("max_frame_bytes", 0),
            d.get("error", 0),
        )


def error_response(cid: int, code: ErrorCode, message: str | None = None) -> dict[str, Any]:
    """A response map carrying only an error, for requests that could not be parsed."""
    response: dict[str, Any] = {"cid": cid, "error": int(code)}
    if message is not None:
        response["message"] = message
    return response
