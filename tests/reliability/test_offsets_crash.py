"""kill -9 at every durable step of committing offsets, then restart: what was made
durable is kept, and a transaction's offsets show iff it committed.

The broker is killed (a) after an OffsetCommit is durable but before its answer,
(b) in a TxnOffsetCommit after the group joined the transaction but before the
pending offsets were written, (c) after the pending offsets are durable but before
the answer, and, in a transaction holding data on a partition and offsets in two
groups, (d) after the decision, (e) after the groups' marker is written but not
synced, (f) after every marker is durable but before COMPLETE (behind EndTxn's
answer, which may be out before the kill); the same for a commit of one partition,
made in one round, at each of its steps. Points are armed with MINIBROKER_CRASH_AT
(broker/crash_points.py). Then: (g) pending offsets whose transaction the
coordinator lost (every txn.wal record cut) are dropped at start, so OffsetFetch
with require_stable does not answer UNSTABLE_OFFSET_COMMIT for ever, while pending
offsets whose group add alone was lost are adopted by the transaction their pid and
epoch name; and (h) a transaction finished again from its decision after a power
loss ends its own batches and offsets, not those of the producer's next transaction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.crash_points import ENV
from broker.storage.record_log import scan_records
from harness.broker_process import BrokerProcess
from harness.txn import Txn, assert_end_txn_retry_answered, committed_view
from harness.wire import WireClient, values_batch
from protocol.errors import ErrorCode
from protocol.framing import encode_frame
from tests.reliability.test_txn_crash import whole_log

DROPPED = (ConnectionError, OSError, EOFError)
UNSTABLE = ErrorCode.UNSTABLE_OFFSET_COMMIT


def fresh(tmp_path: Path, backend: str, crash_at: str | None) -> BrokerProcess:
    env = {ENV: crash_at} if crash_at else None
    broker = BrokerProcess(tmp_path / "data", backend=backend, env=env).start()
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", 2) == 0
    return broker


def commit(c: WireClient, group: str, offsets: dict[int, int]) -> dict[str, Any]:
    return c.call("OffsetCommit", group_id=group, topics=_topics(offsets))


def txn_commit(tx: Txn, group: str, offsets: dict[int, int]) -> dict[str, Any]:
    return tx.c.call(
        "TxnOffsetCommit",
        transactional_id=tx.id,
        producer_id=tx.pid,
        producer_epoch=tx.epoch,
        group_id=group,
        topics=_topics(offsets),
    )


def _topics(offsets: dict[int, int]) -> list[dict[str, Any]]:
    return [
        {"topic": "t", "partitions": [{"partition": p, "offset": o} for p, o in offsets.items()]}
    ]


def fetch(c: WireClient, group: str) -> dict[int, tuple[int, int]]:
    """(offset, error) of both partitions, with require_stable."""
    r = c.call(
        "OffsetFetch",
        group_id=group,
        topics=[{"topic": "t", "partitions": [0, 1]}],
        require_stable=True,
    )
    return {p["partition"]: (p["offset"], p["error"]) for p in r["topics"][0]["partitions"]}


def end_with_two_groups(
    c: WireClient, partitions: list[int], committed: bool
) -> tuple[Txn, tuple[int, int], dict[str, Any] | None]:
    """Group g at offsets 1 and 1; then a transaction writes b"out" to each of
    `partitions` of t, offsets 20 and 21 for g and 30 for h (partition 1), and ends:
    the transaction, its producer id and epoch, and EndTxn's answer (None: the
    connection dropped)."""
    assert commit(c, "g", {0: 1, 1: 1})["error"] == 0
    tx = Txn(c)
    old = (tx.pid, tx.epoch)
    for partition in partitions:
        assert tx.send("t", partition, [b"out"])["error"] == 0
    assert txn_commit(tx, "g", {0: 20, 1: 21})["error"] == 0
    assert txn_commit(tx, "h", {1: 30})["error"] == 0
    try:
        return tx, old, tx.end(committed=committed)
    except DROPPED:
        return tx, old, None


def test_kill_after_a_commit_is_durable_keeps_it(tmp_path: Path, backend: str) -> None:
    broker = fresh(tmp_path, backend, "offset_commit_durable")
    try:
        with WireClient(broker.bootstrap) as c, pytest.raises(DROPPED):
            commit(c, "g", {0: 5, 1: 6})
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert fetch(c, "g") == {0: (5, 0), 1: (6, 0)}
            assert commit(c, "g", {0: 7})["error"] == 0
            assert fetch(c, "g") == {0: (7, 0), 1: (6, 0)}
    finally:
        broker.kill()


@pytest.mark.parametrize("crash_at", ["txn_group_added", "txn_offsets_pending_durable"])
def test_kill_inside_txn_offset_commit_leaves_the_transaction_open(
    tmp_path: Path, backend: str, crash_at: str
) -> None:
    broker = fresh(tmp_path, backend, crash_at)
    try:
        with WireClient(broker.bootstrap) as c:
            assert commit(c, "g", {0: 1})["error"] == 0
            tx = Txn(c)
            assert tx.send("t", 1, [b"out"])["error"] == 0
            with pytest.raises(DROPPED):
                txn_commit(tx, "g", {0: 10})
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == "ONGOING"
            if crash_at == "txn_group_added":
                # The group joined; no offset of it was written.
                assert fetch(c, "g") == {0: (1, 0), 1: (-1, 0)}
            else:
                assert fetch(c, "g") == {0: (-1, UNSTABLE), 1: (-1, 0)}
            tx.c = c
            assert txn_commit(tx, "g", {0: 10})["error"] == 0  # the client's retry
            assert tx.end(committed=True)["error"] == 0
            assert fetch(c, "g") == {0: (10, 0), 1: (-1, 0)}
            assert committed_view(c.fetch("t", 1, 0, isolation_level=1)) == [b"out"]
    finally:
        broker.kill()


@pytest.mark.parametrize(
    "crash_at,committed",
    [
        ("txn_decided", True),
        ("txn_decided", False),
        ("txn_group_markers_written", True),
        ("txn_markers_durable", False),
    ],
)
def test_kill_after_the_decision_shows_offsets_iff_committed(
    tmp_path: Path, backend: str, crash_at: str, committed: bool
) -> None:
    broker = fresh(tmp_path, backend, crash_at)
    try:
        with WireClient(broker.bootstrap) as c:
            # Two partitions: a commit of one takes one round, without a decision first
            # (the next test).
            tx, old, answer = end_with_two_groups(c, [0, 1], committed)
            if answer is not None:
                # Killed at txn_markers_durable, behind the answer: EndTxn answers once
                # the decision is durable and its markers, the groups' too, are written.
                assert crash_at == "txn_markers_durable" and answer["error"] == 0, answer
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == ("COMPLETE_COMMIT" if committed else "COMPLETE_ABORT")
            if committed:
                assert fetch(c, "g") == {0: (20, 0), 1: (21, 0)}
                assert fetch(c, "h") == {0: (-1, 0), 1: (30, 0)}
            else:
                assert fetch(c, "g") == {0: (1, 0), 1: (1, 0)}
                assert fetch(c, "h") == {0: (-1, 0), 1: (-1, 0)}
            view = committed_view(c.fetch("t", 0, 0, isolation_level=1))
            assert view == ([b"out"] if committed else [])
            # The client's retry of EndTxn gets the answer it lost.
            assert_end_txn_retry_answered(c, tx.id, old, committed)
    finally:
        broker.kill()


@pytest.mark.parametrize(
    "crash_at,lose",
    [
        ("txn_marker_written", None),
        ("txn_markers_durable", None),
        ("txn_group_markers_written", None),
        ("txn_group_markers_written", "offsets.wal"),
        ("txn_group_markers_durable", None),
        (None, "txn.wal"),
    ],
)
def test_kill_inside_a_one_round_commit_with_offsets(
    tmp_path: Path, backend: str, crash_at: str | None, lose: str | None
) -> None:
    """A commit of one partition whose transaction holds two groups' offsets takes one
    round (docs/transactions.md, "One round"): its COMMIT marker behind its batch,
    synced, decides it; the groups' marker is written before the answer and synced
    behind it, then COMPLETE is written. Killed at each step (the last, behind the
    answer), or, answered, once COMPLETE is written (the id's next request waits for
    it); then, where `lose` says, with the last record of a file cut as a power loss
    before its sync would: the groups' marker (written, not synced), or COMPLETE
    (behind the groups' marker on disk). The partition's marker decides the commit
    at the next start, and the offsets commit with the batch, once."""
    broker = fresh(tmp_path, backend, crash_at)
    try:
        with WireClient(broker.bootstrap) as c:
            tx, old, answer = end_with_two_groups(c, [0], True)
            if answer is not None:
                # Killed behind the answer: once the groups' marker is written.
                assert crash_at in ("txn_group_markers_durable", None), crash_at
                assert answer["error"] == 0, answer
            if crash_at is None:
                # Waits for COMPLETE to be written (`_locked` waits for the settling).
                assert_end_txn_retry_answered(c, tx.id, old, True)
        assert broker.proc is not None
        if crash_at is None:
            broker.proc.kill()
        broker.proc.wait(15)
        if lose is not None:
            path = broker.data_dir / ("transactions" if lose == "txn.wal" else "groups") / lose
            records = list(scan_records(path.read_bytes(), path))
            assert ("COMPLETE_COMMIT" if lose == "txn.wal" else "markers") in repr(records[-1][0])
            with path.open("r+b") as f:
                f.truncate(records[-2][1])
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == "COMPLETE_COMMIT"
            assert fetch(c, "g") == {0: (20, 0), 1: (21, 0)}
            assert fetch(c, "h") == {0: (-1, 0), 1: (30, 0)}
            assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"out"]
            assert "event=txn_decided_by_marker" in broker.log_text()
            assert_end_txn_retry_answered(c, tx.id, old, True)
    finally:
        broker.kill()


def test_pending_offsets_no_transaction_claims_are_dropped_at_start(
    tmp_path: Path, backend: str
) -> None:
    broker = fresh(tmp_path, backend, "txn_offsets_pending_durable")
    try:
        with WireClient(broker.bootstrap) as c:
            assert commit(c, "g", {0: 1})["error"] == 0
            tx = Txn(c)
            with pytest.raises(DROPPED):
                txn_commit(tx, "g", {0: 10})
        assert broker.proc is not None
        broker.proc.wait(15)
        # The coordinator loses every record of the producer's id (a damaged txn.wal, cut
        # here): the pending offsets now belong to no transaction.
        wal = tmp_path / "data" / "transactions" / "txn.wal"
        # InitProducerId's entry, then the group joining.
        assert len(list(scan_records(wal.read_bytes(), wal))) == 2
        wal.write_bytes(b"")
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert fetch(c, "g") == {0: (1, 0), 1: (-1, 0)}
            assert broker.log_shows("event=txn_orphan_offsets_dropped")
            assert c.call("ListTransactions")["transactions"] == []
    finally:
        broker.kill()


@pytest.mark.parametrize("answered", [True, False])
def test_pending_offsets_whose_group_add_was_lost_are_adopted(
    tmp_path: Path, backend: str, answered: bool
) -> None:
    """A TxnOffsetCommit's answer waits for its pending offsets alone, not for the
    group's add in txn.wal: should the offsets reach the disk and the add not (cut from
    `txn.wal` after the kill, as a power loss before its sync would), the offsets,
    carrying the entry's pid and epoch, are its transaction's, and recovery adopts the
    group. Answered, the transaction commits them without a resend; killed before the
    answer, the client's retry writes them again."""
    broker = fresh(tmp_path, backend, None if answered else "txn_offsets_pending_durable")
    try:
        with WireClient(broker.bootstrap) as c:
            assert commit(c, "g", {0: 1})["error"] == 0
            tx = Txn(c)
            assert tx.send("t", 1, [b"out"])["error"] == 0
            if answered:
                assert txn_commit(tx, "g", {0: 10})["error"] == 0
            else:
                with pytest.raises(DROPPED):
                    txn_commit(tx, "g", {0: 10})
        assert broker.proc is not None
        if answered:
            broker.proc.kill()
        broker.proc.wait(15)
        path = broker.data_dir / "transactions" / "txn.wal"
        records = list(scan_records(path.read_bytes(), path))
        assert "'g'" in repr(records[-1][0]) and "'g'" not in repr(records[-2][0])
        with path.open("r+b") as f:
            f.truncate(records[-2][1])
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert broker.log_shows("event=txn_group_adopted")
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == "ONGOING"
            assert fetch(c, "g") == {0: (-1, UNSTABLE), 1: (-1, 0)}
            tx.c = c
            if not answered:
                assert txn_commit(tx, "g", {0: 10})["error"] == 0
            assert tx.end(committed=True)["error"] == 0
            assert fetch(c, "g") == {0: (10, 0), 1: (-1, 0)}
            assert committed_view(c.fetch("t", 1, 0, isolation_level=1)) == [b"out"]
    finally:
        broker.kill()


def test_requests_behind_a_txn_offset_commit_run_while_its_offsets_are_synced(
    tmp_path: Path, backend: str
) -> None:
    """A TxnOffsetCommit's answer waits for its fsync round, but the requests behind it on
    its connection do not (docs/protocol.md section 1): a Produce sent right behind it
    is appended before that round ends. Killed once the offsets are durable and before
    their answer, the broker holds the Produce's record; a connection that ran its
    requests one after another would have died before it."""
    broker = fresh(tmp_path, backend, "txn_offsets_pending_durable")
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            offsets = {
                "transactional_id": tx.id,
                "producer_id": tx.pid,
                "producer_epoch": tx.epoch,
                "group_id": "g",
                "topics": _topics({0: 10}),
            }
            batch = values_batch([b"b"])
            behind = {
                "acks": 1,
                "timeout_ms": 10_000,
                "topics": [{"topic": "t", "partitions": [{"partition": 1, "records": batch}]}],
            }
            # One write: both requests reach the broker in one read.
            c.send_raw(
                encode_frame({"api": "TxnOffsetCommit", "v": 1, "cid": 1, **offsets})
                + encode_frame({"api": "Produce", "v": 1, "cid": 2, **behind})
            )
            with pytest.raises(DROPPED):
                c.recv()
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert committed_view(c.fetch("t", 1, 0)) == [b"b"]
            # Never answered, the offsets stay pending until the transaction ends.
            assert fetch(c, "g") == {0: (-1, UNSTABLE), 1: (-1, 0)}
    finally:
        broker.kill()


def test_answers_stay_in_order_behind_a_txn_offset_commit(tmp_path: Path, backend: str) -> None:
    """Pipelined on one connection, a TxnOffsetCommit, an OffsetFetch that sees its offsets
    pending, the transaction's EndTxn and an OffsetFetch that sees them committed are
    answered in the order sent, each as if the ones before it had been answered."""
    broker = fresh(tmp_path, backend, None)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            assert tx.send("t", 1, [b"out"])["error"] == 0
            stable = {"group_id": "g", "topics": [{"topic": "t", "partitions": [0, 1]}]}
            requests = [
                (
                    "TxnOffsetCommit",
                    {
                        "transactional_id": tx.id,
                        "producer_id": tx.pid,
                        "producer_epoch": tx.epoch,
                        "group_id": "g",
                        "topics": _topics({0: 10, 1: 11}),
                    },
                ),
                ("OffsetFetch", {**stable, "require_stable": True}),
                (
                    "EndTxn",
                    {
                        "transactional_id": tx.id,
                        "producer_id": tx.pid,
                        "producer_epoch": tx.epoch,
                        "committed": True,
                    },
                ),
                ("OffsetFetch", {**stable, "require_stable": True}),
            ]
            c.send_raw(
                b"".join(
                    encode_frame({"api": api, "v": 1, "cid": cid, **fields})
                    for cid, (api, fields) in enumerate(requests)
                )
            )
            answers = [c.recv() for _ in requests]
            assert [a["cid"] for a in answers] == [0, 1, 2, 3]
            assert [a["error"] for a in answers] == [0, 0, 0, 0]
            pending, committed = (
                [(p["offset"], p["error"]) for p in a["topics"][0]["partitions"]]
                for a in (answers[1], answers[3])
            )
            assert pending == [(-1, UNSTABLE), (-1, UNSTABLE)]
            assert committed == [(10, 0), (11, 0)]
            assert committed_view(c.fetch("t", 1, 0, isolation_level=1)) == [b"out"]
    finally:
        broker.kill()


def commit_then_write_the_next(
    c: WireClient, *, one_round: bool = False, offsets: bool = True, timeout_ms: int = 60_000
) -> Txn:
    """Transaction N: b"n" on partitions 0 and 1 (partition 0 alone with `one_round`)
    and offset 10 in group g, committed; then N+1: b"n+1" on partition 0 and, with
    `offsets`, offset 20 in g. Every request answered; N+1 left open."""
    tx = Txn(c, timeout_ms=timeout_ms)
    for partition in [0] if one_round else [0, 1]:
        assert tx.send("t", partition, [b"n"])["error"] == 0
    assert txn_commit(tx, "g", {0: 10})["error"] == 0
    assert tx.end(committed=True)["error"] == 0
    assert tx.send("t", 0, [b"n+1"])["error"] == 0
    if offsets:
        assert txn_commit(tx, "g", {0: 20})["error"] == 0
    return tx


@pytest.mark.parametrize("one_round", [False, True])
@pytest.mark.parametrize("offsets", [True, False])
def test_an_ended_transaction_finished_again_leaves_the_next_one_open(
    tmp_path: Path, backend: str, offsets: bool, one_round: bool
) -> None:
    """Transaction N commits a batch (on both partitions, or on one: a commit in one
    round) and offset 10, answered; N+1 writes a batch to partition 0 and offset 20,
    both answered. N's COMPLETE is written behind N's answer (synced later), and N+1's
    partition and group adds are durable only through its batch and its offsets: a
    power loss can keep all of N+1's and lose everything `txn.wal` took after N's
    decision, or, for a commit in one round, after N's last add (cut here after a
    kill -9). Recovery finishes N again, from its decision or its marker: N's markers
    end N's batches and offsets, not N+1's (a later epoch), and N+1's batch and
    offsets, of the entry's epoch once N is finished, are adopted: N+1 is open, and
    the client, answered for both, commits it."""
    broker = fresh(tmp_path, backend, None)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = commit_then_write_the_next(c, one_round=one_round, offsets=offsets)
        assert broker.proc is not None
        broker.proc.kill()
        broker.proc.wait(15)
        path = broker.data_dir / "transactions" / "txn.wal"
        records = list(scan_records(path.read_bytes(), path))
        [complete] = [i for i, (body, _) in enumerate(records) if "COMPLETE_COMMIT" in repr(body)]
        kept = records[complete - 1]
        assert ("ONGOING" if one_round else "PREPARE_COMMIT") in repr(kept[0])
        with path.open("r+b") as f:
            f.truncate(kept[1])
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"n"]
            assert fetch(c, "g") == {0: (-1, UNSTABLE) if offsets else (10, 0), 1: (-1, 0)}
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == "ONGOING"
            assert broker.log_shows("event=txn_partition_adopted")
            assert ("event=txn_group_adopted" in broker.log_text()) == offsets
            tx.c = c
            assert tx.end(committed=True)["error"] == 0
            assert fetch(c, "g") == {0: (20 if offsets else 10, 0), 1: (-1, 0)}
            assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"n", b"n+1"]
    finally:
        broker.kill()


def cut_txn_wal_to_the_first_decision(broker: BrokerProcess) -> None:
    """Keep `txn.wal` up to the first PREPARE_COMMIT, as a power loss that took every
    record after it (none synced since) would."""
    path = broker.data_dir / "transactions" / "txn.wal"
    records = list(scan_records(path.read_bytes(), path))
    decision_end = next(end for body, end in records if "PREPARE_COMMIT" in repr(body))
    assert decision_end < records[-1][1]
    with path.open("r+b") as f:
        f.truncate(decision_end)


@pytest.mark.parametrize("lose_groups_marker", [False, True])
def test_a_chain_of_answered_commits_outlives_the_loss_of_their_records(
    tmp_path: Path, backend: str, lose_groups_marker: bool
) -> None:
    """N commits on two partitions (two rounds: its COMPLETE is written behind the
    answer, unsynced); N+1 writes a batch and offset 20 and commits in one round, all
    answered, none of it syncing `txn.wal`. A power loss takes everything `txn.wal`
    holds after N's decision, and, here or not, N+1's groups' marker (synced behind
    its answer). Recovery finishes N, which moves the entry to N+1's epoch, and then
    finds N+1's adds and its marker at that epoch: N+1 is committed with its offsets,
    and the producer goes on at the epoch N+1's answer gave."""
    broker = fresh(tmp_path, backend, None)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = commit_then_write_the_next(c)
            assert tx.end(committed=True)["error"] == 0
        assert broker.proc is not None
        broker.proc.kill()
        broker.proc.wait(15)
        cut_txn_wal_to_the_first_decision(broker)
        if lose_groups_marker:
            path = broker.data_dir / "groups" / "offsets.wal"
            records = list(scan_records(path.read_bytes(), path))
            assert "markers" in repr(records[-1][0])
            with path.open("r+b") as f:
                f.truncate(records[-2][1])
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert (listing["state"], listing["producer_epoch"]) == ("COMPLETE_COMMIT", tx.epoch)
            assert fetch(c, "g") == {0: (20, 0), 1: (-1, 0)}
            assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"n", b"n+1"]
            tx.c = c
            assert tx.send("t", 1, [b"n+2"])["error"] == 0
            assert tx.end(committed=True)["error"] == 0
            # (Whole logs: the restart after a kill starts a new segment.)
            kinds = [kind for kind, _ in whole_log(c, 1)]
            assert kinds == ["data", "COMMIT", "data", "COMMIT"], kinds
            assert committed_view(c.fetch("t", 1, 0, isolation_level=1)) == [b"n"]
    finally:
        broker.kill()


def test_a_timeout_abort_whose_decision_was_lost_stays_an_abort(
    tmp_path: Path, backend: str
) -> None:
    """N commits on two partitions (its COMPLETE unsynced); N+1 writes a batch and
    offset 20, answered, then times out: the sweep aborts it, and the broker is killed
    once its ABORT marker is written, then `txn.wal` is cut back to N's decision (the
    abort's decision shared the markers' round and was lost with N's COMPLETE and
    N+1's adds). Recovery finishes N, then decides N+1 by its ABORT marker: its batch
    and its offsets go, and the client, which never learned of the abort, cannot
    commit it."""
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        env={ENV: "txn_marker_written:3"},
        config="transaction_abort_timed_out_transaction_cleanup_interval_ms = 100\n",
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 2) == 0
            tx = commit_then_write_the_next(c, timeout_ms=1000)
        assert broker.proc is not None
        broker.proc.wait(30)  # the sweep's abort reaches its third marker
        cut_txn_wal_to_the_first_decision(broker)
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == "COMPLETE_ABORT"
            assert fetch(c, "g") == {0: (10, 0), 1: (-1, 0)}
            assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"n"]
            tx.c = c
            assert tx.end(committed=True)["error"] != 0
            assert fetch(c, "g") == {0: (10, 0), 1: (-1, 0)}
    finally:
        broker.kill()
