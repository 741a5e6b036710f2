"""Python SDK for minibroker: idempotent producers and consumers, async (AnyIO) and sync.

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
    CorruptRecordError,
    DeliveryTimeoutError,
    MinibrokerError,
    MinibrokerTimeoutError,
    ProducerFencedError,
)
from client.producer import AsyncProducer, Producer
from client.types import BatchMetadata, ConsumerRecord, RecordMetadata, TopicPartition

__all__ = [
    "AsyncConsumer",
    "AsyncProducer",
    "BatchMetadata",
    "Consumer",
    "ConsumerRecord",
    "CorruptRecordError",
    "DeliveryTimeoutError",
    "MinibrokerError",
    "MinibrokerTimeoutError",
    "Producer",
    "ProducerFencedError",
    "RecordMetadata",
    "TopicPartition",
]
