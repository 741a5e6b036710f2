"""EndTxn sent right behind the last Produce, against the real broker process.

EndTxn may name, per partition, the sequence the producer's last batch there ends
at (`last_sequences`, commit only): the broker commits only when its log holds
exactly that, and otherwise answers CONCURRENT_TRANSACTIONS(51) and changes
nothing. A batch of the transaction that just ended, resent because the lost
connection took its answer, is answered as the duplicate it is; any other batch
of that epoch stays INVALID_PRODUCER_EPOCH(47).

Every test runs on both backends and asserts on what the log holds: the records a
read_committed and a read_uncommitted Fetch return, the offsets, and the states
ListTransactions shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.crash_points import ENV
from harness.broker_process import BrokerProcess
from harness.txn import TXN, Txn, committed_view, log_view
from harness.wire import WireClient, values_batch
from protocol.errors import ErrorCode

# (topic, partition) -> the sequence the producer's last batch there ends at.
LastSequences = dict[tuple[str, int], int]


@pytest.fixture
def c(broker: BrokerProcess) -> Iterator[WireClient]:
    with WireClient(broker.bootstrap) as client:
        assert client.create_topic("t", 3) == 0
        yield client


def _batch(tx: Txn, values: list[bytes], base_sequence: int, epoch: int | None = None) -> bytes:
    return values_batch(
        values,
        producer_id=tx.pid,
        producer_epoch=tx.epoch if epoch is None else epoch,
        base_sequence=base_sequence,
        transactional=True,
    )


def _send_produce(
    c: WireClient, batches: dict[tuple[str, int], bytes], acks: int = -1, tid: str = TXN
) -> int:
    """Send one transactional Produce without reading its answer; returns its cid."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), records in batches.items():
        topics.setdefault(topic, []).append({"partition": partition, "records": records})
    return c.send(
        "Produce",
        acks=acks,
        timeout_ms=10_000,
        transactional_id=tid,
        topics=[{"topic": t, "partitions": ps} for t, ps in topics.items()],
    )


def _last_sequences(last: LastSequences) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, int]]] = {}
    for (topic, partition), sequence in last.items():
        topics.setdefault(topic, []).append({"partition": partition, "last_sequence": sequence})
    return [{"topic": t, "partitions": ps} for t, ps in topics.items()]


def _send_end(
    c: WireClient, tx: Txn, committed: bool, last: LastSequences | list[Any] | None
) -> int:
    """Send EndTxn with `last_sequences` (a mapping, or the raw list) without reading."""
    fields: dict[str, Any] = {}
    if last is not None:
        fields["last_sequences"] = _last_sequences(last) if isinstance(last, dict) else last
    return c.send(
        "EndTxn",
        transactional_id=tx.id,
        producer_id=tx.pid,
        producer_epoch=tx.epoch,
        committed=committed,
        **fields,
    )


def _answer(c: WireClient, cid: int) -> dict[str, Any]:
    r = c.recv()
    assert r["cid"] == cid, (r, cid)
    return r


def _end(
    c: WireClient, tx: Txn, committed: bool, last: LastSequences | list[Any] | None
) -> dict[str, Any]:
    """EndTxn with `last_sequences`; on success `tx` moves to the next epoch, as Txn.end."""
    r = _answer(c, _send_end(c, tx, committed, last))
    if r["error"] == 0:
        tx.pid, tx.epoch = r["producer_id"], r["producer_epoch"]
        tx.seqs = {}
    return r


def _partitions(produced: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(t["topic"], p["partition"]): p for t in produced["topics"] for p in t["partitions"]}


def _listing(c: WireClient, tid: str = TXN) -> dict[str, Any]:
    [listing] = c.call("ListTransactions", transactional_id_prefix=tid)["transactions"]
    assert listing["transactional_id"] == tid
    return listing


def _assert_ongoing(c: WireClient, tx: Txn, partitions: list[int]) -> None:
    """The transaction is still open at the same pid and epoch, holding `partitions` of t."""
    listing = _listing(c, tx.id)
    assert (listing["state"], listing["producer_id"], listing["producer_epoch"]) == (
        "ONGOING",
        tx.pid,
        tx.epoch,
    )
    assert listing["partitions"] == [{"topic": "t", "partitions": partitions}]


def _assert_refused_51(r: dict[str, Any]) -> None:
    assert r["error"] == ErrorCode.CONCURRENT_TRANSACTIONS, r
    assert "not all written" in r["message"], r


def _wait(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _high_watermark(c: WireClient, partition: int) -> int:
    hw: int = c.fetch("t", partition, 0)["high_watermark"]
    return hw


# ------------------------------------------------------------------ pipelined commit


def test_pipelined_commit_lands_whole(c: WireClient) -> None:
    """Two Produce requests (two partitions, two batches on partition 0) and EndTxn
    naming each partition's last sequence, sent without reading an answer between."""
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    first = _send_produce(
        c, {("t", 0): _batch(tx, [b"a0", b"a1"], 0), ("t", 1): _batch(tx, [b"b0"], 0)}
    )
    second = _send_produce(c, {("t", 0): _batch(tx, [b"a2", b"a3", b"a4"], 2)})
    end = _send_end(c, tx, True, {("t", 0): 4, ("t", 1): 0})
    p1 = _partitions(_answer(c, first))
    p2 = _partitions(_answer(c, second))
    ended = _answer(c, end)
    assert {k: (p["error"], p["base_offset"]) for k, p in p1.items()} == {
        ("t", 0): (0, 0),
        ("t", 1): (0, 0),
    }
    assert (p2["t", 0]["error"], p2["t", 0]["base_offset"]) == (0, 2)
    assert (ended["error"], ended["producer_id"], ended["producer_epoch"]) == (0, pid, epoch + 1)

    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 6
    assert committed_view(rc) == [b"a0", b"a1", b"a2", b"a3", b"a4"]
    assert rc["aborted_transactions"] == []
    assert log_view(rc) == [
        ("data", [b"a0", b"a1"]),
        ("data", [b"a2", b"a3", b"a4"]),
        ("COMMIT", pid),
    ]
    rc = c.fetch("t", 1, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 2
    assert committed_view(rc) == [b"b0"]
    assert log_view(rc) == [("data", [b"b0"]), ("COMMIT", pid)]
    assert c.fetch("t", 2, 0)["records"] == b""  # never written: no marker either
    listing = _listing(c)
    assert (listing["state"], listing["producer_epoch"]) == ("COMPLETE_COMMIT", epoch + 1)


def test_a_pipelined_end_txn_ahead_of_a_batch_is_refused_then_retried(c: WireClient) -> None:
    """EndTxn names sequence 4 on partition 0 while the batch of sequences 2-4 is sent
    only after it (as if a client reordered them): 51, nothing ends; the batch then
    lands in the same transaction and the retried EndTxn, pipelined too, commits."""
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    first = _send_produce(c, {("t", 0): _batch(tx, [b"a0", b"a1"], 0)})
    early = _send_end(c, tx, True, {("t", 0): 4})
    second = _send_produce(c, {("t", 0): _batch(tx, [b"a2", b"a3", b"a4"], 2)})
    end = _send_end(c, tx, True, {("t", 0): 4})
    assert _partitions(_answer(c, first))["t", 0]["error"] == 0
    _assert_refused_51(_answer(c, early))
    p2 = _partitions(_answer(c, second))["t", 0]
    assert (p2["error"], p2["base_offset"]) == (0, 2)  # the same epoch: not fenced
    ended = _answer(c, end)
    assert (ended["error"], ended["producer_id"], ended["producer_epoch"]) == (0, pid, epoch + 1)
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 6
    assert committed_view(rc) == [b"a0", b"a1", b"a2", b"a3", b"a4"]
    assert log_view(rc) == [
        ("data", [b"a0", b"a1"]),
        ("data", [b"a2", b"a3", b"a4"]),
        ("COMMIT", pid),
    ]


def test_pipelined_commits_back_to_back(c: WireClient) -> None:
    """Three transactions, each Produce + EndTxn pipelined, the next sent before the
    previous answers were read: each commits with its own marker."""
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    cids = []
    for i in range(3):
        e = epoch + i
        cids.append(_send_produce(c, {("t", 0): _batch(tx, [b"r%d" % i], 0, epoch=e)}))
        cids.append(
            c.send(
                "EndTxn",
                transactional_id=TXN,
                producer_id=pid,
                producer_epoch=e,
                committed=True,
                last_sequences=_last_sequences({("t", 0): 0}),
            )
        )
    answers = [_answer(c, cid) for cid in cids]
    offsets = [_partitions(a)["t", 0]["base_offset"] for a in answers[0::2]]
    assert [_partitions(a)["t", 0]["error"] for a in answers[0::2]] == [0, 0, 0]
    assert offsets == [0, 2, 4]
    assert [(a["error"], a["producer_epoch"]) for a in answers[1::2]] == [
        (0, epoch + 1),
        (0, epoch + 2),
        (0, epoch + 3),
    ]
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 6
    assert committed_view(rc) == [b"r0", b"r1", b"r2"]
    assert log_view(rc) == [x for i in range(3) for x in (("data", [b"r%d" % i]), ("COMMIT", pid))]


# ------------------------------------------------------------------ refusals (51)


def test_a_sequence_not_yet_written_is_refused_and_changes_nothing(c: WireClient) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    assert tx.send("t", 0, [b"x0", b"x1"])["error"] == 0  # sequences 0-1
    # As if the batch of sequences 2-3 were still on its way.
    _assert_refused_51(_end(c, tx, True, {("t", 0): 3}))
    assert (tx.pid, tx.epoch) == (pid, epoch)
    _assert_ongoing(c, tx, [0])
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert (rc["last_stable_offset"], rc["high_watermark"], rc["records"]) == (0, 2, b"")
    assert log_view(c.fetch("t", 0, 0)) == [("data", [b"x0", b"x1"])]  # no marker
    # A sequence behind the last one written is not the last either.
    _assert_refused_51(_end(c, tx, True, {("t", 0): 0}))
    _assert_ongoing(c, tx, [0])
    # The missing batch arrives; EndTxn again, with the right sequences, commits it all.
    assert tx.send("t", 0, [b"x2", b"x3"])["error"] == 0
    r = _end(c, tx, True, {("t", 0): 3})
    assert (r["error"], r["producer_id"], r["producer_epoch"]) == (0, pid, epoch + 1)
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 5
    assert committed_view(rc) == [b"x0", b"x1", b"x2", b"x3"]
    assert log_view(rc) == [("data", [b"x0", b"x1"]), ("data", [b"x2", b"x3"]), ("COMMIT", pid)]
    listing = _listing(c)
    assert (listing["state"], listing["producer_epoch"]) == ("COMPLETE_COMMIT", epoch + 1)


def test_a_refused_batch_fails_the_pipelined_commit_then_abort(c: WireClient) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    assert tx.send("t", 0, [b"kept"])["error"] == 0  # sequence 0
    # Sequences 5-6 leave a gap: refused, and the EndTxn right behind it names 6.
    produced = _send_produce(c, {("t", 0): _batch(tx, [b"gap0", b"gap1"], 5)})
    end = _send_end(c, tx, True, {("t", 0): 6})
    refused = _partitions(_answer(c, produced))["t", 0]
    assert refused["error"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, refused
    _assert_refused_51(_answer(c, end))
    _assert_ongoing(c, tx, [0])
    assert c.fetch("t", 0, 0, isolation_level=1)["last_stable_offset"] == 0
    # The client gives up on it: the abort ends what the log holds.
    r = _end(c, tx, False, None)
    assert (r["error"], r["producer_id"], r["producer_epoch"]) == (0, pid, epoch + 1)
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 2
    assert committed_view(rc) == []
    assert rc["aborted_transactions"] == [{"producer_id": pid, "first_offset": 0}]
    assert log_view(c.fetch("t", 0, 0)) == [("data", [b"kept"]), ("ABORT", pid)]
    assert _listing(c)["state"] == "COMPLETE_ABORT"


def test_a_batch_refused_on_a_new_partition_fails_the_commit(c: WireClient) -> None:
    """The first batch on partition 1 does not start at sequence 0: the transaction
    holds the partition, but no batch of it landed there."""
    tx = Txn(c)
    assert tx.send("t", 0, [b"zero"])["error"] == 0
    produced = _send_produce(c, {("t", 1): _batch(tx, [b"one"], 3)})
    end = _send_end(c, tx, True, {("t", 0): 0, ("t", 1): 3})
    assert _partitions(_answer(c, produced))["t", 1]["error"] == ErrorCode.UNKNOWN_PRODUCER_ID
    _assert_refused_51(_answer(c, end))
    listing = _listing(c)
    assert (listing["state"], listing["producer_epoch"]) == ("ONGOING", tx.epoch)
    assert c.fetch("t", 1, 0)["records"] == b""
    assert c.fetch("t", 0, 0, isolation_level=1)["last_stable_offset"] == 0
    # Naming only what landed commits it (a partition without a batch gets no marker).
    assert _end(c, tx, True, {("t", 0): 0})["error"] == 0
    assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"zero"]
    assert c.fetch("t", 1, 0)["records"] == b""


@pytest.mark.parametrize(
    "named",
    [
        pytest.param({("t", 1): 0}, id="partition-never-written"),
        pytest.param({("nope", 0): 0}, id="unknown-topic"),
        pytest.param({("t", 7): 0}, id="partition-out-of-range"),
        pytest.param({("t", -1): 0}, id="negative-partition"),
    ],
)
def test_a_partition_the_transaction_never_wrote_is_refused(
    c: WireClient, named: LastSequences
) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    assert tx.send("t", 0, [b"only"])["error"] == 0
    _assert_refused_51(_end(c, tx, True, {("t", 0): 0, **named}))
    _assert_ongoing(c, tx, [0])
    assert c.fetch("t", 0, 0, isolation_level=1)["last_stable_offset"] == 0
    for p in (1, 2):
        assert c.fetch("t", p, 0)["records"] == b""
    # The broker is fine and the transaction still commits.
    r = _end(c, tx, True, {("t", 0): 0})
    assert (r["error"], r["producer_id"], r["producer_epoch"]) == (0, pid, epoch + 1)
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert committed_view(rc) == [b"only"]
    assert log_view(rc) == [("data", [b"only"]), ("COMMIT", pid)]


def test_a_partition_written_by_an_earlier_transaction_is_refused(c: WireClient) -> None:
    """Partition 1 holds sequence 0 of this producer, but of the previous epoch: the
    transaction now open never wrote it."""
    tx = Txn(c)
    assert tx.send("t", 1, [b"before"])["error"] == 0
    assert tx.end(committed=True)["error"] == 0
    assert tx.send("t", 0, [b"now"])["error"] == 0
    _assert_refused_51(_end(c, tx, True, {("t", 0): 0, ("t", 1): 0}))
    _assert_ongoing(c, tx, [0])
    assert _end(c, tx, True, {("t", 0): 0})["error"] == 0
    assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"now"]
    assert log_view(c.fetch("t", 1, 0)) == [("data", [b"before"]), ("COMMIT", tx.pid)]


# ------------------------------------------------------------------ validation (42)


@pytest.mark.parametrize(
    ("committed", "last"),
    [
        pytest.param(
            False,
            [{"topic": "t", "partitions": [{"partition": 0, "last_sequence": 0}]}],
            id="abort",
        ),
        pytest.param(False, [], id="abort-empty-list"),
        pytest.param(
            True,
            [
                {
                    "topic": "t",
                    "partitions": [
                        {"partition": 0, "last_sequence": 0},
                        {"partition": 0, "last_sequence": 0},
                    ],
                }
            ],
            id="partition-twice",
        ),
        pytest.param(
            True,
            [
                {"topic": "t", "partitions": [{"partition": 0, "last_sequence": 0}]},
                {"topic": "t", "partitions": [{"partition": 1, "last_sequence": 0}]},
            ],
            id="topic-twice",
        ),
        pytest.param(
            True,
            [{"topic": "t", "partitions": [{"partition": 0, "last_sequence": -1}]}],
            id="negative-sequence",
        ),
        pytest.param(
            True,
            [{"topic": "t", "partitions": [{"partition": 0, "last_sequence": 1 << 31}]}],
            id="sequence-past-2^31",
        ),
        pytest.param(True, [{"topic": "t"}], id="no-partitions-field"),
        pytest.param(
            True,
            [
                {
                    "topic": "t",
                    "partitions": [{"partition": i, "last_sequence": 0} for i in range(10_000)],
                }
            ],
            id="more-than-max_entries_per_request",
        ),
    ],
)
def test_an_invalid_last_sequences_is_an_invalid_request(
    c: WireClient, committed: bool, last: list[Any]
) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    assert tx.send("t", 0, [b"v"])["error"] == 0
    r = _end(c, tx, committed, last)
    assert r["error"] == ErrorCode.INVALID_REQUEST, r
    _assert_ongoing(c, tx, [0])
    assert log_view(c.fetch("t", 0, 0)) == [("data", [b"v"])]
    # The connection is kept, and the transaction ends as it would have.
    r = _end(c, tx, committed, None)
    assert (r["error"], r["producer_epoch"]) == (0, epoch + 1)
    kind = "COMMIT" if committed else "ABORT"
    assert log_view(c.fetch("t", 0, 0)) == [("data", [b"v"]), (kind, pid)]


# ------------------------------------------------------------------ an empty list


def test_an_empty_list_on_an_empty_transaction_commits(c: WireClient) -> None:
    tx = Txn(c)
    epoch = tx.epoch
    r = _end(c, tx, True, {})
    assert (r["error"], r["producer_epoch"]) == (0, epoch + 1)
    assert c.fetch("t", 0, 0)["records"] == b""
    listing = _listing(c)
    assert (listing["state"], listing["producer_epoch"]) == ("COMPLETE_COMMIT", epoch + 1)


def test_an_empty_list_with_batches_commits_as_plain_end_txn(c: WireClient) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    assert tx.send("t", 0, [b"e0"])["error"] == 0
    assert tx.send("t", 2, [b"e2", b"e2b"])["error"] == 0
    r = _end(c, tx, True, {})
    assert (r["error"], r["producer_id"], r["producer_epoch"]) == (0, pid, epoch + 1)
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 2
    assert committed_view(rc) == [b"e0"]
    rc = c.fetch("t", 2, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 3
    assert log_view(rc) == [("data", [b"e2", b"e2b"]), ("COMMIT", pid)]
    assert _listing(c)["state"] == "COMPLETE_COMMIT"


# ------------------------------------------------------------------ resends after the end


def test_a_resend_after_the_end_is_its_duplicate_and_a_new_batch_is_fenced(
    c: WireClient,
) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    b0 = _batch(tx, [b"x", b"y"], 0)
    b1 = _batch(tx, [b"z"], 2)
    first = c.produce("t", 0, b0, acks=-1, transactional_id=TXN)
    second = c.produce("t", 0, b1, acks=-1, transactional_id=TXN)
    assert (first["error"], first["base_offset"], first["duplicate"]) == (0, 0, False)
    assert (second["error"], second["base_offset"], second["duplicate"]) == (0, 2, False)
    assert tx.end(committed=True)["error"] == 0
    assert tx.epoch == epoch + 1
    expected = [("data", [b"x", b"y"]), ("data", [b"z"]), ("COMMIT", pid)]
    assert _high_watermark(c, 0) == 4
    # The same bytes again (pid, the ended epoch, the same sequences): their duplicates.
    for batch, base, acks in ((b0, 0, -1), (b1, 2, -1), (b0, 0, 1)):
        again = c.produce("t", 0, batch, acks=acks, transactional_id=TXN)
        assert (again["error"], again["base_offset"], again["duplicate"]) == (0, base, True), again
    assert _high_watermark(c, 0) == 4
    assert log_view(c.fetch("t", 0, 0)) == expected
    # A new batch of the ended epoch: fenced, never appended.
    late = c.produce("t", 0, _batch(tx, [b"late"], 3, epoch=epoch), acks=-1, transactional_id=TXN)
    assert late["error"] == ErrorCode.INVALID_PRODUCER_EPOCH, late
    assert not late["duplicate"]
    # ...and so is a batch that overlaps the written ones without repeating one.
    overlap = c.produce(
        "t", 0, _batch(tx, [b"y", b"z"], 1, epoch=epoch), acks=-1, transactional_id=TXN
    )
    assert overlap["error"] == ErrorCode.INVALID_PRODUCER_EPOCH, overlap
    # ...and a resend to a partition the ended transaction never wrote.
    elsewhere = c.produce("t", 1, b0, acks=-1, transactional_id=TXN)
    assert elsewhere["error"] == ErrorCode.INVALID_PRODUCER_EPOCH, elsewhere
    assert _high_watermark(c, 0) == 4
    assert log_view(c.fetch("t", 0, 0)) == expected
    assert c.fetch("t", 1, 0)["records"] == b""
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert committed_view(rc) == [b"x", b"y", b"z"]
    # The next transaction is untouched by all that.
    listing = _listing(c)
    assert (listing["state"], listing["producer_epoch"]) == ("COMPLETE_COMMIT", epoch + 1)
    assert tx.send("t", 0, [b"next"])["error"] == 0
    assert tx.end(committed=True)["error"] == 0
    assert committed_view(c.fetch("t", 0, 0, isolation_level=1)) == [b"x", b"y", b"z", b"next"]


def test_a_resend_after_an_abort_is_its_duplicate_and_stays_aborted(c: WireClient) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    b0 = _batch(tx, [b"gone"], 0)
    assert c.produce("t", 0, b0, acks=-1, transactional_id=TXN)["base_offset"] == 0
    assert tx.end(committed=False)["error"] == 0
    again = c.produce("t", 0, b0, acks=-1, transactional_id=TXN)
    assert (again["error"], again["base_offset"], again["duplicate"]) == (0, 0, True)
    assert log_view(c.fetch("t", 0, 0)) == [("data", [b"gone"]), ("ABORT", pid)]
    rc = c.fetch("t", 0, 0, isolation_level=1)
    assert rc["last_stable_offset"] == rc["high_watermark"] == 2
    assert committed_view(rc) == []
    # The ended transaction's EndTxn retried to commit it: the abort stands.
    r = c.call(
        "EndTxn", transactional_id=TXN, producer_id=pid, producer_epoch=epoch, committed=True
    )
    assert r["error"] == ErrorCode.INVALID_TXN_STATE, r


def test_a_resend_once_the_next_transaction_wrote_the_partition_is_fenced(
    c: WireClient,
) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    b0 = _batch(tx, [b"old"], 0)
    b1 = _batch(tx, [b"old-1"], 0)
    assert c.produce("t", 0, b0, acks=-1, transactional_id=TXN)["error"] == 0
    assert c.produce("t", 1, b1, acks=-1, transactional_id=TXN)["error"] == 0
    assert tx.end(committed=True)["error"] == 0
    # The next transaction (epoch + 1) writes partition 0 only.
    assert tx.send("t", 0, [b"new"])["error"] == 0
    # Partition 0 now holds the new epoch: the old batch there is fenced.
    stale = c.produce("t", 0, b0, acks=-1, transactional_id=TXN)
    assert stale["error"] == ErrorCode.INVALID_PRODUCER_EPOCH, stale
    # Partition 1 still has the ended transaction's batch as its newest: a duplicate.
    again = c.produce("t", 1, b1, acks=-1, transactional_id=TXN)
    assert (again["error"], again["base_offset"], again["duplicate"]) == (0, 0, True)
    assert tx.end(committed=True)["error"] == 0
    assert log_view(c.fetch("t", 0, 0)) == [
        ("data", [b"old"]),
        ("COMMIT", pid),
        ("data", [b"new"]),
        ("COMMIT", pid),
    ]
    assert log_view(c.fetch("t", 1, 0)) == [("data", [b"old-1"]), ("COMMIT", pid)]
    assert tx.epoch == epoch + 2


def test_a_resend_after_a_new_init_producer_id_is_fenced(c: WireClient) -> None:
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    b0 = _batch(tx, [b"v"], 0)
    assert c.produce("t", 0, b0, acks=-1, transactional_id=TXN)["error"] == 0
    assert tx.end(committed=True)["error"] == 0
    again = c.produce("t", 0, b0, acks=-1, transactional_id=TXN)
    assert (again["error"], again["duplicate"]) == (0, True)  # still the one just ended
    fresh = Txn(c)  # a new instance of the same transactional id
    assert fresh.pid == pid and fresh.epoch > epoch + 1
    fenced = c.produce("t", 0, b0, acks=-1, transactional_id=TXN)
    assert fenced["error"] == ErrorCode.INVALID_PRODUCER_EPOCH, fenced
    assert not fenced["duplicate"]
    # The epoch the last transaction ended at is fenced now too.
    mid = c.produce("t", 0, _batch(tx, [b"mid"], 0), acks=-1, transactional_id=TXN)
    assert mid["error"] == ErrorCode.INVALID_PRODUCER_EPOCH, mid
    assert _high_watermark(c, 0) == 2
    assert log_view(c.fetch("t", 0, 0)) == [("data", [b"v"]), ("COMMIT", pid)]


def test_lost_answers_of_a_pipelined_commit_are_recovered_on_a_new_connection(
    broker: BrokerProcess, c: WireClient
) -> None:
    """Produce and EndTxn pipelined on one connection whose answers the client never
    reads; on another connection it resends both, as a client does after a lost
    connection: the batch is its duplicate, the EndTxn the answer it lost."""
    tx = Txn(c)
    pid, epoch = tx.pid, tx.epoch
    batches = {("t", 0): _batch(tx, [b"p0"], 0), ("t", 1): _batch(tx, [b"p1", b"p1b"], 0)}
    last = {("t", 0): 0, ("t", 1): 1}
    with WireClient(broker.bootstrap) as lost:
        produced = _send_produce(lost, batches)
        end = _send_end(lost, tx, True, last)
        with WireClient(broker.bootstrap) as retry:
            # The first connection's requests ran (their answers wait unread).
            _wait(lambda: _listing(retry)["state"] == "COMPLETE_COMMIT")
            again = _partitions(_answer(retry, _send_produce(retry, batches)))
            assert {
                k: (p["error"], p["base_offset"], p["duplicate"]) for k, p in again.items()
            } == {
                ("t", 0): (0, 0, True),
                ("t", 1): (0, 0, True),
            }
            r = _answer(retry, _send_end(retry, tx, True, last))
            assert (r["error"], r["producer_id"], r["producer_epoch"]) == (0, pid, epoch + 1)
        # The first connection's answers, read at last, say the same.
        original = _partitions(_answer(lost, produced))
        assert {k: (p["error"], p["base_offset"]) for k, p in original.items()} == {
            ("t", 0): (0, 0),
            ("t", 1): (0, 0),
        }
        assert _answer(lost, end)["producer_epoch"] == epoch + 1
    assert log_view(c.fetch("t", 0, 0, isolation_level=1)) == [("data", [b"p0"]), ("COMMIT", pid)]
    assert log_view(c.fetch("t", 1, 0, isolation_level=1)) == [
        ("data", [b"p1", b"p1b"]),
        ("COMMIT", pid),
    ]


# ------------------------------------------------------------------ kill -9


def test_a_pipelined_commit_survives_kill_9(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("t", 3) == 0
        tx = Txn(c)
        pid, epoch = tx.pid, tx.epoch
        b0 = _batch(tx, [b"k0", b"k1"], 0)
        b2 = _batch(tx, [b"k2"], 0)
        produced = _send_produce(c, {("t", 0): b0, ("t", 2): b2})
        end = _send_end(c, tx, True, {("t", 0): 1, ("t", 2): 0})
        assert all(p["error"] == 0 for p in _partitions(_answer(c, produced)).values())
        assert _answer(c, end)["error"] == 0
    broker.restart(kill=True)
    with WireClient(broker.bootstrap) as c:
        rc = c.fetch("t", 0, 0, isolation_level=1)
        assert rc["last_stable_offset"] == rc["high_watermark"] == 3
        assert committed_view(rc) == [b"k0", b"k1"]
        assert log_view(rc) == [("data", [b"k0", b"k1"]), ("COMMIT", pid)]
        rc = c.fetch("t", 2, 0, isolation_level=1)
        assert committed_view(rc) == [b"k2"]
        assert log_view(rc) == [("data", [b"k2"]), ("COMMIT", pid)]
        assert c.fetch("t", 1, 0)["records"] == b""
        listing = _listing(c)
        assert (listing["state"], listing["producer_id"], listing["producer_epoch"]) == (
            "COMPLETE_COMMIT",
            pid,
            epoch + 1,
        )
        # The lost answers, asked for again after the crash: the same.
        again = c.produce("t", 0, b0, acks=-1, transactional_id=TXN)
        assert (again["error"], again["base_offset"], again["duplicate"]) == (0, 0, True), again
        r = c.call(
            "EndTxn",
            transactional_id=TXN,
            producer_id=pid,
            producer_epoch=epoch,
            committed=True,
            last_sequences=_last_sequences({("t", 0): 1, ("t", 2): 0}),
        )
        assert (r["error"], r["producer_epoch"]) == (0, epoch + 1)
        assert _high_watermark(c, 0) == 3


@pytest.mark.parametrize("how", ["pipelined", "acks=1", "acks=1 then PrepareTxn"])
def test_no_decision_is_written_before_the_batches_are_synced(
    tmp_path: Path, backend: str, how: str
) -> None:
    """Killed as the first fsync round starts: the one the batches asked for (EndTxn
    sent right behind them) or the one EndTxn or PrepareTxn itself asks for (the
    batches sent with acks=1, answered from the page cache). No decision or PREPARED
    record may have been written before that round: on a power loss, one on disk
    without a batch would commit the transaction without it. So after the restart the
    transaction is still open, nothing is readable at read_committed, and the client's
    retries finish it whole."""
    broker = BrokerProcess(
        tmp_path / "data", backend=backend, env={ENV: "flush_round_started"}
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 3) == 0
            tx = Txn(c)
            batches = {("t", p): _batch(tx, [b"v%d" % p], 0) for p in range(3)}
            last = {key: 0 for key in batches}
            if how == "pipelined":
                _send_produce(c, batches)
                _send_end(c, tx, True, last)
            else:
                produced = _answer(c, _send_produce(c, batches, acks=1))
                assert all(p["error"] == 0 for p in _partitions(produced).values())
                if how == "acks=1":
                    _send_end(c, tx, True, None)
                else:
                    c.send(
                        "PrepareTxn",
                        transactional_id=tx.id,
                        producer_id=tx.pid,
                        producer_epoch=tx.epoch,
                        prepared_timeout_ms=60_000,
                    )
            with pytest.raises((ConnectionError, OSError, EOFError)):
                c.recv()
        broker.restart_after_crash_point()
        with WireClient(broker.bootstrap) as c:
            _assert_ongoing(c, tx, [0, 1, 2])
            for p in range(3):
                rc = c.fetch("t", p, 0, isolation_level=1)
                assert (rc["last_stable_offset"], rc["records"]) == (0, b"")
            again = _answer(c, _send_produce(c, batches))
            assert all(p["duplicate"] for p in _partitions(again).values()), again
            assert _end(c, tx, True, last)["error"] == 0
            for p in range(3):
                rc = c.fetch("t", p, 0, isolation_level=1)
                assert committed_view(rc) == [b"v%d" % p]
    finally:
        broker.kill()
