"""Parse and check the data source options on the driver, before any task starts.

Spark hands options over lower-cased and as strings. Everything here turns
them into typed settings and raises `MinibrokerOptionError`, naming the option
or column at fault, so that a bad write or read fails at planning time rather
than in every task.

The client's settings arrive as `minibroker.x.y` options for its `x_y` setting,
the security ones included (`minibroker.security.protocol`,
`minibroker.ssl.cafile`, `minibroker.sasl.mechanism`,
`minibroker.sasl.plain.password`, ...), and are kept in `Settings`, whose repr
hides the passwords: option objects end up in logs and tracebacks.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from client.config import AdminConfig

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


# Settings the connector owns: the writer names each task's transaction itself, and
# the reader positions its consumer itself. An SSL context is no string: the files are.
_PRODUCER_OWNED = frozenset({"transactional_id", "partitioner", "ssl_context"})
_CONSUMER_OWNED = frozenset(
    {"auto_offset_reset", "isolation_level", "consumer_timeout_ms", "ssl_context"}
)

# The writer's promise rests on these, so they are set even where the client agrees.
PRODUCER_DEFAULTS: dict[str, Any] = {"enable_idempotence": True, "acks": "all"}
# A task's transaction runs from its first row to its prepare: the whole task, which
# can take far longer than the client's 60 s. Kafka's transaction.max.timeout.ms.
TASK_TRANSACTION_TIMEOUT_MS = 900_000

DELIVERY = "minibroker.delivery"
EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"


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


class Settings(dict[str, Any]):
    """Client settings from the options: a dict whose repr (and so its str, and that of the
    option objects holding it) shows `<hidden>` for the passwords (client.config's
    SECRET_SETTINGS), so that no log line, traceback or plan shows one. It pickles as
    a dict does, to the executors that need the values."""

    def __repr__(self) -> str:
        from client.config import SECRET_SETTINGS

        return repr({k: "<hidden>" if k in SECRET_SETTINGS else v for k, v in self.items()})

    __str__ = __repr__


def admin_target(bootstrap: str, settings: Mapping[str, Any]) -> AdminConfig:
    """Where the driver's admin calls (commit, abort, listings) go: the bootstrap with the
    security settings among `settings`. Built when needed, never pickled (an SSL
    context cannot be)."""
    from client.config import SECURITY_SETTINGS, AdminConfig

    security = {k: v for k, v in settings.items() if k in SECURITY_SETTINGS}
    return AdminConfig(bootstrap_servers=bootstrap, **security)


def client_config(
    options: Mapping[str, str], config_class: type, *, role: str, exclude: frozenset[str]
) -> Settings:
    """Map every `minibroker.x.y` option but the bootstrap servers to the client's `x_y`
    setting, typed as the client's config class declares it."""
    allowed = _settings(config_class, exclude)
    config = Settings()
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
    producer: Settings
    columns: frozenset[str]
    delivery_timeout_s: float
    exactly_once: bool = True

    def admin(self) -> AdminConfig:
        """The driver's admin calls, secured as the producers are."""
        return admin_target(self.bootstrap, self.producer)


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


def _delivery(options: Mapping[str, str]) -> bool:
    """Whether `minibroker.delivery` asks exactly once (the default)."""
    raw = options.get(DELIVERY, EXACTLY_ONCE).strip().lower()
    if raw not in (EXACTLY_ONCE, AT_LEAST_ONCE):
        raise MinibrokerOptionError(
            f"option {DELIVERY!r} must be {EXACTLY_ONCE} or {AT_LEAST_ONCE}, got {raw!r}"
        )
    return raw == EXACTLY_ONCE


def write_options(options: Mapping[str, str], schema: StructType) -> WriteOptions:
    bootstrap = _bootstrap(options)
    topic = options.get("topic")
    if topic is not None and not topic.strip():
        raise MinibrokerOptionError("option 'topic' must not be empty")
    exactly_once = _delivery(options)
    from client.config import ProducerConfig

    settings = {k: v for k, v in options.items() if k != DELIVERY}
    producer = Settings(
        PRODUCER_DEFAULTS,
        **client_config(settings, ProducerConfig, role="producer", exclude=_PRODUCER_OWNED),
    )
    if exactly_once:
        producer.setdefault("transaction_timeout_ms", TASK_TRANSACTION_TIMEOUT_MS)
        # Checked as the tasks will build it: a transactional producer.
        config = checked(
            ProducerConfig, bootstrap, {**producer, "transactional_id": "check"}, "producer"
        )
    else:
        config = checked(ProducerConfig, bootstrap, producer, "producer")
    return WriteOptions(
        bootstrap,
        topic,
        producer,
        check_write_schema(schema, topic),
        config.delivery_timeout_ms / 1000,
        exactly_once,
    )


def stream_app_id(options: Mapping[str, str]) -> str:
    """The streaming sink's identity across restarts: its checkpoint, as Spark's own is.

    Spark hands the sink the `checkpointLocation` option, or only `queryName` when the
    location comes from spark.sql.streaming.checkpointLocation (root/queryName); a
    query with neither starts from a fresh checkpoint every run, so no identity holds.
    The id is a digest: checkpoint paths can be longer than a transactional id."""
    location = (options.get("checkpointlocation") or "").strip()
    name = (options.get("queryname") or "").strip()
    if not location and not name:
        raise MinibrokerOptionError(
            f"exactly-once streaming needs the query's identity: set option "
            f"'checkpointLocation' or a queryName (or {DELIVERY}={AT_LEAST_ONCE})"
        )
    identity = f"checkpoint:{location}" if location else f"query:{name}"
    return "spark-stream-" + hashlib.sha256(identity.encode()).hexdigest()[:20]


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
    consumer: Settings
    # Streaming only: topics by regular expression, the offsets one micro-batch may
    # span, and whether offsets lost to retention fail the query.
    pattern: re.Pattern[str] | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True


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


def _topics(options: Mapping[str, str], streaming: bool) -> tuple[tuple[str, ...], str | None]:
    """The topics named by `topic` or `subscribe`, or a `subscribePattern` (streaming)."""
    names = ("topic", "subscribe", "subscribepattern") if streaming else ("topic", "subscribe")
    given = [n for n in names if options.get(n) is not None]
    if len(given) != 1:
        choices = ["'topic' (one topic)", "'subscribe' (comma-separated topics)"]
        if streaming:
            choices.append("'subscribePattern' (a regular expression)")
        raise MinibrokerOptionError(
            f"set exactly one of option {', '.join(choices[:-1])} or {choices[-1]}"
        )
    name = given[0]
    raw = options[name]
    if name == "subscribepattern":
        if not raw.strip():
            raise MinibrokerOptionError("option 'subscribePattern' must not be empty")
        return (), raw.strip()
    topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if not topics or (name == "topic" and len(topics) != 1):
        raise MinibrokerOptionError(f"option {name!r} must name a topic, got {raw!r}")
    return topics, None


def _check_offset_topics(display: str, spec: OffsetSpec, topics: tuple[str, ...]) -> None:
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


def read_options(options: Mapping[str, str]) -> ReadOptions:
    bootstrap = _bootstrap(options)
    topics, _ = _topics(options, streaming=False)
    starting = _offsets(options, STARTING, EARLIEST)
    ending = _offsets(options, ENDING, LATEST)
    _check_offset_topics("startingOffsets", starting, topics)
    _check_offset_topics("endingOffsets", ending, topics)
    return _consume_options(options, bootstrap, topics, starting, ending)


def stream_read_options(options: Mapping[str, str]) -> ReadOptions:
    """Spark's Kafka source options for `readStream`: startingOffsets (default latest,
    as Kafka's), maxOffsetsPerTrigger, failOnDataLoss, subscribePattern; no endingOffsets."""
    bootstrap = _bootstrap(options)
    topics, pattern = _topics(options, streaming=True)
    if options.get(ENDING) is not None:
        raise MinibrokerOptionError("option 'endingOffsets' is for batch reads, not readStream")
    starting = _offsets(options, STARTING, LATEST)
    compiled = None
    if pattern is not None:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise MinibrokerOptionError(
                f"option 'subscribePattern' is not a regular expression: {exc}"
            ) from None
        unmatched = sorted(t for t in starting.specific if not compiled.fullmatch(t))
        if unmatched:
            raise MinibrokerOptionError(
                f"option 'startingOffsets' names topics the pattern does not match: "
                f"{', '.join(unmatched)}"
            )
    else:
        _check_offset_topics("startingOffsets", starting, topics)
    max_offsets = None
    raw_max = options.get("maxoffsetspertrigger")
    if raw_max is not None:
        max_offsets = _int("maxOffsetsPerTrigger", raw_max)
        if max_offsets < 1:
            raise MinibrokerOptionError(
                f"option 'maxOffsetsPerTrigger' must be >= 1, got {max_offsets}"
            )
    fail_on_data_loss = _bool("failOnDataLoss", options.get("failondataloss", "true"))
    base = _consume_options(options, bootstrap, topics, starting, OffsetSpec(LATEST))
    return replace(
        base,
        pattern=compiled,
        max_offsets_per_trigger=max_offsets,
        fail_on_data_loss=fail_on_data_loss,
    )


def _consume_options(
    options: Mapping[str, str],
    bootstrap: str,
    topics: tuple[str, ...],
    starting: OffsetSpec,
    ending: OffsetSpec,
) -> ReadOptions:
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
