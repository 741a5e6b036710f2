"""A group of confluent-kafka consumers (classic protocol) reading with commits through
a proxy that drops the group's requests and answers, while the broker is killed with
SIGKILL in the middle of a rebalance and started again on the same data dir and ports,
both backends. The members rejoin, and no record is skipped past a committed offset:
every record is read at least once, every record at or after the offset each
partition had committed when the broker came back is read after it, and no commit the
client was told succeeded is lost.
"""

from __future__ import annotations

import struct
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka

from client import Producer
from client.admin import create_topic, list_group_offsets
from tests.kafka.kafka_support import KafkaFaultProxy, start_behind_proxy
from tests.kafka.test_kafka_groups import (
    DEADLINE_S,
    GROUP_SETTINGS,
    PARTITIONS,
    SESSION_MS,
    Read,
)

HEARTBEAT_MS = 1_000
"""Members learn of a rebalance at their next heartbeat: this long, the rebalance a
new member starts lasts long enough for the test to kill the broker in it."""
GROUP_APIS = {
    8: "OffsetCommit",
    9: "OffsetFetch",
    11: "JoinGroup",
    12: "Heartbeat",
    14: "SyncGroup",
}
"""Kafka's API keys of the requests the proxy drops, or whose answers it drops."""


class GroupFaultProxy(KafkaFaultProxy):
    """KafkaFaultProxy's `drop_request` and `drop_response` on the group's requests (a
    commit or a join whose answer is lost, a heartbeat that never arrives), each closing
    the client's connection, which it opens again through the proxy."""

    def _request(self, frame: bytes, apis: dict[int, str]) -> bytes | None:
        api_key, _version, correlation_id = struct.unpack_from(">hhi", frame, 4)
        if api_key not in GROUP_APIS:
            return frame
        apis[correlation_id] = GROUP_APIS[api_key]
        return None if self._roll("drop_request") else frame

    def _response(self, frame: bytes, apis: dict[int, str]) -> bytes | None:
        (correlation_id,) = struct.unpack_from(">i", frame, 4)
        if apis.pop(correlation_id, None) is not None and self._roll("drop_response"):
            return None
        return frame


class Member:
    """A confluent-kafka group consumer polled by the test's thread, which keeps going
    through the errors a dropped connection or a dead broker reports."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "topic.metadata.refresh.interval.ms": 1_000,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self.consumer.subscribe([topic])

    def poll(self) -> list[Read]:
        out = []
        for m in self.consumer.consume(num_messages=500, timeout=0.1):
            error = m.error()
            if error is None:
                out.append((m.partition(), m.offset(), m.value()))
            elif error.fatal():
                raise AssertionError(f"confluent-kafka consumer: {error}")
        return out

    def commit(self) -> dict[int, int]:
        """Commit the positions; the offsets the broker acknowledged (none when the
        commit failed, as a dropped answer makes it)."""
        try:
            done = self.consumer.commit(asynchronous=False) or []
        except confluent_kafka.KafkaException:
            return {}
        return {tp.partition: tp.offset for tp in done if tp.error is None and tp.offset >= 0}

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def close(self) -> None:
        self.consumer.close()


def produce(mb: str, topic: str, tag: str, count: int) -> dict[bytes, int]:
    """`count` records over every partition, through the minibroker listener; each
    value's partition."""
    values = {f"{tag}-{i}".encode(): i % PARTITIONS for i in range(count)}
    with Producer(mb, linger_ms=5) as producer:
        for value, partition in values.items():
            producer.send(topic, value, partition=partition)
        producer.flush(DEADLINE_S)
    return values


def poll_until(what: str, done: Any, members: list[Member], reads: list[Read]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, what
        for member in members:
            reads += member.poll()


def split(members: list[Member]) -> bool:
    held = [m.assignment() for m in members]
    return all(held) and sum(map(len, held)) == PARTITIONS == len(set().union(*held))


def test_a_group_survives_dropped_answers_and_a_broker_kill_mid_rebalance(
    tmp_path: Path, backend: str
) -> None:
    broker, proxy = start_behind_proxy(
        tmp_path / "data",
        backend,
        lambda target: GroupFaultProxy(target, drop_request=0.04, drop_response=0.04),
        GROUP_SETTINGS,
    )
    topic, group = f"restart-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.address("mb"), topic, partitions=PARTITIONS)
    members: list[Member] = []
    try:
        members += [Member(proxy.bootstrap, topic, group) for _ in range(2)]
        before: list[Read] = []
        poll_until("no split of two", lambda: split(members), members, before)
        sent = produce(broker.address("mb"), topic, "before", 200)
        acked: dict[int, int] = {}
        seen = {v for _, _, v in before}
        deadline = time.monotonic() + DEADLINE_S
        while not seen >= set(sent):
            assert time.monotonic() < deadline, f"{len(set(sent) - seen)} records never read"
            for member in members:
                got = member.poll()
                before += got
                seen |= {v for _, _, v in got}
                for p, offset in member.commit().items():
                    acked[p] = max(acked.get(p, 0), offset)

        # A third member's join starts a rebalance; the broker dies in it.
        members.append(Member(proxy.bootstrap, topic, group))
        joined = f"event=group_member_joined group={group!r}"
        deadline = time.monotonic() + DEADLINE_S
        while broker.log_text().count(joined) < 3:  # librdkafka joins from its own thread
            assert time.monotonic() < deadline, "the third member never joined"
            time.sleep(0.005)
        broker.kill()
        log = broker.log_text()
        assert f"event=group_stable group={group!r}" not in log[log.rindex(joined) :], (
            "the rebalance ended before the kill"
        )
        broker.start(broker.port)
        committed = {
            tp.partition: om.offset
            for tp, om in list_group_offsets(broker.address("mb"), group).items()
        }
        assert all(committed.get(p, 0) >= o for p, o in acked.items()), (committed, acked)

        more = produce(broker.address("mb"), topic, "after", 100)
        end = (len(sent) + len(more)) // PARTITIONS  # every partition's log end offset
        after: list[Read] = []
        poll_until("no split of three after the restart", lambda: split(members), members, after)
        expected = {(p, o) for p in range(PARTITIONS) for o in range(committed.get(p, 0), end)}
        poll_until(
            "not every record after the committed offsets read again",
            lambda: {(p, o) for p, o, _ in after} >= expected,
            members,
            after,
        )
        read_once_at_least = {v for _, _, v in before} | {v for _, _, v in after}
        assert read_once_at_least >= set(sent) | set(more), "a record was never read"
        assert sum(proxy.injected.values()) > 0, "the proxy dropped nothing"
    finally:
        for member in members:
            member.close()
        proxy.close()
        broker.kill()
