"""Metadata: the topics, their partitions and the broker that leads them all
(docs/protocol.md section 4). With `auto_create_topics` on, a Metadata that allows it
creates the topics it names. Kafka's FindCoordinator for a transactional id is answered
the same way, without topics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from broker.clock import now_ms
from broker.config import BrokerConfig
from broker.partitions import TopicError, TopicRegistry
from broker.security import Session
from protocol import messages as m
from protocol.errors import ErrorCode

BROKER_ID = 0


class ClusterApi:
    """Metadata, answered with the address of the listener asked (or `advertised`)."""

    def __init__(
        self, config: BrokerConfig, topics: TopicRegistry, advertised: tuple[str, int]
    ) -> None:
        self.config = config
        self.topics = topics
        self.advertised = advertised

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        return {"Metadata": self.metadata, "KafkaFindTxnCoordinator": self.find_txn_coordinator}

    async def find_txn_coordinator(self, _req: Any, session: Session) -> m.MetadataResponse:
        """Kafka's FindCoordinator for a transactional id (broker/kafka/apis/groups.py):
        this broker, once the judge let the caller describe the id."""
        return await self.metadata(m.MetadataRequest(topics=[]), session)

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
                    topic.topic_id.bytes,
                )
            )
        host, port = session.advertised or self.advertised
        return m.MetadataResponse(brokers=[m.BrokerMetadata(BROKER_ID, host, port)], topics=out)
