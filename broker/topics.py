"""Topics: names, partition counts and per-topic log settings, persisted on disk.

Layout: `<data_dir>/topics/<name>/topic.meta` (sealed msgpack: partitions and
config overrides) and one directory per partition, `<data_dir>/topics/<name>/<n>/`.
The meta file is written after every partition has opened, so a crash or an
error during creation leaves a directory without one, which is no topic and is
cleared when the name is created again.
"""

from __future__ import annotations

import logging
import re
import resource
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from broker.config import BrokerConfig
from broker.fileio import seal, unseal, write_atomic
from broker.log import LogConfig
from broker.partition import Partition, ProducerLimits
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")

TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
META_FILE = "topic.meta"
PARTITIONS_MAX = 10_000
FDS_RESERVED = 64  # snapshots, indexes, the lock, the metrics listener
# Per-topic overrides a CreateTopics config may carry; Kafka's dotted names map
# onto ours (retention.ms -> retention_ms).
TOPIC_SETTINGS = (
    "segment_bytes",
    "segment_ms",
    "retention_bytes",
    "retention_ms",
    "index_interval_bytes",
    "segment_index_bytes",
)


class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_name(name: str) -> None:
    if not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} must match [A-Za-z0-9._-]{{1,249}} and not be '.' or '..'",
        )


def normalize_config(config: dict[str, Any] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for raw_key, value in (config or {}).items():
        key = str(raw_key).replace(".", "_")
        if key not in TOPIC_SETTINGS:
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                f"unknown topic config {raw_key!r}; known: {', '.join(TOPIC_SETTINGS)}",
            )
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise TopicError(
                ErrorCode.INVALID_REQUEST, f"topic config {raw_key!r} must be an integer"
            ) from None
        out[key] = number
    return out


@dataclass
class Topic:
    name: str
    config: dict[str, int]
    partitions: list[Partition]


class TopicRegistry:
    """All topics of a data dir, opened (and recovered) at start."""

    def __init__(self, root: Path, config: BrokerConfig) -> None:
        self.root = root / "topics"
        self.config = config
        self.topics: dict[str, Topic] = {}
        self.on_rolled: Callable[[Partition], None] | None = None

    def set_on_rolled(self, hook: Callable[[Partition], None]) -> None:
        """Run `hook` after any partition, now or later created, rolls a segment."""
        self.on_rolled = hook
        for p in self.all_partitions():
            p.on_rolled = hook

    def log_config(self, overrides: dict[str, int]) -> LogConfig:
        # Broker-wide defaults and topic overrides share the names of TOPIC_SETTINGS.
        defaults = {name: getattr(self.config, name) for name in TOPIC_SETTINGS}
        return LogConfig(**{**defaults, **overrides})

    @property
    def limits(self) -> ProducerLimits:
        return ProducerLimits(
            self.config.max_producers_per_partition, self.config.producer_id_expiration_ms
        )

    def open_all(self, *, clean_shutdown: bool, now_ms: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for directory in sorted(p for p in self.root.iterdir() if p.is_dir()):
            meta_path = directory / META_FILE
            body = unseal(meta_path.read_bytes()) if meta_path.exists() else None
            if body is None:
                log.error(
                    "event=topic_skipped dir=%s reason='missing or corrupt %s'",
                    directory,
                    META_FILE,
                )
                continue
            meta = msgpack.unpackb(body, raw=False)
            self.topics[directory.name] = self._open_topic(
                directory.name, meta["partitions"], meta["config"], clean_shutdown, now_ms
            )

    def _open_topic(
        self, name: str, partitions: int, config: dict[str, int], clean_shutdown: bool, now_ms: int
    ) -> Topic:
        log_config = self.log_config(config)
        opened: list[Partition] = []
        try:
            for i in range(partitions):
                opened.append(
                    Partition.open(
                        name,
                        i,
                        self.root / name / str(i),
                        log_config,
                        self.limits,
                        clean_shutdown=clean_shutdown,
                        now_ms=now_ms,
                    )
                )
        except BaseException:
            for p in opened:
                p.log.close()
            raise
        topic = Topic(name, config, opened)
        for p in topic.partitions:
            p.on_rolled = self.on_rolled
        return topic

    def create(
        self, name: str, partitions: int, config: dict[str, Any] | None, now_ms: int
    ) -> Topic:
        check_name(name)
        if name in self.topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if not 1 <= partitions <= PARTITIONS_MAX:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"partitions must be 1..{PARTITIONS_MAX}, got {partitions}",
            )
        overrides = normalize_config(config)
        try:
            self.log_config(overrides)
        except (TypeError, ValueError) as exc:
            raise TopicError(ErrorCode.INVALID_REQUEST, str(exc)) from exc
        self._check_fd_budget(partitions)
        directory = self.root / name
        if directory.exists():
            # No meta file, so no topic: the leftovers of a creation that failed.
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        try:
            topic = self._open_topic(name, partitions, overrides, True, now_ms)
        except OSError as exc:
            shutil.rmtree(directory, ignore_errors=True)
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"cannot create topic {name!r}: {exc}"
            ) from exc
        # The meta file goes last: a topic directory without one is never a topic.
        write_atomic(
            directory / META_FILE,
            seal(msgpack.packb({"partitions": partitions, "config": overrides}, use_bin_type=True)),
        )
        self.topics[name] = topic
        log.info(
            "event=topic_created topic=%s partitions=%d config=%s", name, partitions, overrides
        )
        return topic

    def _check_fd_budget(self, partitions: int) -> None:
        """Every partition keeps its segment files open; refuse a topic that would
        leave too few descriptors for connections and the files the broker writes."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return
        budget = soft - FDS_RESERVED - min(self.config.max_connections, soft // 4)
        in_use = len(self.all_partitions())
        if in_use + partitions > budget:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"{partitions} more partitions would pass the open-file budget ({in_use} open, "
                f"room for {max(budget, 0)} with RLIMIT_NOFILE={soft} and max_connections="
                f"{self.config.max_connections}); raise the limit (LimitNOFILE=)",
            )

    def partition(self, topic: str, index: int) -> Partition | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= index < len(t.partitions):
            return None
        return t.partitions[index]

    def all_partitions(self) -> list[Partition]:
        return [p for t in self.topics.values() for p in t.partitions]

    def apply_settings(self, config: BrokerConfig) -> None:
        """Adopt reloaded broker-wide retention settings for topics without overrides."""
        self.config = config
        for topic in self.topics.values():
            log_config = self.log_config(topic.config)
            for p in topic.partitions:
                p.log.config = log_config
                p.producers.expiration_ms = config.producer_id_expiration_ms

    def close(self) -> None:
        for p in self.all_partitions():
            p.close()
