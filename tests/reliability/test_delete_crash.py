"""kill -9 at every step of deleting a topic and of changing its settings, then restart:
the topic is whole or gone, never in part, and a change of settings answered is kept.

A topic of three partitions, several segments each, with an idempotent producer's
batches and committed offsets in two groups, is deleted while the broker is armed
to die (MINIBROKER_CRASH_AT, broker/crash_points.py) (a) after its partitions are
flushed, before the rename: it is whole; (b) after the rename to its tombstone is
durable; (c) after its committed offsets are dropped durably; (d) after the first
partition's files are removed; (e) after every file is removed, before the answer:
in (b)-(e) it is gone. A start that dies itself while finishing a deletion (f)
finishes it at the next. Last, (g) a kill after a topic's new meta file is durable,
before the answer: the change is in force after the restart.

After each restart the other topic and its offsets are untouched, and a topic
created again under the deleted name starts empty at offset 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.crash_points import ENV
from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch
from tests.broker.api.test_admin import commit, committed, delete, topic_configs
from tests.reliability.conftest import read_partition

DROPPED = (ConnectionError, OSError, EOFError)
PARTITIONS = 3
GONE_AFTER = [
    "topic_delete_renamed",
    "topic_delete_offsets_durable",
    "topic_delete_partition_removed",
    "topic_delete_files_removed",
]


def armed(tmp_path: Path, backend: str, crash_at: str) -> BrokerProcess:
    return BrokerProcess(tmp_path / "data", backend=backend, env={ENV: crash_at}).start()


def fill(c: WireClient) -> dict[str, list[list[bytes]]]:
    """Topics t (3 partitions of several segments) and u, with records and offsets."""
    assert c.create_topic("t", PARTITIONS, {"segment.bytes": 1024, "retention.ms": -1}) == 0
    assert c.create_topic("u", 1, {"retention.ms": -1}) == 0
    pid, epoch = c.init_producer()
    sent: dict[str, list[list[bytes]]] = {"t": [], "u": []}
    for p in range(PARTITIONS):
        sent["t"].append([])
        for n in range(8):
            value = f"t{p}-{n}".encode() * 40
            batch = values_batch([value], producer_id=pid, producer_epoch=epoch, base_sequence=n)
            assert c.produce("t", p, batch, acks=-1)["error"] == 0
            sent["t"][p].append(value)
    assert c.produce("u", 0, values_batch([b"u-kept"]), acks=-1)["error"] == 0
    sent["u"].append([b"u-kept"])
    commit(c, "g", {("t", 0): 3, ("t", 1): 4, ("t", 2): 5, ("u", 0): 1})
    commit(c, "h", {("t", 1): 2})
    return sent


def stored(c: WireClient, topic: str) -> list[list[bytes]]:
    count = len(c.call("Metadata", topics=[topic])["topics"][0]["partitions"])
    return [[v for _, v in read_partition(c, topic, p)] for p in range(count)]


def assert_gone(broker: BrokerProcess, c: WireClient, sent: dict[str, list[list[bytes]]]) -> None:
    assert [t["error"] for t in c.call("Metadata", topics=["t"])["topics"]] == [3]
    assert c.fetch("t", 0, 0)["error"] == 3
    assert committed(c, "g") == {("u", 0): (1, 0)}
    assert committed(c, "h") == {}
    assert sorted(p.name for p in (broker.data_dir / "topics").iterdir()) == ["u"]
    assert stored(c, "u") == sent["u"]
    assert c.create_topic("t", 1) == 0
    assert c.fetch("t", 0, 0)["high_watermark"] == 0
    assert committed(c, "g", [("t", 0)]) == {("t", 0): (-1, 0)}
    r = c.produce("t", 0, values_batch([b"again"]), acks=-1)
    assert (r["error"], r["base_offset"]) == (0, 0)


@pytest.mark.parametrize("crash_at", GONE_AFTER)
def test_a_kill_after_the_rename_leaves_the_topic_gone(
    tmp_path: Path, backend: str, crash_at: str
) -> None:
    broker = armed(tmp_path, backend, crash_at)
    try:
        with WireClient(broker.bootstrap) as c:
            sent = fill(c)
            with pytest.raises(DROPPED):
                c.call("DeleteTopics", topics=["t"])
        broker.restart_after_crash_point()
        if crash_at != "topic_delete_files_removed":  # else no tombstone was left
            assert broker.log_shows("event=topic_deletion_finished topic=t")
        with WireClient(broker.bootstrap) as c:
            assert_gone(broker, c, sent)
    finally:
        broker.kill()


def test_a_kill_before_the_rename_leaves_the_topic_whole(tmp_path: Path, backend: str) -> None:
    broker = armed(tmp_path, backend, "topic_delete_flushed")
    try:
        with WireClient(broker.bootstrap) as c:
            sent = fill(c)
            with pytest.raises(DROPPED):
                c.call("DeleteTopics", topics=["t"])
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert stored(c, "t") == sent["t"] and stored(c, "u") == sent["u"]
            assert committed(c, "g") == {("t", 0): (3, 0), ("t", 1): (4, 0), ("t", 2): (5, 0)} | {
                ("u", 0): (1, 0)
            }
            assert committed(c, "h") == {("t", 1): (2, 0)}
            # The deletion asked again goes through.
            assert delete(c, "t") == [("t", 0)]
            assert_gone(broker, c, sent)
    finally:
        broker.kill()


def test_a_start_killed_while_finishing_a_deletion_finishes_it_next_time(
    tmp_path: Path, backend: str
) -> None:
    broker = armed(tmp_path, backend, "topic_delete_renamed")
    try:
        with WireClient(broker.bootstrap) as c:
            sent = fill(c)
            with pytest.raises(DROPPED):
                c.call("DeleteTopics", topics=["t"])
        # The next start dies as it removes the tombstone's first partition.
        broker.env = {ENV: "topic_delete_partition_removed"}
        assert broker.proc is not None
        broker.proc.wait(15)
        with pytest.raises(RuntimeError, match="did not start"):
            broker.start(broker.port)
        tombstone = broker.data_dir / "topics" / "t~deleted"
        assert tombstone.is_dir() and len([p for p in tombstone.iterdir() if p.is_dir()]) == 2
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert_gone(broker, c, sent)
    finally:
        broker.kill()


def test_a_kill_after_new_settings_are_durable_keeps_them(tmp_path: Path, backend: str) -> None:
    broker = armed(tmp_path, backend, "topic_config_durable")
    try:
        with WireClient(broker.bootstrap) as c:
            sent = fill(c)
            with pytest.raises(DROPPED):
                c.call(
                    "IncrementalAlterConfigs",
                    resources=[
                        {
                            "type": "topic",
                            "name": "t",
                            "ops": [
                                {"name": "retention.bytes", "op": "set", "value": "1048576"},
                                {"name": "segment.bytes", "op": "delete"},
                            ],
                        }
                    ],
                    validate_only=False,
                )
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            configs = topic_configs(c, "t")
            assert configs["retention.bytes"] == ("1048576", "topic")
            assert configs["segment.bytes"][1] == "default"
            assert configs["retention.ms"] == ("-1", "topic")
            assert stored(c, "t") == sent["t"]
    finally:
        broker.kill()
