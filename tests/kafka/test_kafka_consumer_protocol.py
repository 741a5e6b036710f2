"""KIP-848's consumer groups on the kafka listener: confluent-kafka with
`group.protocol=consumer` (librdkafka's ConsumerGroupHeartbeat v1, Metadata v12 by topic
id) against the real broker on both backends, a native SDK consumer in the same group,
ConsumerGroupDescribe, authorization; and the two requests' codec without a broker
(Kafka's checks of a heartbeat, topic ids, hostile bytes).

Every wait is a polling loop with a deadline; the broker's heartbeat interval and
session timeout are small, so each test takes seconds.
"""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer

from broker.kafka.apis import consumer_groups as cg
from broker.kafka.apis.metadata import UNKNOWN_TOPIC_ID
from broker.kafka.entities import build, request_class
from broker.security import Access, AclBinding, Authorizer
from client.consumer import Consumer
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from protocol import messages as m
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.errors import ErrorCode
from protocol.framing import FrameError
from tests.conftest import BACKENDS
from tests.kafka.kafka_support import start_pinned
from tests.kafka.test_kafka_groups import (
    DEADLINE_S,
    GROUP_SETTINGS,
    LOG,
    PARTITIONS,
    ConfluentReader,
    Member,
    Read,
    Stack,
    assert_once,
    produce,
    read_all,
    settle,
    stack_per_backend,
)
from tests.kafka.test_kafka_smoke import SECURED
from tests.kafka.test_kafka_wire import codec, kio_response

HEARTBEAT, DESCRIBE, METADATA, JOIN_GROUP = 68, 69, 3, 11


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    yield from stack_per_backend(request, tmp_path_factory, "kip848")


# ------------------------------------------------------------------ members


class Kip848Member(ConfluentReader):
    """confluent-kafka's consumer on KIP-848's protocol: the broker assigns, and its
    heartbeat interval and session are the broker's (the client may not set them)."""

    def __init__(self, bootstrap: str, topic: str, group: str, **extra: Any) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1_000,
            **extra,
        }
        self.consumer = confluent_kafka.Consumer(config)
        self.consumer.subscribe([topic])


class NativeMember:
    """The minibroker SDK's group consumer, through the minibroker listener."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = Consumer(
            topics=[topic],
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )

    def poll(self) -> list[Read]:
        batches = self.consumer.poll(timeout_ms=100)
        return [(r.partition, r.offset, r.value) for rs in batches.values() for r in rs]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def commit(self) -> None:
        self.consumer.commit()

    def close(self) -> None:
        self.consumer.close()


class Group:
    """The members of one test's group on a fresh topic; closes what is left."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.topic = stack.new_topic("kip848")
        self.group = f"g-{uuid.uuid4().hex[:8]}"
        self.made: list[Member] = []
        LOG[0] = lambda: "\n".join(
            line for line in stack.broker.log_text().splitlines() if self.group in line
        )

    def kip848(self, **extra: Any) -> Member:
        member = Kip848Member(self.stack.kafka, self.topic, self.group, **extra)
        self.made.append(member)
        return member

    def native(self) -> Member:
        member = NativeMember(self.stack.broker.address("mb"), self.topic, self.group)
        self.made.append(member)
        return member

    def close(self, member: Member) -> None:
        self.made.remove(member)
        member.close()


@pytest.fixture
def group(stack: Stack) -> Iterator[Group]:
    made = Group(stack)
    yield made
    for member in list(made.made):
        try:
            made.close(member)
        except Exception:  # a test's own failure is the one to show
            continue


# ------------------------------------------------------------------ with the clients


@pytest.mark.parametrize("count", [2, 3])
def test_members_split_one_leaves_one_joins_and_they_resume_at_the_commits(
    group: Group, count: int
) -> None:
    """Two or three KIP-848 members split the partitions disjointly and read every record
    once, each from its own partitions; they commit, the first leaves and a new one
    joins: the group takes its partitions over from the committed offsets, reading
    nothing again, then reads the records sent since, none twice."""
    members = [group.kip848() for _ in range(count)]
    settle(*members)
    first = produce(group.stack, group.topic, 200, "first")
    reads = read_all(first, *members)
    assert_once(first, reads)
    for i, member in enumerate(members):
        assert reads[i] and {p for p, _, _ in reads[i]} <= member.assignment()
    for member in members:
        member.commit()
    leaving, *rest = members
    group.close(leaving)
    joined = group.kip848()
    late: list[Read] = []
    settle(*rest, joined, reads=late)
    assert late == [], "a committed record was read again"
    second = produce(group.stack, group.topic, 100, "second")
    assert_once(second, read_all(second, *rest, joined))
    assert "event=group_member_left" in LOG[0](), LOG[0]()


def test_a_native_consumer_and_a_kip848_consumer_share_a_group(group: Group) -> None:
    """One coordinator serves both: an SDK consumer on the minibroker listener and
    librdkafka's KIP-848 consumer on the kafka listener split the partitions and read
    every record once; when the SDK consumer commits and leaves, librdkafka's takes
    its partitions over from its commits."""
    native = group.native()
    kafka = group.kip848()
    settle(native, kafka)
    sent = produce(group.stack, group.topic, 120, "shared")
    reads = read_all(sent, native, kafka)
    assert_once(sent, reads)
    assert reads[0] and reads[1]
    native.commit()
    group.close(native)
    deadline = time.monotonic() + DEADLINE_S
    while kafka.assignment() != set(range(PARTITIONS)):
        assert time.monotonic() < deadline, f"no takeover: {kafka.assignment()}\n{LOG[0]()}"
        assert kafka.poll() == [], "a record the SDK consumer committed was read again"
    more = produce(group.stack, group.topic, 40, "after")
    assert_once(more, read_all(more, kafka))


def test_a_static_member_restarts_without_moving_a_partition(group: Group) -> None:
    """A static KIP-848 member closes (it leaves with epoch -2, keeping its partitions for
    the session) and a new process with the same instance id takes its place: it gets
    the same partitions back and the group's epoch does not move."""
    a = group.kip848(**{"group.instance.id": "instance-a"})
    b = group.kip848(**{"group.instance.id": "instance-b"})
    settle(a, b)
    before = (a.assignment(), b.assignment())
    epoch = describe_epoch(group)
    group.close(b)
    b = group.kip848(**{"group.instance.id": "instance-b"})
    deadline = time.monotonic() + DEADLINE_S
    while b.assignment() != before[1]:
        assert time.monotonic() < deadline, f"no assignment back: {b.assignment()} {before}"
        a.poll()
        b.poll()
    sent = produce(group.stack, group.topic, 40, "static")
    assert_once(sent, read_all(sent, a, b))
    assert (a.assignment(), b.assignment()) == before
    assert describe_epoch(group) == epoch, LOG[0]()
    assert "event=group_member_departed" in LOG[0](), LOG[0]()


KILLED_MEMBER = """
import sys
import confluent_kafka

bootstrap, topic, group = sys.argv[1:4]
consumer = confluent_kafka.Consumer(
    {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer"}
)
consumer.subscribe([topic])
while True:
    consumer.poll(0.1)
"""
"""A KIP-848 member in a process of its own, to be killed."""


def test_a_killed_member_is_removed_after_its_session_and_the_other_takes_over(
    group: Group,
) -> None:
    """kill -9 of a KIP-848 member's process: it sends no leave; the broker removes it
    when its session (group_session_timeout_ms) runs out and the survivor gets its
    partitions."""
    a = group.kip848()
    settle(a)
    args = [group.stack.kafka, group.topic, group.group]
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
    assert "reason=session_timeout" in LOG[0](), LOG[0]()
    sent = produce(group.stack, group.topic, 40, "after-kill")
    assert_once(sent, read_all(sent, a))


def test_a_member_rejoins_after_a_broker_kill_and_resumes_at_its_commits(
    tmp_path: Path, backend: str
) -> None:
    """kill -9 of the broker under a KIP-848 member: membership is soft state, so its
    next heartbeat is UNKNOWN_MEMBER_ID and librdkafka joins again under its own id;
    the commits were fsynced, so it resumes at them: nothing committed is read again,
    nothing after it is skipped."""
    broker = start_pinned(tmp_path / "data", backend, GROUP_SETTINGS)
    made = Group(Stack(broker))
    try:
        a = made.kip848()
        settle(a)
        committed = produce(made.stack, made.topic, 80, "committed")
        read_all(committed, a)
        a.commit()
        uncommitted = produce(made.stack, made.topic, 20, "uncommitted")
        read_all(uncommitted, a)
        broker.restart(kill=True)
        after = produce(made.stack, made.topic, 40, "after")
        values = [v for _, _, v in read_all(uncommitted | after, a)[0]]
        assert not committed & set(values), "a committed record was read again"
        assert sorted(set(values)) == sorted(uncommitted | after)
        assert len(values) == len(set(values))
    finally:
        for member in list(made.made):
            made.close(member)
        broker.kill()


def describe_epoch(group: Group) -> int:
    with KafkaWire(group.stack.kafka) as wire:
        (described,) = wire.call(DESCRIBE, 0, {"group_ids": [group.group]}).groups
    assert described.error_code == 0, described
    return int(described.group_epoch)


def test_the_admin_client_and_minibroker_groups_describe_a_kip848_group(
    group: Group,
) -> None:
    """confluent-kafka's describe_consumer_groups asks ConsumerGroupDescribe (a consumer
    group: members, their assignments and targets by topic id and name), and
    `minibroker groups` shows the same group through the minibroker listener."""
    a = group.kip848()
    b = group.kip848()
    settle(a, b)
    read_all(produce(group.stack, group.topic, 8, "describe"), a, b)
    a.commit()
    b.commit()
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": group.stack.kafka})
    described = admin.describe_consumer_groups([group.group])[group.group].result(DEADLINE_S)
    assert described.type == confluent_kafka.ConsumerGroupType.CONSUMER
    assert described.state == confluent_kafka.ConsumerGroupState.STABLE
    assert described.partition_assignor == cg.ASSIGNOR
    held = [
        {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions}
        for member in described.members
    ]
    targets = [
        {(tp.topic, tp.partition) for tp in member.target_assignment.topic_partitions}
        for member in described.members
    ]
    assert held == targets and sorted(map(len, held)) == [2, 2]
    assert set().union(*held) == {(group.topic, p) for p in range(PARTITIONS)}
    listed = admin.list_consumer_groups().result(DEADLINE_S)
    assert group.group in {g.group_id for g in listed.valid}

    mb = group.stack.broker.address("mb")

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "minibroker_cli", "groups", *args, "--bootstrap-server", mb],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert any(line.startswith(f"{group.group}\tSTABLE\t2") for line in cli("list").splitlines())
    shown = cli("describe", group.group)
    for p in range(PARTITIONS):
        assert f"{group.group}\t{group.topic}\t{p}\t2\t2\t0\t" in shown, shown


def test_a_classic_member_and_a_kip848_member_refuse_each_other(stack: Stack) -> None:
    """A non-empty group serves one protocol: a classic JoinGroup into a KIP-848 group,
    and a ConsumerGroupHeartbeat into a classic group, get INCONSISTENT_GROUP_PROTOCOL
    (23), and neither group changes."""
    topic = stack.new_topic("mixed")
    with KafkaWire(stack.kafka) as wire:
        joined = wire.call(HEARTBEAT, 1, heartbeat("kip848", "m-1", 0, [topic]))
        assert (joined.error_code, joined.member_epoch) == (0, 1)
        classic = wire.call(JOIN_GROUP, 7, join_group("kip848"))
        assert classic.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        required = wire.call(JOIN_GROUP, 7, join_group("classic"))
        assert required.error_code == ErrorCode.MEMBER_ID_REQUIRED
        joined_classic = wire.call(JOIN_GROUP, 7, join_group("classic", required.member_id))
        assert joined_classic.error_code == 0
        refused = wire.call(HEARTBEAT, 1, heartbeat("classic", "m-2", 0, [topic]))
        assert refused.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        described = wire.call(DESCRIBE, 0, {"group_ids": ["kip848", "classic", "nobody"]})
        kip848, classic_group, nobody = described.groups
        assert [mb.member_id for mb in kip848.members] == ["m-1"]
        assert kip848.group_epoch == 1
        assert classic_group.error_code == nobody.error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_member_epochs_and_topic_ids_on_the_wire(stack: Stack) -> None:
    """Heartbeat v1 as librdkafka sends it: the member names itself and is answered its
    assignment by topic id, which Metadata v12 resolves by id; a wrong epoch is
    FENCED_MEMBER_EPOCH, an unknown member UNKNOWN_MEMBER_ID, v0 without a member id is
    named by the broker, and a member leaves with epoch -1."""
    topic = stack.new_topic("epochs")
    with KafkaWire(stack.kafka) as wire:
        joined = wire.call(HEARTBEAT, 1, heartbeat("epochs", "m-1", 0, [topic]))
        assert (joined.error_code, joined.member_id, joined.member_epoch) == (0, "m-1", 1)
        (assigned,) = joined.assignment.topic_partitions
        assert sorted(assigned.partitions) == list(range(PARTITIONS))
        found = wire.call(
            METADATA,
            12,
            {
                "topics": [{"topic_id": assigned.topic_id}, {"topic_id": uuid.uuid4()}],
                "allow_auto_topic_creation": False,
            },
        )
        assert [(t.name, t.error_code) for t in found.topics] == [
            (topic, 0),
            (None, UNKNOWN_TOPIC_ID),
        ]
        assert wire.call(HEARTBEAT, 1, beat("epochs", "m-1", 5)).error_code == (
            ErrorCode.FENCED_MEMBER_EPOCH
        )
        assert wire.call(HEARTBEAT, 1, beat("epochs", "nobody", 1)).error_code == (
            ErrorCode.UNKNOWN_MEMBER_ID
        )
        named = wire.call(HEARTBEAT, 0, heartbeat("epochs", "", 0, [topic]))
        assert named.error_code == 0 and named.member_id and named.member_epoch == 2
        assert wire.call(HEARTBEAT, 1, beat("epochs", "", 0)).error_code == (
            ErrorCode.INVALID_REQUEST
        )
        left = wire.call(HEARTBEAT, 1, beat("epochs", "m-1", m.MEMBER_EPOCH_LEAVE))
        assert (left.error_code, left.member_epoch) == (0, -1)
        described = wire.call(DESCRIBE, 0, {"group_ids": ["epochs"]})
        assert [mb.member_id for mb in described.groups[0].members] == [named.member_id]


def test_a_member_needs_read_on_the_group(tmp_path: Path, backend: str) -> None:
    """Section 7: alice may describe the group and read the topic, not read the group:
    her KIP-848 consumer gets GROUP_AUTHORIZATION_FAILED and the group is not made;
    bob, allowed READ on the group, joins it."""
    env = {"MINIBROKER_BOOTSTRAP_USERS": "admin:admin-pw,alice:alice-pw,bob:bob-pw"}
    broker = BrokerProcess(tmp_path / "data", backend=backend, config=SECURED, env=env).start()
    try:
        with WireClient(broker.address("minibroker")) as admin:
            admin.authenticate("admin", "admin-pw")
            assert admin.create_topic("orders", PARTITIONS) == 0
            grants = [
                ("topic", "orders", "User:alice", "read"),
                ("group", "g", "User:alice", "describe"),
                ("topic", "orders", "User:bob", "read"),
                ("group", "g", "User:bob", "read"),
            ]
            results = admin.call(
                "CreateAcls",
                creations=[
                    {
                        "resource_type": rtype,
                        "resource_name": name,
                        "pattern_type": "literal",
                        "principal": principal,
                        "host": "*",
                        "operation": operation,
                        "permission": "allow",
                    }
                    for rtype, name, principal, operation in grants
                ],
            )["results"]
            assert [r["error"] for r in results] == [0] * len(grants)

        def member(user: str) -> Kip848Member:
            return Kip848Member(
                broker.address("kafka"),
                "orders",
                "g",
                **{
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "SCRAM-SHA-256",
                    "sasl.username": user,
                    "sasl.password": f"{user}-pw",
                },
            )

        alice = member("alice")
        try:
            error = None
            deadline = time.monotonic() + DEADLINE_S
            while error is None:
                assert time.monotonic() < deadline, "alice's consumer was never refused"
                for msg in alice.consumer.consume(num_messages=10, timeout=0.2):
                    error = msg.error()
            # librdkafka makes it fatal, naming the broker's error.
            assert error.code() == confluent_kafka.KafkaError._FATAL
            assert "Group authorization failed" in error.str()
        finally:
            alice.close()
        with WireClient(broker.address("minibroker")) as admin:
            admin.authenticate("admin", "admin-pw")
            assert admin.call("ListGroups")["groups"] == []
        bob = member("bob")
        try:
            settle(bob)
        finally:
            bob.close()
    finally:
        broker.kill()


# ------------------------------------------------------------------ a raw Kafka client


class KafkaWire:
    """One connection speaking Kafka's frames, answers read with kio's entities."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
        self.correlation_id = 0

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def call(self, key: int, version: int, values: dict[str, Any]) -> Any:
        self.correlation_id += 1
        body = request_body(key, version, values, self.correlation_id)
        self.sock.sendall(struct.pack(">i", len(body)) + body)
        (length,) = struct.unpack(">i", self._exactly(4))
        frame = struct.pack(">i", length) + self._exactly(length)
        correlation_id, answer = kio_response(frame, key, version)
        assert correlation_id == self.correlation_id
        return answer

    def _exactly(self, size: int) -> bytes:
        out = b""
        while len(out) < size:
            chunk = self.sock.recv(size - len(out))
            assert chunk, "the broker closed the connection"
            out += chunk
        return out


def request_body(key: int, version: int, values: dict[str, Any], correlation_id: int = 1) -> bytes:
    """A Kafka request frame body (header and request) of kio's entities."""
    cls = request_class(key, version)
    assert cls is not None
    header_cls = cls.__header_schema__  # type: ignore[attr-defined]
    header = {
        "request_api_key": key,
        "request_api_version": version,
        "correlation_id": correlation_id,
        "client_id": "kip848-test",
    }
    out = io.BytesIO()
    entity_writer(header_cls)(out, build(header_cls, header))
    entity_writer(cls)(out, build(cls, values))
    return out.getvalue()


def heartbeat(group_id: str, member_id: str, epoch: int, topics: list[str]) -> dict[str, Any]:
    """A join as librdkafka sends it: a rebalance timeout, the topics, nothing owned."""
    return {
        "group_id": group_id,
        "member_id": member_id,
        "member_epoch": epoch,
        "rebalance_timeout": 30_000,
        "subscribed_topic_names": topics,
        "topic_partitions": [],
    }


def beat(group_id: str, member_id: str, epoch: int) -> dict[str, Any]:
    """A heartbeat with nothing changed: -1 and nulls."""
    return {
        "group_id": group_id,
        "member_id": member_id,
        "member_epoch": epoch,
        "rebalance_timeout": -1,
        "topic_partitions": None,
    }


def join_group(group_id: str, member_id: str = "") -> dict[str, Any]:
    return {
        "group_id": group_id,
        "session_timeout": 3_000,
        "rebalance_timeout": 3_000,
        "member_id": member_id,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }


# ------------------------------------------------------------------ the codec, no broker


def decoded(version: int, values: dict[str, Any]) -> cg.KafkaConsumerGroupHeartbeatRequest | Any:
    """What the codec makes of a heartbeat: the broker request, or the listener's own
    answer read back."""
    out = codec().decode(request_body(HEARTBEAT, version, values))
    if isinstance(out, bytes):
        return kio_response(out, HEARTBEAT, version)[1]
    return out


def test_a_join_becomes_the_coordinators_heartbeat() -> None:
    owned = uuid.uuid4()
    request = decoded(
        1, {**beat("g", "m", 3), "topic_partitions": [{"topic_id": owned, "partitions": [0, 2]}]}
    )
    assert isinstance(request, cg.KafkaConsumerGroupHeartbeatRequest)
    assert request.owned == [cg.TopicIdPartitions(owned.bytes, [0, 2])]
    assert (request.rebalance_timeout_ms, request.subscribed_topics) == (-1, None)
    join = decoded(1, {**heartbeat("g", "m", 0, ["a", "b", "a"]), "server_assignor": "uniform"})
    assert isinstance(join, cg.KafkaConsumerGroupHeartbeatRequest)
    assert (join.rebalance_timeout_ms, join.subscribed_topics, join.owned) == (
        30_000,
        ["a", "b"],
        [],
    )


@pytest.mark.parametrize(
    ("version", "values", "code", "reason"),
    [
        (1, beat("g", "", 1), ErrorCode.INVALID_REQUEST, "MemberId can't be empty."),
        (1, heartbeat("g", "", 0, ["t"]), ErrorCode.INVALID_REQUEST, "MemberId can't be empty."),
        (0, beat("g", " ", 1), ErrorCode.INVALID_REQUEST, "MemberId can't be empty."),
        (1, beat(" ", "m", 1), ErrorCode.INVALID_REQUEST, "GroupId can't be empty."),
        (1, {**beat("g", "m", 1), "instance_id": ""}, 42, "InstanceId can't be empty."),
        (1, {**beat("g", "m", 1), "rack_id": " "}, 42, "RackId can't be empty."),
        (1, {**heartbeat("g", "m", 0, ["t"]), "rebalance_timeout": -1}, 42, "RebalanceTimeoutMs"),
        (1, {**heartbeat("g", "m", 0, ["t"]), "topic_partitions": None}, 42, "TopicPartitions"),
        (1, {**heartbeat("g", "m", 0, ["t"]), "subscribed_topic_names": None}, 42, "Subscribed"),
        (1, {**heartbeat("g", "m", 0, []), "subscribed_topic_regex": "t.*"}, 42, "Regex"),
        (1, beat("g", "m", -2), ErrorCode.INVALID_REQUEST, "InstanceId can't be null."),
        (1, beat("g", "m", -3), ErrorCode.INVALID_REQUEST, "MemberEpoch is invalid."),
        (1, beat("g", "m" * 256, 1), ErrorCode.INVALID_REQUEST, "at most 255"),
        (1, {**beat("g", "m", 1), "server_assignor": "range"}, 112, "ServerAssignor range"),
    ],
)
def test_kafkas_checks_of_a_heartbeat(
    version: int, values: dict[str, Any], code: int, reason: str
) -> None:
    """GroupMetadataManager's checks, answered by the listener with Kafka's reasons."""
    answer = decoded(version, values)
    assert (answer.error_code, reason in (answer.error_message or "")) == (code, True)


def test_owned_partitions_named_twice_are_refused() -> None:
    topic_id = uuid.uuid4()
    for owned in (
        [{"topic_id": topic_id, "partitions": [0]}, {"topic_id": topic_id, "partitions": [1]}],
        [{"topic_id": topic_id, "partitions": [1, 1]}],
    ):
        answer = decoded(1, {**beat("g", "m", 2), "topic_partitions": owned})
        assert answer.error_code == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("version", [0, 1])
def test_the_answer_names_topics_by_id(version: int) -> None:
    c = codec()
    request = c.decode(request_body(HEARTBEAT, version, heartbeat("g", "m", 0, ["t"]), 9))
    assert isinstance(request, cg.KafkaConsumerGroupHeartbeatRequest)
    topic_id = uuid.uuid4()
    response = cg.KafkaConsumerGroupHeartbeatResponse(
        member_id="m",
        member_epoch=4,
        heartbeat_interval_ms=200,
        assignment=[cg.TopicIdPartitions(topic_id.bytes, [1, 3])],
    )
    correlation_id, answer = kio_response(c.encode(response, request.cid), HEARTBEAT, version)
    assert (correlation_id, answer.member_id, answer.member_epoch) == (9, "m", 4)
    assert answer.heartbeat_interval.total_seconds() == 0.2
    (assigned,) = answer.assignment.topic_partitions
    assert (assigned.topic_id, assigned.partitions) == (topic_id, (1, 3))


def test_metadata_v12_by_id_keeps_the_topics_asked_for() -> None:
    c = codec()
    known, unknown = uuid.uuid4(), uuid.uuid4()
    values = {
        "topics": [{"topic_id": known}, {"topic_id": unknown}, {"name": "named"}],
        "allow_auto_topic_creation": True,
    }
    request = c.decode(request_body(METADATA, 12, values, 5))
    assert isinstance(request, m.MetadataRequest)
    assert (request.topics, request.allow_auto_create) == (None, False)
    everything = m.MetadataResponse(
        brokers=[m.BrokerMetadata(0, "h", 1)],
        topics=[
            m.TopicMetadata("other", topic_id=uuid.uuid4().bytes),
            m.TopicMetadata("mine", partitions=[m.PartitionMetadata(0)], topic_id=known.bytes),
        ],
    )
    _, answer = kio_response(c.encode(everything, request.cid), METADATA, 12)
    assert [(t.name, t.topic_id, t.error_code) for t in answer.topics] == [
        ("mine", known, 0),
        (None, unknown, UNKNOWN_TOPIC_ID),
        ("named", None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]


ids = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


@settings(max_examples=80, deadline=None)
@given(
    version=st.integers(0, 1),
    member_id=ids,
    epoch=st.integers(-4, 4),
    timeout_ms=st.integers(-1, 100_000),
    names=st.none() | st.lists(ids, max_size=4),
    owned=st.none()
    | st.lists(st.tuples(st.uuids(), st.lists(st.integers(0, 5), max_size=4)), max_size=3),
    instance=st.none() | ids,
)
def test_any_heartbeat_becomes_a_request_or_a_clean_refusal(
    version: int,
    member_id: str,
    epoch: int,
    timeout_ms: int,
    names: list[str] | None,
    owned: list[tuple[uuid.UUID, list[int]]] | None,
    instance: str | None,
) -> None:
    values = {
        "group_id": "g",
        "member_id": member_id,
        "member_epoch": epoch,
        "rebalance_timeout": timeout_ms,
        "subscribed_topic_names": names,
        "instance_id": instance,
        "topic_partitions": None
        if owned is None
        else [{"topic_id": t, "partitions": ps} for t, ps in owned],
    }
    out = decoded(version, values)
    if isinstance(out, cg.KafkaConsumerGroupHeartbeatRequest):
        assert out.member_epoch >= m.MEMBER_EPOCH_LEAVE_STATIC
        assert version == 0 or out.member_id.strip()
    else:
        assert out.error_code in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_ASSIGNOR)


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, 200), junk=st.binary(max_size=40))
def test_truncated_and_mangled_heartbeats_close_or_decode(cut: int, junk: bytes) -> None:
    body = request_body(HEARTBEAT, 1, heartbeat("g", "m", 0, ["t"]))
    with contextlib.suppress(FrameError):
        codec().decode(body[: max(8, len(body) - cut)] + junk)


def access(*bindings: tuple[str, str, str]) -> Access:
    authorizer = Authorizer(["User:admin"])
    for rtype, name, operation in bindings:
        authorizer.add(AclBinding(rtype, name, "literal", "User:alice", "*", operation, "allow"))
    return Access(authorizer, lambda _rtype, _name: False)


def test_heartbeat_needs_read_and_describe_is_judged_per_group() -> None:
    join = cg.KafkaConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="m",
        member_epoch=0,
        rebalance_timeout_ms=1_000,
        subscribed_topics=["mine", "theirs"],
        owned=[],
        instance_id=None,
    )
    denied = access((Res.GROUP, "g", Op.DESCRIBE)).judge(join, "User:alice", "h")
    assert denied.refused and denied.refusal.error == ErrorCode.GROUP_AUTHORIZATION_FAILED
    allowed = access((Res.GROUP, "g", Op.READ), (Res.TOPIC, "mine", Op.DESCRIBE))
    judged = allowed.judge(join, "User:alice", "h")
    assert not judged.refused and judged.request.subscribed_topics == ["mine"]
    describe = cg.ConsumerGroupDescribeRequest(group_ids=["g", "other"])
    judged = access((Res.GROUP, "g", Op.DESCRIBE), (Res.TOPIC, "mine", Op.DESCRIBE)).judge(
        describe, "User:alice", "h"
    )
    assert judged.request.group_ids == ["g"]
    parts = [
        cg.ConsumerTopicPartitions("mine", bytes(16), [0]),
        cg.ConsumerTopicPartitions("theirs", bytes(16), [0]),
    ]
    member = cg.ConsumerMember("m", None, 1, "c", "h", ["mine", "theirs"], parts, list(parts))
    response = cg.ConsumerGroupDescribeResponse(
        groups=[cg.ConsumerGroupDescription("g", state="Stable", members=[member])]
    )
    judged.finish(response)
    (shown, refused) = response.groups
    assert shown.members[0].subscribed_topics == ["mine"]
    assert [t.topic for t in shown.members[0].assignment] == ["mine"]
    assert [t.topic for t in shown.members[0].target] == ["mine"]
    assert (refused.group_id, refused.error) == ("other", ErrorCode.GROUP_AUTHORIZATION_FAILED)
