"""Transactions against the real broker process, over the raw wire (docs/protocol.md section 5).

Every test starts the broker on loopback with a fresh data dir, on both backends,
and asserts on the bytes a Fetch returns: which batches lie in the log, which
the last stable offset lets a read_committed reader see, and which aborted
transactions the broker lists for them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.broker_process import BrokerProcess
from harness.txn import TXN, Txn, committed_view, log_view
from harness.wire import WireClient, values_batch
from protocol.batch import scan_batches
from protocol.errors import ErrorCode
from tests.reliability.conftest import config_file


@pytest.fixture
def c(broker: BrokerProcess) -> Iterator[WireClient]:
    with WireClient(broker.bootstrap) as client:
        assert client.create_topic("t", 3) == 0
        yield client


def test_commit_across_three_partitions_is_seen_whole(c: WireClient) -> None:
    tx = Txn(c)
    for p in range(3):
        assert tx.send("t", p, [b"v%d" % p])["error"] == 0
    for p in range(3):
        rc = c.fetch("t", p, 0, isolation_level=1)
        # Open: the stable offset holds at the transaction's first batch.
        assert (rc["last_stable_offset"], rc["high_watermark"], rc["records"]) == (0, 1, b"")
        listed = c.call(
            "ListOffsets",
            isolation_level=1,
            topics=[{"topic": "t", "partitions": [{"partition": p, "timestamp": -1}]}],
        )
        assert listed["topics"][0]["partitions"][0]["offset"] == 0
    assert tx.end(committed=True)["error"] == 0
    for p in range(3):
        rc = c.fetch("t", p, 0, isolation_level=1)
        assert rc["last_stable_offset"] == rc["high_watermark"] == 2
        assert committed_view(rc) == [b"v%d" % p]
        assert rc["aborted_transactions"] == []
        assert log_view(rc) == [("data", [b"v%d" % p]), ("COMMIT", tx.pid)]


def test_abort_across_three_partitions_hides_everything(c: WireClient) -> None:
    tx = Txn(c)
    pid = tx.pid
    for p in range(3):
        assert tx.send("t", p, [b"gone-%d" % p, b"too"])["error"] == 0
    assert tx.end(committed=False)["error"] == 0
    for p in range(3):
        rc = c.fetch("t", p, 0, isolation_level=1)
        assert rc["last_stable_offset"] == 3
        assert rc["aborted_transactions"] == [{"producer_id": pid, "first_offset": 0}]
        assert committed_view(rc) == []
        ru = c.fetch("t", p, 0, isolation_level=0)
        # read_uncommitted: the data is there; the marker is a control batch to skip.
        assert ru["aborted_transactions"] is None
        assert log_view(ru) == [("data", [b"gone-%d" % p, b"too"]), ("ABORT", pid)]


def test_interleaved_transactions_keep_only_committed_data(c: WireClient) -> None:
    a, b = Txn(c, "a"), Txn(c, "b")
    plain = c.init_producer()
    assert a.send("t", 0, [b"a1"])["error"] == 0
    assert b.send("t", 0, [b"b1"])["error"] == 0
    r = c.produce(
        "t",
        0,
        values_batch([b"plain"], producer_id=plain[0], producer_epoch=0, base_sequence=0),
        acks=-1,
    )
    assert r["error"] == 0
    assert a.send("t", 0, [b"a2"])["error"] == 0
    assert a.end(committed=False)["error"] == 0
    # b still open at offset 1: a reader stops there.
    assert c.fetch("t", 0, 0, isolation_level=1)["last_stable_offset"] == 1
    assert b.end(committed=True)["error"] == 0
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert committed_view(rc) == [b"b1", b"plain"]
    # From offset 4 on the aborted transaction of `a` is behind the reader... but its
    # marker at 4 is not: it is still listed, and nothing of `a` is shown.
    later = c.fetch("t", 0, 4, isolation_level=1)
    assert [x["first_offset"] for x in later["aborted_transactions"]] == [0]


def test_end_txn_retry_answers_the_same_and_a_late_batch_is_fenced(c: WireClient) -> None:
    tx = Txn(c)
    old = (tx.pid, tx.epoch)
    assert tx.send("t", 0, [b"x"])["error"] == 0
    first = tx.end(committed=True)
    assert first["error"] == 0 and (first["producer_id"], first["producer_epoch"]) == (
        old[0],
        old[1] + 1,
    )
    again = c.call(
        "EndTxn", transactional_id=TXN, producer_id=old[0], producer_epoch=old[1], committed=True
    )
    assert (again["error"], again["producer_epoch"]) == (0, old[1] + 1)
    opposite = c.call(
        "EndTxn", transactional_id=TXN, producer_id=old[0], producer_epoch=old[1], committed=False
    )
    assert opposite["error"] == ErrorCode.INVALID_TXN_STATE
    # A retry of the ended transaction's batch: fenced, never appended.
    late = values_batch(
        [b"late"], producer_id=old[0], producer_epoch=old[1], base_sequence=1, transactional=True
    )
    assert (
        c.produce("t", 0, late, transactional_id=TXN)["error"] == ErrorCode.INVALID_PRODUCER_EPOCH
    )
    assert log_view(c.fetch("t", 0, 0)) == [("data", [b"x"]), ("COMMIT", old[0])]


def test_empty_transaction_ends_without_a_marker_and_bumps_the_epoch(c: WireClient) -> None:
    tx = Txn(c)
    epoch = tx.epoch
    assert tx.end(committed=True)["error"] == 0
    assert tx.epoch == epoch + 1
    assert c.fetch("t", 0, 0)["records"] == b""
    [listing] = c.call("ListTransactions")["transactions"]
    assert (listing["state"], listing["producer_epoch"]) == ("COMPLETE_COMMIT", epoch + 1)


def test_zombie_is_fenced_and_its_open_transaction_aborted(c: WireClient) -> None:
    zombie = Txn(c)
    assert zombie.send("t", 0, [b"zombie"])["error"] == 0
    fresh = Txn(c)
    assert (fresh.pid, fresh.epoch) == (zombie.pid, zombie.epoch + 2)  # abort, then init
    assert zombie.send("t", 0, [b"again"])["error"] == ErrorCode.INVALID_PRODUCER_EPOCH
    assert zombie.end(committed=True)["error"] == ErrorCode.PRODUCER_FENCED
    assert fresh.send("t", 0, [b"fresh"])["error"] == 0
    assert fresh.end(committed=True)["error"] == 0
    assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"fresh"]


def test_fencing_errors_name_the_case(c: WireClient) -> None:
    tx = Txn(c)
    Txn(c)  # a newer instance: tx's epoch is now fenced
    r = tx.end(committed=True)
    assert r["error"] == ErrorCode.PRODUCER_FENCED, r
    unknown = c.call(
        "EndTxn", transactional_id="nobody", producer_id=tx.pid, producer_epoch=0, committed=True
    )
    assert unknown["error"] == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    plain = c.init_producer()
    # A transactional batch under another producer's id, or without transactional_id.
    wrong = values_batch(
        [b"w"], producer_id=plain[0], producer_epoch=0, base_sequence=0, transactional=True
    )
    assert c.produce("t", 0, wrong, transactional_id=TXN)["error"] == ErrorCode.INVALID_TXN_STATE
    assert c.produce("t", 0, wrong)["error"] == ErrorCode.INVALID_TXN_STATE
    # The transactional producer's own id on a plain batch would slip past the stable offset.
    current = Txn(c, "own")
    sneaky = values_batch(
        [b"s"], producer_id=current.pid, producer_epoch=current.epoch, base_sequence=0
    )
    assert c.produce("t", 0, sneaky)["error"] == ErrorCode.INVALID_TXN_STATE
    timeout = c.call("InitProducerId", transactional_id="slow", transaction_timeout_ms=10**9)
    assert timeout["error"] == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert c.fetch("t", 0, 0)["records"] == b""


def test_prepared_transaction_takes_no_more_batches_and_commits_from_outside(
    broker: BrokerProcess, c: WireClient
) -> None:
    tx = Txn(c)
    assert tx.send("t", 1, [b"p"])["error"] == 0
    assert tx.prepare()["error"] == 0
    assert tx.prepare()["error"] == 0  # repeating it is fine
    assert tx.send("t", 1, [b"more"])["error"] == ErrorCode.INVALID_TXN_STATE
    assert c.call(
        "PrepareTxn",
        transactional_id=TXN,
        producer_id=tx.pid,
        producer_epoch=tx.epoch,
        prepared_timeout_ms=10**12,
    )["error"] == (ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    with WireClient(broker.bootstrap) as driver:
        r = driver.call("CommitTxns", transactions=[tx.ref()], committed=True)
        assert r["error"] == 0 and r["transactions"] == [
            {"transactional_id": TXN, "error": 0, "message": None}
        ]
        # The same call again after a lost answer: done already, error 0.
        assert driver.call("CommitTxns", transactions=[tx.ref()], committed=True)["error"] == 0
    assert committed_view(c.fetch("t", 1, 0, isolation_level=1)) == [b"p"]


def test_commit_txns_is_all_or_nothing(c: WireClient) -> None:
    a, b, ongoing = Txn(c, "a"), Txn(c, "b"), Txn(c, "c")
    for tx, p in ((a, 0), (b, 1), (ongoing, 2)):
        assert tx.send("t", p, [tx.id.encode()])["error"] == 0
    assert a.prepare()["error"] == 0 and b.prepare()["error"] == 0
    stale = {**b.ref(), "producer_epoch": b.epoch - 1}
    for bad, code in (
        (ongoing.ref(), ErrorCode.INVALID_TXN_STATE),  # commit needs PREPARED
        (stale, ErrorCode.PRODUCER_FENCED),
        ({**a.ref(), "transactional_id": "nobody"}, ErrorCode.INVALID_PRODUCER_ID_MAPPING),
    ):
        r = c.call("CommitTxns", transactions=[a.ref(), bad], committed=True)
        assert r["error"] == code, r
        assert [t["error"] for t in r["transactions"]] == [0, code]
    states = _states(c)
    assert states == {"a": "PREPARED", "b": "PREPARED", "c": "ONGOING"}
    assert c.fetch("t", 0, 0, isolation_level=1)["records"] == b""
    r = c.call("CommitTxns", transactions=[a.ref(), b.ref()], committed=True)
    assert r["error"] == 0
    assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"a"]
    assert committed_view(c.fetch("t", 1, 0, isolation_level=1)) == [b"b"]
    # An abort takes ONGOING ones too.
    assert c.call("CommitTxns", transactions=[ongoing.ref()], committed=False)["error"] == 0
    assert c.fetch("t", 2, 0, isolation_level=1)["last_stable_offset"] == 2


def test_commit_txns_app_version_makes_a_rerun_commit_nothing(c: WireClient) -> None:
    first = Txn(c, "sink-0")
    assert first.send("t", 0, [b"batch-7"])["error"] == 0
    assert first.prepare()["error"] == 0
    r = c.call(
        "CommitTxns",
        transactions=[first.ref()],
        committed=True,
        txn_app_id="sink",
        txn_app_version=7,
    )
    assert (r["error"], r["already_committed"], r["txn_app_version"]) == (0, False, 7)
    # The micro-batch runs again (a retried Spark job): same version, new transaction.
    rerun = Txn(c, "sink-1")
    assert rerun.send("t", 0, [b"batch-7-again"])["error"] == 0
    assert rerun.prepare()["error"] == 0
    r = c.call(
        "CommitTxns",
        transactions=[rerun.ref()],
        committed=True,
        txn_app_id="sink",
        txn_app_version=7,
    )
    assert (r["error"], r["already_committed"], r["txn_app_version"]) == (0, True, 7)
    assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"batch-7"]
    assert c.fetch("t", 0, 0, isolation_level=1)["last_stable_offset"] == 4  # rerun aborted
    apps = c.call("DescribeTxnApps", txn_app_ids=["sink", "other"])["apps"]
    assert [(a["txn_app_id"], a["txn_app_version"]) for a in apps] == [("sink", 7)]
    older = Txn(c, "sink-2")
    assert older.prepare()["error"] == 0
    r = c.call(
        "CommitTxns",
        transactions=[older.ref()],
        committed=True,
        txn_app_id="sink",
        txn_app_version=3,
    )
    assert (r["already_committed"], r["txn_app_version"]) == (True, 7)


def test_a_late_prepare_of_a_finished_app_version_is_refused_and_aborted(c: WireClient) -> None:
    """A Spark task still running after the driver committed its write: its PrepareTxn
    names the write's app version, which is recorded, so its transaction is aborted at
    once instead of holding the stable offset until its prepared timeout."""
    winner = Txn(c, "w.p0.a1")
    assert winner.send("t", 0, [b"winner"])["error"] == 0
    assert winner.prepare(txn_app_id="w", txn_app_version=0)["error"] == 0
    late = Txn(c, "w.p0.a0")
    assert late.send("t", 0, [b"late"])["error"] == 0
    r = c.call(
        "CommitTxns", transactions=[winner.ref()], committed=True, txn_app_id="w", txn_app_version=0
    )
    assert (r["error"], r["already_committed"]) == (0, False)
    assert c.fetch("t", 0, 0, isolation_level=1)["last_stable_offset"] == 1  # late holds it
    refused = late.prepare(txn_app_id="w", txn_app_version=0)
    assert refused["error"] == ErrorCode.INVALID_TXN_STATE, refused
    assert "version 0 recorded" in refused["message"]
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 4
    assert committed_view(rc) == [b"winner"]
    assert log_view(c.fetch("t", 0, 0)) == [
        ("data", [b"winner"]),
        ("data", [b"late"]),
        ("COMMIT", winner.pid),
        ("ABORT", late.pid),
    ]
    states = _states(c)
    assert states == {"w.p0.a0": "COMPLETE_ABORT", "w.p0.a1": "COMPLETE_COMMIT"}
    # The writer's own abort afterwards is the retry of what happened: answered 0.
    assert late.end(committed=False)["error"] == 0
    # A later version of the same app is not finished: its prepare is accepted.
    nxt = Txn(c, "w.p0.a2")
    assert nxt.send("t", 1, [b"next"])["error"] == 0
    assert nxt.prepare(txn_app_id="w", txn_app_version=1)["error"] == 0


def test_an_abort_with_an_app_version_finishes_it_durably(broker: BrokerProcess) -> None:
    """CommitTxns aborting with an app version records it (the driver's abort of a Spark
    write): every later PrepareTxn under that version is refused, across a kill -9."""
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", 1) == 0
        running = Txn(c, "job.p0.a0")
        assert running.send("t", 0, [b"half"])["error"] == 0
        r = c.call(
            "CommitTxns", transactions=[], committed=False, txn_app_id="job", txn_app_version=0
        )
        assert (r["error"], r["already_committed"], r["txn_app_version"]) == (0, False, 0)
        assert running.prepare(txn_app_id="job", txn_app_version=0)["error"] == (
            ErrorCode.INVALID_TXN_STATE
        )
        rc = c.fetch("t", 0, 0, isolation_level=1)
        assert rc["last_stable_offset"] == rc["high_watermark"] == 2
        assert committed_view(rc) == []
        # Without the app fields (an older client) PrepareTxn is what it always was.
        plain = Txn(c, "job.p1.a0")
        assert plain.send("t", 0, [b"plain"])["error"] == 0
        assert plain.prepare()["error"] == 0
    broker.restart(kill=True)
    with WireClient(broker.bootstrap) as c:
        empty = Txn(c, "job.p2.a0")  # nothing written: refused all the same, no marker
        assert empty.prepare(txn_app_id="job", txn_app_version=0)["error"] == (
            ErrorCode.INVALID_TXN_STATE
        )
        apps = c.call("DescribeTxnApps", txn_app_ids=["job"])["apps"]
        assert [(a["txn_app_id"], a["txn_app_version"]) for a in apps] == [("job", 0)]
        assert _states(c) == {
            "job.p0.a0": "COMPLETE_ABORT",
            "job.p1.a0": "PREPARED",
            "job.p2.a0": "EMPTY",
        }
        assert len(log_view(c.fetch("t", 0, 0))) == 3  # half, ABORT, plain: no new marker


def test_list_transactions_filters_by_prefix_and_state(c: WireClient) -> None:
    a, b = Txn(c, "spark-a"), Txn(c, "spark-b")
    Txn(c, "other")
    assert a.send("t", 0, [b"x"])["error"] == 0
    assert b.send("t", 1, [b"y"])["error"] == 0 and b.prepare()["error"] == 0
    r = c.call("ListTransactions", transactional_id_prefix="spark-", states=["ONGOING"])
    [listing] = r["transactions"]
    assert listing["transactional_id"] == "spark-a"
    assert listing["partitions"] == [{"topic": "t", "partitions": [0]}]
    assert listing["timeout_ms"] == 60_000 and listing["started_ms"] > 0
    r = c.call("ListTransactions", transactional_id_prefix="spark-")
    assert [t["state"] for t in r["transactions"]] == ["ONGOING", "PREPARED"]


@pytest.mark.parametrize("backend", ["trio"])
def test_timeouts_abort_and_free_the_stable_offset(tmp_path: Path, backend: str) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        extra_args=config_file(
            tmp_path, "transaction_abort_timed_out_transaction_cleanup_interval_ms = 50\n"
        ),
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 2) == 0
            short = Txn(c, "short", timeout_ms=300)
            assert short.send("t", 0, [b"late"])["error"] == 0
            # Prepared: the transaction timeout stops applying; the prepared one rules.
            held = Txn(c, "held", timeout_ms=300)
            assert held.send("t", 1, [b"held"])["error"] == 0
            # Long enough for the short one's abort to finish first on a busy machine.
            assert held.prepare(timeout_ms=4000)["error"] == 0
            started = time.monotonic()
            _wait(lambda: c.fetch("t", 0, 0, isolation_level=1)["last_stable_offset"] == 2)
            assert short.send("t", 0, [b"more"])["error"] == ErrorCode.INVALID_PRODUCER_EPOCH
            assert short.end(committed=True)["error"] == ErrorCode.INVALID_PRODUCER_EPOCH
            assert c.fetch("t", 1, 0, isolation_level=1)["last_stable_offset"] == 0
            _wait(lambda: c.fetch("t", 1, 0, isolation_level=1)["last_stable_offset"] == 2)
            assert time.monotonic() - started >= 3.5
            # The marker frees the stable offset before the coordinator logs the
            # completion (Kafka's order), so PREPARE_ABORT may still show for a moment.
            ended = {"short": "COMPLETE_ABORT", "held": "COMPLETE_ABORT"}
            _wait(lambda: _states(c) == ended)
            assert committed_view(c.fetch("t", 1, 0, isolation_level=1)) == []
    finally:
        broker.kill()


def test_ended_ids_and_app_versions_expire_and_stay_forgotten(tmp_path: Path, backend: str) -> None:
    """Tried: an ended transactional id and a recorded app version left alone past
    transactional_id_expiration_ms, then a kill -9 and a restart. Both are forgotten at a
    sweep, and the removal replays: the app version does not come back."""
    config = config_file(
        tmp_path,
        "transactional_id_expiration_ms = 1500\n"
        "transaction_abort_timed_out_transaction_cleanup_interval_ms = 50\n",
    )
    data = tmp_path / "data"
    broker = BrokerProcess(data, backend=backend, extra_args=config).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 1) == 0
            writer = Txn(c, "write-1.p0.a0")
            assert writer.send("t", 0, [b"row"])["error"] == 0
            assert writer.prepare()["error"] == 0
            r = c.call(
                "CommitTxns",
                transactions=[writer.ref()],
                committed=True,
                txn_app_id="write-1",
                txn_app_version=0,
            )
            assert (r["error"], r["already_committed"]) == (0, False)
            assert len(c.call("DescribeTxnApps")["apps"]) == 1
            assert len(c.call("ListTransactions")["transactions"]) == 1
            _wait(lambda: c.call("DescribeTxnApps")["apps"] == [])
            _wait(lambda: c.call("ListTransactions")["transactions"] == [])
        broker.kill()
        broker = BrokerProcess(data, backend=backend, extra_args=config).start()
        with WireClient(broker.bootstrap) as c:
            assert c.call("DescribeTxnApps")["apps"] == []
            assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"row"]
    finally:
        broker.kill()


def _states(c: WireClient) -> dict[str, str]:
    return {t["transactional_id"]: t["state"] for t in c.call("ListTransactions")["transactions"]}


def _wait(condition: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_limits_on_ids_and_partitions_per_transaction(tmp_path: Path, backend: str) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        extra_args=config_file(
            tmp_path, "max_transactional_ids = 2\nmax_partitions_per_transaction = 2\n"
        ),
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 3) == 0
            a = Txn(c, "a")
            assert a.send("t", 0, [b"0"])["error"] == 0
            assert a.send("t", 1, [b"1"])["error"] == 0
            r = a.send("t", 2, [b"2"])
            assert r["error"] == ErrorCode.INVALID_TXN_STATE and "max_partitions" in r["message"]
            b = Txn(c, "b")
            assert b.send("t", 2, [b"b"])["error"] == 0
            # Both ids hold open transactions: a third id cannot be held.
            full = c.call("InitProducerId", transactional_id="c")
            assert full["error"] == ErrorCode.CONCURRENT_TRANSACTIONS, full
            assert a.end(committed=True)["error"] == 0
            # Now `a` has ended: it is the one forgotten to make room.
            Txn(c, "c")
            ids = {t["transactional_id"] for t in c.call("ListTransactions")["transactions"]}
            assert ids == {"b", "c"}
            assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"0"]
    finally:
        broker.kill()


def test_aborted_index_survives_restart_and_goes_with_its_segment(
    tmp_path: Path, backend: str
) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        extra_args=config_file(tmp_path, "segment_bytes = 1024\n"),
    ).start()
    partition_dir = tmp_path / "data" / "topics" / "t" / "0"
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 1) == 0
            tx = Txn(c)
            kept = []
            for i in range(12):
                value = b"%02d-" % i + b"v" * 200
                assert tx.send("t", 0, [value])["error"] == 0
                assert tx.end(committed=i % 2 == 0)["error"] == 0
                if i % 2 == 0:
                    kept.append(value)
            assert len(list(partition_dir.glob("*.txnindex"))) >= 2

            def everything() -> list[bytes]:
                out, offset = [], 0
                while True:
                    f = c.fetch("t", 0, offset, isolation_level=1)
                    if not f["records"]:
                        return out
                    out += committed_view(f)
                    offset = [h for _, h in scan_batches(f["records"])][-1].next_offset

            assert everything() == kept
        # kill -9: the active segment's aborted list was never written; replay rebuilds it.
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            assert everything() == kept
        # A damaged .txnindex: the whole log is replayed to rebuild every list.
        broker.kill()
        victim = sorted(partition_dir.glob("*.txnindex"))[0]
        victim.write_bytes(b"junk")
        broker.start(broker.port)
        with WireClient(broker.bootstrap) as c:
            assert everything() == kept
        assert broker.log_shows("txnindex_ignored")
        # Retention deletes old segments, and their aborted lists with them.
        broker.kill()
        config_file(
            tmp_path,
            "segment_bytes = 1024\nretention_bytes = 1\nretention_check_interval_ms = 50\n",
        )
        broker.start(broker.port)
        # A segment's files go one by one: wait until the .txnindex left are the log's too.
        _wait(
            lambda: (
                len(list(partition_dir.glob("*.log"))) == 1
                and {p.stem for p in partition_dir.glob("*.txnindex")}
                <= {p.stem for p in partition_dir.glob("*.log")}
            )
        )
        with WireClient(broker.bootstrap) as c:
            start = c.fetch("t", 0, 0, isolation_level=1)["log_start_offset"]
            f = c.fetch("t", 0, start, isolation_level=1)
            assert all(a["first_offset"] >= 0 for a in f["aborted_transactions"])
            assert set(committed_view(f)) <= set(kept)
    finally:
        broker.kill()


_SUMMARY = re.compile(r"event=txn_summary seconds=\d+ committed=(\d+) aborted=(\d+)$")


def test_info_logs_a_summary_of_transactions_not_a_line_each(tmp_path: Path, backend: str) -> None:
    """Tried: 5 transactions committed and 2 aborted, at INFO with a 1 s summary interval,
    then 1 more and a stop. No line per transaction; summary lines that count all 7, none
    of them zero; the one that ended after the last interval is counted at the stop."""
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        extra_args=config_file(tmp_path, "log_summary_interval_ms = 1000\n"),
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 1) == 0
            for i in range(7):
                tx = Txn(c)
                assert tx.send("t", 0, [b"%d" % i])["error"] == 0
                assert tx.end(committed=i < 5)["error"] == 0

        def counted() -> list[tuple[int, int]]:
            found = (_SUMMARY.search(line) for line in list(broker.log_lines))
            return [(int(m.group(1)), int(m.group(2))) for m in found if m]

        _wait(lambda: tuple(map(sum, zip(*counted(), strict=True))) == (5, 2))
        with WireClient(broker.bootstrap) as c:
            tx = Txn(c)
            assert tx.send("t", 0, [b"last"])["error"] == 0
            assert tx.end(committed=True)["error"] == 0
        assert broker.terminate() == 0
        assert broker.log_shows("event=stopped")
        assert tuple(map(sum, zip(*counted(), strict=True))) == (6, 2)
        assert all(committed + aborted > 0 for committed, aborted in counted())
        assert "event=txn_decided" not in broker.log_text()
    finally:
        broker.kill()


def test_a_commit_marks_a_partition_whose_producer_state_was_evicted(
    tmp_path: Path, backend: str
) -> None:
    """With max_producers_per_partition = 1, an idempotent producer's batch on partition 0
    evicts the transactional producer's state there while its transaction stays open:
    the commit still writes its marker on both partitions, though the epoch of the
    one open on partition 0 is no longer known (a marker is otherwise due only where
    the transaction's own epoch is open), so read_committed sees the whole commit."""
    broker = BrokerProcess(
        tmp_path / "data", backend=backend, config="max_producers_per_partition = 1\n"
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 2) == 0
            tx = Txn(c)
            assert tx.send("t", 0, [b"a"])["error"] == 0
            assert tx.send("t", 1, [b"b"])["error"] == 0
            pid, epoch = c.init_producer()
            batch = values_batch([b"x"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
            assert c.produce("t", 0, batch, acks=-1)["error"] == 0
            assert tx.end(committed=True)["error"] == 0
            assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"a", b"x"]
            assert committed_view(c.fetch("t", 1, 0, isolation_level=1)) == [b"b"]
    finally:
        broker.kill()
