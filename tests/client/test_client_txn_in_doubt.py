"""A commit whose answer is lost is never reported as abortable (issue 35), against the
real broker process on both backends.

`commit_transaction()` sends EndTxn in the same write as the transaction's last
Produce requests. Once that EndTxn may have reached the broker, the transaction may
be committed, and a batch whose answer was lost then fails for reasons that say
nothing about it: its resend is fenced, or it times out while the broker is down.
What was tried here, each time with the first Produce answer dropped by a proxy
(so the connection, and with it the commit's answer, is cut):

- the broker killed (SIGKILL, from inside, at a crash point) at each step of the
  commit: the batches durable, the decision written, each marker written, the
  markers durable before the answer; it is restarted only after the client gave up;
- no kill, but every Produce resent after the cut swallowed, so the batches run out
  of delivery_timeout_ms while the commit itself went through.

Each time `commit_transaction()` either succeeds or raises the unknown-outcome
MinibrokerTimeoutError, never TransactionAbortableError; abort_transaction() is
refused meanwhile; asking again succeeds exactly when the records are visible at
read_committed, each once; and the producer goes on with the next transaction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.crash_points import ENV
from client import IllegalStateError, MinibrokerTimeoutError, Producer
from client.accumulator import RecordHandle
from client.admin import create_topic
from harness.broker_process import BrokerProcess
from tests.client.test_client_txn_integration import read_all
from tests.fault_proxy import FaultProxy

TOPIC = "in-doubt"
PARTITIONS = 2
# The records wait for the commit, so its Produce requests and EndTxn go in one write;
# the commit's retries (max_block_ms) outlast the batches' delivery_timeout_ms, which
# must not fail them, nor wake the sender in a loop, while the commit is in doubt.
SETTINGS: dict[str, Any] = {
    "linger_ms": 1_000,
    "request_timeout_ms": 1_000,
    "delivery_timeout_ms": 2_000,
    "max_block_ms": 2_500,
    "retry_backoff_ms": 20,
    "retry_backoff_max_ms": 100,
    "reconnect_backoff_ms": 20,
    "reconnect_backoff_max_ms": 100,
}
# Each step of a commit sent behind its batches, with the batches on both partitions.
CRASH_POINTS = [
    "txn_contents_durable",  # the batches durable, nothing decided
    "txn_decided",  # the decision written
    "txn_marker_written:1",  # the first partition's marker written
    "txn_marker_written:2",  # both markers written
    "txn_markers_durable",  # all durable, before the answer
]


def send_one_transaction(producer: Producer, number: int) -> dict[bytes, RecordHandle]:
    """Begin a transaction and send two records to each partition: {value: handle}."""
    producer.begin_transaction()
    sent: dict[bytes, RecordHandle] = {}
    for partition in range(PARTITIONS):
        for record in range(2):
            value = b"txn%d-p%d-r%d" % (number, partition, record)
            sent[value] = producer.send(TOPIC, value, partition=partition)
    return sent


def check_committed_once(
    broker: BrokerProcess, transactions: list[dict[bytes, RecordHandle]]
) -> None:
    """read_committed shows exactly the transactions' records, each once, and every
    handle reports success (at its record's offset, where the answer told it)."""
    committed = read_all(broker.bootstrap, TOPIC, "read_committed")
    where = {r.value: (r.partition, r.offset) for r in committed}
    expected = [v for sent in transactions for v in sent]
    assert sorted(r.value for r in committed if r.value is not None) == sorted(expected)
    assert len(committed) == len(expected), "a record is stored twice"
    for sent in transactions:
        for value, handle in sent.items():
            assert handle.exception() is None, (value, handle.exception())
            meta = handle.get(0)
            assert meta.partition == where[value][0]
            assert meta.offset in (-1, where[value][1]), value


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_commit_cut_off_by_a_broker_kill_is_unknown_until_asked_again(
    tmp_path: Path, backend: str, point: str
) -> None:
    broker = BrokerProcess(tmp_path / "data", backend=backend, env={ENV: point}).start()
    try:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        with (
            FaultProxy(
                lambda: (broker.host, broker.port),
                drop_response=1.0,
                limits={"drop_response": 1},
            ) as proxy,
            Producer(proxy.bootstrap, transactional_id="in-doubt", **SETTINGS) as producer,
        ):
            producer.init_transactions()
            first = send_one_transaction(producer, 0)
            # The broker dies at `point`; the batches' resends and the commit's own
            # retries meet no broker until max_block_ms is up.
            with pytest.raises(MinibrokerTimeoutError):
                producer.commit_transaction()
            assert broker.proc is not None and broker.proc.wait(15) != 0
            with pytest.raises(IllegalStateError, match=r"commit_transaction\(\) again"):
                producer.abort_transaction()
            broker.restart_after_crash_point()
            producer.commit_transaction()
            second = send_one_transaction(producer, 1)
            producer.commit_transaction()
            metrics = producer.metrics()
        assert metrics["transactions_committed"] == 2
        assert metrics["transactions_aborted"] == 0
        check_committed_once(broker, [first, second])
    finally:
        broker.kill()


def test_a_commit_whose_batches_run_out_of_time_after_it_committed_succeeds(
    broker: BrokerProcess,
) -> None:
    """The commit went through, but its answer was cut off with the first batch's, and
    every Produce resent after that is swallowed: the batches run out of
    delivery_timeout_ms. The commit asked again learns it committed; the batches it
    names are written (their offsets unknown where no answer came)."""
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    with (
        FaultProxy(
            lambda: (broker.host, broker.port),
            drop_response=1.0,
            drop_request=1.0,
            limits={"drop_response": 1},
            after={"drop_request": "drop_response"},
        ) as proxy,
        Producer(proxy.bootstrap, transactional_id="in-doubt", **SETTINGS) as producer,
    ):
        producer.init_transactions()
        sent = send_one_transaction(producer, 0)
        producer.commit_transaction()
        assert producer.metrics()["transactions_committed"] == 1
        assert proxy.injected["drop_response"] == 1 and proxy.injected["drop_request"] >= 1
    check_committed_once(broker, [sent])
