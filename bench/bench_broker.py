"""Broker throughput and memory, driven by a raw-protocol load generator.

One connection pipelines pre-encoded Produce frames of 16 KiB batches of
100-byte records (a window of requests in flight), so the figure is the
broker's, not a client library's. Each configuration runs `ROUNDS` times and
the median is reported; ratios (idempotent vs plain, acks=-1 vs the fdatasync
ceiling, metrics on vs off) are taken between runs of the same invocation.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import random
import re
import shutil
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import progress
from bench.stats import min_max
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from protocol.batch import build_batch_from_columns, scan_batches, with_sequence
from protocol.framing import FrameDecoder, decode_body, encode_frame

BATCH_BYTES = 16 * 1024
RECORD_BYTES = 100
WINDOW = 64
ROUNDS = 6
# The cost rounds: enough paired rounds that the median's 95% interval is about
# ±1.5% (24 gave ±2.5-4.5%, wider than the 3% it is meant to judge), each short
# enough that 96 of them take a minute per backend.
COST_ROUNDS = 96
COST_BLOCK_ROUNDS = 6
COST_BATCHES = 2000
BOOTSTRAP_RESAMPLES = 4000


def _batch_template(pid: int, epoch: int) -> tuple[bytes, int]:
    # msgpack adds ~7 bytes per record; fill the batch up to 16 KiB.
    count = (BATCH_BYTES - 56) // (RECORD_BYTES + 7)
    values: list[bytes | None] = [os.urandom(RECORD_BYTES) for _ in range(count)]
    batch = build_batch_from_columns(
        values,
        None,
        int(time.time() * 1000),
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0 if pid >= 0 else -1,
    )
    return batch, count


def _frames(
    n_batches: int,
    acks: int,
    pid: int,
    epoch: int,
    topic: str,
    partitions: int,
    *,
    first_partition: int = 0,
) -> list[bytes]:
    template, count = _batch_template(pid, epoch)
    frames = []
    seq = [0] * partitions
    for i in range(n_batches):
        p = i % partitions
        batch = template
        if pid >= 0:
            batch = with_sequence(template, epoch, seq[p])
            seq[p] += count
        frames.append(
            encode_frame(
                {
                    "api": "Produce",
                    "v": 1,
                    "cid": i,
                    "acks": acks,
                    "timeout_ms": 30_000,
                    "topics": [
                        {
                            "topic": topic,
                            "partitions": [{"partition": first_partition + p, "records": batch}],
                        }
                    ],
                }
            )
        )
    return frames


def produce_error(body: bytes) -> Any:
    """The error of a Produce answer's one partition (0: none)."""
    return decode_body(body)["topics"][0]["partitions"][0]["error"]


def _pipeline(
    bootstrap: str,
    frames: list[bytes],
    sock: socket.socket | None = None,
    error_of: Callable[[bytes], Any] = produce_error,
) -> float:
    """Send every frame with at most WINDOW unanswered; return elapsed seconds. On a new
    connection to `bootstrap`, or on `sock` (a plain socket, e.g. one that authenticated
    with SASL first), which the caller closes. `error_of` reads the error of an answer's
    body (the frames of Kafka's protocol have the same length prefix).

    Each send takes every frame the window has room for, as a Kafka client's network
    thread writes every ready request: one frame per send let the load generator's two
    threads fall into lock-step with the broker at two frames per read, which doubled
    the broker's CPU per batch in one asyncio run out of six (docs/benchmark-notes.md)."""
    own = sock is None
    if sock is None:
        host, port = bootstrap.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    window = threading.Semaphore(WINDOW)
    errors: list[Any] = []

    def read_all() -> None:
        decoder = FrameDecoder(1 << 30)
        seen = 0
        while seen < len(frames):
            data = sock.recv(1 << 20)
            if not data:
                errors.append("connection closed")
                return
            for body in decoder.feed_bodies(data):
                err = error_of(body)
                if err:
                    errors.append(err)
                seen += 1
                window.release()

    reader = threading.Thread(target=read_all)
    started = time.perf_counter()
    reader.start()
    i = 0
    while i < len(frames):
        window.acquire()
        n = 1
        while i + n < len(frames) and window.acquire(blocking=False):
            n += 1
        _send_all(sock, frames[i : i + n])
        i += n
    reader.join()
    elapsed = time.perf_counter() - started
    if own:
        sock.close()
    if errors:
        raise RuntimeError(f"produce errors: {errors[:3]}")
    return elapsed


def _send_all(sock: socket.socket, frames: list[bytes]) -> None:
    """sendall() for several buffers: one sendmsg per call the kernel takes whole."""
    views = [memoryview(f) for f in frames]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def _produce(
    broker: BrokerProcess,
    *,
    acks: int,
    idempotent: bool,
    n_batches: int,
    connect: Callable[[], WireClient] | None = None,
    topic_prefix: str = "bench",
) -> tuple[float, float]:
    """(MB/s, broker CPU µs per batch) of one pipelined run into a fresh topic, whose name
    starts with `topic_prefix`. The topic, the producer id and the run share one
    connection: `connect()`'s (e.g. authenticated with SASL), else a new plain one.

    CPU per batch is the steadier figure on a shared machine: neighbours slow the
    wall clock, not the work the broker does per batch."""
    with (connect or functools.partial(WireClient, broker.bootstrap))() as c:
        topic = f"{topic_prefix}-{acks}-{idempotent}-{time.monotonic_ns()}"
        c.create_topic(topic, 1)
        pid, epoch = c.init_producer() if idempotent else (-1, -1)
        frames = _frames(n_batches, acks, pid, epoch, topic, 1)
        payload = sum(len(f) for f in frames)
        cpu = _cpu_s(broker.pid)
        elapsed = _pipeline(broker.bootstrap, frames, c.sock)
        cpu = _cpu_s(broker.pid) - cpu
    return payload / elapsed / 1e6, cpu / n_batches * 1e6


def _producer_process(
    bootstrap: str, topic: str, partition: int, n_batches: int, acks: int, start: Any, out: Any
) -> None:
    """One load process: its own producer id, its own partition, one pipelined connection."""
    with WireClient(bootstrap) as c:
        pid, epoch = c.init_producer()
    frames = _frames(n_batches, acks, pid, epoch, topic, 1, first_partition=partition)
    start.wait()
    out.put(_pipeline(bootstrap, frames))


def _group_commit_totals(broker: BrokerProcess) -> tuple[float, float]:
    """(batches, fsync rounds) so far, from the broker's group-commit histogram."""
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    found = dict(re.findall(r"^minibroker_group_commit_batches_(sum|count) (\S+)$", text, re.M))
    return float(found.get("sum", 0)), float(found.get("count", 0))


def produce_parallel(
    broker: BrokerProcess, *, producers: int, acks: int, n_batches: int
) -> tuple[float, float, float]:
    """(MB/s, broker CPU µs per batch, batches per fsync) of `producers` processes, each
    an idempotent producer pipelining `n_batches` 16 KiB batches into a partition of its
    own of one fresh topic."""
    topic = f"bench-par-{acks}-{time.monotonic_ns()}"
    with WireClient(broker.bootstrap) as c:
        c.create_topic(topic, producers)
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(producers + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_producer_process,
            args=(broker.bootstrap, topic, i, n_batches, acks, start, out),
        )
        for i in range(producers)
    ]
    for proc in procs:
        proc.start()
    assert broker.proc is not None
    batches, rounds = _group_commit_totals(broker)
    start.wait()
    cpu = _cpu_s(broker.proc.pid)
    began = time.perf_counter()
    for _ in procs:
        out.get(timeout=600)
    wall = time.perf_counter() - began
    cpu = _cpu_s(broker.proc.pid) - cpu
    for proc in procs:
        proc.join()
        if proc.exitcode:
            raise RuntimeError(f"load process failed: exit {proc.exitcode}")
    batches2, rounds2 = _group_commit_totals(broker)
    total = producers * n_batches
    per_fsync = (batches2 - batches) / (rounds2 - rounds) if rounds2 > rounds else 0.0
    return total * BATCH_BYTES / wall / 1e6, cpu / total * 1e6, per_fsync


def _cpu_s(pid: int) -> float:
    """CPU seconds the process's live threads have run, user and kernel, to the
    nanosecond (schedstat): /proc/<pid>/stat counts 10 ms ticks, which alone moved
    a 2,000-batch round's figure by ±7%."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a worker thread that ended meanwhile
    return total_ns / 1e9


def _fetch_all(
    broker: BrokerProcess, topic: str, connect: Callable[[], WireClient] | None = None
) -> tuple[float, float]:
    """Read `topic` partition 0 from the start with 1 MiB Fetches over one raw
    connection (`connect()`'s, e.g. over TLS, else a new plain one); return (MB/s,
    broker CPU seconds per GB)."""
    assert broker.proc is not None
    with (connect or functools.partial(WireClient, broker.bootstrap))() as c:
        offset = total = 0
        cpu = _cpu_s(broker.proc.pid)
        started = time.perf_counter()
        while True:
            records = c.fetch(topic, 0, offset, partition_max_bytes=1 << 20)["records"]
            if not records:
                break
            total += len(records)
            *_, (_, last) = scan_batches(records, check_crc=False)
            offset = last.next_offset
        elapsed = time.perf_counter() - started
        cpu = _cpu_s(broker.proc.pid) - cpu
    return total / elapsed / 1e6, cpu / (total / 1e9)


def fetch_zero_copy(tmp_path: Path, n_batches: int) -> list[dict[str, Any]]:
    """The same stored topic fetched by a trio broker with and without os.sendfile."""
    rows = []
    figures: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    conf = tmp_path / "copy.toml"
    conf.write_text("fetch_zero_copy = false\n")
    data = tmp_path / "data-fetch"
    broker = BrokerProcess(data, backend="trio").start()
    try:
        with WireClient(broker.bootstrap) as c:
            c.create_topic("fetch", 1)
        frames = _frames(n_batches, 1, -1, -1, "fetch", 1)
        _pipeline(broker.bootstrap, frames)
    finally:
        broker.kill()
    for round_ in progress.rounds(ROUNDS, "fetch, sendfile and read"):
        for zero_copy in (True, False) if round_ % 2 == 0 else (False, True):
            extra = [] if zero_copy else ["--config", str(conf)]
            broker = BrokerProcess(data, backend="trio", extra_args=extra).start()
            try:
                figures[zero_copy].append(_fetch_all(broker, "fetch"))
            finally:
                broker.kill()
    for zero_copy, values in figures.items():
        label = "sendfile" if zero_copy else "copy"
        rows.append(
            {
                "benchmark": f"fetch trio {label}",
                "value": statistics.median(v[0] for v in values),
                "unit": "MB/s",
                "min_max": min_max([v[0] for v in values]),
                "rounds": len(values),
            }
        )
        rows.append(
            {
                "benchmark": f"fetch trio {label} broker CPU",
                "value": statistics.median(v[1] for v in values),
                "unit": "CPU s/GB",
                "rounds": len(values),
            }
        )
    return rows


def fdatasync_ceiling_mb_s(directory: Path, n_batches: int, group: int) -> float:
    """MB/s of appending 16 KiB chunks with one fdatasync per `group` chunks and one at the
    end; `group` 0 syncs never, which is the page cache's pace (what acks=1 waits for)."""
    chunk = os.urandom(BATCH_BYTES)
    path = directory / "fdatasync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        started = time.perf_counter()
        for i in range(n_batches):
            os.write(fd, chunk)
            if group and (i + 1) % group == 0:
                os.fdatasync(fd)
        if group:
            os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return n_batches * BATCH_BYTES / elapsed / 1e6


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def rss_with_producers(backend: str, partitions: int = 100, producers: int = 10_000) -> int:
    """Broker RSS after `producers` idempotent producers each wrote 5 batches
    (filling their duplicate window) to one of `partitions` partitions."""
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", backend=backend).start()
        try:
            with WireClient(broker.bootstrap) as c:
                c.create_topic("rss", partitions)
                grants = [c.init_producer() for _ in range(producers)]
                pending = 0
                for i, (pid, epoch) in enumerate(grants):
                    template = build_batch_from_columns(
                        [b"x" * RECORD_BYTES], None, 0, producer_id=pid, producer_epoch=epoch
                    )
                    for seq in range(5):
                        c.send(
                            "Produce",
                            acks=1,
                            timeout_ms=30_000,
                            topics=[
                                {
                                    "topic": "rss",
                                    "partitions": [
                                        {
                                            "partition": i % partitions,
                                            "records": with_sequence(template, epoch, seq),
                                        }
                                    ],
                                }
                            ],
                        )
                        pending += 1
                    while pending > WINDOW:
                        r = c.recv()
                        assert r["topics"][0]["partitions"][0]["error"] == 0, r
                        pending -= 1
                while pending:
                    c.recv()
                    pending -= 1
            assert broker.proc is not None
            return _rss_bytes(broker.proc.pid)
        finally:
            broker.kill()


def durable_rows(tmp_path: Path, n_batches: int, producers: int = 4) -> list[dict[str, Any]]:
    """`producers` processes at acks=-1, and at acks=1 for the CPU-bound pace, against
    the fdatasync ceiling measured between their rounds: every round measures all three,
    so drift on the machine lands on each alike."""
    rows: list[dict[str, Any]] = []
    per_producer = max(n_batches // producers, WINDOW)
    for backend in ("trio", "asyncio"):
        broker = BrokerProcess(tmp_path / f"data-durable-{backend}", backend=backend).start()
        figures: dict[str, list[tuple[float, ...]]] = {"-1": [], "1": [], "ceiling": []}
        try:
            for _ in progress.rounds(ROUNDS, f"4 producer processes, {backend}"):
                figures["ceiling"].append(
                    (fdatasync_ceiling_mb_s(tmp_path, producers * per_producer, WINDOW),)
                )
                for acks in (-1, 1):
                    figures[str(acks)].append(
                        produce_parallel(
                            broker, producers=producers, acks=acks, n_batches=per_producer
                        )
                    )
        finally:
            broker.kill()
        ratios = [a[0] / c[0] for a, c in zip(figures["-1"], figures["ceiling"], strict=True)]
        rows.append(
            {
                "benchmark": f"fdatasync ceiling, one per {WINDOW} writes ({backend} rounds)",
                "value": statistics.median(v[0] for v in figures["ceiling"]),
                "unit": "MB/s",
                "rounds": ROUNDS,
            }
        )
        for acks in (-1, 1):
            values = figures[str(acks)]
            row: dict[str, Any] = {
                "benchmark": f"produce {backend} {producers} producers acks={acks} idempotent",
                "value": statistics.median(v[0] for v in values),
                "unit": "MB/s",
                "min_max": min_max([v[0] for v in values]),
                "broker_cpu_us_per_batch": statistics.median(v[1] for v in values),
                "rounds": ROUNDS,
            }
            if acks == -1:
                row["batches_per_fsync"] = statistics.median(v[2] for v in values)
                row["of_ceiling"] = _spread(ratios)
            rows.append(row)
    return rows


def cost_rows(
    tmp_path: Path, rounds: int = COST_ROUNDS, n_batches: int = COST_BATCHES
) -> list[dict[str, Any]]:
    """What idempotence and metrics cost in broker CPU per batch (acks=1), as the
    median of per-round ratios with a bootstrap 95% interval (`paired_rounds`, `cost_row`).

    Each round runs plain, idempotent, and idempotent with metrics off back to back;
    metrics on and off are two brokers."""
    rows: list[dict[str, Any]] = []
    cases = [(True, False), (True, True), (False, True)]  # (metrics, idempotent)
    for backend in ("trio", "asyncio"):

        @contextlib.contextmanager
        def brokers(block: int, backend: str = backend) -> Iterator[Callable[[Any], float]]:
            started = {
                metrics: BrokerProcess(
                    tmp_path / f"data-cost-{backend}-{metrics}-{block}",
                    backend=backend,
                    extra_args=[] if metrics else ["--metrics-port", "-1"],
                ).start()
                for metrics in (True, False)
            }

            def measure(case: tuple[bool, bool]) -> float:
                metrics, idempotent = case
                return _produce(
                    started[metrics], acks=1, idempotent=idempotent, n_batches=n_batches
                )[1]

            try:
                yield measure
            finally:
                for b in started.values():
                    b.kill()

        cpu = paired_rounds(cases, rounds, f"costs, {backend}", brokers)
        idem = [r[True, True] / r[True, False] for r in cpu]
        metrics_on = [r[True, True] / r[False, True] for r in cpu]
        rows += [
            cost_row(f"cost of idempotence {backend}, broker CPU per batch", idem),
            cost_row(f"cost of metrics {backend}, broker CPU per batch", metrics_on),
        ]
    return rows


def paired_rounds(
    cases: Sequence[Any],
    rounds: int,
    what: str,
    brokers: Callable[[int], contextlib.AbstractContextManager[Callable[[Any], float]]],
) -> list[dict[Any, float]]:
    """Each round's figure of every case (broker CPU per batch, say), the cases run back
    to back in an order that rotates every round (A/B/C, B/C/A, ...), so a ratio of two
    cases of one round compares figures a few hundred milliseconds apart: drift on the
    shared machine cancels within a round instead of landing on one case.

    `brokers(block)` starts the brokers of a block of COST_BLOCK_ROUNDS rounds and yields
    the function that measures a case on them. One process can run a few percent slower
    than its twin for as long as it lives (where it sits in memory and on the cores):
    fresh brokers every block make that part of the sampled noise rather than a bias of
    the whole run."""
    out: list[dict[Any, float]] = []
    for block in range(0, rounds, COST_BLOCK_ROUNDS):
        with brokers(block) as measure:
            for round_ in progress.rounds(
                rounds, what, block, min(block + COST_BLOCK_ROUNDS, rounds)
            ):
                order = [cases[(round_ + i) % len(cases)] for i in range(len(cases))]
                out.append({case: measure(case) for case in order})
    return out


def cost_row(name: str, ratios: list[float]) -> dict[str, Any]:
    """A cost as the suites report it: the median of per-round ratios (with/without) in
    percent, its bootstrap 95% interval and min-max; `bench.__main__._cost_verdict`
    judges it by the interval."""
    low, high = bootstrap_median_ci(ratios)
    return {
        "benchmark": name,
        "value": (statistics.median(ratios) - 1) * 100,
        "unit": "%",
        "ci95_low": (low - 1) * 100,
        "ci95_high": (high - 1) * 100,
        "min_max": f"{(min(ratios) - 1) * 100:+.1f} to {(max(ratios) - 1) * 100:+.1f}",
        "rounds": len(ratios),
    }


def bootstrap_median_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (seeded: the same rounds give the
    same interval)."""
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP_RESAMPLES)
    )
    tail = (1 - level) / 2
    return medians[int(tail * len(medians))], medians[int((1 - tail) * len(medians)) - 1]


def _spread(values: list[float]) -> str:
    """Median and min-max of ratios, as the docs quote them."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def run(n_batches: int = 6000) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        tmp_path = Path(tmp)
        ceiling_each = statistics.median(
            fdatasync_ceiling_mb_s(tmp_path, n_batches // 4, 1)
            for _ in progress.rounds(ROUNDS, "fdatasync ceiling, one per write")
        )
        ceiling_group = statistics.median(
            fdatasync_ceiling_mb_s(tmp_path, n_batches, WINDOW)
            for _ in progress.rounds(ROUNDS, f"fdatasync ceiling, one per {WINDOW} writes")
        )
        rows.append(
            {
                "benchmark": "fdatasync ceiling, one per 16 KiB write",
                "value": ceiling_each,
                "unit": "MB/s",
            }
        )
        rows.append(
            {
                "benchmark": f"fdatasync ceiling, one per {WINDOW} writes",
                "value": ceiling_group,
                "unit": "MB/s",
            }
        )
        rows += fetch_zero_copy(tmp_path, n_batches)
        for backend in ("trio", "asyncio"):
            _settle(tmp_path)
            brokers = {
                metrics: BrokerProcess(
                    tmp_path / f"data-{backend}-{metrics}",
                    backend=backend,
                    extra_args=[] if metrics else ["--metrics-port", "-1"],
                ).start()
                for metrics in (True, False)
            }
            # acks=1 cases interleave ABBA; acks=-1 runs after them as a phase of its
            # own, since its fsyncs would otherwise land on whichever case follows.
            cases = [(True, 1, False), (True, 1, True), (False, 1, True)]
            figures: dict[tuple[bool, int, bool], list[tuple[float, float]]] = {
                case: [] for case in cases
            }
            figures[(True, -1, True)] = []
            try:
                for round_ in progress.rounds(ROUNDS, f"produce, {backend}"):
                    for metrics, acks, idem in cases if round_ % 2 == 0 else cases[::-1]:
                        figures[(metrics, acks, idem)].append(
                            _produce(
                                brokers[metrics], acks=acks, idempotent=idem, n_batches=n_batches
                            )
                        )
                for _ in progress.rounds(ROUNDS, f"produce acks=-1, {backend}"):
                    figures[(True, -1, True)].append(
                        _produce(brokers[True], acks=-1, idempotent=True, n_batches=n_batches)
                    )
            finally:
                for b in brokers.values():
                    b.kill()
            for (metrics, acks, idem), values in figures.items():
                rows.append(
                    {
                        "benchmark": f"produce {backend} acks={acks} "
                        f"{'idempotent' if idem else 'plain'}"
                        f"{'' if metrics else ' metrics off'}",
                        "value": statistics.median(v[0] for v in values),
                        "unit": "MB/s",
                        "min_max": min_max([v[0] for v in values]),
                        "broker_cpu_us_per_batch": statistics.median(v[1] for v in values),
                        "rounds": len(values),
                    }
                )
            rows.append(
                {
                    "benchmark": f"broker RSS {backend}, 100 partitions x 10,000 producers",
                    "value": rss_with_producers(backend) / 1e6,
                    "unit": "MB",
                }
            )
        _settle(tmp_path)
        rows += durable_rows(tmp_path, n_batches)
        _settle(tmp_path)
        rows += cost_rows(tmp_path)
    return rows


def _settle(tmp_path: Path) -> None:
    """Delete the data the phases before wrote and flush what else is dirty, so that
    their writeback does not land on the next phase: the kernel flushes dirty pages
    about 30 s after they were written, which used to fall on the asyncio rounds
    that follow the trio ones (26-30 µs per batch alone, 36-55 µs after trio)."""
    for data in tmp_path.glob("data-*"):
        shutil.rmtree(data, ignore_errors=True)
    os.sync()
