"""Kafka's group consumers on the kafka listener, on both backends: kafka-python's
KafkaConsumer, aiokafka's AIOKafkaConsumer and confluent-kafka's Consumer with a
group id join the classic group protocol (broker/groups/classic.py), split a topic's
partitions, take over from a member that leaves, resume at committed offsets, restart
as static members without a rebalance; the admin clients list, describe and delete
the groups.

Every wait is a polling loop with a deadline; the broker's session timeouts are
small and its initial rebalance delay 0, so each test takes seconds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.admin
import pytest
from aiokafka import AIOKafkaConsumer

from client import TopicPartition
from client.admin import alter_group_offsets, create_topic, list_group_offsets
from harness.broker_process import BrokerProcess
from tests.conftest import BACKENDS
from tests.kafka.kafka_support import CLIENTS, listeners_config, start_pinned

PARTITIONS = 4
DEADLINE_S = 30.0
SESSION_MS = 3_000
HEARTBEAT_MS = 200
GROUP_SETTINGS = (
    "group_initial_rebalance_delay_ms = 0\n"
    "group_min_session_timeout_ms = 500\n"
    "group_session_timeout_ms = 3000\n"
    "group_heartbeat_interval_ms = 200\n"
)
T = TypeVar("T")

GENERATION = re.compile(r"generation=(\d+)")
LOG: list[Callable[[], str]] = [str]
"""What the broker logged of the test's group, for a failure's message (set per test)."""

TRACE = {"debug": "cgrp,topic"}
"""librdkafka's debug contexts that log its assignment and offsets."""

Read = tuple[int, int, bytes]
"""(partition, offset, value) of a record a member read."""


class Stack:
    """A broker with a minibroker listener (to create topics) and a kafka listener."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.kafka = f"127.0.0.1:{broker.listener_ports['kafka']}"

    def new_topic(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        create_topic(self.broker.address("mb"), name, partitions=PARTITIONS)
        return name

    def stable_generation(self, group: str) -> int | None:
        """The generation `group` is Stable at, from the broker's log: None while a
        rebalance runs (the last generation begun is not the last one completed)."""
        begun = completed = None
        for line in self.broker.log_text().splitlines():
            if f"group={group!r}" in line:
                found = GENERATION.search(line)
                if found and "event=group_generation" in line:
                    begun = int(found.group(1))
                elif found and "event=group_stable" in line:
                    completed = int(found.group(1))
        return completed if completed == begun else None


def stack_per_backend(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    settings: str = GROUP_SETTINGS,
) -> Iterator[Stack]:
    """The body of a module's stack fixture, parametrized over the backends: a broker
    with `settings` on `request.param` in a fresh `{name}-{backend}` directory."""
    data_dir: Path = tmp_path_factory.mktemp(f"{name}-{request.param}") / "data"
    broker = BrokerProcess(
        data_dir, backend=request.param, config=settings + listeners_config()
    ).start()
    try:
        yield Stack(broker)
    finally:
        broker.kill()


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    yield from stack_per_backend(request, tmp_path_factory, "kafka-groups")


# ------------------------------------------------------------------ one member, per client


class Member(Protocol):
    """A group consumer, driven from the test's thread."""

    def poll(self) -> list[Read]: ...

    def assignment(self) -> set[int]: ...

    def commit(self) -> None: ...

    def close(self) -> None: ...


class KafkaPythonMember:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        instance: str | None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.consumer = kafka.KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            group_instance_id=instance,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            **(settings or {}),
        )
        # Subscribed, then the topic's metadata fetched, before the first join: the
        # metadata answer gives the coordinator its view of the topic's partitions. A
        # leader that assigns without it rejoins as soon as it comes, and kafka-python
        # 3.0's heartbeat task can lose its re-enabling to so quick a rejoin (seen 1 in
        # 8 runs): the member then never heartbeats again and never learns of a
        # rebalance, until the broker removes it after its session.
        self.consumer.subscribe([topic])
        assert self.consumer.partitions_for_topic(topic)

    def poll(self) -> list[Read]:
        batches = self.consumer.poll(timeout_ms=100)
        return [(r.partition, r.offset, r.value) for rs in batches.values() for r in rs]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def commit(self) -> None:
        self.consumer.commit()

    def close(self) -> None:
        self.consumer.close()


class Threaded:
    """A member polled by a thread of its own, as an application polls: kafka-python's
    poll() can wait in a JoinGroup for the barrier, which the other members, polled by
    the same thread, would never reach. Its other calls run on that thread too
    (KafkaConsumer is not thread-safe); poll() hands what the thread read since."""

    def __init__(self, make: Callable[[], Member]) -> None:
        self._calls: queue.Queue[tuple[Callable[[Member], Any], Future[Any]]] = queue.Queue()
        self._reads: list[Read] = []
        self._read = threading.Condition()
        self._stopped = False
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(make, started), daemon=True)
        self._thread.start()
        started.result(DEADLINE_S)

    def _run(self, make: Callable[[], Member], started: Future[None]) -> None:
        try:
            member = make()
        except BaseException as exc:  # handed to the test's thread
            started.set_exception(exc)
            return
        started.set_result(None)
        while not self._stopped:
            while not self._calls.empty():
                call, done = self._calls.get()
                try:
                    done.set_result(call(member))
                except BaseException as exc:  # handed to the caller
                    done.set_exception(exc)
            if not self._stopped:
                got = member.poll()
                with self._read:
                    self._reads += got
                    self._read.notify_all()

    def _call(self, call: Callable[[Member], T]) -> T:
        done: Future[T] = Future()
        self._calls.put((call, done))
        return done.result(DEADLINE_S)

    def poll(self) -> list[Read]:
        """What the thread read since the last call, waiting up to one poll for some."""
        with self._read:
            self._read.wait_for(lambda: self._reads, timeout=0.1)
            got, self._reads = self._reads, []
        return got

    def assignment(self) -> set[int]:
        return self._call(lambda member: member.assignment())

    def commit(self) -> None:
        self._call(lambda member: member.commit())

    def stall(self, release: threading.Event) -> None:
        """Stop polling until `release` is set, as an application stuck in its own work:
        the thread waits in a call instead of its next poll."""
        self._calls.put((lambda _member: release.wait(), Future()))

    def close(self) -> None:
        def close(member: Member) -> None:
            self._stopped = True
            member.close()

        self._call(close)
        self._thread.join(DEADLINE_S)


class Loop:
    """An asyncio loop on a thread of its own, where aiokafka's consumers run their
    heartbeats and rebalances while the test's thread waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE_S)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE_S)
        self.loop.close()


class AioKafkaMember:
    def __init__(
        self, loop: Loop, bootstrap: str, topic: str, group: str, instance: str | None
    ) -> None:
        self.loop = loop

        async def start() -> AIOKafkaConsumer:
            consumer = AIOKafkaConsumer(
                topic,
                bootstrap_servers=bootstrap,
                group_id=group,
                group_instance_id=instance,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
            )
            await consumer.start()
            return consumer

        self.consumer = loop.run(start())

    def poll(self) -> list[Read]:
        batches = self.loop.run(self.consumer.getmany(timeout_ms=100))
        return [(r.partition, r.offset, r.value) for rs in batches.values() for r in rs]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def commit(self) -> None:
        self.loop.run(self.consumer.commit())

    def close(self) -> None:
        self.loop.run(self.consumer.stop())


class ConfluentReader:
    """What a group member of confluent-kafka does once its consumer is made, whichever
    group protocol it speaks."""

    consumer: confluent_kafka.Consumer

    def poll(self) -> list[Read]:
        out = []
        for m in self.consumer.consume(num_messages=500, timeout=0.1):
            if m.error() is not None:
                raise AssertionError(f"confluent-kafka consumer: {m.error()}")
            out.append((m.partition(), m.offset(), m.value()))
        return out

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def commit(self) -> None:
        self.consumer.commit(asynchronous=False)

    def close(self) -> None:
        self.consumer.close()


class ConfluentMember(ConfluentReader):
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        instance: str | None,
        strategy: str = "range,roundrobin",
        settings: dict[str, Any] | None = None,
    ) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "partition.assignment.strategy": strategy,
            "topic.metadata.refresh.interval.ms": 1_000,
        }
        if instance is not None:
            config["group.instance.id"] = instance
        # What librdkafka logs (with TRACE: what OffsetFetch returned, each reset and why,
        # which it logs at debug level only), kept for a failure's message.
        self.log: collections.deque[str] = collections.deque(maxlen=2_000)
        logger = logging.Logger(f"rdkafka.{group}", logging.DEBUG)
        logger.addHandler(_Kept(self.log))
        config["logger"] = logger
        self.consumer = confluent_kafka.Consumer({**config, **(settings or {})})
        self.consumer.subscribe([topic])

    def offsets_log(self) -> str:
        """The last of what librdkafka logged of its assignment and offsets."""
        lines = [line for line in self.log if "OFFSET" in line or "ASSIGN" in line]
        return "\n".join(lines[-120:])


class _Kept(logging.Handler):
    def __init__(self, into: collections.deque[str]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{record.created:.3f} {record.getMessage()}")


class Members:
    """Makes the members of one test, of one client, and closes what is left."""

    def __init__(self, client: str, stack: Stack, topic: str, group: str) -> None:
        self.client, self.stack, self.topic, self.group = client, stack, topic, group
        self.loop = Loop() if client == "aiokafka" else None
        self.made: list[Member] = []

    def new(
        self, instance: str | None = None, settings: dict[str, Any] | None = None, **kwargs: Any
    ) -> Member:
        """A member; `settings` are the client's own (kafka-python's keyword arguments,
        librdkafka's properties)."""
        bootstrap, topic, group = self.stack.kafka, self.topic, self.group
        member: Member
        if self.client == "kafka-python":
            member = Threaded(
                lambda: KafkaPythonMember(bootstrap, topic, group, instance, settings)
            )
        elif self.client == "aiokafka":
            assert self.loop is not None
            member = AioKafkaMember(self.loop, bootstrap, topic, group, instance)
        else:
            member = ConfluentMember(bootstrap, topic, group, instance, settings=settings, **kwargs)
        self.made.append(member)
        return member

    def close(self, member: Member) -> None:
        self.made.remove(member)
        member.close()

    def close_all(self) -> None:
        for member in list(self.made):
            # A test's own failure is the one to show.
            with contextlib.suppress(Exception):
                self.close(member)
        if self.loop is not None:
            self.loop.close()


@pytest.fixture
def group_of(stack: Stack) -> Iterator[Callable[[str], Members]]:
    made: list[Members] = []

    def make(client: str) -> Members:
        members = Members(client, stack, stack.new_topic(client), f"g-{uuid.uuid4().hex[:8]}")
        made.append(members)
        LOG[0] = lambda: "\n".join(
            line for line in stack.broker.log_text().splitlines() if members.group in line
        )
        return members

    yield make
    for members in made:
        members.close_all()


# ------------------------------------------------------------------ helpers


def produce(stack: Stack, topic: str, count: int, tag: str) -> set[bytes]:
    """`count` records spread over every partition; their values."""
    producer = confluent_kafka.Producer({"bootstrap.servers": stack.kafka})
    values = {f"{tag}-{i}".encode() for i in range(count)}
    for i, value in enumerate(sorted(values)):
        producer.produce(topic, value=value, partition=i % PARTITIONS)
    assert producer.flush(DEADLINE_S) == 0
    return values


def settle(*members: Member, reads: list[Read] | None = None) -> None:
    """Poll every member until their assignments split all partitions disjointly,
    each holding some; what they read meanwhile goes to `reads`."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        for member in members:
            got = member.poll()
            if reads is not None:
                reads += got
        held = [member.assignment() for member in members]
        split = sum(len(h) for h in held) == PARTITIONS == len(set().union(*held))
        if split and all(held):
            return
    held = [member.assignment() for member in members]
    raise AssertionError(f"no split within {DEADLINE_S}s: {held}\n{LOG[0]()}")


def read_all(expected: set[bytes], *members: Member) -> dict[int, list[Read]]:
    """Poll every member until `expected` was read; what each read, by member index."""
    out: dict[int, list[Read]] = {i: [] for i in range(len(members))}
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        for i, member in enumerate(members):
            out[i] += member.poll()
        if {v for reads in out.values() for _, _, v in reads} >= expected:
            return out
    seen = {v for reads in out.values() for _, _, v in reads}
    raise AssertionError(f"{len(expected - seen)} of {len(expected)} records never read")


def committed(stack: Stack, group: str) -> dict[int, int]:
    """The group's committed offsets by partition, as the broker holds them (read on
    the minibroker listener)."""
    offsets = list_group_offsets(stack.broker.address("mb"), group)
    return {tp.partition: om.offset for tp, om in offsets.items()}


def assert_once(expected: set[bytes], reads: dict[int, list[Read]]) -> None:
    values = [v for rs in reads.values() for _, _, v in rs]
    assert sorted(values) == sorted(expected), "a record read twice, or one not sent"


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("client", CLIENTS)
def test_members_split_then_one_leaves_and_the_others_resume_at_its_commits(
    stack: Stack, group_of: Callable[[str], Members], client: str, count: int
) -> None:
    """Two or three members split the partitions disjointly and read every record once,
    each from its own partitions; the first commits and leaves, the others take its
    partitions over from the committed offsets: they read the records sent since, none
    twice."""
    members = group_of(client)
    if client == "confluent-kafka":
        # librdkafka restarts a reset's offset query (auto.offset.reset, here BEGINNING)
        # whenever an outdated ListOffsets answer comes back (rdkafka_partition.c,
        # rd_kafka_toppar_handle_Offset: "outdated offset response"), even for a
        # partition revoked meanwhile; when that query fires after the partition came
        # back with its committed offset, the member reads it from 0. A member that held
        # the partitions before any commit starts that chain, so the group starts with
        # offsets committed at 0: no reset, and the test is about the hand-over.
        start = {TopicPartition(members.topic, p): 0 for p in range(PARTITIONS)}
        alter_group_offsets(stack.broker.address("mb"), members.group, start)
    group = [
        members.new(settings=TRACE if client == "confluent-kafka" else None) for _ in range(count)
    ]
    settle(*group)
    first = produce(stack, members.topic, 200, "first")
    reads = read_all(first, *group)
    assert_once(first, reads)
    for i, member in enumerate(group):
        assert reads[i] and {p for p, _, _ in reads[i]} <= member.assignment()
    for member in group:
        member.commit()
    # What every commit's answer promised is what the broker holds.
    ends = {
        p: 1 + max(o for _, rs in reads.items() for q, o, _ in rs if q == p)
        for p in range(PARTITIONS)
    }
    assert committed(stack, members.group) == ends, LOG[0]()
    leaving, *rest = group
    members.close(leaving)
    late: list[Read] = []
    settle(*rest, reads=late)
    assert late == []
    second = produce(stack, members.topic, 100, "second")
    again = read_all(second, *rest)
    held = committed(stack, members.group)
    starts = {
        p: min(o for _, rs in again.items() for q, o, _ in rs if q == p) for p in range(PARTITIONS)
    }
    # Where each partition was read from, against what the group holds: a member that
    # starts below the committed offset did not take it over.
    assert starts == ends, f"read from {starts}; committed {held}\n{LOG[0]()}\n" + "\n".join(
        m.offsets_log() for m in rest if isinstance(m, ConfluentMember)
    )
    assert_once(second, again)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_static_member_restarts_without_a_rebalance(
    stack: Stack, group_of: Callable[[str], Members], client: str
) -> None:
    """KIP-345: a static member that stops and starts again within its session takes its
    old place, with its partitions, and the group's generation does not move."""
    members = group_of(client)
    a = members.new("instance-a")
    b = members.new("instance-b")
    settle(a, b)
    deadline = time.monotonic() + DEADLINE_S
    while (generation := stack.stable_generation(members.group)) is None:
        assert time.monotonic() < deadline, f"the group never became Stable\n{LOG[0]()}"
        a.poll()
        b.poll()
    before = (a.assignment(), b.assignment())
    members.close(b)
    b = members.new("instance-b")
    deadline = time.monotonic() + DEADLINE_S
    while b.assignment() != before[1]:
        assert time.monotonic() < deadline, f"no assignment back: {b.assignment()} {before}"
        a.poll()
        b.poll()
    sent = produce(stack, members.topic, 40, "static")
    assert_once(sent, read_all(sent, a, b))
    assert (a.assignment(), b.assignment()) == before
    assert stack.stable_generation(members.group) == generation, LOG[0]()
    assert "event=group_member_removed" not in LOG[0]()


def test_confluent_cooperative_sticky(stack: Stack, group_of: Callable[[str], Members]) -> None:
    """KIP-429 as librdkafka drives it: the second member gets partitions the first gives
    up incrementally, then the first leaves and the second takes all, reading no record
    twice."""
    members = group_of("confluent-kafka")
    a = members.new(strategy="cooperative-sticky")
    settle(a)
    b = members.new(strategy="cooperative-sticky")
    settle(a, b)
    sent = produce(stack, members.topic, 100, "coop")
    assert_once(sent, read_all(sent, a, b))
    a.commit()
    members.close(a)
    deadline = time.monotonic() + DEADLINE_S
    while b.assignment() != set(range(PARTITIONS)):
        assert time.monotonic() < deadline, f"no takeover: {b.assignment()}"
        assert b.poll() == []
    more = produce(stack, members.topic, 40, "coop-more")
    assert_once(more, read_all(more, b))


# ------------------------------------------------------------------ admin


def test_kafka_python_admin_lists_describes_and_deletes(
    stack: Stack, group_of: Callable[[str], Members]
) -> None:
    members = group_of("kafka-python")
    a = members.new()
    settle(a)
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=stack.kafka)
    try:
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed[members.group]["protocol_type"] == "consumer"
        assert listed[members.group]["group_state"] == "Stable"
        empty_only = admin.list_groups(states_filter=["Empty"])
        assert members.group not in {g["group_id"] for g in empty_only}
        described = admin.describe_groups([members.group])[members.group]
        assert (described["group_state"], described["protocol_type"]) == ("Stable", "consumer")
        (member,) = described["members"]
        assert member["member_metadata"]["topics"] == [members.topic]
        assert member["member_assignment"]["assigned_partitions"] == [
            {"topic": members.topic, "partitions": list(range(PARTITIONS))}
        ]
        assert admin.delete_groups([members.group]) == {members.group: "NonEmptyGroupError"}
        sent = produce(stack, members.topic, 8, "admin")
        read_all(sent, a)
        a.commit()
        members.close(a)
        offsets = admin.list_group_offsets(members.group)[members.group]
        assert sorted(o.offset for o in offsets.values()) == [2] * PARTITIONS
        assert admin.delete_groups([members.group]) == {members.group: "OK"}
        assert members.group not in {g["group_id"] for g in admin.list_groups()}
        assert admin.list_group_offsets(members.group) == {members.group: {}}
        assert admin.delete_groups([members.group]) == {members.group: "GroupIdNotFoundError"}
    finally:
        admin.close()


def test_confluent_admin_lists_describes_and_deletes(
    stack: Stack, group_of: Callable[[str], Members]
) -> None:
    members = group_of("confluent-kafka")
    a = members.new()
    settle(a)
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": stack.kafka})
    listed = admin.list_consumer_groups().result(DEADLINE_S)
    states = {g.group_id: g.state for g in listed.valid}
    assert states[members.group] == confluent_kafka.ConsumerGroupState.STABLE
    stable_only = admin.list_consumer_groups(
        states={confluent_kafka.ConsumerGroupState.EMPTY}
    ).result(DEADLINE_S)
    assert members.group not in {g.group_id for g in stable_only.valid}
    described = admin.describe_consumer_groups([members.group])[members.group].result(DEADLINE_S)
    assert described.state == confluent_kafka.ConsumerGroupState.STABLE
    (member,) = described.members
    assert {tp.partition for tp in member.assignment.topic_partitions} == set(range(PARTITIONS))
    read_all(produce(stack, members.topic, 8, "admin"), a)
    a.commit()
    members.close(a)
    admin.delete_consumer_groups([members.group])[members.group].result(DEADLINE_S)
    listed = admin.list_consumer_groups().result(DEADLINE_S)
    assert members.group not in {g.group_id for g in listed.valid}


def test_minibroker_groups_shows_a_kafka_clients_group(
    stack: Stack, group_of: Callable[[str], Members]
) -> None:
    """`minibroker groups` (the native listener's ListGroups and DescribeGroups) shows a
    classic group: its state, generation, members and what each was assigned, and the
    offsets the Kafka client committed, with their lag."""
    members = group_of("confluent-kafka")
    a = members.new()
    settle(a)

    def cli(*args: str) -> str:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "minibroker_cli",
                "groups",
                *args,
                "--bootstrap-server",
                stack.broker.address("mb"),
            ],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    read_all(produce(stack, members.topic, 8, "cli"), a)
    a.commit()
    assert f"{members.group}\tStable\t1" in cli("list").splitlines()
    described = cli("describe", members.group)
    partitions = ",".join(f"{members.topic}-{p}" for p in range(PARTITIONS))
    assert f"\t{members.topic}\t{partitions}" in described
    assert "State: Stable" in described
    # The Kafka client's commits, read through the minibroker listener: 2 per partition.
    for p in range(PARTITIONS):
        assert f"{members.group}\t{members.topic}\t{p}\t2\t2\t0\t" in described


KILLED_MEMBER = """
import sys
import confluent_kafka

bootstrap, topic, group, session_ms, heartbeat_ms = sys.argv[1:6]
consumer = confluent_kafka.Consumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": int(session_ms),
        "heartbeat.interval.ms": int(heartbeat_ms),
        "enable.auto.commit": False,
    }
)
consumer.subscribe([topic])
while True:
    consumer.poll(0.1)
"""
"""A group member in a process of its own, to be killed."""


def test_a_killed_member_leaves_after_its_session_and_the_other_takes_over(
    stack: Stack, group_of: Callable[[str], Members]
) -> None:
    """kill -9 of a member's process: it sends no LeaveGroup; the broker removes it when
    its session runs out and the survivor gets its partitions."""
    members = group_of("confluent-kafka")
    a = members.new()
    settle(a)
    args = [stack.kafka, members.topic, members.group, str(SESSION_MS), str(HEARTBEAT_MS)]
    killed = subprocess.Popen([sys.executable, "-c", KILLED_MEMBER, *args])
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not (a.assignment() and len(a.assignment()) < PARTITIONS):
            assert time.monotonic() < deadline, f"the second member got nothing\n{LOG[0]()}"
            assert a.poll() == []
    finally:
        killed.kill()
        killed.wait(DEADLINE_S)
    while a.assignment() != set(range(PARTITIONS)):
        assert time.monotonic() < deadline, f"no takeover\n{LOG[0]()}"
        assert a.poll() == []
    assert "reason=session_timeout" in LOG[0]()
    sent = produce(stack, members.topic, 40, "after-kill")
    assert_once(sent, read_all(sent, a))


def test_members_rejoin_after_a_broker_kill_and_resume_at_the_committed_offsets(
    tmp_path: Path, backend: str
) -> None:
    """kill -9 of the broker under a consuming group: membership is soft state, so the
    member's next heartbeat is refused and it joins again; the committed offsets were
    fsynced, so it resumes at them: nothing committed is read again, nothing after
    it is skipped."""
    broker = start_pinned(tmp_path / "data", backend, GROUP_SETTINGS)
    stack = Stack(broker)
    members = Members("confluent-kafka", stack, stack.new_topic("restart"), "g-restart")
    try:
        a = members.new()
        settle(a)
        committed = produce(stack, members.topic, 80, "committed")
        read_all(committed, a)
        a.commit()
        uncommitted = produce(stack, members.topic, 20, "uncommitted")
        read_all(uncommitted, a)
        broker.restart(kill=True)
        after = produce(stack, members.topic, 40, "after")
        again = read_all(uncommitted | after, a)[0]
        values = [v for _, _, v in again]
        assert not committed & set(values), "a committed record was read again"
        assert sorted(set(values)) == sorted(uncommitted | after)
        assert len(values) == len(set(values))
    finally:
        members.close_all()
        broker.kill()
