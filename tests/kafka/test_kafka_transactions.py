"""Kafka's transactional producers against the real broker's kafka listener, on both
backends: kafka-python, aiokafka and confluent-kafka (librdkafka) commit and abort
transactions over several partitions, read back at read_committed and read_uncommitted
by manually assigned consumers of the same client; a second producer with the same
transactional id fences the first and aborts its open transaction; the broker aborts a
transaction past its timeout. Then, on the raw protocol, what KIP-890 part 1 protects
a classic producer from: a batch to a partition not added, a late batch of an ended
transaction (docs/transactions.md, "Kafka's clients")."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import kafka.structs
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AIOTopicPartition
from kafka.protocol.admin import DescribeTransactionsRequest, DescribeTransactionsResponse
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import FetchResponse, OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from client import Consumer, Producer
from harness.broker_process import BrokerProcess
from harness.kafka_requests import fetch_request, produce_request
from harness.wire import WireClient, fetched_values
from tests.conftest import BACKENDS
from tests.kafka.kafka_support import CLIENTS, DEADLINE_S, KafkaStack, listeners_config
from tests.kafka.test_kafka_smoke import SECURED

PARTITIONS = 3
PER_TXN = 9  # records per transaction, spread over the partitions
TIMEOUT_MS = 1_000  # the transaction timeout of the timeout test
SETTINGS = "transaction_abort_timed_out_transaction_cleanup_interval_ms = 50\n"
INVALID_TXN_STATE = 48
PRODUCER_FENCED = 90
UNKNOWN_TOPIC_OR_PARTITION = 3
OPERATION_NOT_ATTEMPTED = 55
UNSTABLE_OFFSET_COMMIT = 88
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
TRANSACTIONAL_ID_NOT_FOUND = 105


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaStack]:
    """One broker per backend for the module, sweeping for timed-out transactions every
    50 ms; each test has topics and transactional ids of its own."""
    data_dir = tmp_path_factory.mktemp(f"kafka-txn-{request.param}") / "data"
    broker = BrokerProcess(
        data_dir, backend=request.param, config=SETTINGS + listeners_config()
    ).start()
    stack = KafkaStack(broker)
    try:
        yield stack
    finally:
        stack.close()


# ------------------------------------------------------------------ each client's producer


class TxnProducer:
    """One client's transactional producer, driven synchronously."""

    def __init__(self, client: str, bootstrap: str, transactional_id: str, timeout_ms: int) -> None:
        self.client = client
        self.bootstrap = bootstrap
        if client == "kafka-python":
            self.kp = kafka.KafkaProducer(
                bootstrap_servers=bootstrap,
                transactional_id=transactional_id,
                transaction_timeout_ms=timeout_ms,
                retry_backoff_ms=20,
            )
        elif client == "aiokafka":
            self.runner = asyncio.Runner()

            async def make() -> AIOKafkaProducer:
                return AIOKafkaProducer(
                    bootstrap_servers=bootstrap,
                    transactional_id=transactional_id,
                    transaction_timeout_ms=timeout_ms,
                    retry_backoff_ms=20,
                )

            self.ai = self.runner.run(make())
        else:
            self.ck = confluent_kafka.Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "transactional.id": transactional_id,
                    "transaction.timeout.ms": timeout_ms,
                    "message.timeout.ms": timeout_ms,
                    "retry.backoff.ms": 20,
                }
            )

    def init(self) -> None:
        if self.client == "kafka-python":
            self.kp.init_transactions()
        elif self.client == "aiokafka":
            self.runner.run(self.ai.start())
        else:
            self.ck.init_transactions(DEADLINE_S)

    def begin(self) -> None:
        if self.client == "kafka-python":
            self.kp.begin_transaction()
        elif self.client == "aiokafka":
            self.runner.run(self.ai.begin_transaction())
        else:
            self.ck.begin_transaction()

    def send_all(self, topic: str, values: list[bytes]) -> None:
        """Send `values` round-robin over the partitions and wait until all are written."""
        if self.client == "kafka-python":
            for i, value in enumerate(values):
                self.kp.send(topic, value=value, partition=i % PARTITIONS)
            self.kp.flush(DEADLINE_S)
        elif self.client == "aiokafka":

            async def send() -> None:
                for i, value in enumerate(values):
                    await self.ai.send(topic, value=value, partition=i % PARTITIONS)
                await self.ai.flush()

            self.runner.run(send())
        else:
            for i, value in enumerate(values):
                self.ck.produce(topic, value=value, partition=i % PARTITIONS)
            assert self.ck.flush(DEADLINE_S) == 0

    def send_offsets(self, topic: str, offsets: dict[int, int], group: str) -> None:
        """The consumed `offsets` (partition -> next offset) of `group`, outside its
        membership (a consumer that assigns itself), join the transaction."""
        if self.client == "kafka-python":
            self.kp.send_offsets_to_transaction(
                {
                    kafka.structs.TopicPartition(topic, p): kafka.structs.OffsetAndMetadata(
                        o, "", -1
                    )
                    for p, o in offsets.items()
                },
                group,
            )
        elif self.client == "aiokafka":
            tps = {AIOTopicPartition(topic, p): o for p, o in offsets.items()}
            self.runner.run(self.ai.send_offsets_to_transaction(tps, group))
        else:
            consumer = confluent_kafka.Consumer(
                {"bootstrap.servers": self.bootstrap, "group.id": group}
            )
            try:
                self.ck.send_offsets_to_transaction(
                    [confluent_kafka.TopicPartition(topic, p, o) for p, o in offsets.items()],
                    consumer.consumer_group_metadata(),
                    DEADLINE_S,
                )
            finally:
                consumer.close()

    def end(self, commit: bool) -> None:
        if self.client == "kafka-python":
            (self.kp.commit_transaction if commit else self.kp.abort_transaction)()
        elif self.client == "aiokafka":
            ending = self.ai.commit_transaction if commit else self.ai.abort_transaction
            self.runner.run(ending())
        else:
            (self.ck.commit_transaction if commit else self.ck.abort_transaction)(DEADLINE_S)

    def close(self) -> None:
        if self.client == "kafka-python":
            self.kp.close(timeout=5)
        elif self.client == "aiokafka":
            try:
                self.runner.run(self.ai.stop())
            finally:
                self.runner.close()


def producer(client: str, stack: KafkaStack, tid: str, timeout_ms: int = 60_000) -> TxnProducer:
    p = TxnProducer(client, stack.kafka, tid, timeout_ms)
    p.init()
    return p


# ------------------------------------------------------------------ each client's reader


def read_all(client: str, bootstrap: str, topic: str, count: int, isolation: str) -> list[bytes]:
    """Every partition of `topic` from its beginning by manual assignment, with `client`'s
    consumer at `isolation`, until `count` values came (confluent-kafka: until every
    partition's end, so a record too many shows too)."""
    if client == "kafka-python":
        consumer = kafka.KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation
        )
        out: list[bytes] = []
        try:
            consumer.assign([kafka.structs.TopicPartition(topic, p) for p in range(PARTITIONS)])
            consumer.seek_to_beginning()
            deadline = time.monotonic() + DEADLINE_S
            while len(out) < count and time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=200).values():
                    out += [m.value for m in batch]
        finally:
            consumer.close()
        return out
    if client == "aiokafka":
        return asyncio.run(_read_aiokafka(bootstrap, topic, count, isolation))
    return _read_confluent(bootstrap, topic, isolation)


async def _read_aiokafka(bootstrap: str, topic: str, count: int, isolation: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation
    )
    out: list[bytes] = []
    await consumer.start()
    try:
        consumer.assign([AIOTopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < count and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                out += [m.value for m in batch]
    finally:
        await consumer.stop()
    return out


def _read_confluent(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"assign-only-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    out: list[bytes] = []
    at_end: set[int] = set()
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        deadline = time.monotonic() + DEADLINE_S
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=100, timeout=0.2):
                error = m.error()
                if error is not None and error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                elif error is not None:
                    raise AssertionError(f"confluent-kafka consumer: {error}")
                else:
                    out.append(m.value())
    finally:
        consumer.close()
    return out


def values(tag: str) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(PER_TXN)]


def assert_reads(client: str, stack: KafkaStack, topic: str, committed: list[bytes]) -> None:
    """read_committed sees exactly `committed`."""
    back = read_all(client, stack.kafka, topic, len(committed), "read_committed")
    assert sorted(back) == sorted(committed)


# ------------------------------------------------------------------ the clients


@pytest.mark.parametrize("client", CLIENTS)
def test_commit_and_abort_over_several_partitions(stack: KafkaStack, client: str) -> None:
    """Three transactions of one producer (commit, abort, commit) over three partitions:
    read_committed sees the two committed ones whole and nothing of the aborted one,
    read_uncommitted sees all three. The producer keeps its epoch across them (EndTxn
    v0-3 answers none), so the coordinator must not move it at a commit or an abort."""
    topic = stack.new_topic(f"txn-{client}", partitions=PARTITIONS)
    p = producer(client, stack, f"txn-{client}-{uuid.uuid4().hex[:8]}")
    try:
        for tag, commit in (("c1", True), ("a2", False), ("c3", True)):
            p.begin()
            p.send_all(topic, values(tag))
            p.end(commit)
    finally:
        p.close()
    assert_reads(client, stack, topic, values("c1") + values("c3"))
    everything = values("c1") + values("a2") + values("c3")
    back = read_all(client, stack.kafka, topic, len(everything), "read_uncommitted")
    assert sorted(back) == sorted(everything)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_second_producer_fences_the_first(stack: KafkaStack, client: str) -> None:
    """A zombie: the first producer's transaction is open when a second one with the same
    transactional id initializes. Its transaction is aborted and its commit fails; the
    second one's transaction commits."""
    topic = stack.new_topic(f"fence-{client}", partitions=PARTITIONS)
    tid = f"fence-{client}-{uuid.uuid4().hex[:8]}"
    zombie = producer(client, stack, tid)
    successor: TxnProducer | None = None
    try:
        zombie.begin()
        zombie.send_all(topic, values("zombie"))
        successor = producer(client, stack, tid)
        with pytest.raises(Exception):  # noqa: B017 (each client has its own fenced error)
            zombie.end(True)
        successor.begin()
        successor.send_all(topic, values("successor"))
        successor.end(True)
    finally:
        zombie.close()
        if successor is not None:
            successor.close()
    assert_reads(client, stack, topic, values("successor"))


@pytest.mark.parametrize("client", CLIENTS)
def test_the_broker_aborts_a_transaction_past_its_timeout(stack: KafkaStack, client: str) -> None:
    """The producer writes and then stalls past its transaction timeout: the broker
    aborts the transaction (bumping the epoch, which fences the stalled producer's
    commit) and read_committed readers are held back no longer."""
    topic = stack.new_topic(f"timeout-{client}", partitions=PARTITIONS)
    tid = f"timeout-{client}-{uuid.uuid4().hex[:8]}"
    p = producer(client, stack, tid, timeout_ms=TIMEOUT_MS)
    try:
        p.begin()
        p.send_all(topic, values("late"))
        assert stack.broker.log_shows(f"event=txn_timed_out id={tid!r}", DEADLINE_S)
        with pytest.raises(Exception):  # noqa: B017 (each client has its own error for it)
            p.end(True)
    finally:
        p.close()
    assert read_all(client, stack.kafka, topic, 0, "read_committed") == []
    back = read_all(client, stack.kafka, topic, PER_TXN, "read_uncommitted")
    assert sorted(back) == sorted(values("late"))


@pytest.mark.parametrize("client", CLIENTS)
def test_consumed_offsets_commit_and_abort_with_the_transaction(
    stack: KafkaStack, client: str
) -> None:
    """send_offsets_to_transaction (AddOffsetsToTxn, then TxnOffsetCommit) for a group
    the consumer is not a member of: the offsets become the group's committed offsets
    when the transaction commits, and are dropped when it aborts."""
    topic = stack.new_topic(f"offsets-{client}", partitions=PARTITIONS)
    group = f"ctp-{client}-{uuid.uuid4().hex[:8]}"
    p = producer(client, stack, f"offsets-{client}-{uuid.uuid4().hex[:8]}")
    try:
        for offsets, commit in (({0: 5, 1: 7}, True), ({0: 50, 2: 70}, False)):
            p.begin()
            p.send_all(topic, values(f"o{commit}"))
            p.send_offsets(topic, offsets, group)
            p.end(commit)
    finally:
        p.close()
    assert committed_offsets(stack.kafka, group, topic) == {0: 5, 1: 7, 2: None}


def test_a_group_members_offsets_join_its_transaction(stack: KafkaStack) -> None:
    """Consume-transform-produce as confluent-kafka's EOS example runs it: a consumer in a
    classic group reads, the producer sends the transforms and the consumer's offsets
    with its group metadata (KIP-447: generation and member id, checked as an
    OffsetCommit's), and commits; the output holds each input once and the group's
    offsets move with the commit. They were refused ILLEGAL_GENERATION before."""
    source = stack.new_topic("ctp-in", partitions=1)
    sink = stack.new_topic("ctp-out", partitions=1)
    group = f"ctp-member-{uuid.uuid4().hex[:8]}"
    inputs = [f"in-{i}".encode() for i in range(10)]
    seed = confluent_kafka.Producer({"bootstrap.servers": stack.kafka})
    for value in inputs:
        seed.produce(source, value=value, partition=0)
    assert seed.flush(DEADLINE_S) == 0
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": stack.kafka,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    p = producer("confluent-kafka", stack, f"ctp-member-{uuid.uuid4().hex[:8]}")
    try:
        consumer.subscribe([source])
        done = 0
        deadline = time.monotonic() + DEADLINE_S
        while done < len(inputs) and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(num_messages=4, timeout=0.5) if not m.error()]
            if not batch:
                continue
            p.begin()
            for m in batch:
                p.ck.produce(sink, value=m.value().upper(), partition=0)
            p.ck.send_offsets_to_transaction(
                consumer.position(consumer.assignment()),
                consumer.consumer_group_metadata(),
                DEADLINE_S,
            )
            p.end(True)
            done += len(batch)
    finally:
        p.close()
        consumer.close()
    assert done == len(inputs)
    assert sorted(read_all("kafka-python", stack.kafka, sink, 10, "read_committed")) == sorted(
        v.upper() for v in inputs
    )
    assert committed_offsets(stack.kafka, group, source)[0] == len(inputs)


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    """The group's committed offsets, read as a read_committed consumer asks (OffsetFetch
    with require_stable)."""
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    try:
        return {
            p: consumer.committed(kafka.structs.TopicPartition(topic, p)) for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


# ------------------------------------------------------------------ the raw protocol


class Raw:
    """One connection to the kafka listener, sending kafka-python's request classes."""

    def __init__(self, address: str) -> None:
        host, port = address.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)

    def call(self, message: ApiMessage, response: Any, version: int) -> Any:
        message.with_header(correlation_id=7, client_id="raw")
        body = bytes(message.encode(header=True))
        self.sock.sendall(struct.pack(">i", len(body)) + body)
        (length,) = struct.unpack(">i", self._exactly(4))
        return response[version].decode(self._exactly(length), header=True)

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            assert chunk, "connection closed"
            data += chunk
        return data

    def init(self, tid: str, pid: int = -1, epoch: int = -1) -> Any:
        request = InitProducerIdRequest[3](
            transactional_id=tid,
            transaction_timeout_ms=60_000,
            producer_id=pid,
            producer_epoch=epoch,
        )
        return self.call(request, InitProducerIdResponse, 3)

    def add(self, tid: str, pid: int, epoch: int, topic: str, partitions: list[int]) -> list[int]:
        topic_cls = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        topics = [topic_cls(name=topic, partitions=partitions)]
        request = AddPartitionsToTxnRequest[3](
            v3_and_below_transactional_id=tid,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=topics,
        )
        answer = self.call(request, AddPartitionsToTxnResponse, 3)
        return [
            p.partition_error_code
            for t in answer.results_by_topic_v3_and_below
            for p in t.results_by_partition
        ]

    def produce(self, tid: str, pid: int, epoch: int, seq: int, topic: str, value: bytes) -> int:
        builder = DefaultRecordBatchBuilder(2, 0, True, pid, epoch, seq, 1 << 20)
        builder.append(0, int(time.time() * 1000), None, value, [])
        request = produce_request(topic, bytes(builder.build()), acks=-1, transactional_id=tid)
        answer = self.call(request, ProduceResponse, 9)
        code: int = answer.responses[0].partition_responses[0].error_code
        return code

    def end(self, tid: str, pid: int, epoch: int, commit: bool) -> int:
        request = EndTxnRequest[3](
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit
        )
        code: int = self.call(request, EndTxnResponse, 3).error_code
        return code

    def add_offsets(self, tid: str, pid: int, epoch: int, group: str) -> int:
        request = AddOffsetsToTxnRequest[3](
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group
        )
        code: int = self.call(request, AddOffsetsToTxnResponse, 3).error_code
        return code

    def txn_offsets(self, tid: str, pid: int, epoch: int, group: str, topic: str) -> int:
        """Offset 1 of partition 0 of `topic` for `group` in the transaction; its code."""
        topic_cls = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        partition = topic_cls.TxnOffsetCommitRequestPartition(
            partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata=""
        )
        request = TxnOffsetCommitRequest[3](
            transactional_id=tid,
            group_id=group,
            producer_id=pid,
            producer_epoch=epoch,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=[topic_cls(name=topic, partitions=[partition])],
        )
        answer = self.call(request, TxnOffsetCommitResponse, 3)
        code: int = answer.topics[0].partitions[0].error_code
        return code

    def stable_offset(self, group: str, topic: str) -> tuple[int, int]:
        """(error, offset) of partition 0 of `topic` for `group`, asked with require_stable."""
        topic_cls = OffsetFetchRequest.OffsetFetchRequestTopic
        request = OffsetFetchRequest[7](
            group_id=group,
            topics=[topic_cls(name=topic, partition_indexes=[0])],
            require_stable=True,
        )
        answer = self.call(request, OffsetFetchResponse, 7)
        partition = answer.topics[0].partitions[0]
        return partition.error_code, partition.committed_offset

    def log_end(self, topic: str) -> int:
        answer = self.call(fetch_request(topic), FetchResponse, 12)
        end: int = answer.responses[0].partitions[0].high_watermark
        return end

    def stable_end(self, topic: str, partition: int) -> int:
        """The partition's last stable offset, as a read_committed Fetch answers it."""
        request = fetch_request(topic)
        request.isolation_level = 1
        request.topics[0].partitions[0].partition = partition
        answer = self.call(request, FetchResponse, 12)
        stable: int = answer.responses[0].partitions[0].last_stable_offset
        return stable

    def login(self, user: str) -> None:
        """SASL PLAIN as `user` (password `<user>-pw`)."""
        handshake = self.call(SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse, 1)
        assert handshake.error_code == 0
        token = f"\0{user}\0{user}-pw".encode()
        answer = self.call(
            SaslAuthenticateRequest[1](auth_bytes=token), SaslAuthenticateResponse, 1
        )
        assert answer.error_code == 0, answer

    def coordinator(self, tid: str) -> tuple[int, int]:
        """FindCoordinator for transactional id `tid`: (error, port)."""
        request = FindCoordinatorRequest[3](key=tid, key_type=1)
        answer = self.call(request, FindCoordinatorResponse, 3)
        return answer.error_code, answer.port

    def describe(self, *tids: str) -> list[Any]:
        """DescribeTransactions of `tids`: each id's state, in order."""
        request = DescribeTransactionsRequest[0](transactional_ids=list(tids))
        states: list[Any] = self.call(request, DescribeTransactionsResponse, 0).transaction_states
        return states

    def close(self) -> None:
        self.sock.close()


def test_a_classic_producer_writes_only_to_partitions_it_added(stack: KafkaStack) -> None:
    """KIP-890 part 1: a transactional batch to a partition the open transaction has
    not added is refused, never appended; after the commit, the producer's next batch
    with the same epoch (a late retry of the ended transaction's) finds no transaction
    holding the partition and is refused too, so no hanging transaction can start."""
    topic = stack.new_topic("raw-txn", partitions=1)
    tid = f"raw-{uuid.uuid4().hex[:8]}"
    raw = Raw(stack.kafka)
    try:
        init = raw.init(tid)
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        assert raw.produce(tid, pid, epoch, 0, topic, b"early") == INVALID_TXN_STATE
        assert raw.add(tid, pid, epoch, topic, [0]) == [0]
        assert raw.produce(tid, pid, epoch, 0, topic, b"in") == 0
        assert raw.end(tid, pid, epoch, commit=True) == 0
        assert raw.log_end(topic) == 2  # the batch and its COMMIT marker
        assert raw.produce(tid, pid, epoch, 1, topic, b"late") == INVALID_TXN_STATE
        assert raw.log_end(topic) == 2
        # A retried EndTxn is answered the same; the opposite end contradicts it.
        assert raw.end(tid, pid, epoch, commit=True) == 0
        assert raw.end(tid, pid, epoch, commit=False) == INVALID_TXN_STATE
        # None of a request is added when one partition does not exist.
        assert raw.add(tid, pid, epoch, topic, [0, 9]) == [
            OPERATION_NOT_ATTEMPTED,
            UNKNOWN_TOPIC_OR_PARTITION,
        ]
        assert raw.produce(tid, pid, epoch, 1, topic, b"not added") == INVALID_TXN_STATE
        # The next transaction, same epoch, goes on with the next sequence.
        assert raw.add(tid, pid, epoch, topic, [0]) == [0]
        assert raw.produce(tid, pid, epoch, 1, topic, b"next") == 0
        assert raw.end(tid, pid, epoch, commit=False) == 0
        # Naming its producer bumps it (KIP-360), and fences the epoch it named.
        newer = raw.init(tid, pid, epoch)
        assert (newer.error_code, newer.producer_id, newer.producer_epoch) == (0, pid, epoch + 1)
        assert raw.add(tid, pid, epoch, topic, [0]) == [PRODUCER_FENCED]
    finally:
        raw.close()


def ids(answer: Any) -> tuple[int, int, int]:
    """An InitProducerId answer's (error, producer id, epoch)."""
    return answer.error_code, answer.producer_id, answer.producer_epoch


def test_a_classic_init_sent_again_after_its_answer_was_lost(stack: KafkaStack) -> None:
    """kafka-python and librdkafka send an InitProducerId again as it was when its answer
    is lost. One naming the producer it had (KIP-360) gets the answer it was given, as
    Kafka's coordinator gives it, even after a kill -9 (txn.wal keeps what it named):
    it was fenced before. A -1/-1 one is a new instance, bumped again; after it, the old
    request is a zombie's and fenced."""
    topic = stack.new_topic("raw-reinit", partitions=1)
    tid = f"raw-reinit-{uuid.uuid4().hex[:8]}"
    raw = Raw(stack.kafka)
    try:
        code, pid, epoch = ids(raw.init(tid))
        assert code == 0
        assert ids(raw.init(tid)) == (0, pid, epoch + 1)  # -1/-1 again: bumped again
        assert ids(raw.init(tid, pid, epoch + 1)) == (0, pid, epoch + 2)
        assert ids(raw.init(tid, pid, epoch + 1)) == (0, pid, epoch + 2)
    finally:
        raw.close()
    stack.broker.restart()
    raw = Raw(stack.kafka)
    try:
        assert ids(raw.init(tid, pid, epoch + 1)) == (0, pid, epoch + 2)
        assert raw.add(tid, pid, epoch + 2, topic, [0]) == [0]
        assert raw.produce(tid, pid, epoch + 2, 0, topic, b"after") == 0
        assert raw.end(tid, pid, epoch + 2, commit=True) == 0
        assert ids(raw.init(tid, pid, epoch + 1)) == (0, pid, epoch + 2)
        assert ids(raw.init(tid)) == (0, pid, epoch + 3)  # a new instance takes over
        assert raw.init(tid, pid, epoch + 1).error_code == PRODUCER_FENCED
        assert raw.init(tid, pid, epoch + 2).error_code == PRODUCER_FENCED
    finally:
        raw.close()


def test_a_classic_transaction_open_at_a_kill_stays_open(stack: KafkaStack) -> None:
    """A classic producer's transactions share one pid and epoch, so the COMMIT marker
    of its previous transaction on partition 0 carries the open one's ids. Recovery
    decides an open transaction by a marker of its ids whose decision was lost; for a
    classic one that marker can only be an earlier transaction's (its decisions are
    durable before its markers), so after a kill -9 the open transaction stays open,
    holding partition 1's last stable offset, and the producer's abort ends it."""
    topic = stack.new_topic("raw-kill", partitions=2)
    tid = f"raw-kill-{uuid.uuid4().hex[:8]}"
    raw = Raw(stack.kafka)
    try:
        init = raw.init(tid)
        pid, epoch = init.producer_id, init.producer_epoch
        assert raw.add(tid, pid, epoch, topic, [0]) == [0]
        assert raw.produce(tid, pid, epoch, 0, topic, b"committed") == 0
        assert raw.end(tid, pid, epoch, commit=True) == 0
        assert raw.add(tid, pid, epoch, topic, [0, 1]) == [0, 0]
        builder = DefaultRecordBatchBuilder(2, 0, True, pid, epoch, 0, 1 << 20)
        builder.append(0, int(time.time() * 1000), None, b"open", [])
        request = produce_request(
            topic, bytes(builder.build()), acks=-1, transactional_id=tid, partition=1
        )
        assert (
            raw.call(request, ProduceResponse, 9).responses[0].partition_responses[0].error_code
            == 0
        )
    finally:
        raw.close()
    stack.broker.restart()
    raw = Raw(stack.kafka)
    try:
        assert raw.stable_end(topic, 1) == 0
        assert raw.end(tid, pid, epoch, commit=False) == 0
        assert raw.stable_end(topic, 1) == 2  # the batch and its ABORT marker
    finally:
        raw.close()


def test_a_classic_producer_commits_offsets_only_of_a_group_it_added(stack: KafkaStack) -> None:
    """TxnOffsetCommit needs the group added by AddOffsetsToTxn (a late one of an ended
    transaction would otherwise start a new one); while the offsets are pending,
    OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT (KIP-447)."""
    topic = stack.new_topic("raw-offsets", partitions=1)
    tid = f"raw-offsets-{uuid.uuid4().hex[:8]}"
    group = f"raw-group-{uuid.uuid4().hex[:8]}"
    raw = Raw(stack.kafka)
    try:
        init = raw.init(tid)
        pid, epoch = init.producer_id, init.producer_epoch
        assert raw.txn_offsets(tid, pid, epoch, group, topic) == INVALID_TXN_STATE
        assert raw.add_offsets(tid, pid, epoch, group) == 0
        assert raw.txn_offsets(tid, pid, epoch, group, topic) == 0
        assert raw.stable_offset(group, topic)[0] == UNSTABLE_OFFSET_COMMIT
        assert raw.end(tid, pid, epoch, commit=True) == 0
        assert raw.stable_offset(group, topic) == (0, 1)
        assert raw.txn_offsets(tid, pid, epoch, group, topic) == INVALID_TXN_STATE
        assert raw.add_offsets(tid, pid, epoch - 1, group) == PRODUCER_FENCED
    finally:
        raw.close()


def test_kafkas_admin_client_lists_and_describes_transactions(stack: KafkaStack) -> None:
    """KIP-664's ListTransactions and DescribeTransactions show what `minibroker txn
    list` shows: an open classic transaction with its partitions, found by state and
    producer id; an unknown id is TRANSACTIONAL_ID_NOT_FOUND. DescribeProducers shows
    the producer on the partition it wrote, with its open transaction's first offset."""
    topic = stack.new_topic("admin-txn", partitions=2)
    tid = f"admin-{uuid.uuid4().hex[:8]}"
    raw = Raw(stack.kafka)
    admin = kafka.KafkaAdminClient(bootstrap_servers=stack.kafka)
    try:
        init = raw.init(tid)
        pid, epoch = init.producer_id, init.producer_epoch
        assert raw.add(tid, pid, epoch, topic, [0, 1]) == [0, 0]
        listed = [t for ts in admin.list_transactions().values() for t in ts]
        assert (tid, pid, "Ongoing") in [
            (t.transactional_id, t.producer_id, t.state) for t in listed
        ]
        by_pid = admin.list_transactions(producer_id_filters=[pid], state_filters=["Ongoing"])
        assert [t.transactional_id for ts in by_pid.values() for t in ts] == [tid]
        assert not [
            t for ts in admin.list_transactions(state_filters=["Dead"]).values() for t in ts
        ]
        described = admin.describe_transactions([tid])[tid]
        assert (described.state, described.producer_id, described.producer_epoch) == (
            "Ongoing",
            pid,
            epoch,
        )
        assert described.topic_partitions == {
            kafka.structs.TopicPartition(topic, 0),
            kafka.structs.TopicPartition(topic, 1),
        }
        assert described.transaction_timeout_ms == 60_000
        with pytest.raises(kafka.errors.TransactionalIdNotFoundError):
            admin.describe_transactions([f"{tid}-unknown"])
        # DescribeProducers: the open transaction's first offset on the partition written.
        assert raw.produce(tid, pid, epoch, 0, topic, b"open") == 0
        tp0 = kafka.structs.TopicPartition(topic, 0)
        (state,) = admin.describe_producers([tp0])[tp0].active_producers
        assert (state.producer_id, state.producer_epoch, state.last_sequence) == (pid, epoch, 0)
        assert state.current_transaction_start_offset == 0
        tp1 = kafka.structs.TopicPartition(topic, 1)
        assert admin.describe_producers([tp1])[tp1].active_producers == []
        assert raw.end(tid, pid, epoch, commit=False) == 0
        described = admin.describe_transactions([tid])[tid]
        assert described.state == "CompleteAbort" and described.topic_partitions == set()
        (state,) = admin.describe_producers([tp0])[tp0].active_producers
        assert state.current_transaction_start_offset == -1
    finally:
        admin.close()
        raw.close()


# ------------------------------------------------------------------ across the listeners


def sdk_read_committed(bootstrap: str, topic: str) -> list[bytes]:
    """Every record of `topic` that our SDK's consumer shows at read_committed."""
    with Consumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        assert consumer.config.isolation_level == "read_committed"
        partitions = consumer.assignment()
        ends = consumer.end_offsets(partitions)
        out: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, "consumer did not reach the end offsets"
            for records in consumer.poll(timeout_ms=200).values():
                out += [r.value for r in records if r.value is not None]
        return out


@pytest.mark.parametrize("client", CLIENTS)
def test_transactions_of_both_listeners_read_through_both(stack: KafkaStack, client: str) -> None:
    """One topic holds both formats: our SDK's transactions (magic 1, their epoch moving
    at each end) and a Kafka client's (v2, one epoch), committed and aborted, one of
    ours open across one of theirs on the same partitions. At read_committed the SDK
    and the Kafka client each see the committed ones of both and nothing aborted: the
    markers and the aborted-transaction lists read the same through either listener."""
    topic = stack.new_topic(f"cross-{client}", partitions=PARTITIONS)
    theirs = producer(client, stack, f"cross-k-{client}-{uuid.uuid4().hex[:8]}")
    ours = Producer(stack.mb, transactional_id=f"cross-n-{client}-{uuid.uuid4().hex[:8]}")
    try:
        ours.init_transactions()
        for tag, commit in (("n-c1", True), ("n-a2", False)):
            ours.begin_transaction()
            for i, value in enumerate(values(tag)):
                ours.send(topic, value, partition=i % PARTITIONS)
            ours.flush()
            if tag == "n-a2":  # open across a Kafka transaction on the same partitions
                for ktag, kcommit in (("k-a1", False), ("k-c2", True)):
                    theirs.begin()
                    theirs.send_all(topic, values(ktag))
                    theirs.end(kcommit)
            (ours.commit_transaction if commit else ours.abort_transaction)()
    finally:
        ours.close()
        theirs.close()
    committed = values("n-c1") + values("k-c2")
    assert sorted(sdk_read_committed(stack.mb, topic)) == sorted(committed)
    assert_reads(client, stack, topic, committed)


# ------------------------------------------------------------------ authorization


def test_a_transactional_id_and_its_topics_need_write(tmp_path: Path, backend: str) -> None:
    """Section 7 on the kafka listener: alice, allowed WRITE on her transactional id and
    on one topic, runs a transaction there; bob, allowed the topic alone, cannot take
    her id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); alice cannot add a topic she may
    write, only describe (TOPIC_AUTHORIZATION_FAILED from AddPartitionsToTxn)."""
    env = {"MINIBROKER_BOOTSTRAP_USERS": "admin:admin-pw,alice:alice-pw,bob:bob-pw"}
    broker = BrokerProcess(tmp_path / "data", backend=backend, config=SECURED, env=env).start()
    try:
        with WireClient(broker.address("minibroker")) as admin:
            admin.authenticate("admin", "admin-pw")
            assert admin.create_topic("payments", 1) == 0
            assert admin.create_topic("audit", 1) == 0
            grants = [
                ("topic", "payments", "User:alice", "write"),
                ("transactional_id", "tx-alice", "User:alice", "write"),
                # She sees the topic (Metadata), so her producer asks to add it.
                ("topic", "audit", "User:alice", "describe"),
                ("topic", "payments", "User:bob", "write"),
            ]
            creations = [
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
            ]
            results = admin.call("CreateAcls", creations=creations)["results"]
            assert [r["error"] for r in results] == [0, 0, 0, 0]

        def producer(user: str) -> kafka.KafkaProducer:
            return kafka.KafkaProducer(
                bootstrap_servers=broker.address("kafka"),
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-256",
                sasl_plain_username=user,
                sasl_plain_password=f"{user}-pw",
                transactional_id="tx-alice",
                max_block_ms=10_000,
            )

        alice = producer("alice")
        try:
            alice.init_transactions()
            alice.begin_transaction()
            alice.send("payments", value=b"paid", partition=0)
            alice.commit_transaction()
        finally:
            alice.close(timeout=5)
        # librdkafka, since kafka-python's commit waits for ever on a batch whose
        # partition was refused (it fails the add, not the batch).
        alice_ck = confluent_kafka.Producer(
            {
                "bootstrap.servers": broker.address("kafka"),
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "alice",
                "sasl.password": "alice-pw",
                "transactional.id": "tx-alice",
            }
        )
        alice_ck.init_transactions(DEADLINE_S)
        alice_ck.begin_transaction()
        alice_ck.produce("audit", value=b"not hers", partition=0)
        with pytest.raises(confluent_kafka.KafkaException) as topic_refused:
            alice_ck.commit_transaction(DEADLINE_S)
        alice_ck.abort_transaction(DEADLINE_S)
        bob = producer("bob")
        try:
            with pytest.raises(kafka.errors.KafkaError) as id_refused:
                bob.init_transactions()
        finally:
            bob.close(timeout=5)
        with WireClient(broker.address("minibroker")) as admin:
            admin.authenticate("admin", "admin-pw")
            paid = fetched_values(admin.fetch("payments", 0, 0)["records"])
            audit = fetched_values(admin.fetch("audit", 0, 0)["records"])
    finally:
        broker.kill()
    error = topic_refused.value.args[0]
    assert error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error.txn_requires_abort()
    assert isinstance(id_refused.value, kafka.errors.TransactionalIdAuthorizationFailedError)
    assert (0, b"paid") in paid and audit == []


def test_finding_and_describing_a_transactional_id_need_describe(
    tmp_path: Path, backend: str
) -> None:
    """As Kafka asks: FindCoordinator for a transactional id and DescribeTransactions need
    DESCRIBE on the id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, for an unknown id too, so
    a denial does not tell which ids exist), and DescribeTransactions leaves out the
    topics the caller may not describe. Each denial changes nothing: alice's open
    transaction is the same after them, and she commits it."""
    users = "admin:admin-pw,alice:alice-pw,bob:bob-pw,carol:carol-pw"
    env = {"MINIBROKER_BOOTSTRAP_USERS": users}
    broker = BrokerProcess(tmp_path / "data", backend=backend, config=SECURED, env=env).start()
    try:
        with WireClient(broker.address("minibroker")) as admin:
            admin.authenticate("admin", "admin-pw")
            assert admin.create_topic("payments", 1) == 0
            grants = [
                ("topic", "payments", "User:alice", "write"),
                ("transactional_id", "tx-alice", "User:alice", "write"),  # implies describe
                ("topic", "payments", "User:bob", "describe"),
                ("transactional_id", "tx-alice", "User:carol", "describe"),
            ]
            creations = [
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
            ]
            results = admin.call("CreateAcls", creations=creations)["results"]
            assert [r["error"] for r in results] == [0, 0, 0, 0]
        address = broker.address("kafka")
        port = int(address.rsplit(":", 1)[1])
        alice, bob, carol = Raw(address), Raw(address), Raw(address)
        try:
            for raw, user in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
                raw.login(user)
            assert alice.coordinator("tx-alice") == (0, port)
            code, pid, epoch = ids(alice.init("tx-alice"))
            assert code == 0
            assert alice.add("tx-alice", pid, epoch, "payments", [0]) == [0]
            assert alice.produce("tx-alice", pid, epoch, 0, "payments", b"paid") == 0

            def seen_by_alice() -> tuple[int, str, int, int, list[tuple[str, list[int]]]]:
                (state,) = alice.describe("tx-alice")
                topics = [(t.topic, list(t.partitions)) for t in state.topics]
                return (
                    state.error_code,
                    state.transaction_state,
                    state.producer_id,
                    state.producer_epoch,
                    topics,
                )

            before = seen_by_alice()
            assert before == (0, "Ongoing", pid, epoch, [("payments", [0])])
            assert bob.coordinator("tx-alice")[0] == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert bob.coordinator("tx-unknown")[0] == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            denied = bob.describe("tx-alice", "tx-unknown")
            assert [(d.transactional_id, d.error_code) for d in denied] == [
                ("tx-alice", TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                ("tx-unknown", TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
            ]
            assert denied[0].producer_id == -1 and list(denied[0].topics) == []
            # carol may describe the id but not the topic: the topic is left out.
            (hers,) = carol.describe("tx-alice")
            assert (hers.error_code, hers.transaction_state, hers.producer_id) == (
                0,
                "Ongoing",
                pid,
            )
            assert list(hers.topics) == []
            # Asked by one who may describe any id, an unknown one is not found.
            admin_raw = Raw(address)
            try:
                admin_raw.login("admin")
                assert admin_raw.describe("tx-unknown")[0].error_code == TRANSACTIONAL_ID_NOT_FOUND
            finally:
                admin_raw.close()
            assert seen_by_alice() == before
            assert alice.end("tx-alice", pid, epoch, commit=True) == 0
            assert seen_by_alice()[:2] == (0, "CompleteCommit")
        finally:
            for raw in (alice, bob, carol):
                raw.close()
    finally:
        broker.kill()
