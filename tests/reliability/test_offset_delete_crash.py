"""kill -9 after a Kafka OffsetDelete is durable but before its answer: after the
restart the deleted offset is gone, through the minibroker listener too, and the
offsets not named are kept (the "expire" record of groups/offsets.wal, fsynced
before the answer; the point is armed with MINIBROKER_CRASH_AT)."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from kafka.protocol.consumer.group import OffsetDeleteRequest as KDelete

from broker.crash_points import ENV
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from tests.kafka.kafka_support import listeners_config


def offset_delete_frame(group: str, topic: str, partition: int) -> bytes:
    topic_cls = KDelete.OffsetDeleteRequestTopic
    request = KDelete[0](
        group_id=group,
        topics=[
            topic_cls(
                name=topic,
                partitions=[topic_cls.OffsetDeleteRequestPartition(partition_index=partition)],
            )
        ],
    )
    request.with_header(correlation_id=1, client_id="crash-test")
    body = bytes(request.encode(header=True))
    return struct.pack(">i", len(body)) + body


def offsets(c: WireClient, group: str) -> dict[int, int]:
    r = c.call("OffsetFetch", group_id=group, topics=[{"topic": "t", "partitions": [0, 1]}])
    return {p["partition"]: p["offset"] for p in r["topics"][0]["partitions"]}


def test_kill_after_an_offset_delete_is_durable_keeps_it_deleted(
    tmp_path: Path, backend: str
) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        env={ENV: "offset_delete_durable"},
        config=listeners_config(),
    ).start()
    try:
        with WireClient(broker.address("mb")) as c:
            assert c.create_topic("t", 2) == 0
            topics = [{"topic": "t", "partitions": [{"partition": p, "offset": 5} for p in (0, 1)]}]
            assert c.call("OffsetCommit", group_id="g", topics=topics)["error"] == 0
        host, port = broker.address("kafka").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=15) as s:
            s.sendall(offset_delete_frame("g", "t", 0))
            assert s.recv(4) == b"", "answered: the broker did not die at the crash point"
        broker.restart_after_crash_point()
        with WireClient(broker.address("mb")) as c:
            assert offsets(c, "g") == {0: -1, 1: 5}
    finally:
        broker.kill()
