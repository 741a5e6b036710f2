"""The soak: mixed load against one broker for SOAK_SECONDS (default 600), a kill -9
and restart every SOAK_RESTART_SECONDS (default 60), sampled every SOAK_SAMPLE_SECONDS.

    make soak                      # 10 minutes
    SOAK_SECONDS=120 make soak     # a short check

Load: two raw-protocol producers (acks=-1 and acks=1, idempotent, pipelined 8
deep), a fetcher reading behind them, and a Metadata caller. Every sample records
produce throughput, p99 produce latency and the broker's VmRSS into
soak-out/soak.csv and plots soak-out/soak.png. Fails (exit 1) when the RSS trend,
a least-squares slope over the samples after the first restart, exceeds
SOAK_RSS_SLOPE_KIB_PER_MIN (default 1024 KiB/min), when any produce answers an
error, or when fewer records are read back than were acknowledged.
"""

from __future__ import annotations

import csv
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch
from tests.reliability.conftest import read_partition

SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
RESTART_S = float(os.environ.get("SOAK_RESTART_SECONDS", "60"))
SAMPLE_S = float(os.environ.get("SOAK_SAMPLE_SECONDS", "3"))
SLOPE_LIMIT = float(os.environ.get("SOAK_RSS_SLOPE_KIB_PER_MIN", "1024"))
OUT = Path(os.environ.get("SOAK_OUT", "soak-out"))
TOPIC = "soak"
PIPELINE = 8
VALUE = b"v" * 200
# Retention keeps the disk bounded (about 15 MB/s are written), so RSS is not
# judged against an ever larger log.
CONFIG = (
    "segment_bytes = 16777216\nretention_bytes = 67108864\nretention_check_interval_ms = 5000\n"
)


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    records: int = 0
    latencies: list[float] = field(default_factory=list)
    acked: dict[int, int] = field(default_factory=dict)  # partition -> acknowledged records
    errors: list[str] = field(default_factory=list)

    def take(self) -> tuple[int, list[float]]:
        with self.lock:
            out = (self.records, self.latencies)
            self.records, self.latencies = 0, []
            return out


def producer(
    broker: BrokerProcess, partition: int, acks: int, stop: threading.Event, s: Stats
) -> None:
    """One idempotent producer on one partition; reconnects (new id) after each restart."""
    while not stop.is_set():
        try:
            with WireClient(broker.bootstrap, timeout_s=10) as c:
                pid, epoch = c.init_producer()
                seq = 0
                while not stop.is_set():
                    sent = []
                    for _ in range(PIPELINE):
                        batch = values_batch(
                            [VALUE] * 10, producer_id=pid, producer_epoch=epoch, base_sequence=seq
                        )
                        seq += 10
                        c.send(
                            "Produce",
                            acks=acks,
                            timeout_ms=10_000,
                            topics=[
                                {
                                    "topic": TOPIC,
                                    "partitions": [{"partition": partition, "records": batch}],
                                }
                            ],
                        )
                        sent.append(time.monotonic())
                    for started in sent:
                        r = c.recv()["topics"][0]["partitions"][0]
                        with s.lock:
                            if r["error"]:
                                s.errors.append(f"produce error {r}")
                                return
                            s.records += 10
                            s.acked[partition] = s.acked.get(partition, 0) + 10
                            s.latencies.append(time.monotonic() - started)
        except OSError:
            time.sleep(0.2)  # the broker is restarting


def reader(broker: BrokerProcess, stop: threading.Event) -> None:
    offsets = {0: 0, 1: 0}
    while not stop.is_set():
        try:
            with WireClient(broker.bootstrap, timeout_s=10) as c:
                while not stop.is_set():
                    for partition in offsets:
                        f = c.fetch(TOPIC, partition, offsets[partition], max_wait_ms=100)
                        offsets[partition] = max(offsets[partition], f["high_watermark"] - 1000)
                    c.call("Metadata", topics=None)
        except OSError:
            time.sleep(0.2)


def slope_per_minute(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3:
        return 0.0
    return statistics.linear_regression(xs, ys).slope * 60


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] for r in rows]
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(9, 8))
    for ax, key, label in zip(
        axes,
        ("records_per_s", "p99_ms", "rss_mib"),
        ("produce records/s", "p99 produce latency (ms)", "broker RSS (MiB)"),
        strict=True,
    ):
        ax.plot(t, [r[key] for r in rows])
        ax.set_ylabel(label)
    axes[-1].set_xlabel("seconds")
    fig.suptitle(f"minibroker soak, restart every {RESTART_S:.0f} s")
    fig.savefig(path, dpi=90)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    config = root / "broker.toml"
    config.write_text(CONFIG)
    broker = BrokerProcess(root / "data", extra_args=["--config", str(config)]).start()
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic(TOPIC, 2) == 0
    stats = Stats()
    stop = threading.Event()
    threads = [
        threading.Thread(target=producer, args=(broker, 0, -1, stop, stats), daemon=True),
        threading.Thread(target=producer, args=(broker, 1, 1, stop, stats), daemon=True),
        threading.Thread(target=reader, args=(broker, stop), daemon=True),
    ]
    for t in threads:
        t.start()
    rows: list[dict[str, float]] = []
    started = last_restart = time.monotonic()
    restarts = 0
    try:
        while (now := time.monotonic()) - started < SECONDS:
            time.sleep(SAMPLE_S)
            records, latencies = stats.take()
            p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else 0.0
            assert broker.proc is not None
            rows.append(
                {
                    "t_s": round(time.monotonic() - started, 1),
                    "records_per_s": round(records / SAMPLE_S),
                    "p99_ms": round(p99 * 1000, 2),
                    "rss_mib": round(broker.rss_kib() / 1024, 1),
                    "restarts": restarts,
                }
            )
            print(rows[-1], flush=True)
            if now - last_restart >= RESTART_S:
                broker.restart(kill=True)
                restarts += 1
                last_restart = time.monotonic()
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    with (OUT / "soak.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, OUT / "soak.png")
    with WireClient(broker.bootstrap) as c:
        ends = c.call(
            "ListOffsets",
            isolation_level=0,
            topics=[
                {"topic": TOPIC, "partitions": [{"partition": p, "timestamp": -1} for p in (0, 1)]}
            ],
        )["topics"][0]["partitions"]
        stored = {e["partition"]: e["offset"] for e in ends}
        read_partition(c, TOPIC, 0, limit_s=120)  # what retention kept reads back, CRCs valid
    broker.terminate()
    shutil.rmtree(root)
    after_first = [r for r in rows if r["restarts"] >= 1] or rows
    slope = slope_per_minute(
        [r["t_s"] for r in after_first], [r["rss_mib"] * 1024 for r in after_first]
    )
    throughput = statistics.mean(r["records_per_s"] for r in rows)
    print(
        f"soak: {SECONDS:.0f} s, {restarts} restarts, {len(rows)} samples, mean {throughput:.0f} "
        f"records/s, max p99 {max(r['p99_ms'] for r in rows)} ms, RSS "
        f"{rows[0]['rss_mib']}..{max(r['rss_mib'] for r in rows)} MiB, RSS slope "
        f"{slope:.0f} KiB/min (limit {SLOPE_LIMIT:.0f}), stored {stored}; "
        f"wrote {OUT}/soak.csv and {OUT}/soak.png"
    )
    failures = list(stats.errors)
    if slope > SLOPE_LIMIT:
        failures.append(f"RSS grows {slope:.0f} KiB/min > {SLOPE_LIMIT:.0f}")
    if restarts < max(1, int(SECONDS // RESTART_S) - 1):
        failures.append(f"only {restarts} restarts")
    # kill -9 keeps the page cache: acks=1 records survive it as well as acks=-1 ones;
    # the log end counts every record ever appended, retention or not.
    lost = {p: stats.acked.get(p, 0) - n for p, n in stored.items() if n < stats.acked.get(p, 0)}
    if lost or not all(stored.values()):
        failures.append(f"acknowledged records lost: {lost}, stored {stored}")
    for failure in failures:
        print("SOAK FAILED:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
