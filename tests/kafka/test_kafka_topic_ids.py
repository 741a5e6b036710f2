"""Topic ids (KIP-516) through both listeners of a real broker: Kafka's client reads in
Metadata the id the native listener answers, the same after a kill -9 and a restart, and
a new one for a topic deleted and created again under its name."""

from __future__ import annotations

import uuid

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from harness.wire import WireClient
from tests.kafka.conftest import TwoListeners


def _native_ids(address: str) -> dict[str, uuid.UUID]:
    with WireClient(address) as wire:
        answer = wire.call("Metadata", topics=None, allow_auto_create=False)
    return {t["name"]: uuid.UUID(bytes=t["topic_id"]) for t in answer["topics"]}


def _kafka_ids(address: str) -> dict[str, uuid.UUID]:
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        return {t["name"]: uuid.UUID(str(t["topic_id"])) for t in admin.describe_topics()}
    finally:
        admin.close()


def test_a_topic_keeps_its_id_through_both_listeners_and_a_kill(
    two_listeners: TwoListeners,
) -> None:
    proc = two_listeners.broker
    with WireClient(two_listeners.minibroker) as wire:
        assert wire.create_topic("orders", 2) == 0
        assert wire.create_topic("audit", 1) == 0
    ids = _native_ids(two_listeners.minibroker)
    assert len(set(ids.values())) == 2 and all(i.version == 4 for i in ids.values())
    assert _kafka_ids(two_listeners.kafka) == ids

    proc.restart(kill=True)
    assert _native_ids(proc.address("minibroker")) == ids
    assert _kafka_ids(proc.address("kafka")) == ids

    with WireClient(proc.address("minibroker")) as wire:
        assert wire.call("DeleteTopics", topics=["orders"])["topics"][0]["error"] == 0
        assert wire.create_topic("orders", 2) == 0
    again = _kafka_ids(proc.address("kafka"))
    assert again["audit"] == ids["audit"] and again["orders"] != ids["orders"]


def test_createtopics_answers_the_new_topics_id(two_listeners: TwoListeners) -> None:
    admin = KafkaAdminClient(bootstrap_servers=two_listeners.kafka)
    try:
        created = admin.create_topics([NewTopic("events", 3, 1)])["topics"]
    finally:
        admin.close()
    assert [t["name"] for t in created] == ["events"]
    assert uuid.UUID(str(created[0]["topic_id"])) == _native_ids(two_listeners.minibroker)["events"]
