"""Scaling curves: each cost of the broker shown against the work that causes it.

- Produce throughput, broker CPU per batch and broker RSS as one topic's partitions go
  1 -> 100 -> 1,000 (4 producers spread over them), and as producers go 1 -> 4 -> 16
  (into 16 partitions, acks=1 and acks=-1). Load comes from bench_broker's raw-wire
  generator (pre-encoded 16 KiB batches, pipelined); each producer is a forked process
  with its own connection and producer id. Every point has a broker of its own, so its
  RSS is that point's alone, and rounds visit the points in rotating order.
- Fetch latency of one 1 MiB Fetch from the head (the batches just written) and from the
  tail (offset 0, its pages evicted from the page cache before every fetch) as one
  partition's log grows to 0.1, 1 and 10 GiB (times the scale).
- Restart time at each of those log sizes, after kill -9 (page cache kept, as a process
  crash leaves it), after kill -9 with the log's pages dropped (as a reboot leaves them)
  and after SIGTERM: until the broker listens, until a Fetch of the newest batch answers,
  and the recovery time the broker logs, against the bytes recovery validates (every
  segment from the one holding the recovery point, which is written on roll and close).

The topic's segment_bytes is 1 GiB times the scale (the default at scale 1), so the log
spans the same number of segments at every scale: recovery is bounded by segments.

    python -m bench.bench_scaling --scale 0.1 --out /tmp/scaling
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import progress
from bench.bench_broker import (
    BATCH_BYTES,
    WINDOW,
    _cpu_s,
    _frames,
    _pipeline,
    _rss_bytes,
)
from bench.stats import min_max, percentile, verdict
from broker.storage.log import _read_recovery_point, _scan_from
from broker.storage.segment import LOG_SUFFIX
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from protocol.batch import build_batch_from_columns
from protocol.framing import encode_frame

MIB = 1 << 20
GIB = 1 << 30
ROUNDS = 5
# Restarts and fetch rounds cost more wall time each and swing less: the minimum of 3.
LOG_ROUNDS = 3
PARTITION_STEPS = (1, 100, 1000)
PARTITION_CURVE_PRODUCERS = 4
PRODUCER_STEPS = (1, 4, 16)
PRODUCER_CURVE_PARTITIONS = 16
# 16 KiB batches per point and round at scale 1: about half a second of broker work.
CURVE_BATCHES = 8192
LOG_STEPS_GIB = (0.1, 1.0, 10.0)
# The log is written in 256 KiB batches of 1,000-byte records: the broker's CPU per byte
# is lowest around there (1 MiB batches cost about twice as much per byte here).
GROW_BATCH_BYTES = 256 * 1024
GROW_RECORD_BYTES = 1000
FETCH_MAX_BYTES = 1 << 20
# Fetches per round and end at scale 1; never under 100, so a p99 is not just the slowest.
FETCHES = 200
RESTART_TIMEOUT_S = 120.0
LOAD_TIMEOUT_S = 300.0
# (name, SIGKILL rather than SIGTERM, page cache dropped before the start)
RESTARTS = (
    ("after kill -9", True, False),
    ("cold, after kill -9 and dropping the page cache", True, True),
    ("after SIGTERM", False, False),
)
_RECOVERED = re.compile(r"event=recovered .*seconds=([\d.]+)")


# -- produce curves ------------------------------------------------------------------------


def _load_process(
    bootstrap: str,
    topic: str,
    first_partition: int,
    partitions: int,
    n_batches: int,
    acks: int,
    start: Any,
    out: Any,
) -> None:
    """One producer: its own producer id and connection, round-robin over its partitions."""
    with WireClient(bootstrap) as c:
        pid, epoch = c.init_producer()
    frames = _frames(
        n_batches, acks, pid, epoch, topic, partitions, first_partition=first_partition
    )
    start.wait()
    out.put(_pipeline(bootstrap, frames))


def produce_spread(
    broker: BrokerProcess, topic: str, *, partitions: int, producers: int, acks: int, batches: int
) -> tuple[float, float, int]:
    """(MB/s, broker CPU µs per batch, broker RSS bytes after) of `producers` processes
    writing `batches` 16 KiB batches in all to `topic`, each over its own share of the
    partitions (all of them share partition 0 when there is one)."""
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(producers + 1)
    out = ctx.Queue()
    per_producer = max(batches // producers, 1)
    procs = []
    for k in range(producers):
        first = k * partitions // producers
        span = max((k + 1) * partitions // producers - first, 1)
        args = (broker.bootstrap, topic, first, span, per_producer, acks, start, out)
        procs.append(ctx.Process(target=_load_process, args=args))
    for proc in procs:
        proc.start()
    assert broker.proc is not None
    try:
        start.wait(timeout=LOAD_TIMEOUT_S)
        cpu = _cpu_s(broker.proc.pid)
        began = time.perf_counter()
        for _ in procs:
            out.get(timeout=LOAD_TIMEOUT_S)
        wall = time.perf_counter() - began
        cpu = _cpu_s(broker.proc.pid) - cpu
    finally:
        for proc in procs:
            proc.join(LOAD_TIMEOUT_S)
    if any(proc.exitcode for proc in procs):
        raise RuntimeError(f"load process failed: {[proc.exitcode for proc in procs]}")
    total = producers * per_producer
    return total * BATCH_BYTES / wall / 1e6, cpu / total * 1e6, _rss_bytes(broker.proc.pid)


def _rotated(items: list[Any], round_: int) -> list[Any]:
    """The points in the order of this round: each point takes each place once in
    len(items) rounds, so drift on the machine lands on all alike."""
    k = round_ % len(items)
    return items[k:] + items[:k]


def _curve_row(
    name: str, x: dict[str, Any], figures: list[tuple[float, float, int]], rss_empty: int
) -> dict[str, Any]:
    mb_s = [f[0] for f in figures]
    return {
        "benchmark": name,
        **x,
        "value": statistics.median(mb_s),
        "unit": "MB/s",
        "min_max": min_max(mb_s, 0),
        "broker_cpu_us_per_batch": statistics.median(f[1] for f in figures),
        "broker_cpu_min_max": min_max([f[1] for f in figures], 0),
        "rss_mb": figures[-1][2] / 1e6,
        "rss_empty_mb": rss_empty / 1e6,
        "rounds": len(figures),
    }


def _start_brokers(tmp: Path, names: list[str]) -> dict[str, BrokerProcess]:
    brokers: dict[str, BrokerProcess] = {}
    try:
        for name in names:
            brokers[name] = BrokerProcess(tmp / f"data-{name}").start()
    except Exception:
        _stop_all(brokers)
        raise
    return brokers


def _stop_all(brokers: dict[str, BrokerProcess]) -> None:
    """Kill the brokers and delete their data: the disk and page cache are the log's next."""
    for b in brokers.values():
        b.kill()
        shutil.rmtree(b.data_dir, ignore_errors=True)


def _empty_rss_with_topic(b: BrokerProcess, partitions: int) -> int:
    """The broker's RSS before any load, then the curve's topic created."""
    assert b.proc is not None
    rss = _rss_bytes(b.proc.pid)
    with WireClient(b.bootstrap, timeout_s=60) as c:
        assert c.create_topic("scaling", partitions) == 0
    return rss


def partition_rows(tmp: Path, batches: int, rounds: int) -> list[dict[str, Any]]:
    """Throughput, CPU per batch and RSS of one topic of 1, 100 and 1,000 partitions."""
    brokers = _start_brokers(tmp, [f"p{n}" for n in PARTITION_STEPS])
    figures: dict[int, list[tuple[float, float, int]]] = {n: [] for n in PARTITION_STEPS}
    rss_empty: dict[int, int] = {}
    try:
        for n in PARTITION_STEPS:
            rss_empty[n] = _empty_rss_with_topic(brokers[f"p{n}"], n)
        for round_ in progress.rounds(rounds, "partitions"):
            for n in _rotated(list(PARTITION_STEPS), round_):
                figures[n].append(
                    produce_spread(
                        brokers[f"p{n}"],
                        "scaling",
                        partitions=n,
                        producers=PARTITION_CURVE_PRODUCERS,
                        acks=1,
                        batches=batches,
                    )
                )
    finally:
        _stop_all(brokers)
    return [
        _curve_row(
            f"produce into {n:,} partition{'s' * (n > 1)}, {PARTITION_CURVE_PRODUCERS} producers, "
            "acks=1 idempotent",
            {"partitions": n, "producers": PARTITION_CURVE_PRODUCERS, "acks": 1},
            figures[n],
            rss_empty[n],
        )
        for n in PARTITION_STEPS
    ]


def producer_rows(tmp: Path, batches: int, rounds: int) -> list[dict[str, Any]]:
    """Throughput, CPU per batch and RSS of 1, 4 and 16 producers into 16 partitions."""
    brokers = _start_brokers(tmp, [f"w{p}" for p in PRODUCER_STEPS])
    cases = [(p, acks) for p in PRODUCER_STEPS for acks in (1, -1)]
    figures: dict[tuple[int, int], list[tuple[float, float, int]]] = {c: [] for c in cases}
    rss_empty: dict[int, int] = {}
    try:
        for p in PRODUCER_STEPS:
            rss_empty[p] = _empty_rss_with_topic(brokers[f"w{p}"], PRODUCER_CURVE_PARTITIONS)
        for round_ in progress.rounds(rounds, "producers"):
            for p, acks in _rotated(cases, round_):
                figures[p, acks].append(
                    produce_spread(
                        brokers[f"w{p}"],
                        "scaling",
                        partitions=PRODUCER_CURVE_PARTITIONS,
                        producers=p,
                        acks=acks,
                        batches=batches,
                    )
                )
    finally:
        _stop_all(brokers)
    return [
        _curve_row(
            f"produce {p} producer{'s' * (p > 1)} into {PRODUCER_CURVE_PARTITIONS} partitions, "
            f"acks={acks} idempotent",
            {"partitions": PRODUCER_CURVE_PARTITIONS, "producers": p, "acks": acks},
            figures[p, acks],
            rss_empty[p],
        )
        for p, acks in cases
    ]


# -- one partition's log growing: fetch latency and restart time ---------------------------


def _grow_frame(topic: str) -> tuple[bytes, int, int]:
    """(Produce frame, records per batch, batch bytes): one plain acks=1 batch, sent over
    and over (the broker stamps each copy's offsets)."""
    count = (GROW_BATCH_BYTES - 128) // (GROW_RECORD_BYTES + 8)
    values: list[bytes | None] = [os.urandom(GROW_RECORD_BYTES) for _ in range(count)]
    batch = build_batch_from_columns(values, None, int(time.time() * 1000))
    frame = encode_frame(
        {
            "api": "Produce",
            "v": 1,
            "cid": 0,
            "acks": 1,
            "timeout_ms": 30_000,
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "records": batch}]}],
        }
    )
    return frame, count, len(batch)


def fetch_latencies(
    broker: BrokerProcess, topic: str, first_segment: Path, head_offset: int, fetches: int
) -> tuple[list[float], list[float]]:
    """(head, tail) seconds of `fetches` single Fetches each, alternating: the tail one
    at offset 0 right after its segment's pages left the page cache (POSIX_FADV_DONTNEED
    on a clean file drops them: sync the log first), the head one at `head_offset`, hot."""
    head: list[float] = []
    tail: list[float] = []
    fd = os.open(first_segment, os.O_RDONLY)
    try:
        with WireClient(broker.bootstrap, timeout_s=60) as c:
            for _ in range(fetches):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                for offset, out in ((0, tail), (head_offset, head)):
                    began = time.perf_counter()
                    records = c.fetch(topic, 0, offset, partition_max_bytes=FETCH_MAX_BYTES)
                    out.append(time.perf_counter() - began)
                    if not records["records"]:
                        raise RuntimeError(f"empty fetch at {offset}: {records}")
    finally:
        os.close(fd)
    return head, tail


def _fetch_works(bootstrap: str, topic: str, offset: int, deadline: float) -> None:
    """Return once a Fetch of `offset` answers records (the broker may still be opening)."""
    while True:
        try:
            with WireClient(bootstrap, timeout_s=30) as c:
                if c.fetch(topic, 0, offset)["records"]:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no records at offset {offset} after restart")
        time.sleep(0.01)


def recovery_scan_bytes(log_dir: Path) -> int:
    """Bytes of log that opening `log_dir` after a crash validates batch by batch: every
    segment from the one holding the recovery point on (the rule of broker/storage/log.py)."""
    sizes = {int(p.name.removesuffix(LOG_SUFFIX)): p.stat().st_size for p in _segments(log_dir)}
    scan_from = _scan_from(sorted(sizes), _read_recovery_point(log_dir), clean_shutdown=False)
    return sum(size for base, size in sizes.items() if base >= scan_from)


def _segments(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("*" + LOG_SUFFIX))


def sync_log(log_dir: Path, *, drop: bool = False) -> None:
    """fdatasync the log's segments (so the growth writes' writeback is not timed with
    what follows) and, with `drop`, drop their pages from the page cache too."""
    for path in _segments(log_dir):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            if drop:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def restart_times(
    broker: BrokerProcess, topic: str, log_dir: Path, last_offset: int, *, kill: bool, cold: bool
) -> tuple[float, float, float, float, int]:
    """(stop ms, start-to-listening ms, start-to-first-Fetch ms, recovery ms the broker logs,
    bytes recovery validates) of one restart, after SIGKILL (`kill`) or SIGTERM; with the
    log's pages dropped from the page cache in between when `cold`."""
    began = time.perf_counter()
    if kill:
        broker.kill()
    else:
        broker.terminate(RESTART_TIMEOUT_S)
    stop_s = time.perf_counter() - began
    scan_bytes = recovery_scan_bytes(log_dir) if kill else 0
    if cold:
        sync_log(log_dir, drop=True)
    began = time.perf_counter()
    broker.start(broker.port)
    listen_s = time.perf_counter() - began
    _fetch_works(broker.bootstrap, topic, last_offset, time.monotonic() + RESTART_TIMEOUT_S)
    first_fetch_s = time.perf_counter() - began
    found = [m.group(1) for m in map(_RECOVERED.search, broker.log_lines) if m]
    recovery_s = float(found[-1]) if found else math.nan
    return stop_s * 1e3, listen_s * 1e3, first_fetch_s * 1e3, recovery_s * 1e3, scan_bytes


def _log_sizes(tmp: Path, scale: float) -> tuple[list[float], dict[str, Any] | None]:
    """The log sizes in GiB to measure, capped to half the free disk (room for 2x the
    target), and the reason row when capped."""
    sizes = [gib * scale for gib in LOG_STEPS_GIB]
    free_gib = shutil.disk_usage(tmp).free / GIB
    kept = [s for s in sizes if 2 * s <= free_gib]
    if len(kept) == len(sizes):
        return sizes, None
    reason = {
        "benchmark": f"log sizes capped: no room on disk for 2x {sizes[-1]:g} GiB",
        "value": free_gib,
        "unit": "GiB free",
    }
    return kept, reason


def log_rows(tmp: Path, scale: float, fetches: int, rounds: int) -> list[dict[str, Any]]:
    """Grow one partition's log step by step; at each size time Fetches at both ends,
    then restarts after kill -9 (first: the tail a crash leaves), kill -9 with a cold page
    cache, and SIGTERM. The log is deleted at the end."""
    sizes, reason = _log_sizes(tmp, scale)
    rows: list[dict[str, Any]] = [reason] if reason else []
    topic = "grow"
    segment_bytes = round(GIB * scale)
    data = tmp / "data-log"
    broker = BrokerProcess(data).start()
    try:
        with WireClient(broker.bootstrap, timeout_s=60) as c:
            assert c.create_topic(topic, 1, {"segment.bytes": segment_bytes}) == 0
        frame, count, batch_bytes = _grow_frame(topic)
        batches = 0
        for gib in sizes:
            n = max(math.ceil(gib * GIB / batch_bytes) - batches, 1)
            write_s = _pipeline(broker.bootstrap, [frame] * n)
            batches += n
            log_dir = data / "topics" / topic / "0"
            x = {
                "log_mib": round(batches * batch_bytes / MIB),
                "segments": len(_segments(log_dir)),
            }
            rows.append(
                {
                    "benchmark": f"write the log to {gib:g} GiB, 256 KiB batches acks=1 plain",
                    **x,
                    "value": n * batch_bytes / write_s / 1e6,
                    "unit": "MB/s",
                    "segment_bytes": segment_bytes,
                }
            )
            # The last FETCH_MAX_BYTES of the log: what a consumer at the head reads next.
            head_offset = (batches - FETCH_MAX_BYTES // batch_bytes) * count
            first_segment = _segments(log_dir)[0]
            sync_log(log_dir)
            per_round = [
                fetch_latencies(broker, topic, first_segment, head_offset, fetches)
                for _ in progress.rounds(rounds, f"fetch, log {gib:g} GiB")
            ]
            for end, k in (("head", 0), ("tail (page cache dropped)", 1)):
                p50 = [percentile(r[k], 0.5) * 1e3 for r in per_round]
                p99 = [percentile(r[k], 0.99) * 1e3 for r in per_round]
                rows.append(
                    {
                        "benchmark": f"fetch 1 MiB from the {end}, log {gib:g} GiB",
                        **x,
                        "value": statistics.median(p99),
                        "unit": "ms p99",
                        "min_max": min_max(p99, 2),
                        "p50_ms": statistics.median(p50),
                        "rounds": rounds,
                        "fetches": fetches,
                    }
                )
            # Kills first: a SIGTERM leaves a recovery point at the log end, which
            # would spare the next kill's recovery the tail a crash leaves.
            last_offset = batches * count - 1
            for how, kill, cold in RESTARTS:
                times = [
                    restart_times(broker, topic, log_dir, last_offset, kill=kill, cold=cold)
                    for _ in progress.rounds(rounds, f"restart ({how}), log {gib:g} GiB")
                ]
                listen = [t[1] for t in times]
                rows.append(
                    {
                        "benchmark": f"restart {how}, log {gib:g} GiB",
                        **x,
                        "value": statistics.median(listen),
                        "unit": "ms to listening",
                        "min_max": min_max(listen, 0),
                        "first_fetch_ms": statistics.median(t[2] for t in times),
                        "broker_recovery_ms": statistics.median(t[3] for t in times),
                        "stop_ms": statistics.median(t[0] for t in times),
                        "recovery_scan_mib": round(statistics.median(t[4] for t in times) / MIB),
                        "rounds": rounds,
                    }
                )
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
    return rows


def run(scale: float = 1.0) -> list[dict[str, Any]]:
    """Every curve at `scale` (1.0: 8,192 batches per produce point, a log up to 10 GiB)."""
    batches = max(round(CURVE_BATCHES * scale), 4 * WINDOW)
    fetches = max(round(FETCHES * scale), 100)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        tmp_path = Path(tmp)
        rows += partition_rows(tmp_path, batches, ROUNDS)
        rows += producer_rows(tmp_path, batches, ROUNDS)
        rows += log_rows(tmp_path, scale, fetches, LOG_ROUNDS)
    return rows


# -- verdicts and plots --------------------------------------------------------------------


def _pick(rows: list[dict[str, Any]], prefix: str, **match: Any) -> list[dict[str, Any]]:
    return [
        r
        for r in rows
        if str(r["benchmark"]).startswith(prefix) and all(r.get(k) == v for k, v in match.items())
    ]


def _gib(row: dict[str, Any]) -> str:
    return f"{row['log_mib'] / 1024:.3g} GiB"


def _grown(lo: dict[str, Any], hi: dict[str, Any]) -> str:
    """Throughput and broker CPU per batch of the curve's far end against its start,
    each with its verdict (at least half the throughput, at most twice the CPU)."""
    cpu_ratio = hi["broker_cpu_us_per_batch"] / lo["broker_cpu_us_per_batch"]
    return (
        f"throughput {hi['value']:.0f} / {lo['value']:.0f} MB/s = "
        f"{hi['value'] / lo['value']:.2f} (at least 0.5 wanted): "
        f"{verdict(hi['value'] >= 0.5 * lo['value'])}; broker CPU per batch "
        f"{cpu_ratio:.2f}x (at most 2x wanted): {verdict(cpu_ratio <= 2)}"
    )


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """Each cost against its work: costs per unit of work no more than 2x apart across
    the curve, except recovery, which should not grow with the log past a segment."""
    out = []
    parts = _pick(rows, "produce into")
    one, many = parts[0], parts[-1]
    out.append(f"- {many['partitions']:,} partitions against 1: {_grown(one, many)}.")
    per_partition_kib = (many["rss_mb"] - one["rss_mb"]) * 1e3 / 1.024 / (many["partitions"] - 1)
    out.append(
        f"- RSS {one['rss_mb']:.0f} MB at 1 partition, {many['rss_mb']:.0f} MB at "
        f"{many['partitions']:,}: {per_partition_kib:.0f} KiB per partition (at most 100 KiB "
        f"wanted, 1,000 partitions in 100 MB): {verdict(per_partition_kib <= 100)}."
    )
    for acks in (1, -1):
        prods = _pick(rows, "produce ", acks=acks, partitions=PRODUCER_CURVE_PARTITIONS)
        prods = [r for r in prods if not r["benchmark"].startswith("produce into")]
        lo, hi = prods[0], prods[-1]
        out.append(
            f"- acks={acks}, {hi['producers']} producers against 1: {_grown(lo, hi)}; RSS "
            f"{lo['rss_mb']:.0f} -> {hi['rss_mb']:.0f} MB."
        )
    for end in ("head", "tail"):
        fetch = _pick(rows, f"fetch 1 MiB from the {end}")
        if len(fetch) >= 2:
            small, big = fetch[0], fetch[-1]
            ratio = big["value"] / small["value"]
            out.append(
                f"- fetch from the {end}: p99 {big['value']:.1f} ms at {_gib(big)} against "
                f"{small['value']:.1f} ms at {_gib(small)}, {ratio:.2f}x for "
                f"{big['log_mib'] / small['log_mib']:.0f}x the log (within 2x wanted): "
                f"{verdict(ratio <= 2)}."
            )
    writes = _pick(rows, "write the log")
    for how, kill, _ in RESTARTS:
        restarts = _pick(rows, f"restart {how},")
        if len(restarts) < 2:
            continue
        small, big = restarts[0], restarts[-1]
        points = ", ".join(f"{r['value']:,.0f} ms at {_gib(r)}" for r in restarts)
        if not kill:
            ratio = big["value"] / small["value"]
            recovery = ", ".join(
                f"{r['broker_recovery_ms']:,.0f} ms for {r['segments']} segments" for r in restarts
            )
            out.append(
                f"- restart {how}, to listening: {points} (the broker's opening of the logs: "
                f"{recovery}); {ratio:.2f}x for {big['log_mib'] / small['log_mib']:.0f}x the "
                f"log (within 2x wanted): {verdict(ratio <= 2)}."
            )
            continue
        scanned = ", ".join(
            f"{r['broker_recovery_ms']:,.0f} ms for {r['recovery_scan_mib'] / 1024:.3g} of "
            f"{_gib(r)}"
            for r in restarts
        )
        per_gib = [
            r["broker_recovery_ms"] / max(r["recovery_scan_mib"], 1) * 1024 for r in restarts
        ]
        segment_mib = writes[0]["segment_bytes"] / MIB
        small_ms = max(small["broker_recovery_ms"], 1.0)
        big_ms = big["broker_recovery_ms"]
        out.append(
            f"- restart {how}, to listening: {points}. Recovery as the broker logs it, against "
            f"the log it validates (from the recovery point's segment on): {scanned}; "
            f"{per_gib[-1]:,.0f} ms per GiB validated at the largest log against "
            f"{per_gib[0]:,.0f} at the smallest; growing no faster than the log (at the "
            "largest log at most 2x the smallest's recovery, or at most 2x its time per GiB "
            "validated; a few MiB validated make the second a fixed cost over nothing): "
            f"{verdict(big_ms <= 2 * small_ms or per_gib[-1] <= 2 * per_gib[0])}; "
            "the largest log validates "
            f"{big['recovery_scan_mib'] / segment_mib:.1f} segments of {big['segments']} (at "
            f"most 2 wanted: bounded by segments, not the log): "
            f"{verdict(big['recovery_scan_mib'] <= 2 * segment_mib)}."
        )
    return out


def plots(rows: list[dict[str, Any]], out_dir: Path) -> list[tuple[str, Path]]:
    """Log-x curves, with a dashed line where the cost would be if it grew as fast as the
    work (or stayed level, for throughput), so a reader sees which side each curve is on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, Path]] = []

    def bounds(
        r: dict[str, Any], value: str = "value", spread: str = "min_max"
    ) -> tuple[float, float]:
        low, high = (float(v) for v in str(r[spread]).replace(",", "").split("-"))
        # The range is printed rounded, so a median next to an end can fall just outside.
        return max(0.0, r[value] - low), max(0.0, high - r[value])

    def throughput_rss(curve: list[list[dict[str, Any]]], key: str, title: str) -> Any:
        fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4.2))
        for series in curve:
            xs = [r[key] for r in series]
            label = f"acks={series[0]['acks']}"
            for ax, value, spread in (
                (ax1, "value", "min_max"),
                (ax2, "broker_cpu_us_per_batch", "broker_cpu_min_max"),
            ):
                line = ax.errorbar(
                    xs,
                    [r[value] for r in series],
                    yerr=list(zip(*(bounds(r, value, spread) for r in series), strict=True)),
                    marker="o",
                    capsize=3,
                    label=label,
                )
                ax.axhline(series[0][value], ls="--", lw=0.8, color=line[0].get_color())
            ax3.plot(xs, [r["rss_mb"] for r in series], marker="o", label=f"after load, {label}")
        first = curve[0]
        xs = [r[key] for r in first]
        ax3.plot(xs, [r["rss_empty_mb"] for r in first], marker="s", ls=":", label="empty broker")
        ax1.set(ylabel="MB/s")
        ax1.set_title("throughput", fontsize=10)
        ax2.set(ylabel="µs per 16 KiB batch")
        ax2.set_title("broker CPU per batch", fontsize=10)
        ax3.set(ylabel="MB")
        ax3.set_title("broker RSS", fontsize=10)
        for ax in (ax1, ax2, ax3):
            ax.set(xscale="log", xlabel=key, ylim=(0, None))
            ax.set_xticks(xs, [f"{x:,}" for x in xs])
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        fig.suptitle(f"{title}\nmedian, min-max of rounds; dashed: level with the first point")
        fig.tight_layout()
        return fig

    def save(fig: Any, name: str, caption: str) -> None:
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append((caption, path))

    parts = _pick(rows, "produce into")
    if parts:
        title = f"one topic, {PARTITION_CURVE_PRODUCERS} producers, 16 KiB batches, acks=1"
        save(
            throughput_rss([parts], "partitions", title),
            "scaling-partitions.png",
            "Throughput and broker RSS against partitions",
        )
    prods = [r for r in _pick(rows, "produce ") if not r["benchmark"].startswith("produce into")]
    if prods:
        by_acks = [[r for r in prods if r["acks"] == acks] for acks in (1, -1)]
        title = f"{PRODUCER_CURVE_PARTITIONS} partitions, a process per producer, 16 KiB batches"
        save(
            throughput_rss(by_acks, "producers", title),
            "scaling-producers.png",
            "Throughput and broker RSS against producers",
        )

    fetch = _pick(rows, "fetch 1 MiB")
    if fetch:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for end, marker in (("head", "o"), ("tail", "s")):
            series = _pick(rows, f"fetch 1 MiB from the {end}")
            xs = [r["log_mib"] / 1024 for r in series]
            line = ax.errorbar(
                xs,
                [r["value"] for r in series],
                yerr=list(zip(*(bounds(r) for r in series), strict=True)),
                marker=marker,
                capsize=3,
                label=series[0]["benchmark"].split(", log")[0].removeprefix("fetch 1 MiB ")
                + ": p99",
            )
            color = line[0].get_color()
            ax.plot(xs, [r["p50_ms"] for r in series], marker=marker, ls=":", color=color)
            ax.axhline(series[0]["value"], ls="--", lw=0.8, color=color, alpha=0.6)
        ax.set(xscale="log", xlabel="log size GiB", ylabel="ms per 1 MiB Fetch", ylim=(0, None))
        ax.set_xticks(xs, [f"{x:.3g}" for x in xs])
        ax.set_title(
            "Fetch latency as one partition's log grows\n"
            "p99 (median, min-max of rounds); dotted: p50; dashed: level with the smallest log",
            fontsize=10,
        )
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
        fig.tight_layout()
        save(fig, "scaling-fetch.png", "Fetch latency against log size")

    kills = _pick(rows, "restart after kill -9,")
    if kills:
        fig, ax = plt.subplots(figsize=(11, 5))
        xs = [r["log_mib"] / 1024 for r in kills]
        labels = ("kill -9", "kill -9, page cache dropped", "SIGTERM")
        for (how, _, _), label in zip(RESTARTS, labels, strict=True):
            series = _pick(rows, f"restart {how},")
            line = ax.errorbar(
                xs,
                [r["value"] for r in series],
                yerr=list(zip(*(bounds(r) for r in series), strict=True)),
                marker="o",
                capsize=3,
                label=f"{label}: start to listening",
            )
            ax.plot(
                xs,
                [r["broker_recovery_ms"] for r in series],
                marker="v",
                ls=":",
                color=line[0].get_color(),
                label=f"{label}: recovery (broker log)",
            )
        ax.plot(
            xs,
            [kills[0]["broker_recovery_ms"] * x / xs[0] for x in xs],
            ls="--",
            color="grey",
            lw=0.8,
            label="proportional to the log",
        )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="log size GiB (segments; GiB a crash makes recovery check)",
            ylabel="ms",
        )
        ax.set_xticks(
            xs,
            [
                f"{x:.3g}\n{r['segments']} seg.\n{r['recovery_scan_mib'] / 1024:.2g} checked"
                for x, r in zip(xs, kills, strict=True)
            ],
        )
        ax.set_title(
            "Restart time as one partition's log grows (median, min-max of rounds)", fontsize=10
        )
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=0.3, which="both")
        fig.tight_layout()
        save(fig, "scaling-restart.png", "Restart time against log size")
    return made


def main() -> None:
    from bench.__main__ import standalone

    standalone("scaling", "broker scaling curves")


if __name__ == "__main__":
    main()
