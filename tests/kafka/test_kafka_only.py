"""The pattern of a Kafka-only request (broker/kafka/kafka_only.py), on an example class
declared here: it declares its needs as protocol/messages.py's requests do, the broker's
one judge (broker/security/authorization.py) decides it, the kafka codec answers its
refusal in its own response, and the native listener never decodes it."""

from __future__ import annotations

import msgspec
import pytest

from broker.kafka.codec import refusal
from broker.kafka.kafka_only import KafkaOnlyRequest
from broker.security import Access, AclBinding, Authorizer
from protocol import messages as m
from protocol.authorization import Entries, EntryNeed, Path, RequestNeed, Requirements
from protocol.authorization import Operation as Op
from protocol.authorization import ResourceType as Res
from protocol.errors import ErrorCode

ALICE = "User:alice"
HOST = "10.0.0.1"


class ExampleTopic(msgspec.Struct):
    name: str


class ExampleTopicAnswer(msgspec.Struct):
    name: str
    error: int = ErrorCode.NONE
    message: str | None = None


class ExampleResponse(m.Response):
    topics: list[ExampleTopicAnswer]


class ExampleRequest(KafkaOnlyRequest, tag="ExampleJoin"):
    """Joins `group_id` to read `topics`: read on the group, describe on each topic."""

    response = ExampleResponse
    requirements = Requirements(
        (
            RequestNeed(Op.READ, Res.GROUP, Path("group_id")),
            EntryNeed(Op.DESCRIBE, Res.TOPIC, "name"),
        ),
        Entries("topics", "topics", lambda t, code, why: ExampleTopicAnswer(t.name, code, why)),
    )
    group_id: str
    topics: list[ExampleTopic]


def access(*bindings: tuple[str, str, str]) -> Access:
    authorizer = Authorizer(["User:admin"])
    for rtype, name, operation in bindings:
        authorizer.add(AclBinding(rtype, name, "literal", ALICE, "*", operation, "allow"))
    return Access(authorizer, lambda _rtype, _name: False)


def example() -> ExampleRequest:
    return ExampleRequest(group_id="g", topics=[ExampleTopic("orders"), ExampleTopic("secret")])


def test_the_native_listener_does_not_know_it() -> None:
    assert ExampleRequest not in m.REQUEST_CLASSES
    assert "ExampleJoin" not in m.REQUEST_TYPES
    with pytest.raises(m.RequestRefused) as refused:
        m.decode_request(m.encode_request(example(), 7))
    assert refused.value.code == ErrorCode.UNSUPPORTED_VERSION


def test_a_denied_request_need_refuses_it_whole() -> None:
    judged = access((Res.TOPIC, "orders", Op.DESCRIBE)).judge(example(), ALICE, HOST)
    assert judged.refused
    assert isinstance(judged.refusal, ExampleResponse)
    assert judged.refusal.error == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert [(a.name, a.error) for a in judged.refusal.topics] == [
        ("orders", ErrorCode.GROUP_AUTHORIZATION_FAILED),
        ("secret", ErrorCode.GROUP_AUTHORIZATION_FAILED),
    ]


def test_a_denied_entry_is_answered_and_left_out() -> None:
    judged = access((Res.GROUP, "g", Op.READ), (Res.TOPIC, "orders", Op.DESCRIBE)).judge(
        example(), ALICE, HOST
    )
    assert not judged.refused
    assert isinstance(judged.request, ExampleRequest)
    assert [t.name for t in judged.request.topics] == ["orders"]
    response = ExampleResponse(topics=[ExampleTopicAnswer("orders")])
    judged.finish(response)
    assert [(a.name, a.error) for a in response.topics] == [
        ("orders", ErrorCode.NONE),
        ("secret", ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    ]


def test_a_super_user_passes() -> None:
    judged = access().judge(example(), "User:admin", HOST)
    assert not judged.refused and judged.request.topics == example().topics


def test_the_codec_answers_a_refusal_in_the_request_s_own_response() -> None:
    refused = m.Response(error=ErrorCode.SASL_AUTHENTICATION_FAILED, message="authenticate first")
    answer = refusal(example(), refused)
    assert isinstance(answer, ExampleResponse)
    assert answer.error == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert [(a.name, a.error, a.message) for a in answer.topics] == [
        ("orders", ErrorCode.SASL_AUTHENTICATION_FAILED, "authenticate first"),
        ("secret", ErrorCode.SASL_AUTHENTICATION_FAILED, "authenticate first"),
    ]


def test_a_class_without_its_declarations_is_refused_when_made() -> None:
    with pytest.raises(TypeError, match="declares no requirements"):

        class Undeclared(KafkaOnlyRequest, tag="ExampleUndeclared"):
            response = ExampleResponse
