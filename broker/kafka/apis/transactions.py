"""A transactional producer's APIs: InitProducerId (v0-4, with or without a transactional
id), AddPartitionsToTxn (v0-3), AddOffsetsToTxn (v0-3), TxnOffsetCommit (v0-3) and
EndTxn (v0-3), the versions of Kafka 2.8 that kafka-python, aiokafka and librdkafka use.

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
from typing import Any

import msgspec
from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker.kafka.api import Exchange, KafkaApi, Reply, Values, ms
from broker.kafka.kafka_only import KafkaOnlyRequest
from protocol import messages as m
from protocol.authorization import Entries, EntryNeed, Path, RequestNeed, Requirements
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
    are checked by the group's membership: outside it (generation -1, no member id)
    there is nothing to check. A member's commit waits for the classic groups (the
    consumer-groups step): its generation and member id are to be judged here, where
    it is refused ILLEGAL_GENERATION until then."""
    generation = getattr(req, "generation_id", NO_GENERATION)
    member = getattr(req, "member_id", "")
    refusal: int | None = None
    if _id_refusal(req.transactional_id) is not None or not req.group_id:
        refusal = ErrorCode.INVALID_REQUEST
    elif generation != NO_GENERATION or member:
        refusal = KafkaErrorCode.illegal_generation
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
        topics=[
            m.OffsetCommitTopic(
                t.name,
                [
                    m.OffsetCommitPartition(
                        p.partition_index, p.committed_offset, p.committed_metadata
                    )
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ],
    )


def answer_txn_offset_commit(r: m.TxnOffsetCommitResponse, _version: int, _asked: None) -> Values:
    return {
        "topics": [
            {
                "name": t.topic,
                "partitions": [
                    {"partition_index": p.partition, "error_code": p.error} for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


def translate_end_txn(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    if _id_refusal(req.transactional_id) is not None:
        return Reply({"error_code": ErrorCode.INVALID_REQUEST})
    return m.EndTxnRequest(
        transactional_id=req.transactional_id,
        producer_id=req.producer_id,
        producer_epoch=req.producer_epoch,
        committed=req.committed,
    )


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
APIS = (INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT)
