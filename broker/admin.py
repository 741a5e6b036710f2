"""Topic administration: DeleteTopics, DescribeConfigs and IncrementalAlterConfigs
(docs/protocol.md sections 4 and 9.16, docs/operations.md).

What a setting is, its bounds and how it is shown come from the settings table
(broker/config.py): DescribeConfigs reads it, IncrementalAlterConfigs checks values
with the same `Setting.check` CreateTopics' config goes through. This module orders
the IO around them.

Deleting a topic is whole or nothing. First the refusals: an open transaction
holds data on it or offsets of it (CONCURRENT_TRANSACTIONS). Then, each step
durable before the next:

1. its partitions are flushed, so every acks=-1 batch already appended is
   answered as stored, as it would have been before the deletion;
2. its directory is renamed to its tombstone and the rename fsynced: from here
   on the topic is gone (`TopicRegistry.delete`). Long-polling fetches on it are
   woken and find it unknown; the group committer lets go of its files;
3. every group's committed offsets of it are dropped (`OffsetStore.delete_topic`);
4. the tombstone is removed (`TopicRegistry.remove_deleted`).

A crash before step 2 leaves the topic whole; after it, the next start finds the
tombstone and runs steps 3 and 4 before serving (`finish_deletions`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.config import (
    ConfigError,
    SettingNamedTwice,
    altered_overrides,
    describe_broker,
    describe_topic,
)
from broker.crash_points import crash_point
from broker.groups import OffsetStore
from broker.partitions import GroupCommitter, Topic, TopicError, TopicRegistry
from broker.storage import StorageError
from broker.transactions import TransactionCoordinator
from protocol import messages as m
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")


async def finish_deletion(topics: TopicRegistry, offsets: OffsetStore, name: str) -> None:
    """Steps 3 and 4 of a deletion whose rename is durable: the topic's committed offsets,
    then its files. OSError on a storage failure: the tombstone stays for the next start."""
    await offsets.delete_topic(name)
    topics.remove_deleted(name)


async def finish_deletions(topics: TopicRegistry, offsets: OffsetStore) -> None:
    """At start, once the committed offsets are loaded: finish every deletion a crash
    interrupted (the tombstones `TopicRegistry.open_all` found)."""
    for name in topics.deleting:
        log.warning("event=topic_deletion_finished topic=%s reason='interrupted by a crash'", name)
        await finish_deletion(topics, offsets, name)
    topics.deleting = []


class Admin:
    """The three APIs, over the topic registry, the committed offsets, the transaction
    coordinator (who holds an open transaction) and the group committer."""

    def __init__(
        self,
        topics: TopicRegistry,
        offsets: OffsetStore,
        coordinator: TransactionCoordinator,
        committer: GroupCommitter,
        broker_id: int,
        wake_fetchers: Callable[[], None],
    ) -> None:
        self.topics = topics
        self.offsets = offsets
        self.coordinator = coordinator
        self.committer = committer
        self.broker_id = broker_id
        self.wake_fetchers = wake_fetchers

    # ------------------------------------------------------------------ DeleteTopics

    async def delete_topics(self, req: m.DeleteTopicsRequest) -> m.DeleteTopicsResponse:
        """Each topic on its own, whole or not at all, in the order named."""
        return m.DeleteTopicsResponse(topics=[await self._delete(name) for name in req.topics])

    async def _delete(self, name: str) -> m.DeleteTopicResult:
        topic = self.topics.topics.get(name)
        if topic is None:
            return m.DeleteTopicResult(
                name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
            )
        busy = self._open_transactions(topic)
        if busy is not None:
            return m.DeleteTopicResult(name, ErrorCode.CONCURRENT_TRANSACTIONS, busy)
        try:
            for p in topic.partitions:
                p.log.flush()
        except StorageError as exc:
            log.error("event=topic_delete_failed topic=%s error=%r", name, str(exc))
            return m.DeleteTopicResult(name, ErrorCode.KAFKA_STORAGE_ERROR, f"storage: {exc}")
        crash_point("topic_delete_flushed")
        unfinished: OSError | None = None
        try:
            self.topics.delete(name)
        except TopicError as exc:
            log.error("event=topic_delete_failed topic=%s error=%r", name, exc.message)
            return m.DeleteTopicResult(name, exc.code, exc.message)
        except OSError as exc:
            unfinished = exc  # renamed, but the rename is not known durable
        self.wake_fetchers()
        await self.committer.forget(topic.partitions)
        for p in topic.partitions:
            p.close_files()
        if unfinished is None:
            try:
                await finish_deletion(self.topics, self.offsets, name)
            except OSError as exc:
                unfinished = exc
        if unfinished is not None:
            log.error("event=topic_delete_unfinished topic=%s error=%r", name, str(unfinished))
            return m.DeleteTopicResult(
                name,
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"topic {name!r} is deleted but its deletion did not finish ({unfinished}); "
                "the broker finishes it at its next start",
            )
        log.info("event=topic_deleted topic=%s partitions=%d", name, len(topic.partitions))
        return m.DeleteTopicResult(name)

    def _open_transactions(self, topic: Topic) -> str | None:
        """Why `topic` may not go now: an open transaction holds data on one of its
        partitions, or offsets of it in a group. None when nothing does."""
        for p in topic.partitions:
            for pid in p.producers.open_txns:
                owner = self.coordinator.owner_of(pid)
                who = f"transactional id {owner!r}" if owner else f"producer id {pid}"
                return (
                    f"{who} has an open transaction on {topic.name}-{p.index}; delete the "
                    "topic once it has ended"
                )
        for group_id, pid in self.offsets.pending_in(topic.name):
            owner = self.coordinator.owner_of(pid)
            who = f"transactional id {owner!r}" if owner else f"producer id {pid}"
            return (
                f"{who} has an open transaction holding offsets of {topic.name} in group "
                f"{group_id!r}; delete the topic once it has ended"
            )
        return None

    # ------------------------------------------------------------------ DescribeConfigs

    def describe_configs(self, req: m.DescribeConfigsRequest) -> m.DescribeConfigsResponse:
        config = self.topics.config  # the broker's settings, reloads included
        results = []
        for r in req.resources:
            topic = self.topics.topics.get(r.name) if r.type == "topic" else None
            if r.type == "broker" and r.name == str(self.broker_id):
                described = describe_broker(config)
            elif topic is not None:
                described = describe_topic(config, topic.config)
            else:
                # Kafka's answers: a broker id other than this broker's is INVALID_REQUEST.
                error = (
                    ErrorCode.INVALID_REQUEST
                    if r.type == "broker"
                    else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
                results.append(m.DescribeConfigsResult(r.type, r.name, error))
                continue
            configs = [m.ConfigEntry(*d) for d in described]
            results.append(m.DescribeConfigsResult(r.type, r.name, configs=configs))
        return m.DescribeConfigsResponse(results=results)

    # ------------------------------------------------------------------ IncrementalAlterConfigs

    def incremental_alter_configs(
        self, req: m.IncrementalAlterConfigsRequest
    ) -> m.IncrementalAlterConfigsResponse:
        """Each resource all or nothing, durable before the answer (unless validate_only)."""
        return m.IncrementalAlterConfigsResponse(
            results=[self._alter(r, req.validate_only) for r in req.resources]
        )

    def _alter(self, r: m.AlterableConfigResource, validate_only: bool) -> m.AlterConfigsResult:
        topic = self.topics.topics.get(r.name)
        if topic is None:
            return m.AlterConfigsResult(
                r.type,
                r.name,
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {r.name!r} does not exist",
            )
        try:
            overrides = altered_overrides(topic.config, [(o.name, o.op, o.value) for o in r.ops])
        except SettingNamedTwice as exc:
            return m.AlterConfigsResult(r.type, r.name, ErrorCode.INVALID_REQUEST, str(exc))
        except ConfigError as exc:
            return m.AlterConfigsResult(r.type, r.name, ErrorCode.INVALID_CONFIG, str(exc))
        if validate_only or overrides == topic.config:
            return m.AlterConfigsResult(r.type, r.name)
        try:
            self.topics.alter_config(r.name, overrides)
        except OSError as exc:
            log.error("event=topic_config_failed topic=%s error=%r", r.name, str(exc))
            return m.AlterConfigsResult(
                r.type, r.name, ErrorCode.KAFKA_STORAGE_ERROR, f"storage: {exc}"
            )
        log.info("event=topic_config_altered topic=%s config=%s", r.name, overrides)
        return m.AlterConfigsResult(r.type, r.name)
