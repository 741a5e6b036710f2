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

from client.consumer import AsyncConsumer, Consumer
from client.errors import (
    CommitTxnsError,
    CorruptRecordError,
    DeliveryTimeoutError,
    IllegalStateError,
    MinibrokerError,
    MinibrokerTimeoutError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
)
from client.producer import AsyncProducer, Producer
from client.types import (
    BatchMetadata,
    CommitTxnsResult,
    ConsumerRecord,
    RecordMetadata,
    TopicPartition,
    TxnHandle,
)

__all__ = [
    "AsyncConsumer",
    "AsyncProducer",
    "BatchMetadata",
    "CommitTxnsError",
    "CommitTxnsResult",
    "Consumer",
    "ConsumerRecord",
    "CorruptRecordError",
    "DeliveryTimeoutError",
    "IllegalStateError",
    "MinibrokerError",
    "MinibrokerTimeoutError",
    "Producer",
    "ProducerFencedError",
    "RecordMetadata",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TxnHandle",
]
