"""A producer's writes: Produce (v3-9; Kafka 2.8 is the last release whose Produce names
topics rather than topic ids, and Kafka 4.0 reads magic 2 only, from v3, KIP-896).
InitProducerId, which librdkafka needs with Produce v3+ to enable idempotence, is in
transactions.py.

Produce's answer goes out through `produce_response`, written by hand for the hot path;
`answer_produce` is the reference it is held to (tests/kafka/test_kafka_wire.py).
"""

from __future__ import annotations

import struct
from typing import Any

from broker.kafka.api import Exchange, KafkaApi, Values, ms
from broker.kafka.wire import I32, I64, array, framed, header, nullable_string, string
from protocol import messages as m

_PARTITION = struct.Struct(">ihqq")  # index, error, base offset, append time
FLEXIBLE = 9


def translate_produce(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.ProduceRequest(
        acks=req.acks,
        timeout_ms=ms(req.timeout),
        transactional_id=req.transactional_id,
        topics=[
            m.ProduceTopic(
                t.name,
                [
                    m.ProducePartition(p.index, memoryview(p.records or b""))
                    for p in t.partition_data
                ],
            )
            for t in req.topic_data
        ],
    )


def answer_produce(r: m.ProduceResponse, _version: int, _asked: None) -> Values:
    return {
        "responses": [
            {
                "name": t.topic,
                "partition_responses": [
                    {
                        "index": p.partition,
                        "error_code": p.error,
                        "base_offset": p.base_offset,
                        "log_append_time": p.log_append_time_ms,
                        "log_start_offset": p.log_start_offset,
                        "error_message": p.message,
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


def produce_response(response: m.ProduceResponse, version: int, correlation_id: int) -> bytes:
    """The Produce v3-9 response frame of `response`."""
    flexible = version >= FLEXIBLE
    out = bytearray(header(correlation_id, flexible))
    array(out, len(response.topics), flexible)
    for topic in response.topics:
        string(out, topic.topic, flexible)
        array(out, len(topic.partitions), flexible)
        for p in topic.partitions:
            out += _PARTITION.pack(p.partition, p.error, p.base_offset, p.log_append_time_ms)
            if version >= 5:
                out += I64.pack(p.log_start_offset)
            if version >= 8:
                array(out, 0, flexible)  # record_errors
                nullable_string(out, p.message, flexible)
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    out += I32.pack(0)  # throttle_time_ms
    if flexible:
        out.append(0)
    return framed(out)


PRODUCE = KafkaApi(0, "Produce", 3, 9, translate_produce, answer_produce)
APIS = (PRODUCE,)
