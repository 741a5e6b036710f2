"""Transactions through faults: the SDK's transactional producer, both faces, against
the real broker process through FaultProxy, on both backends.

commit_transaction() sends EndTxn(commit) in the same write as the transaction's last
Produce requests, naming each partition's last sequence; the broker commits only when
its log holds the batches up to there (else CONCURRENT_TRANSACTIONS, nothing changed).
When that EndTxn is refused or its answer lost, the client waits for every batch's
answer, resends the batches whose answers were lost (the broker answers a resend of
the transaction that just ended as its duplicate), and sends a plain EndTxn, which
gets the first one's answer if it had committed.

Here Produce and EndTxn requests and answers are dropped (the connection cut) at
random, a batch is refused, a committed transaction's answers are lost. Each test
then reads the topic back: read_committed holds every committed transaction's records
exactly once and in order and none of an aborted one, every record handle's offset is
where its record is, and no answer ever fenced the producer (its own retries must not).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from client import (
    AsyncProducer,
    MinibrokerTimeoutError,
    Producer,
    TransactionAbortableError,
)
from client.accumulator import RecordHandle
from client.admin import create_topic
from client.types import ConsumerRecord
from harness.broker_process import BrokerProcess
from protocol.batch import read_header
from protocol.errors import ErrorCode
from tests.client.test_client_txn_integration import read_all
from tests.fault_proxy import FaultProxy, Seen

TOPIC = "txn-faults"
PARTITIONS = 3
CONFIG: dict[str, Any] = {
    "retry_backoff_ms": 20,
    "retry_backoff_max_ms": 200,
    "reconnect_backoff_ms": 20,
    "reconnect_backoff_max_ms": 200,
    "request_timeout_ms": 5_000,
    "delivery_timeout_ms": 30_000,
    "max_block_ms": 15_000,
}
# Records wait for the commit: its Produce requests and its EndTxn then go in one write.
HELD: dict[str, Any] = {**CONFIG, "linger_ms": 60_000, "delivery_timeout_ms": 90_000}
DROPS = {
    "drop_request": 0.2,
    "drop_response": 0.2,
    "drop_end_txn_request": 0.2,
    "drop_end_txn_response": 0.2,
}
FENCING = {ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED}
# How the broker refuses a batch whose sequence it jumped (a first batch on a partition
# the producer has no state on: UNKNOWN_PRODUCER_ID); either way it appended nothing.
REFUSED = {ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID}
ATTEMPTS = 6  # of one transaction (each abort re-sends it) or of one commit or abort call

Sent = tuple[RecordHandle, int, bytes]  # a record's handle, partition and value


@pytest.fixture
def anyio_backend(backend: str) -> str:
    return backend


@pytest.fixture
def topic(broker: BrokerProcess) -> str:
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    return TOPIC


def proxy_to(broker: BrokerProcess, seed: int, **faults: Any) -> FaultProxy:
    return FaultProxy(
        lambda: (broker.host, broker.port), seed=seed, record={"Produce", "EndTxn"}, **faults
    ).start()


@dataclass
class Ledger:
    """What a test sent, by outcome, and how often it had to retry or abort."""

    committed: list[list[Sent]] = field(default_factory=list)  # in commit order
    aborted: list[list[Sent]] = field(default_factory=list)
    abortable: int = 0  # TransactionAbortableError, then abort and send again
    timeouts: int = 0  # MinibrokerTimeoutError, then the same call again


def plans(count: int, seed: int) -> list[list[tuple[int, int]]]:
    """Per transaction: (partition, record count) for 1 to 3 partitions, 1 to 4 records."""
    rng = random.Random(seed)
    return [
        [(p, rng.randint(1, 4)) for p in sorted(rng.sample(range(PARTITIONS), rng.randint(1, 3)))]
        for _ in range(count)
    ]


def value(txn: int, attempt: int, partition: int, record: int) -> bytes:
    return b"t%03d-a%d-p%d-r%d" % (txn, attempt, partition, record)


def deliberate_abort(txn: int) -> bool:
    """Every tenth transaction is aborted by the test once its records are stored."""
    return txn % 10 == 9


def finish_sync(call: Callable[[], None], ledger: Ledger) -> None:
    """commit_transaction() or abort_transaction(), called again after a timeout (the
    documented way to finish)."""
    for _ in range(ATTEMPTS):
        try:
            call()
            return
        except MinibrokerTimeoutError:
            ledger.timeouts += 1
    pytest.fail(f"{call} timed out {ATTEMPTS} times")


async def finish_async(call: Callable[[], Awaitable[None]], ledger: Ledger) -> None:
    for _ in range(ATTEMPTS):
        try:
            await call()
            return
        except MinibrokerTimeoutError:
            ledger.timeouts += 1
    pytest.fail(f"{call} timed out {ATTEMPTS} times")


def run_sync(producer: Producer, topic: str, txns: list[list[tuple[int, int]]]) -> Ledger:
    """Each transaction committed (or deliberately aborted); on TransactionAbortableError
    it is aborted and its records sent again in a new transaction."""
    ledger = Ledger()
    for txn, parts in enumerate(txns):
        for attempt in range(ATTEMPTS):
            producer.begin_transaction()
            sent: list[Sent] = []
            try:
                for partition, count in parts:
                    for record in range(count):
                        v = value(txn, attempt, partition, record)
                        sent.append((producer.send(topic, v, partition=partition), partition, v))
                if deliberate_abort(txn):
                    producer.flush()
                    finish_sync(producer.abort_transaction, ledger)
                    ledger.aborted.append(sent)
                    break
                finish_sync(producer.commit_transaction, ledger)
            except TransactionAbortableError:
                ledger.abortable += 1
                finish_sync(producer.abort_transaction, ledger)
                ledger.aborted.append(sent)
                continue
            ledger.committed.append(sent)
            break
        else:
            pytest.fail(f"transaction {txn} was not committed in {ATTEMPTS} attempts")
    return ledger


async def run_async(
    producer: AsyncProducer, topic: str, txns: list[list[tuple[int, int]]]
) -> Ledger:
    """run_sync, on the async face."""
    ledger = Ledger()
    for txn, parts in enumerate(txns):
        for attempt in range(ATTEMPTS):
            await producer.begin_transaction()
            sent: list[Sent] = []
            try:
                for partition, count in parts:
                    for record in range(count):
                        v = value(txn, attempt, partition, record)
                        handle = await producer.send(topic, v, partition=partition)
                        sent.append((handle, partition, v))
                if deliberate_abort(txn):
                    await producer.flush()
                    await finish_async(producer.abort_transaction, ledger)
                    ledger.aborted.append(sent)
                    break
                await finish_async(producer.commit_transaction, ledger)
            except TransactionAbortableError:
                ledger.abortable += 1
                await finish_async(producer.abort_transaction, ledger)
                ledger.aborted.append(sent)
                continue
            ledger.committed.append(sent)
            break
        else:
            pytest.fail(f"transaction {txn} was not committed in {ATTEMPTS} attempts")
    return ledger


# --------------------------------------------------------------------------- checks


def check_read_back(bootstrap: str, topic: str, ledger: Ledger) -> None:
    """read_committed: the committed transactions' records, each once, in commit order per
    partition, nothing else; each handle's offset is where its record is (for an aborted
    transaction's stored records too, read_uncommitted); nothing is stored twice."""
    committed = read_all(bootstrap, topic, "read_committed")
    uncommitted = read_all(bootstrap, topic, "read_uncommitted")
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for sent in ledger.committed:
        for _, partition, v in sent:
            expected[partition].append(v)
    got: dict[int, list[bytes | None]] = {p: [] for p in range(PARTITIONS)}
    for r in committed:
        got[r.partition].append(r.value)
    for p in range(PARTITIONS):
        assert got[p] == expected[p], f"partition {p}: read_committed is not the committed ones"

    where = {(r.partition, r.value): r.offset for r in committed}
    for sent in ledger.committed:
        for handle, partition, v in sent:
            assert handle.exception() is None, (v, handle.exception())
            meta = handle.get(0)
            assert (meta.partition, meta.offset) == (partition, where[partition, v]), v

    stored = [r.value for r in uncommitted]
    assert len(stored) == len(set(stored)), "a record is stored twice"
    sent_values = {v for sents in ledger.committed + ledger.aborted for _, _, v in sents}
    assert set(stored) <= sent_values
    at: dict[tuple[int, int], ConsumerRecord] = {(r.partition, r.offset): r for r in uncommitted}
    for sent in ledger.aborted:
        for handle, partition, v in sent:
            assert handle.done(), v
            if handle.exception() is None:
                meta = handle.get(0)
                assert meta.partition == partition
                assert at[partition, meta.offset].value == v, v


def answers(proxy: FaultProxy, api: str) -> list[Seen]:
    return [s for s in proxy.seen if s.api == api and s.direction == "response"]


def requests(proxy: FaultProxy, api: str) -> list[Seen]:
    return [s for s in proxy.seen if s.api == api and s.direction == "request"]


def exchanges(proxy: FaultProxy, api: str) -> list[tuple[Seen, Seen | None]]:
    """Each request of `api` the client sent, in order, with the broker's answer to it
    (delivered or not), or None when the broker never answered (the request dropped)."""
    answered = {(s.connection, s.message["cid"]): s for s in answers(proxy, api)}
    return [(r, answered.get((r.connection, r.message["cid"]))) for r in requests(proxy, api)]


def error(seen: Seen | None) -> int | None:
    return None if seen is None else seen.message.get("error", ErrorCode.NONE)


def partition_answers(seen: Seen) -> list[tuple[str, dict[str, Any]]]:
    return [
        (t["topic"], p) for t in seen.message.get("topics") or [] for p in t.get("partitions") or []
    ]


def assert_never_fenced(proxy: FaultProxy) -> None:
    """No answer the broker gave, delivered or not, fenced the producer."""
    for seen in answers(proxy, "Produce") + answers(proxy, "EndTxn"):
        codes = {seen.message.get("error", 0)} | {
            p.get("error", 0) for _, p in partition_answers(seen)
        }
        assert not codes & FENCING, seen


def pipelined(seen: Seen) -> bool:
    return seen.message.get("last_sequences") is not None


# --------------------------------------------------------------------------- many transactions


def check_many(proxy: FaultProxy, ledger: Ledger, txns: int, metrics: dict[str, float]) -> None:
    for fault in DROPS:
        assert proxy.injected[fault] >= 1, proxy.injected
    assert len(ledger.committed) == txns - sum(map(deliberate_abort, range(txns)))
    assert metrics["transactions_committed"] == len(ledger.committed)
    assert metrics["transactions_aborted"] == len(ledger.aborted)
    # Commits went right behind the batches, and a commit whose answer was lost was asked
    # again as it was sent (same pid, epoch and last sequences), never as a plain EndTxn
    # that would commit whatever the log holds.
    commits = [s.message for s in requests(proxy, "EndTxn") if s.message["committed"]]
    asked = [(m["producer_id"], m["producer_epoch"], str(m.get("last_sequences"))) for m in commits]
    assert all(m.get("last_sequences") for m in commits)
    assert len(asked) > len(set(asked))
    # And the one-round-trip commit worked between the faults: answered, and delivered.
    ends = exchanges(proxy, "EndTxn")
    assert any(
        pipelined(r) and a is not None and a.passed and error(a) == ErrorCode.NONE for r, a in ends
    )
    # Every EndTxn that reached the broker was answered, none with an error other than
    # CONCURRENT_TRANSACTIONS (a pipelined one that came before a batch: retried).
    for r, a in ends:
        assert (a is not None) == r.passed, (r, a)
        assert error(a) in (None, ErrorCode.NONE, ErrorCode.CONCURRENT_TRANSACTIONS), a
    assert_never_fenced(proxy)


@pytest.mark.parametrize(
    ("seed", "refused"),
    [(11, 0.0), (13, 0.1)],
    ids=["drops", "drops-and-refused-batches"],
)
def test_sync_many_transactions_through_faults(
    broker: BrokerProcess, topic: str, seed: int, refused: float
) -> None:
    """The drops; with `refused`, also that share of batches refused by the broker: those
    transactions must be aborted (TransactionAbortableError) and sent again."""
    txns = plans(60, seed=seed)
    with (
        proxy_to(broker, seed=seed, **DROPS, reject_out_of_order=refused) as proxy,
        Producer(proxy.bootstrap, transactional_id=f"many-sync-{seed}", **CONFIG) as producer,
    ):
        finish_sync(producer.init_transactions, Ledger())
        ledger = run_sync(producer, topic, txns)
        metrics = producer.metrics()
    check_many(proxy, ledger, len(txns), metrics)
    if refused:
        assert proxy.injected["reject_out_of_order"] >= 1
        assert ledger.abortable >= 1
    check_read_back(broker.bootstrap, topic, ledger)


@pytest.mark.anyio
async def test_async_many_transactions_through_dropped_requests_and_answers(
    broker: BrokerProcess, topic: str
) -> None:
    txns = plans(40, seed=12)
    with proxy_to(broker, seed=12, **DROPS) as proxy:
        async with AsyncProducer(
            proxy.bootstrap, transactional_id="many-async", **CONFIG
        ) as producer:
            await finish_async(producer.init_transactions, Ledger())
            ledger = await run_async(producer, topic, txns)
            metrics = producer.metrics()
    check_many(proxy, ledger, len(txns), metrics)
    await anyio.to_thread.run_sync(check_read_back, broker.bootstrap, topic, ledger)


# --------------------------------------------------------------------------- a refused batch


def test_a_refused_batch_refuses_the_pipelined_commit(broker: BrokerProcess, topic: str) -> None:
    """The broker refuses the first batch (its sequence jumped): the EndTxn sent
    behind it is answered CONCURRENT_TRANSACTIONS and commits nothing, commit_transaction
    raises TransactionAbortableError, the abort works and the next transaction commits."""
    ledger = Ledger()
    with (
        proxy_to(
            broker, seed=21, reject_out_of_order=1.0, limits={"reject_out_of_order": 1}
        ) as proxy,
        Producer(proxy.bootstrap, transactional_id="refused", **HELD) as producer,
    ):
        producer.init_transactions()
        for attempt in range(2):
            producer.begin_transaction()
            sent = [
                (
                    producer.send(topic, value(0, attempt, p, r), partition=p),
                    p,
                    value(0, attempt, p, r),
                )
                for p in (0, 1)
                for r in range(3)
            ]
            if attempt == 0:
                with pytest.raises(TransactionAbortableError) as refused:
                    producer.commit_transaction()
                assert refused.value.code in REFUSED
                failures = [h.exception() for h, _, _ in sent if h.exception() is not None]
                assert len(failures) == 3, failures  # the refused batch's records
                assert all(getattr(e, "code", None) == refused.value.code for e in failures)
                producer.abort_transaction()
                ledger.aborted.append(sent)
                # Nothing of it is visible to read_committed.
                assert read_all(broker.bootstrap, topic, "read_committed") == []
            else:
                producer.commit_transaction()
                ledger.committed.append(sent)
        metrics = producer.metrics()
    assert proxy.injected["reject_out_of_order"] == 1
    assert (metrics["transactions_committed"], metrics["transactions_aborted"]) == (1, 1)
    ends = [(r.message["committed"], pipelined(r), error(a)) for r, a in exchanges(proxy, "EndTxn")]
    # The refused commit sent no plain EndTxn after it (a batch had failed); the abort.
    assert ends == [
        (True, True, ErrorCode.CONCURRENT_TRANSACTIONS),
        (False, False, ErrorCode.NONE),
        (True, True, ErrorCode.NONE),
    ]
    assert_never_fenced(proxy)
    check_read_back(broker.bootstrap, topic, ledger)
    # The batch of the aborted attempt that was stored stays stored, hidden.
    assert len(read_all(broker.bootstrap, topic, "read_uncommitted")) == 9


# --------------------------------------------------------------------------- a lost commit answer

LOST = {
    # The commit's answer alone.
    "end_txn_answer": {"drop_end_txn_response": 1.0, "limits": {"drop_end_txn_response": 1}},
    # The first batch's answer, and with the cut every answer after it: the commit's too.
    "batch_and_end_txn_answers": {"drop_response": 1.0, "limits": {"drop_response": 1}},
}


def begin_two_per_partition(
    producer: Producer, topic: str, txn: int
) -> list[tuple[RecordHandle, int, bytes]]:
    """Begin transaction `txn` and send two records to each partition: (handle, partition,
    value) of each."""
    producer.begin_transaction()
    return [
        (producer.send(topic, value(txn, 0, p, r), partition=p), p, value(txn, 0, p, r))
        for p in range(PARTITIONS)
        for r in range(2)
    ]


@pytest.mark.parametrize("lost", LOST)
def test_a_commit_whose_answer_was_lost_is_finished_not_fenced(
    broker: BrokerProcess, topic: str, lost: str
) -> None:
    """The EndTxn sent behind the batches committed, then the connection was cut before its
    answer reached the client (and, in one case, a batch's answer too). The client asks
    the same EndTxn again, which gets the lost answer, and resends the batch, answered as
    the duplicate it is with its original offset: the producer goes on at the next epoch,
    nothing is stored twice, and the first transaction's handles report their records'
    offsets."""
    ledger = Ledger()
    with (
        proxy_to(broker, seed=31, **LOST[lost]) as proxy,
        Producer(proxy.bootstrap, transactional_id=f"lost-{lost}", **HELD) as producer,
    ):
        producer.init_transactions()
        first_epoch = producer.metrics()["producer_epoch"]
        for txn in range(2):
            sent = begin_two_per_partition(producer, topic, txn)
            producer.commit_transaction()
            ledger.committed.append(sent)
            if txn == 0:
                after_first = producer.metrics()
        metrics = producer.metrics()
    assert sum(proxy.injected.values()) == 1, proxy.injected

    # What the client sent and what the broker answered, whether or not it arrived.
    (first, first_answer), (retry, retry_answer), (second, second_answer) = exchanges(
        proxy, "EndTxn"
    )
    assert first_answer is not None and retry_answer is not None and second_answer is not None
    assert pipelined(first) and first.passed
    assert (first_answer.message["error"], first_answer.passed) == (ErrorCode.NONE, False)
    assert first_answer.message["producer_epoch"] == first_epoch + 1  # it committed
    assert retry.message["committed"] and pipelined(retry)
    assert retry.message["last_sequences"] == first.message["last_sequences"]
    assert (retry.message["producer_id"], retry.message["producer_epoch"]) == (
        first.message["producer_id"],
        first.message["producer_epoch"],
    )
    # The retry got the lost answer: the producer is at the next epoch, not fenced.
    assert retry_answer.passed and retry_answer.message["error"] == ErrorCode.NONE
    for key in ("producer_id", "producer_epoch"):
        assert retry_answer.message[key] == first_answer.message[key]
    assert after_first["producer_epoch"] == first_epoch + 1
    assert pipelined(second) and second_answer.message["error"] == ErrorCode.NONE
    assert second_answer.passed and metrics["producer_epoch"] == first_epoch + 2
    assert (metrics["transactions_committed"], metrics["transactions_aborted"]) == (2, 0)

    if lost == "batch_and_end_txn_answers":
        # The lost batch answer's partition: resent after the commit, answered as the
        # duplicate it is, at the offset the lost answer had.
        produce = answers(proxy, "Produce")
        lost_parts = [(t, p) for s in produce if not s.passed for t, p in partition_answers(s)]
        assert lost_parts and all(p["error"] == ErrorCode.NONE for _, p in lost_parts)
        resent = [
            (t, p) for s in produce if s.passed for t, p in partition_answers(s) if p["duplicate"]
        ]
        assert {(t, p["partition"], p["base_offset"]) for t, p in lost_parts} == {
            (t, p["partition"], p["base_offset"]) for t, p in resent
        }
        # The resends carried the first transaction's producer id and epoch.
        resent_batches = [
            read_header(p["records"])
            for s in requests(proxy, "Produce")[1:]
            for t in s.message["topics"]
            for p in t["partitions"]
        ]
        assert any(h.producer_epoch == first_epoch for h in resent_batches)
    assert_never_fenced(proxy)
    check_read_back(broker.bootstrap, topic, ledger)


# ------------------------------------------------------------------------ a commit timed out

LOST_ANSWERS = 12  # EndTxn answers lost in a row: more than max_block_ms lets it retry


def test_a_commit_that_timed_out_is_finished_by_calling_it_again(
    broker: BrokerProcess, topic: str
) -> None:
    """The EndTxn behind the batches committed but its answer was lost, and so were the
    answers to the same EndTxn asked again after it, until max_block_ms was up:
    commit_transaction raises MinibrokerTimeoutError, and calling it again (the documented
    way to finish) gets the first answer. One commit, one epoch bump, nothing fenced."""
    ledger = Ledger()
    with (
        proxy_to(
            broker,
            seed=41,
            drop_end_txn_response=1.0,
            limits={"drop_end_txn_response": LOST_ANSWERS},
        ) as proxy,
        Producer(
            proxy.bootstrap, transactional_id="timed-out", **{**HELD, "max_block_ms": 400}
        ) as producer,
    ):
        producer.init_transactions()
        first_epoch = producer.metrics()["producer_epoch"]
        for txn in range(2):
            sent = begin_two_per_partition(producer, topic, txn)
            finish_sync(producer.commit_transaction, ledger)
            ledger.committed.append(sent)
        metrics = producer.metrics()
    assert ledger.timeouts >= 1
    assert proxy.injected["drop_end_txn_response"] == LOST_ANSWERS
    assert (metrics["transactions_committed"], metrics["producer_epoch"]) == (2, first_epoch + 2)

    ends = exchanges(proxy, "EndTxn")
    (first, first_answer), *retries, (second, second_answer) = ends
    assert pipelined(first) and first_answer is not None and not first_answer.passed
    assert (error(first_answer), first_answer.message["producer_epoch"]) == (0, first_epoch + 1)
    # Every retry was the first transaction's EndTxn as sent, answered as the first one
    # was. Under load one more may go out: a call's max_block_ms ran out while an answer
    # the proxy passed was still on its way, so the next call asked again.
    assert LOST_ANSWERS <= len(retries) <= LOST_ANSWERS + ATTEMPTS
    for retry, answer in retries:
        assert retry.message["last_sequences"] == first.message["last_sequences"]
        assert retry.message["producer_epoch"] == first_epoch
        assert answer is not None and error(answer) == ErrorCode.NONE
        assert answer.message["producer_epoch"] == first_epoch + 1
    passed = [a.passed for _, a in retries if a is not None]
    assert passed[: LOST_ANSWERS - 1] == [False] * (LOST_ANSWERS - 1) and passed[-1]
    assert passed.count(False) == LOST_ANSWERS - 1
    assert pipelined(second) and second_answer is not None and second_answer.passed
    assert_never_fenced(proxy)
    check_read_back(broker.bootstrap, topic, ledger)
