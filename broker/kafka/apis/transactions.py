"""A transactional producer's APIs: InitProducerId (v0-4, with or without a transactional
id), AddPartitionsToTxn (v0-3), AddOffsetsToTxn (v0-3), TxnOffsetCommit (v0-3) and
EndTxn (v0-3), the versions of Kafka 2.8 that kafka-python, aiokafka and librdkafka use;
and the admin clients' ListTransactions (v0-1) and DescribeTransactions (v0), Kafka 3.0's
(KIP-664), over the coordinator's own ListTransactions, and DescribeProducers (v0), from
each partition's producer state.

They run on the broker's one transaction coordinator (docs/transactions.md, "Kafka's
clients"). A Kafka client's transactions are Kafka's before KIP-890: it keeps its
epoch across the transactions it ends (EndTxn v0-3 answers no new one) and adds each
partition, and each group whose offsets it commits, before it writes there. So its
InitProducerId marks the transactional id classic, and AddPartitionsToTxn and
AddOffsetsToTxn, which the native protocol lacks, are Kafka-only requests the
coordinator serves for classic ids alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec
from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker.clock import now_ms
from broker.kafka.api import Exchange, KafkaApi, Reply, Translated, Values, ms
from broker.kafka.apis.groups import commit_topics, committed_topics
from broker.kafka.kafka_only import KafkaOnlyRequest
from protocol import messages as m
from protocol.authorization import Entries, EntryNeed, Omission, Path, RequestNeed, Requirements
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.errors import ErrorCode


def _id_refusal(transactional_id: str) -> str | None:
    """Why a transactional id cannot be one (the native contract's bounds), or None."""
    if not 1 <= len(transactional_id) <= m.IDENTIFIER_CHARS_MAX:
        return f"a transactional id has 1 to {m.IDENTIFIER_CHARS_MAX} characters"
    return None


class ClassicInitProducerIdRequest(KafkaOnlyRequest, tag="KafkaInitProducerId"):
    """A Kafka client's InitProducerId with a transactional id: the coordinator's
    InitProducerId, which marks the id classic. `producer_id`/`producer_epoch` name the
    producer it had (v3+, KIP-360), -1 for a new instance."""

    response = m.InitProducerIdResponse
    requirements = Requirements(
        (RequestNeed(Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactional_id")),)
    )
    transactional_id: str
    transaction_timeout_ms: int
    producer_id: int = -1
    producer_epoch: int = -1


def translate_init_producer_id(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    pid, epoch = getattr(req, "producer_id", -1), getattr(req, "producer_epoch", -1)
    tid = req.transactional_id
    if tid is None:
        return m.InitProducerIdRequest(producer_id=pid, producer_epoch=epoch)
    why = _id_refusal(tid)
    if why is not None:
        return Reply(
            {
                "error_code": ErrorCode.INVALID_REQUEST,
                "producer_id": -1,
                "producer_epoch": -1,
            }
        )
    return ClassicInitProducerIdRequest(
        transactional_id=tid,
        transaction_timeout_ms=ms(req.transaction_timeout),
        producer_id=pid,
        producer_epoch=epoch,
    )


def answer_init_producer_id(r: m.InitProducerIdResponse, _version: int, _asked: None) -> Values:
    return {
        "error_code": r.error,
        "producer_id": r.producer_id,
        "producer_epoch": r.producer_epoch,
    }


class TxnPartitionResult(msgspec.Struct):
    partition: int
    error: int = ErrorCode.NONE
    message: str | None = None


class TxnTopicResult(msgspec.Struct):
    topic: str
    partitions: list[TxnPartitionResult]


class AddPartitionsToTxnResponse(m.Response):
    topics: list[TxnTopicResult] = msgspec.field(default_factory=list)


class TxnTopic(msgspec.Struct):
    topic: str
    partitions: list[int]


def _topic_refused(t: TxnTopic, code: ErrorCode, why: str) -> TxnTopicResult:
    return TxnTopicResult(t.topic, [TxnPartitionResult(p, code, why) for p in t.partitions])


class AddPartitionsToTxnRequest(KafkaOnlyRequest, tag="KafkaAddPartitionsToTxn"):
    """A classic producer's partitions join its transaction before it writes there."""

    response = AddPartitionsToTxnResponse
    requirements = Requirements(
        (
            RequestNeed(Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactional_id")),
            EntryNeed(Op.WRITE, Res.TOPIC, "topic"),
        ),
        Entries("topics", "topics", _topic_refused),
    )
    transactional_id: str
    producer_id: int
    producer_epoch: int
    topics: list[TxnTopic]

    def answered(
        self, refused: Mapping[tuple[str, int], tuple[int, str]]
    ) -> AddPartitionsToTxnResponse:
        """The answer, given the partitions the coordinator refused (code, why)."""
        return AddPartitionsToTxnResponse(
            topics=[
                TxnTopicResult(
                    t.topic,
                    [
                        TxnPartitionResult(p, *refused.get((t.topic, p), (ErrorCode.NONE, None)))
                        for p in t.partitions
                    ],
                )
                for t in self.topics
            ]
        )


def translate_add_partitions(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    tid = req.v3_and_below_transactional_id
    topics = [TxnTopic(t.name, list(t.partitions)) for t in req.v3_and_below_topics]
    why = _id_refusal(tid)
    if why is not None:
        refused = AddPartitionsToTxnResponse(
            topics=[_topic_refused(t, ErrorCode.INVALID_REQUEST, why) for t in topics]
        )
        return Reply(answer_add_partitions(refused, 0, None))
    return AddPartitionsToTxnRequest(
        transactional_id=tid,
        producer_id=req.v3_and_below_producer_id,
        producer_epoch=req.v3_and_below_producer_epoch,
        topics=topics,
    )


def answer_add_partitions(r: AddPartitionsToTxnResponse, _version: int, _asked: None) -> Values:
    """Each partition's code; when any is refused alone, the others were not attempted
    (OPERATION_NOT_ATTEMPTED, 55), as Kafka answers: none was added."""
    failed = any(p.error for t in r.topics for p in t.partitions)
    return {
        "results_by_topic_v3_and_below": [
            {
                "name": t.topic,
                "results_by_partition": [
                    {
                        "partition_index": p.partition,
                        "partition_error_code": p.error
                        or (KafkaErrorCode.operation_not_attempted if failed else 0),
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


class AddOffsetsToTxnResponse(m.Response):
    pass


class AddOffsetsToTxnRequest(KafkaOnlyRequest, tag="KafkaAddOffsetsToTxn"):
    """A classic producer's consumer group joins its transaction before TxnOffsetCommit."""

    response = AddOffsetsToTxnResponse
    requirements = Requirements(
        (
            RequestNeed(Op.WRITE, Res.TRANSACTIONAL_ID, Path("transactional_id")),
            RequestNeed(Op.READ, Res.GROUP, Path("group_id")),
        )
    )
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


def translate_add_offsets(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    if _id_refusal(req.transactional_id) is not None or not req.group_id:
        return Reply({"error_code": ErrorCode.INVALID_REQUEST})
    return AddOffsetsToTxnRequest(
        transactional_id=req.transactional_id,
        producer_id=req.producer_id,
        producer_epoch=req.producer_epoch,
        group_id=req.group_id,
    )


def answer_error_only(r: m.Response, _version: int, _asked: None) -> Values:
    """AddOffsetsToTxn's and EndTxn's (v0-3) answer: the code alone (a classic producer
    goes on with its own pid and epoch)."""
    return {"error_code": r.error}


NO_GENERATION = -1
"""The generation (and empty member id) of a consumer outside any group's membership:
what a producer sends with a group id alone, or a consumer that assigns itself."""


def translate_txn_offset_commit(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    """Offsets joining a classic transaction. KIP-447's generation and member id (v3)
    are judged as an OffsetCommit's are, by the group's membership (a classic group's
    generation); outside it (generation -1, no member id) there is nothing to check."""
    refusal: int | None = None
    if _id_refusal(req.transactional_id) is not None or not req.group_id:
        refusal = ErrorCode.INVALID_REQUEST
    if refusal is not None:
        return Reply(
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {"partition_index": p.partition_index, "error_code": refusal}
                            for p in t.partitions
                        ],
                    }
                    for t in req.topics
                ]
            }
        )
    return m.TxnOffsetCommitRequest(
        transactional_id=req.transactional_id,
        producer_id=req.producer_id,
        producer_epoch=req.producer_epoch,
        group_id=req.group_id,
        member_id=getattr(req, "member_id", ""),
        member_epoch=getattr(req, "generation_id", NO_GENERATION),
        topics=commit_topics(req.topics),
    )


def answer_txn_offset_commit(r: m.TxnOffsetCommitResponse, _version: int, _asked: None) -> Values:
    return {"topics": committed_topics(r.topics)}


def translate_end_txn(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    if _id_refusal(req.transactional_id) is not None:
        return Reply({"error_code": ErrorCode.INVALID_REQUEST})
    return m.EndTxnRequest(
        transactional_id=req.transactional_id,
        producer_id=req.producer_id,
        producer_epoch=req.producer_epoch,
        committed=req.committed,
    )


KAFKA_STATES = {
    "EMPTY": "Empty",
    # KIP-939: a prepared transaction is ongoing to Kafka's tools.
    "ONGOING": "Ongoing",
    "PREPARED": "Ongoing",
    "PREPARE_COMMIT": "PrepareCommit",
    "PREPARE_ABORT": "PrepareAbort",
    "COMPLETE_COMMIT": "CompleteCommit",
    "COMPLETE_ABORT": "CompleteAbort",
}
"""The coordinator's states as Kafka's ListTransactions and DescribeTransactions name them."""


class TxnFilters(NamedTuple):
    """What Kafka's ListTransactions filters by that the coordinator's does not."""

    producer_ids: frozenset[int]
    min_duration_ms: int
    """Only transactions running longer than this (v1); -1: any."""
    unknown_states: list[str]


def translate_list_transactions(req: Any, _version: int, _ex: Exchange) -> Translated[TxnFilters]:
    """Kafka's state names to the coordinator's (a state it has no such state for is
    answered in `unknown_state_filters`); the producer id and duration filters are
    applied to its answer."""
    wanted = set(req.state_filters)
    states = sorted(s for s, name in KAFKA_STATES.items() if name in wanted)
    unknown = sorted(wanted - set(KAFKA_STATES.values()))
    filters = TxnFilters(
        frozenset(req.producer_id_filters), getattr(req, "duration_filter", -1), unknown
    )
    request = m.ListTransactionsRequest(states=states if wanted else None)
    return Translated(request, filters)


def answer_list_transactions(
    r: m.ListTransactionsResponse, _version: int, asked: TxnFilters
) -> Values:
    now = now_ms()
    listed = [
        t
        for t in r.transactions
        if (not asked.producer_ids or t.producer_id in asked.producer_ids)
        and (
            asked.min_duration_ms < 0
            or (t.started_ms >= 0 and now - t.started_ms > asked.min_duration_ms)
        )
    ]
    return {
        "error_code": r.error,
        "unknown_state_filters": asked.unknown_states,
        "transaction_states": [
            {
                "transactional_id": t.transactional_id,
                "producer_id": t.producer_id,
                "transaction_state": KAFKA_STATES[t.state],
            }
            for t in listed
        ],
    }


class DescribedTxn(msgspec.Struct):
    """One transactional id's answer: its transaction, or why there is none."""

    transactional_id: str
    error: int = ErrorCode.NONE
    message: str | None = None
    listing: m.TransactionListing | None = None
    partitions: list[m.TxnTopicPartitions] = msgspec.field(default_factory=list)
    """The transaction's partitions: the listing's, without the topics the caller may
    not describe (the judge cuts them here, as Kafka does)."""


class DescribeTransactionsResponse(m.Response):
    transactions: list[DescribedTxn] = msgspec.field(default_factory=list)


def _txn_refused(transactional_id: str, code: ErrorCode, why: str) -> DescribedTxn:
    return DescribedTxn(transactional_id, code, why)


class DescribeTransactionsRequest(KafkaOnlyRequest, tag="KafkaDescribeTransactions"):
    """Kafka's DescribeTransactions (KIP-664): each id's transaction, as Kafka answers it:
    an id the caller may not DESCRIBE is TRANSACTIONAL_ID_AUTHORIZATION_FAILED, an
    unknown one TRANSACTIONAL_ID_NOT_FOUND, and the topics it may not DESCRIBE are left
    out of the partitions."""

    response = DescribeTransactionsResponse
    requirements = Requirements(
        (
            EntryNeed(Op.DESCRIBE, Res.TRANSACTIONAL_ID, ""),
            Omission(Op.DESCRIBE, Res.TOPIC, Path("partitions[].topic"), within=("transactions",)),
        ),
        Entries("transactional_ids", "transactions", _txn_refused),
    )
    transactional_ids: list[str]

    def answered(self, found: list[m.TransactionListing | None]) -> DescribeTransactionsResponse:
        """The answer, given each id's listing (None: no such id)."""
        out = []
        for tid, listing in zip(self.transactional_ids, found, strict=True):
            if listing is None:
                why = f"transactional id {tid!r} is unknown"
                out.append(DescribedTxn(tid, KafkaErrorCode.transactional_id_not_found, why))
            else:
                out.append(DescribedTxn(tid, listing=listing, partitions=listing.partitions))
        return DescribeTransactionsResponse(transactions=out)


def translate_describe_transactions(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return DescribeTransactionsRequest(transactional_ids=list(req.transactional_ids))


def answer_describe_transactions(
    r: DescribeTransactionsResponse, _version: int, _asked: None
) -> Values:
    states = []
    for d in r.transactions:
        t = d.listing
        if t is None:
            states.append(
                {
                    "error_code": d.error,
                    "transactional_id": d.transactional_id,
                    "transaction_state": "",
                    "producer_id": -1,
                    "producer_epoch": -1,
                }
            )
            continue
        states.append(
            {
                "error_code": d.error,
                "transactional_id": d.transactional_id,
                "transaction_state": KAFKA_STATES[t.state],
                "transaction_timeout": t.timeout_ms,
                "transaction_start_time": t.started_ms,
                "producer_id": t.producer_id,
                "producer_epoch": t.producer_epoch,
                "topics": [{"topic": p.topic, "partitions": p.partitions} for p in d.partitions],
            }
        )
    return {"transaction_states": states}


class ActiveProducer(msgspec.Struct):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_seen_ms: int
    txn_first_offset: int


class ProducersPartition(msgspec.Struct):
    partition: int
    error: int = ErrorCode.NONE
    message: str | None = None
    producers: list[ActiveProducer] = msgspec.field(default_factory=list)


class ProducersTopic(msgspec.Struct):
    topic: str
    partitions: list[ProducersPartition]


class DescribeProducersResponse(m.Response):
    topics: list[ProducersTopic] = msgspec.field(default_factory=list)


def _producers_refused(t: TxnTopic, code: ErrorCode, why: str) -> ProducersTopic:
    return ProducersTopic(t.topic, [ProducersPartition(p, code, why) for p in t.partitions])


class DescribeProducersRequest(KafkaOnlyRequest, tag="KafkaDescribeProducers"):
    """The producers each partition holds state of (KIP-664's hanging transactions
    tooling): READ on each topic, as Kafka asks."""

    response = DescribeProducersResponse
    requirements = Requirements(
        (EntryNeed(Op.READ, Res.TOPIC, "topic"),),
        Entries("topics", "topics", _producers_refused),
    )
    topics: list[TxnTopic]

    def answered(
        self, states: Mapping[tuple[str, int], list[tuple[int, int, int, int, int]] | None]
    ) -> DescribeProducersResponse:
        """The answer, given each partition's producers (None: no such partition)."""
        topics = []
        for t in self.topics:
            partitions = []
            for p in t.partitions:
                held = states.get((t.topic, p))
                if held is None:
                    why = f"{t.topic}-{p} does not exist"
                    partitions.append(
                        ProducersPartition(p, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, why)
                    )
                else:
                    partitions.append(
                        ProducersPartition(p, producers=[ActiveProducer(*s) for s in held])
                    )
            topics.append(ProducersTopic(t.topic, partitions))
        return DescribeProducersResponse(topics=topics)


def translate_describe_producers(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return DescribeProducersRequest(
        topics=[TxnTopic(t.name, list(t.partition_indexes)) for t in req.topics]
    )


def answer_describe_producers(r: DescribeProducersResponse, _version: int, _asked: None) -> Values:
    """Each producer's last timestamp is when the broker last took a batch of it (the
    producer state keeps no batch timestamp); the coordinator epoch is -1 (one broker,
    no coordinator moves)."""
    return {
        "topics": [
            {
                "name": t.topic,
                "partitions": [
                    {
                        "partition_index": p.partition,
                        "error_code": p.error,
                        "error_message": p.message,
                        "active_producers": [
                            {
                                "producer_id": s.producer_id,
                                "producer_epoch": s.producer_epoch,
                                "last_sequence": s.last_sequence,
                                "last_timestamp": s.last_seen_ms,
                                "coordinator_epoch": -1,
                                "current_txn_start_offset": s.txn_first_offset,
                            }
                            for s in p.producers
                        ],
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


INIT_PRODUCER_ID = KafkaApi(
    22, "InitProducerId", 0, 4, translate_init_producer_id, answer_init_producer_id
)
ADD_PARTITIONS_TO_TXN = KafkaApi(
    24, "AddPartitionsToTxn", 0, 3, translate_add_partitions, answer_add_partitions
)
ADD_OFFSETS_TO_TXN = KafkaApi(25, "AddOffsetsToTxn", 0, 3, translate_add_offsets, answer_error_only)
END_TXN = KafkaApi(26, "EndTxn", 0, 3, translate_end_txn, answer_error_only)
TXN_OFFSET_COMMIT = KafkaApi(
    28, "TxnOffsetCommit", 0, 3, translate_txn_offset_commit, answer_txn_offset_commit
)
DESCRIBE_PRODUCERS = KafkaApi(
    61, "DescribeProducers", 0, 0, translate_describe_producers, answer_describe_producers
)
LIST_TRANSACTIONS = KafkaApi(
    66, "ListTransactions", 0, 1, translate_list_transactions, answer_list_transactions
)
DESCRIBE_TRANSACTIONS = KafkaApi(
    65, "DescribeTransactions", 0, 0, translate_describe_transactions, answer_describe_transactions
)
APIS = (
    INIT_PRODUCER_ID,
    ADD_PARTITIONS_TO_TXN,
    ADD_OFFSETS_TO_TXN,
    END_TXN,
    TXN_OFFSET_COMMIT,
    DESCRIBE_PRODUCERS,
    DESCRIBE_TRANSACTIONS,
    LIST_TRANSACTIONS,
)
