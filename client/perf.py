"""`perf-produce` and `perf-consume`: load generators modelled on Kafka's perf-test tools.

perf-produce prints, every `--reporting-interval` ms (5 s) and at the end, lines in
the format of kafka-producer-perf-test:

    N records sent, X records/sec (Y MB/sec), A ms avg latency, M ms max latency.
    ... , P50 ms 50th, P95 ms 95th, P99 ms 99th, P999 ms 99.9th.

perf-consume prints kafka-consumer-perf-test's summary at the end, and a plain
progress line every `--reporting-interval` ms before it. Both show a live progress
line on a terminal (client/progress.py), and on Ctrl-C they print their summary of
what was done so far and exit 130.

Latency is the time from send() (or send_batch()) to the delivery callback. To
keep the tool from measuring its own callbacks, per-record sends carry a
callback on a sample of records (at most ~100,000 samples per run); with
`--api batch` every call has one.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from typing import Any, TextIO

from client.config import ConsumerConfig, ProducerConfig, settings_for
from client.consumer import Consumer
from client.interrupt import ctrl_c
from client.producer import Producer
from client.progress import MB, REPORT_INTERVAL_MS, Progress
from client.types import TopicPartition

SAMPLES_MAX = 100_000


class Stats:
    """Latency samples and windowed throughput, like Kafka's ProducerPerformance.Stats."""

    def __init__(self, record_size: int, progress: Progress, interval_ms: float) -> None:
        self.record_size = record_size
        self.progress = progress
        self.interval_s = interval_ms / 1000
        self.start = time.monotonic()
        self.latencies: list[float] = []
        self.count = 0
        self._lock = threading.Lock()
        self._window_start = self.start
        self._window_count = 0
        self._window_latency_sum = 0.0
        self._window_latency_max = 0.0
        self._window_samples = 0

    def record(self, sent_at: float, records: int, sampled: bool = True) -> None:
        """`records` were acknowledged; the latency of a sampled one is measured."""
        now = time.monotonic()
        latency_ms = (now - sent_at) * 1000
        with self._lock:
            self.count += records
            self._window_count += records
            if sampled:
                self.latencies.append(latency_ms)
                self._window_samples += 1
                self._window_latency_sum += latency_ms
                self._window_latency_max = max(self._window_latency_max, latency_ms)

    def restart(self) -> None:
        """Start the clock now, once set-up (metadata, topic creation) is done."""
        self.start = self._window_start = time.monotonic()
        self.progress.restart()

    def tick(self) -> None:
        """Print the window's line every interval, and move the live line on a terminal."""
        now = time.monotonic()
        with self._lock:
            if now - self._window_start >= self.interval_s:
                elapsed = now - self._window_start
                avg = self._window_latency_sum / max(self._window_samples, 1)
                self._line(self._window_count, elapsed, avg, self._window_latency_max, ".")
                self._window_start = now
                self._window_count = 0
                self._window_samples = 0
                self._window_latency_sum = 0.0
                self._window_latency_max = 0.0
            count = self.count
        self.progress.show(count, count * self.record_size)

    def final(self) -> dict[str, float]:
        """The closing line (also after Ctrl-C: the records acknowledged so far)."""
        self.progress.close()
        elapsed = time.monotonic() - self.start
        latencies = sorted(self.latencies)
        avg = sum(latencies) / len(latencies) if latencies else 0.0
        worst = latencies[-1] if latencies else 0.0

        def pct(p: float) -> int:
            return (
                int(latencies[min(int(len(latencies) * p), len(latencies) - 1)]) if latencies else 0
            )

        tail = (
            f", {pct(0.5)} ms 50th, {pct(0.95)} ms 95th, {pct(0.99)} ms 99th, "
            f"{pct(0.999)} ms 99.9th."
        )
        self._line(self.count, elapsed, avg, worst, tail)
        return {
            "records": self.count,
            "seconds": elapsed,
            "records_per_sec": self.count / elapsed if elapsed else 0.0,
            "mb_per_sec": self.count * self.record_size / MB / elapsed if elapsed else 0.0,
            "latency_avg_ms": avg,
            "latency_max_ms": worst,
            "latency_p50_ms": pct(0.5),
            "latency_p99_ms": pct(0.99),
        }

    def _line(self, count: int, elapsed: float, avg: float, worst: float, tail: str) -> None:
        rate = count / elapsed if elapsed else 0.0
        self.progress.write(
            f"{count} records sent, {rate:.1f} records/sec "
            f"({rate * self.record_size / MB:.2f} MB/sec), {avg:.1f} ms avg latency, "
            f"{worst:.1f} ms max latency{tail}"
        )


class Throttle:
    """Kafka's ThroughputThrottler: sleep when ahead of `per_second` (<= 0: unlimited)."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self.start = time.monotonic()

    def wait(self, sent: int) -> None:
        if self.per_second <= 0:
            return
        ahead = sent / self.per_second - (time.monotonic() - self.start)
        if ahead > 0.001:
            time.sleep(ahead)


def payloads(record_size: int, count: int = 64) -> list[bytes]:
    """A few random payloads of uppercase letters, cycled through like Kafka's tool."""
    rng = random.Random(0)
    letters = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return [bytes(rng.choice(letters) for _ in range(record_size)) for _ in range(count)]


STOP_CHECK_MASK = 1023
"""`_send_records` looks for Ctrl-C once every 1,024 records."""


def perf_produce(args: argparse.Namespace, out: TextIO = sys.stdout) -> dict[str, float]:
    """Send --num-records records; KeyboardInterrupt (Ctrl-C) stops it, prints the closing
    line for the records acknowledged so far, and goes on up."""
    config: dict[str, Any] = {
        "acks": args.acks,
        "batch_size": args.batch_size,
        "linger_ms": args.linger_ms,
        "enable_idempotence": args.idempotence == "on",
        "compression_type": args.compression_type,
        "max_request_size": max(args.max_request_size, args.batch_size),
        "buffer_memory": max(32 * MB, 4 * args.max_request_size),
    }
    values = payloads(args.record_size)
    progress = Progress(out, "sent", total=args.num_records, plain=False)
    stats = Stats(args.record_size, progress, args.reporting_interval)
    interrupted = False
    settings = settings_for(ProducerConfig, config, args.client_settings, args.client_config)
    with Producer(args.bootstrap_server, **settings) as producer:
        producer.partitions_for(args.topic)  # metadata (and auto-creation) outside the clock
        stats.restart()
        throttle = Throttle(args.throughput)
        try:
            with ctrl_c() as stop:
                if args.api == "send":
                    _send_records(producer, args, values, stats, throttle, stop)
                else:
                    _send_batches(producer, args, values, stats, throttle, stop)
            if stop.is_set():
                raise KeyboardInterrupt
            producer.flush()
        except KeyboardInterrupt:
            interrupted = True
            producer.close(0)  # what is not acknowledged yet is not waited for
    result = stats.final()
    if interrupted:
        raise KeyboardInterrupt
    result.update(producer.metrics())
    return result


def _send_records(
    producer: Producer,
    args: argparse.Namespace,
    values: list[bytes],
    stats: Stats,
    throttle: Throttle,
    stop: threading.Event,
) -> None:
    total = args.num_records
    every = max(1, total // SAMPLES_MAX)
    send = producer.send
    topic, partition = args.topic, args.partition
    n_values = len(values)
    for i in range(total):
        if not i & STOP_CHECK_MASK and stop.is_set():
            return
        if i % every == 0:
            sent_at = time.monotonic()

            def acked(error: BaseException | None, _md: Any, sent_at: float = sent_at) -> None:
                if error is None:
                    stats.record(sent_at, every)

            send(topic, values[i % n_values], partition=partition, on_delivery=acked)
            if i % (every * 64) == 0:
                stats.tick()
                throttle.wait(i)
        else:
            send(topic, values[i % n_values], partition=partition)


def _send_batches(
    producer: Producer,
    args: argparse.Namespace,
    values: list[bytes],
    stats: Stats,
    throttle: Throttle,
    stop: threading.Event,
) -> None:
    total = args.num_records
    per_call = args.records_per_call
    column = (values * (per_call // len(values) + 1))[:per_call]
    sent = 0
    while sent < total and not stop.is_set():
        n = min(per_call, total - sent)

        def acked(
            error: BaseException | None, _md: Any, sent_at: float = time.monotonic(), n: int = n
        ) -> None:
            if error is None:
                stats.record(sent_at, n)

        producer.send_batch(
            args.topic,
            column if n == per_call else column[:n],
            partition=args.partition,
            on_delivery=acked,
        )
        sent += n
        stats.tick()
        throttle.wait(sent)


def perf_consume(args: argparse.Namespace, out: TextIO = sys.stdout) -> dict[str, float]:
    """Read --messages records from the beginning; print kafka-consumer-perf-test's line,
    also for what was read when KeyboardInterrupt (Ctrl-C) stops it, which then goes on up."""
    interrupted = False
    own = {
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 100,
        "max_partition_fetch_bytes": args.fetch_size,
    }
    settings = settings_for(ConsumerConfig, own, args.client_settings, args.client_config)
    with (
        Consumer(bootstrap_servers=args.bootstrap_server, **settings) as consumer,
        ctrl_c() as stop,
    ):
        partitions = [
            TopicPartition(args.topic, p) for p in consumer.partitions_for_topic(args.topic)
        ]
        consumer.assign(partitions)
        target = args.messages
        progress = Progress(out, "consumed", total=target, interval_ms=args.reporting_interval)
        count = 0
        size = 0
        start = progress.start
        last_data = start
        try:
            while count < target:
                if stop.is_set():
                    raise KeyboardInterrupt
                batch = consumer.poll(timeout_ms=100, max_records=100_000)
                now = time.monotonic()
                if batch:
                    last_data = now
                    for records in batch.values():
                        count += len(records)
                        size += sum(len(r.value or b"") for r in records)
                elif (now - last_data) * 1000 >= args.timeout_ms:
                    break
                progress.show(count, size)
        except KeyboardInterrupt:
            interrupted = True
        progress.close()
        elapsed = max(last_data - start, 1e-9)
    out.write(
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec\n"
        f"{_stamp(start)}, {_stamp(last_data)}, {size / MB:.4f}, {size / MB / elapsed:.4f}, "
        f"{count}, {count / elapsed:.4f}\n"
    )
    out.flush()
    if interrupted:
        raise KeyboardInterrupt
    return {
        "records": count,
        "seconds": elapsed,
        "records_per_sec": count / elapsed,
        "mb_per_sec": size / MB / elapsed,
    }


def _stamp(monotonic: float) -> str:
    wall = time.time() - (time.monotonic() - monotonic)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall)) + f":{int(wall % 1 * 1000):03d}"


def add_produce_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", required=True)
    parser.add_argument("--num-records", type=int, required=True)
    parser.add_argument("--record-size", type=int, default=100, help="bytes per record value")
    parser.add_argument(
        "--throughput", type=float, default=-1, help="records/s to aim for; -1 for no limit"
    )
    parser.add_argument("--acks", default="all", choices=["all", "-1", "1", "0"])
    parser.add_argument("--batch-size", type=int, default=16384)
    parser.add_argument("--linger-ms", type=float, default=0)
    parser.add_argument("--max-request-size", type=int, default=1024 * 1024)
    parser.add_argument("--idempotence", choices=["on", "off"], default="on")
    parser.add_argument(
        "--compression-type", default="none", choices=["none", "gzip", "zstd", "lz4"]
    )
    parser.add_argument("--api", choices=["send", "batch"], default="send")
    parser.add_argument(
        "--records-per-call", type=int, default=10_000, help="records per send_batch() call"
    )
    parser.add_argument("--partition", type=int, default=None, help="default: the partitioner's")
    add_reporting_interval(parser)


def add_consume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", required=True)
    parser.add_argument("--messages", type=int, required=True, help="records to read")
    parser.add_argument(
        "--timeout-ms", type=int, default=10_000, help="give up when idle this long"
    )
    parser.add_argument("--fetch-size", type=int, default=1024 * 1024)
    add_reporting_interval(parser)


def add_reporting_interval(parser: argparse.ArgumentParser) -> None:
    """Kafka's perf tools' option (and default), for every command that reports progress."""
    parser.add_argument(
        "--reporting-interval",
        type=int,
        default=REPORT_INTERVAL_MS,
        metavar="MS",
        help="how often to print a progress line (a terminal also shows a live one)",
    )
