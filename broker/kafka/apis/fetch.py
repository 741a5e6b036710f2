"""A consumer's reads: Fetch (v4-12; Kafka 2.8 is the last release whose Fetch names
topics rather than topic ids) and ListOffsets (v1-6).

Fetch's answer goes out through `fetch_response`, written by hand for the hot path;
`answer_fetch` is the reference it is held to (tests/kafka/test_kafka_wire.py).
"""

from __future__ import annotations

import struct
from typing import Any

from broker.kafka.api import Exchange, KafkaApi, Values, ms
from broker.kafka.apis.metadata import LEADER_EPOCH
from broker.kafka.wire import I16, I32, I64, array, framed, header, length, string
from protocol import messages as m

_PARTITION = struct.Struct(">ihqq")  # index, error, high watermark, stable offset
_ABORTED = struct.Struct(">qq")
FLEXIBLE = 12


def translate_fetch(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.FetchRequest(
        max_wait_ms=ms(req.max_wait),
        min_bytes=req.min_bytes,
        max_bytes=req.max_bytes,
        isolation_level=req.isolation_level,
        topics=[
            m.FetchTopic(
                t.topic,
                [
                    m.FetchPartition(p.partition, p.fetch_offset, p.partition_max_bytes)
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ],
    )


def answer_fetch(r: m.FetchResponse, _version: int, _asked: None) -> Values:
    return {
        "error_code": r.error,
        "session_id": 0,  # no fetch sessions (KIP-227): every Fetch names its partitions
        "responses": [
            {
                "topic": t.topic,
                "partitions": [
                    {
                        "partition_index": p.partition,
                        "error_code": p.error,
                        "high_watermark": p.high_watermark,
                        "last_stable_offset": p.last_stable_offset,
                        "log_start_offset": p.log_start_offset,
                        "aborted_transactions": None
                        if p.aborted_transactions is None
                        else [
                            {"producer_id": a.producer_id, "first_offset": a.first_offset}
                            for a in p.aborted_transactions
                        ],
                        "preferred_read_replica": -1,
                        "records": p.records,
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ],
    }


def fetch_response(
    response: m.FetchResponse, version: int, correlation_id: int, records: list[bytes]
) -> bytes:
    """The Fetch v4-12 response frame of `response`, each partition's records from
    `records` (the same order: already in Kafka's v2 form)."""
    flexible = version >= FLEXIBLE
    out = bytearray(header(correlation_id, flexible))
    out += I32.pack(0)  # throttle_time_ms
    if version >= 7:
        out += I16.pack(response.error)
        out += I32.pack(0)  # session_id: no fetch sessions
    array(out, len(response.topics), flexible)
    batches = iter(records)
    for topic in response.topics:
        string(out, topic.topic, flexible)
        array(out, len(topic.partitions), flexible)
        for p in topic.partitions:
            out += _PARTITION.pack(p.partition, p.error, p.high_watermark, p.last_stable_offset)
            if version >= 5:
                out += I64.pack(p.log_start_offset)
            aborted = p.aborted_transactions
            if aborted is None:
                out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                array(out, len(aborted), flexible)
                for a in aborted:
                    out += _ABORTED.pack(a.producer_id, a.first_offset)
                    if flexible:
                        out.append(0)
            if version >= 11:
                out += I32.pack(-1)  # preferred_read_replica
            data = next(batches)
            length(out, len(data), flexible)
            out += data
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    if flexible:
        out.append(0)
    return framed(out)


def translate_list_offsets(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return m.ListOffsetsRequest(
        isolation_level=getattr(req, "isolation_level", m.ISOLATION_READ_UNCOMMITTED),
        topics=[
            m.ListOffsetsTopic(
                t.name,
                [m.ListOffsetsPartition(p.partition_index, p.timestamp) for p in t.partitions],
            )
            for t in req.topics
        ],
    )


def answer_list_offsets(r: m.ListOffsetsResponse, _version: int, _asked: None) -> Values:
    return {
        "topics": [
            {
                "name": t.topic,
                "partitions": [
                    {
                        "partition_index": p.partition,
                        "error_code": p.error,
                        "timestamp": p.timestamp,
                        "offset": p.offset,
                        "leader_epoch": LEADER_EPOCH,
                    }
                    for p in t.partitions
                ],
            }
            for t in r.topics
        ]
    }


FETCH = KafkaApi(1, "Fetch", 4, 12, translate_fetch, answer_fetch)
LIST_OFFSETS = KafkaApi(2, "ListOffsets", 1, 6, translate_list_offsets, answer_list_offsets)
APIS = (FETCH, LIST_OFFSETS)
