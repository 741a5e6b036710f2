"""The committed-offsets state without a broker: records, replay, markers, retention, the
count held against max_committed_offsets (broker/groups/offset_state.py), groups in a
transaction's entry (broker/transactions/state.py), the offsets log file
(broker/groups/offset_store.py on broker/storage/record_log.py), and the store's sweep
under a membership the test sets."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from broker.config import BrokerConfig
from broker.groups.offset_state import (
    Committed,
    OffsetState,
    OffsetStateError,
    Pending,
    commit_record,
    deleted_record,
    empty_record,
    empty_since,
    expire_record,
    markers_record,
    pending_record,
)
from broker.groups.offset_store import NoMembers, OffsetLog, OffsetLogError, OffsetStore
from broker.transactions.state import (
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    TxnEntry,
    completed,
    decided,
    initialized,
    with_group,
    with_partitions,
)
from protocol import messages as m
from protocol.errors import ErrorCode

DAY_MS = 24 * 3600 * 1000


def replayed(records: list[Any]) -> OffsetState:
    state = OffsetState()
    for record in records:
        state.apply(record)
    return state


def view(state: OffsetState) -> dict[str, Any]:
    """Everything the state holds, as plain values, to compare two states."""
    return {
        g: (
            group.empty_since_ms,
            dict(group.committed),
            {p: dict(o) for p, o in group.pending.items()},
            dict(group.pending_epochs),
        )
        for g, group in state.groups.items()
    }


def test_commits_replay_to_the_last_offset_per_partition_and_count_what_is_held() -> None:
    records = [
        commit_record("g", 100, 100, [(("t", 0), Pending(5, "m"))]),
        commit_record("g", 100, 200, [(("t", 0), Pending(7, None)), (("t", 1), Pending(1, ""))]),
        commit_record("h", None, 300, [(("t", 0), Pending(2, None))]),
    ]
    state = replayed(records)
    g = state.group("g")
    assert g is not None
    assert g.committed == {("t", 0): Committed(7, None, 200), ("t", 1): Committed(1, "", 200)}
    assert state.held == 3
    assert state.new_keys("g", [("t", 1), ("t", 2), ("t", 2)], -1) == 1
    assert state.new_keys("new", [("t", 1)], -1) == 1


def test_a_commit_marker_makes_pending_offsets_committed_and_an_abort_drops_them() -> None:
    state = replayed(
        [
            commit_record("g", 1, 1, [(("t", 0), Pending(3, None))]),
            pending_record(
                "g", 1, 42, 0, [(("t", 0), Pending(10, "a")), (("t", 1), Pending(4, None))]
            ),
            pending_record("g", 1, 43, 3, [(("t", 2), Pending(8, None))]),
        ]
    )
    g = state.group("g")
    assert g is not None
    assert state.held == 4 and g.is_pending(("t", 1)) and not g.is_pending(("t", 3))
    assert state.pending_owners() == {("g", 42, 0), ("g", 43, 3)}
    assert state.new_keys("g", [("t", 0), ("t", 1)], 42) == 0
    assert state.new_keys("g", [("t", 0)], 43) == 1
    state.apply(markers_record(500, [("g", 42, True), ("g", 43, False)]))
    assert g.committed == {("t", 0): Committed(10, "a", 500), ("t", 1): Committed(4, None, 500)}
    assert g.pending == {} and state.held == 2
    # A marker written twice (a retry after a storage failure) changes nothing.
    state.apply(markers_record(600, [("g", 42, True)]))
    assert g.committed[("t", 0)] == Committed(10, "a", 500)


def test_a_group_with_only_aborted_pending_offsets_is_forgotten() -> None:
    state = replayed(
        [
            pending_record("g", None, 7, 0, [(("t", 0), Pending(1, None))]),
            markers_record(10, [("g", 7, False)]),
        ]
    )
    assert state.groups == {} and state.held == 0


def test_offsets_expire_retention_after_the_later_of_commit_and_the_group_emptying() -> None:
    retention = 7 * DAY_MS
    state = replayed(
        [
            commit_record("g", None, 0, [(("t", 0), Pending(1, None))]),
            commit_record("g", None, 5 * DAY_MS, [(("t", 1), Pending(1, None))]),
        ]
    )
    # With members, nothing expires, however old.
    assert state.expired("g", 100 * DAY_MS, retention) == []
    # Emptied at day 3: (t, 0) goes at day 10, (t, 1) (committed at day 5) at day 12.
    state.apply(empty_record("g", 3 * DAY_MS))
    assert state.expired("g", 10 * DAY_MS - 1, retention) == []
    assert state.expired("g", 10 * DAY_MS, retention) == [("t", 0)]
    assert state.expired("g", 12 * DAY_MS, retention) == [("t", 0), ("t", 1)]
    # A partition an open transaction holds is kept.
    state.apply(pending_record("g", 3 * DAY_MS, 9, 0, [(("t", 1), Pending(2, None))]))
    assert state.expired("g", 12 * DAY_MS, retention) == [("t", 0)]
    state.apply(expire_record("g", [("t", 0)]))
    g = state.group("g")
    assert g is not None and list(g.committed) == [("t", 1)] and state.held == 2


def test_empty_since_follows_membership() -> None:
    assert empty_since(None, False, 50) == 50  # a new group of manual commits
    assert empty_since(None, True, 50) is None
    state = replayed([commit_record("g", 20, 20, [(("t", 0), Pending(1, None))])])
    g = state.group("g")
    assert empty_since(g, False, 50) == 20  # still empty: since the first look
    assert empty_since(g, True, 50) is None
    state.apply(empty_record("g", None))
    assert empty_since(g, False, 70) == 70  # its members left: empty from now


def test_a_snapshot_replays_to_the_same_state_and_count() -> None:
    state = replayed(
        [
            commit_record(
                "g", None, 1, [(("t", 0), Pending(3, "x")), (("u", 2), Pending(0, None))]
            ),
            pending_record("g", None, 5, 2, [(("t", 0), Pending(9, None))]),
            commit_record("h", 4, 4, [(("t", 1), Pending(8, None))]),
            # Written before pending records held the epoch: it stays unknown.
            ["pending", "h", 4, 6, [["t", 2, 7, None]]],
        ]
    )
    again = replayed(list(state.snapshot()))
    assert view(again) == view(state) and again.held == state.held == 5
    assert again.pending_owners() == {("g", 5, 2), ("h", 6, None)}
    # A "group" record replaces the group it names, count included.
    again.apply(
        next(iter(replayed([commit_record("g", 1, 1, [(("t", 0), Pending(1, None))])]).snapshot()))
    )
    assert again.held == 3


def test_a_marker_ends_the_pending_offsets_of_its_own_epoch_only() -> None:
    """A producer's transaction at epoch 4 wrote offsets; the ending of its transaction
    at epoch 3 (written again by recovery) must not commit them, and does not hold them;
    an epoch of None (recovery's orphans) holds them, and so does a legacy record's."""
    state = replayed([pending_record("g", None, 9, 4, [(("t", 0), Pending(20, None))])])
    assert not state.holds_pending("g", 9, 3)
    assert state.holds_pending("g", 9, 4) and state.holds_pending("g", 9, None)
    assert not state.holds_pending("g", 8, 4) and not state.holds_pending("h", 9, 4)
    legacy = replayed([["pending", "g", None, 9, [["t", 0, 20, None]]]])
    assert legacy.holds_pending("g", 9, 3) and legacy.pending_owners() == {("g", 9, None)}
    state.apply(markers_record(5, [("g", 9, True)]))
    assert state.pending_owners() == set() and state.group("g") is not None


def test_a_deleted_topic_leaves_every_group_committed_and_pending() -> None:
    records = [
        commit_record("g", 1, 1, [(("t", 0), Pending(3, None)), (("u", 0), Pending(1, None))]),
        commit_record("h", 1, 1, [(("t", 1), Pending(5, None))]),
        pending_record("g", 1, 42, 0, [(("t", 0), Pending(4, None)), (("u", 0), Pending(2, None))]),
        pending_record("g", 1, 43, 0, [(("t", 1), Pending(6, None))]),
    ]
    state = replayed(records)
    assert sorted(state.holds_topic("t")) == ["g", "h"] and state.holds_topic("v") == []
    assert sorted(state.pending_in("t")) == [("g", 42), ("g", 43)]
    assert state.pending_in("u") == [("g", 42)]
    state.apply(deleted_record("t"))
    g = state.group("g")
    assert g is not None and state.group("h") is None  # h held only offsets of t
    assert g.committed == {("u", 0): Committed(1, None, 1)}
    assert g.pending == {42: {("u", 0): Pending(2, None)}}  # 43 held only t's
    assert state.held == 2 and state.holds_topic("t") == []
    # Replayed, and written a second time (a deletion finished again after a crash).
    again = replayed([*records, deleted_record("t"), deleted_record("t")])
    assert view(again) == view(state) and again.held == state.held


@pytest.mark.parametrize(
    "record",
    [
        ["deleted", 7],
        ["deleted"],
        ["commit", "g", None, 1, [["t", 0, -1, None]]],
        ["commit", "g", None, 1, [["t", "0", 1, None]]],
        ["commit", "g", None, True, [["t", 0, 1, None]]],
        ["commit", 7, None, 1, [["t", 0, 1, None]]],
        ["pending", "g", None, 5, [["t", 0, 1, 3]]],
        ["markers", 1, [["g", 5, 1]]],
        ["expire", "g", [["t"]]],
        ["group", "g", None, [["t", 0, 1, None]], []],
        ["bogus"],
        [],
        "commit",
    ],
)
def test_a_malformed_record_is_refused_before_anything_changes(record: Any) -> None:
    state = replayed([commit_record("g", None, 1, [(("t", 0), Pending(3, None))])])
    before = view(state)
    with pytest.raises(OffsetStateError):
        state.apply(record)
    assert view(state) == before and state.held == 1


# ------------------------------------------------------------------ groups in a transaction


def test_a_transaction_holding_only_a_group_is_decided_then_completed() -> None:
    entry = initialized(None, "tx", 1, 0, 60_000, 0)
    ongoing = with_group(entry, "g", 10)
    assert (ongoing.state, ongoing.started_ms, ongoing.groups) == (ONGOING, 10, {"g"})
    both = with_partitions(with_group(ongoing, "h", 20), {("t", 0)}, 30)
    assert both.groups == {"g", "h"} and both.started_ms == 10
    ended = decided(both, True, (1, 1), 40)
    assert ended.state == PREPARE_COMMIT and ended.groups == {"g", "h"}
    done = completed(ended, 50)
    assert done.state == COMPLETE_COMMIT and done.groups == frozenset()
    # The next transaction starts with no group.
    assert with_partitions(done, {("t", 1)}, 60).groups == frozenset()
    assert decided(with_group(done, "g", 70), False, (1, 2), 80).state == PREPARE_ABORT


def test_entries_round_trip_with_groups_and_old_entries_still_decode() -> None:
    entry = with_group(initialized(None, "tx", 1, 0, 60_000, 0), "g", 10)
    assert TxnEntry.decode(entry.encode()) == entry
    old = initialized(None, "tx", 1, 0, 60_000, 0).encode()[:10]  # written before groups
    decoded = TxnEntry.decode(old)
    assert decoded.state == EMPTY and decoded.groups == frozenset()


# ------------------------------------------------------------------ the file


def test_offsets_log_compacts_to_a_record_per_group_and_refuses_damage(tmp_path: Path) -> None:
    async def main() -> None:
        log = OffsetLog(tmp_path, max_bytes=4096)
        assert log.open(lambda body: None) == 0
        state = OffsetState()
        i = 0
        while not log.wants_compaction():
            record = commit_record(f"g{i % 3}", None, i, [(("t", i % 5), Pending(i, None))])
            await log.append(record)
            state.apply(record)
            i += 1
        log.compact(state.snapshot())
        log.close()
        assert log.path == tmp_path / "groups" / "offsets.wal"
        bodies: list[Any] = []
        OffsetLog(tmp_path, max_bytes=4096).open(bodies.append)
        assert len(bodies) == 3 and view(replayed(bodies)) == view(state)

    anyio.run(main)
    log = OffsetLog(tmp_path, max_bytes=4096)
    data = bytearray(log.path.read_bytes())
    data[9] ^= 0xFF  # inside the first record's body
    log.path.write_bytes(bytes(data))
    with pytest.raises(OffsetLogError, match=r"offsets\.wal: record at byte 0"):
        log.open(lambda body: None)


# ------------------------------------------------------------------ the store's sweep


class Members:
    """A group membership whose answers the test sets."""

    def __init__(self) -> None:
        self.members: dict[str, dict[str, int]] = {}

    def locked(self, group_id: str) -> AbstractAsyncContextManager[None]:
        return NoMembers().locked(group_id)

    def check_member(self, group_id: str, member_id: str, member_epoch: int) -> ErrorCode:
        epochs = self.members.get(group_id, {})
        if not epochs:
            return NoMembers().check_member(group_id, member_id, member_epoch)
        if member_id not in epochs:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE if epochs[member_id] == member_epoch else ErrorCode.STALE_MEMBER_EPOCH

    def has_members(self, group_id: str) -> bool:
        return bool(self.members.get(group_id))


class Topics:
    def partition(self, topic: str, index: int) -> object | None:
        return object() if topic == "t" else None


def member_commit(group: str, member: str, epoch: int, offset: int) -> m.OffsetCommitRequest:
    return m.OffsetCommitRequest(
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        topics=[m.OffsetCommitTopic("t", [m.OffsetCommitPartition(0, offset)])],
    )


def test_offsets_of_a_group_expire_only_retention_after_its_members_left(tmp_path: Path) -> None:
    config = BrokerConfig(offsets_retention_ms=DAY_MS)
    members = Members()

    def store() -> OffsetStore:
        s = OffsetStore(config, Topics(), OffsetLog(tmp_path, 4096), members)  # type: ignore[arg-type]
        s.load()
        return s

    async def main() -> None:
        s = store()
        members.members["g"] = {"m-1": 3}
        stale = await s.offset_commit(member_commit("g", "m-1", 2, 5))
        assert stale.topics[0].partitions[0].error == ErrorCode.STALE_MEMBER_EPOCH
        outside = await s.offset_commit(member_commit("g", "", -1, 5))
        assert outside.topics[0].partitions[0].error == ErrorCode.UNKNOWN_MEMBER_ID
        ok = await s.offset_commit(member_commit("g", "m-1", 3, 5))
        assert ok.topics[0].partitions[0].error == ErrorCode.NONE
        group = s.state.group("g")
        assert group is not None and group.empty_since_ms is None
        start = group.committed[("t", 0)].commit_ms
        s.sweep(start + 30 * DAY_MS)  # members: kept however old
        assert s.state.group("g") is not None
        members.members["g"] = {}
        left = start + 40 * DAY_MS
        s.sweep(left)
        assert group.empty_since_ms == left and s.state.group("g") is not None
        s.close()
        s = store()  # the sweep's record is in the file
        again = s.state.group("g")
        assert again is not None and again.empty_since_ms == left
        s.sweep(left + DAY_MS - 1)
        assert s.state.group("g") is not None
        s.sweep(left + DAY_MS)
        assert s.state.group("g") is None and s.stats().expired == 1
        s.close()
        assert store().state.groups == {}

    anyio.run(main)
