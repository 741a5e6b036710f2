"""The producer and transaction APIs: InitProducerId, EndTxn, PrepareTxn, CommitTxns,
ListTransactions and DescribeTxnApps (docs/transactions.md), and a Kafka client's
InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn,
DescribeTransactions and DescribeProducers (Kafka-only requests,
broker/kafka/apis/transactions.py).

An InitProducerId without a transactional id is answered from the producer ids; the
rest goes to the transaction coordinator, which owns the transactions' state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.metrics import BrokerMetrics
from broker.partitions import ProducerIdManager, TopicRegistry
from broker.security import Session
from broker.transactions import TransactionCoordinator
from protocol import messages as m
from protocol.errors import ErrorCode


def owner_of(
    coordinator: TransactionCoordinator, producer_ids: ProducerIdManager, producer_id: int
) -> str:
    """The principal an issued producer id belongs to: the one that last initialized
    its transactional id, else the one it was handed out to (docs/protocol.md section 7,
    "Producer ids belong to principals")."""
    owner = coordinator.principal_of(producer_id)
    return producer_ids.owner(producer_id) if owner is None else owner


class TransactionApi:
    """The producer ids' and the transaction coordinator's APIs."""

    def __init__(
        self,
        topics: TopicRegistry,
        producer_ids: ProducerIdManager,
        coordinator: TransactionCoordinator,
        metrics: BrokerMetrics,
    ) -> None:
        self.topics = topics
        self.producer_ids = producer_ids
        self.coordinator = coordinator
        self.metrics = metrics

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        coordinator = self.coordinator
        return {
            "InitProducerId": self.init_producer_id,
            "KafkaInitProducerId": self.classic_init_producer_id,
            "KafkaAddPartitionsToTxn": self.add_partitions_to_txn,
            "KafkaAddOffsetsToTxn": self.add_offsets_to_txn,
            "KafkaDescribeProducers": self.describe_producers,
            "KafkaDescribeTransactions": lambda req, _session: req.answered(
                coordinator.describe_transactions(req.transactional_ids)
            ),
            "EndTxn": lambda req, session: coordinator.end_txn(req, session.principal),
            "PrepareTxn": lambda req, session: coordinator.prepare_txn(req, session.principal),
            "CommitTxns": lambda req, _session: coordinator.commit_txns(req),
            "ListTransactions": lambda req, _session: coordinator.list_transactions(req),
            "DescribeTxnApps": lambda req, _session: coordinator.describe_apps(req),
        }

    async def classic_init_producer_id(
        self, req: Any, session: Session
    ) -> m.InitProducerIdResponse:
        """A Kafka client's InitProducerId with a transactional id (broker/kafka/apis/
        transactions.py): the coordinator's, the id marked classic."""
        pid, epoch = await self.coordinator.init_producer(
            req.transactional_id,
            req.transaction_timeout_ms,
            session.principal,
            classic=True,
            producer_id=req.producer_id,
            producer_epoch=req.producer_epoch,
        )
        return m.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    async def add_partitions_to_txn(self, req: Any, session: Session) -> Any:
        """A classic producer's AddPartitionsToTxn: each partition's verdict, answered in
        the Kafka-only response the request declares."""
        wanted = [(t.topic, p) for t in req.topics for p in t.partitions]
        refused = await self.coordinator.add_partitions(
            req.transactional_id, req.producer_id, req.producer_epoch, wanted, session.principal
        )
        return req.answered(refused)

    async def add_offsets_to_txn(self, req: Any, session: Session) -> Any:
        """A classic producer's AddOffsetsToTxn: the group joins its transaction."""
        await self.coordinator.add_offsets(
            req.transactional_id,
            req.producer_id,
            req.producer_epoch,
            req.group_id,
            session.principal,
        )
        return type(req).response()

    def describe_producers(self, req: Any, _session: Session) -> Any:
        """Kafka's DescribeProducers: each partition's producer state."""
        states = {}
        for t in req.topics:
            for p in t.partitions:
                partition = self.topics.partition(t.topic, p)
                states[t.topic, p] = None if partition is None else partition.producers.describe()
        return req.answered(states)

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
        if issued and owner_of(self.coordinator, ids, req.producer_id) != principal:
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
            known_epoch = max(known, default=None)
            grant = ids.bump(req.producer_id, req.producer_epoch, known_epoch, principal)
        else:
            grant = ids.new_producer(principal)
        if grant.error == ErrorCode.INVALID_PRODUCER_EPOCH:
            self.metrics.producer_event("fenced")
        return m.InitProducerIdResponse(
            producer_id=grant.producer_id, producer_epoch=grant.producer_epoch, error=grant.error
        )
