"""Crash loop: idempotent acks=all producers write while the broker is SIGKILLed at
random moments, again and again, restarting on the same data dir and port.

What is tried, on each backend: 3 `client.Producer`s (idempotent, acks=all,
5 requests in flight, small batches) each write numbered records to all 4
partitions of a topic; a killer thread SIGKILLs the broker at a random moment
(seeded), restarts it on the same data dir and port, and does so N times
(3 quick, 20 under MINIBROKER_RELIABILITY=full). Afterwards every partition is
read with raw Fetch, every batch CRC-checked, and:

- every acknowledged record is there exactly once, at the offset its
  acknowledgement named;
- per producer and partition the records are in send order with no duplicate,
  and nothing acknowledged is missing (no gap);
- records whose send failed (unacknowledged) may have landed, at most once;
  they are counted and reported.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from client import Producer
from client.accumulator import RecordHandle
from client.admin import create_topic
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from tests.reliability.conftest import read_partition, size

PRODUCERS = 3
PARTITIONS = 4
TOPIC = "crash-loop"
RECORDS_MAX = 1_000_000  # per producer: a cap; the kills must all land before it
PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable_idempotence": True,
    "max_in_flight_requests_per_connection": 5,
    "batch_size": 2_048,
    "linger_ms": 2,
    "retry_backoff_ms": 20,
    "retry_backoff_max_ms": 200,
    "reconnect_backoff_ms": 20,
    "reconnect_backoff_max_ms": 200,
    "request_timeout_ms": 10_000,
    "delivery_timeout_ms": 120_000,
}


def producer_loop(
    bootstrap: str,
    number: int,
    stop: threading.Event,
    out: list[list[RecordHandle]],
    metrics: list[dict[str, float]],
) -> None:
    """Send `p<number>-<partition>-<i>` records round-robin until `stop`, then flush."""
    handles: list[RecordHandle] = []
    with Producer(bootstrap, **PRODUCER_CONFIG) as producer:
        for i in range(RECORDS_MAX):
            if stop.is_set():
                break
            partition = i % PARTITIONS
            handles.append(
                producer.send(TOPIC, b"p%d-%d-%d" % (number, partition, i), partition=partition)
            )
            if i % 50 == 49:
                time.sleep(0.005)  # a steady stream, not one burst before the first kill
        producer.flush(120)
        metrics[number] = producer.metrics()
    out[number] = handles


def test_idempotent_producers_survive_a_kill9_loop(tmp_path: Path, backend: str, seed: int) -> None:
    rng = random.Random(seed)
    kills = size(3, 20)
    broker = BrokerProcess(tmp_path / "data", backend=backend).start()
    try:
        create_topic(broker.bootstrap, TOPIC, partitions=PARTITIONS)
        stop = threading.Event()
        results: list[list[RecordHandle]] = [[] for _ in range(PRODUCERS)]
        metrics: list[dict[str, float]] = [{} for _ in range(PRODUCERS)]
        threads = [
            threading.Thread(
                target=producer_loop, args=(broker.bootstrap, n, stop, results, metrics)
            )
            for n in range(PRODUCERS)
        ]
        for t in threads:
            t.start()
        try:
            for _ in range(kills):
                time.sleep(rng.uniform(0.2, 1.2))
                broker.restart(kill=True)
                assert broker.log_shows("previous_shutdown=unclean")
            time.sleep(0.5)  # some writes after the last restart
        finally:
            stop.set()
            for t in threads:
                t.join(180)
        assert not any(t.is_alive() for t in threads), "a producer did not finish within 180 s"
        # The kills hit the producers mid-stream, not after they ran out of records.
        assert all(len(h) < RECORDS_MAX for h in results), "a producer ran out before the kills"
        assert all(m["connection_failures"] + m["batch_retries"] > 0 for m in metrics), metrics

        with WireClient(broker.bootstrap) as c:
            stored = {p: read_partition(c, TOPIC, p) for p in range(PARTITIONS)}
        landed: dict[bytes, int] = {}
        for partition, records in stored.items():
            for offset, value in records:
                assert value not in landed, f"{value!r} stored twice in partition {partition}"
                landed[value] = offset
            for number in range(PRODUCERS):
                prefix = b"p%d-%d-" % (number, partition)
                sequence = [int(v[len(prefix) :]) for _, v in records if v.startswith(prefix)]
                assert sequence == sorted(sequence), f"{prefix!r} out of order"

        acknowledged = unacknowledged = unacknowledged_landed = 0
        for number, handles in enumerate(results):
            for i, handle in enumerate(handles):
                partition = i % PARTITIONS
                value = b"p%d-%d-%d" % (number, partition, i)
                assert handle.done(), f"{value!r} never resolved"
                if handle.exception() is None:
                    acknowledged += 1
                    meta = handle.get(0)
                    assert landed.get(value) == meta.offset, (value, meta, landed.get(value))
                else:
                    unacknowledged += 1
                    unacknowledged_landed += value in landed
        assert acknowledged > 0 and len(landed) == acknowledged + unacknowledged_landed
        print(
            f"crash loop seed={seed} backend={backend}: kills={kills} acknowledged={acknowledged} "
            f"unacknowledged={unacknowledged} (landed {unacknowledged_landed}) lost=0 duplicated=0"
        )
    finally:
        broker.kill()
