"""API semantics: each request in, its response map out (docs/protocol.md section 4).

Handlers run on the event loop and do their log work synchronously, so the
requests of one connection take effect strictly in arrival order. `handle`
returns an `Outcome` the connection layer acts on: an `Answer` to send now, a
`DurableReply` (a Produce with acks=-1, appended at once) to send when the group
commit has made its batches durable, a `SplicedReply` (a Fetch whose records go
out with sendfile), or `NoAnswer` (acks=0). Replies go out in request order, so
later requests keep flowing while a DurableReply waits.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import anyio
import msgspec

from broker import __version__ as BROKER_VERSION
from broker.admin import Admin
from broker.clock import now_ms
from broker.config import BrokerConfig
from broker.crash_points import crash_point
from broker.group_commit import FlushFailed, GroupCommitter
from broker.groups import GroupCoordinator, OffsetStore
from broker.metrics import BrokerMetrics
from broker.partition import AppendResult, Partition
from broker.producer_ids import ProducerIdManager
from broker.security import (
    Access,
    AclBinding,
    AclFilter,
    AclStore,
    Audit,
    Denial,
    Judgement,
    ResourceType,
    Session,
    validate_filter,
)
from broker.storage import CorruptBatchError, FileSpan, OffsetOutOfRange, RecordLog
from broker.topics import TopicError, TopicRegistry
from broker.transactions import TransactionCoordinator
from protocol import messages as m
from protocol.batch import (
    CONTROL_FLAG,
    NO_PRODUCER_ID,
    TRANSACTIONAL_FLAG,
    BatchError,
    BatchHeader,
    scan_batches,
    validate,
)
from protocol.errors import ErrorCode, ProtocolError
from protocol.framing import splice_frame

log = logging.getLogger(f"minibroker.{__name__}")

BROKER_ID = 0


class Answer(NamedTuple):
    """A response to send now; the connection encodes it under the request's cid.
    A tuple: built per request, where a frozen dataclass costs 0.4 µs."""

    response: m.Response


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """The request gets no response at all (a Produce with acks=0)."""


class DurableReply:
    """An acks=-1 Produce reply that may only be sent once its batches are on disk."""

    __slots__ = ("_committer", "_durable", "_record_log", "_timeout_ms", "_timeout_s", "response")

    def __init__(
        self,
        committer: GroupCommitter,
        response: m.ProduceResponse,
        durable: list[tuple[Partition, int]],
        timeout_ms: int,
        timeout_s: float,
    ) -> None:
        self._committer = committer
        self.response = response
        self._durable = durable
        self._timeout_ms = timeout_ms
        self._timeout_s = timeout_s
        self._record_log: tuple[RecordLog, int] | None = None

    def also_durable(self, record_log: RecordLog, end: int) -> None:
        """Answer only once `record_log` is durable up to `end` too (a transaction's
        partition add, written beside the batches and synced in the same round)."""
        self._record_log = (record_log, end)

    def ready(self) -> bool:
        """True when completing would not wait: lets the writer batch sends."""
        if self._record_log is not None and not self._record_log[0].is_durable(self._record_log[1]):
            return False
        return all(p.log.flushed_offset > last for p, last in self._durable)

    async def complete(self) -> m.ProduceResponse:
        if self.ready():
            # Most replies of a round find it done: no timeout scope to set up.
            return self.response
        if self._record_log is not None:
            record_log, end = self._record_log
            try:
                # Started now, it runs while the partitions' round (already requested) does.
                await record_log.durable(end)
            except OSError as exc:
                _storage_failed(self.response, f"transaction log: {exc}")
                return self.response
        failed: set[int] = set()
        with anyio.move_on_after(self._timeout_s) as scope:
            for partition, last_offset in self._durable:
                try:
                    await self._committer.wait_durable(partition, last_offset)
                except FlushFailed:
                    failed.add(id(partition))
        if failed or scope.cancelled_caught:
            late = {
                id(p): "fsync failed"
                if id(p) in failed
                else f"not durable within timeout_ms={self._timeout_ms}"
                for p, last in self._durable
                if id(p) in failed or p.log.flushed_offset <= last
            }
            by_key = {(p.topic, p.index): id(p) for p, _ in self._durable}
            for t in self.response.topics:
                for r in t.partitions:
                    reason = late.get(by_key.get((t.topic, r.partition), 0))
                    if r.error or reason is None:
                        continue
                    r.error = (
                        ErrorCode.KAFKA_STORAGE_ERROR
                        if reason == "fsync failed"
                        else ErrorCode.REQUEST_TIMED_OUT
                    )
                    r.message = reason
        return self.response


def _storage_failed(response: m.ProduceResponse, message: str) -> None:
    """Answer KAFKA_STORAGE_ERROR for every batch of `response` appended: what they rest
    on (a transaction's partition add) could not be made durable."""
    for t in response.topics:
        for r in t.partitions:
            if not r.error:
                r.error = ErrorCode.KAFKA_STORAGE_ERROR
                r.message = message


class SplicedReply:
    """A Fetch reply whose record bytes go from the log files with os.sendfile.

    It owns its spans' file descriptors until `close`, which the connection
    calls once the reply is sent or dropped."""

    __slots__ = ("holes", "response", "spans")

    def __init__(self, response: m.FetchResponse, spans: list[FileSpan], holes: list[bytes]):
        self.response = response
        self.spans = spans
        self.holes = holes

    def pieces(self, cid: int) -> list[bytes | int]:
        """The frame as bytes to send and, between them, indexes into `spans`."""
        holes = [(hole, span.length) for hole, span in zip(self.holes, self.spans, strict=True)]
        return splice_frame(m.encode_response(self.response, cid), holes)

    def close(self) -> None:
        for span in self.spans:
            os.close(span.fd)
        self.spans = []


Outcome = Answer | DurableReply | SplicedReply | NoAnswer
"""What a request comes to: answer now, answer once durable, answer from the
log files, or no answer."""

Checked = tuple[Partition, BatchHeader] | m.ProducePartitionResponse
"""A produced batch after the broker-wide checks: where to append it, or its refusal."""

FetchLook = tuple[
    m.FetchResponse, int, bool, list[tuple[FileSpan, bytes]], list[tuple[str, int, int]]
]
"""(response, bytes ready, errored, file spans with their placeholders, and the
(topic, bytes, records) flows to count once this look is the reply sent)."""


Handler = Callable[[Any, Session], Any]
"""An API's function: the request and its connection's session in, a response (or an
awaitable of one, or an outcome) out."""


def _plain(handler: Callable[[Any], Any]) -> Handler:
    """A handler that does not need to know who asks."""
    return lambda request, _session: handler(request)


class Handlers:
    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicRegistry,
        producer_ids: ProducerIdManager,
        committer: GroupCommitter,
        coordinator: TransactionCoordinator,
        offsets: OffsetStore,
        metrics: BrokerMetrics,
        advertised: tuple[str, int],
        groups: GroupCoordinator,
        *,
        acls: AclStore | None = None,
        extra_apis: Mapping[str, Handler] | None = None,
    ) -> None:
        """`acls` is the ACL store when `authorizer` is on (None: everything is allowed);
        `extra_apis` are the functions of APIs served elsewhere (SASL, SCRAM credentials),
        authorized here like every other."""
        self.config = config
        self.topics = topics
        self.producer_ids = producer_ids
        self.committer = committer
        self.coordinator = coordinator
        self.groups = groups
        coordinator.on_markers = self._wake_fetchers
        self.offsets = offsets
        self.metrics = metrics
        self.advertised = advertised
        self._appended = anyio.Event()
        self._zero_copy = config.fetch_zero_copy and config.backend == "trio"
        self._fetch_waiters = 0
        self._stopping = False
        admin = Admin(topics, offsets, coordinator, committer, BROKER_ID, self._wake_fetchers)
        self.acls = acls
        # None when `authorizer` is off: then a request costs one `is None` test more.
        self._access = None if acls is None else Access(acls.authorizer, self._creates)
        self._audit = Audit()
        self._table: dict[str, Handler] = {
            "ApiVersions": _plain(self.api_versions),
            "Metadata": self.metadata,
            "CreateTopics": _plain(self.create_topics),
            "InitProducerId": self.init_producer_id,
            "Produce": self.produce,
            "Fetch": _plain(self.fetch),
            "ListOffsets": _plain(self.list_offsets),
            "DeleteTopics": _plain(admin.delete_topics),
            "DescribeConfigs": _plain(admin.describe_configs),
            "IncrementalAlterConfigs": _plain(admin.incremental_alter_configs),
            "EndTxn": lambda req, session: coordinator.end_txn(req, session.principal),
            "PrepareTxn": lambda req, session: coordinator.prepare_txn(req, session.principal),
            "CommitTxns": _plain(coordinator.commit_txns),
            "ListTransactions": _plain(coordinator.list_transactions),
            "DescribeTxnApps": _plain(coordinator.describe_apps),
            "ConsumerGroupHeartbeat": _plain(groups.heartbeat),
            "ListGroups": _plain(groups.list_groups),
            "DescribeGroups": _plain(groups.describe_groups),
            "OffsetCommit": _plain(offsets.offset_commit),
            "OffsetFetch": _plain(offsets.offset_fetch),
            "TxnOffsetCommit": self.txn_offset_commit,
            "CreateAcls": _plain(self.create_acls),
            "DescribeAcls": _plain(self.describe_acls),
            "DeleteAcls": _plain(self.delete_acls),
            **(extra_apis or {}),
        }
        self.apis = frozenset(self._table)

    def reconfigure(self, config: BrokerConfig) -> None:
        """SIGHUP's new settings: the reloadable ones apply from the next request."""
        self.config = config
        self.coordinator.config = config
        self.offsets.config = config
        if self.acls is not None:
            self.acls.authorizer.set_super_users(config.super_users)

    async def handle(self, request: Any, session: Session) -> Outcome:
        """Run one parsed request from `session`'s client and say how the connection
        answers it: authorized first, when the authorizer is on."""
        handler = self._table.get(request.api)
        if handler is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"{request.api} is not served yet")
        judged: Judgement | None = None
        if self._access is not None:
            judged = self._judge(request, session)
            if judged.refused:
                return _outcome(judged.refusal)
            request = judged.request
        result = handler(request, session)
        # What isinstance(result, Awaitable) checks, at a fifth of the cost.
        if hasattr(result, "__await__"):
            result = await result
        if judged is not None:
            _finish(judged, result)
        return _outcome(result)

    # ----------------------------------------------------------------- authorization

    def _judge(self, request: m.Request, session: Session) -> Judgement:
        """What the request may do (docs/protocol.md section 7); its denials audited."""
        assert self._access is not None
        judged = self._access.judge(request, session.principal, session.peer_host)
        if judged.denials:
            self._report(request.api, session, judged.denials)
        return judged

    def _report(self, api: str, session: Session, denials: list[Denial]) -> None:
        self._audit.denied(session.principal, session.peer_host, api, denials)
        for denial in denials:
            self.metrics.authorization_denied(api, denial.resource_type)

    def _creates(self, resource_type: str, name: str) -> bool:
        """Whether a request allowed to create resources (Metadata's auto-creation) would
        create this one: a topic that does not exist, while auto-creation is on."""
        return (
            resource_type == ResourceType.TOPIC
            and self.config.auto_create_topics
            and name not in self.topics.topics
        )

    # ----------------------------------------------------------------- simple APIs

    def api_versions(self, _: m.ApiVersionsRequest) -> m.ApiVersionsResponse:
        return m.ApiVersionsResponse(
            apis={api: [m.VERSION, m.VERSION] for api in sorted(self.apis)},
            broker_version=BROKER_VERSION,
            max_frame_bytes=self.config.max_frame_bytes,
        )

    async def metadata(self, req: m.MetadataRequest, session: Session) -> m.MetadataResponse:
        registry = self.topics
        names = sorted(registry.topics) if req.topics is None else req.topics
        out: list[m.TopicMetadata] = []
        for name in names:
            topic = registry.topics.get(name)
            if topic is None and req.allow_auto_create and self.config.auto_create_topics:
                try:
                    topic = registry.create(name, self.config.default_partitions, None, now_ms())
                except TopicError as exc:
                    out.append(m.TopicMetadata(name, exc.code))
                    continue
                finally:
                    # A creation is milliseconds of file work: thousands of them in
                    # one request must take turns with the other connections.
                    await anyio.lowlevel.checkpoint()
            if topic is None:
                out.append(m.TopicMetadata(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            out.append(
                m.TopicMetadata(
                    name,
                    ErrorCode.NONE,
                    [
                        m.PartitionMetadata(p.index, ErrorCode.NONE, BROKER_ID)
                        for p in topic.partitions
                    ],
                )
            )
        host, port = session.advertised or self.advertised
        return m.MetadataResponse(brokers=[m.BrokerMetadata(BROKER_ID, host, port)], topics=out)

    async def create_topics(self, req: m.CreateTopicsRequest) -> m.CreateTopicsResponse:
        results = []
        for t in req.topics:
            try:
                self.topics.create(t.name, t.partitions, t.config, now_ms())
                results.append(m.CreateTopicResult(t.name))
            except TopicError as exc:
                results.append(m.CreateTopicResult(t.name, exc.code, exc.message))
            await anyio.lowlevel.checkpoint()  # as in metadata: creations take turns
        return m.CreateTopicsResponse(topics=results)

    async def init_producer_id(
        self, req: m.InitProducerIdRequest, session: Session
    ) -> m.InitProducerIdResponse:
        ids = self.producer_ids
        principal = session.principal
        if req.transactional_id is not None:
            pid, epoch = await self.coordinator.init_producer(
                req.transactional_id, req.transaction_timeout_ms, principal
            )
            return m.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)
        issued = req.producer_id >= 0 and ids.is_issued(req.producer_id)
        if issued and self._owner_of(req.producer_id) != principal:
            # Bumping another principal's epoch would fence its producer.
            return m.InitProducerIdResponse(
                error=ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                message=f"producer id {req.producer_id} belongs to another principal",
            )
        if req.producer_id >= 0:
            known = [
                e
                for p in self.topics.all_partitions()
                if (e := p.producers.epoch_of(req.producer_id)) is not None
            ]
            grant = ids.bump(req.producer_id, req.producer_epoch, max(known, default=None))
        else:
            grant = ids.new_producer(principal)
        if grant.error == ErrorCode.INVALID_PRODUCER_EPOCH:
            self.metrics.producer_event("fenced")
        return m.InitProducerIdResponse(
            producer_id=grant.producer_id, producer_epoch=grant.producer_epoch, error=grant.error
        )

    def list_offsets(self, req: m.ListOffsetsRequest) -> m.ListOffsetsResponse:
        topics = []
        for t in req.topics:
            out = []
            for lp in t.partitions:
                index, timestamp = lp.partition, lp.timestamp
                p = self.topics.partition(t.topic, index)
                if p is None:
                    out.append(
                        m.ListOffsetsPartitionResponse(index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    )
                elif timestamp == m.TIMESTAMP_LATEST:
                    latest = (
                        p.last_stable_offset
                        if req.isolation_level == m.ISOLATION_READ_COMMITTED
                        else p.log.log_end_offset
                    )
                    out.append(m.ListOffsetsPartitionResponse(index, offset=latest))
                elif timestamp == m.TIMESTAMP_EARLIEST:
                    out.append(m.ListOffsetsPartitionResponse(index, offset=p.log.log_start_offset))
                else:
                    found = p.log.offset_for_timestamp(timestamp)
                    out.append(
                        m.ListOffsetsPartitionResponse(
                            index, offset=-1 if found is None else found, timestamp=timestamp
                        )
                    )
            topics.append(m.ListOffsetsTopicResponse(t.topic, out))
        return m.ListOffsetsResponse(topics=topics)

    def txn_offset_commit(
        self, req: m.TxnOffsetCommitRequest, session: Session
    ) -> Awaitable[m.TxnOffsetCommitResponse]:
        return self.offsets.txn_offset_commit(req, self.coordinator, session.principal)

    def _owner_of(self, producer_id: int) -> str:
        """The principal an issued producer id belongs to: the one that last initialized
        its transactional id, else the one it was handed out to (docs/protocol.md section 7,
        "Producer ids belong to principals")."""
        owner = self.coordinator.principal_of(producer_id)
        return self.producer_ids.owner(producer_id) if owner is None else owner

    # ----------------------------------------------------------------- ACLs

    async def create_acls(self, req: m.CreateAclsRequest) -> m.CreateAclsResponse:
        if self.acls is None:
            return m.CreateAclsResponse(
                error=ErrorCode.SECURITY_DISABLED,
                message=_SECURITY_DISABLED,
                results=[
                    m.AclCreationResult(ErrorCode.SECURITY_DISABLED, _SECURITY_DISABLED)
                    for _ in req.creations
                ],
            )
        results = await self.acls.create([_binding(b) for b in req.creations])
        return m.CreateAclsResponse(
            results=[m.AclCreationResult(r.error, r.message) for r in results]
        )

    def describe_acls(self, req: m.DescribeAclsRequest) -> m.DescribeAclsResponse:
        if self.acls is None:
            return m.DescribeAclsResponse(
                error=ErrorCode.SECURITY_DISABLED, message=_SECURITY_DISABLED
            )
        acl_filter = _filter(req.filter)
        invalid = validate_filter(acl_filter)
        if invalid is not None:
            return m.DescribeAclsResponse(error=ErrorCode.INVALID_REQUEST, message=invalid)
        return m.DescribeAclsResponse(
            bindings=[m.AclBinding(*b) for b in self.acls.authorizer.describe(acl_filter)]
        )

    async def delete_acls(self, req: m.DeleteAclsRequest) -> m.DeleteAclsResponse:
        if self.acls is None:
            return m.DeleteAclsResponse(
                error=ErrorCode.SECURITY_DISABLED,
                message=_SECURITY_DISABLED,
                results=[m.AclDeletionResult(ErrorCode.SECURITY_DISABLED) for _ in req.filters],
            )
        results = await self.acls.delete([_filter(f) for f in req.filters])
        return m.DeleteAclsResponse(
            results=[
                m.AclDeletionResult(r.error, [m.AclBinding(*b) for b in r.deleted]) for r in results
            ]
        )

    # ----------------------------------------------------------------- produce

    def produce(
        self, req: m.ProduceRequest, session: Session
    ) -> (
        m.ProduceResponse | DurableReply | Awaitable[m.ProduceResponse | DurableReply | None] | None
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

    @staticmethod
    def appends_together(request: Any) -> bool:
        """Whether `request` may join `produce_many`: a Produce that needs no await."""
        return (
            isinstance(request, m.ProduceRequest)
            and request.transactional_id is None
            and request.acks in (-1, 0, 1)
        )

    def produce_many(self, reqs: list[m.ProduceRequest], session: Session) -> list[Outcome]:
        """Produce requests read together from `session`'s client (each
        `appends_together`), answered as one after another would be, with each
        partition's batches appended in one write."""
        passed: set[tuple[int, int, str | None]] = set()
        principal = session.principal
        if self._access is None:
            replies = self._append_checked(
                [(req, self._check_request(req, passed, principal)) for req in reqs]
            )
            return [_outcome(reply) for reply in replies]
        # A run's requests mostly name the same topics. Once one is allowed whole, the
        # others naming the same topics are too (a decision depends on the principal, the
        # host and the names, and the ACLs cannot change before the run is done), so they
        # are judged once per run: None stands for "allowed as it came".
        whole: set[tuple[str, ...]] = set()
        judged: list[Judgement | None] = []
        for req in reqs:
            names = tuple(t.topic for t in req.topics)
            if names in whole:
                judged.append(None)
                continue
            judgement = self._judge(req, session)
            if not judgement.refused and judgement.request is req and not judgement.finishes:
                whole.add(names)
            judged.append(judgement)
        handled = [
            req if j is None else cast(m.ProduceRequest, j.request)
            for req, j in zip(reqs, judged, strict=True)
            if j is None or not j.refused
        ]
        replies = self._append_checked(
            [(req, self._check_request(req, passed, principal)) for req in handled]
        )
        results = iter(replies)
        outcomes = []
        for j in judged:
            if j is not None and j.refused:
                outcomes.append(_outcome(j.refusal))
                continue
            reply = next(results)
            if j is not None:
                _finish(j, reply)
            outcomes.append(_outcome(reply))
        return outcomes

    def _check_request(
        self, req: m.ProduceRequest, passed: set[tuple[int, int, str | None]], principal: str
    ) -> list[list[Checked]]:
        """Each batch's partition and header, or its refusal. `passed` holds the
        producers (id, epoch, transactional id) found in good standing, for `principal`,
        since the caller last awaited: until then nothing can change their standing."""
        tid = req.transactional_id
        return [
            [
                self._check_batch(t.topic, p.partition, p.records, tid, passed, principal)
                for p in t.partitions
            ]
            for t in req.topics
        ]

    async def _produce_transactional(
        self, req: m.ProduceRequest, transactional_id: str, checked: list[list[Checked]]
    ) -> m.ProduceResponse | DurableReply | None:
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
            if not txn_log_end:
                return reply
            if isinstance(reply, DurableReply):
                # The partition add was written, not synced: it shares this reply's round.
                reply.also_durable(self.coordinator.log, txn_log_end)
                return reply
            # acks=0 or 1: the batch is not waited for, but the add is, before any answer.
            try:
                await self.coordinator.durable(txn_log_end)
            except OSError as exc:
                if reply is not None:
                    _storage_failed(reply, f"transaction log: {exc}")
            return reply

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
            int, tuple[Partition, list[tuple[list[Checked], int]], list[bytes], list[BatchHeader]]
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
            for (row, i), records, header, result in zip(
                places, batches, headers, results, strict=True
            ):
                answer, last_offset = self._answer_append(partition, records, header, result)
                row[i] = answer
                if last_offset >= 0:
                    durable.setdefault(id(row), []).append((partition, last_offset))
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
        records: bytes,
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
        self,
        partition: Partition,
        records: bytes,
        header: BatchHeader,
        result: AppendResult,
    ) -> tuple[m.ProducePartitionResponse, int]:
        """A batch's answer and last offset (-1 when refused), counted in the metrics."""
        index = partition.index
        plog = partition.log
        if result.error:
            self._count_rejection(result.error)
            return (
                m.ProducePartitionResponse(
                    index,
                    result.error,
                    log_start_offset=plog.log_start_offset,
                    message=result.message,
                ),
                -1,
            )
        if result.duplicate:
            self.metrics.producer_event("duplicate")
        else:
            self.metrics.record_produce(partition.topic, len(records), header.record_count)
            self._wake_fetchers()
        return (
            m.ProducePartitionResponse(
                index,
                ErrorCode.NONE,
                result.base_offset,
                -1,
                plog.log_start_offset,
                result.duplicate,
            ),
            result.last_offset,
        )

    def _wake_fetchers(self) -> None:
        if self._fetch_waiters:
            self._appended.set()
            self._appended = anyio.Event()

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
        if self._owner_of(pid) != principal:
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

    # ----------------------------------------------------------------- fetch

    async def fetch(self, req: m.FetchRequest) -> m.FetchResponse | SplicedReply:
        wait_s = min(max(req.max_wait_ms, 0), self.config.request_timeout_ms) / 1000
        deadline = anyio.current_time() + wait_s
        while True:
            response, ready_bytes, errored, spans, flows = self._fetch_once(req)
            remaining = deadline - anyio.current_time()
            if ready_bytes >= req.min_bytes or errored or remaining <= 0 or self._stopping:
                for topic, size, count in flows:
                    self.metrics.record_fetch(topic, size, count)
                if not spans:
                    return response
                return SplicedReply(response, [s for s, _ in spans], [h for _, h in spans])
            for span, _ in spans:
                os.close(span.fd)
            self._fetch_waiters += 1
            try:
                with anyio.move_on_after(remaining):
                    await self._appended.wait()
            finally:
                self._fetch_waiters -= 1

    def _fetch_once(self, req: m.FetchRequest) -> FetchLook:
        """One look at the logs; on any failure the file spans taken so far are closed."""
        spans: list[tuple[FileSpan, bytes]] = []
        try:
            return self._look(req, spans)
        except BaseException:
            for span, _ in spans:
                os.close(span.fd)
            raise

    def _look(self, req: m.FetchRequest, spans: list[tuple[FileSpan, bytes]]) -> FetchLook:
        budget = min(req.max_bytes, self.config.fetch_max_bytes)
        used = 0
        errored = False
        flows: list[tuple[str, int, int]] = []
        topics = []
        for t in req.topics:
            topic = t.topic
            out = []
            for fp in t.partitions:
                p = self.topics.partition(topic, fp.partition)
                if p is None:
                    errored = True
                    out.append(
                        m.FetchPartitionResponse(fp.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    )
                    continue
                plog = p.log
                high_watermark = plog.log_end_offset
                stable = p.last_stable_offset
                committed = req.isolation_level == m.ISOLATION_READ_COMMITTED
                upper = stable if committed else None
                records = b""
                size = count = 0
                end_offset = fp.fetch_offset
                error = ErrorCode.NONE
                # Kafka's rule: the first non-empty partition may exceed the budget by one
                # batch so a consumer always progresses; the rest stay within it.
                room = (
                    min(fp.partition_max_bytes, budget - used) if used else fp.partition_max_bytes
                )
                if room > 0 or not used:
                    try:
                        if self._zero_copy:
                            span = plog.span(fp.fetch_offset, max(room, 1), upper)
                            if span is not None:
                                # A placeholder stands in the map for the file bytes.
                                records = os.urandom(12) + len(spans).to_bytes(4, "big")
                                spans.append((span, records))
                                size, count = span.length, span.record_count
                                end_offset = span.next_offset
                        else:
                            records = plog.read(fp.fetch_offset, max(room, 1), upper)
                            size = len(records)
                            headers = [h for _, h in scan_batches(records, check_crc=False)]
                            count = sum(h.record_count for h in headers)
                            if headers:
                                end_offset = headers[-1].next_offset
                    except OffsetOutOfRange:
                        error = ErrorCode.OFFSET_OUT_OF_RANGE
                        errored = True
                    except CorruptBatchError as exc:
                        # Damage at rest: said, logged, never sent on.
                        log.error(
                            "event=corrupt_batch topic=%s partition=%d reason=%r",
                            topic,
                            p.index,
                            str(exc),
                        )
                        error = ErrorCode.KAFKA_STORAGE_ERROR
                        errored = True
                used += size
                if size:
                    flows.append((topic, size, count))
                out.append(
                    m.FetchPartitionResponse(
                        fp.partition,
                        error,
                        high_watermark,
                        stable,
                        plog.log_start_offset,
                        [
                            m.AbortedTransaction(pid, first)
                            for pid, first in p.aborted.overlapping(fp.fetch_offset, end_offset)
                        ]
                        if committed
                        else None,
                        records,
                    )
                )
            topics.append(m.FetchTopicResponse(topic, out))
        return m.FetchResponse(topics=topics), used, errored, spans, flows

    def stop_waiting(self) -> None:
        """Shutdown: answer every long-polling Fetch now with what it has."""
        self._stopping = True
        self._appended.set()

    # ----------------------------------------------------------------- housekeeping

    def housekeeping(self) -> None:
        """Retention and producer expiry, run every retention_check_interval_ms."""
        stamp = now_ms()
        for p in self.topics.all_partitions():
            deleted = p.apply_retention(stamp)
            if deleted:
                log.info(
                    "event=retention topic=%s partition=%d segments_deleted=%d log_start_offset=%d",
                    p.topic,
                    p.index,
                    deleted,
                    p.log.log_start_offset,
                )
            p.producers.expire(stamp)


_SECURITY_DISABLED = "the authorizer is off (setting authorizer = false)"


def _binding(wire: m.AclBinding) -> AclBinding:
    return AclBinding(*msgspec.structs.astuple(wire))


def _filter(wire: m.AclBindingFilter) -> AclFilter:
    return AclFilter(*msgspec.structs.astuple(wire))


def _finish(judged: Judgement, result: Any) -> None:
    """Complete a handled request's response with what its judgement left out."""
    response = result if isinstance(result, m.Response) else getattr(result, "response", None)
    if response is not None:
        judged.finish(response)


def _outcome(result: Any) -> Outcome:
    """A handler's result as the connection answers it."""
    if result is None:
        return NoAnswer()
    if isinstance(result, m.Response):
        return Answer(result)
    assert isinstance(result, DurableReply | SplicedReply | NoAnswer), type(result)
    return result
