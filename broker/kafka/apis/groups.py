"""A consumer group's APIs: FindCoordinator (v0-3), Kafka's classic group protocol
(JoinGroup v0-7, SyncGroup v0-5, Heartbeat v0-4, LeaveGroup v0-4), OffsetCommit (v2-8),
DescribeGroups (v0-5), ListGroups (v0-4) and DeleteGroups (v0-2) (docs/kafka-compatibility.md);
OffsetFetch and OffsetDelete are group_offsets.py's.

The group coordinator is this broker. The classic protocol runs in
broker/groups/classic.py beside the KIP-848 groups; its requests are Kafka-only
(kafka_only.py), declared here with what they need of the authorizer (READ on the group
for membership, DESCRIBE for describing and listing, DELETE for deleting), and served by
`ClassicGroupApi`, which the composition root adds to the broker's APIs. Commits of a
group member are checked against its generation; committed offsets are the one store
both listeners read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from broker.groups import (
    CLASSIC_STATES,
    ClassicGroup,
    GroupCoordinator,
    Join,
    JoinAnswer,
    OffsetStore,
    Sync,
    SyncAnswer,
)
from broker.kafka.api import Exchange, KafkaApi, Reply, Values, ms
from broker.kafka.kafka_only import KafkaOnlyRequest
from broker.security import Session
from protocol import messages as m
from protocol.authorization import Entries, EntryNeed, Omission, Path, RequestNeed, Requirements
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.errors import ErrorCode

EMPTY, PREPARING_REBALANCE, _, _, DEAD = CLASSIC_STATES
MAX_PROTOCOLS = 64
"""Protocols one JoinGroup may offer; more is INVALID_REQUEST (a client offers a few)."""
MAX_METADATA_BYTES = 1024 * 1024
"""A member's metadata per protocol and its assignment are the clients' bytes, kept for
the group's lifetime and passed on: each is bounded, larger is INVALID_REQUEST."""
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
"""DescribeGroups' authorized_operations when not asked for, as Kafka answers."""
READ_GROUP = Requirements((RequestNeed(Op.READ, Res.GROUP, Path("group_id")),))

# --------------------------------------------------------------------------- the requests


class JoinGroupResponse(m.Response):
    joined: JoinAnswer = JoinAnswer()


class JoinGroupRequest(KafkaOnlyRequest, tag="JoinGroup"):
    response = JoinGroupResponse
    requirements = READ_GROUP
    group_id: str
    member_id: str
    instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    require_known_member_id: bool


class SyncGroupResponse(m.Response):
    synced: SyncAnswer = SyncAnswer()


class SyncGroupRequest(KafkaOnlyRequest, tag="SyncGroup"):
    response = SyncGroupResponse
    requirements = READ_GROUP
    group_id: str
    generation: int
    member_id: str
    instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: dict[str, bytes]


class HeartbeatResponse(m.Response):
    pass


class HeartbeatRequest(KafkaOnlyRequest, tag="Heartbeat"):
    response = HeartbeatResponse
    requirements = READ_GROUP
    group_id: str
    generation: int
    member_id: str
    instance_id: str | None


class LeftMember(msgspec.Struct):
    member_id: str
    instance_id: str | None
    error: int = ErrorCode.NONE


class LeaveGroupResponse(m.Response):
    members: list[LeftMember] = msgspec.field(default_factory=list)


class LeaveGroupRequest(KafkaOnlyRequest, tag="LeaveGroup"):
    response = LeaveGroupResponse
    requirements = READ_GROUP
    group_id: str
    members: list[tuple[str, str | None]]


class DescribedMember(msgspec.Struct):
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class DescribedGroup(msgspec.Struct):
    group_id: str
    error: int = ErrorCode.NONE
    state: str = DEAD
    protocol_type: str = ""
    protocol: str = ""
    members: list[DescribedMember] = msgspec.field(default_factory=list)


class KafkaDescribeGroupsResponse(m.Response):
    groups: list[DescribedGroup] = msgspec.field(default_factory=list)


class KafkaDescribeGroupsRequest(KafkaOnlyRequest, tag="KafkaDescribeGroups"):
    """Kafka's DescribeGroups: the classic groups' protocols and the members' bytes,
    which the native DescribeGroups does not carry."""

    response = KafkaDescribeGroupsResponse
    requirements = Requirements(
        (EntryNeed(Op.DESCRIBE, Res.GROUP, ""),),
        Entries("group_ids", "groups", lambda group_id, code, _: DescribedGroup(group_id, code)),
    )
    group_ids: list[str]


class ListedGroup(msgspec.Struct):
    group_id: str
    protocol_type: str
    state: str


class KafkaListGroupsResponse(m.Response):
    groups: list[ListedGroup] = msgspec.field(default_factory=list)


class KafkaListGroupsRequest(KafkaOnlyRequest, tag="KafkaListGroups"):
    """Kafka's ListGroups: with each group's protocol type, and a states filter (v4)."""

    response = KafkaListGroupsResponse
    requirements = Requirements((Omission(Op.DESCRIBE, Res.GROUP, Path("groups[].group_id")),))
    states: list[str]


class DeletedGroup(msgspec.Struct):
    group_id: str
    error: int = ErrorCode.NONE
    message: str | None = None


class DeleteGroupsResponse(m.Response):
    results: list[DeletedGroup] = msgspec.field(default_factory=list)


class DeleteGroupsRequest(KafkaOnlyRequest, tag="DeleteGroups"):
    response = DeleteGroupsResponse
    requirements = Requirements(
        (EntryNeed(Op.DELETE, Res.GROUP, ""),),
        Entries(
            "group_ids", "results", lambda group_id, code, why: DeletedGroup(group_id, code, why)
        ),
    )
    group_ids: list[str]


class ClassicGroupApi:
    """The Kafka-only group APIs, on the group coordinator and the offsets store."""

    def __init__(self, groups: GroupCoordinator, offsets: OffsetStore) -> None:
        self.groups = groups
        self.offsets = offsets

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        return {
            "JoinGroup": self.join_group,
            "SyncGroup": self.sync_group,
            "Heartbeat": self.heartbeat,
            "LeaveGroup": self.leave_group,
            "KafkaDescribeGroups": lambda req, _session: self.describe_groups(req),
            "KafkaListGroups": lambda req, _session: self.list_groups(req),
            "DeleteGroups": lambda req, _session: self.delete_groups(req),
        }

    async def join_group(self, req: JoinGroupRequest, session: Session) -> JoinGroupResponse:
        join = Join(
            member_id=req.member_id,
            instance_id=req.instance_id,
            protocol_type=req.protocol_type,
            protocols=tuple(req.protocols),
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            client_id=req.client_id or "",
            client_host=session.peer_host,
            require_known_member_id=req.require_known_member_id,
        )
        joined = await self.groups.join_group(req.group_id, join)
        return JoinGroupResponse(error=joined.error, message=joined.message, joined=joined)

    async def sync_group(self, req: SyncGroupRequest, _session: Session) -> SyncGroupResponse:
        sync = Sync(
            req.member_id,
            req.generation,
            req.instance_id,
            req.protocol_type,
            req.protocol_name,
            req.assignments,
        )
        synced = await self.groups.sync_group(req.group_id, sync)
        return SyncGroupResponse(error=synced.error, message=synced.message, synced=synced)

    async def heartbeat(self, req: HeartbeatRequest, _session: Session) -> HeartbeatResponse:
        error = await self.groups.classic_heartbeat(
            req.group_id, req.member_id, req.instance_id, req.generation
        )
        return HeartbeatResponse(error=error)

    async def leave_group(self, req: LeaveGroupRequest, _session: Session) -> LeaveGroupResponse:
        errors = await self.groups.leave_group(req.group_id, req.members)
        if errors is None:
            errors = [ErrorCode.UNKNOWN_MEMBER_ID] * len(req.members)
        return LeaveGroupResponse(
            members=[
                LeftMember(member_id, instance_id, error)
                for (member_id, instance_id), error in zip(req.members, errors, strict=True)
            ]
        )

    def describe_groups(self, req: KafkaDescribeGroupsRequest) -> KafkaDescribeGroupsResponse:
        with_offsets = self.groups.offset_groups()
        out = []
        for group_id in req.group_ids:
            group = self.groups.classic_group(group_id)
            if group is not None:
                out.append(_described(group))
                continue
            listed = self.groups.kafka_listing(group_id)
            if listed is not None:
                out.append(DescribedGroup(group_id, state=listed.state, protocol_type="consumer"))
            elif group_id in with_offsets:
                out.append(DescribedGroup(group_id, state=EMPTY))
            else:
                out.append(DescribedGroup(group_id))  # Kafka 2.8: Dead, no error
        return KafkaDescribeGroupsResponse(groups=out)

    def list_groups(self, req: KafkaListGroupsRequest) -> KafkaListGroupsResponse:
        wanted = {s.lower() for s in req.states}
        listed = [
            ListedGroup(g.group_id, g.protocol_type, g.state)
            for g in self.groups.kafka_listings()
            if not wanted or g.state.lower() in wanted
        ]
        return KafkaListGroupsResponse(groups=listed)

    async def delete_groups(self, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
        results = []
        for group_id in req.group_ids:
            error, message = await self.offsets.delete_group(group_id)
            results.append(DeletedGroup(group_id, error, message))
        return DeleteGroupsResponse(results=results)


def _described(group: ClassicGroup) -> DescribedGroup:
    """As Kafka describes a classic group: members' metadata and assignments once a
    protocol is chosen (CompletingRebalance, Stable), none while the barrier runs."""
    protocol = group.protocol_name if group.state != PREPARING_REBALANCE else None
    return DescribedGroup(
        group.group_id,
        state=group.state,
        protocol_type=group.protocol_type or "",
        protocol=protocol or "",
        members=[
            DescribedMember(
                member_id,
                member.instance_id,
                member.client_id,
                member.client_host,
                b"" if protocol is None else member.metadata(protocol),
                b"" if protocol is None else member.assignment,
            )
            for member_id, member in group.members.items()
        ],
    )


# --------------------------------------------------------------------------- translations


def _refused(code: ErrorCode, message: str, **values: Any) -> Reply:
    return Reply({"error_code": code, "error_message": message, **values})


def _bad_ids(req: Any, *ids: str | None) -> Reply | None:
    """Kafka's INVALID_GROUP_ID for an empty group id; ids are kept for the group's life
    and logged, so each is bounded as the native protocol bounds them (INVALID_REQUEST)."""
    if not req.group_id:
        return _refused(ErrorCode.INVALID_GROUP_ID, "a group id is not empty", protocol_name="")
    if any(len(i) > m.IDENTIFIER_CHARS_MAX for i in (req.group_id, *ids) if i is not None):
        return _refused(
            ErrorCode.INVALID_REQUEST,
            f"group, member and instance ids have at most {m.IDENTIFIER_CHARS_MAX} characters",
            protocol_name="",
        )
    return None


def translate_join_group(req: Any, version: int, _ex: Exchange) -> m.Request | Reply:
    instance_id = getattr(req, "group_instance_id", None)
    if (bad := _bad_ids(req, req.member_id, instance_id)) is not None:
        return bad
    protocols = [(p.name, p.metadata) for p in req.protocols]
    if len(protocols) > MAX_PROTOCOLS or any(len(d) > MAX_METADATA_BYTES for _, d in protocols):
        return _refused(
            ErrorCode.INVALID_REQUEST,
            f"at most {MAX_PROTOCOLS} protocols of at most {MAX_METADATA_BYTES} bytes each",
            member_id=req.member_id,
            protocol_name="",
        )
    return JoinGroupRequest(
        group_id=req.group_id,
        member_id=req.member_id,
        instance_id=instance_id,
        protocol_type=req.protocol_type,
        protocols=protocols,
        session_timeout_ms=ms(req.session_timeout),
        rebalance_timeout_ms=ms(req.rebalance_timeout) if version >= 1 else -1,
        require_known_member_id=version >= 4,
    )


def answer_join_group(r: JoinGroupResponse, version: int, _asked: None) -> Values:
    joined = r.joined
    return {
        "error_code": r.error,
        "generation_id": joined.generation,
        "protocol_type": joined.protocol_type,
        "protocol_name": joined.protocol_name if version >= 7 else joined.protocol_name or "",
        "leader": joined.leader,
        "member_id": joined.member_id,
        "members": [
            {"member_id": i, "group_instance_id": instance, "metadata": data}
            for i, instance, data in joined.members
        ],
    }


def translate_sync_group(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    instance_id = getattr(req, "group_instance_id", None)
    if (bad := _bad_ids(req, req.member_id, instance_id)) is not None:
        return bad
    assignments = {a.member_id: a.assignment for a in req.assignments}
    if len(assignments) != len(req.assignments) or any(
        len(a) > MAX_METADATA_BYTES for a in assignments.values()
    ):
        return _refused(
            ErrorCode.INVALID_REQUEST,
            f"one assignment per member, of at most {MAX_METADATA_BYTES} bytes",
        )
    return SyncGroupRequest(
        group_id=req.group_id,
        generation=req.generation_id,
        member_id=req.member_id,
        instance_id=instance_id,
        protocol_type=getattr(req, "protocol_type", None),
        protocol_name=getattr(req, "protocol_name", None),
        assignments=assignments,
    )


def answer_sync_group(r: SyncGroupResponse, _version: int, _asked: None) -> Values:
    return {
        "error_code": r.error,
        "protocol_type": r.synced.protocol_type,
        "protocol_name": r.synced.protocol_name,
        "assignment": r.synced.assignment,
    }


def translate_heartbeat(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    if (bad := _bad_ids(req, req.member_id, getattr(req, "group_instance_id", None))) is not None:
        return bad
    return HeartbeatRequest(
        group_id=req.group_id,
        generation=req.generation_id,
        member_id=req.member_id,
        instance_id=getattr(req, "group_instance_id", None),
    )


def answer_heartbeat(r: HeartbeatResponse, _version: int, _asked: None) -> Values:
    return {"error_code": r.error}


def translate_leave_group(req: Any, version: int, _ex: Exchange) -> m.Request | Reply:
    if version < 3:
        members: list[tuple[str, str | None]] = [(req.member_id, None)]
    else:
        members = [(mb.member_id, mb.group_instance_id) for mb in req.members]
    if not members:
        return _refused(ErrorCode.INVALID_REQUEST, "a LeaveGroup names its members")
    if (bad := _bad_ids(req, *(i for pair in members for i in pair))) is not None:
        return bad
    return LeaveGroupRequest(group_id=req.group_id, members=members)


def answer_leave_group(r: LeaveGroupResponse, version: int, _asked: None) -> Values:
    if version < 3:
        return {"error_code": r.error or (r.members[0].error if r.members else 0)}
    return {
        "error_code": r.error,
        "members": [
            {"member_id": mb.member_id, "group_instance_id": mb.instance_id, "error_code": mb.error}
            for mb in r.members
        ],
    }


def translate_describe_groups(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return KafkaDescribeGroupsRequest(group_ids=list(dict.fromkeys(req.groups)))


def answer_describe_groups(r: KafkaDescribeGroupsResponse, _version: int, _asked: None) -> Values:
    return {
        "groups": [
            {
                "error_code": g.error,
                "group_id": g.group_id,
                "group_state": g.state,
                "protocol_type": g.protocol_type,
                "protocol_data": g.protocol,
                "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
                "members": [
                    {
                        "member_id": mb.member_id,
                        "group_instance_id": mb.instance_id,
                        "client_id": mb.client_id,
                        "client_host": mb.client_host,
                        "member_metadata": mb.metadata,
                        "member_assignment": mb.assignment,
                    }
                    for mb in g.members
                ],
            }
            for g in r.groups
        ]
    }


def translate_list_groups(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return KafkaListGroupsRequest(states=list(getattr(req, "states_filter", ())))


def answer_list_groups(r: KafkaListGroupsResponse, _version: int, _asked: None) -> Values:
    return {
        "error_code": r.error,
        "groups": [
            {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state}
            for g in r.groups
        ],
    }


def translate_delete_groups(req: Any, _version: int, _ex: Exchange) -> m.Request:
    return DeleteGroupsRequest(group_ids=list(dict.fromkeys(req.groups_names)))


def answer_delete_groups(r: DeleteGroupsResponse, _version: int, _asked: None) -> Values:
    return {"results": [{"group_id": g.group_id, "error_code": g.error} for g in r.results]}


TRANSACTION_KEY = 1
"""FindCoordinator's key type of a transactional id (0: a group)."""


class FindTxnCoordinatorRequest(KafkaOnlyRequest, tag="KafkaFindTxnCoordinator"):
    """FindCoordinator for a transactional id: answered as a Metadata request without
    topics, for a caller that may DESCRIBE the id, as Kafka asks
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED otherwise)."""

    response = m.MetadataResponse
    requirements = Requirements(
        (RequestNeed(Op.DESCRIBE, Res.TRANSACTIONAL_ID, Path("transactional_id")),)
    )
    transactional_id: str


def translate_find_coordinator(req: Any, _version: int, _ex: Exchange) -> m.Request | Reply:
    """The group coordinator (key type 0) and the transaction coordinator (1) are this
    broker: a Metadata request without topics answers where it is (and passes
    authentication like any other request); for a transactional id, one that also
    needs DESCRIBE on it."""
    key_type = getattr(req, "key_type", 0)
    if key_type == TRANSACTION_KEY:
        return FindTxnCoordinatorRequest(transactional_id=req.key)
    if key_type != 0:
        return Reply(
            {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": f"no coordinator of key type {req.key_type}",
                "node_id": -1,
            }
        )
    return m.MetadataRequest(topics=[])


def answer_find_coordinator(r: m.MetadataResponse, _version: int, _asked: None) -> Values:
    """Where the coordinator is; a refusal (DESCRIBE on the transactional id denied)
    names no node."""
    if r.error:
        return {"error_code": r.error, "error_message": r.message, "node_id": -1}
    broker = r.brokers[0]
    return {"error_code": 0, "node_id": broker.id, "host": broker.host, "port": broker.port}


def commit_topics(topics: Any) -> list[m.OffsetCommitTopic]:
    """A Kafka OffsetCommit's or TxnOffsetCommit's topics as the broker's."""
    return [
        m.OffsetCommitTopic(
            t.name,
            [
                m.OffsetCommitPartition(p.partition_index, p.committed_offset, p.committed_metadata)
                for p in t.partitions
            ],
        )
        for t in topics
    ]


def committed_topics(topics: list[m.TopicPartitionErrors]) -> list[Values]:
    """The broker's answers per partition as an OffsetCommit's or TxnOffsetCommit's."""
    return [
        {
            "name": t.topic,
            "partitions": [
                {"partition_index": p.partition, "error_code": p.error} for p in t.partitions
            ],
        }
        for t in topics
    ]


def translate_offset_commit(req: Any, _version: int, _ex: Exchange) -> m.Request:
    """A member's commits carry its generation (checked as Kafka does); generation -1 and
    no member id commit from outside the group's membership."""
    return m.OffsetCommitRequest(
        group_id=req.group_id,
        member_id=req.member_id,
        member_epoch=req.generation_id_or_member_epoch,
        topics=commit_topics(req.topics),
    )


def answer_offset_commit(r: m.OffsetCommitResponse, _version: int, _asked: None) -> Values:
    return {"topics": committed_topics(r.topics)}


OFFSET_COMMIT = KafkaApi(8, "OffsetCommit", 2, 8, translate_offset_commit, answer_offset_commit)
FIND_COORDINATOR = KafkaApi(
    10, "FindCoordinator", 0, 3, translate_find_coordinator, answer_find_coordinator
)
JOIN_GROUP = KafkaApi(11, "JoinGroup", 0, 7, translate_join_group, answer_join_group)
HEARTBEAT = KafkaApi(12, "Heartbeat", 0, 4, translate_heartbeat, answer_heartbeat)
LEAVE_GROUP = KafkaApi(13, "LeaveGroup", 0, 4, translate_leave_group, answer_leave_group)
SYNC_GROUP = KafkaApi(14, "SyncGroup", 0, 5, translate_sync_group, answer_sync_group)
DESCRIBE_GROUPS = KafkaApi(
    15, "DescribeGroups", 0, 5, translate_describe_groups, answer_describe_groups
)
LIST_GROUPS = KafkaApi(16, "ListGroups", 0, 4, translate_list_groups, answer_list_groups)
DELETE_GROUPS = KafkaApi(42, "DeleteGroups", 0, 2, translate_delete_groups, answer_delete_groups)
APIS = (
    OFFSET_COMMIT,
    FIND_COORDINATOR,
    JOIN_GROUP,
    HEARTBEAT,
    LEAVE_GROUP,
    SYNC_GROUP,
    DESCRIBE_GROUPS,
    LIST_GROUPS,
    DELETE_GROUPS,
)
