"""Parse and check the data source options on the driver, before any task starts.

Spark hands options over lower-cased and as strings. Everything here turns
them into typed settings and raises `MinibrokerOptionError`, naming the option
or column at fault, so that a bad write or read fails at planning time rather
than in every task.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

PREFIX = "minibroker."
BOOTSTRAP = "minibroker.bootstrap.servers"

EARLIEST = -2
LATEST = -1


class MinibrokerOptionError(ValueError):
    """A data source option or input column that the connector cannot use."""


def _bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise MinibrokerOptionError(f"option {name!r} must be true or false, got {raw!r}")
    return lowered == "true"


def _int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise MinibrokerOptionError(f"option {name!r} must be an integer, got {raw!r}") from None


def _float(name: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise MinibrokerOptionError(f"option {name!r} must be a number, got {raw!r}") from None


def _str(name: str, raw: str) -> str:
    return raw.strip()


Converter = Callable[[str, str], Any]


def _converter(f: Field[Any]) -> Converter:
    """How to read a client setting from Spark's string, from its declared type."""
    declared = str(f.type)
    if "bool" in declared:
        return _bool
    if declared.startswith("int"):
        return _int
    if declared.startswith("float"):
        return _float
    return _str


def _settings(config_class: type, exclude: frozenset[str]) -> dict[str, Converter]:
    return {
        f.name: _converter(f)
        for f in fields(config_class)
        if f.init and f.name not in exclude and f.name != "bootstrap_servers"
    }


# Settings the connector owns: transactions need begin/commit calls the writer does not
# make yet, and the reader positions its consumer itself.
_PRODUCER_OWNED = frozenset({"transactional_id", "transaction_timeout_ms", "partitioner"})
_CONSUMER_OWNED = frozenset({"auto_offset_reset", "isolation_level", "consumer_timeout_ms"})

# The writer's promise rests on these, so they are set even where the client agrees.
PRODUCER_DEFAULTS: dict[str, Any] = {"enable_idempotence": True, "acks": "all"}


def _bootstrap(options: Mapping[str, str]) -> str:
    from client.config import parse_bootstrap

    servers = (options.get(BOOTSTRAP) or "").strip()
    if not servers:
        raise MinibrokerOptionError(
            f"option {BOOTSTRAP!r} is required, e.g. .option({BOOTSTRAP!r}, '127.0.0.1:9092')"
        )
    try:
        parse_bootstrap(servers)
    except ValueError:
        raise MinibrokerOptionError(
            f"option {BOOTSTRAP!r} must be host:port[,host:port...], got {servers!r}"
        ) from None
    return servers


def client_config(
    options: Mapping[str, str], config_class: type, *, role: str, exclude: frozenset[str]
) -> dict[str, Any]:
    """Map every `minibroker.x.y` option but the bootstrap servers to the client's `x_y`
    setting, typed as the client's config class declares it."""
    allowed = _settings(config_class, exclude)
    config: dict[str, Any] = {}
    for name, raw in options.items():
        if not name.startswith(PREFIX) or name == BOOTSTRAP:
            continue
        key = name[len(PREFIX) :].replace(".", "_")
        convert = allowed.get(key)
        if convert is None:
            known = ", ".join(PREFIX + k.replace("_", ".") for k in sorted(allowed))
            raise MinibrokerOptionError(
                f"option {name!r} is not a {role} setting; known: {BOOTSTRAP}, {known}"
            )
        config[key] = convert(name, raw)
    return config


def checked(config_class: type, bootstrap: str, config: Mapping[str, Any], role: str) -> Any:
    """The client's config object, built without I/O, so refusals surface at planning time."""
    try:
        return config_class(bootstrap_servers=bootstrap, **config)
    except (TypeError, ValueError) as exc:
        raise MinibrokerOptionError(
            f"the {role} refuses the minibroker.* options (a.b.c is a_b_c there): {exc}"
        ) from None


# ----------------------------------------------------------------------------- writer

_INTEGER_TYPES = (ByteType, ShortType, IntegerType, LongType)


@dataclass(frozen=True)
class WriteOptions:
    bootstrap: str
    topic: str | None
    producer: dict[str, Any]
    columns: frozenset[str]
    delivery_timeout_s: float


def _is_text_or_binary(data_type: DataType) -> bool:
    return isinstance(data_type, (StringType, BinaryType))


def _is_headers(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    element = data_type.elementType
    return (
        element.fieldNames() == ["key", "value"]
        and isinstance(element["key"].dataType, StringType)
        and _is_text_or_binary(element["value"].dataType)
    )


def check_write_schema(schema: StructType, topic_option: str | None) -> frozenset[str]:
    """The Kafka sink's columns that `schema` holds, after checking their types.

    Other columns are ignored, as Spark's Kafka sink ignores them."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in types:
        raise MinibrokerOptionError(
            "column 'value' (string or binary) is required; "
            f"the input has {', '.join(schema.fieldNames()) or 'no columns'}"
        )
    checks: dict[str, tuple[Callable[[DataType], bool], str]] = {
        "value": (_is_text_or_binary, "string or binary"),
        "key": (_is_text_or_binary, "string or binary"),
        "topic": (lambda t: isinstance(t, StringType), "string"),
        "partition": (lambda t: isinstance(t, _INTEGER_TYPES), "an integer type"),
        "headers": (_is_headers, "array<struct<key:string,value:binary>>"),
    }
    for name, (ok, wanted) in checks.items():
        if name in types and not ok(types[name]):
            raise MinibrokerOptionError(
                f"column {name!r} must be {wanted}, got {types[name].simpleString()}"
            )
    if topic_option is None and "topic" not in types:
        raise MinibrokerOptionError("no topic: set option 'topic' or add a string column 'topic'")
    return frozenset(name for name in checks if name in types)


def write_options(options: Mapping[str, str], schema: StructType) -> WriteOptions:
    bootstrap = _bootstrap(options)
    topic = options.get("topic")
    if topic is not None and not topic.strip():
        raise MinibrokerOptionError("option 'topic' must not be empty")
    from client.config import ProducerConfig

    producer = {
        **PRODUCER_DEFAULTS,
        **client_config(options, ProducerConfig, role="producer", exclude=_PRODUCER_OWNED),
    }
    config = checked(ProducerConfig, bootstrap, producer, "producer")
    return WriteOptions(
        bootstrap,
        topic,
        producer,
        check_write_schema(schema, topic),
        config.delivery_timeout_ms / 1000,
    )


# ----------------------------------------------------------------------------- reader

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
STARTING = "startingoffsets"
ENDING = "endingoffsets"


@dataclass(frozen=True)
class OffsetSpec:
    """`earliest`, `latest`, or per topic a map partition -> offset (-2 earliest, -1 latest)."""

    default: int
    specific: dict[str, dict[int, int]] = field(default_factory=dict)

    def for_partition(self, topic: str, partition: int) -> int:
        if not self.specific:
            return self.default
        return self.specific[topic][partition]


@dataclass(frozen=True)
class ReadOptions:
    bootstrap: str
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    isolation_level: str
    max_records_per_partition: int | None
    poll_timeout_ms: int
    consumer: dict[str, Any]


def _offsets(options: Mapping[str, str], name: str, default: int) -> OffsetSpec:
    raw = options.get(name)
    display = "startingOffsets" if name == STARTING else "endingOffsets"
    if raw is None or not raw.strip():
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() == "earliest":
        return OffsetSpec(EARLIEST)
    if text.lower() == "latest":
        return OffsetSpec(LATEST)
    example = '{"topic":{"0":23,"1":-2}}'
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise MinibrokerOptionError(
            f"option {display!r} must be earliest, latest or JSON like {example}, got {raw!r}"
        )
    specific: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict) or not partitions:
            raise MinibrokerOptionError(
                f"option {display!r}: topic {topic!r} needs a map of partition to offset, "
                f"like {example}"
            )
        offsets: dict[int, int] = {}
        for partition, offset in partitions.items():
            if (
                not str(partition).isdigit()
                or not isinstance(offset, int)
                or isinstance(offset, bool)
                or offset < EARLIEST
            ):
                raise MinibrokerOptionError(
                    f"option {display!r}: topic {topic!r} partition {partition!r} -> {offset!r} "
                    "is not a partition number and an offset (>= 0, -2 earliest, -1 latest)"
                )
            offsets[int(partition)] = offset
        specific[topic] = offsets
    return OffsetSpec(default, specific)


def read_options(options: Mapping[str, str]) -> ReadOptions:
    bootstrap = _bootstrap(options)
    topic = options.get("topic")
    subscribe = options.get("subscribe")
    if (topic is None) == (subscribe is None):
        raise MinibrokerOptionError(
            "set exactly one of option 'topic' (one topic) or 'subscribe' (comma-separated topics)"
        )
    raw_topics = topic if topic is not None else subscribe
    assert raw_topics is not None
    topics = tuple(dict.fromkeys(t.strip() for t in raw_topics.split(",") if t.strip()))
    if not topics or (topic is not None and len(topics) != 1):
        name = "topic" if topic is not None else "subscribe"
        raise MinibrokerOptionError(f"option {name!r} must name a topic, got {raw_topics!r}")

    starting = _offsets(options, STARTING, EARLIEST)
    ending = _offsets(options, ENDING, LATEST)
    for display, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
        unknown = sorted(set(spec.specific) - set(topics))
        if unknown:
            raise MinibrokerOptionError(
                f"option {display!r} names topics that are not read: {', '.join(unknown)}"
            )
        missing = sorted(set(topics) - set(spec.specific)) if spec.specific else []
        if missing:
            raise MinibrokerOptionError(
                f"option {display!r} must give offsets for every topic read; "
                f"missing: {', '.join(missing)}"
            )

    isolation = options.get("isolation.level", "read_committed").strip().lower()
    if isolation not in ISOLATION_LEVELS:
        raise MinibrokerOptionError(
            "option 'isolation.level' must be read_committed or read_uncommitted, "
            f"got {isolation!r}"
        )

    max_records = options.get("maxrecordsperpartition")
    max_records_value = None
    if max_records is not None:
        max_records_value = _int("maxRecordsPerPartition", max_records)
        if max_records_value < 1:
            raise MinibrokerOptionError(
                f"option 'maxRecordsPerPartition' must be >= 1, got {max_records_value}"
            )
    poll_timeout_ms = _int("pollTimeoutMs", options.get("polltimeoutms", "120000"))
    if poll_timeout_ms < 1:
        raise MinibrokerOptionError(f"option 'pollTimeoutMs' must be >= 1, got {poll_timeout_ms}")

    from client.config import ConsumerConfig

    consumer = client_config(options, ConsumerConfig, role="consumer", exclude=_CONSUMER_OWNED)
    checked(ConsumerConfig, bootstrap, {**consumer, "isolation_level": isolation}, "consumer")

    return ReadOptions(
        bootstrap=bootstrap,
        topics=topics,
        starting=starting,
        ending=ending,
        isolation_level=isolation,
        max_records_per_partition=max_records_value,
        poll_timeout_ms=poll_timeout_ms,
        consumer=consumer,
    )
