"""Exactly-once delivery within a producer session, under faults, for both faces.

A producer sends 50,000 records (values are their sequence numbers, spread over
three partitions) with max_in_flight_requests_per_connection=5 while:

- a proxy drops connections before requests reach the broker and discards
  responses after the broker appended;
- the broker is killed with SIGKILL and restarted, twice;
- a proxy makes the broker reject first attempts with UNKNOWN_PRODUCER_ID or
  OUT_OF_ORDER_SEQUENCE_NUMBER (KIP-360 epoch bumps);
- both kinds of proxy faults at once.

Afterwards a consumer reads every partition to its end: each record must be
there exactly once, in order. Each scenario runs for the sync and the async
face, against both broker backends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from client import AsyncProducer, Consumer, Producer
from client.admin import create_topic
from harness.broker_process import BrokerProcess
from tests.fault_proxy import FaultProxy

RECORDS = 50_000
PARTITIONS = 3
TOPIC = "exactly-once"
PRODUCER_CONFIG: dict[str, Any] = {
    "max_in_flight_requests_per_connection": 5,
    "batch_size": 1_024,  # small batches: many requests, so faults land at many points
    # and small grown ones: a full pipeline's batch grows (adaptive batching) to 2 KiB only
    "max_request_size": 2_048,
    "linger_ms": 2,
    "retry_backoff_ms": 20,
    "retry_backoff_max_ms": 200,
    "reconnect_backoff_ms": 20,
    "reconnect_backoff_max_ms": 200,
    "request_timeout_ms": 10_000,
    "delivery_timeout_ms": 120_000,
}

Faults = dict[str, float]
SCENARIOS: dict[str, Faults] = {
    "drops": {"drop_request": 0.01, "drop_response": 0.02},
    "rejections": {"reject_unknown_producer": 0.01, "reject_out_of_order": 0.01},
    # Epoch bumps while other batches' outcomes are unknown: the hardest KIP-360 path.
    "combined": {
        "drop_request": 0.01,
        "drop_response": 0.02,
        "reject_unknown_producer": 0.01,
        "reject_out_of_order": 0.01,
    },
}


@pytest.fixture
def anyio_backend(backend: str) -> str:
    return backend


def produce_sync(bootstrap: str, watch: Callable[[Callable[[], dict]], None] | None = None) -> dict:
    with Producer(bootstrap, **PRODUCER_CONFIG) as producer:
        if watch is not None:
            watch(producer.metrics)
        handles = [
            producer.send(TOPIC, b"%d" % i, partition=i % PARTITIONS) for i in range(RECORDS)
        ]
        producer.flush(120)
        for handle in handles:
            handle.get(0)  # raises if any record failed
        return producer.metrics()


async def produce_async(
    bootstrap: str, watch: Callable[[Callable[[], dict]], None] | None = None
) -> dict:
    async with AsyncProducer(bootstrap, **PRODUCER_CONFIG) as producer:
        if watch is not None:
            watch(producer.metrics)
        handles = []
        for i in range(RECORDS):
            handles.append(await producer.send(TOPIC, b"%d" % i, partition=i % PARTITIONS))
            if i % 1_000 == 0:
                await anyio.sleep(0)  # let the sender run between bursts
        await producer.flush(120)
        for handle in handles:
            await handle
        return producer.metrics()


def assert_exactly_once_in_order(bootstrap: str) -> None:
    with Consumer(TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        partitions = consumer.assignment()
        ends = consumer.end_offsets(partitions)
        got: dict[int, list[int]] = {tp.partition: [] for tp in partitions}
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline
            for tp, records in consumer.poll(timeout_ms=500, max_records=100_000).items():
                got[tp.partition] += [int(r.value) for r in records]
    for partition in range(PARTITIONS):
        expected = list(range(partition, RECORDS, PARTITIONS))
        values = got[partition]
        assert len(values) == len(set(values)), f"duplicates in partition {partition}"
        assert values == expected, f"partition {partition}: missing or out of order"


def proxied(broker: BrokerProcess, faults: Faults, seed: int) -> FaultProxy:
    create_topic(broker.bootstrap, TOPIC, partitions=PARTITIONS)
    return FaultProxy(lambda: (broker.host, broker.port), seed=seed, **faults).start()


def check_faults(proxy: FaultProxy, metrics: dict, scenario: str) -> None:
    assert sum(proxy.injected.values()) >= 5, proxy.injected
    if scenario != "rejections":
        assert metrics["batch_retries"] > 0
    if scenario != "drops":
        assert metrics["epoch_bumps"] > 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sync_producer_exactly_once_through_faults(broker: BrokerProcess, scenario: str) -> None:
    with proxied(broker, SCENARIOS[scenario], seed=1) as proxy:
        metrics = produce_sync(proxy.bootstrap)
    check_faults(proxy, metrics, scenario)
    assert_exactly_once_in_order(broker.bootstrap)


@pytest.mark.anyio
@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_async_producer_exactly_once_through_faults(
    broker: BrokerProcess, scenario: str
) -> None:
    with proxied(broker, SCENARIOS[scenario], seed=2) as proxy:
        metrics = await produce_async(proxy.bootstrap)
    check_faults(proxy, metrics, scenario)
    await anyio.to_thread.run_sync(assert_exactly_once_in_order, broker.bootstrap)


class Restarter:
    """Kills (-9) and restarts the broker as acknowledged records pass given counts."""

    def __init__(self, broker: BrokerProcess, at: tuple[int, ...] = (15_000, 32_000)) -> None:
        self.broker = broker
        self.at = at
        self.restarts = 0
        self._thread: threading.Thread | None = None

    def watch(self, metrics: Callable[[], dict]) -> None:
        self._thread = threading.Thread(target=self._run, args=(metrics,), daemon=True)
        self._thread.start()

    def _run(self, metrics: Callable[[], dict]) -> None:
        deadline = time.monotonic() + 60
        for threshold in self.at:
            while metrics()["records_sent"] < threshold and time.monotonic() < deadline:
                time.sleep(0.005)
            self.broker.restart(kill=True)
            self.restarts += 1

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join(60)


def test_sync_producer_exactly_once_across_broker_kills(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, TOPIC, partitions=PARTITIONS)
    restarter = Restarter(broker)
    metrics = produce_sync(broker.bootstrap, restarter.watch)
    restarter.join()
    assert restarter.restarts == 2
    assert metrics["connection_failures"] + metrics["batch_retries"] > 0
    assert_exactly_once_in_order(broker.bootstrap)


@pytest.mark.anyio
async def test_async_producer_exactly_once_across_broker_kills(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, TOPIC, partitions=PARTITIONS)
    restarter = Restarter(broker)
    metrics = await produce_async(broker.bootstrap, restarter.watch)
    await anyio.to_thread.run_sync(restarter.join)
    assert restarter.restarts == 2
    assert metrics["connection_failures"] + metrics["batch_retries"] > 0
    await anyio.to_thread.run_sync(assert_exactly_once_in_order, broker.bootstrap)
