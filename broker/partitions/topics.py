"""Topics: names, partition counts and per-topic log settings, persisted on disk.

Layout: `<data_dir>/topics/<name>/topic.meta` (sealed msgpack: partitions, config
overrides and the topic id) and one directory per partition,
`<data_dir>/topics/<name>/<n>/`.

Every topic has an id (Kafka's KIP-516), random and fixed for the topic's life, so a
topic deleted and created again under its name is told apart from the old one. A meta
file written before topics had ids gets one at the next start, written back before
the topic serves anything; a meta file rebuilt after damage gets a new one.

A topic is created in `<name>~` ('~' is never in a topic name) and renamed into
place once its meta file is durable, so a crash or an error during creation
leaves at most a staging directory, which is removed. A topic directory without
a readable meta file is therefore damage, never a creation that failed: it is
rebuilt from its partition directories or the broker refuses to start. Nothing
here deletes a directory that may hold records, except a deletion asked for.

A topic is deleted (DeleteTopics) by renaming its directory to `<name>~deleted`,
its tombstone, durably: that rename is the moment it is gone. Its files are then
removed; a tombstone found at start is a deletion a crash interrupted, which the
broker finishes (docs/operations.md, "Deleting a topic"). While a tombstone is
there the name cannot be created again, so a tombstone always belongs to the
last topic of its name.

A topic's overrides change (IncrementalAlterConfigs) by rewriting its meta file
atomically, then giving its open partitions the new log settings.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import resource
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

from broker.config import PARTITIONS_MAX, TOPIC_SETTINGS, BrokerConfig, ConfigError, topic_overrides
from broker.crash_points import crash_point
from broker.partitions.partition import Partition, ProducerLimits
from broker.storage import (
    DataDirError,
    LogConfig,
    StorageError,
    fsync_dir,
    seal,
    unseal,
    write_atomic,
)
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")

TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
META_FILE = "topic.meta"
STAGING_SUFFIX = "~"
TOMBSTONE_SUFFIX = "~deleted"
FDS_RESERVED = 64  # snapshots, indexes, the lock, the metrics listener


class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class TopicMetaError(DataDirError):
    """A topic directory whose meta file is gone or damaged and cannot be rebuilt."""


def check_name(name: str) -> None:
    if not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} must match [A-Za-z0-9._-]{{1,249}} and not be '.' or '..'",
        )


REBUILT_META_CONFIG = {"retention_ms": -1, "retention_bytes": -1}


class TopicMeta(NamedTuple):
    """What a topic's meta file holds."""

    partitions: int
    config: dict[str, int]
    topic_id: uuid.UUID | None  # None: written before topics had ids


def new_topic_id() -> uuid.UUID:
    """A random topic id, as Kafka's `Uuid.randomUuid` makes one: never one whose text
    starts with '-' (Kafka's tools would read it as an option). A version 4 UUID is
    never Kafka's reserved zero or metadata-topic id."""
    while True:
        topic_id = uuid.uuid4()
        if not topic_id_text(topic_id).startswith("-"):
            return topic_id


def topic_id_text(topic_id: uuid.UUID) -> str:
    """A topic id as Kafka shows it: URL-safe base64 of its 16 bytes, unpadded."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def encode_meta(meta: TopicMeta) -> bytes:
    assert meta.topic_id is not None, "a meta file is written with the topic's id"
    body = {"partitions": meta.partitions, "config": meta.config, "id": meta.topic_id.bytes}
    return seal(msgpack.packb(body, use_bin_type=True))


def decode_meta(data: bytes) -> TopicMeta:
    """The meta file's contents; ValueError saying what is wrong with it."""
    body = unseal(data)
    if body is None:
        raise ValueError("checksum mismatch")
    try:
        meta = msgpack.unpackb(body, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    if not isinstance(meta, dict) or set(meta) - {"id"} != {"partitions", "config"}:
        raise ValueError("not a map of partitions, config and id")
    raw_id = meta.get("id")
    if raw_id is not None and (type(raw_id) is not bytes or len(raw_id) != 16):
        raise ValueError(f"topic id {raw_id!r} is not 16 bytes")
    partitions = meta["partitions"]
    if type(partitions) is not int or not 1 <= partitions <= PARTITIONS_MAX:
        raise ValueError(f"partitions {partitions!r} not in 1..{PARTITIONS_MAX}")
    if not isinstance(meta["config"], dict):
        raise ValueError("config is not a map")
    try:
        config = topic_overrides(meta["config"])
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return TopicMeta(partitions, config, None if raw_id is None else uuid.UUID(bytes=raw_id))


def partition_count_on_disk(directory: Path) -> int:
    """How many partitions the directories `0`..`n-1` of a topic say it has; TopicMetaError
    when they do not say it unambiguously."""
    found = sorted(
        int(p.name)
        for p in directory.iterdir()
        if p.is_dir() and p.name.isdigit() and str(int(p.name)) == p.name
    )
    if not found:
        raise TopicMetaError(
            f"{directory / META_FILE} is missing or damaged and {directory} has no partition "
            "directories to rebuild it from; restore the topic from a backup or move the "
            "directory away"
        )
    if found != list(range(len(found))) or len(found) > PARTITIONS_MAX:
        raise TopicMetaError(
            f"{directory / META_FILE} is missing or damaged and the partition directories "
            f"of {directory} ({', '.join(map(str, found))}) are not 0..n-1; restore the "
            "topic from a backup or move the directory away"
        )
    return len(found)


@dataclass
class Topic:
    name: str
    config: dict[str, int]
    partitions: list[Partition]
    topic_id: uuid.UUID


class TopicRegistry:
    """All topics of a data dir, opened (and recovered) at start."""

    def __init__(self, root: Path, config: BrokerConfig) -> None:
        self.root = root / "topics"
        self.config = config
        self.topics: dict[str, Topic] = {}
        self.on_rolled: Callable[[Partition], None] | None = None
        # Topics whose deletion a crash interrupted (tombstones found at start): the
        # broker finishes them before it serves (broker/admin.py, finish_deletions).
        self.deleting: list[str] = []

    def set_on_rolled(self, hook: Callable[[Partition], None]) -> None:
        """Run `hook` after any partition, now or later created, rolls a segment."""
        self.on_rolled = hook
        for p in self.all_partitions():
            p.on_rolled = hook

    def log_config(self, overrides: dict[str, int]) -> LogConfig:
        # Broker-wide defaults and topic overrides share the setting names.
        defaults = {s.name: getattr(self.config, s.name) for s in TOPIC_SETTINGS.values()}
        return LogConfig(**{**defaults, **overrides})

    @property
    def limits(self) -> ProducerLimits:
        return ProducerLimits(
            self.config.max_producers_per_partition, self.config.producer_id_expiration_ms
        )

    def open_all(self, *, clean_shutdown: bool, now_ms: int) -> None:
        """Open every topic; TopicMetaError when one cannot be opened without guessing."""
        self.root.mkdir(parents=True, exist_ok=True)
        for entry in sorted(self.root.iterdir()):
            if entry.name.endswith(TOMBSTONE_SUFFIX) and entry.is_dir():
                self.deleting.append(entry.name[: -len(TOMBSTONE_SUFFIX)])
                continue
            if entry.name.endswith(STAGING_SUFFIX):
                # Never renamed into place, so never a topic: nothing was ever stored there.
                log.warning("event=topic_creation_discarded dir=%s", entry)
                shutil.rmtree(entry)
                continue
            if not entry.is_dir() or not TOPIC_NAME.fullmatch(entry.name):
                log.warning("event=topic_dir_ignored path=%s reason='not a topic'", entry)
                continue
            meta = self._read_meta(entry)
            assert meta.topic_id is not None
            self.topics[entry.name] = self._open_topic(entry.name, meta, clean_shutdown, now_ms)

    def _read_meta(self, directory: Path) -> TopicMeta:
        """The topic's meta file, given an id if it has none; when it is missing or
        damaged, the partition count its directories show with retention off and a new
        id, written back as the new meta file."""
        meta_path = directory / META_FILE
        try:
            meta = decode_meta(meta_path.read_bytes())
        except FileNotFoundError:
            reason = "missing"
        except ValueError as exc:
            reason = str(exc)
        except OSError as exc:
            raise TopicMetaError(f"cannot read {meta_path}: {exc.strerror}") from exc
        else:
            if meta.topic_id is not None:
                return meta
            topic_id = new_topic_id()
            log.info(
                "event=topic_id_assigned file=%s topic_id=%s", meta_path, topic_id_text(topic_id)
            )
            return self._write_meta(meta_path, meta._replace(topic_id=topic_id))
        partitions = partition_count_on_disk(directory)
        # The overrides are lost with the file. Retention is switched off rather than
        # falling back to the broker's, which could delete data the topic kept forever:
        # only an operator who sets it again may let retention remove anything.
        config = dict(REBUILT_META_CONFIG)
        log.warning(
            "event=topic_meta_rebuilt file=%s reason=%r partitions=%d config=%s "
            "note='per-topic overrides are lost; retention is off until set again'",
            meta_path,
            reason,
            partitions,
            config,
        )
        return self._write_meta(meta_path, TopicMeta(partitions, config, new_topic_id()))

    @staticmethod
    def _write_meta(meta_path: Path, meta: TopicMeta) -> TopicMeta:
        try:
            write_atomic(meta_path, encode_meta(meta))
        except OSError as exc:
            raise TopicMetaError(f"cannot rewrite {meta_path}: {exc.strerror}") from exc
        return meta

    def _open_topic(self, name: str, meta: TopicMeta, clean_shutdown: bool, now_ms: int) -> Topic:
        assert meta.topic_id is not None
        log_config = self.log_config(meta.config)
        opened: list[Partition] = []
        try:
            for i in range(meta.partitions):
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
                _release(p)
            raise
        topic = Topic(name, meta.config, opened, meta.topic_id)
        for p in topic.partitions:
            p.on_rolled = self.on_rolled
        return topic

    def create(
        self, name: str, partitions: int, config: dict[str, Any] | None, now_ms: int
    ) -> Topic:
        """Create a topic whole or not at all: on any error nothing of it stays on disk
        or open, and an OSError answers KAFKA_STORAGE_ERROR."""
        check_name(name)
        if name in self.topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if not 1 <= partitions <= PARTITIONS_MAX:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"partitions must be 1..{PARTITIONS_MAX}, got {partitions}",
            )
        try:
            overrides = topic_overrides(config)
        except ConfigError as exc:
            raise TopicError(ErrorCode.INVALID_CONFIG, str(exc)) from exc
        self._check_fd_budget(partitions)
        if os.path.lexists(self._tombstone(name)):
            # Its offsets may still be dropped at the next start: a new topic of the
            # name must not be there to lose its own. Retriable: a deletion under way
            # is done in moments.
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"cannot create topic {name!r} yet: the deletion of the topic of that name "
                f"has not finished ({self._tombstone(name)} is still there); one that "
                "failed is finished at the broker's next start",
            )
        directory = self.root / name
        if os.path.lexists(directory):
            # Not a topic we know, yet maybe someone's records: never deleted here.
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"cannot create topic {name!r}: {directory} already exists and is no topic "
                "of this broker; move it away",
            )
        staging = self.root / (name + STAGING_SUFFIX)
        try:
            if os.path.lexists(staging):
                shutil.rmtree(staging)  # a creation that failed and could not clean up
            staging.mkdir(parents=True)
            for i in range(partitions):
                (staging / str(i)).mkdir()
            meta = TopicMeta(partitions, overrides, new_topic_id())
            write_atomic(staging / META_FILE, encode_meta(meta))
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise _storage_error(name, exc) from exc
        try:
            os.rename(staging, directory)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise _storage_error(name, exc) from exc
        try:
            fsync_dir(self.root)
            topic = self._open_topic(name, meta, True, now_ms)
        except (OSError, StorageError) as exc:
            self._uncreate(directory, staging)
            raise _storage_error(name, exc) from exc
        except BaseException:
            self._uncreate(directory, staging)
            raise
        self.topics[name] = topic
        log.info(
            "event=topic_created topic=%s topic_id=%s partitions=%d config=%s",
            name,
            topic_id_text(topic.topic_id),
            partitions,
            overrides,
        )
        return topic

    def _uncreate(self, directory: Path, staging: Path) -> None:
        """Take back a topic renamed into place moments ago: it has served nothing."""
        try:
            os.rename(directory, staging)
            shutil.rmtree(staging)
            fsync_dir(self.root)
        except OSError as exc:
            log.error("event=topic_uncreate_failed dir=%s error=%r", directory, str(exc))

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

    def _tombstone(self, name: str) -> Path:
        return self.root / (name + TOMBSTONE_SUFFIX)

    def delete(self, name: str) -> Topic:
        """Take topic `name` out of service and rename its directory to its tombstone,
        durably: from then on it is gone, after a crash too. TopicError
        (KAFKA_STORAGE_ERROR) when the rename fails: nothing changed. An OSError from
        the directory's fsync comes after the rename: the topic is out of service and
        the next start finds it whole or gone. The caller closes its partitions' files
        and then has `remove_deleted` remove them."""
        topic = self.topics[name]
        try:
            os.rename(self.root / name, self._tombstone(name))
        except OSError as exc:
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"cannot delete topic {name!r}: {exc}"
            ) from exc
        del self.topics[name]
        fsync_dir(self.root)
        crash_point("topic_delete_renamed")
        return topic

    def remove_deleted(self, name: str) -> None:
        """Remove the tombstone of deleted topic `name`, a partition at a time (a crash
        leaves what is left of it for the next start), then the directory, durably."""
        tombstone = self._tombstone(name)
        for entry in sorted(tombstone.iterdir()):
            if entry.is_dir():
                shutil.rmtree(entry)
                crash_point("topic_delete_partition_removed")
        shutil.rmtree(tombstone)
        fsync_dir(self.root)
        crash_point("topic_delete_files_removed")
        log.info("event=topic_files_removed topic=%s", name)

    def alter_config(self, name: str, overrides: dict[str, int]) -> None:
        """Make `overrides` (checked, by setting name) topic `name`'s: its meta file is
        rewritten atomically, then its open partitions take the new log settings (the
        next retention run and the next roll use them). OSError when the meta file could
        not be written: the overrides in force are unchanged."""
        topic = self.topics[name]
        meta = TopicMeta(len(topic.partitions), overrides, topic.topic_id)
        write_atomic(self.root / name / META_FILE, encode_meta(meta))
        crash_point("topic_config_durable")
        topic.config = overrides
        self._apply_log_config(topic)

    def _apply_log_config(self, topic: Topic) -> None:
        log_config = self.log_config(topic.config)
        for p in topic.partitions:
            p.log.config = log_config

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
            self._apply_log_config(topic)
            for p in topic.partitions:
                p.producers.expiration_ms = config.producer_id_expiration_ms

    def close(self) -> None:
        for p in self.all_partitions():
            p.close()


def _storage_error(name: str, exc: BaseException) -> TopicError:
    log.error("event=topic_create_failed topic=%s error=%r", name, str(exc))
    return TopicError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot create topic {name!r}: {exc}")


def _release(partition: Partition) -> None:
    """Close a partition being given up on; its files are closed even if writing fails."""
    try:
        partition.log.close()
    except StorageError as exc:
        log.warning(
            "event=partition_close_failed dir=%s error=%r", partition.log.directory, str(exc)
        )
