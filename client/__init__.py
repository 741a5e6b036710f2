"""Python SDK for minibroker: idempotent and transactional producers, consumers, async
(AnyIO) and sync.

    from client import Producer, Consumer

    with Producer("127.0.0.1:9092") as p:
        p.send("events", b"hello").get(timeout=10)

    with Consumer("events", bootstrap_servers="127.0.0.1:9092",
                  auto_offset_reset="earliest", consumer_timeout_ms=1000) as c:
        for record in c:
            print(record.offset, record.value)

Settings use Kafka's names and defaults (see `client.config`).
"""

from client.config import AdminConfig
from client.consumer import AsyncConsumer, Consumer, ConsumerRebalanceListener
from client.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    CommitFailedError,
    CommitTxnsError,
    CorruptRecordError,
    DeliveryTimeoutError,
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupMaxSizeReachedError,
    IllegalStateError,
    MinibrokerError,
    MinibrokerTimeoutError,
    NoBrokersAvailable,
    NonEmptyGroupError,
    NoOffsetForPartitionError,
    ProducerFencedError,
    StaleMemberEpochError,
    TransactionAbortableError,
    TransactionAbortedError,
    TxnOffsetCommitFailedError,
    UnknownMemberIdError,
    UnknownPartitionError,
    UnstableOffsetCommitError,
)
from client.producer import AsyncProducer, Producer
from client.types import (
    BatchMetadata,
    CommitTxnsResult,
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
    TxnHandle,
)

__all__ = [
    "AdminConfig",
    "AsyncConsumer",
    "AsyncProducer",
    "AuthenticationFailedError",
    "AuthorizationFailedError",
    "BatchMetadata",
    "CommitFailedError",
    "CommitTxnsError",
    "CommitTxnsResult",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "CorruptRecordError",
    "DeliveryTimeoutError",
    "FencedInstanceIdError",
    "FencedMemberEpochError",
    "GroupMaxSizeReachedError",
    "IllegalStateError",
    "MinibrokerError",
    "MinibrokerTimeoutError",
    "NoBrokersAvailable",
    "NoOffsetForPartitionError",
    "NonEmptyGroupError",
    "OffsetAndMetadata",
    "Producer",
    "ProducerFencedError",
    "RecordMetadata",
    "StaleMemberEpochError",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TxnHandle",
    "TxnOffsetCommitFailedError",
    "UnknownMemberIdError",
    "UnknownPartitionError",
    "UnstableOffsetCommitError",
]
