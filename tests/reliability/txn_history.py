"""The transactional history check: a Jepsen-style test of the SDK's transactional
producer. Producer processes run transactions against one broker that is killed
(SIGKILL) and restarted every few seconds; afterwards every transaction's records
as read back are held against what the SDK told its producer.

    make txn-history                                   # 50,000 transactions per backend
    TXN_HISTORY_TRANSACTIONS=1500 make txn-history     # a short check

Settings (environment):
  TXN_HISTORY_TRANSACTIONS   transactions per backend, shared by the producers (50000)
  TXN_HISTORY_BACKENDS       the broker's --backend values, run one after the other,
                             each with its own broker and data dir (trio,asyncio)
  TXN_HISTORY_PRODUCERS      producer processes (3)
  TXN_HISTORY_KILL_SECONDS   mean time between kills, each drawn from 0.5x to 1.5x (6)
  TXN_HISTORY_DOWNTIME_MS    longest outage after a kill, each drawn from 0 to it (4000):
                             longer than the producers' delivery_timeout_ms (3000) at
                             times, so batches run out while a commit is in doubt
  TXN_HISTORY_PAUSE_MS       longest pause before a commit, taken by 1 transaction in 5,
                             so kills land at every step of a transaction (20)
  TXN_HISTORY_MAX_SECONDS    bound on each backend's run; producers are stopped then (3600)
  TXN_HISTORY_SEED           the random seed (printed; random when unset)
  TXN_HISTORY_OUT            where the report goes (txn-history-out)
  TXN_HISTORY_CLIENT         sdk, or confluent: confluent-kafka's transactional producers
                             and read_committed consumers through a kafka listener of
                             the same broker (`--client confluent` says the same) (sdk)

Each producer process (`client.Producer` with a transactional_id of its own) sends
1-5 records to 1-3 of 4 partitions per transaction, then aborts 15% of them and
commits the rest, following the SDK's contract, and appends each transaction's
records and reported outcome to its own JSON-lines ledger, flushed per transaction:
  committed     commit_transaction() returned (called again after each timeout)
  aborted       the abort it chose returned
  abortable     TransactionAbortableError, then abort_transaction() returned
  abort_failed  either abort's own call failed, or timed out ABORT_TRIES times
  failed        an error before commit_transaction() was called: no commit was asked
  unknown       commit_transaction() timed out COMMIT_TRIES times, or failed otherwise
After the last three the producer is replaced: its successor's init_transactions()
fences it and ends what it left open. A read_committed reader runs throughout,
re-creating its consumer and seeking back now and then; at the end every partition
is read whole at both isolation levels.

With `--client confluent` the producers are confluent-kafka's (librdkafka), following
its contract: commit_transaction() and abort_transaction() are called again after a
retriable error, an error that needs an abort is `abortable`, and a fatal one leaves
the outcome `unknown` (committing) or `failed`; the in-run reader and the final reads
are confluent-kafka consumers too, through the broker's kafka listener.

Anomalies: an aborted read (a record of a transaction reported aborted, abortable,
abort_failed or failed is visible at read_committed), a lost write (one of a
committed transaction is not), a fractured read (a transaction partly visible; an
unknown one may be visible whole or not at all), a duplicate, an order one (a
producer's records out of sending order in a partition), a stuck LSO (the last
stable offset short of the log end after every producer stopped), an inconsistent
read (the reader during the run, or read_committed, saw a record the final read
does not hold at that offset) and a phantom (a visible record no ledger sent).

Prints a table per backend and writes, per backend, report.json (counts and every
anomaly with its transaction's records, outcome and what was read), the ledgers,
the producers' logs and both final reads to TXN_HISTORY_OUT/<backend>/. Exits 1
when there is any anomaly or the run did not complete.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException

from client import (
    Consumer,
    MinibrokerError,
    MinibrokerTimeoutError,
    Producer,
    TopicPartition,
    TransactionAbortableError,
)
from client.admin import create_topic
from harness.broker_process import BrokerProcess
from tests.kafka.kafka_support import start_pinned

TOPIC = "history"
PARTITIONS = 4
ABORT_PROBABILITY = 0.15
PAUSE_PROBABILITY = 0.2
# Retries of a commit or an abort that timed out (each up to max_block_ms), per the contract.
COMMIT_TRIES = 20
ABORT_TRIES = 20
# A broker restart takes about a second; these bound what waits for one.
INIT_LIMIT_S = 60.0
INIT_BACKOFF_S = 0.1
CLOSE_S = 5.0
READY_LIMIT_S = 60.0
LSO_LIMIT_S = 30.0
READ_LIMIT_S = 300.0
READER_JOIN_S = 15.0
# Short enough that a kill every few seconds is survived by retrying, not waited out.
PRODUCER_CONFIG: dict[str, Any] = {
    "max_block_ms": 3000,
    "delivery_timeout_ms": 3000,
    "request_timeout_ms": 1500,
    "retry_backoff_ms": 20,
    "retry_backoff_max_ms": 200,
    "reconnect_backoff_ms": 20,
    "reconnect_backoff_max_ms": 200,
}
CONSUMER_CONFIG: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "fetch_max_wait_ms": 100,
    "request_timeout_ms": 5000,
    "retry_backoff_ms": 20,
    "reconnect_backoff_ms": 20,
    "reconnect_backoff_max_ms": 200,
}
_MAX_BLOCK_S = PRODUCER_CONFIG["max_block_ms"] / 1000
CLIENTS = ("sdk", "confluent")
# confluent-kafka's counterparts of the SDK's settings above: each call bounded by the
# same 3 s, a batch's delivery too; reconnect at once after a restart, and no
# re-bootstrap (KIP-899) when the one broker is down (docs/kafka-compatibility.md).
CONFLUENT_PRODUCER: dict[str, Any] = {
    "message.timeout.ms": 3000,
    "socket.timeout.ms": 1500,
    "retry.backoff.ms": 20,
    "retry.backoff.max.ms": 200,
    "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 200,
    "metadata.recovery.strategy": "none",
    "linger.ms": 5,
}
CONFLUENT_CONSUMER: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "fetch.wait.max.ms": 100,
    "socket.timeout.ms": 5000,
    "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 200,
    "metadata.recovery.strategy": "none",
}
# A producer stopped mid-commit may retry it COMMIT_TRIES times, then close.
PRODUCER_JOIN_S = COMMIT_TRIES * _MAX_BLOCK_S + 30.0
# The longest a producer may go without a ledger line: a commit's retries, then an
# abort's, each call bounded by max_block_ms (replacing the producer takes less).
STALL_LIMIT_S = (COMMIT_TRIES + ABORT_TRIES) * _MAX_BLOCK_S + 30.0
STALL_CHECK_S = 5.0
# Outcomes whose records must never be visible: the SDK said the transaction was not
# committed, or no commit was asked for.
NOT_COMMITTED = frozenset({"aborted", "abortable", "abort_failed", "failed"})
OUTCOMES = ("committed", "aborted", "abortable", "abort_failed", "failed", "unknown")
ANOMALY_KINDS = (
    "aborted_read",
    "lost_write",
    "fractured_read",
    "duplicate",
    "order",
    "stuck_lso",
    "inconsistent_read",
    "phantom",
)

Record = tuple[int, bytes]  # (partition, value)
Log = dict[int, list[tuple[int, bytes]]]  # partition -> [(offset, value)] in offset order


@dataclass(frozen=True)
class Settings:
    """What one run does; `from_env` reads the TXN_HISTORY_* variables (module docstring)."""

    transactions: int = 50_000
    backends: tuple[str, ...] = ("trio", "asyncio")
    producers: int = 3
    kill_interval_s: float = 6.0
    downtime_max_s: float = 4.0
    pause_max_s: float = 0.02
    max_seconds: float = 3600.0
    seed: int = 0
    client: str = "sdk"

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ.get
        seed = env("TXN_HISTORY_SEED")
        return cls(
            transactions=int(env("TXN_HISTORY_TRANSACTIONS", "50000")),
            backends=tuple(
                b.strip()
                for b in env("TXN_HISTORY_BACKENDS", "trio,asyncio").split(",")
                if b.strip()
            ),
            producers=int(env("TXN_HISTORY_PRODUCERS", "3")),
            kill_interval_s=float(env("TXN_HISTORY_KILL_SECONDS", "6")),
            downtime_max_s=float(env("TXN_HISTORY_DOWNTIME_MS", "4000")) / 1000,
            pause_max_s=float(env("TXN_HISTORY_PAUSE_MS", "20")) / 1000,
            max_seconds=float(env("TXN_HISTORY_MAX_SECONDS", "3600")),
            seed=int(seed) if seed else random.SystemRandom().randrange(1 << 32),
            client=env("TXN_HISTORY_CLIENT", "sdk"),
        )


# ---------------------------------------------------------------------- producer processes


@dataclass(frozen=True)
class ProducerJob:
    """What one producer process is handed (picklable, for the spawn context)."""

    bootstrap: str
    number: int
    transactions: int
    seed: int
    pause_max_s: float
    ledger: Path
    log: Path
    client: str = "sdk"


class TxnWriter:
    """One producer process's transactional producer, replaced when it is left unusable
    or with a transaction of unknown outcome (its successor's init_transactions()
    fences it and ends that transaction). `attempt` counts the instances."""

    def __init__(self, job: ProducerJob) -> None:
        self.job = job
        self.attempt = 0
        self.producer = self._open()

    def _open(self) -> Producer:
        producer = Producer(
            self.job.bootstrap, transactional_id=f"hist-{self.job.number}", **PRODUCER_CONFIG
        )
        deadline = time.monotonic() + INIT_LIMIT_S
        while True:
            try:
                producer.init_transactions()
                return producer
            except MinibrokerError as exc:
                # NoBrokersAvailable fails at once while the broker restarts: back off.
                if not (isinstance(exc, MinibrokerTimeoutError) or exc.retriable) or (
                    time.monotonic() > deadline
                ):
                    producer.close(CLOSE_S)
                    raise
                time.sleep(INIT_BACKOFF_S)

    def replace(self) -> None:
        self.close()
        self.attempt += 1
        self.producer = self._open()

    def close(self) -> None:
        try:
            self.producer.close(CLOSE_S)
        except MinibrokerError as exc:
            logging.warning("closing producer instance %d: %r", self.attempt, exc)

    def run(self, plan: list[Record], abort: bool, pause_s: float) -> dict[str, Any]:
        """One transaction of `plan`; what the SDK reported, as the ledger's end entry."""
        p = self.producer
        sent = commit_timeouts = 0
        committing = False
        try:
            p.begin_transaction()
            for partition, value in plan:
                p.send(TOPIC, value, partition=partition)
                sent += 1
            time.sleep(pause_s)
            if abort:
                return self._abort("aborted", sent, commit_timeouts)
            committing = True
            for _ in range(COMMIT_TRIES):
                try:
                    p.commit_transaction()
                    return {
                        "outcome": "committed",
                        "sent": sent,
                        "commit_timeouts": commit_timeouts,
                    }
                except MinibrokerTimeoutError:
                    commit_timeouts += 1
            return {
                "outcome": "unknown",
                "sent": sent,
                "commit_timeouts": commit_timeouts,
                "error": f"commit_transaction() timed out {COMMIT_TRIES} times",
            }
        except TransactionAbortableError as exc:
            return self._abort("abortable", sent, commit_timeouts, repr(exc))
        except MinibrokerError as exc:
            return {
                "outcome": "unknown" if committing else "failed",
                "sent": sent,
                "commit_timeouts": commit_timeouts,
                "error": repr(exc),
            }

    def _abort(
        self, reported: str, sent: int, commit_timeouts: int, error: str | None = None
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "outcome": reported,
            "sent": sent,
            "commit_timeouts": commit_timeouts,
            "error": error,
            "abort_timeouts": 0,
        }
        failure = f"abort_transaction() timed out {ABORT_TRIES} times"
        for _ in range(ABORT_TRIES):
            try:
                self.producer.abort_transaction()
                return entry
            except MinibrokerTimeoutError:
                entry["abort_timeouts"] += 1
            except MinibrokerError as exc:
                failure = repr(exc)
                break
        return {**entry, "outcome": "abort_failed", "abort_of": reported, "abort_error": failure}


class ConfluentTxnWriter:
    """TxnWriter's counterpart with confluent-kafka's transactional producer, through the
    kafka listener: the same ledger outcomes, by librdkafka's contract (module
    docstring)."""

    def __init__(self, job: ProducerJob) -> None:
        self.job = job
        self.attempt = 0
        self.producer = self._open()

    def _open(self) -> confluent_kafka.Producer:
        config = {
            "bootstrap.servers": self.job.bootstrap,
            "transactional.id": f"hist-{self.job.number}",
            **CONFLUENT_PRODUCER,
        }
        deadline = time.monotonic() + INIT_LIMIT_S
        while True:
            producer = confluent_kafka.Producer(config)
            try:
                producer.init_transactions(_MAX_BLOCK_S)
                return producer
            except KafkaException as exc:
                # A new instance each time: after a fatal error init_transactions() may
                # not be called again on the same one.
                error = exc.args[0]
                if not (error.retriable() or error.fatal()) or time.monotonic() > deadline:
                    raise
                time.sleep(INIT_BACKOFF_S)

    def replace(self) -> None:
        self.close()
        self.attempt += 1
        self.producer = self._open()

    def close(self) -> None:
        # Nothing waits for what it left: its successor's init_transactions() ends it.
        try:
            self.producer.purge()
            self.producer.flush(0)
        except KafkaException as exc:
            # A producer left fatal (librdkafka's INVALID_TXN_STATE on an abort whose
            # transaction the coordinator never saw begin) raises its error again here.
            logging.warning("closing producer instance %d: %r", self.attempt, exc)

    def run(self, plan: list[Record], abort: bool, pause_s: float) -> dict[str, Any]:
        """One transaction of `plan`; what librdkafka reported, as the ledger's end entry."""
        p = self.producer
        sent = commit_timeouts = 0
        committing = False
        try:
            p.begin_transaction()
            for partition, value in plan:
                p.produce(TOPIC, value, partition=partition)
                sent += 1
            time.sleep(pause_s)
            if abort:
                return self._abort("aborted", sent, commit_timeouts)
            committing = True
            for _ in range(COMMIT_TRIES):
                try:
                    p.commit_transaction(_MAX_BLOCK_S)
                    return {
                        "outcome": "committed",
                        "sent": sent,
                        "commit_timeouts": commit_timeouts,
                    }
                except KafkaException as exc:
                    error = exc.args[0]
                    if error.txn_requires_abort():
                        return self._abort("abortable", sent, commit_timeouts, repr(error))
                    if error.fatal() or not error.retriable():
                        raise
                    commit_timeouts += 1
            return {
                "outcome": "unknown",
                "sent": sent,
                "commit_timeouts": commit_timeouts,
                "error": f"commit_transaction() failed retriably {COMMIT_TRIES} times",
            }
        except KafkaException as exc:
            error = exc.args[0]
            if not committing and error.txn_requires_abort():
                return self._abort("abortable", sent, commit_timeouts, repr(error))
            return {
                "outcome": "unknown" if committing else "failed",
                "sent": sent,
                "commit_timeouts": commit_timeouts,
                "error": repr(error),
            }

    def _abort(
        self, reported: str, sent: int, commit_timeouts: int, error: str | None = None
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "outcome": reported,
            "sent": sent,
            "commit_timeouts": commit_timeouts,
            "error": error,
            "abort_timeouts": 0,
        }
        failure = f"abort_transaction() failed retriably {ABORT_TRIES} times"
        for _ in range(ABORT_TRIES):
            try:
                self.producer.abort_transaction(_MAX_BLOCK_S)
                return entry
            except KafkaException as exc:
                if not exc.args[0].retriable() or exc.args[0].fatal():
                    failure = repr(exc.args[0])
                    break
                entry["abort_timeouts"] += 1
        return {**entry, "outcome": "abort_failed", "abort_of": reported, "abort_error": failure}


def writer_of(job: ProducerJob) -> TxnWriter | ConfluentTxnWriter:
    return TxnWriter(job) if job.client == "sdk" else ConfluentTxnWriter(job)


def producer_main(
    job: ProducerJob, ready: multiprocessing.connection.Connection, stop: ProcessEvent
) -> None:
    """A producer process: `job.transactions` transactions (fewer once `stop` is set),
    each appended to the ledger before it starts and once the SDK reported its outcome."""
    logging.basicConfig(
        filename=job.log, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    # Where a run that finds this process stuck has its stacks written (it sends SIGABRT).
    stacks = job.log.open("a")
    faulthandler.enable(stacks, all_threads=True)
    rng = random.Random(job.seed * 1000 + job.number)
    try:
        writer = writer_of(job)
        ready.send(True)
        with job.ledger.open("a") as ledger:
            for number in range(job.transactions):
                if stop.is_set():
                    break
                txn = f"p{job.number}.t{number}"
                partitions = rng.sample(range(PARTITIONS), rng.randint(1, 3))
                plan = [
                    (rng.choice(partitions), f"{txn}.a{writer.attempt}.r{i}".encode())
                    for i in range(rng.randint(1, 5))
                ]
                begin = {"txn": txn, "attempt": writer.attempt, "records": _json_records(plan)}
                _append(ledger, {"event": "begin", **begin})
                pause_s = rng.uniform(0, job.pause_max_s) if rng.random() < PAUSE_PROBABILITY else 0
                end = writer.run(plan, rng.random() < ABORT_PROBABILITY, pause_s)
                _append(ledger, {"event": "end", "txn": txn, **end})
                if end["outcome"] not in ("committed", "aborted", "abortable"):
                    writer.replace()
        writer.close()
    except BaseException:
        logging.exception("producer %d failed", job.number)
        raise


def _append(ledger: Any, entry: dict[str, Any]) -> None:
    ledger.write(json.dumps(entry) + "\n")
    ledger.flush()


def _json_records(records: list[Record]) -> list[list[Any]]:
    return [[partition, value.decode()] for partition, value in records]


# ---------------------------------------------------------------------- readers


class InRunReader(threading.Thread):
    """A read_committed reader during the run: it re-creates its consumer every 0.3-2 s
    and then, for each partition, goes on where it was or seeks back to an offset it
    read before. `seen` keeps every (partition, offset) -> values it was handed."""

    def __init__(self, bootstrap: str, seed: int) -> None:
        super().__init__(name="txn-history-reader", daemon=True)
        self.bootstrap = bootstrap
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.seen: dict[tuple[int, int], set[bytes]] = defaultdict(set)
        self.restarts = 0
        self.errors: list[str] = []
        self.crash: str | None = None

    def run(self) -> None:
        try:
            self._read()
        except Exception as exc:
            self.crash = repr(exc)
            raise

    def _read(self) -> None:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        next_offsets = dict.fromkeys(range(PARTITIONS), 0)
        read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        while not self.stop.is_set():
            try:
                with Consumer(
                    *tps,
                    bootstrap_servers=self.bootstrap,
                    isolation_level="read_committed",
                    **CONSUMER_CONFIG,
                ) as consumer:
                    for tp in tps:
                        consumer.seek(tp, next_offsets[tp.partition])
                    until = time.monotonic() + self.rng.uniform(0.3, 2.0)
                    while time.monotonic() < until and not self.stop.is_set():
                        for tp, records in consumer.poll(timeout_ms=200).items():
                            for r in records:
                                self.seen[(tp.partition, r.offset)].add(r.value or b"")
                                read[tp.partition].append(r.offset)
                                next_offsets[tp.partition] = r.offset + 1
            except MinibrokerError as exc:
                self.errors.append(repr(exc))
            self.restarts += 1
            for p, offsets in read.items():
                if offsets and self.rng.random() < 0.5:
                    next_offsets[p] = self.rng.choice(offsets)


class ConfluentInRunReader(InRunReader):
    """InRunReader with confluent-kafka's read_committed consumer, through the kafka
    listener: re-created as often, going on or seeking back the same way."""

    def _read(self) -> None:
        next_offsets = dict.fromkeys(range(PARTITIONS), 0)
        read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        while not self.stop.is_set():
            consumer = confluent_kafka.Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": "txn-history-reader",  # librdkafka wants one; none joins
                    "isolation.level": "read_committed",
                    **CONFLUENT_CONSUMER,
                }
            )
            try:
                consumer.assign(
                    [
                        confluent_kafka.TopicPartition(TOPIC, p, next_offsets[p])
                        for p in range(PARTITIONS)
                    ]
                )
                until = time.monotonic() + self.rng.uniform(0.3, 2.0)
                while time.monotonic() < until and not self.stop.is_set():
                    for m in consumer.consume(num_messages=500, timeout=0.2):
                        error = m.error()
                        if error is not None:
                            if error.code() != confluent_kafka.KafkaError._PARTITION_EOF:
                                self.errors.append(str(error))
                            continue
                        partition, offset = m.partition(), m.offset()
                        self.seen[(partition, offset)].add(m.value() or b"")
                        read[partition].append(offset)
                        next_offsets[partition] = offset + 1
            finally:
                consumer.close()
            self.restarts += 1
            for p, offsets in read.items():
                if offsets and self.rng.random() < 0.5:
                    next_offsets[p] = self.rng.choice(offsets)


def wait_stable(bootstrap: str, limit_s: float) -> dict[int, tuple[int, int]]:
    """(last stable offset, log end) of the partitions whose LSO is still short of the
    end after `limit_s`: every transaction should be over once the producers stopped."""
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    with (
        Consumer(*tps, bootstrap_servers=bootstrap, isolation_level="read_committed") as stable,
        Consumer(*tps, bootstrap_servers=bootstrap, isolation_level="read_uncommitted") as whole,
    ):
        deadline = time.monotonic() + limit_s
        while True:
            ends = whole.end_offsets(tps)
            lsos = stable.end_offsets(tps)
            short = {tp.partition: (lsos[tp], ends[tp]) for tp in tps if lsos[tp] < ends[tp]}
            if not short or time.monotonic() > deadline:
                return short
            time.sleep(0.2)


def read_log(bootstrap: str, isolation_level: str, limit_s: float) -> Log:
    """Every record of every partition from offset 0 to its end at `isolation_level`."""
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    out: Log = {p: [] for p in range(PARTITIONS)}
    with Consumer(
        *tps, bootstrap_servers=bootstrap, isolation_level=isolation_level, **CONSUMER_CONFIG
    ) as consumer:
        ends = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + limit_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{isolation_level} read did not reach {ends} in {limit_s} s")
            for tp, records in consumer.poll(timeout_ms=200, max_records=100_000).items():
                out[tp.partition] += [(r.offset, r.value or b"") for r in records]
    return out


def read_log_confluent(bootstrap: str, isolation_level: str, limit_s: float) -> Log:
    """read_log with confluent-kafka's consumer: every partition from its beginning to
    the end librdkafka reports (the last stable offset at read_committed, which
    wait_stable saw at the log end)."""
    out: Log = {p: [] for p in range(PARTITIONS)}
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "txn-history-final",
            "isolation.level": isolation_level,
            **CONFLUENT_CONSUMER,
        }
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(TOPIC, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        at_end: set[int] = set()
        deadline = time.monotonic() + limit_s
        while len(at_end) < PARTITIONS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{isolation_level} read did not end in {limit_s} s")
            for m in consumer.consume(num_messages=10_000, timeout=0.2):
                error = m.error()
                if error is None:
                    out[m.partition()].append((m.offset(), m.value() or b""))
                elif error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
    finally:
        consumer.close()
    return out


# ---------------------------------------------------------------------- classification


@dataclass
class Txn:
    """A transaction as its producer's ledger tells it."""

    id: str
    attempt: int
    records: list[Record]
    end: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        return str(self.end.get("outcome", "unknown"))

    @property
    def sent(self) -> list[Record]:
        """The records send() accepted (all of them when no outcome was written)."""
        return self.records[: self.end.get("sent", len(self.records))]


def load_ledgers(paths: list[Path]) -> dict[str, Txn]:
    txns: dict[str, Txn] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry["event"] == "begin":
                records = [(p, v.encode()) for p, v in entry["records"]]
                txns[entry["txn"]] = Txn(entry["txn"], entry["attempt"], records)
            else:
                end = {k: v for k, v in entry.items() if k not in ("event", "txn")}
                txns[entry["txn"]].end = end
    return txns


def _where(log: Log) -> dict[Record, list[int]]:
    at: dict[Record, list[int]] = defaultdict(list)
    for partition, records in log.items():
        for offset, value in records:
            at[(partition, value)].append(offset)
    return at


def classify(
    txns: dict[str, Txn],
    committed: Log,
    uncommitted: Log,
    in_run: dict[tuple[int, int], set[bytes]],
    stuck: dict[int, tuple[int, int]],
) -> list[dict[str, Any]]:
    """Every anomaly of the history, each naming what was sent, reported and read."""
    visible = _where(committed)
    stored = _where(uncommitted)
    owner = {record: (txn, i) for txn in txns.values() for i, record in enumerate(txn.sent)}
    anomalies: list[dict[str, Any]] = []

    def sender(partition: int, value: bytes) -> Txn | None:
        found = owner.get((partition, value))
        return None if found is None else found[0]

    def report(kind: str, txn: Txn | None, detail: str) -> None:
        entry: dict[str, Any] = {"kind": kind, "detail": detail}
        if txn is not None:
            entry.update(txn=txn.id, attempt=txn.attempt, reported=txn.end)
            entry["records"] = [
                {
                    "partition": p,
                    "value": v.decode(),
                    "sent": i < len(txn.sent),
                    "read_committed_offsets": visible.get((p, v), []),
                    "read_uncommitted_offsets": stored.get((p, v), []),
                }
                for i, (p, v) in enumerate(txn.records)
            ]
        anomalies.append(entry)

    for txn in txns.values():
        shown = [r for r in txn.sent if r in visible]
        if 0 < len(shown) < len(txn.sent):
            report("fractured_read", txn, f"{len(shown)} of {len(txn.sent)} records visible")
        if txn.outcome == "committed" and len(shown) < len(txn.sent):
            report("lost_write", txn, f"committed, {len(txn.sent) - len(shown)} records missing")
        if txn.outcome in NOT_COMMITTED and shown:
            report("aborted_read", txn, f"reported {txn.outcome}, {len(shown)} records visible")
        if any(r in visible for r in txn.records[len(txn.sent) :]):
            report("phantom", txn, "a record whose send() failed is visible")
    for record, offsets in visible.items():
        if record not in owner:
            report("phantom", None, f"{record} at {offsets}: in no ledger")
        elif len(offsets) > 1:
            report("duplicate", owner[record][0], f"{record} at offsets {offsets}")
    for partition, records in committed.items():
        last: dict[str, tuple[int, int, int]] = {}  # producer -> (txn number, index, offset)
        for offset, value in records:
            if (partition, value) not in owner:
                continue
            txn, index = owner[(partition, value)]
            producer, number = txn.id.split(".t")
            key = (int(number), index, offset)
            if producer in last and key[:2] < last[producer][:2]:
                before, before_index, before_offset = last[producer]
                report(
                    "order",
                    txn,
                    f"partition {partition}: {value.decode()} at {offset} after "
                    f"{producer}.t{before} r{before_index} at {before_offset}",
                )
            last[producer] = key
    for partition, (lso, end) in stuck.items():
        report("stuck_lso", None, f"partition {partition}: last stable offset {lso}, end {end}")
    final = {(p, o): v for p, records in committed.items() for o, v in records}
    whole = {(p, o): v for p, records in uncommitted.items() for o, v in records}
    for (p, o), values in sorted(in_run.items()):
        for value in values:
            if final.get((p, o)) != value:
                report(
                    "inconsistent_read",
                    sender(p, value),
                    f"the reader saw {value.decode()} at {p}/{o}; the final read has "
                    f"{final.get((p, o))!r}",
                )
    for (p, o), value in final.items():
        if whole.get((p, o)) != value:
            report(
                "inconsistent_read",
                sender(p, value),
                f"read_committed has {value.decode()} at {p}/{o}, read_uncommitted "
                f"{whole.get((p, o))!r}",
            )
    return anomalies


# ---------------------------------------------------------------------- one backend


@dataclass
class BackendResult:
    backend: str
    outcomes: Counter[str] = field(default_factory=Counter)
    commit_timeouts: int = 0
    kills: int = 0
    reader_restarts: int = 0
    records_committed: int = 0
    records_uncommitted: int = 0
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def counts(self) -> Counter[str]:
        return Counter(a["kind"] for a in self.anomalies)


class ProducerFleet:
    """The producer processes of one run: spawned, watched for progress, stopped."""

    def __init__(self, settings: Settings, bootstrap: str, out: Path) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.stop = self.ctx.Event()
        share, extra = divmod(settings.transactions, settings.producers)
        self.jobs = [
            ProducerJob(
                bootstrap,
                n,
                share + (n < extra),
                settings.seed,
                settings.pause_max_s,
                out / f"ledger-p{n}.jsonl",
                out / f"producer-p{n}.log",
                settings.client,
            )
            for n in range(settings.producers)
        ]
        self.procs: list[multiprocessing.process.BaseProcess] = []
        # Per producer: its ledger's size, and when that last changed.
        self.progress: list[tuple[int, float]] = []

    def start(self) -> None:
        """Spawn the producers and wait until each has its producer id, so that the kill
        clock starts with the load; raises if one exits first."""
        pending: dict[Any, multiprocessing.process.BaseProcess] = {}
        for job in self.jobs:
            receive, send = self.ctx.Pipe(duplex=False)
            proc = self.ctx.Process(
                target=producer_main, args=(job, send, self.stop), name=f"p{job.number}"
            )
            proc.start()
            send.close()
            self.procs.append(proc)
            pending[receive] = proc
        deadline = time.monotonic() + READY_LIMIT_S
        while pending:
            remaining_s = deadline - time.monotonic()
            waiting = [*pending, *(proc.sentinel for proc in pending.values())]
            if remaining_s <= 0 or not multiprocessing.connection.wait(waiting, remaining_s):
                raise RuntimeError(f"producers not ready within {READY_LIMIT_S} s")
            for receive in list(pending):
                if receive.poll():
                    try:
                        receive.recv()
                    except EOFError:
                        name = pending[receive].name
                        raise RuntimeError(f"producer {name} exited before it was ready") from None
                    del pending[receive]
        self.progress = [(0, time.monotonic())] * len(self.jobs)

    def sentinels(self) -> list[int]:
        return [proc.sentinel for proc in self.procs if proc.is_alive()]

    def stalled(self) -> list[str]:
        """Abort each producer whose ledger has not grown for STALL_LIMIT_S (SIGABRT, so that
        faulthandler writes its threads' stacks to its log); says which."""
        now = time.monotonic()
        found = []
        for i, (job, proc) in enumerate(zip(self.jobs, self.procs, strict=True)):
            size = job.ledger.stat().st_size if job.ledger.exists() else 0
            if size != self.progress[i][0]:
                self.progress[i] = (size, now)
            elif proc.is_alive() and now - self.progress[i][1] > STALL_LIMIT_S:
                _abort(proc)
                found.append(
                    f"producer {proc.name} ended no transaction for {STALL_LIMIT_S:g} s, "
                    f"longer than the SDK's bounds allow: its stacks are in {job.log.name}"
                )
        return found

    def finish(self) -> list[str]:
        """Ask every producer to stop after its transaction and wait; abort one that does
        not stop in time. One that did not exit cleanly is fenced by a new instance of
        its transactional id, which ends what it left open, so that the last stable
        offset does not wait for the broker's transaction timeout. Says what went wrong."""
        self.stop.set()
        failures = []
        deadline = time.monotonic() + PRODUCER_JOIN_S
        for job, proc in zip(self.jobs, self.procs, strict=True):
            proc.join(max(deadline - time.monotonic(), 0))
            if proc.is_alive():
                failures.append(
                    f"producer {proc.name} did not stop within {PRODUCER_JOIN_S:g} s: "
                    f"its stacks are in {job.log.name}"
                )
                _abort(proc)
                proc.join(PRODUCER_JOIN_S)
            if proc.exitcode != 0:
                failures.append(f"producer {proc.name} exited with {proc.exitcode}")
                try:
                    writer_of(job).close()
                except (MinibrokerError, KafkaException) as exc:
                    failures.append(f"producer {proc.name} could not be fenced: {exc!r}")
        return failures

    def kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(PRODUCER_JOIN_S)


def _abort(proc: multiprocessing.process.BaseProcess) -> None:
    """SIGABRT: faulthandler writes the process's stacks to its log, then it dies."""
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGABRT)


def check_backend(settings: Settings, backend: str, out: Path) -> BackendResult:
    """Run the history on a fresh broker of `backend` and classify it; writes to `out`."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    result = BackendResult(backend)
    rng = random.Random(settings.seed)
    root = Path(tempfile.mkdtemp(prefix="txn-history-"))
    confluent = settings.client == "confluent"
    if confluent:
        broker = start_pinned(root / "data", backend)
    else:
        broker = BrokerProcess(root / "data", backend=backend).start()
    sdk = broker.address("mb") if confluent else broker.bootstrap
    clients = broker.address("kafka") if confluent else sdk
    fleet = ProducerFleet(settings, clients, out)
    reader = (ConfluentInRunReader if confluent else InRunReader)(clients, settings.seed)
    read = read_log_confluent if confluent else read_log
    started = time.monotonic()
    try:
        create_topic(sdk, TOPIC, partitions=PARTITIONS)
        fleet.start()
        reader.start()
        deadline = time.monotonic() + settings.max_seconds
        next_kill = time.monotonic() + settings.kill_interval_s * rng.uniform(0.5, 1.5)
        while fleet.sentinels() and not result.failures:
            now = time.monotonic()
            if now >= deadline:
                result.failures.append(f"producers still running after {settings.max_seconds} s")
                break
            wake_s = min(next_kill, deadline, now + STALL_CHECK_S) - now
            multiprocessing.connection.wait(fleet.sentinels(), wake_s)
            result.failures += fleet.stalled()
            if fleet.sentinels() and time.monotonic() >= next_kill:
                broker.kill()
                # The outage itself is what is tested: nothing to wait for but time.
                time.sleep(rng.uniform(0, settings.downtime_max_s))
                broker.start(broker.port)
                result.kills += 1
                print(
                    f"{backend}: kill {result.kills} at {time.monotonic() - started:.1f} s",
                    flush=True,
                )
                next_kill = time.monotonic() + settings.kill_interval_s * rng.uniform(0.5, 1.5)
        result.failures += fleet.finish()
        reader.stop.set()
        reader.join(READER_JOIN_S)
        if reader.is_alive() or reader.crash:
            result.failures.append(f"the in-run reader did not stop or crashed: {reader.crash}")
        stuck = wait_stable(sdk, LSO_LIMIT_S)
        committed = read(clients, "read_committed", READ_LIMIT_S)
        uncommitted = read(clients, "read_uncommitted", READ_LIMIT_S)
    finally:
        reader.stop.set()
        fleet.kill()
        broker.kill()
        shutil.rmtree(root, ignore_errors=True)
    txns = load_ledgers(sorted(out.glob("ledger-p*.jsonl")))
    result.outcomes = Counter(t.outcome for t in txns.values())
    result.commit_timeouts = sum(t.end.get("commit_timeouts", 0) for t in txns.values())
    result.reader_restarts = reader.restarts
    result.records_committed = sum(len(r) for r in committed.values())
    result.records_uncommitted = sum(len(r) for r in uncommitted.values())
    result.anomalies = classify(txns, committed, uncommitted, reader.seen, stuck)
    result.wall_s = time.monotonic() - started
    _write_log(out / "read_committed.jsonl", committed)
    _write_log(out / "read_uncommitted.jsonl", uncommitted)
    report = {
        "backend": backend,
        "settings": dataclasses.asdict(settings),
        "transactions": len(txns),
        "outcomes": result.outcomes,
        "commit_timeouts": result.commit_timeouts,
        "kills": result.kills,
        "reader_restarts": result.reader_restarts,
        "reader_errors": reader.errors,
        "records_committed": result.records_committed,
        "records_uncommitted": result.records_uncommitted,
        "anomaly_counts": result.counts(),
        "failures": result.failures,
        "wall_s": round(result.wall_s, 1),
        "anomalies": result.anomalies,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return result


def _write_log(path: Path, log: Log) -> None:
    with path.open("w") as f:
        for partition, records in log.items():
            for offset, value in records:
                line = {"partition": partition, "offset": offset, "value": value.decode()}
                f.write(json.dumps(line) + "\n")


def summary(settings: Settings, results: list[BackendResult]) -> str:
    """The table of every backend's counts, then the first anomalies and failures of each."""
    rows: list[tuple[str, list[Any]]] = [
        ("transactions", [sum(r.outcomes.values()) for r in results]),
        *((f"  {o}", [r.outcomes[o] for r in results]) for o in OUTCOMES),
        ("commit timeouts retried", [r.commit_timeouts for r in results]),
        ("kills", [r.kills for r in results]),
        ("reader restarts", [r.reader_restarts for r in results]),
        ("records read committed", [r.records_committed for r in results]),
        ("records read uncommitted", [r.records_uncommitted for r in results]),
        *((kind, [r.counts()[kind] for r in results]) for kind in ANOMALY_KINDS),
        ("wall s", [f"{r.wall_s:.0f}" for r in results]),
    ]
    lines = [
        f"txn-history: seed {settings.seed}, {settings.transactions} transactions per backend, "
        f"{settings.producers} {settings.client} producers, a kill every "
        f"~{settings.kill_interval_s:g} s, "
        f"down for up to {settings.downtime_max_s:g} s",
        f"{'':26}" + "".join(f"{r.backend:>12}" for r in results),
    ]
    lines += [f"{name:26}" + "".join(f"{v!s:>12}" for v in values) for name, values in rows]
    for r in results:
        if not r.kills:
            lines.append(
                f"{r.backend}: no kill happened: raise TXN_HISTORY_TRANSACTIONS or lower "
                "TXN_HISTORY_KILL_SECONDS"
            )
        lines += [f"{r.backend}: FAILED: {failure}" for failure in r.failures]
        lines += [
            f"{r.backend}: {a['kind']} {a.get('txn', '')}: {a['detail']}; reported "
            f"{a.get('reported', '-')}"
            for a in r.anomalies[:20]
        ]
        if len(r.anomalies) > 20:
            lines.append(f"{r.backend}: ... {len(r.anomalies) - 20} more in report.json")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--client", choices=CLIENTS, help="the producers' and readers' client (TXN_HISTORY_CLIENT)"
    )
    args = parser.parse_args()
    settings = Settings.from_env()
    if args.client is not None:
        settings = dataclasses.replace(settings, client=args.client)
    if settings.client not in CLIENTS:
        parser.error(f"TXN_HISTORY_CLIENT={settings.client!r} is not one of {CLIENTS}")
    out = Path(os.environ.get("TXN_HISTORY_OUT", "txn-history-out"))
    print(
        f"txn-history: seed {settings.seed} (TXN_HISTORY_SEED), backends "
        f"{','.join(settings.backends)}",
        flush=True,
    )
    results = [check_backend(settings, backend, out / backend) for backend in settings.backends]
    text = summary(settings, results)
    print(text)
    (out / "summary.txt").write_text(text + "\n")
    print(f"wrote {out}/summary.txt and {out}/<backend>/report.json", file=sys.stderr)
    return 1 if any(r.anomalies or r.failures for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
