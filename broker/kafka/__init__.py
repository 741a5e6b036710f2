"""Apache Kafka's wire protocol on a `kafka` listener: an adapter from Kafka's
requests to the broker's own handlers, topics, producer state and security
(docs/kafka-compatibility.md)."""

from broker.kafka.apis import NEXT_STEP, SERVED, KafkaApi
from broker.kafka.codec import KafkaCodec

__all__ = ["NEXT_STEP", "SERVED", "KafkaApi", "KafkaCodec"]
