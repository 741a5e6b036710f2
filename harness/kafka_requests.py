"""Kafka's Produce and Fetch requests for one partition, as kafka-python builds them:
what the Kafka listener's tests and its codec benchmark send."""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest

_Topic = ProduceRequest.TopicProduceData
_FetchTopic = FetchRequest.FetchTopic


def produce_request(
    topic: str,
    batch: bytes,
    *,
    version: int = 9,
    acks: int = 1,
    timeout_ms: int = 10_000,
    partition: int = 0,
    transactional_id: str | None = None,
) -> ApiMessage:
    """A Produce of `batch` to one partition of `topic` (non-transactional unless
    `transactional_id` is given)."""
    message: ApiMessage = ProduceRequest[version](
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[
            _Topic(
                name=topic,
                partition_data=[_Topic.PartitionProduceData(index=partition, records=batch)],
            )
        ],
    )
    return message


def fetch_request(topic: str, *, version: int = 12, max_wait_ms: int = 0) -> ApiMessage:
    """A read-uncommitted Fetch of partition 0 of `topic` from offset 0, up to 1 MiB."""
    message: ApiMessage = FetchRequest[version](
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[
            _FetchTopic(
                topic=topic,
                partitions=[
                    _FetchTopic.FetchPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=1 << 20
                    )
                ],
            )
        ],
    )
    return message
