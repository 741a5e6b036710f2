"""The classic group APIs' codec on the kafka listener, without a broker: every version
of JoinGroup, SyncGroup, Heartbeat and LeaveGroup as kafka-python encodes it becomes
the Kafka-only request the coordinator runs; the answers read back in kafka-python's
classes; hostile metadata and assignments are refused cleanly; and what each request
needs of the authorizer (docs/protocol.md section 7) is judged as declared."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.group import HeartbeatRequest as KHeartbeat
from kafka.protocol.consumer.group import HeartbeatResponse as KHeartbeatResponse
from kafka.protocol.consumer.group import JoinGroupRequest as KJoin
from kafka.protocol.consumer.group import JoinGroupResponse as KJoinResponse
from kafka.protocol.consumer.group import LeaveGroupRequest as KLeave
from kafka.protocol.consumer.group import SyncGroupRequest as KSync
from kafka.protocol.consumer.group import SyncGroupResponse as KSyncResponse

from broker.groups import JoinAnswer, SyncAnswer
from broker.kafka.apis import groups as g
from broker.security import Access, AclBinding, Authorizer
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.errors import ErrorCode
from tests.kafka.test_kafka_wire import codec, request_bytes, response_of

ALICE = "User:alice"
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
metadata = st.binary(max_size=300)


def join_request(
    version: int,
    protocols: list[tuple[str, bytes]],
    member_id: str = "",
    instance: str | None = None,
) -> Any:
    fields: dict[str, Any] = {
        "group_id": "g",
        "session_timeout_ms": 10_000,
        "member_id": member_id,
        "protocol_type": "consumer",
        "protocols": [KJoin.JoinGroupRequestProtocol(name=n, metadata=d) for n, d in protocols],
    }
    if version >= 1:
        fields["rebalance_timeout_ms"] = 30_000
    if version >= 5:
        fields["group_instance_id"] = instance
    return KJoin[version](**fields)


@settings(max_examples=60, deadline=None)
@given(
    version=st.integers(0, 7),
    protocols=st.lists(st.tuples(names, metadata), min_size=1, max_size=5),
    member_id=names,
)
def test_every_join_group_version_becomes_the_coordinators_join(
    version: int, protocols: list[tuple[str, bytes]], member_id: str
) -> None:
    request = codec().decode(request_bytes(join_request(version, protocols, member_id)))
    assert isinstance(request, g.JoinGroupRequest)
    assert (request.group_id, request.member_id, request.protocols) == ("g", member_id, protocols)
    assert request.session_timeout_ms == 10_000
    assert request.rebalance_timeout_ms == (30_000 if version >= 1 else -1)
    assert request.require_known_member_id == (version >= 4)


@pytest.mark.parametrize("version", range(8))
def test_join_group_answers_read_back_in_every_version(version: int) -> None:
    c = codec()
    request = c.decode(request_bytes(join_request(version, [("range", b"m")]), correlation_id=3))
    assert isinstance(request, g.JoinGroupRequest)
    joined = JoinAnswer(
        generation=4,
        protocol_type="consumer",
        protocol_name="range",
        leader="a",
        member_id="a",
        members=(("a", None, b"meta-a"), ("b", None, b"meta-b")),
    )
    frame = c.encode(g.JoinGroupResponse(joined=joined), request.cid)
    correlation, answer = response_of(frame, KJoinResponse, version)
    assert correlation == 3 and answer.error_code == 0
    assert (answer.generation_id, answer.protocol_name, answer.leader, answer.member_id) == (
        4,
        "range",
        "a",
        "a",
    )
    assert [(mb.member_id, mb.metadata) for mb in answer.members] == [
        ("a", b"meta-a"),
        ("b", b"meta-b"),
    ]


def test_member_id_required_reads_back_with_the_id() -> None:
    c = codec()
    request = c.decode(request_bytes(join_request(4, [("range", b"")])))
    assert isinstance(request, g.JoinGroupRequest)
    joined = JoinAnswer(ErrorCode.MEMBER_ID_REQUIRED, member_id="new-id")
    response = g.JoinGroupResponse(error=joined.error, joined=joined)
    _, answer = response_of(c.encode(response, request.cid), KJoinResponse, 4)
    assert (answer.error_code, answer.member_id) == (79, "new-id")


@pytest.mark.parametrize("version", range(6))
def test_sync_group_carries_the_plan_and_answers_the_part(version: int) -> None:
    fields: dict[str, Any] = {
        "group_id": "g",
        "generation_id": 2,
        "member_id": "a",
        "assignments": [
            KSync.SyncGroupRequestAssignment(member_id="a", assignment=b"A"),
            KSync.SyncGroupRequestAssignment(member_id="b", assignment=b"B"),
        ],
    }
    if version >= 3:
        fields["group_instance_id"] = "i"
    if version >= 5:
        fields["protocol_type"], fields["protocol_name"] = "consumer", "range"
    c = codec()
    request = c.decode(request_bytes(KSync[version](**fields)))
    assert isinstance(request, g.SyncGroupRequest)
    assert request.assignments == {"a": b"A", "b": b"B"}
    assert request.instance_id == ("i" if version >= 3 else None)
    synced = SyncAnswer(protocol_type="consumer", protocol_name="range", assignment=b"A")
    _, answer = response_of(
        c.encode(g.SyncGroupResponse(synced=synced), request.cid), KSyncResponse, version
    )
    assert (answer.error_code, answer.assignment) == (0, b"A")


def test_hostile_metadata_and_assignments_are_refused_cleanly() -> None:
    too_big = b"x" * (g.MAX_METADATA_BYTES + 1)
    for request in (
        join_request(7, [("range", too_big)]),
        join_request(7, [(f"p{i}", b"") for i in range(g.MAX_PROTOCOLS + 1)]),
    ):
        _, answer = response_of(codec().decode(request_bytes(request)), KJoinResponse, 7)  # type: ignore[arg-type]
        assert answer.error_code == ErrorCode.INVALID_REQUEST
    twice = KSync[5](
        group_id="g",
        generation_id=1,
        member_id="a",
        group_instance_id=None,
        protocol_type=None,
        protocol_name=None,
        assignments=[
            KSync.SyncGroupRequestAssignment(member_id="a", assignment=b""),
            KSync.SyncGroupRequestAssignment(member_id="a", assignment=b""),
        ],
    )
    _, answer = response_of(codec().decode(request_bytes(twice)), KSyncResponse, 5)  # type: ignore[arg-type]
    assert answer.error_code == ErrorCode.INVALID_REQUEST


def test_heartbeat_and_leave_group_in_old_and_batch_versions() -> None:
    beat = codec().decode(
        request_bytes(
            KHeartbeat[4](group_id="g", generation_id=3, member_id="a", group_instance_id="i")
        )
    )
    assert isinstance(beat, g.HeartbeatRequest)
    assert (beat.generation, beat.member_id, beat.instance_id) == (3, "a", "i")
    old = codec().decode(request_bytes(KLeave[0](group_id="g", member_id="a")))
    assert isinstance(old, g.LeaveGroupRequest) and old.members == [("a", None)]
    batch = KLeave[3](
        group_id="g",
        members=[
            KLeave.MemberIdentity(member_id="a", group_instance_id=None),
            KLeave.MemberIdentity(member_id="", group_instance_id="i"),
        ],
    )
    new = codec().decode(request_bytes(batch))
    assert isinstance(new, g.LeaveGroupRequest) and new.members == [("a", None), ("", "i")]


# ------------------------------------------------------------------ authorization


def access(*bindings: tuple[str, str, str]) -> Access:
    authorizer = Authorizer(["User:admin"])
    for rtype, name, operation in bindings:
        authorizer.add(AclBinding(rtype, name, "literal", ALICE, "*", operation, "allow"))
    return Access(authorizer, lambda _rtype, _name: False)


def test_membership_needs_read_on_the_group() -> None:
    join = g.JoinGroupRequest(
        group_id="g",
        member_id="",
        instance_id=None,
        protocol_type="consumer",
        protocols=[("range", b"")],
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        require_known_member_id=True,
    )
    denied = access((Res.GROUP, "g", Op.DESCRIBE)).judge(join, ALICE, "h")
    assert denied.refused and denied.refusal.error == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert not access((Res.GROUP, "g", Op.READ)).judge(join, ALICE, "h").refused
    beat = g.HeartbeatRequest(group_id="g", generation=1, member_id="a", instance_id=None)
    assert access().judge(beat, ALICE, "h").refused


def test_describe_and_delete_are_judged_per_group() -> None:
    describe = g.KafkaDescribeGroupsRequest(group_ids=["mine", "theirs"])
    judged = access((Res.GROUP, "mine", Op.DESCRIBE)).judge(describe, ALICE, "h")
    assert not judged.refused and judged.request.group_ids == ["mine"]
    response = g.KafkaDescribeGroupsResponse(groups=[g.DescribedGroup("mine", state="Stable")])
    judged.finish(response)
    assert [(d.group_id, d.error) for d in response.groups] == [
        ("mine", ErrorCode.NONE),
        ("theirs", ErrorCode.GROUP_AUTHORIZATION_FAILED),
    ]
    delete = g.DeleteGroupsRequest(group_ids=["mine", "theirs"])
    judged = access((Res.GROUP, "mine", Op.DELETE)).judge(delete, ALICE, "h")
    assert judged.request.group_ids == ["mine"]
    listing = g.KafkaListGroupsRequest(states=[])
    judged = access((Res.GROUP, "mine", Op.DESCRIBE)).judge(listing, ALICE, "h")
    listed = g.KafkaListGroupsResponse(
        groups=[g.ListedGroup("mine", "consumer", "Stable"), g.ListedGroup("theirs", "", "Empty")]
    )
    judged.finish(listed)
    assert [x.group_id for x in listed.groups] == ["mine"]


def test_empty_and_oversized_ids_are_refused() -> None:
    empty = join_request(7, [("range", b"")])
    empty.group_id = ""
    _, answer = response_of(codec().decode(request_bytes(empty)), KJoinResponse, 7)  # type: ignore[arg-type]
    assert answer.error_code == ErrorCode.INVALID_GROUP_ID
    long_id = "m" * 256
    beat = KHeartbeat[4](group_id="g", generation_id=1, member_id=long_id, group_instance_id=None)
    _, answer = response_of(codec().decode(request_bytes(beat)), KHeartbeatResponse, 4)  # type: ignore[arg-type]
    assert answer.error_code == ErrorCode.INVALID_REQUEST
