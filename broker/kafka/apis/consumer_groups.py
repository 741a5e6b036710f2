"""KIP-848's consumer groups for Kafka's clients: ConsumerGroupHeartbeat (v0-1) and
ConsumerGroupDescribe (v0) (docs/kafka-compatibility.md).

Both run on the native group coordinator (broker/groups/state.py), which already
assigns on the server: a librdkafka consumer with `group.protocol=consumer` and a
minibroker SDK consumer are members of one kind and may share a group. The one thing
Kafka's messages have that the native ones lack is topic ids: an assignment and the
partitions a member owns name topics by id, subscriptions by name. The translations
stay pure and carry ids as bytes; `ConsumerGroupApi`, which holds the topic registry,
turns them into names on the way in and names into ids on the way out.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from broker.groups import ConsumerGroup, GroupCoordinator
from broker.kafka.api import Exchange, KafkaApi, Reply, Values, ms
from broker.kafka.kafka_only import KafkaOnlyRequest
from broker.partitions import TopicRegistry
from broker.security import Session
from protocol import messages as m
from protocol.authorization import Entries, EntryNeed, Omission, Path, RequestNeed, Requirements
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.errors import ErrorCode

ASSIGNOR = "uniform"
"""The one server assignor (broker/groups/assignor.py is in the spirit of Kafka's
uniform one): a heartbeat naming another gets UNSUPPORTED_ASSIGNOR, as Kafka answers."""
NOT_ASKED = -(2**31)
"""authorized_operations when not computed, as Kafka answers when not asked."""

# --------------------------------------------------------------------------- the requests


class TopicIdPartitions(msgspec.Struct):
    """Partitions of one topic, named by its id (16 bytes), as Kafka's messages do."""

    topic_id: bytes
    partitions: list[int]


class KafkaConsumerGroupHeartbeatResponse(m.Response):
    member_id: str = ""
    member_epoch: int = -1
    heartbeat_interval_ms: int = -1
    assignment: list[TopicIdPartitions] | None = None


class KafkaConsumerGroupHeartbeatRequest(KafkaOnlyRequest, tag="KafkaConsumerGroupHeartbeat"):
    """The native ConsumerGroupHeartbeat with what Kafka's adds: owned partitions by topic
    id, a rebalance timeout of -1 when unchanged, and (v1) a member id of the client's."""

    response = KafkaConsumerGroupHeartbeatResponse
    # As the native request: READ on the group; subscribed topics the caller may not
    # describe are left out of the subscription (docs/protocol.md section 9).
    requirements = Requirements(
        (
            RequestNeed(Op.READ, Res.GROUP, Path("group_id")),
            Omission(Op.DESCRIBE, Res.TOPIC, Path("subscribed_topics[]"), in_response=False),
        )
    )
    group_id: str
    member_id: str
    member_epoch: int
    rebalance_timeout_ms: int
    subscribed_topics: list[str] | None
    owned: list[TopicIdPartitions] | None
    instance_id: str | None

    def entry_count(self) -> int:
        owned = self.owned or ()
        subscribed = len(self.subscribed_topics or ())
        return subscribed + len(owned) + sum(len(t.partitions) for t in owned)


class ConsumerTopicPartitions(msgspec.Struct):
    topic: str
    topic_id: bytes
    partitions: list[int]


class ConsumerMember(msgspec.Struct):
    member_id: str
    instance_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topics: list[str]
    assignment: list[ConsumerTopicPartitions]
    target: list[ConsumerTopicPartitions]


class ConsumerGroupDescription(msgspec.Struct):
    group_id: str
    error: int = ErrorCode.NONE
    message: str | None = None
    state: str = "Dead"
    group_epoch: int = -1
    members: list[ConsumerMember] = msgspec.field(default_factory=list)


class ConsumerGroupDescribeResponse(m.Response):
    groups: list[ConsumerGroupDescription] = msgspec.field(default_factory=list)


def _members_topics(path: str) -> Omission:
    return Omission(Op.DESCRIBE, Res.TOPIC, Path(path), within=("groups", "members"))


class ConsumerGroupDescribeRequest(KafkaOnlyRequest, tag="ConsumerGroupDescribe"):
    """DESCRIBE on each group; another member's topics are shown only where the caller
    may describe them, as DescribeGroups shows them."""

    response = ConsumerGroupDescribeResponse
    requirements = Requirements(
        (
            EntryNeed(Op.DESCRIBE, Res.GROUP, ""),
            _members_topics("subscribed_topics[]"),
            _members_topics("assignment[].topic"),
            _members_topics("target[].topic"),
        ),
        Entries(
            "group_ids",
            "groups",
            lambda group_id, code, why: ConsumerGroupDescription(group_id, code, why),
        ),
    )
    group_ids: list[str]

    def entry_count(self) -> int:
        return len(self.group_ids)


class ConsumerGroupApi:
    """KIP-848's requests of Kafka's clients, on the group coordinator, with the topic
    registry for the ids their messages name topics by."""

    def __init__(self, groups: GroupCoordinator, topics: TopicRegistry) -> None:
        self.groups = groups
        self.topics = topics

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        return {
            "KafkaConsumerGroupHeartbeat": self.heartbeat,
            "ConsumerGroupDescribe": lambda req, _session: self.describe(req),
        }

    async def heartbeat(
        self, req: KafkaConsumerGroupHeartbeatRequest, session: Session
    ) -> KafkaConsumerGroupHeartbeatResponse:
        owned = None
        if req.owned is not None:
            # Partitions of a topic no longer here (deleted) are no one's to give up.
            names = {t.topic_id.bytes: name for name, t in self.topics.topics.items()}
            owned = [
                m.GroupTopicPartitions(names[t.topic_id], t.partitions)
                for t in req.owned
                if t.topic_id in names
            ]
        native = m.ConsumerGroupHeartbeatRequest(
            group_id=req.group_id,
            member_id=req.member_id,
            member_epoch=req.member_epoch,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            subscribed_topics=req.subscribed_topics,
            owned=owned,
            instance_id=req.instance_id,
        )
        native.client_id = req.client_id
        # A Kafka client may name itself (v1 must, KIP-1082): "" alone is named here.
        r = await self.groups.heartbeat(native, client_named=True, client_host=session.peer_host)
        return KafkaConsumerGroupHeartbeatResponse(
            error=r.error,
            message=r.message,
            member_id=r.member_id,
            member_epoch=r.member_epoch,
            heartbeat_interval_ms=r.heartbeat_interval_ms,
            assignment=None if r.assignment is None else self._by_id(r.assignment),
        )

    def describe(self, req: ConsumerGroupDescribeRequest) -> ConsumerGroupDescribeResponse:
        out = []
        for group_id in req.group_ids:
            group = self.groups.consumer_group(group_id)
            if group is not None:
                out.append(self._described(group))
                continue
            # Kafka's answer for a classic group too, after which librdkafka's admin
            # client asks DescribeGroups.
            why = "is not a consumer group" if self.groups.kafka_listing(group_id) else "not found"
            message = f"group {group_id!r} {why}"
            out.append(ConsumerGroupDescription(group_id, ErrorCode.GROUP_ID_NOT_FOUND, message))
        return ConsumerGroupDescribeResponse(groups=out)

    def _described(self, group: ConsumerGroup) -> ConsumerGroupDescription:
        members = [
            ConsumerMember(
                member_id,
                member.instance_id,
                member.member_epoch,
                member.client_id,
                member.client_host,
                sorted(member.subscribed_topics),
                self._named(member.assigned),
                self._named(group.target.get(member_id, frozenset())),
            )
            for member_id, member in sorted(group.members.items())
        ]
        return ConsumerGroupDescription(
            group.group_id,
            state=group.state.capitalize(),
            group_epoch=group.group_epoch,
            members=members,
        )

    def _topic_id(self, name: str) -> bytes | None:
        topic = self.topics.topics.get(name)
        return None if topic is None else topic.topic_id.bytes

    def _by_id(self, assigned: Iterable[m.GroupTopicPartitions]) -> list[TopicIdPartitions]:
        """An assignment by name as Kafka's by id; a topic deleted since it was assigned
        is left out (the next assignment drops it too)."""
        out = []
        for t in assigned:
            topic_id = self._topic_id(t.topic)
            if topic_id is not None:
                out.append(TopicIdPartitions(topic_id, t.partitions))
        return out

    def _named(self, partitions: frozenset[tuple[str, int]]) -> list[ConsumerTopicPartitions]:
        topics: dict[str, list[int]] = {}
        for topic, index in sorted(partitions):
            topics.setdefault(topic, []).append(index)
        return [
            ConsumerTopicPartitions(topic, self._topic_id(topic) or bytes(16), indexes)
            for topic, indexes in topics.items()
        ]


# --------------------------------------------------------------------------- translations


def _invalid(message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> Reply:
    return Reply({"error_code": code, "error_message": message})


def _blank(value: str | None) -> bool:
    return value is not None and not value.strip()


def translate_heartbeat(
    req: Any, version: int, _ex: Exchange
) -> KafkaConsumerGroupHeartbeatRequest | Reply:
    """Kafka's checks of a heartbeat (GroupMetadataManager's), as INVALID_REQUEST with
    Kafka's reasons. v1's member names itself (KIP-1082); v0's may, or joins with ""
    and is named by the broker."""
    epoch, member_id = req.member_epoch, req.member_id
    named = version >= 1 or epoch > 0 or epoch == m.MEMBER_EPOCH_LEAVE
    if named and not member_id.strip():
        return _invalid("MemberId can't be empty.")
    if not req.group_id.strip():
        return _invalid("GroupId can't be empty.")
    if _blank(req.instance_id):
        return _invalid("InstanceId can't be empty.")
    if _blank(req.rack_id):
        return _invalid("RackId can't be empty.")
    ids = (req.group_id, member_id, req.instance_id)
    if any(i is not None and len(i) > m.IDENTIFIER_CHARS_MAX for i in ids):
        return _invalid(
            f"group, member and instance ids have at most {m.IDENTIFIER_CHARS_MAX} characters"
        )
    regex = getattr(req, "subscribed_topic_regex", None)
    if regex:
        return _invalid("SubscribedTopicRegex is not served by this broker: name the topics")
    timeout_ms = ms(req.rebalance_timeout)
    if epoch == m.MEMBER_EPOCH_JOIN:
        if timeout_ms == -1:
            return _invalid("RebalanceTimeoutMs must be provided in first request.")
        if req.topic_partitions is None or req.topic_partitions:
            return _invalid("TopicPartitions must be empty when (re-)joining.")
        if req.subscribed_topic_names is None:
            return _invalid("SubscribedTopicNames must be set in first request.")
    elif epoch == m.MEMBER_EPOCH_LEAVE_STATIC and req.instance_id is None:
        return _invalid("InstanceId can't be null.")
    elif epoch < m.MEMBER_EPOCH_LEAVE_STATIC:
        return _invalid("MemberEpoch is invalid.")
    if req.server_assignor is not None and req.server_assignor != ASSIGNOR:
        return _invalid(
            f"ServerAssignor {req.server_assignor} is not supported. "
            f"Supported assignors: {ASSIGNOR}.",
            ErrorCode.UNSUPPORTED_ASSIGNOR,
        )
    owned = None
    if req.topic_partitions is not None:
        owned = [
            TopicIdPartitions(t.topic_id.bytes if t.topic_id else bytes(16), list(t.partitions))
            for t in req.topic_partitions
        ]
        ids_named = [t.topic_id for t in owned]
        if len(set(ids_named)) != len(ids_named) or any(
            len(set(t.partitions)) != len(t.partitions) for t in owned
        ):
            return _invalid("TopicPartitions names a topic or a partition twice")
    names = req.subscribed_topic_names
    return KafkaConsumerGroupHeartbeatRequest(
        group_id=req.group_id,
        member_id=member_id,
        member_epoch=epoch,
        rebalance_timeout_ms=timeout_ms,
        subscribed_topics=None if names is None else list(dict.fromkeys(names)),
        owned=owned,
        instance_id=req.instance_id,
    )


def answer_heartbeat(r: KafkaConsumerGroupHeartbeatResponse, _version: int, _asked: None) -> Values:
    values: Values = {
        "error_code": r.error,
        "error_message": r.message,
        "member_id": r.member_id or None,
        "member_epoch": r.member_epoch,
        "heartbeat_interval": r.heartbeat_interval_ms,
    }
    if r.assignment is not None:
        values["assignment"] = {"topic_partitions": _topic_partitions(r.assignment)}
    return values


def _topic_partitions(assigned: list[TopicIdPartitions]) -> list[Values]:
    return [{"topic_id": uuid.UUID(bytes=t.topic_id), "partitions": t.partitions} for t in assigned]


def translate_describe(req: Any, _version: int, _ex: Exchange) -> ConsumerGroupDescribeRequest:
    return ConsumerGroupDescribeRequest(group_ids=list(dict.fromkeys(req.group_ids)))


def answer_describe(r: ConsumerGroupDescribeResponse, _version: int, _asked: None) -> Values:
    def partitions(tps: list[ConsumerTopicPartitions]) -> Values:
        return {
            "topic_partitions": [
                {
                    "topic_id": uuid.UUID(bytes=t.topic_id),
                    "topic_name": t.topic,
                    "partitions": t.partitions,
                }
                for t in tps
            ]
        }

    return {
        "groups": [
            {
                "error_code": g.error,
                "error_message": g.message,
                "group_id": g.group_id,
                "group_state": g.state if not g.error else "",
                "group_epoch": g.group_epoch,
                # The target is recomputed with every epoch the group takes.
                "assignment_epoch": g.group_epoch,
                "assignor_name": ASSIGNOR if not g.error else "",
                "authorized_operations": NOT_ASKED,
                "members": [
                    {
                        "member_id": mb.member_id,
                        "instance_id": mb.instance_id,
                        "member_epoch": mb.member_epoch,
                        "client_id": mb.client_id,
                        "client_host": mb.client_host,
                        "subscribed_topic_names": mb.subscribed_topics,
                        "assignment": partitions(mb.assignment),
                        "target_assignment": partitions(mb.target),
                    }
                    for mb in g.members
                ],
            }
            for g in r.groups
        ]
    }


CONSUMER_GROUP_HEARTBEAT = KafkaApi(
    68, "ConsumerGroupHeartbeat", 0, 1, translate_heartbeat, answer_heartbeat
)
CONSUMER_GROUP_DESCRIBE = KafkaApi(
    69, "ConsumerGroupDescribe", 0, 0, translate_describe, answer_describe
)
APIS = (CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE)
