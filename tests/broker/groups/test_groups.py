"""Consumer-group membership against the real broker process, over the raw wire
(docs/protocol.md section 6): joins, reconciliation, leaves, expiry, fencing,
static membership, ListGroups, DescribeGroups and the caps, on both backends.

Members here are plain heartbeat loops that consume exactly what they were last
told; after every single heartbeat the test checks that no partition is owned by
two members, on the members' side and in the broker's DescribeGroups.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.broker_process import BrokerProcess
from harness.txn import Txn
from harness.wire import WireClient
from protocol.errors import ErrorCode
from tests.reliability.conftest import config_file

DEADLINE_S = 30.0
REBALANCE_TIMEOUT_MS = 60_000


def start(tmp_path: Path, backend: str, settings: str = "") -> BrokerProcess:
    return BrokerProcess(
        tmp_path / "data", backend=backend, extra_args=config_file(tmp_path, settings)
    ).start()


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    proc = start(tmp_path, backend, "group_max_size = 4\nmax_groups = 3\n")
    try:
        yield proc
    finally:
        proc.kill()


class Member:
    """One consumer: its id and epoch, and the partitions of `t` it consumes."""

    def __init__(
        self,
        c: WireClient,
        group: str = "g",
        client_id: str = "test",
        instance_id: str | None = None,
    ) -> None:
        self.c = c
        self.group = group
        self.client_id = client_id
        self.instance_id = instance_id
        self.member_id = ""
        self.epoch = 0
        self.owned: set[int] = set()
        self.told: set[int] = set()

    def beat(self, *, release: bool = True, **fields: Any) -> dict[str, Any]:
        """One heartbeat reporting what it consumes; `release=False` keeps partitions it
        was told to give up (its revocation is still running)."""
        if release:
            self.owned &= self.told
        request = {
            "group_id": self.group,
            "member_id": self.member_id,
            "member_epoch": self.epoch,
            "rebalance_timeout_ms": REBALANCE_TIMEOUT_MS,
            "subscribed_topics": ["t"] if self.epoch == 0 else None,
            "owned": [{"topic": "t", "partitions": sorted(self.owned)}],
            "client_id": self.client_id,
            **({} if self.instance_id is None else {"instance_id": self.instance_id}),
            **fields,
        }
        r = self.c.call("ConsumerGroupHeartbeat", **request)
        if r["error"] == ErrorCode.NONE and request["member_epoch"] >= 0:
            self.member_id, self.epoch = r["member_id"], r["member_epoch"]
            if r["assignment"] is not None:
                self.told = {p for t in r["assignment"] for p in t["partitions"]}
                self.owned |= self.told
        return r

    def join(self) -> Member:
        r = self.beat()
        assert r["error"] == 0 and r["member_id"] and r["heartbeat_interval_ms"] > 0, r
        return self


def describe(c: WireClient, *groups: str) -> list[dict[str, Any]]:
    r = c.call("DescribeGroups", group_ids=list(groups))
    assert r["error"] == 0, r
    return list(r["groups"])


def held(c: WireClient, group: str = "g") -> dict[str, set[int]]:
    """What the broker counts as each member's."""
    (g,) = describe(c, group)
    return {
        mb["member_id"]: {p for t in mb["assignment"] for p in t["partitions"]}
        for mb in g["members"]
    }


def state(c: WireClient, group: str = "g") -> str:
    return str(describe(c, group)[0]["state"])


def assert_one_owner(c: WireClient, members: list[Member]) -> None:
    seen: dict[int, str] = {}
    for mb in members:
        for p in mb.owned:
            assert p not in seen, f"partition {p} consumed by {seen[p]} and {mb.member_id}"
            seen[p] = mb.member_id
    broker = held(c, members[0].group)
    broker_seen: dict[int, str] = {}
    for member_id, partitions in broker.items():
        for p in partitions:
            assert p not in broker_seen, f"the broker gives {p} to two members"
            broker_seen[p] = member_id
    for mb in members:
        assert mb.owned <= broker[mb.member_id], (mb.member_id, mb.owned)


def converge(c: WireClient, members: list[Member]) -> None:
    """Heartbeat round after round until the group is STABLE, checking after each one."""
    group = members[0].group
    deadline = time.monotonic() + DEADLINE_S
    while state(c, group) != "STABLE":
        assert time.monotonic() < deadline, held(c, group)
        for mb in members:
            assert mb.beat()["error"] == 0
            assert_one_owner(c, members)
    for mb in members:
        assert mb.beat()["error"] == 0  # an answer with nothing new
        assert mb.owned == mb.told == held(c, group)[mb.member_id]


def test_members_share_a_topic_and_partitions_move_only_when_let_go(
    broker: BrokerProcess,
) -> None:
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", 6) == 0
        a, b, cc = (Member(c).join() for _ in range(3))
        members = [a, b, cc]
        assert_one_owner(c, members)
        converge(c, members)
        assert sorted(len(mb.owned) for mb in members) == [2, 2, 2]
        assert set().union(*(mb.owned for mb in members)) == set(range(6))
        epoch = describe(c, "g")[0]["group_epoch"]
        assert epoch == 3 and all(mb.epoch == 3 for mb in members)

        # A fourth joins: everything is held, so it gets nothing yet.
        d = Member(c).join()
        assert d.told == set() and d.epoch == 4
        members.append(d)
        # Quotas are now 2, 2, 1, 1: one owner is told to give a partition up, and
        # keeps it for now.
        revoked: dict[str, set[int]] = {}
        for mb in (a, b, cc):
            before = set(mb.owned)
            r = mb.beat(release=False)
            assert r["error"] == 0
            if mb.told != before:
                revoked[mb.member_id] = before - mb.told
                assert mb.epoch == 3  # behind the group until it lets go
            assert_one_owner(c, members)
        assert [len(p) for p in revoked.values()] == [1]
        assert d.beat()["error"] == 0 and d.told == set()
        assert held(c)[d.member_id] == set()
        # The partition goes to d only after its owner's heartbeat no longer lists it.
        (donor,) = (mb for mb in (a, b, cc) if mb.member_id in revoked)
        assert donor.beat()["error"] == 0 and donor.epoch == 4
        assert_one_owner(c, members)
        assert d.beat()["error"] == 0 and d.told == revoked[donor.member_id]
        assert_one_owner(c, members)
        converge(c, members)
        assert sorted(len(mb.owned) for mb in members) == [1, 1, 2, 2]

        # One leaves: its partitions are free at once.
        r = a.beat(member_epoch=-1)
        assert (r["error"], r["member_epoch"]) == (0, -1)
        members.remove(a)
        assert a.member_id not in held(c)
        converge(c, members)
        assert sorted(len(mb.owned) for mb in members) == [2, 2, 2]
        assert set().union(*(mb.owned for mb in members)) == set(range(6))


def test_a_silent_member_is_removed_after_the_session_timeout(tmp_path: Path, backend: str) -> None:
    proc = start(
        tmp_path,
        backend,
        "group_session_timeout_ms = 2000\ngroup_heartbeat_interval_ms = 100\n",
    )
    try:
        with WireClient(proc.bootstrap) as c:
            assert c.create_topic("t", 6) == 0
            a, b = Member(c).join(), Member(c).join()
            assert a.beat()["heartbeat_interval_ms"] == 100
            converge(c, [a, b])
            assert len(b.owned) == 3
            # a stops heartbeating; b carries on and is given a's partitions.
            deadline = time.monotonic() + DEADLINE_S
            while len(b.told) < 6:
                assert time.monotonic() < deadline, held(c)
                assert b.beat()["error"] == 0
                assert_one_owner(c, [b])
                time.sleep(0.1)
            assert set(held(c)) == {b.member_id}
            assert a.beat()["error"] == ErrorCode.UNKNOWN_MEMBER_ID
            assert proc.log_shows(f"event=group_member_expired group='g' member={a.member_id}")
    finally:
        proc.kill()


def test_fencing_codes(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", 2) == 0
        a = Member(c).join()
        assert a.epoch == 1

        def code(**fields: Any) -> int:
            request = {
                "group_id": "g",
                "member_id": a.member_id,
                "member_epoch": 1,
                "rebalance_timeout_ms": 1000,
                **fields,
            }
            return int(c.call("ConsumerGroupHeartbeat", **request)["error"])

        assert code(member_epoch=2) == ErrorCode.FENCED_MEMBER_EPOCH
        assert code(member_epoch=-7) == ErrorCode.FENCED_MEMBER_EPOCH
        assert code(member_id="nobody") == ErrorCode.UNKNOWN_MEMBER_ID
        assert code(member_id="", member_epoch=1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert code(group_id="other") == ErrorCode.UNKNOWN_MEMBER_ID
        assert code(member_id="", member_epoch=0) == ErrorCode.INVALID_REQUEST  # no topics
        assert code(rebalance_timeout_ms=1_800_001) == ErrorCode.INVALID_REQUEST
        assert code(rebalance_timeout_ms=-1) == ErrorCode.INVALID_REQUEST
        assert code(instance_id="") == ErrorCode.INVALID_REQUEST
        assert code(instance_id="x" * 256) == ErrorCode.INVALID_REQUEST
        assert code(instance_id="i-1") == ErrorCode.INVALID_REQUEST  # a joined as dynamic
        assert code(member_id="nobody", instance_id="i-1") == ErrorCode.UNKNOWN_MEMBER_ID
        assert code() == ErrorCode.NONE
        assert describe(c, "g")[0]["members"][0]["member_epoch"] == 1


def commit(c: WireClient, member: Member, **txn: Any) -> dict[str, Any]:
    """An OffsetCommit (or, given a producer's fields, a TxnOffsetCommit) of partition 0 as
    `member` at its epoch."""
    return c.call(
        "TxnOffsetCommit" if txn else "OffsetCommit",
        group_id=member.group,
        member_id=member.member_id,
        member_epoch=member.epoch,
        topics=[{"topic": "t", "partitions": [{"partition": 0, "offset": 1}]}],
        **txn,
    )


def test_a_restarted_static_member_takes_over_at_once_and_the_old_one_is_fenced(
    broker: BrokerProcess,
) -> None:
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", 4) == 0
        a, b = Member(c, instance_id="i-a").join(), Member(c).join()
        converge(c, [a, b])
        (g,) = describe(c, "g")
        assert {mb["member_id"]: mb["instance_id"] for mb in g["members"]} == {
            a.member_id: "i-a",
            b.member_id: None,
        }
        # "a" restarts (its process is paused, not even dead): the new one owns nothing and
        # is given a's partitions in its join's answer, and b notices nothing.
        a2 = Member(c, instance_id="i-a").join()
        assert a2.member_id != a.member_id and a2.told == a.owned
        assert describe(c, "g")[0]["group_epoch"] == g["group_epoch"]
        assert held(c) == {a2.member_id: a.owned, b.member_id: b.owned}
        assert b.beat()["assignment"] is None
        assert broker.log_shows(
            f"event=group_member_fenced group='g' member={a.member_id} instance='i-a' "
            f"replaced_by={a2.member_id}"
        )
        # The old member may have read on meanwhile; it can commit nothing more.
        fenced = a.beat()
        assert fenced["error"] == ErrorCode.FENCED_INSTANCE_ID and a2.member_id in fenced["message"]
        refused = commit(c, a)
        assert refused["error"] == ErrorCode.FENCED_INSTANCE_ID
        assert refused["topics"][0]["partitions"][0]["error"] == ErrorCode.FENCED_INSTANCE_ID
        txn = Txn(c, "old-a")
        in_txn = commit(
            c, a, transactional_id=txn.id, producer_id=txn.pid, producer_epoch=txn.epoch
        )
        assert in_txn["error"] == ErrorCode.FENCED_INSTANCE_ID
        assert commit(c, a2)["error"] == 0
        assert (
            c.call("OffsetFetch", group_id="g", topics=None)["topics"][0]["partitions"][0]["offset"]
            == 1
        )


def test_a_static_member_that_leaves_keeps_its_partitions_until_its_session_ends(
    tmp_path: Path, backend: str
) -> None:
    proc = start(
        tmp_path,
        backend,
        "group_session_timeout_ms = 3000\ngroup_heartbeat_interval_ms = 100\n",
    )
    try:
        with WireClient(proc.bootstrap) as c:
            assert c.create_topic("t", 4) == 0
            a, b = Member(c, instance_id="i-a").join(), Member(c).join()
            converge(c, [a, b])
            kept = set(a.owned)
            left = a.beat(member_epoch=-2)  # a clean close: it revoked everything first
            assert (left["error"], left["member_epoch"]) == (0, -2)
            assert proc.log_shows(f"event=group_member_departed group='g' member={a.member_id}")
            (g,) = describe(c, "g")
            by_id = {mb["member_id"]: mb for mb in g["members"]}
            assert by_id[a.member_id]["member_epoch"] == -2 and g["state"] == "STABLE"
            assert held(c)[a.member_id] == kept
            assert commit(c, a)["error"] == ErrorCode.FENCED_MEMBER_EPOCH  # it left
            # A restart within the session moves nothing: the same partitions, at once.
            assert b.beat()["assignment"] is None
            a2 = Member(c, instance_id="i-a").join()
            assert a2.told == kept and describe(c, "g")[0]["group_epoch"] == g["group_epoch"]
            # It leaves again and does not come back: its partitions go to b once its
            # session runs out, not before.
            left_at = time.monotonic()
            assert a2.beat(member_epoch=-2)["error"] == 0
            while len(b.told) < 4:
                assert time.monotonic() - left_at < DEADLINE_S, held(c)
                assert b.beat()["error"] == 0
                assert_one_owner(c, [b])
                time.sleep(0.1)
            assert time.monotonic() - left_at >= 2.9  # the session timeout, 3 s
            assert proc.log_shows(
                f"event=group_member_expired group='g' member={a2.member_id} reason=session_timeout"
            )
            assert set(held(c)) == {b.member_id}
    finally:
        proc.kill()


def test_membership_is_forgotten_by_a_restart_and_members_rejoin(tmp_path: Path) -> None:
    proc = start(tmp_path, "trio")
    try:
        with WireClient(proc.bootstrap) as c:
            assert c.create_topic("t", 2) == 0
            a = Member(c).join()
        proc.restart()
        with WireClient(proc.bootstrap) as c:
            assert c.call("ListGroups")["groups"] == []
            a.c = c
            assert a.beat()["error"] == ErrorCode.UNKNOWN_MEMBER_ID
            fresh = Member(c).join()
            assert fresh.told == {0, 1}
    finally:
        proc.kill()


def test_list_and_describe_groups(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", 3) == 0
        a = Member(c, "g1", client_id="svc-a").join()
        b = Member(c, "g1", client_id="svc-b").join()
        lone = Member(c, "g2").join()
        converge(c, [a, b])
        listed = c.call("ListGroups")["groups"]
        assert listed == [
            {"group_id": "g1", "state": "STABLE", "members": 2},
            {"group_id": "g2", "state": "STABLE", "members": 1},
        ]
        g1, g2, missing = describe(c, "g1", "g2", "nope")
        assert (g1["error"], g1["state"], g1["group_epoch"]) == (0, "STABLE", 2)
        by_id = {mb["member_id"]: mb for mb in g1["members"]}
        assert by_id[a.member_id]["client_id"] == "svc-a"
        assert by_id[b.member_id]["subscribed_topics"] == ["t"]
        assert by_id[b.member_id]["member_epoch"] == 2
        assert {
            mid: sorted(p for t in mb["assignment"] for p in t["partitions"])
            for mid, mb in by_id.items()
        } == {a.member_id: sorted(a.owned), b.member_id: sorted(b.owned)}
        assert g2["members"][0]["assignment"] == [{"topic": "t", "partitions": [0, 1, 2]}]
        assert (missing["error"], missing["state"]) == (ErrorCode.GROUP_ID_NOT_FOUND, "DEAD")
        assert broker.metrics_port
        with urllib.request.urlopen(
            f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10
        ) as r:
            body = r.read().decode()
        assert 'minibroker_group_members{group="g1"} 2.0' in body
        assert 'minibroker_group_state{group="g2",state="STABLE"} 1.0' in body
        # The last member leaves: the group is gone.
        assert lone.beat(member_epoch=-1)["error"] == 0
        assert [g["group_id"] for g in c.call("ListGroups")["groups"]] == ["g1"]
        assert describe(c, "g2")[0]["error"] == ErrorCode.GROUP_ID_NOT_FOUND


def test_caps_on_members_and_groups(broker: BrokerProcess) -> None:
    """The broker runs with group_max_size = 4 and max_groups = 3."""
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", 1) == 0
        for _ in range(4):
            Member(c, "big").join()
        r = Member(c, "big").beat()
        assert r["error"] == ErrorCode.GROUP_MAX_SIZE_REACHED and "group_max_size=4" in r["message"]
        second, third = Member(c, "g2").join(), Member(c, "g3").join()
        r = Member(c, "g4").beat()
        assert r["error"] == ErrorCode.POLICY_VIOLATION and "max_groups=3" in r["message"]
        assert second.beat(member_epoch=-1)["error"] == 0  # g2 empties and is dropped
        Member(c, "g4").join()
        assert [g["members"] for g in c.call("ListGroups")["groups"]] == [4, 1, 1]
        assert third.beat()["error"] == 0
