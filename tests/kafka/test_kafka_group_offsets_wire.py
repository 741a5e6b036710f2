"""OffsetFetch v8 (several groups, KIP-709) and OffsetDelete (KIP-496) on the kafka
listener's codec, without a broker: kafka-python's requests become the broker's, the
answers read back in kafka-python's classes, malformed requests are refused cleanly,
and each group and topic is judged as declared (docs/protocol.md section 7)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.group import OffsetDeleteRequest as KDelete
from kafka.protocol.consumer.group import OffsetDeleteResponse as KDeleteResponse
from kafka.protocol.consumer.group import OffsetFetchRequest as KFetch
from kafka.protocol.consumer.group import OffsetFetchResponse as KFetchResponse

from broker.kafka.apis import group_offsets as go
from protocol import messages as m
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.errors import ErrorCode
from tests.kafka.test_kafka_groups_wire import ALICE, access
from tests.kafka.test_kafka_wire import codec, request_bytes, response_of


def fetch_v8(groups: list[tuple[str, list[tuple[str, list[int]]] | None]]) -> Any:
    group_cls = KFetch.OffsetFetchRequestGroup
    topic_cls = group_cls.OffsetFetchRequestTopics
    return KFetch[8](
        groups=[
            group_cls(
                group_id=g,
                topics=None
                if topics is None
                else [topic_cls(name=t, partition_indexes=ps) for t, ps in topics],
            )
            for g, topics in groups
        ],
        require_stable=True,
    )


def delete_v0(group: str, topics: list[tuple[str, list[int]]]) -> Any:
    topic_cls = KDelete.OffsetDeleteRequestTopic
    part_cls = topic_cls.OffsetDeleteRequestPartition
    return KDelete[0](
        group_id=group,
        topics=[
            topic_cls(name=t, partitions=[part_cls(partition_index=p) for p in ps])
            for t, ps in topics
        ],
    )


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300)
topics = st.lists(
    st.tuples(names, st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4)), max_size=4
)


@settings(max_examples=80, deadline=None)
@given(groups=st.lists(st.tuples(names, st.none() | topics), max_size=4), group=names, asked=topics)
def test_any_offset_fetch_v8_or_offset_delete_is_a_request_or_a_clean_refusal(
    groups: list[tuple[str, list[tuple[str, list[int]]] | None]],
    group: str,
    asked: list[tuple[str, list[int]]],
) -> None:
    """Whatever names and numbers kafka-python encodes, the codec hands the broker a
    bounded request or answers a refusal itself; nothing else escapes."""
    for message in (fetch_v8(groups), delete_v0(group, asked)):
        out = codec().decode(request_bytes(message))
        assert isinstance(out, (bytes, go.KafkaOffsetFetchGroupsRequest, go.OffsetDeleteRequest))
        if not isinstance(out, bytes):
            assert out.entry_count() <= 4 * (1 + 4 * 5)


def test_offset_fetch_v8_asks_each_group_and_answers_each() -> None:
    c = codec()
    req = c.decode(request_bytes(fetch_v8([("a", [("t", [0, 1])]), ("b", None)])))
    assert isinstance(req, go.KafkaOffsetFetchGroupsRequest)
    assert req.require_stable
    assert [(g.group_id, g.topics) for g in req.groups] == [
        ("a", [m.GroupTopicPartitions("t", [0, 1])]),
        ("b", None),
    ]
    assert req.entry_count() == 2 + 1 + 2
    answer = go.KafkaOffsetFetchGroupsResponse(
        groups=[
            go.FetchedGroup(
                "a",
                topics=[
                    m.OffsetFetchTopic(
                        "t",
                        [
                            m.OffsetFetchPartition(0, 5, "meta"),
                            m.OffsetFetchPartition(1, error=ErrorCode.UNSTABLE_OFFSET_COMMIT),
                        ],
                    )
                ],
            ),
            go.FetchedGroup("b", ErrorCode.GROUP_AUTHORIZATION_FAILED),
        ]
    )
    _, read = response_of(c.encode(answer, req.cid), KFetchResponse, 8)
    a, b = read.groups
    assert (a.group_id, a.error_code, b.group_id, b.error_code) == ("a", 0, "b", 30)
    (topic,) = a.topics
    assert [
        (p.partition_index, p.committed_offset, p.metadata, p.error_code) for p in topic.partitions
    ] == [(0, 5, "meta", 0), (1, -1, None, ErrorCode.UNSTABLE_OFFSET_COMMIT)]


def test_offset_fetch_v7_is_still_the_brokers_own() -> None:
    topic_cls = KFetch.OffsetFetchRequestTopic
    v7 = KFetch[7](
        group_id="g",
        topics=[topic_cls(name="t", partition_indexes=[0])],
        require_stable=False,
    )
    req = codec().decode(request_bytes(v7))
    assert isinstance(req, m.OffsetFetchRequest)
    assert (req.group_id, req.topics) == ("g", [m.GroupTopicPartitions("t", [0])])


def test_a_malformed_offset_fetch_v8_is_refused_in_every_group() -> None:
    for groups in (
        [("a", [("t", [0]), ("t", [1])]), ("b", None)],  # a topic twice
        [("a", [("t", [0, 0])])],  # a partition twice
        [("a", None), ("a", None)],  # a group twice
        [("g" * 256, None)],  # an id too long
    ):
        frame = codec().decode(request_bytes(fetch_v8(groups)))
        assert isinstance(frame, bytes)
        _, read = response_of(frame, KFetchResponse, 8)
        assert [g.error_code for g in read.groups] == [ErrorCode.INVALID_REQUEST] * len(groups)


def test_offset_delete_becomes_the_stores_delete_and_answers_per_partition() -> None:
    c = codec()
    req = c.decode(request_bytes(delete_v0("g", [("t", [0, 1]), ("u", [2])])))
    assert isinstance(req, go.OffsetDeleteRequest)
    assert (req.group_id, req.topics) == (
        "g",
        [m.GroupTopicPartitions("t", [0, 1]), m.GroupTopicPartitions("u", [2])],
    )
    assert req.entry_count() == 5
    answer = go.OffsetDeleteResponse(
        topics=[
            m.TopicPartitionErrors(
                "t",
                [m.PartitionError(0), m.PartitionError(1, ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)],
            ),
            m.TopicPartitionErrors(
                "u", [m.PartitionError(2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
            ),
        ]
    )
    _, read = response_of(c.encode(answer, req.cid), KDeleteResponse, 0)
    assert read.error_code == 0
    assert [
        (t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in read.topics
    ] == [
        ("t", [(0, 0), (1, 86)]),
        ("u", [(2, 3)]),
    ]


def test_a_malformed_offset_delete_is_refused_whole() -> None:
    for group, topics, code in (
        ("", [("t", [0])], ErrorCode.INVALID_GROUP_ID),
        ("g" * 256, [("t", [0])], ErrorCode.INVALID_REQUEST),
        ("g", [("t", [0]), ("t", [1])], ErrorCode.INVALID_REQUEST),
        ("g", [("t", [3, 3])], ErrorCode.INVALID_REQUEST),
    ):
        frame = codec().decode(request_bytes(delete_v0(group, topics)))
        assert isinstance(frame, bytes)
        _, read = response_of(frame, KDeleteResponse, 0)
        assert (read.error_code, read.topics) == (code, [])


def test_offset_delete_needs_delete_on_the_group_and_read_on_each_topic() -> None:
    req = go.OffsetDeleteRequest(
        group_id="g",
        topics=[m.GroupTopicPartitions("mine", [0]), m.GroupTopicPartitions("theirs", [0, 1])],
    )
    denied = access((Res.GROUP, "g", Op.READ), (Res.TOPIC, "mine", Op.READ)).judge(req, ALICE, "h")
    assert denied.refused and denied.refusal is not None
    assert denied.refusal.error == ErrorCode.GROUP_AUTHORIZATION_FAILED
    judged = access((Res.GROUP, "g", Op.DELETE), (Res.TOPIC, "mine", Op.READ)).judge(
        req, ALICE, "h"
    )
    assert not judged.refused and [t.topic for t in judged.request.topics] == ["mine"]
    response = go.OffsetDeleteResponse(
        topics=[m.TopicPartitionErrors("mine", [m.PartitionError(0)])]
    )
    judged.finish(response)
    assert [(t.topic, [p.error for p in t.partitions]) for t in response.topics] == [
        ("mine", [0]),
        ("theirs", [ErrorCode.TOPIC_AUTHORIZATION_FAILED] * 2),
    ]


def test_offset_fetch_v8_judges_each_group_and_leaves_out_topics_not_described() -> None:
    req = go.KafkaOffsetFetchGroupsRequest(
        groups=[go.GroupOffsetsAsked("mine", None), go.GroupOffsetsAsked("theirs", None)],
        require_stable=False,
    )
    judged = access((Res.GROUP, "mine", Op.DESCRIBE), (Res.TOPIC, "seen", Op.DESCRIBE)).judge(
        req, ALICE, "h"
    )
    assert [g.group_id for g in judged.request.groups] == ["mine"]
    partition = [m.OffsetFetchPartition(0, 1)]
    response = go.KafkaOffsetFetchGroupsResponse(
        groups=[
            go.FetchedGroup(
                "mine",
                topics=[
                    m.OffsetFetchTopic("seen", partition),
                    m.OffsetFetchTopic("hidden", partition),
                ],
            )
        ]
    )
    judged.finish(response)
    assert [(g.group_id, g.error, [t.topic for t in g.topics]) for g in response.groups] == [
        ("mine", 0, ["seen"]),
        ("theirs", ErrorCode.GROUP_AUTHORIZATION_FAILED, []),
    ]
