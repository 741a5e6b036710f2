"""DeleteTopics, DescribeConfigs and IncrementalAlterConfigs against the real broker
process, over the raw wire (docs/protocol.md sections 4 and 9.16), on both backends.

Every test asserts on what the broker serves afterwards: after a deletion, Metadata,
Produce, Fetch, ListOffsets and OffsetFetch say the topic is gone, its files are gone,
and a topic created again under its name starts empty, with no committed offset and
no producer state; a refused deletion or alteration changed nothing (records, offsets
and settings read back). A changed retention deletes old segments at the next
retention run, and a changed segment size rolls the next segment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config import SETTINGS, TOPIC_SETTINGS
from harness.broker_process import BrokerProcess
from harness.txn import Txn
from harness.wire import WireClient, values_batch
from protocol.errors import ErrorCode
from tests.reliability.conftest import config_file, read_partition

# Set in the broker's file, so DescribeConfigs says "broker" for them.
BROKER_SETTINGS = "retention_check_interval_ms = 50\nsegment_ms = 86400000\n"
OLD_MS = 1_600_000_000_000  # record timestamps far older than any retention below


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        tmp_path / "data", backend=backend, extra_args=config_file(tmp_path, BROKER_SETTINGS)
    ).start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def c(broker: BrokerProcess) -> Iterator[WireClient]:
    with WireClient(broker.bootstrap) as client:
        yield client


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def delete(c: WireClient, *names: str) -> list[tuple[str, int]]:
    r = c.call("DeleteTopics", topics=list(names))
    assert r["error"] == 0, r
    return [(t["name"], t["error"]) for t in r["topics"]]


def commit(c: WireClient, group: str, offsets: dict[tuple[str, int], int]) -> None:
    by_topic: dict[str, list[dict[str, int]]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append({"partition": partition, "offset": offset})
    r = c.call(
        "OffsetCommit",
        group_id=group,
        topics=[{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
    )
    errors = [p["error"] for t in r["topics"] for p in t["partitions"]]
    assert r["error"] == 0 and set(errors) == {0}, r


def committed(
    c: WireClient, group: str, partitions: list[tuple[str, int]] | None = None
) -> dict[tuple[str, int], tuple[int, int]]:
    """OffsetFetch: (offset, error) per partition (nil topics: all the group holds)."""
    topics = None
    if partitions is not None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        topics = [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]
    r = c.call("OffsetFetch", group_id=group, topics=topics)
    assert r["error"] == 0, r
    return {
        (t["topic"], p["partition"]): (p["offset"], p["error"])
        for t in r["topics"]
        for p in t["partitions"]
    }


def values(c: WireClient, topic: str, partition: int) -> list[bytes]:
    """Every value of the partition from its log start offset, each batch CRC-checked."""
    return [v for _, v in read_partition(c, topic, partition)]


def earliest(c: WireClient, topic: str, partition: int) -> int:
    r = c.call(
        "ListOffsets",
        isolation_level=0,
        topics=[{"topic": topic, "partitions": [{"partition": partition, "timestamp": -2}]}],
    )
    p = r["topics"][0]["partitions"][0]
    assert p["error"] == 0, p
    return int(p["offset"])


def describe(c: WireClient, *resources: tuple[str, str]) -> list[dict[str, Any]]:
    r = c.call("DescribeConfigs", resources=[{"type": t, "name": n} for t, n in resources])
    assert r["error"] == 0, r
    return list(r["results"])


def topic_configs(c: WireClient, topic: str) -> dict[str, tuple[str | None, str]]:
    """{name: (value, source)} of every setting of `topic`."""
    [result] = describe(c, ("topic", topic))
    assert result["error"] == 0, result
    return {e["name"]: (e["value"], e["source"]) for e in result["configs"]}


def alter(
    c: WireClient, topic: str, *ops: tuple[str, str, str | None], validate_only: bool = False
) -> tuple[int, str | None]:
    r = c.call(
        "IncrementalAlterConfigs",
        resources=[
            {
                "type": "topic",
                "name": topic,
                "ops": [{"name": n, "op": op, "value": v} for n, op, v in ops],
            }
        ],
        validate_only=validate_only,
    )
    assert r["error"] == 0, r
    [result] = r["results"]
    return result["error"], result["message"]


def segment_files(broker: BrokerProcess, topic: str, partition: int) -> list[Path]:
    return sorted((broker.data_dir / "topics" / topic / str(partition)).glob("*.log"))


# --------------------------------------------------------------------------- DeleteTopics


def test_a_deleted_topic_is_gone_for_every_api_and_comes_back_empty(
    broker: BrokerProcess, c: WireClient
) -> None:
    assert c.create_topic("t", 2) == 0 and c.create_topic("u", 1) == 0
    pid, epoch = c.init_producer()
    batch = values_batch([b"a", b"b", b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    assert c.produce("t", 0, batch, acks=-1)["error"] == 0
    assert c.produce("t", 1, values_batch([b"x"]), acks=-1)["error"] == 0
    assert c.produce("u", 0, values_batch([b"kept"]), acks=-1)["error"] == 0
    commit(c, "g", {("t", 0): 2, ("t", 1): 1, ("u", 0): 1})
    commit(c, "h", {("t", 0): 3})

    assert delete(c, "t") == [("t", 0)]

    metadata = c.call("Metadata", topics=["t"])["topics"]
    assert [(t["name"], t["error"]) for t in metadata] == [("t", 3)]
    assert [t["name"] for t in c.call("Metadata", topics=None)["topics"]] == ["u"]
    assert c.produce("t", 0, values_batch([b"late"]), acks=-1)["error"] == 3
    assert c.fetch("t", 0, 0)["error"] == 3
    listed = c.call(
        "ListOffsets",
        isolation_level=0,
        topics=[{"topic": "t", "partitions": [{"partition": 0, "timestamp": -1}]}],
    )
    assert listed["topics"][0]["partitions"][0]["error"] == 3
    # Its committed offsets went with it; the other topic's stayed.
    assert committed(c, "g", [("t", 0), ("t", 1), ("u", 0)]) == {
        ("t", 0): (-1, 3),
        ("t", 1): (-1, 3),
        ("u", 0): (1, 0),
    }
    assert committed(c, "g") == {("u", 0): (1, 0)}
    assert committed(c, "h") == {}
    topics_dir = broker.data_dir / "topics"
    assert sorted(p.name for p in topics_dir.iterdir()) == ["u"]
    assert values(c, "u", 0) == [b"kept"]
    assert delete(c, "t") == [("t", 3)]

    # Created again: empty, from offset 0, with no offset committed and no producer state
    # (the producer's next sequence is unknown there; only sequence 0 starts it).
    assert c.create_topic("t", 1) == 0
    assert committed(c, "g", [("t", 0)]) == {("t", 0): (-1, 0)}
    assert c.fetch("t", 0, 0)["high_watermark"] == 0
    next_batch = values_batch([b"d"], producer_id=pid, producer_epoch=epoch, base_sequence=3)
    assert c.produce("t", 0, next_batch, acks=-1)["error"] == ErrorCode.UNKNOWN_PRODUCER_ID
    fresh = values_batch([b"new"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    r = c.produce("t", 0, fresh, acks=-1)
    assert (r["error"], r["base_offset"]) == (0, 0)
    assert values(c, "t", 0) == [b"new"]


def test_each_topic_of_a_request_is_answered_on_its_own(
    broker: BrokerProcess, c: WireClient
) -> None:
    for name in ("a", "b"):
        assert c.create_topic(name) == 0
    assert delete(c, "nope", "a", "b", "..") == [("nope", 3), ("a", 0), ("b", 0), ("..", 3)]
    assert c.call("Metadata", topics=None)["topics"] == []
    assert list((broker.data_dir / "topics").iterdir()) == []


def test_the_admin_apis_are_listed_and_bounded(c: WireClient) -> None:
    apis = c.call("ApiVersions")["apis"]
    for api in ("DeleteTopics", "DescribeConfigs", "IncrementalAlterConfigs"):
        assert apis[api] == [1, 1]
    r = c.call("DeleteTopics", topics=[f"t{i}" for i in range(10_001)])
    assert r["error"] == ErrorCode.INVALID_REQUEST
    assert c.call("DeleteTopics", topics=["t", "t"])["error"] == ErrorCode.INVALID_REQUEST


def test_a_topic_holding_an_open_transaction_is_not_deleted(c: WireClient) -> None:
    assert c.create_topic("t", 2) == 0 and c.create_topic("u", 1) == 0
    assert c.produce("t", 1, values_batch([b"plain"]), acks=-1)["error"] == 0
    commit(c, "g", {("t", 1): 1})
    tx = Txn(c)
    assert tx.send("t", 0, [b"open"])["error"] == 0
    r = c.call("DeleteTopics", topics=["t"])["topics"][0]
    assert r["error"] == ErrorCode.CONCURRENT_TRANSACTIONS
    assert "'tx'" in r["message"] and "t-0" in r["message"]
    # Nothing changed: the records, the open transaction and the offsets are all there.
    assert values(c, "t", 1) == [b"plain"]
    assert values(c, "t", 0) == [b"open"]
    assert committed(c, "g") == {("t", 1): (1, 0)}
    assert tx.send("t", 0, [b"more"])["error"] == 0
    assert tx.end(committed=True)["error"] == 0
    assert delete(c, "t") == [("t", 0)]

    # Offsets of the topic pending in a transaction (whose data is elsewhere) hold it too.
    assert c.create_topic("t", 1) == 0
    tx = Txn(c, "tx2")
    assert tx.send("u", 0, [b"out"])["error"] == 0
    r = c.call(
        "TxnOffsetCommit",
        transactional_id=tx.id,
        producer_id=tx.pid,
        producer_epoch=tx.epoch,
        group_id="g",
        topics=[{"topic": "t", "partitions": [{"partition": 0, "offset": 0}]}],
    )
    assert r["error"] == 0, r
    r = c.call("DeleteTopics", topics=["t"])["topics"][0]
    assert r["error"] == ErrorCode.CONCURRENT_TRANSACTIONS and "'tx2'" in r["message"]
    assert tx.end(committed=False)["error"] == 0
    assert delete(c, "t") == [("t", 0)]


def test_a_long_polling_fetch_on_a_deleted_topic_is_answered_at_once(
    broker: BrokerProcess, c: WireClient
) -> None:
    assert c.create_topic("t") == 0
    with WireClient(broker.bootstrap, timeout_s=25) as waiting:
        started = time.monotonic()
        waiting.send(
            "Fetch",
            max_wait_ms=20_000,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            topics=[
                {
                    "topic": "t",
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}
                    ],
                }
            ],
        )
        # It long-polls: no answer while nothing changes (and so it has been read).
        waiting.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            waiting.recv()
        waiting.sock.settimeout(25)
        assert delete(c, "t") == [("t", 0)]
        answer = waiting.recv()
        assert answer["topics"][0]["partitions"][0]["error"] == 3
        assert time.monotonic() - started < 15


def test_a_group_drops_the_partitions_of_a_deleted_topic(c: WireClient) -> None:
    assert c.create_topic("t", 2) == 0 and c.create_topic("u", 1) == 0
    member = {"member_id": "", "member_epoch": 0}
    owned: list[dict[str, Any]] = []

    def beat() -> set[tuple[str, int]]:
        r = c.call(
            "ConsumerGroupHeartbeat",
            group_id="g",
            rebalance_timeout_ms=60_000,
            subscribed_topics=["t", "u"] if member["member_epoch"] == 0 else None,
            owned=owned,
            **member,
        )
        assert r["error"] == 0, r
        member.update(member_id=r["member_id"], member_epoch=r["member_epoch"])
        if r["assignment"] is not None:
            owned[:] = r["assignment"]
        return {(t["topic"], p) for t in owned for p in t["partitions"]}

    assert beat() == {("t", 0), ("t", 1), ("u", 0)}
    assert delete(c, "t") == [("t", 0)]
    assert beat() == {("u", 0)}
    assert beat() == {("u", 0)}  # it let go of the deleted partitions
    [group] = c.call("DescribeGroups", group_ids=["g"])["groups"]
    [described] = group["members"]
    assert described["assignment"] == [{"topic": "u", "partitions": [0]}]
    # Created again, it is assigned again.
    assert c.create_topic("t", 1) == 0
    assert beat() == {("t", 0), ("u", 0)}


# --------------------------------------------------------------------------- DescribeConfigs


def test_describe_configs_of_a_topic_and_of_the_broker(c: WireClient) -> None:
    assert c.create_topic("t", 1, {"retention.ms": 1000}) == 0
    topic, broker_ = describe(c, ("topic", "t"), ("broker", "0"))
    assert (topic["type"], topic["name"], topic["error"]) == ("topic", "t", 0)
    entries = {e["name"]: e for e in topic["configs"]}
    assert list(entries) == list(TOPIC_SETTINGS)
    assert entries["retention.ms"] == {
        "name": "retention.ms",
        "value": "1000",
        "source": "topic",
        "read_only": False,
        "sensitive": False,
    }
    assert (entries["segment.ms"]["value"], entries["segment.ms"]["source"]) == (
        "86400000",
        "broker",
    )
    assert (entries["segment.bytes"]["value"], entries["segment.bytes"]["source"]) == (
        str(SETTINGS["segment_bytes"].default),
        "default",
    )
    assert not any(e["read_only"] or e["sensitive"] for e in entries.values())

    assert (broker_["type"], broker_["name"], broker_["error"]) == ("broker", "0", 0)
    settings = {e["name"]: e for e in broker_["configs"]}
    assert list(settings) == list(SETTINGS)
    interval = settings["retention_check_interval_ms"]
    assert (interval["value"], interval["source"], interval["read_only"]) == ("50", "broker", True)
    level = settings["log_level"]  # reloadable: changes while the broker runs
    assert (level["value"], level["source"], level["read_only"]) == ("info", "default", False)
    assert settings["auto_create_topics"]["value"] == "true"
    assert settings["port"]["source"] == "broker"  # the harness picks the port
    # Only what the settings table marks sensitive is hidden: its value is nil.
    hidden = {name for name, e in settings.items() if e["value"] is None}
    assert hidden == {name for name, e in settings.items() if e["sensitive"]}
    assert hidden == {name for name, s in SETTINGS.items() if s.sensitive}
    assert "metrics_basic_auth_users" in hidden


def test_describe_configs_answers_each_resource(c: WireClient) -> None:
    assert c.create_topic("t") == 0
    results = describe(c, ("topic", "nope"), ("broker", "1"), ("topic", "t"))
    assert [(r["name"], r["error"], r["configs"]) for r in results[:2]] == [
        ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []),
        ("1", ErrorCode.INVALID_REQUEST, []),
    ]
    assert results[2]["error"] == 0 and results[2]["configs"]
    # A resource type the contract does not name is a mistyped field (section 1).
    r = c.call("DescribeConfigs", resources=[{"type": "group", "name": "g"}])
    assert r["error"] == ErrorCode.INVALID_REQUEST and "type" in r["message"]


# ---------------------------------------------------------------- IncrementalAlterConfigs


def test_alter_sets_and_deletes_overrides_durably(broker: BrokerProcess, c: WireClient) -> None:
    assert c.create_topic("t", 2, {"segment.ms": 3_600_000}) == 0
    assert alter(c, "t", ("retention.ms", "set", "5000"), ("segment.ms", "delete", None)) == (
        0,
        None,
    )
    assert alter(c, "t", ("retention_bytes", "set", "4096")) == (0, None)  # our name too
    assert alter(c, "t", ("index.interval.bytes", "delete", None)) == (0, None)  # none: no-op
    expected = {
        "retention.ms": ("5000", "topic"),
        "retention.bytes": ("4096", "topic"),
        "segment.ms": ("86400000", "broker"),
    }
    configs = topic_configs(c, "t")
    assert {k: configs[k] for k in expected} == expected
    broker.restart()  # kill -9: the change was durable before the answer
    with WireClient(broker.bootstrap) as again:
        assert topic_configs(again, "t") == configs


def test_a_refused_alteration_changes_nothing(c: WireClient) -> None:
    assert c.create_topic("t", 1, {"retention.ms": 1000}) == 0
    before = topic_configs(c, "t")
    valid = ("retention.bytes", "set", "4096")
    for bad, code, needle in [
        (("cleanup.policy", "set", "compact"), ErrorCode.INVALID_CONFIG, "cleanup.policy"),
        (("segment.bytes", "set", "100"), ErrorCode.INVALID_CONFIG, "segment.bytes"),
        (("retention.ms", "set", "soon"), ErrorCode.INVALID_CONFIG, "retention.ms"),
        (("retention.ms", "set", "1.5"), ErrorCode.INVALID_CONFIG, "retention.ms"),
        (("segment.ms", "set", None), ErrorCode.INVALID_CONFIG, "segment.ms"),
        (("nonsense", "delete", None), ErrorCode.INVALID_CONFIG, "nonsense"),
        (("retention_bytes", "delete", None), ErrorCode.INVALID_REQUEST, "retention_bytes"),
    ]:
        error, message = alter(c, "t", valid, bad)
        assert error == code and message is not None and needle in message, (bad, message)
        assert topic_configs(c, "t") == before
    assert alter(c, "t", valid, validate_only=True) == (0, None)
    assert topic_configs(c, "t") == before
    assert alter(c, "nope", valid)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # Only topics are altered: another resource type is a mistyped field (section 1).
    r = c.call(
        "IncrementalAlterConfigs",
        resources=[{"type": "broker", "name": "0", "ops": []}],
        validate_only=False,
    )
    assert r["error"] == ErrorCode.INVALID_REQUEST


def test_lowered_retention_deletes_old_segments_at_the_next_run(
    broker: BrokerProcess, c: WireClient
) -> None:
    config = {"segment.bytes": 1024, "retention.ms": -1, "retention.bytes": -1}
    assert c.create_topic("t", 1, config) == 0
    sent = [f"record-{i:03}".encode() * 20 for i in range(40)]
    for value in sent:
        assert c.produce("t", 0, values_batch([value], timestamp_ms=OLD_MS), acks=-1)["error"] == 0
    segments = len(segment_files(broker, "t", 0))
    assert segments > 10 and earliest(c, "t", 0) == 0
    assert alter(c, "t", ("retention.bytes", "set", "4096")) == (0, None)
    wait_for(lambda: len(segment_files(broker, "t", 0)) < segments)
    start = earliest(c, "t", 0)
    assert start > 0 and values(c, "t", 0) == sent[start:]
    assert alter(c, "t", ("retention.ms", "set", "60000")) == (0, None)
    # Every record is older than a minute: all but the active segment go.
    wait_for(lambda: len(segment_files(broker, "t", 0)) == 1)
    assert values(c, "t", 0) == sent[earliest(c, "t", 0) :]


def test_a_new_segment_size_applies_from_the_next_roll(
    broker: BrokerProcess, c: WireClient
) -> None:
    assert c.create_topic("t", 1, {"retention.ms": -1}) == 0
    for _ in range(5):
        assert c.produce("t", 0, values_batch([b"x" * 300]), acks=-1)["error"] == 0
    assert len(segment_files(broker, "t", 0)) == 1
    assert alter(c, "t", ("segment.bytes", "set", "1024")) == (0, None)
    for _ in range(5):
        assert c.produce("t", 0, values_batch([b"y" * 300]), acks=-1)["error"] == 0
    assert len(segment_files(broker, "t", 0)) > 2
    assert values(c, "t", 0) == [b"x" * 300] * 5 + [b"y" * 300] * 5
