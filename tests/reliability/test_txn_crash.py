"""kill -9 at every step of a transaction, then restart: the outcome is what was answered.

A transaction writes to 3 partitions. The broker is killed (a) after the first
acknowledged batch, (b) mid-Produce: the partition durably added to the
transaction, the batch not yet appended, (c) after EndTxn's decision is durable
but before any marker, (d) after one marker of three is written, (e) after every
marker is durable but before COMPLETE is recorded (behind EndTxn's answer, which
the decision's round alone is waited for: it may be out before the kill), (f) after
PrepareTxn, and
(g) in a CommitTxns of two transactions with an app version, after its decision
and one marker, (h) after a transactional batch is appended, before its answer
(its partition add and the batch share an fsync round). Points (b)-(h) are
reached by arming MINIBROKER_CRASH_AT, which makes the broker SIGKILL itself
there (broker/crash_points.py). Since a kill keeps the page cache, (i) and (j)
repeat (h) and (d) and then cut `txn.wal`'s last record, as a power loss before
the shared round would: the lost add is adopted, the lost decision is taken from
the marker. (k) repeats (j) with a segment roll between a marker and the
kill, its snapshot past that marker, in a CommitTxns of two transactions: the
marker the replay no longer reads still decides its transaction, remembered by
the snapshot (version 3).

After each restart: a decided transaction is complete, with its markers, before
any read is served (read_committed sees it whole at once); an undecided one is
still open with its deadline and can go on; the epoch of an ended transaction is
fenced; and no partition's last stable offset is stuck.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.crash_points import ENV
from broker.partitions.producer_state import PartitionProducerState
from broker.storage.record_log import scan_records
from harness.broker_process import BrokerProcess
from harness.txn import Txn, assert_end_txn_retry_answered, committed_view, log_view
from harness.wire import WireClient
from protocol.batch import scan_batches

PARTITIONS = 3


def fresh(tmp_path: Path, backend: str, crash_at: str | None) -> BrokerProcess:
    env = {ENV: crash_at} if crash_at else None
    broker = BrokerProcess(tmp_path / "data", backend=backend, env=env).start()
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", PARTITIONS) == 0
    return broker


def end_answered_or_dropped(tx: Txn, committed: bool) -> None:
    """EndTxn with the broker killed at `txn_markers_durable`: its markers are synced
    behind its answer, so the answer may have gone out before the kill, or not."""
    try:
        r = tx.end(committed=committed)
    except (ConnectionError, OSError, EOFError):
        return
    assert r["error"] == 0, r


def stable_offsets(c: WireClient) -> list[int]:
    return [c.fetch("t", p, 0, isolation_level=1)["last_stable_offset"] for p in range(PARTITIONS)]


def whole_log(c: WireClient, partition: int, topic: str = "t") -> list[tuple[str, object]]:
    """log_view of every batch, across segments (a Fetch reads from one at a time)."""
    out: list[tuple[str, object]] = []
    offset = 0
    while True:
        f = c.fetch(topic, partition, offset)
        if not f["records"]:
            return out
        out += log_view(f)
        offset = [h for _, h in scan_batches(f["records"])][-1].next_offset


def all_committed(c: WireClient) -> list[list[bytes]]:
    return [committed_view(c.fetch("t", p, 0, isolation_level=1)) for p in range(PARTITIONS)]


def assert_decided(c: WireClient, committed: bool) -> None:
    """The transaction of one record per partition ("v0", "v1", ...) is complete: every
    partition stable past its marker, the records visible exactly when committed."""
    assert stable_offsets(c) == [2, 2, 2]
    want = [[b"v%d" % p] if committed else [] for p in range(PARTITIONS)]
    assert all_committed(c) == want
    for p in range(PARTITIONS):
        kinds = [k for k, _ in whole_log(c, p)]
        assert kinds == ["data", "COMMIT" if committed else "ABORT"], (p, kinds)


def test_kill_after_first_batch_keeps_the_transaction_open(tmp_path: Path, backend: str) -> None:
    broker = fresh(tmp_path, backend, None)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            assert tx.send("t", 0, [b"first"])["error"] == 0
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == "ONGOING"
            assert stable_offsets(c) == [0, 0, 0]
            tx.c = c
            for p in (1, 2):
                assert tx.send("t", p, [b"after-%d" % p])["error"] == 0
            assert tx.end(committed=True)["error"] == 0
            assert all_committed(c) == [[b"first"], [b"after-1"], [b"after-2"]]
    finally:
        broker.kill()


@pytest.mark.parametrize(
    "crash_at,committed",
    [
        ("txn_partitions_added", None),
        ("txn_decided", True),
        ("txn_marker_written", True),
        ("txn_markers_durable", False),
    ],
)
def test_kill_inside_produce_or_end_txn(
    tmp_path: Path, backend: str, crash_at: str, committed: bool | None
) -> None:
    broker = fresh(tmp_path, backend, crash_at)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            old = (tx.pid, tx.epoch)
            if committed is None:
                with pytest.raises((ConnectionError, OSError, EOFError)):
                    tx.send("t", 0, [b"lost"])
            else:
                for p in range(PARTITIONS):
                    assert tx.send("t", p, [b"v%d" % p])["error"] == 0
                if crash_at == "txn_markers_durable":
                    end_answered_or_dropped(tx, committed)
                else:
                    with pytest.raises((ConnectionError, OSError, EOFError)):
                        tx.end(committed=committed)
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            if committed is None:
                # The partition joined the transaction; its batch never landed.
                assert listing["state"] == "ONGOING"
                assert c.fetch("t", 0, 0)["records"] == b""
                tx.c = c
                assert tx.send("t", 0, [b"retried"])["error"] == 0
                assert tx.end(committed=True)["error"] == 0
                assert all_committed(c) == [[b"retried"], [], []]
                return
            # Decided before the crash: complete before the first read was served.
            assert listing["state"] == ("COMPLETE_COMMIT" if committed else "COMPLETE_ABORT")
            assert_decided(c, committed)
            # The client's retry of EndTxn gets the answer it lost.
            assert_end_txn_retry_answered(c, tx.id, old, committed)
    finally:
        broker.kill()


def test_kill_after_prepare_keeps_it_prepared(tmp_path: Path, backend: str) -> None:
    broker = fresh(tmp_path, backend, "txn_prepared")
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            assert tx.send("t", 1, [b"prepared"])["error"] == 0
            with pytest.raises((ConnectionError, OSError, EOFError)):
                tx.prepare()
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == "PREPARED"
            r = c.call("CommitTxns", transactions=[tx.ref()], committed=True)
            assert r["error"] == 0, r
            assert all_committed(c) == [[], [b"prepared"], []]
    finally:
        broker.kill()


def test_kill_inside_commit_txns_completes_every_transaction(tmp_path: Path, backend: str) -> None:
    broker = fresh(tmp_path, backend, "txn_marker_written")
    try:
        with WireClient(broker.bootstrap) as c:
            a, b = Txn(c, "a"), Txn(c, "b")
            for tx, p in ((a, 0), (b, 1)):
                assert tx.send("t", p, [tx.id.encode()])["error"] == 0
                assert tx.send("t", 2, [tx.id.encode()])["error"] == 0
                assert tx.prepare()["error"] == 0
            with pytest.raises((ConnectionError, OSError, EOFError)):
                c.call(
                    "CommitTxns",
                    transactions=[a.ref(), b.ref()],
                    committed=True,
                    txn_app_id="job",
                    txn_app_version=1,
                )
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert all_committed(c) == [[b"a"], [b"b"], [b"a", b"b"]]
            apps = c.call("DescribeTxnApps")["apps"]
            assert [(x["txn_app_id"], x["txn_app_version"]) for x in apps] == [("job", 1)]
            # The driver retries after the lost answer: the version is recorded already.
            r = c.call(
                "CommitTxns",
                transactions=[a.ref(), b.ref()],
                committed=True,
                txn_app_id="job",
                txn_app_version=1,
            )
            assert (r["error"], r["already_committed"]) == (0, True)
            assert all_committed(c) == [[b"a"], [b"b"], [b"a", b"b"]]
    finally:
        broker.kill()


def lose_last_txn_record(broker: BrokerProcess) -> None:
    """Cut `txn.wal`'s last record, as a power loss would before its fsync: a kill -9
    keeps the page cache, so this is how a test gets the state where a write that
    shared an fsync round with another reached the disk and its partner did not."""
    path = broker.data_dir / "transactions" / "txn.wal"
    data = path.read_bytes()
    ends = [end for _, end in scan_records(data, path)]
    assert len(ends) >= 2, ends
    with path.open("r+b") as f:
        f.truncate(ends[-2])


@pytest.mark.parametrize("lose_the_add", [False, True])
def test_kill_after_the_batch_is_appended(tmp_path: Path, backend: str, lose_the_add: bool) -> None:
    """The partition add and the batch share an fsync round: killed between the append
    and the answer, the batch is the transaction's whether or not the add reached the
    disk (adopted by recovery when it did not), and the client's retry is a duplicate."""
    broker = fresh(tmp_path, backend, "txn_batch_appended")
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            with pytest.raises((ConnectionError, OSError, EOFError)):
                tx.send("t", 0, [b"landed"])
        assert broker.proc is not None
        broker.proc.wait(15)
        if lose_the_add:
            lose_last_txn_record(broker)
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == "ONGOING"
            assert listing["partitions"] == [{"topic": "t", "partitions": [0]}]
            assert stable_offsets(c) == [0, 0, 0]
            tx.c = c
            retried = tx.send("t", 0, [b"landed"])
            assert (retried["error"], retried["duplicate"]) == (0, True)
            assert tx.send("t", 1, [b"more"])["error"] == 0
            assert tx.end(committed=True)["error"] == 0
            assert all_committed(c) == [[b"landed"], [b"more"], []]
    finally:
        broker.kill()


@pytest.mark.parametrize("records_lost", [1, 3, 4])
@pytest.mark.parametrize("committed", [True, False])
def test_a_marker_decides_when_the_decision_was_lost(
    tmp_path: Path, backend: str, committed: bool, records_lost: int
) -> None:
    """The decision and the markers share an fsync round: a marker on disk without its
    decision decides the transaction, and recovery writes the other markers. The
    partitions' adds are durable only through their batches (acks=-1): lost with the
    decision (the last 3 or 4 records of `txn.wal` cut: the decision and the adds of
    partitions 2 and 1, or of all three), the partitions are adopted by their batches
    and the marker before it decides, so the commit reaches all three partitions."""
    broker = fresh(tmp_path, backend, "txn_marker_written")
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            old = (tx.pid, tx.epoch)
            for p in range(PARTITIONS):
                assert tx.send("t", p, [b"v%d" % p])["error"] == 0
            with pytest.raises((ConnectionError, OSError, EOFError)):
                tx.end(committed=committed)
        assert broker.proc is not None
        broker.proc.wait(15)
        path = broker.data_dir / "transactions" / "txn.wal"
        records = list(scan_records(path.read_bytes(), path))
        assert len(records) == 1 + PARTITIONS + 1  # InitProducerId, 3 adds, the decision
        with path.open("r+b") as f:
            f.truncate(records[-1 - records_lost][1])
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["state"] == ("COMPLETE_COMMIT" if committed else "COMPLETE_ABORT")
            assert_decided(c, committed)
            assert_end_txn_retry_answered(c, tx.id, old, committed)
    finally:
        broker.kill()


def test_an_acks_all_batch_answered_outlives_the_loss_of_its_add(
    tmp_path: Path, backend: str
) -> None:
    """With acks=-1 the answer waits for the batch, not for its partition add, which
    the next sync of `txn.wal` takes: a power loss before that (the add cut by hand
    after a kill -9) leaves the durable batch, from which recovery adopts the partition,
    so the answered batch is the transaction's and commits with it."""
    broker = fresh(tmp_path, backend, None)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            assert tx.send("t", 2, [b"answered"])["error"] == 0
        assert broker.proc is not None
        broker.proc.kill()
        broker.proc.wait(15)
        lose_last_txn_record(broker)
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert "event=txn_partition_adopted" in broker.log_text()
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["partitions"] == [{"topic": "t", "partitions": [2]}]
            tx.c = c
            assert tx.send("t", 0, [b"more"])["error"] == 0
            assert tx.end(committed=True)["error"] == 0
            assert all_committed(c) == [[b"more"], [], [b"answered"]]
    finally:
        broker.kill()


def test_an_acks_1_batch_answered_is_in_the_transaction_after_a_kill(
    tmp_path: Path, backend: str
) -> None:
    """With acks=1 the batch is not waited for, but its partition add is, before the
    answer: after a kill the transaction holds the partition and commits the batch."""
    broker = fresh(tmp_path, backend, None)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            assert tx.send("t", 2, [b"acks-1"], acks=1)["error"] == 0
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            [listing] = c.call("ListTransactions")["transactions"]
            assert listing["partitions"] == [{"topic": "t", "partitions": [2]}]
            tx.c = c
            assert tx.end(committed=True)["error"] == 0
            assert all_committed(c) == [[], [], [b"acks-1"]]
    finally:
        broker.kill()


def test_a_marker_behind_a_snapshot_decides_when_the_decision_was_lost(
    tmp_path: Path, backend: str
) -> None:
    """CommitTxns ends `a` (partition 0) and `b` (partitions 0 and 1) in one decision.
    Partition 0's segment is sized so that `b`'s marker rolls it: the roll's snapshot
    lies past `a`'s marker. The broker dies right after that second marker, and the
    decision record is cut as a power loss would: a replay from the snapshot no longer
    reads `a`'s marker, which must still decide `a` (a commit, as it says), and `b`'s
    marker decides `b`, whose missing marker on partition 1 recovery writes."""
    # Partition 0 holds a's batch (863 bytes), b's (64) and a's marker (66): 993 bytes
    # of the 1024 a segment may hold, so b's marker (66 more) rolls first.
    big = b"x" * 800
    broker = fresh(tmp_path, backend, "txn_marker_written:2")
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("s", 2, {"segment.bytes": "1024"}) == 0
            a, b = Txn(c, "a"), Txn(c, "b")
            assert a.send("s", 0, [big])["error"] == 0
            assert b.send("s", 0, [b"b"])["error"] == 0
            assert b.send("s", 1, [b"b"])["error"] == 0
            for tx in (a, b):
                assert tx.prepare()["error"] == 0
            refs = [a.ref(), b.ref()]
            with pytest.raises((ConnectionError, OSError, EOFError)):
                c.call("CommitTxns", transactions=refs, committed=True)
        assert broker.proc is not None
        broker.proc.wait(15)
        [directory] = [d for d in broker.data_dir.rglob("0") if d.parent.name == "s"]
        snapshots = sorted(directory.glob("*.snapshot"))
        assert snapshots and int(snapshots[-1].name.split(".")[0]) == 3, snapshots
        lose_last_txn_record(broker)
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            states = {
                t["transactional_id"]: t["state"]
                for t in c.call("ListTransactions")["transactions"]
            }
            assert states == {"a": "COMPLETE_COMMIT", "b": "COMPLETE_COMMIT"}
            committed = [committed_view(c.fetch("s", p, 0, isolation_level=1)) for p in range(2)]
            assert committed == [[big, b"b"], [b"b"]]
            # Every marker once, each a COMMIT; no partition is left unstable.
            kinds = [[k for k, _ in whole_log(c, p, "s")] for p in range(2)]
            assert kinds == [["data", "data", "COMMIT", "COMMIT"], ["data", "COMMIT"]]
            for p, want in ((0, 4), (1, 2)):
                assert c.fetch("s", p, 0, isolation_level=1)["last_stable_offset"] == want
            # The driver retries after the lost answer: answered as committed.
            r = c.call("CommitTxns", transactions=refs, committed=True)
            assert r["error"] == 0, r
    finally:
        broker.kill()


def test_markers_whose_decision_is_durable_leave_the_snapshots(
    tmp_path: Path, backend: str
) -> None:
    """A marker is kept in the producer state only until its decision is durable: the
    snapshot of a clean stop after an answered EndTxn keeps none."""
    broker = fresh(tmp_path, backend, None)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            for p in range(PARTITIONS):
                assert tx.send("t", p, [b"v%d" % p])["error"] == 0
            assert tx.end(committed=True)["error"] == 0
        assert broker.terminate() == 0
        for p in range(PARTITIONS):
            [directory] = [d for d in broker.data_dir.rglob(str(p)) if d.parent.name == "t"]
            newest = sorted(directory.glob("*.snapshot"))[-1]
            offset, state = PartitionProducerState.decode_snapshot(
                newest.read_bytes(), max_producers=10, expiration_ms=1000
            )
            assert offset == 2 and state.markers == {} and state.open_txns == {}
    finally:
        broker.kill()
