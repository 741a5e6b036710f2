"""A group member that stops polling, on the real broker, both backends, with
kafka-python's and confluent-kafka's consumers: its client's background thread keeps
heartbeating, so its session never runs out, but it cannot answer a rebalance without
polling; the broker removes it once the rebalance has waited its rebalance timeout,
and the others take its partitions. (A member whose process is killed leaves after
its session timeout: test_kafka_groups.py.)"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import BACKENDS
from tests.kafka.test_kafka_groups import (
    GROUP_SETTINGS,
    LOG,
    Member,
    Members,
    Stack,
    Threaded,
    assert_once,
    group_of,
    produce,
    read_all,
    settle,
    stack_per_backend,
)

__all__ = ["group_of"]  # the fixture, shared with test_kafka_groups.py

REBALANCE_MS = 3_000
"""The broker's largest rebalance timeout, to which it cuts the members' (both clients
send their max poll interval as their rebalance timeout)."""
POLL_INTERVAL = {
    "kafka-python": {"max_poll_interval_ms": 60_000},
    "confluent-kafka": {"max.poll.interval.ms": 60_000},
}
"""Longer than the test: no client gives up on its own poll interval and leaves, so the
broker's rebalance timeout is what removes the stuck member."""
REMOVED = re.compile(r"event=group_member_removed .*reason=rebalance_timeout")


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    settings = f"{GROUP_SETTINGS}group_max_rebalance_timeout_ms = {REBALANCE_MS}\n"
    yield from stack_per_backend(request, tmp_path_factory, "kafka-stuck", settings)


def stall(member: Member) -> threading.Event:
    """Stop `member` polling until the event is set. A confluent-kafka member is polled
    only by the test's thread, so the test just stops polling it."""
    release = threading.Event()
    if isinstance(member, Threaded):
        member.stall(release)
    return release


@pytest.mark.parametrize("client", sorted(POLL_INTERVAL))
def test_a_member_that_stops_polling_is_removed_and_the_others_take_over(
    stack: Stack, group_of: Callable[[str], Members], client: str
) -> None:
    """A new member's join starts a rebalance the stuck member never answers: the
    broker removes it after the rebalance timeout, and the two others split every
    partition and read every record once."""
    members = group_of(client)
    stuck = members.new(settings=POLL_INTERVAL[client])
    a = members.new(settings=POLL_INTERVAL[client])
    settle(stuck, a)
    release = stall(stuck)
    try:
        b = members.new(settings=POLL_INTERVAL[client])
        settle(a, b)
        sent = produce(stack, members.topic, 40, "after-stall")
        assert_once(sent, read_all(sent, a, b))
        assert REMOVED.search(LOG[0]()), LOG[0]()
    finally:
        release.set()
