"""Transactions end to end: the client SDK against the real broker process, both backends.

Commit and abort across partitions as each isolation level sees them, fencing
of a zombie, prepare plus a commit by another client with app-version
idempotence, the operator's tools, and a consumer reading while 200
transactions (half aborted) are written.
"""

from __future__ import annotations

import json
import pickle
import threading
import time

import pytest

from client import (
    AsyncProducer,
    Consumer,
    IllegalStateError,
    MinibrokerError,
    Producer,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TxnHandle,
)
from client.admin import (
    abort_transaction,
    abort_transactions,
    commit_transactions,
    commit_transactions_async,
    create_topic,
    describe_txn_apps,
    list_transactions,
    list_transactions_async,
)
from client.errors import CommitTxnsError
from client.types import ConsumerRecord
from harness.broker_process import BrokerProcess
from protocol.errors import ErrorCode
from tests.client.test_client_cli import cli

FAST = {"retry_backoff_ms": 20, "request_timeout_ms": 5_000, "delivery_timeout_ms": 10_000}


@pytest.fixture
def anyio_backend(backend: str) -> str:
    return backend


def read_all(bootstrap: str, topic: str, isolation_level: str) -> list[ConsumerRecord]:
    """Every record of `topic` the isolation level shows, up to its end offsets, in
    (partition, offset) order."""
    with Consumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
    ) as consumer:
        partitions = consumer.assignment()
        ends = consumer.end_offsets(partitions)
        out: list[ConsumerRecord] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, "consumer did not reach the end offsets"
            for records in consumer.poll(timeout_ms=200, max_records=100_000).values():
                out += records
        return sorted(out, key=lambda r: (r.partition, r.offset))


def values(records: list[ConsumerRecord]) -> list[bytes | None]:
    return [r.value for r in records]


def transactional(broker: BrokerProcess, transactional_id: str, **config: object) -> Producer:
    producer = Producer(broker.bootstrap, transactional_id=transactional_id, **FAST, **config)
    producer.init_transactions()
    return producer


# --------------------------------------------------------------------------- commit / abort


def test_commit_and_abort_across_three_partitions(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 3)
    with transactional(broker, "tx-1") as producer:
        with pytest.raises(IllegalStateError, match="begin_transaction"):
            producer.send("t", b"outside", partition=0)
        producer.begin_transaction()
        for p in range(3):
            producer.send("t", b"committed-%d" % p, partition=p)
        producer.commit_transaction()

        producer.begin_transaction()
        handles = [producer.send("t", b"aborted-%d" % p, partition=p) for p in range(3)]
        producer.flush()  # stored, then aborted: read_uncommitted sees them
        assert all(h.get(10).offset >= 0 for h in handles)
        producer.abort_transaction()

        producer.begin_transaction()
        producer.send("t", b"committed-again", partition=1)
        producer.commit_transaction()
        metrics = producer.metrics()
    assert (metrics["transactions_committed"], metrics["transactions_aborted"]) == (2, 1)

    committed = read_all(broker.bootstrap, "t", "read_committed")
    assert values(committed) == [b"committed-0", b"committed-1", b"committed-again", b"committed-2"]
    uncommitted = read_all(broker.bootstrap, "t", "read_uncommitted")
    assert sorted(values(uncommitted)) == sorted(
        [b"committed-%d" % p for p in range(3)]
        + [b"aborted-%d" % p for p in range(3)]
        + [b"committed-again"]
    )
    # The markers take offsets but are never handed out: 1 + 1 per transaction per partition.
    assert [r.offset for r in uncommitted if r.partition == 1] == [0, 2, 4]


def test_abort_drops_records_not_yet_sent(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 1)
    with transactional(broker, "tx-linger", linger_ms=5_000) as producer:
        producer.begin_transaction()
        handle = producer.send("t", b"never-sent")
        producer.abort_transaction()
        with pytest.raises(TransactionAbortedError):
            handle.get(10)
        producer.begin_transaction()
        producer.send("t", b"kept")
        producer.commit_transaction()
    assert values(read_all(broker.bootstrap, "t", "read_committed")) == [b"kept"]
    assert values(read_all(broker.bootstrap, "t", "read_uncommitted")) == [b"kept"]


def test_the_sync_context_manager_commits_or_aborts(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 2)
    with transactional(broker, "tx-cm") as producer:
        with producer.transaction():
            producer.send("t", b"in", partition=0)
            producer.send("t", b"in", partition=1)
        with pytest.raises(RuntimeError, match="boom"), producer.transaction():
            producer.send("t", b"out", partition=0)
            producer.flush()
            raise RuntimeError("boom")
        with producer.transaction():
            producer.send("t", b"in-again", partition=0)
    assert values(read_all(broker.bootstrap, "t", "read_committed")) == [
        b"in",
        b"in-again",
        b"in",
    ]


@pytest.mark.anyio
async def test_the_async_context_manager_commits_or_aborts(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 1)
    async with AsyncProducer(broker.bootstrap, transactional_id="tx-async", **FAST) as producer:
        await producer.init_transactions()
        async with producer.transaction():
            await producer.send("t", b"committed")
        with pytest.raises(ValueError):
            async with producer.transaction():
                handle = await producer.send("t", b"aborted")
                await handle
                raise ValueError
        async with producer.transaction():
            await producer.send("t", b"committed-2")
        # Closing with a transaction open aborts it.
        await producer.begin_transaction()
        await (await producer.send("t", b"open-at-close"))
    # The sync faces work from inside a running loop too (they run their own).
    committed = read_all(broker.bootstrap, "t", "read_committed")
    assert values(committed) == [b"committed", b"committed-2"]
    listings = await list_transactions_async(broker.bootstrap, "tx-async")
    assert [t.state for t in listings] == ["COMPLETE_ABORT"]


# --------------------------------------------------------------------------- fencing


def test_a_zombie_is_fenced_for_good(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 2)
    zombie = transactional(broker, "tx-z")
    try:
        zombie.begin_transaction()
        zombie.send("t", b"zombie", partition=0).get(10)
        successor = transactional(broker, "tx-z")  # fences the zombie, aborts its transaction
        with successor.transaction():
            successor.send("t", b"successor", partition=0)
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
        for call in (
            zombie.begin_transaction,
            zombie.commit_transaction,
            zombie.abort_transaction,
            zombie.init_transactions,
            lambda: zombie.send("t", b"late", partition=1),
        ):
            with pytest.raises(ProducerFencedError):
                call()
        with successor.transaction():
            successor.send("t", b"successor-2", partition=1)
        successor.close()
    finally:
        zombie.close()
    assert values(read_all(broker.bootstrap, "t", "read_committed")) == [
        b"successor",
        b"successor-2",
    ]


@pytest.mark.parametrize("end", ["commit", "abort"])
def test_a_zombie_cannot_end_the_transaction_it_was_fenced_in(
    broker: BrokerProcess, end: str
) -> None:
    """The successor's InitProducerId aborted the zombie's transaction: neither the zombie's
    commit nor its abort may succeed and hand it an epoch (it would share the successor's)."""
    create_topic(broker.bootstrap, "t", 1)
    with transactional(broker, "tx-z3") as zombie:
        zombie.begin_transaction()
        zombie.send("t", b"zombie").get(10)
        with transactional(broker, "tx-z3") as successor:
            with pytest.raises(ProducerFencedError):
                getattr(zombie, f"{end}_transaction")()
            with pytest.raises(ProducerFencedError):
                zombie.begin_transaction()
            with successor.transaction():
                successor.send("t", b"successor")
    assert values(read_all(broker.bootstrap, "t", "read_committed")) == [b"successor"]


def test_a_zombies_next_batch_is_fenced(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 1)
    with transactional(broker, "tx-z2") as zombie:
        zombie.begin_transaction()
        zombie.send("t", b"first").get(10)
        transactional(broker, "tx-z2").close()
        with pytest.raises(ProducerFencedError):
            zombie.send("t", b"second").get(10)
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
    assert read_all(broker.bootstrap, "t", "read_committed") == []


# --------------------------------------------------------------------------- prepare


def test_prepare_then_commit_elsewhere_with_app_version_idempotence(
    broker: BrokerProcess,
) -> None:
    create_topic(broker.bootstrap, "t", 3)
    writers = [transactional(broker, f"sink-{p}") for p in range(3)]
    try:

        def attempt(label: bytes) -> list[TxnHandle]:
            handles = []
            for p, writer in enumerate(writers):
                writer.begin_transaction()
                writer.send("t", label + b"-%d" % p, partition=p)
                handle = writer.prepare_transaction()
                with pytest.raises(IllegalStateError, match="prepared"):
                    writer.send("t", b"after-prepare", partition=p)
                # What an executor ships to the driver.
                handles.append(pickle.loads(pickle.dumps(handle)))
            return [TxnHandle.from_dict(json.loads(json.dumps(h.to_dict()))) for h in handles]

        first = attempt(b"first")
        assert {t.state for t in list_transactions(broker.bootstrap, "sink-")} == {"PREPARED"}
        # Prepared data is not readable yet.
        assert read_all(broker.bootstrap, "t", "read_committed") == []
        result = commit_transactions(broker.bootstrap, first, app_id="app", app_version=1)
        assert (result.already_committed, result.txn_app_version) == (False, 1)
        # A retry after a lost answer is harmless.
        assert commit_transactions(broker.bootstrap, first).already_committed is False

        # The micro-batch runs again: new epochs, the same app version.
        for writer in writers:
            writer.init_transactions()
        second = attempt(b"second")
        result = commit_transactions(broker.bootstrap, second, app_id="app", app_version=1)
        assert (result.already_committed, result.txn_app_version) == (True, 1)
        assert {t.state for t in list_transactions(broker.bootstrap, "sink-")} == {"COMPLETE_ABORT"}

        for writer in writers:
            writer.init_transactions()
        third = attempt(b"third")
        abort_transactions(broker.bootstrap, third)
        (app,) = describe_txn_apps(broker.bootstrap, ["app"])
        assert (app.txn_app_id, app.txn_app_version) == ("app", 1)
    finally:
        for writer in writers:
            writer.close()
    assert values(read_all(broker.bootstrap, "t", "read_committed")) == [
        b"first-0",
        b"first-1",
        b"first-2",
    ]
    assert len(read_all(broker.bootstrap, "t", "read_uncommitted")) == 9


def test_a_prepare_under_a_finished_app_version_is_refused_and_leaves_nothing_open(
    broker: BrokerProcess,
) -> None:
    """The late Spark task: its write was aborted (the version recorded as finished) before
    it prepared; the refusal aborts its transaction and the producer can still close."""
    create_topic(broker.bootstrap, "t", 1)
    late = transactional(broker, "job.p0.a1")
    try:
        late.begin_transaction()
        late.send("t", b"late", partition=0)
        late.flush()
        result = abort_transactions(broker.bootstrap, [], app_id="job", app_version=0)
        assert (result.already_committed, result.txn_app_version) == (False, 0)
        with pytest.raises(TransactionAbortableError, match="version 0 recorded") as refused:
            late.prepare_transaction(app_id="job", app_version=0)
        assert refused.value.code == ErrorCode.INVALID_TXN_STATE
        [listing] = list_transactions(broker.bootstrap, "job.")
        assert listing.state == "COMPLETE_ABORT"
        late.abort_transaction()  # the producer goes on
    finally:
        late.close()
    assert read_all(broker.bootstrap, "t", "read_committed") == []
    assert values(read_all(broker.bootstrap, "t", "read_uncommitted")) == [b"late"]


def test_commit_transactions_is_all_or_nothing(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 1)
    with transactional(broker, "good") as good, transactional(broker, "open") as still_open:
        good.begin_transaction()
        good.send("t", b"good")
        handle = good.prepare_transaction()
        still_open.begin_transaction()
        still_open.send("t", b"open").get(10)
        not_prepared = TxnHandle("open", handle.producer_id + 1_000, 0)
        with pytest.raises(CommitTxnsError) as failure:
            commit_transactions(broker.bootstrap, [handle, not_prepared])
        assert failure.value.errors["open"] != 0
        assert [t.state for t in list_transactions(broker.bootstrap, "good")] == ["PREPARED"]
        commit_transactions(broker.bootstrap, [handle])
        still_open.abort_transaction()
    assert values(read_all(broker.bootstrap, "t", "read_committed")) == [b"good"]


# --------------------------------------------------------------------------- operators


def test_an_operator_aborts_a_lingering_transaction(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 2)
    with transactional(broker, "ops-1") as producer:
        producer.begin_transaction()
        producer.send("t", b"lingering", partition=1).get(10)
        (listing,) = list_transactions(broker.bootstrap, "ops-", ["ONGOING"])
        assert [(e.topic, e.partitions) for e in listing.partitions] == [("t", [1])]
        # The open transaction holds back read_committed readers.
        assert read_all(broker.bootstrap, "t", "read_committed") == []

        aborted = abort_transaction(broker.bootstrap, "ops-1")
        assert aborted is not None and aborted.state == "ONGOING"
        assert abort_transaction(broker.bootstrap, "ops-1") is None
        assert list_transactions(broker.bootstrap, "ops-", ["ONGOING"]) == []

        # The owner learns at commit; an abort then lets it go on.
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        producer.abort_transaction()
        with producer.transaction():
            producer.send("t", b"next", partition=0)
    assert values(read_all(broker.bootstrap, "t", "read_committed")) == [b"next"]


def test_txn_cli(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", 1)
    with transactional(broker, "cli-1") as producer:
        producer.begin_transaction()
        producer.send("t", b"x").get(10)
        listed = cli(broker, "txn", "list", "--prefix", "cli-", "--state", "ONGOING")
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.decode().splitlines()
        assert header.startswith("TransactionalId")
        columns = row.split("\t")
        assert (columns[0], columns[3], columns[6]) == ("cli-1", "ONGOING", "t-0")
        aborted = cli(broker, "txn", "abort", "cli-1")
        assert aborted.returncode == 0, aborted.stderr
        assert b"Aborted the ONGOING transaction of cli-1" in aborted.stdout
        again = cli(broker, "txn", "abort", "cli-1")
        assert again.returncode == 1 and b"no open transaction" in again.stderr
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("t", b"y")
        handle = producer.prepare_transaction()
    commit_transactions(broker.bootstrap, [handle], app_id="cli-app", app_version=7)
    apps = cli(broker, "txn", "apps")
    assert apps.returncode == 0, apps.stderr
    assert apps.stdout.decode().splitlines()[1].split("\t")[:2] == ["cli-app", "7"]
    assert cli(broker, "txn", "apps", "other").stdout.decode().splitlines()[1:] == []


# --------------------------------------------------------------------------- a reader meanwhile


def test_a_reader_during_200_transactions_sees_exactly_the_committed_ones(
    broker: BrokerProcess,
) -> None:
    """Transaction i writes one record to each of 3 partitions and is aborted when i is odd.
    A read_committed consumer polling all along must never see an aborted record or a
    marker, and must see each committed record once, in order."""
    create_topic(broker.bootstrap, "t", 3)
    count = 200
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with transactional(broker, "loop") as producer:
                for i in range(count):
                    producer.begin_transaction()
                    for p in range(3):
                        producer.send("t", b"%d" % i, partition=p)
                    if i % 2:
                        producer.flush()  # stored before the abort, to be hidden
                        producer.abort_transaction()
                    else:
                        producer.commit_transaction()
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=write)
    seen: dict[int, list[int]] = {p: [] for p in range(3)}
    expected = [i for i in range(count) if i % 2 == 0]
    with Consumer("t", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as c:
        writer.start()
        deadline = time.monotonic() + 120
        while any(len(seen[p]) < len(expected) for p in range(3)):
            assert time.monotonic() < deadline, f"read only {[len(v) for v in seen.values()]}"
            assert not failures, failures
            for tp, records in c.poll(timeout_ms=200).items():
                for record in records:
                    assert record.value is not None, f"a control record: {record}"
                    i = int(record.value)
                    assert i % 2 == 0, f"aborted transaction {i} seen at {record}"
                    seen[tp.partition].append(i)
        writer.join(60)
        assert not failures, failures
        assert c.poll(timeout_ms=500) == {}
    for p in range(3):
        assert seen[p] == expected
    uncommitted = read_all(broker.bootstrap, "t", "read_uncommitted")
    assert len(uncommitted) == 3 * count
    assert all(r.value is not None for r in uncommitted)


def test_a_broken_transactional_id_setting_is_reported(broker: BrokerProcess) -> None:
    with (
        Producer(broker.bootstrap, transactional_id="tx-bad", transaction_timeout_ms=10**9) as p,
        pytest.raises(MinibrokerError, match="INVALID_TRANSACTION_TIMEOUT"),
    ):
        p.init_transactions()


def test_an_idempotent_producer_rejects_transaction_calls(broker: BrokerProcess) -> None:
    with Producer(broker.bootstrap) as producer:
        with pytest.raises(IllegalStateError, match="transactional_id"):
            producer.begin_transaction()
        producer.send("t", b"plain").get(10)


@pytest.mark.anyio
async def test_async_prepare_and_admin_commit(broker: BrokerProcess) -> None:
    async with AsyncProducer(broker.bootstrap, transactional_id="tx-prep", **FAST) as producer:
        await producer.init_transactions()
        await producer.begin_transaction()
        await producer.send("t", b"prepared")
        handle = await producer.prepare_transaction()
    assert handle == TxnHandle("tx-prep", handle.producer_id, handle.producer_epoch)
    await commit_transactions_async(broker.bootstrap, [handle])
    assert values(read_all(broker.bootstrap, "t", "read_committed")) == [b"prepared"]
