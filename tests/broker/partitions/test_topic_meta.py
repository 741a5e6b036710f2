"""Topic metadata against the real broker process: a damaged topic.meta never costs an
acknowledged record, and CreateTopics is whole or nothing.

What is tried:
- topic.meta deleted, truncated or bit-flipped while the broker is stopped, then a
  Metadata request with allow_auto_create (which used to re-create the topic over its
  data): every acknowledged record is still fetched;
- a topic directory whose partitions cannot be told: the broker refuses to start (exit 3)
  naming the file, and touches nothing;
- CreateTopics with out-of-range configs: INVALID_CONFIG naming the setting, nothing on
  disk;
- CreateTopics on a full disk (RLIMIT_FSIZE 0 set on the running broker):
  KAFKA_STORAGE_ERROR, nothing on disk, and the same topic is created once there is room.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess, serve_once
from harness.wire import WireClient, fetched_values, values_batch
from protocol.errors import ErrorCode

PARTITIONS = 3


def all_values(c: WireClient, topic: str, partition: int) -> list[bytes]:
    f = c.fetch(topic, partition, 0)
    assert f["error"] == 0, f
    return [v for _, v in fetched_values(f["records"])]


def produce_acked(c: WireClient) -> dict[int, list[bytes]]:
    sent: dict[int, list[bytes]] = {}
    for p in range(PARTITIONS):
        sent[p] = []
        for n in range(4):
            values = [f"p{p}-b{n}-{i}".encode() for i in range(3)]
            r = c.produce("orders", p, values_batch(values), acks=-1)
            assert r["error"] == 0, r
            sent[p].extend(values)
    return sent


@pytest.mark.parametrize("how", ["deleted", "truncated", "flipped"])
def test_damaged_topic_meta_keeps_every_acknowledged_record(tmp_path: Path, how: str) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("orders", PARTITIONS, {"retention.ms": -1}) == 0
            sent = produce_acked(c)
        assert broker.terminate() == 0
        meta = tmp_path / "data" / "topics" / "orders" / "topic.meta"
        if how == "deleted":
            meta.unlink()
        elif how == "truncated":
            meta.write_bytes(meta.read_bytes()[:-5])
        else:
            data = bytearray(meta.read_bytes())
            data[len(data) // 2] ^= 0x5A
            meta.write_bytes(bytes(data))

        broker.start()
        with WireClient(broker.bootstrap) as c:
            r = c.call("Metadata", topics=["orders"], allow_auto_create=True)
            for p in range(PARTITIONS):
                assert all_values(c, "orders", p) == sent[p]
            assert r["topics"][0]["error"] == 0
            assert len(r["topics"][0]["partitions"]) == PARTITIONS
        assert broker.log_shows(f"event=topic_meta_rebuilt file={meta}")
        # The rebuilt meta file holds: another restart needs no rebuilding.
        broker.restart(kill=True)
        assert "topic_meta_rebuilt" not in broker.log_text()
        with WireClient(broker.bootstrap) as c:
            for p in range(PARTITIONS):
                assert all_values(c, "orders", p) == sent[p]
    finally:
        broker.kill()


def test_unrecoverable_topic_meta_refuses_to_start_and_names_the_file(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("orders", PARTITIONS) == 0
            sent = produce_acked(c)
    finally:
        assert broker.terminate() == 0
    topic = tmp_path / "data" / "topics" / "orders"
    (topic / "topic.meta").unlink()
    os.rename(topic / "1", topic / "7")  # partitions 0, 2, 7: how many were there?
    before = sorted(os.listdir(topic))
    r = serve_once(tmp_path / "data")
    assert r.returncode == 3, r.stderr
    assert "event=refused_to_start" in r.stderr and str(topic / "topic.meta") in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(os.listdir(topic)) == before
    # Put back by hand, the topic is whole again.
    os.rename(topic / "7", topic / "1")
    broker.start()
    try:
        with WireClient(broker.bootstrap) as c:
            for p in range(PARTITIONS):
                assert all_values(c, "orders", p) == sent[p]
    finally:
        broker.kill()


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"segment.bytes": 100}, "segment.bytes"),
        ({"segment.ms": 1e300}, "segment.ms"),
        ({"retention.ms": float("inf")}, "retention.ms"),
        ({"retention.bytes": "lots"}, "retention.bytes"),
        ({"compression.type": "zstd"}, "unknown topic config 'compression.type' (known: "),
        (
            {"retension.ms": 1000},
            "unknown topic config 'retension.ms'; did you mean 'retention.ms'? (known: ",
        ),
    ],
)
def test_create_topics_with_a_bad_config_is_invalid_config(
    broker: BrokerProcess, config: dict, needle: str
) -> None:
    with WireClient(broker.bootstrap) as c:
        r = c.call("CreateTopics", topics=[{"name": "t", "partitions": 2, "config": config}])
        result = r["topics"][0]
        assert result["error"] == ErrorCode.INVALID_CONFIG
        assert needle in result["message"]
        assert not (broker.data_dir / "topics" / "t").exists()
        assert c.create_topic("t", 2, {"segment.bytes": "4096"}) == 0
        assert len(os.listdir(f"/proc/{broker.proc.pid}/fd")) < 200  # type: ignore[union-attr]


def test_create_topics_on_a_full_disk_is_storage_error_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    assert broker.proc is not None
    pid = broker.proc.pid
    try:
        with WireClient(broker.bootstrap) as c:
            c.call("ApiVersions")  # the connection's own descriptor is open from here
            fds_before = len(os.listdir(f"/proc/{pid}/fd"))
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
            assert c.create_topic("full", 4) == ErrorCode.KAFKA_STORAGE_ERROR
            r = c.call("Metadata", topics=["auto"], allow_auto_create=True)
            assert r["topics"][0]["error"] == ErrorCode.KAFKA_STORAGE_ERROR
            assert os.listdir(tmp_path / "data" / "topics") == []
            assert len(os.listdir(f"/proc/{pid}/fd")) == fds_before
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            assert c.create_topic("full", 4) == 0
            assert c.produce("full", 3, values_batch([b"x"]), acks=-1)["error"] == 0
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            assert all_values(c, "full", 3) == [b"x"]
    finally:
        broker.kill()
