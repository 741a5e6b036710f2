"""Consumer groups through the kafka listener, on one broker per backend.

Two measurements, their cases interleaved (ABBA) round by round in one run:
- the time from a fourth member's join to all four consuming, for four kinds of group
  on a topic of 8 partitions fed by a producer all along: Kafka's classic protocol
  with eager rebalancing (confluent-kafka, `range`), with cooperative rebalancing
  (confluent-kafka, `cooperative-sticky`), KIP-848 (confluent-kafka,
  `group.protocol=consumer`) and the native SDK's group (minibroker `Consumer`).
  Three members consume; the fourth is made and subscribes; the time runs until
  the four hold disjoint non-empty parts of every partition and each has read a
  record since its own last change of assignment. Each member polls in a thread of
  its own, as an application would;
- a confluent-kafka consumer's records/s in a (classic) group against the same
  consumer by assigned partitions, reading a 4-partition topic whole, counted from
  the first records it gets (each round's ratio group/assigned); the time to those
  first records beside it (the group's join; for assigned partitions librdkafka's
  offset query, which waits for its 500 ms timer when it started before the
  partition's leader was known).

Ratios are medians of paired rounds with a bootstrap 95% interval.

    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_kafka_groups --scale 0.1
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import confluent_kafka

from bench import progress
from bench.bench_broker import bootstrap_median_ci
from bench.stats import min_max
from client import Consumer
from client.admin import create_topic
from harness.broker_process import BrokerProcess

T = TypeVar("T")
BACKENDS = ("trio", "asyncio")
CONFIG = (
    "group_initial_rebalance_delay_ms = 0\n"
    "group_min_session_timeout_ms = 500\n"
    "group_session_timeout_ms = 6000\n"
    "group_heartbeat_interval_ms = 200\n"
    '[[listeners]]\nname = "mb"\nhost = "127.0.0.1"\nport = 0\n'
    '[[listeners]]\nname = "kafka"\nhost = "127.0.0.1"\nport = 0\n'
    'advertised_host = "127.0.0.1"\nprotocol = "kafka"\n'
)
JOIN_PARTITIONS = 8
JOIN_ROUNDS = 6  # per kind, at scale 1
READ_PARTITIONS = 4
READ_RECORDS = 400_000  # at scale 1
READ_ROUNDS = 6
DEADLINE_S = 60.0
HEARTBEAT_MS = 200
SESSION_MS = 6_000
KINDS = {
    "classic eager (confluent-kafka, range)": "range",
    "classic cooperative (confluent-kafka, cooperative-sticky)": "cooperative-sticky",
    "KIP-848 (confluent-kafka, group.protocol=consumer)": "consumer",
    "native (minibroker Consumer)": "native",
}


@dataclass
class Watched:
    """What one member's polling thread saw: its assignment, and whether it read a
    record since that last changed."""

    assignment: frozenset[int] = frozenset()
    read_since_change: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Member:
    """A group consumer of one kind, polled by a thread of its own."""

    def __init__(self, kind: str, broker: BrokerProcess, topic: str, group: str) -> None:
        self.kind = kind
        self.watched = Watched()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(broker, topic, group), daemon=True)
        self._thread.start()
        self._ready.wait(DEADLINE_S)

    def _consumer(self, broker: BrokerProcess, topic: str, group: str) -> Any:
        if self.kind == "native":
            return Consumer(
                topics=[topic],
                bootstrap_servers=broker.address("mb"),
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="latest",
                fetch_max_wait_ms=50,
            )
        config: dict[str, Any] = {
            "bootstrap.servers": f"127.0.0.1:{broker.listener_ports['kafka']}",
            "group.id": group,
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        }
        if self.kind == "consumer":
            config["group.protocol"] = "consumer"
        else:
            config["partition.assignment.strategy"] = self.kind
            config["session.timeout.ms"] = SESSION_MS
            config["heartbeat.interval.ms"] = HEARTBEAT_MS
        consumer = confluent_kafka.Consumer(config)
        consumer.subscribe([topic])
        return consumer

    def _run(self, broker: BrokerProcess, topic: str, group: str) -> None:
        try:
            consumer = self._consumer(broker, topic, group)
        except BaseException as exc:  # handed to the caller
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        native = self.kind == "native"
        try:
            while not self._stop.is_set():
                if native:
                    got = bool(consumer.poll(timeout_ms=50))
                else:
                    got = any(m.error() is None for m in consumer.consume(500, timeout=0.05))
                held = frozenset(tp.partition for tp in consumer.assignment())
                w = self.watched
                with w.lock:
                    if held != w.assignment:
                        w.assignment, w.read_since_change = held, False
                    elif got and held:
                        w.read_since_change = True
        finally:
            consumer.close()

    def snapshot(self) -> tuple[frozenset[int], bool]:
        w = self.watched
        with w.lock:
            return w.assignment, w.read_since_change

    def close(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S)
        if self._error is not None:
            raise self._error


def _all_consuming(members: list[Member], partitions: int) -> bool:
    seen = [m.snapshot() for m in members]
    held = [a for a, _ in seen]
    cover = sum(map(len, held)) == partitions == len(frozenset().union(*held))
    return cover and all(held) and all(read for _, read in seen)


def _wait(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.005)


class Feeder:
    """A producer writing a record to every partition every few milliseconds, so that a
    member reads as soon as it holds a partition."""

    def __init__(self, broker: BrokerProcess, topic: str, partitions: int) -> None:
        self._producer = confluent_kafka.Producer(
            {"bootstrap.servers": f"127.0.0.1:{broker.listener_ports['kafka']}", "linger.ms": 1}
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(topic, partitions), daemon=True)
        self._thread.start()

    def _run(self, topic: str, partitions: int) -> None:
        while not self._stop.is_set():
            for p in range(partitions):
                self._producer.produce(topic, value=b"x" * 100, partition=p)
            self._producer.poll(0.005)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S)
        self._producer.flush(DEADLINE_S)


def join_round(broker: BrokerProcess, kind: str) -> float:
    """Seconds from the fourth member's start to all four consuming."""
    topic = f"join-{uuid.uuid4().hex[:8]}"
    create_topic(broker.address("mb"), topic, partitions=JOIN_PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    feeder = Feeder(broker, topic, JOIN_PARTITIONS)
    members: list[Member] = []
    try:
        for _ in range(3):
            members.append(Member(kind, broker, topic, group))
        _wait(lambda: _all_consuming(members, JOIN_PARTITIONS), f"three {kind} members")
        began = time.monotonic()
        members.append(Member(kind, broker, topic, group))
        _wait(lambda: _all_consuming(members, JOIN_PARTITIONS), f"four {kind} members")
        return time.monotonic() - began
    finally:
        for member in members:
            member.close()
        feeder.close()


def _fill(broker: BrokerProcess, topic: str, records: int) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": f"127.0.0.1:{broker.listener_ports['kafka']}", "linger.ms": 5}
    )
    for i in range(records):
        producer.produce(topic, value=b"x" * 100, partition=i % READ_PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0


def read_round(
    broker: BrokerProcess, topic: str, records: int, in_group: bool
) -> tuple[float, float]:
    """One confluent-kafka consumer reading `topic` whole: its records/s from the first
    records it got to the last, and the seconds from its creation to those first ones
    (the group's join; for assigned partitions, librdkafka's offset query)."""
    config: dict[str, Any] = {
        "bootstrap.servers": f"127.0.0.1:{broker.listener_ports['kafka']}",
        "group.id": f"g-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
    }
    began = time.monotonic()
    consumer = confluent_kafka.Consumer(config)
    try:
        if in_group:
            consumer.subscribe([topic])
        else:
            consumer.assign(
                [
                    confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                    for p in range(READ_PARTITIONS)
                ]
            )
        first = 0
        while not first:
            if time.monotonic() > began + DEADLINE_S:
                raise TimeoutError("no record read")
            first = sum(m.error() is None for m in consumer.consume(1000, timeout=0.1))
        started = time.monotonic()
        read = first
        while read < records:
            if time.monotonic() > started + DEADLINE_S * 5:
                raise TimeoutError(f"read {read} of {records}")
            read += sum(m.error() is None for m in consumer.consume(1000, timeout=0.1))
        return (records - first) / (time.monotonic() - started), started - began
    finally:
        consumer.close()


def _interleaved(rounds: int, what: str, cases: dict[str, Callable[[], T]]) -> dict[str, list[T]]:
    """Each case once per round, in ABBA order."""
    figures: dict[str, list[T]] = {name: [] for name in cases}
    names = list(cases)
    for round_ in progress.rounds(rounds, what):
        for name in names if round_ % 2 == 0 else names[::-1]:
            figures[name].append(cases[name]())
    return figures


def _measure(
    broker: BrokerProcess, backend: str, join_rounds: int, read_rounds: int, records: int
) -> tuple[dict[str, list[float]], dict[str, list[tuple[float, float]]]]:
    """The join times of every kind, then the reads, on one broker."""
    joins = _interleaved(
        join_rounds,
        f"a fourth member's join, {backend}",
        {name: partial(join_round, broker, kind) for name, kind in KINDS.items()},
    )
    topic = f"read-{uuid.uuid4().hex[:8]}"
    create_topic(broker.address("mb"), topic, partitions=READ_PARTITIONS)
    _fill(broker, topic, records)
    reads = _interleaved(
        read_rounds,
        f"group against assigned, {backend}",
        {
            "group": partial(read_round, broker, topic, records, True),
            "assigned": partial(read_round, broker, topic, records, False),
        },
    )
    return joins, reads


def run(scale: float = 1.0) -> list[dict[str, Any]]:
    join_rounds = max(2, round(JOIN_ROUNDS * min(1.0, scale * 3)))
    read_rounds = max(2, round(READ_ROUNDS * min(1.0, scale * 3)))
    records = max(10_000, round(READ_RECORDS * scale))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for backend in BACKENDS:
            broker = BrokerProcess(Path(tmp) / f"data-{backend}", backend=backend, config=CONFIG)
            broker.start()
            try:
                joins, reads = _measure(broker, backend, join_rounds, read_rounds, records)
            finally:
                broker.kill()
            for name, seconds in joins.items():
                rows.append(
                    {
                        "benchmark": f"fourth member's join to four consuming {backend}, {name}",
                        "value": statistics.median(seconds) * 1000,
                        "unit": "ms",
                        "min_max": min_max([s * 1000 for s in seconds], 0),
                        "rounds": len(seconds),
                    }
                )
            for name, figures in reads.items():
                rates = [rate for rate, _ in figures]
                firsts = [first * 1000 for _, first in figures]
                rows.append(
                    {
                        "benchmark": f"confluent-kafka consumer {backend}, {name}, "
                        f"{records:,} records of 100 bytes, from the first read",
                        "value": statistics.median(rates),
                        "unit": "records/s",
                        "min_max": min_max(rates, 0),
                        "rounds": len(rates),
                    }
                )
                rows.append(
                    {
                        "benchmark": f"confluent-kafka consumer {backend}, {name}, "
                        "creation to the first records",
                        "value": statistics.median(firsts),
                        "unit": "ms",
                        "min_max": min_max(firsts, 0),
                        "rounds": len(firsts),
                    }
                )
            ratios = [g[0] / a[0] for g, a in zip(reads["group"], reads["assigned"], strict=True)]
            low, high = bootstrap_median_ci(ratios)
            rows.append(
                {
                    "benchmark": f"confluent-kafka consumer {backend}, group / assigned",
                    "value": statistics.median(ratios),
                    "unit": "x",
                    "min_max": min_max(ratios, 2),
                    "ci95_low": low,
                    "ci95_high": high,
                    "rounds": len(ratios),
                }
            )
    return rows


def targets(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for backend in BACKENDS:
        row = next(
            r
            for r in rows
            if r["benchmark"] == f"confluent-kafka consumer {backend}, group / assigned"
        )
        low, high = row["ci95_low"], row["ci95_high"]
        verdict = (
            "met"
            if low >= 0.9
            else "MISSED"
            if high < 0.9
            else "not shown (the interval spans 0.9)"
        )
        joins = ", ".join(
            f"{r['benchmark'].split(', ', 1)[1]} {r['value']:.0f} ms"
            for r in rows
            if r["benchmark"].startswith(f"fourth member's join to four consuming {backend}")
        )
        out += [
            f"- {backend}: a confluent-kafka consumer in a group reads at {row['value']:.2f}x "
            f"the same consumer by assigned partitions, median of {row['rounds']} paired "
            f"rounds, 95% CI {low:.2f}-{high:.2f} (at least 0.9x wanted): {verdict}.",
            f"- {backend}: a fourth member's join to four consuming (medians): {joins}.",
        ]
    return out


def main() -> None:
    from bench.__main__ import standalone

    standalone("kafka_groups", __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
