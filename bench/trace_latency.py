"""Where an open-loop record waits: stage timestamps along its path, for the latency tail.

A sampling profile shows where CPU goes, not where a record waits. This runs the
peers suite's open loop (100-byte records at a fixed rate, one partition, timed from
each record's scheduled send time to its acknowledgement) against a real broker
and stamps every batch on its way:

    scheduled -> appended (the caller's send) -> drained (the sender took the sealed
    batch) -> written (the Produce request left in one send) -> answered (the
    response was decoded) -> acked (the batch's done callback ran, as the peers suite
    times it)

The sender's two methods are wrapped for the run only; nothing in the client
changes. Each record's latency is split into those stages, and the table compares
the median record with the records of the slowest 1%: the stage that grows in the
tail is where the tail comes from. The broker's own view is read from /metrics
(Produce duration from decoding to the answer being ready, fsync duration and
batches per fsync), as histogram-bucket percentiles for the run.

    PYTHONPATH=$PWD .venv/bin/python -m bench.trace_latency [--load-pct 50] [--acks all]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.bench_peers import MB_ACKS_1, MB_ACKS_ALL, _values
from bench.open_loop import ACK_WAIT_S, AckTimes, run_open_loop_acked
from bench.stats import min_max, percentile
from client import Producer
from client.accumulator import ProducerBatch
from client.admin import create_topic
from client.sender import Sender
from harness.broker_process import BrokerProcess

STAGES = ("caller", "accumulator", "send", "broker+network", "wake")
STAGE_MEANING = {
    "caller": "scheduled -> appended: the caller's thread got round to send()",
    "accumulator": "appended -> drained: linger, batch filling, in-flight cap, sender's turn",
    "send": "drained -> written: request encoded and written to the socket",
    "broker+network": "written -> answered: the broker's work and fsync, both ways on loopback",
    "wake": "answered -> acked: the batch finished and its done callback ran",
}
MAX_RATE_RECORDS = 300_000


class _Stamps:
    """Per-batch stage times (perf_counter seconds), filled by the wrapped sender.

    Batches are known by a number the caller's thread gives each as it opens, not
    held: holding them kept every batch's records alive, and the collector's passes
    over them stalled the producer for 200 ms (a tracer's artefact, seen here)."""

    def __init__(self) -> None:
        self.number_of: dict[int, int] = {}  # id() of a live batch -> its number
        self.drained: dict[int, float] = {}
        self.written: dict[int, float] = {}
        self.answered: dict[int, float] = {}
        self.in_flight_at_drain: dict[int, int] = {}


@contextlib.contextmanager
def _traced_sender(stamps: _Stamps) -> Iterator[None]:
    """Wrap Sender._send_produce and Sender._on_produce_answer to stamp each batch."""
    send_produce = Sender._send_produce
    on_answer = Sender._on_produce_answer

    async def traced_send(
        self: Sender, conn: Any, drained: list[list[ProducerBatch]], trailer: Any = None
    ) -> None:
        now = time.perf_counter()
        for batches in drained:
            for batch in batches:
                stamps.drained[stamps.number_of.get(id(batch), -1)] = now
                stamps.in_flight_at_drain[stamps.number_of.get(id(batch), -1)] = (
                    self._produce_in_flight
                )
        await send_produce(self, conn, drained, trailer)
        now = time.perf_counter()
        for batches in drained:
            for batch in batches:
                stamps.written[stamps.number_of.get(id(batch), -1)] = now

    def traced_answer(self: Sender, batches: list[ProducerBatch], *args: Any) -> None:
        now = time.perf_counter()
        for batch in batches:
            stamps.answered[stamps.number_of.get(id(batch), -1)] = now
        on_answer(self, batches, *args)

    Sender._send_produce = traced_send  # type: ignore[method-assign]
    Sender._on_produce_answer = traced_answer  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        Sender._send_produce = send_produce  # type: ignore[method-assign]
        Sender._on_produce_answer = on_answer  # type: ignore[method-assign]


def max_rate(bootstrap: str, config: dict[str, Any], topic: str) -> float:
    """Records/s of per-record send() flat out (as the peers suite measures it)."""
    create_topic(bootstrap, topic, partitions=1)
    values = _values()
    with Producer(bootstrap, **config) as producer:
        producer.partitions_for(topic)
        started = time.perf_counter()
        for i in range(MAX_RATE_RECORDS):
            producer.send(topic, values[i & 255], partition=0)
        producer.flush(ACK_WAIT_S)
        return MAX_RATE_RECORDS / (time.perf_counter() - started)


def traced_open_loop(
    bootstrap: str, config: dict[str, Any], topic: str, rate: float, records: int
) -> dict[str, list[Any]]:
    """One open-loop run; per record, the seconds spent in each of STAGES and in all."""
    create_topic(bootstrap, topic, partitions=1)
    values = _values()
    stamps = _Stamps()
    acks = AckTimes()
    appended = [0.0] * records
    batch_of = [-1] * records  # each record's batch number
    gc_pauses: list[tuple[float, int, float]] = []  # (at, generation, seconds)
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            gc_started[0] = now
        else:
            gc_pauses.append((now, info["generation"], now - gc_started[0]))

    slow_sends: list[tuple[float, float]] = []  # (at, seconds) of send_due calls over 5 ms
    gc.callbacks.append(on_gc)
    with (
        contextlib.ExitStack() as undo,
        _traced_sender(stamps),
        Producer(bootstrap, **config) as producer,
    ):
        undo.callback(gc.callbacks.remove, on_gc)
        producer.partitions_for(topic)
        send = producer.send

        def send_due(first: int, stop: int) -> None:
            now = time.perf_counter()
            for i in range(first, stop):
                handle = send(topic, values[i & 255], partition=0)
                appended[i] = now
                if handle[1] == 0:  # one partition: a new batch holds every record that follows
                    stamps.number_of[id(handle[0])] = i
                    acks.opened(i, handle)
                batch_of[i] = stamps.number_of[id(handle[0])]
            acks.sent = stop
            took = time.perf_counter() - now
            if took > 0.005:
                slow_sends.append((now, took))

        t0 = run_open_loop_acked(producer, send_due, acks, rate, records)
    acked_at = {first: at for first, at in acks.acked_at.items() if at}
    out: dict[str, list[Any]] = {stage: [] for stage in (*STAGES, "total", "at_s")}
    batch_acked: dict[int, float] = {}
    for i, key in enumerate(batch_of):
        if key < 0:
            continue
        if i in acked_at:
            batch_acked[key] = acked_at[i]
        if key not in batch_acked or key not in stamps.answered:
            continue  # never acknowledged in time: the peers suite counts it at the end
        scheduled = t0 + i / rate
        points = (
            scheduled,
            appended[i],
            stamps.drained[key],
            stamps.written[key],
            stamps.answered[key],
            batch_acked[key],
        )
        for stage, start, end in zip(STAGES, points, points[1:], strict=False):
            out[stage].append(end - start)
        out["total"].append(points[-1] - scheduled)
        out["at_s"].append(i / rate)
    out["in_flight_at_drain"] = [float(v) for v in stamps.in_flight_at_drain.values()]
    out["gc"] = [
        f"{at - t0:.2f} s gen{gen} {sec * 1000:.1f} ms" for at, gen, sec in gc_pauses if sec > 0.002
    ]
    out["slow_sends"] = [f"{at - t0:.2f} s {sec * 1000:.0f} ms" for at, sec in slow_sends]
    return out


def tail_breakdown(stages: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Each stage's median over all records and over the slowest 1% (in ms)."""
    total = stages["total"]
    p99 = percentile(total, 0.99)
    tail = [i for i, t in enumerate(total) if t >= p99]
    rows = []
    for stage in (*STAGES, "total"):
        values = stages[stage]
        rows.append(
            {
                "stage": stage,
                "median_ms": statistics.median(values) * 1000,
                "p99_ms": percentile(values, 0.99) * 1000,
                # Means, not medians: they add up to the total's, stage by stage.
                "in_slowest_1pct_ms": statistics.fmean(values[i] for i in tail) * 1000,
                "meaning": STAGE_MEANING.get(stage, "scheduled -> acked"),
            }
        )
    return rows


def tail_windows(stages: dict[str, list[Any]], window_s: float = 0.05) -> list[str]:
    """When the slowest 1% were scheduled: the busiest windows, as "start s: records"."""
    total = stages["total"]
    p99 = percentile(total, 0.99)
    counts: dict[int, int] = {}
    for at_s, t in zip(stages["at_s"], total, strict=True):
        if t >= p99:
            counts[int(at_s / window_s)] = counts.get(int(at_s / window_s), 0) + 1
    busiest = sorted(counts.items(), key=lambda kv: -kv[1])[:6]
    return [f"{k * window_s:.2f} s: {n:,}" for k, n in sorted(busiest)]


def broker_histograms(metrics_port: int) -> dict[str, list[tuple[float, float]]]:
    """Cumulative buckets (le, count) of the broker's Produce, fsync and group-commit
    histograms, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    wanted = {
        "minibroker_request_duration_seconds": "produce_s",
        "minibroker_fsync_duration_seconds": "fsync_s",
        "minibroker_group_commit_batches": "batches_per_fsync",
    }
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in wanted.values()}
    for family in text_string_to_metric_families(text):
        name = wanted.get(family.name)
        if name is None:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                continue
            if name == "produce_s" and sample.labels.get("api") != "Produce":
                continue
            out[name].append((float(sample.labels["le"]), sample.value))
    return out


def bucket_percentile(
    after: list[tuple[float, float]], before: list[tuple[float, float]], pct: float
) -> str:
    """The bucket bound under which `pct`% of the run's observations fell ("<= x")."""
    counts = dict(before)
    run = [(le, n - counts.get(le, 0.0)) for le, n in after]
    if not run or run[-1][1] == 0:
        return "-"
    target = run[-1][1] * pct / 100
    for le, n in run:
        if n >= target:
            return f"<= {le:g}"
    return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="trio", choices=("trio", "asyncio"))
    parser.add_argument("--acks", default="all", choices=("all", "1"))
    parser.add_argument("--load-pct", type=float, default=50)
    parser.add_argument("--rate", type=float, help="records/s (default: load-pct of the max)")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--linger-ms", type=float)
    parser.add_argument(
        "--switch-interval-ms", type=float, help="sys.setswitchinterval for this process"
    )
    args = parser.parse_args()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    config = dict(MB_ACKS_ALL if args.acks == "all" else MB_ACKS_1)
    if args.linger_ms is not None:
        config["linger_ms"] = args.linger_ms
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", backend=args.backend).start()
        try:
            rate = args.rate or max_rate(broker.bootstrap, config, "max") * args.load_pct / 100
            print(f"rate {rate:,.0f} records/s, config {config}, backend {args.backend}")
            for run in range(args.runs):
                assert broker.metrics_port is not None
                before = broker_histograms(broker.metrics_port)
                stages = traced_open_loop(
                    broker.bootstrap, config, f"trace-{run}", rate, int(rate * args.seconds)
                )
                after = broker_histograms(broker.metrics_port)
                print(f"\nrun {run + 1}: {len(stages['total']):,} records")
                print(f"{'stage':16} {'median':>8} {'p99':>8} {'slowest 1% mean':>16}  (ms)")
                for row in tail_breakdown(stages):
                    print(
                        f"{row['stage']:16} {row['median_ms']:8.2f} {row['p99_ms']:8.2f}"
                        f" {row['in_slowest_1pct_ms']:16.2f}  {row['meaning']}"
                    )
                print(f"slowest 1% scheduled in: {', '.join(tail_windows(stages))}")
                print(f"gc pauses over 2 ms: {stages['gc'] or 'none'}")
                print(f"send_due calls over 5 ms: {stages['slow_sends'][:8] or 'none'}")
                flights = stages["in_flight_at_drain"]
                print(
                    f"requests in flight when a batch was drained: median "
                    f"{statistics.median(flights):g}, {min_max(flights, 0)}"
                )
                for name in after:
                    print(
                        f"broker {name}: p50 {bucket_percentile(after[name], before[name], 50)}"
                        f", p99 {bucket_percentile(after[name], before[name], 99)}"
                    )
        finally:
            broker.kill()


if __name__ == "__main__":
    main()
