"""Committed offsets against the real broker process, over the raw wire (docs/protocol.md
section 6): OffsetCommit, OffsetFetch and TxnOffsetCommit, on both backends.

Each test asserts on what OffsetFetch answers: which offset and metadata a group
holds per partition, across a clean restart and a kill -9, inside and after a
transaction, past retention, and at the caps. Most commits come from outside any
group (member_id "", member_epoch -1); one test joins a member with
ConsumerGroupHeartbeat and checks who may commit for its group.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.broker_process import BrokerProcess
from harness.txn import Txn
from harness.wire import WireClient, values_batch
from protocol.errors import ErrorCode
from tests.reliability.conftest import config_file

GROUP = "g"


@pytest.fixture
def c(broker: BrokerProcess) -> Iterator[WireClient]:
    with WireClient(broker.bootstrap) as client:
        assert client.create_topic("t", 3) == 0
        yield client


def commit(
    c: WireClient, offsets: dict[tuple[str, int], int], group: str = GROUP, **fields: Any
) -> dict[tuple[str, int], int]:
    """OffsetCommit (metadata "m<offset>"); the error of each partition."""
    r = c.call("OffsetCommit", group_id=group, topics=commit_topics(offsets, "m"), **fields)
    return errors_of(r)


def txn_commit(
    tx: Txn, offsets: dict[tuple[str, int], int], group: str = GROUP
) -> dict[tuple[str, int], int]:
    """TxnOffsetCommit with the transactional producer's ids; the error of each partition."""
    r = tx.c.call(
        "TxnOffsetCommit",
        transactional_id=tx.id,
        producer_id=tx.pid,
        producer_epoch=tx.epoch,
        group_id=group,
        topics=commit_topics(offsets, None),
    )
    return errors_of(r)


def commit_topics(offsets: dict[tuple[str, int], int], metadata: str | None) -> list[dict]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        meta = None if metadata is None else f"{metadata}{offset}"
        topics.setdefault(topic, []).append(
            {"partition": partition, "offset": offset, "metadata": meta}
        )
    return [{"topic": t, "partitions": ps} for t, ps in topics.items()]


def errors_of(response: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {
        (t["topic"], p["partition"]): p["error"]
        for t in response["topics"]
        for p in t["partitions"]
    }


def fetch(
    c: WireClient,
    partitions: list[tuple[str, int]] | None = None,
    group: str = GROUP,
    require_stable: bool = False,
) -> dict[tuple[str, int], tuple[int, Any, int]]:
    """OffsetFetch: (offset, metadata, error) per partition."""
    topics = None
    if partitions is not None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        topics = [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]
    r = c.call("OffsetFetch", group_id=group, topics=topics, require_stable=require_stable)
    assert r["error"] == 0, r
    return {
        (t["topic"], p["partition"]): (p["offset"], p["metadata"], p["error"])
        for t in r["topics"]
        for p in t["partitions"]
    }


def offsets(c: WireClient, group: str = GROUP) -> dict[tuple[str, int], int]:
    return {key: offset for key, (offset, _, _) in fetch(c, group=group).items()}


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# --------------------------------------------------------------------------- OffsetCommit


def test_commit_and_fetch_round_trip(c: WireClient) -> None:
    assert commit(c, {("t", 0): 5, ("t", 2): 9}) == {("t", 0): 0, ("t", 2): 0}
    assert commit(c, {("t", 0): 7}) == {("t", 0): 0}
    assert fetch(c, [("t", 0), ("t", 1), ("t", 2)]) == {
        ("t", 0): (7, "m7", 0),
        ("t", 1): (-1, None, 0),
        ("t", 2): (9, "m9", 0),
    }
    # Nil topics: every partition the group holds.
    assert fetch(c) == {("t", 0): (7, "m7", 0), ("t", 2): (9, "m9", 0)}
    # Metadata: none, empty and the declared maximum of 4096 characters round trip.
    long = "x" * 4096
    r = c.call(
        "OffsetCommit",
        group_id=GROUP,
        topics=[
            {
                "topic": "t",
                "partitions": [
                    {"partition": 0, "offset": 1, "metadata": None},
                    {"partition": 1, "offset": 2, "metadata": ""},
                    {"partition": 2, "offset": 3, "metadata": long},
                ],
            }
        ],
    )
    assert set(errors_of(r).values()) == {0}
    assert fetch(c) == {("t", 0): (1, None, 0), ("t", 1): (2, "", 0), ("t", 2): (3, long, 0)}
    too_long = c.call(
        "OffsetCommit",
        group_id=GROUP,
        topics=[
            {"topic": "t", "partitions": [{"partition": 0, "offset": 1, "metadata": long + "x"}]}
        ],
    )
    assert too_long["error"] == ErrorCode.INVALID_REQUEST, too_long
    # Groups are apart; an unknown group holds nothing.
    assert offsets(c, "other") == {}
    assert fetch(c, [("t", 0)], group="other") == {("t", 0): (-1, None, 0)}


def test_unknown_partitions_are_refused_one_by_one(c: WireClient) -> None:
    assert commit(c, {("t", 0): 1, ("t", 3): 1, ("nope", 0): 1}) == {
        ("t", 0): 0,
        ("t", 3): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert offsets(c) == {("t", 0): 1}
    got = fetch(c, [("t", 3), ("nope", 0)])
    assert {k: e for k, (_, _, e) in got.items()} == {
        ("t", 3): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }


def test_a_member_of_a_group_without_members_is_unknown(c: WireClient) -> None:
    refused = commit(c, {("t", 0): 4}, member_id="m-1", member_epoch=3)
    assert refused == {("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert commit(c, {("t", 0): 4}, member_id="", member_epoch=0) == {
        ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID
    }
    assert offsets(c) == {}


def test_only_the_current_member_epoch_commits_for_a_group_with_members(c: WireClient) -> None:
    joined = c.call(
        "ConsumerGroupHeartbeat",
        group_id=GROUP,
        member_id="",
        member_epoch=0,
        rebalance_timeout_ms=60_000,
        subscribed_topics=["t"],
    )
    assert joined["error"] == 0
    member, epoch = joined["member_id"], joined["member_epoch"]
    assert commit(c, {("t", 0): 5}, member_id=member, member_epoch=epoch) == {("t", 0): 0}
    # Kafka's validateMemberEpoch: a newer epoch is fenced, an older one stale.
    assert commit(c, {("t", 0): 6}, member_id=member, member_epoch=epoch + 1) == {
        ("t", 0): ErrorCode.FENCED_MEMBER_EPOCH
    }
    assert commit(c, {("t", 0): 7}, member_id=member, member_epoch=epoch - 1) == {
        ("t", 0): ErrorCode.STALE_MEMBER_EPOCH
    }
    # From outside the group, or as a stranger, while it has a member: refused.
    assert commit(c, {("t", 0): 8}) == {("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert commit(c, {("t", 0): 9}, member_id="stranger", member_epoch=epoch) == {
        ("t", 0): ErrorCode.UNKNOWN_MEMBER_ID
    }
    tx = Txn(c)
    r = tx.c.call(
        "TxnOffsetCommit",
        transactional_id=tx.id,
        producer_id=tx.pid,
        producer_epoch=tx.epoch,
        group_id=GROUP,
        member_id=member,
        member_epoch=epoch + 1,
        topics=commit_topics({("t", 1): 3}, None),
    )
    assert errors_of(r) == {("t", 1): ErrorCode.FENCED_MEMBER_EPOCH}
    assert tx.end(committed=True)["error"] == 0
    assert offsets(c) == {("t", 0): 5}
    # Once the member leaves, the group takes commits from outside again.
    left = c.call(
        "ConsumerGroupHeartbeat",
        group_id=GROUP,
        member_id=member,
        member_epoch=-1,
        rebalance_timeout_ms=60_000,
    )
    assert left["error"] == 0
    assert commit(c, {("t", 0): 10}) == {("t", 0): 0}
    assert offsets(c) == {("t", 0): 10}


def test_restart_and_kill_keep_every_answered_commit(tmp_path: Path, backend: str) -> None:
    broker = BrokerProcess(tmp_path / "data", backend=backend).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 3) == 0
            assert commit(c, {("t", 0): 10, ("t", 1): 11}) == {("t", 0): 0, ("t", 1): 0}
            assert commit(c, {("t", 0): 12}, group="h") == {("t", 0): 0}
        broker.restart(kill=False)
        with WireClient(broker.bootstrap) as c:
            assert offsets(c) == {("t", 0): 10, ("t", 1): 11}
            assert fetch(c, [("t", 1)]) == {("t", 1): (11, "m11", 0)}
            assert commit(c, {("t", 1): 20, ("t", 2): 21}) == {("t", 1): 0, ("t", 2): 0}
        # kill -9 right after the answer: the commit was durable before it.
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            assert offsets(c) == {("t", 0): 10, ("t", 1): 20, ("t", 2): 21}
            assert offsets(c, "h") == {("t", 0): 12}
    finally:
        broker.kill()


def test_the_log_is_compacted_and_replays_the_same(tmp_path: Path, backend: str) -> None:
    config = "offsets_log_max_bytes = 4096\noffsets_retention_check_interval_ms = 50\n"
    broker = BrokerProcess(
        tmp_path / "data", backend=backend, extra_args=config_file(tmp_path, config)
    ).start()
    wal = tmp_path / "data" / "groups" / "offsets.wal"
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 3) == 0
            tx = Txn(c)
            assert txn_commit(tx, {("t", 2): 99}, group="g0") == {("t", 2): 0}
            for i in range(300):
                assert commit(c, {("t", i % 3): i}, group=f"g{i % 2}") == {("t", i % 3): 0}
            expected = {g: offsets(c, g) for g in ("g0", "g1")}
            # 300 commit records are far more than 4096 bytes: the sweep compacts the
            # file (maybe while they are written; what follows is appended to it, and
            # compacted again once past 4096 bytes).
            wait_for(lambda: "event=record_log_compacted" in broker.log_text())
            wait_for(lambda: wal.stat().st_size <= 4096)
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            assert {g: offsets(c, g) for g in ("g0", "g1")} == expected
            # The pending offset survived compaction too.
            assert fetch(c, [("t", 2)], group="g0", require_stable=True) == {
                ("t", 2): (-1, None, ErrorCode.UNSTABLE_OFFSET_COMMIT)
            }
            tx.c = c
            assert tx.end(committed=True)["error"] == 0
            assert offsets(c, "g0")[("t", 2)] == 99
    finally:
        broker.kill()


# --------------------------------------------------------------------------- transactions


def test_txn_offsets_are_visible_only_once_the_transaction_commits(c: WireClient) -> None:
    assert commit(c, {("t", 0): 3}) == {("t", 0): 0}
    tx = Txn(c)
    assert tx.send("t", 1, [b"out"])["error"] == 0
    assert txn_commit(tx, {("t", 0): 8, ("t", 2): 6}) == {("t", 0): 0, ("t", 2): 0}
    [listing] = c.call("ListTransactions")["transactions"]
    assert listing["state"] == "ONGOING"
    # Without require_stable: the last committed offsets; with it, 88 where pending.
    assert fetch(c) == {("t", 0): (3, "m3", 0)}
    assert fetch(c, [("t", 0), ("t", 1), ("t", 2)], require_stable=True) == {
        ("t", 0): (-1, None, ErrorCode.UNSTABLE_OFFSET_COMMIT),
        ("t", 1): (-1, None, 0),
        ("t", 2): (-1, None, ErrorCode.UNSTABLE_OFFSET_COMMIT),
    }
    assert {k: e for k, (_, _, e) in fetch(c, require_stable=True).items()} == {
        ("t", 0): ErrorCode.UNSTABLE_OFFSET_COMMIT,
        ("t", 2): ErrorCode.UNSTABLE_OFFSET_COMMIT,
    }
    assert tx.end(committed=True)["error"] == 0
    assert fetch(c, require_stable=True) == {("t", 0): (8, None, 0), ("t", 2): (6, None, 0)}


def test_txn_offsets_of_an_aborted_transaction_are_dropped(c: WireClient) -> None:
    assert commit(c, {("t", 0): 3}) == {("t", 0): 0}
    tx = Txn(c)
    # Offsets alone start a transaction.
    assert txn_commit(tx, {("t", 0): 8, ("t", 1): 1}) == {("t", 0): 0, ("t", 1): 0}
    assert txn_commit(tx, {("t", 0): 9}, group="h") == {("t", 0): 0}
    assert tx.end(committed=False)["error"] == 0
    assert fetch(c, require_stable=True) == {("t", 0): (3, "m3", 0)}
    assert offsets(c, "h") == {}
    # The next transaction of the same producer commits its own offsets only.
    assert txn_commit(tx, {("t", 1): 2}) == {("t", 1): 0}
    assert tx.end(committed=True)["error"] == 0
    assert offsets(c) == {("t", 0): 3, ("t", 1): 2}


def test_a_fenced_producer_cannot_commit_offsets(c: WireClient) -> None:
    tx = Txn(c)
    ended_pid, ended_epoch = tx.pid, tx.epoch
    assert tx.end(committed=True)["error"] == 0
    late = Txn.__new__(Txn)
    late.c, late.id, late.pid, late.epoch = c, tx.id, ended_pid, ended_epoch
    # The epoch of an ended transaction: fenced by the end's bump.
    assert txn_commit(late, {("t", 0): 1}) == {("t", 0): ErrorCode.INVALID_PRODUCER_EPOCH}
    zombie_pid, zombie_epoch = tx.pid, tx.epoch
    Txn(c)  # a new instance of the same transactional id
    late.pid, late.epoch = zombie_pid, zombie_epoch
    assert txn_commit(late, {("t", 0): 2}) == {("t", 0): ErrorCode.PRODUCER_FENCED}
    late.id = "never-initialised"
    assert txn_commit(late, {("t", 0): 3}) == {("t", 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING}
    assert fetch(c, [("t", 0)], require_stable=True) == {("t", 0): (-1, None, 0)}
    # A prepared transaction takes no more offsets.
    prepared = Txn(c, "prepared")
    assert prepared.send("t", 1, [b"x"])["error"] == 0
    assert prepared.prepare()["error"] == 0
    assert txn_commit(prepared, {("t", 1): 1}) == {("t", 1): ErrorCode.INVALID_TXN_STATE}


# --------------------------------------------------------------------------- limits


def test_retention_expires_offsets_of_a_group_without_members(tmp_path: Path, backend: str) -> None:
    config = "offsets_retention_ms = 1500\noffsets_retention_check_interval_ms = 50\n"
    broker = BrokerProcess(
        tmp_path / "data", backend=backend, extra_args=config_file(tmp_path, config)
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 2) == 0
            started = time.monotonic()
            assert commit(c, {("t", 0): 1, ("t", 1): 1}) == {("t", 0): 0, ("t", 1): 0}
            # A partition an open transaction holds keeps its committed offset.
            tx = Txn(c)
            assert txn_commit(tx, {("t", 1): 5}) == {("t", 1): 0}
            wait_for(lambda: offsets(c) == {("t", 1): 1})
            assert time.monotonic() - started >= 1.5
            assert tx.end(committed=True)["error"] == 0
            assert offsets(c) == {("t", 1): 5}
            wait_for(lambda: offsets(c) == {})
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            assert offsets(c) == {}
    finally:
        broker.kill()


def test_caps_on_groups_per_transaction_and_offsets_held(tmp_path: Path, backend: str) -> None:
    config = "max_committed_offsets = 4\nmax_partitions_per_transaction = 2\n"
    broker = BrokerProcess(
        tmp_path / "data", backend=backend, extra_args=config_file(tmp_path, config)
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 3) == 0
            # Groups count against max_partitions_per_transaction with the partitions.
            tx = Txn(c)
            assert tx.send("t", 0, [b"a"])["error"] == 0
            assert txn_commit(tx, {("t", 0): 9}) == {("t", 0): 0}
            assert txn_commit(tx, {("t", 0): 9}, group="h") == {
                ("t", 0): ErrorCode.INVALID_TXN_STATE
            }
            assert tx.send("t", 1, [b"b"])["error"] == ErrorCode.INVALID_TXN_STATE
            assert tx.end(committed=True)["error"] == 0
            assert offsets(c) == {("t", 0): 9} and offsets(c, "h") == {}
            # Four offsets held in all, pending ones included.
            assert commit(c, {("t", 1): 1}) == {("t", 1): 0}
            assert commit(c, {("t", 0): 1, ("t", 1): 2, ("t", 2): 3}, group="h") == {
                ("t", 0): 0,
                ("t", 1): 0,
                ("t", 2): ErrorCode.POLICY_VIOLATION,
            }
            # At the cap, offsets already held still move; new ones do not.
            assert commit(c, {("t", 0): 7, ("t", 1): 8}) == {("t", 0): 0, ("t", 1): 0}
            assert txn_commit(tx, {("t", 2): 1}) == {("t", 2): ErrorCode.POLICY_VIOLATION}
            assert offsets(c) == {("t", 0): 7, ("t", 1): 8}
            assert offsets(c, "h") == {("t", 0): 1, ("t", 1): 2}
    finally:
        broker.kill()


# --------------------------------------------------------------------------- metrics


def test_lag_and_counts_are_on_metrics(tmp_path: Path, backend: str) -> None:
    broker = BrokerProcess(tmp_path / "data", backend=backend).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 2) == 0
            values = [b"%d" % i for i in range(10)]
            assert c.produce("t", 0, values_batch(values), acks=-1)["error"] == 0
            assert commit(c, {("t", 0): 4, ("t", 1): 0}) == {("t", 0): 0, ("t", 1): 0}
            tx = Txn(c)
            assert txn_commit(tx, {("t", 0): 6}, group="h") == {("t", 0): 0}
        samples = scrape(broker)
        lag = {
            labels: v
            for (name, labels), v in samples.items()
            if name == "minibroker_consumer_group_lag"
        }
        assert lag == {
            (("group", GROUP), ("partition", "0"), ("topic", "t")): 6,
            (("group", GROUP), ("partition", "1"), ("topic", "t")): 0,
        }
        assert samples[("minibroker_consumer_group_committed_offsets", ())] == 2
        assert samples[("minibroker_consumer_group_pending_offsets", ())] == 1
        assert samples[("minibroker_consumer_groups_with_offsets", ())] == 2
        commits = (("api", "OffsetCommit"),)
        assert samples[("minibroker_offset_commits_total", commits)] == 2
    finally:
        broker.kill()


def scrape(broker: BrokerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
