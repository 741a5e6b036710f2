"""Kafka's own Python clients against the real broker's kafka listener, on both backends:
kafka-python, aiokafka and confluent-kafka (librdkafka), each with its idempotent
producer at acks=all, produce through a proxy that drops requests and answers, or
across a kill -9 of the broker, and read the partition back with manual assignment.

Every record must come back exactly once and in order, with its key, value, headers
(null keys and values among them) and create time, at the offset its producer was
acknowledged with; offsets run 0..n-1, so a duplicate or a gap shows.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import BACKENDS
from tests.kafka.kafka_support import (
    CLIENTS,
    CODECS,
    KafkaStack,
    Rec,
    produce,
    read_back,
    records,
    stack_per_backend,
    without_offsets,
)

RECORDS = 400


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaStack]:
    """One broker per backend for the module, its kafka listener behind a fault proxy;
    each test has topics of its own and sets the proxy's faults."""
    yield from stack_per_backend(request, tmp_path_factory, "clients", proxied=True)


def assert_exactly_once(sent: list[Rec], offsets: list[int], back: list[Rec]) -> None:
    """`back` is `sent` in order, each record at the offset it was acknowledged with."""
    assert offsets == list(range(len(sent))), "acknowledged offsets are not 0..n-1"
    assert [r.offset for r in back] == offsets, "a record missing, duplicated or moved"
    assert without_offsets(back) == sent


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", CLIENTS)
def test_idempotent_producer_through_dropped_answers(
    stack: KafkaStack, client: str, codec: str
) -> None:
    """Tried: the proxy swallows some Produce requests and, worse, discards some Produce
    answers after the broker appended, cutting the connection each time, so the producer
    retries batches whose fate it cannot know; the broker must recognise the retries of
    appended batches by their sequence numbers and append them no second time."""
    topic = stack.new_topic(f"{client}-{codec}")
    sent = records(RECORDS, f"{client}-{codec}")
    stack.faults(drop_request=0.05, drop_response=0.25)
    try:
        offsets = produce(client, stack.kafka, topic, sent, codec)
        assert stack.proxy is not None
        injected = dict(stack.proxy.injected)
    finally:
        stack.faults()
    assert injected.get("drop_response", 0) >= 1, f"no answer was dropped: {injected}"
    assert_exactly_once(sent, offsets, read_back(client, stack.kafka, topic, RECORDS))


@pytest.mark.parametrize("client", CLIENTS)
def test_idempotent_producer_across_a_broker_kill(stack: KafkaStack, client: str) -> None:
    """Tried: kill -9 of the broker while the first half of the records is in flight
    (some acknowledged, some not), the second half queued while it is down, then a restart
    on the same data dir and ports; acknowledged records were fsynced, so none is lost,
    and the retried batches the broker had appended before dying are not appended again."""
    topic = stack.new_topic(f"{client}-kill")
    sent = records(RECORDS, f"{client}-kill")

    def crash() -> None:
        stack.broker.kill()
        stack.broker.start()

    offsets = produce(client, stack.kafka, topic, sent, "lz4", restart=(RECORDS // 8, crash))
    assert_exactly_once(sent, offsets, read_back(client, stack.kafka, topic, RECORDS))
