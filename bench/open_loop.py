"""The open loop that bench_client's and bench_peers' latency figures come from.

Records are due on a fixed schedule (record k at t0 + k/rate) and each is timed from
its scheduled send time, not its actual send, so a stall is not hidden by coordinated
omission; the SDK producer's acknowledgements are stamped per batch (`AckTimes`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from client import Producer
from client.accumulator import RecordHandle
from client.admin import create_topic

ACK_WAIT_S = 30.0  # bound on waiting for outstanding acknowledgements


def records_due(t0: float, rate: float, records: int, now: float) -> int:
    """How many records are due by `now` on the fixed schedule (record k at t0 + k/rate)."""
    return max(0, min(records, int((now - t0) * rate) + 1))


def scheduled_latencies(acked: list[float], t0: float, rate: float, end: float) -> list[float]:
    """Seconds from each record's scheduled time to its ack; one never acknowledged
    counts as acknowledged at `end` (a lower bound, still in the tail)."""
    return [(a or end) - (t0 + k / rate) for k, a in enumerate(acked)]


def run_open_loop(send: Callable[[int, int], None], rate: float, records: int) -> float:
    """Call `send(first, stop)` with the records due, sleeping until the next is due;
    returns t0. A send that blocks makes the next call carry everything due meanwhile."""
    t0 = time.perf_counter() + 0.005
    deadline = t0 + records / rate + ACK_WAIT_S
    sent = 0
    while sent < records and time.perf_counter() < deadline:
        due = records_due(t0, rate, records, time.perf_counter())
        if due > sent:
            send(sent, due)
            sent = due
        else:
            time.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
    return t0


class AckTimes:
    """Each batch's acknowledgement time, stamped on the producer's I/O thread.

    Every record of a batch is acknowledged at once, so a done callback on the record
    that opens each batch times them all. It runs as the answer is handled, as
    kafka-producer-perf-test's callback does: a thread waiting on the handles instead
    would add its own wait for the GIL (up to the 5 ms switch interval) to every figure,
    and an `on_delivery` per record would cost the producer a third of its throughput."""

    def __init__(self) -> None:
        self.firsts: list[int] = []  # the first record of each batch, in order
        self.acked_at: dict[int, float] = {}  # first record -> perf_counter; 0.0: failed
        self.sent = 0  # records sent so far: `send_due` sets it

    def opened(self, first: int, handle: RecordHandle) -> None:
        """`first`, just sent, opened a batch: time its acknowledgement."""
        self.firsts.append(first)
        handle.add_done_callback(partial(self._stamp, first))

    def _stamp(self, first: int, handle: RecordHandle) -> None:
        self.acked_at[first] = time.perf_counter() if handle.exception() is None else 0.0

    def per_record(self, records: int) -> list[float]:
        """Each record's ack time: its batch's, or 0.0 (failed, never acknowledged, or
        never sent because the loop ran out of time)."""
        acked = [0.0] * records
        for first, stop in zip(self.firsts, [*self.firsts[1:], self.sent], strict=True):
            acked[first:stop] = [self.acked_at.get(first, 0.0)] * (stop - first)
        return acked


def run_open_loop_acked(
    producer: Producer,
    send_due: Callable[[int, int], None],
    acks: AckTimes,
    rate: float,
    records: int,
) -> float:
    """`run_open_loop`, then every ack (`send_due` calls `acks.opened` for each batch and
    sets `acks.sent`); returns t0. Once `flush` returns every callback has run: the I/O
    thread runs a batch's callbacks as it finishes it, before `flush` may resume."""
    t0 = run_open_loop(send_due, rate, records)
    producer.flush(ACK_WAIT_S)
    return t0


def producer_latencies(
    bootstrap: str,
    topic: str,
    values: list[bytes],
    config: dict[str, Any],
    rate: float,
    records: int,
) -> list[float]:
    """Each record's latency in s, from its scheduled send time to its ack, of the SDK
    producer's open loop at `rate` records/s to partition 0 of a new one-partition
    `topic` (`values` cycled, 256 of them)."""
    create_topic(bootstrap, topic, partitions=1)
    acks = AckTimes()
    with Producer(bootstrap, **config) as producer:
        producer.partitions_for(topic)
        send = producer.send

        def send_due(first: int, stop: int) -> None:
            for i in range(first, stop):
                handle = send(topic, values[i & 255], partition=0)
                if handle[1] == 0:  # the first record of a new batch
                    acks.opened(i, handle)
            acks.sent = stop

        t0 = run_open_loop_acked(producer, send_due, acks, rate, records)
        end = time.perf_counter()
    return scheduled_latencies(acks.per_record(records), t0, rate, end)
