"""`perf-produce` and `perf-consume`: load generators modelled on Kafka's perf-test tools.

perf-produce prints, every 5 s and at the end, lines in the format of
kafka-producer-perf-test:

    N records sent, X records/sec (Y MB/sec), A ms avg latency, M ms max latency.
    ... , P50 ms 50th, P95 ms 95th, P99 ms 99th, P999 ms 99.9th.

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

from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition

REPORT_INTERVAL_S = 5.0
SAMPLES_MAX = 100_000
MB = 1024 * 1024


class Stats:
    """Latency samples and windowed throughput, like Kafka's ProducerPerformance.Stats."""

    def __init__(self, total: int, record_size: int, out: TextIO) -> None:
        self.total = total
        self.record_size = record_size
        self.out = out
        self.start = time.monotonic()
        self.latencies: list[float] = []
        self.count = 0
        self._lock = threading.Lock()
        self._window_start = self.start
        self._window_count = 0
        self._window_latency_sum = 0.0
        self._window_latency_max = 0.0
        self._window_samples = 0
        self._progress_shown = 0.0

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

    def tick(self) -> None:
        """Print the window's line every REPORT_INTERVAL_S, and a progress bar on a TTY."""
        now = time.monotonic()
        with self._lock:
            if now - self._window_start >= REPORT_INTERVAL_S:
                elapsed = now - self._window_start
                avg = self._window_latency_sum / max(self._window_samples, 1)
                self._line(self._window_count, elapsed, avg, self._window_latency_max, ".")
                self._window_start = now
                self._window_count = 0
                self._window_samples = 0
                self._window_latency_sum = 0.0
                self._window_latency_max = 0.0
        if self.out.isatty() and now - self._progress_shown > 0.2:
            self._progress_shown = now
            done = self.count / max(self.total, 1)
            bar = "#" * int(done * 40)
            self.out.write(f"\r[{bar:<40}] {done:6.1%} {self.count}/{self.total}\r")
            self.out.flush()

    def final(self) -> dict[str, float]:
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
        clear = "\r" + " " * 70 + "\r" if self.out.isatty() else ""
        self.out.write(
            f"{clear}{count} records sent, {rate:.1f} records/sec "
            f"({rate * self.record_size / MB:.2f} MB/sec), {avg:.1f} ms avg latency, "
            f"{worst:.1f} ms max latency{tail}\n"
        )
        self.out.flush()


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


def perf_produce(args: argparse.Namespace, out: TextIO = sys.stdout) -> dict[str, float]:
    config: dict[str, Any] = {
        "acks": args.acks,
        "batch_size": args.batch_size,
        "linger_ms": args.linger_ms,
        "enable_idempotence": args.idempotence == "on",
        "compression_type": args.compression_type,
        "max_request_size": max(args.max_request_size, args.batch_size),
        "buffer_memory": max(32 * MB, 4 * args.max_request_size),
    }
    total = args.num_records
    values = payloads(args.record_size)
    stats = Stats(total, args.record_size, out)
    throttle = Throttle(args.throughput)
    with Producer(args.bootstrap_server, **config) as producer:
        producer.partitions_for(args.topic)  # metadata (and auto-creation) outside the clock
        stats.start = time.monotonic()
        if args.api == "send":
            _send_records(producer, args, values, stats, throttle)
        else:
            _send_batches(producer, args, values, stats, throttle)
        producer.flush()
    result = stats.final()
    result.update(producer.metrics())
    return result


def _send_records(
    producer: Producer,
    args: argparse.Namespace,
    values: list[bytes],
    stats: Stats,
    throttle: Throttle,
) -> None:
    total = args.num_records
    every = max(1, total // SAMPLES_MAX)
    send = producer.send
    topic, partition = args.topic, args.partition
    n_values = len(values)
    for i in range(total):
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
) -> None:
    total = args.num_records
    per_call = args.records_per_call
    column = (values * (per_call // len(values) + 1))[:per_call]
    sent = 0
    while sent < total:
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
    """Read --messages records from the beginning; print kafka-consumer-perf-test's line."""
    with Consumer(
        bootstrap_servers=args.bootstrap_server,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=args.fetch_size,
    ) as consumer:
        partitions = [
            TopicPartition(args.topic, p) for p in consumer.partitions_for_topic(args.topic)
        ]
        consumer.assign(partitions)
        target = args.messages
        count = 0
        size = 0
        start = time.monotonic()
        last_data = start
        while count < target:
            batch = consumer.poll(timeout_ms=100, max_records=100_000)
            now = time.monotonic()
            if not batch:
                if (now - last_data) * 1000 >= args.timeout_ms:
                    break
                continue
            last_data = now
            for records in batch.values():
                count += len(records)
                size += sum(len(r.value or b"") for r in records)
            if out.isatty():
                out.write(f"\r{count}/{target} records\r")
        elapsed = max(last_data - start, 1e-9)
    out.write(
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec\n"
        f"{_stamp(start)}, {_stamp(last_data)}, {size / MB:.4f}, {size / MB / elapsed:.4f}, "
        f"{count}, {count / elapsed:.4f}\n"
    )
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


def add_consume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", required=True)
    parser.add_argument("--messages", type=int, required=True, help="records to read")
    parser.add_argument(
        "--timeout-ms", type=int, default=10_000, help="give up when idle this long"
    )
    parser.add_argument("--fetch-size", type=int, default=1024 * 1024)
