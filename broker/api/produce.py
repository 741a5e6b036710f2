"""Produce: each batch checked broker-wide, then appended through its partition
(docs/protocol.md sections 3 and 4).

Batches are validated (`protocol/batch.py`), judged against the producer's standing
(issued, its principal's, not fenced, transactional as its id says) and appended with
`Partition.append_many`, each partition's batches of a request, or of a run of
requests read together, in one write. A transactional Produce is first admitted by
the transaction coordinator under its id's lock. acks=-1 answers with a
`DurableReply`, sent once the group commit has synced the batches.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any, cast

from broker.api.outcomes import DurableReply, SyncedReply, storage_failed
from broker.api.transactions import owner_of
from broker.clock import now_ms
from broker.config import BrokerConfig
from broker.crash_points import crash_point
from broker.metrics import BrokerMetrics
from broker.partitions import (
    AppendResult,
    FlushFailed,
    GroupCommitter,
    Partition,
    ProducerIdManager,
    TopicRegistry,
)
from broker.security import Session
from broker.transactions import TransactionCoordinator
from protocol import messages as m
from protocol.batch import (
    CONTROL_FLAG,
    NO_PRODUCER_ID,
    TRANSACTIONAL_FLAG,
    BatchError,
    BatchHeader,
    validate,
)
from protocol.errors import ErrorCode

Checked = tuple[Partition, BatchHeader] | m.ProducePartitionResponse
"""A produced batch after the broker-wide checks: where to append it, or its refusal."""


def appends_together(request: Any) -> bool:
    """Whether `request` may join a run of Produce requests appended together: a Produce
    that needs no await."""
    return (
        isinstance(request, m.ProduceRequest)
        and request.transactional_id is None
        and request.acks in (-1, 0, 1)
    )


class ProduceApi:
    """Produce, alone or in runs of requests read together."""

    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicRegistry,
        producer_ids: ProducerIdManager,
        committer: GroupCommitter,
        coordinator: TransactionCoordinator,
        metrics: BrokerMetrics,
        wake: Callable[[], None],
    ) -> None:
        """`wake` tells the long-polling Fetches that records were appended."""
        self.config = config
        self.topics = topics
        self.producer_ids = producer_ids
        self.committer = committer
        self.coordinator = coordinator
        self.metrics = metrics
        self._wake = wake

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        return {"Produce": self.produce}

    def produce(
        self, req: m.ProduceRequest, session: Session
    ) -> (
        m.ProduceResponse
        | DurableReply
        | Awaitable[m.ProduceResponse | DurableReply | SyncedReply | None]
        | None
    ):
        acks = req.acks
        if acks not in (-1, 0, 1):
            return m.ProduceResponse(
                topics=[
                    m.ProduceTopicResponse(
                        t.topic,
                        [
                            m.ProducePartitionResponse(
                                p.partition, ErrorCode.INVALID_REQUIRED_ACKS, message=f"acks={acks}"
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in req.topics
                ]
            )
        checked = self._check_request(req, set(), session.principal)
        if req.transactional_id is not None:
            return self._produce_transactional(req, req.transactional_id, checked)
        return self._append_checked([(req, checked)])[0]

    def produce_run(
        self, reqs: list[m.ProduceRequest], principal: str
    ) -> list[m.ProduceResponse | DurableReply | None]:
        """The replies to Produce requests read together (each `appends_together`),
        as one after another would answer them, each partition's batches appended in
        one write."""
        passed: set[tuple[int, int, str | None]] = set()
        return self._append_checked(
            [(req, self._check_request(req, passed, principal)) for req in reqs]
        )

    def _check_request(
        self, req: m.ProduceRequest, passed: set[tuple[int, int, str | None]], principal: str
    ) -> list[list[Checked]]:
        """Each batch's partition and header, or its refusal. `passed` holds the
        producers (id, epoch, transactional id) found in good standing, for `principal`,
        since the caller last awaited: until then nothing can change their standing."""
        tid = req.transactional_id
        topics = req.topics
        if len(topics) == 1 and len(topics[0].partitions) == 1:
            # One batch, the common Produce: without the comprehensions' frames.
            t = topics[0]
            p = t.partitions[0]
            return [[self._check_batch(t.topic, p.partition, p.records, tid, passed, principal)]]
        return [
            [
                self._check_batch(t.topic, p.partition, p.records, tid, passed, principal)
                for p in t.partitions
            ]
            for t in topics
        ]

    async def _produce_transactional(
        self, req: m.ProduceRequest, transactional_id: str, checked: list[list[Checked]]
    ) -> m.ProduceResponse | DurableReply | SyncedReply | None:
        """The coordinator admits the batches (the transaction durably holds their
        partitions) and, under the same lock, they are appended."""
        async with self.coordinator.locked(transactional_id):
            admitted = [
                ((t.topic, c[0].index), c[1])
                for t, row in zip(req.topics, checked, strict=True)
                for c in row
                if isinstance(c, tuple)
            ]
            refused, ended, txn_log_end = self.coordinator.admit(transactional_id, admitted)
            repeats: dict[tuple[str, int], m.ProducePartitionResponse] = {}
            for t, row in zip(req.topics, checked, strict=True):
                for c in row:
                    # Its topic was deleted (perhaps created anew) while the batch waited:
                    # the partition it was checked against is closed.
                    if (
                        isinstance(c, tuple)
                        and self.topics.partition(t.topic, c[0].index) is not c[0]
                    ):
                        refused[t.topic, c[0].index] = (
                            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            f"topic {t.topic!r} was deleted",
                        )
                    elif isinstance(c, tuple) and (t.topic, c[0].index) in ended:
                        repeat = await self._repeat_of_ended(c[0], c[1], req.acks)
                        if repeat is not None:
                            repeats[t.topic, c[0].index] = repeat
                            del refused[t.topic, c[0].index]
            answered = {
                key: m.ProducePartitionResponse(key[1], code, message=message)
                for key, (code, message) in refused.items()
            } | repeats
            if answered:
                checked = [
                    [
                        answered.get((t.topic, c[0].index), c) if isinstance(c, tuple) else c
                        for c in row
                    ]
                    for t, row in zip(req.topics, checked, strict=True)
                ]
                for code, _ in refused.values():
                    self._count_rejection(code)
            reply = self._append_checked([(req, checked)])[0]
            crash_point("txn_batch_appended")
            if not txn_log_end or isinstance(reply, DurableReply):
                # acks=-1: the add, written, not synced, is durable through the batch
                # once the batch is: should a crash keep the batch and lose the add,
                # recovery adopts the partition from the batch, which carries the
                # entry's pid and epoch (docs/transactions.md, At start, step 5). The
                # next sync of `txn.wal` takes it (a one-round commit's, behind its
                # answer; a decision's).
                return reply
            self.coordinator.sync_soon(txn_log_end)
            if reply is not None:
                # acks=1: the batch is not waited for, but the add is, before the answer;
                # what the connection sends next runs meanwhile.
                return self._add_synced(reply, txn_log_end)
            # acks=0: no answer, but the add is synced before the next request, as ever.
            with contextlib.suppress(OSError):
                await self.coordinator.durable(txn_log_end)
            return None

    def _add_synced(self, reply: m.ProduceResponse, txn_log_end: int) -> SyncedReply:
        """`reply`, sent once the partition add written up to `txn_log_end` is durable."""
        coordinator = self.coordinator

        async def durable() -> None:
            try:
                await coordinator.durable(txn_log_end)
            except OSError as exc:
                storage_failed(reply, f"transaction log: {exc}")

        return SyncedReply(reply, functools.partial(coordinator.is_durable, txn_log_end), durable)

    async def _repeat_of_ended(
        self, partition: Partition, header: BatchHeader, acks: int
    ) -> m.ProducePartitionResponse | None:
        """The answer to a resent batch of the producer's transaction that just ended,
        when the log holds it (its original offset, as a duplicate; once durable for
        acks=-1), else None: it stays refused. A client that sends EndTxn right behind
        its last Produce resends a batch whose answer the lost connection took, after
        the transaction ended (docs/protocol.md section 9)."""
        decision = partition.producers.check(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.record_count,
            now_ms(),
        )
        repeat = decision.duplicate
        if decision.error or repeat is None:
            return None
        self.metrics.producer_event("duplicate")
        plog = partition.log
        error = ErrorCode.NONE
        if acks == -1 and plog.flushed_offset <= repeat.last_offset:
            try:
                await self.committer.wait_durable(partition, repeat.last_offset)
            except FlushFailed:
                error = ErrorCode.KAFKA_STORAGE_ERROR
        return m.ProducePartitionResponse(
            partition.index,
            error,
            repeat.base_offset if not error else -1,
            -1,
            plog.log_start_offset,
            not error,
            message="fsync failed" if error else None,
        )

    def _append_checked(
        self, checked: list[tuple[m.ProduceRequest, list[list[Checked]]]]
    ) -> list[m.ProduceResponse | DurableReply | None]:
        """Append the batches that passed the checks, each partition's in one
        `append_many`, and build each request's reply from the results.

        Each batch's entry in `checked` is replaced by its answer, so every entry is
        an answer when the replies are built."""
        stamp = now_ms()
        # Per partition: where each of its batches sits (its row and place in the row),
        # the batches and their headers, in the order they came.
        runs: dict[
            int,
            tuple[Partition, list[tuple[list[Checked], int]], list[memoryview], list[BatchHeader]],
        ] = {}
        for req, rows in checked:
            for t, row in zip(req.topics, rows, strict=True):
                for i, c in enumerate(row):
                    if isinstance(c, tuple):
                        partition, header = c
                        run = runs.get(id(partition))
                        if run is None:
                            run = runs[id(partition)] = (partition, [], [], [])
                        run[1].append((row, i))
                        run[2].append(t.partitions[i].records)
                        run[3].append(header)
        durable: dict[int, list[tuple[Partition, int]]] = {}
        for partition, places, batches, headers in runs.values():
            results = partition.append_many(batches, headers, stamp)
            # What the run appended, counted once for the run.
            appended_bytes = appended_records = 0
            for (row, i), header, result in zip(places, headers, results, strict=True):
                row[i] = self._answer_append(partition, result)
                if result.error:
                    continue
                durable.setdefault(id(row), []).append((partition, result.last_offset))
                if not result.duplicate:
                    appended_bytes += header.size_bytes
                    appended_records += header.record_count
            if appended_records:
                self.metrics.record_produce(partition.topic, appended_bytes, appended_records)
                self._wake()
        replies: list[m.ProduceResponse | DurableReply | None] = []
        for req, rows in checked:
            # Every entry is an answer now (see above).
            topics = [
                m.ProduceTopicResponse(t.topic, cast(list[m.ProducePartitionResponse], row))
                for t, row in zip(req.topics, rows, strict=True)
            ]
            waits = [w for row in rows for w in durable.get(id(row), ())] if req.acks == -1 else []
            if req.acks == 0:
                replies.append(None)
            elif waits:
                # Start the fsync round now rather than when the reply writer reaches
                # this reply, so syncing overlaps the next appends.
                for partition, _ in waits:
                    self.committer.request_flush(partition, batches=1)
                replies.append(self._await_durable(req.timeout_ms, topics, waits))
            else:
                replies.append(m.ProduceResponse(topics=topics))
        return replies

    def _check_batch(
        self,
        topic: str,
        index: int,
        records: memoryview,
        transactional_id: str | None,
        passed: set[tuple[int, int, str | None]],
        principal: str,
    ) -> Checked:
        """The partition and header of a batch that may be appended, or the refusal."""
        partition = self.topics.partition(topic, index)
        if partition is None:
            return m.ProducePartitionResponse(
                index,
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                message=f"unknown topic-partition {topic}-{index}",
            )
        try:
            header = validate(records, max_bytes=self.config.message_max_bytes)
        except BatchError as exc:
            return m.ProducePartitionResponse(index, exc.code, message=exc.message)
        error, message = self._refuse_batch(header, transactional_id, passed, principal)
        if error:
            return m.ProducePartitionResponse(index, error, message=message)
        return partition, header

    def _answer_append(
        self, partition: Partition, result: AppendResult
    ) -> m.ProducePartitionResponse:
        """A batch's answer; a refusal or a duplicate counted in the metrics (the caller
        counts what was appended)."""
        index = partition.index
        plog = partition.log
        if result.error:
            self._count_rejection(result.error)
            return m.ProducePartitionResponse(
                index,
                result.error,
                log_start_offset=plog.log_start_offset,
                message=result.message,
            )
        if result.duplicate:
            self.metrics.producer_event("duplicate")
        return m.ProducePartitionResponse(
            index,
            ErrorCode.NONE,
            result.base_offset,
            -1,
            plog.log_start_offset,
            result.duplicate,
        )

    def _refuse_batch(
        self,
        header: BatchHeader,
        transactional_id: str | None,
        passed: set[tuple[int, int, str | None]],
        principal: str,
    ) -> tuple[ErrorCode, str | None]:
        """Broker-wide checks before the partition's producer state is consulted."""
        # The flags are read once as bits: this runs for every produced batch.
        attributes = header.attributes
        if attributes & CONTROL_FLAG:
            return ErrorCode.INVALID_RECORD, "clients may not write control batches"
        transactional = bool(attributes & TRANSACTIONAL_FLAG)
        if transactional and transactional_id is None:
            return ErrorCode.INVALID_TXN_STATE, "a transactional batch needs transactional_id"
        if transactional_id is not None and not transactional:
            return (
                ErrorCode.INVALID_TXN_STATE,
                "a Produce with transactional_id carries transactional batches only",
            )
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return ErrorCode.NONE, None
        epoch = header.producer_epoch
        standing = (pid, epoch, transactional_id)
        if standing in passed:
            return ErrorCode.NONE, None
        if not self.producer_ids.is_issued(pid):
            self.metrics.producer_event("unknown_producer_id")
            return ErrorCode.UNKNOWN_PRODUCER_ID, f"producer id {pid} was never issued"
        if owner_of(self.coordinator, self.producer_ids, pid) != principal:
            return (
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"producer id {pid} belongs to another principal",
            )
        # A transactional batch is judged by its coordinator, which tells a fenced epoch
        # from the one whose transaction just ended (its resends may be duplicates).
        if transactional_id is None and self.producer_ids.fenced(pid, epoch):
            self.metrics.producer_event("fenced")
            return ErrorCode.INVALID_PRODUCER_EPOCH, f"epoch {epoch} of producer {pid} is fenced"
        if not transactional:
            owner = self.coordinator.owner_of(pid)
            if owner is not None:
                return (
                    ErrorCode.INVALID_TXN_STATE,
                    f"producer {pid} belongs to transactional id {owner!r}: its batches are "
                    "transactional",
                )
        passed.add(standing)
        return ErrorCode.NONE, None

    def _count_rejection(self, code: ErrorCode) -> None:
        kind = {
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: "out_of_order",
            ErrorCode.UNKNOWN_PRODUCER_ID: "unknown_producer_id",
            ErrorCode.INVALID_PRODUCER_EPOCH: "fenced",
            ErrorCode.DUPLICATE_SEQUENCE_NUMBER: "duplicate",
        }.get(code)
        if kind:
            self.metrics.producer_event(kind)

    def _await_durable(
        self,
        timeout_ms: int,
        results: list[m.ProduceTopicResponse],
        durable: list[tuple[Partition, int]],
    ) -> DurableReply:
        timeout_s = min(max(timeout_ms, 0), self.config.request_timeout_ms) / 1000
        return DurableReply(
            self.committer, m.ProduceResponse(topics=results), durable, timeout_ms, timeout_s
        )
