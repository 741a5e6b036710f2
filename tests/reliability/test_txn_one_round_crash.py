"""kill -9 at every step of a commit made in one fsync round (a transaction that
wrote to one partition: docs/transactions.md, "One round"), then restart.

Its COMMIT marker is appended behind its batches before anything is decided, and one
round syncs both; then `txn.wal` gets the entry COMPLETE, synced behind the answer.
Killed (l) with the marker written, before the round (`txn_marker_written`), or (m)
after the round, before the entry is written (`txn_markers_durable`), EndTxn is never
answered, and the marker decides the commit at the next start, once; the client's
retry gets the answer it lost. (n) As (l), then a power loss that takes the partition
add (`txn.wal`'s last record), which shares its batch's round and which EndTxn sent
right behind the batch does not wait for: recovery adopts the partition by the
marker, which then decides. (o) Answered, then a power loss that takes `txn.wal`'s
unsynced COMPLETE (cut by hand after a kill -9, which keeps the page cache): the
marker decides it again, at the epoch the answer gave, and the producer goes on with
it. Each is tried with the batch answered at acks=-1 and at acks=1. The letters are
the rows of docs/transactions.md's crash points.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.txn import Txn, assert_end_txn_retry_answered
from harness.wire import WireClient
from tests.reliability.test_txn_crash import all_committed, fresh, lose_last_txn_record, whole_log


def assert_committed_once(c: WireClient, values: list[bytes], epoch: int) -> None:
    [listing] = c.call("ListTransactions")["transactions"]
    assert (listing["state"], listing["producer_epoch"]) == ("COMPLETE_COMMIT", epoch), listing
    assert all_committed(c) == [[], values, []]
    kinds = [k for k, _ in whole_log(c, 1)]
    assert kinds == ["data"] * len(values) + ["COMMIT"], kinds
    assert c.fetch("t", 1, 0, isolation_level=1)["last_stable_offset"] == len(values) + 1


@pytest.mark.parametrize("acks", [-1, 1])
@pytest.mark.parametrize(
    "crash_at,lose_the_add",
    [("txn_marker_written", False), ("txn_markers_durable", False), ("txn_marker_written", True)],
)
def test_kill_inside_a_one_round_commit(
    tmp_path: Path, backend: str, crash_at: str, lose_the_add: bool, acks: int
) -> None:
    broker = fresh(tmp_path, backend, crash_at)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            old = (tx.pid, tx.epoch)
            assert tx.send("t", 1, [b"one"], acks=acks)["error"] == 0
            with pytest.raises((ConnectionError, OSError, EOFError)):
                tx.end(committed=True)
        assert broker.proc is not None
        broker.proc.wait(15)
        if lose_the_add:
            lose_last_txn_record(broker)  # the entry is EMPTY again
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert_committed_once(c, [b"one"], old[1] + 1)
            log = broker.log_text()
            assert ("event=txn_partition_adopted" in log) == lose_the_add
            assert "event=txn_decided_by_marker" in log
            assert_end_txn_retry_answered(c, tx.id, old, True)
    finally:
        broker.kill()


@pytest.mark.parametrize("acks", [-1, 1])
def test_an_answered_commit_outlives_the_loss_of_its_record(
    tmp_path: Path, backend: str, acks: int
) -> None:
    broker = fresh(tmp_path, backend, None)
    try:
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            assert tx.send("t", 1, [b"one"], acks=acks)["error"] == 0
            assert tx.end(committed=True)["error"] == 0
            answered = (tx.pid, tx.epoch)
        assert broker.proc is not None
        broker.proc.kill()
        broker.proc.wait(15)
        lose_last_txn_record(broker)  # the COMPLETE the answer did not wait for
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            assert_committed_once(c, [b"one"], answered[1])
            assert "event=txn_decided_by_marker" in broker.log_text()
            tx.c = c
            assert tx.send("t", 1, [b"two"])["error"] == 0
            assert tx.end(committed=True)["error"] == 0
            # (Whole logs: the restart after a kill starts a new segment, and a Fetch
            # reads one.)
            assert [k for k, _ in whole_log(c, 1)] == ["data", "COMMIT"] * 2
            assert c.fetch("t", 1, 0, isolation_level=1)["last_stable_offset"] == 4
    finally:
        broker.kill()
