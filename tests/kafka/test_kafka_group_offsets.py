"""A group's committed offsets through Kafka's admin clients and our SDK, on the real
broker, both backends: kafka-python's KafkaAdminClient lists several groups' offsets in
one OffsetFetch v8, alters them from outside the group and deletes them with
OffsetDelete (refused GROUP_SUBSCRIBED_TO_TOPIC while a member subscribes to the
topic); confluent-kafka's AdminClient lists and alters them; and the offsets are one
store: what a Kafka client commits our SDK reads and the other way round, and a
deletion through the kafka listener is one through the minibroker listener too.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.admin
import kafka.errors
import pytest
from kafka.protocol.consumer.group import OffsetFetchRequest as KFetch
from kafka.protocol.consumer.group import OffsetFetchResponse as KFetchResponse
from kafka.structs import OffsetAndMetadata

from client import Consumer, TopicPartition
from client.admin import alter_group_offsets, list_group_offsets
from protocol.errors import ErrorCode
from protocol.framing import frame
from tests.kafka.test_kafka_groups import (
    DEADLINE_S,
    PARTITIONS,
    Members,
    Read,
    Stack,
    group_of,
    produce,
    read_all,
    settle,
    stack,
)
from tests.kafka.test_kafka_wire import request_bytes, response_of

__all__ = ["group_of", "stack"]  # the fixtures, shared with test_kafka_groups.py


@pytest.fixture
def admin(stack: Stack) -> Iterator[kafka.admin.KafkaAdminClient]:
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=stack.kafka)
    try:
        yield client
    finally:
        client.close()


def committed_by_sdk(stack: Stack, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets as our SDK reads them, on the minibroker listener."""
    offsets = list_group_offsets(stack.broker.address("mb"), group)
    return {(tp.topic, tp.partition): om.offset for tp, om in offsets.items()}


def test_kafka_python_admin_fetches_alters_and_deletes_offsets(
    stack: Stack,
    group_of: Callable[[str], Members],
    admin: kafka.admin.KafkaAdminClient,
) -> None:
    members = group_of("kafka-python")
    topic = members.topic
    a = members.new()
    settle(a)
    read_all(produce(stack, topic, 8, "offsets"), a)
    a.commit()
    tp0 = kafka.TopicPartition(topic, 0)
    # A member subscribes to the topic: its offsets stay (Kafka's rule, KIP-496).
    assert admin.delete_group_offsets(members.group, [tp0]) == {
        tp0: kafka.errors.GroupSubscribedToTopicError
    }
    # Altered from outside the group: refused while it has members.
    refused = admin.alter_group_offsets(members.group, {tp0: OffsetAndMetadata(0, "", None)})
    assert refused == {tp0: kafka.errors.UnknownMemberIdError}
    members.close(a)

    other = f"g-{uuid.uuid4().hex[:8]}"
    tp1 = kafka.TopicPartition(topic, 1)
    altered = admin.alter_group_offsets(other, {tp1: OffsetAndMetadata(1, "set", None)})
    assert altered == {tp1: kafka.errors.NoError}
    both = admin.list_group_offsets([members.group, other])  # one OffsetFetch v8
    assert {tp.partition: om.offset for tp, om in both[members.group].items()} == {
        p: 2 for p in range(PARTITIONS)
    }
    assert {tp: (om.offset, om.metadata) for tp, om in both[other].items()} == {tp1: (1, "set")}

    unknown = kafka.TopicPartition("no-such-topic", 0)
    deleted = admin.delete_group_offsets(members.group, [tp0, tp1, unknown])
    assert deleted == {
        tp0: kafka.errors.NoError,
        tp1: kafka.errors.NoError,
        unknown: kafka.errors.UnknownTopicOrPartitionError,
    }
    left = {(topic, p): 2 for p in range(2, PARTITIONS)}
    assert {
        (tp.topic, tp.partition): om.offset
        for tp, om in admin.list_group_offsets(members.group)[members.group].items()
    } == left
    # One store: the minibroker listener no longer has them either.
    assert committed_by_sdk(stack, members.group) == left
    with pytest.raises(kafka.errors.GroupIdNotFoundError):
        admin.delete_group_offsets(f"g-{uuid.uuid4().hex[:8]}", [tp0])


def test_confluent_admin_lists_and_alters_offsets(
    stack: Stack, group_of: Callable[[str], Members]
) -> None:
    """confluent-kafka's AdminClient has no delete_consumer_group_offsets (librdkafka has
    it, the Python binding does not); it lists and alters."""
    members = group_of("confluent-kafka")
    a = members.new()
    settle(a)
    read_all(produce(stack, members.topic, 8, "confluent"), a)
    a.commit()
    members.close(a)
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": stack.kafka})
    request = [confluent_kafka.ConsumerGroupTopicPartitions(members.group)]
    listed = admin.list_consumer_group_offsets(request)[members.group].result(DEADLINE_S)
    assert {tp.partition: tp.offset for tp in listed.topic_partitions} == {
        p: 2 for p in range(PARTITIONS)
    }
    wanted = [confluent_kafka.TopicPartition(members.topic, p, 1) for p in range(PARTITIONS)]
    altered = admin.alter_consumer_group_offsets(
        [confluent_kafka.ConsumerGroupTopicPartitions(members.group, wanted)]
    )[members.group].result(DEADLINE_S)
    assert [tp.error for tp in altered.topic_partitions] == [None] * PARTITIONS
    assert committed_by_sdk(stack, members.group) == {
        (members.topic, p): 1 for p in range(PARTITIONS)
    }


def test_the_sdk_and_a_kafka_client_share_a_groups_offsets(
    stack: Stack, group_of: Callable[[str], Members]
) -> None:
    """A Kafka client's commits are read by our SDK; offsets our SDK sets are where the
    Kafka client's next member resumes; and offsets our SDK's group member commits are
    where a Kafka client's member of the same group id resumes, reading no record twice."""
    members = group_of("confluent-kafka")
    topic, group = members.topic, members.group
    a = members.new()
    settle(a)
    read_all(produce(stack, topic, 8, "kafka"), a)
    a.commit()
    members.close(a)
    assert committed_by_sdk(stack, group) == {(topic, p): 2 for p in range(PARTITIONS)}

    # The SDK moves partition 0 back one record: the Kafka member reads it again.
    alter_group_offsets(stack.broker.address("mb"), group, {(topic, 0): 1})
    b = members.new()
    again: list[Read] = []
    settle(b, reads=again)
    deadline = time.monotonic() + DEADLINE_S
    while not again:
        assert time.monotonic() < deadline, "partition 0 was not read again from offset 1"
        again += b.poll()
    assert [(p, o) for p, o, _ in again] == [(0, 1)]
    b.commit()
    members.close(b)

    # Our SDK's consumer, in the same group (KIP-848, on the minibroker listener),
    # resumes at the Kafka client's commits and commits its own.
    sent = produce(stack, topic, 8, "sdk")
    got: list[bytes] = []
    with Consumer(
        topics=[topic],
        group_id=group,
        bootstrap_servers=stack.broker.address("mb"),
        enable_auto_commit=False,
    ) as sdk:
        deadline = time.monotonic() + DEADLINE_S
        while set(got) < sent:
            assert time.monotonic() < deadline, f"the SDK read {got}"
            for records in sdk.poll(timeout_ms=100).values():
                got += [r.value for r in records if r.value is not None]
        sdk.commit()
    assert sorted(got) == sorted(sent), "the SDK read a record the Kafka client had committed"
    assert committed_by_sdk(stack, group) == {(topic, p): 4 for p in range(PARTITIONS)}

    # A Kafka client's member resumes at the SDK's commits.
    later = produce(stack, topic, 4, "later")
    c = members.new()
    reads = read_all(later, c)[0]
    assert sorted(v for _, _, v in reads) == sorted(later)


def test_offset_delete_refuses_a_topic_a_kip848_member_subscribes_to(
    stack: Stack, admin: kafka.admin.KafkaAdminClient
) -> None:
    """Our SDK's group member (a KIP-848 group, on the minibroker listener) subscribes to
    one topic: Kafka's OffsetDelete keeps that topic's offsets and deletes another's."""
    read, other = stack.new_topic("subscribed"), stack.new_topic("unsubscribed")
    group = f"g-{uuid.uuid4().hex[:8]}"
    mb = stack.broker.address("mb")
    alter_group_offsets(mb, group, {(other, 0): 3})
    with Consumer(
        topics=[read], group_id=group, bootstrap_servers=mb, enable_auto_commit=False
    ) as sdk:
        deadline = time.monotonic() + DEADLINE_S
        while not sdk.assignment():
            assert time.monotonic() < deadline, "the SDK's member got no partitions"
            sdk.poll(timeout_ms=100)
        sdk.commit({TopicPartition(read, 0): 0})
        subscribed, unsubscribed = kafka.TopicPartition(read, 0), kafka.TopicPartition(other, 0)
        assert admin.delete_group_offsets(group, [subscribed, unsubscribed]) == {
            subscribed: kafka.errors.GroupSubscribedToTopicError,
            unsubscribed: kafka.errors.NoError,
        }
    assert committed_by_sdk(stack, group) == {(read, 0): 0}


def kafka_call(stack: Stack, request: Any, response_cls: Any, version: int) -> Any:
    """One request on a connection of its own, as kafka-python encodes it; the answer
    read back in kafka-python's classes."""
    host, port = stack.kafka.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as s:
        s.sendall(frame(request_bytes(request)))
        head = s.recv(4, socket.MSG_WAITALL)
        (length,) = struct.unpack(">i", head)
        body = s.recv(length, socket.MSG_WAITALL)
    _, answer = response_of(head + body, response_cls, version)
    return answer


def test_offset_fetch_v8_answers_each_group_stable_or_not(stack: Stack) -> None:
    """KIP-447 per group: an open transaction's offsets make its group's partition
    UNSTABLE_OFFSET_COMMIT under require_stable, while the other group's committed
    offsets are answered in the same response."""
    topic = stack.new_topic("stable")
    pending, committed = f"g-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    alter_group_offsets(stack.broker.address("mb"), committed, {(topic, 0): 7})
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": stack.kafka, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(DEADLINE_S)
    producer.begin_transaction()
    consumer = confluent_kafka.Consumer({"bootstrap.servers": stack.kafka, "group.id": pending})
    try:
        producer.send_offsets_to_transaction(
            [confluent_kafka.TopicPartition(topic, 0, 5)],
            consumer.consumer_group_metadata(),
            DEADLINE_S,
        )

        def fetch(stable: bool) -> dict[str, list[tuple[int, int, int]]]:
            request = KFetch[8](
                groups=[
                    KFetch.OffsetFetchRequestGroup(
                        group_id=g,
                        topics=[
                            KFetch.OffsetFetchRequestGroup.OffsetFetchRequestTopics(
                                name=topic, partition_indexes=[0]
                            )
                        ],
                    )
                    for g in (pending, committed)
                ],
                require_stable=stable,
            )
            answer = kafka_call(stack, request, KFetchResponse, 8)
            return {
                g.group_id: [
                    (p.partition_index, p.committed_offset, p.error_code)
                    for t in g.topics
                    for p in t.partitions
                ]
                for g in answer.groups
            }

        assert fetch(True) == {
            pending: [(0, -1, ErrorCode.UNSTABLE_OFFSET_COMMIT)],
            committed: [(0, 7, 0)],
        }
        assert fetch(False) == {pending: [(0, -1, 0)], committed: [(0, 7, 0)]}
        producer.commit_transaction(DEADLINE_S)
        assert fetch(True) == {pending: [(0, 5, 0)], committed: [(0, 7, 0)]}
    finally:
        consumer.close()
