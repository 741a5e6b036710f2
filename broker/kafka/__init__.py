"""Apache Kafka's wire protocol on a `kafka` listener: an adapter from Kafka's
requests to the broker's own handlers, topics, producer state and security
(docs/kafka-compatibility.md)."""

from broker.kafka.api import KafkaApi
from broker.kafka.apis import SERVED
from broker.kafka.apis.consumer_groups import ConsumerGroupApi
from broker.kafka.apis.group_offsets import GroupOffsetApi
from broker.kafka.apis.groups import ClassicGroupApi
from broker.kafka.codec import KafkaCodec

__all__ = [
    "SERVED",
    "ClassicGroupApi",
    "ConsumerGroupApi",
    "GroupOffsetApi",
    "KafkaApi",
    "KafkaCodec",
]
