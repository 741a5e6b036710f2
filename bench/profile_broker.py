"""Flame graph of the broker process under one of the broker suite's produce loads.

Starts a broker, attaches py-spy (`pip install py-spy`) to it, runs the load,
stops py-spy (SIGINT makes it write the SVG) and prints the load's figures, so
a profile and the numbers it explains come from the same run:

    python -m bench.profile_broker --backend trio --load acks1 --out docs/profiles/acks1-trio.svg
    python -m bench.profile_broker --load acks-all-4 --out docs/profiles/acks-all-4-trio.svg

`--pieces` times the broker's steps for one batch in process instead, without
sockets or event loop, so the rest of the end-to-end figure is theirs:

    python -m bench.profile_broker --pieces

`--runs` times `Partition.append_many` on runs of 16 batches, one idempotent
producer's and plain ones, so what idempotence adds to an append shows alone:

    python -m bench.profile_broker --runs

`--writes` times the kernel's part of an append: µs per batch of `pwritev`
appending 16 KiB batches, page-aligned or not, one or several per call:

    python -m bench.profile_broker --writes
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_broker import _batch_template, _frames, _produce, produce_parallel
from broker.partitions.partition import Partition, ProducerLimits
from broker.storage.log import LogConfig
from harness.broker_process import BrokerProcess
from protocol import messages as m
from protocol.batch import validate, with_sequence
from protocol.framing import FrameDecoder, frame

LOADS = ("acks1", "acks1-plain", "acks-all-4")
SAMPLE_RATE_HZ = 1000
READ_BYTES = 256 * 1024  # broker.network.server.RECEIVE_BYTES


def _partition(directory: Path) -> Partition:
    """A fresh partition with the broker's default log settings."""
    return Partition.open(
        "t", 0, directory, LogConfig(), ProducerLimits(10, 10**9), clean_shutdown=True, now_ms=0
    )


def pieces(n_batches: int) -> dict[str, float]:
    """µs per 16 KiB idempotent batch of each step from bytes read to answer encoded."""
    data = b"".join(_frames(n_batches, 1, 1, 0, "t", 1))
    spent = dict.fromkeys(["framing", "decode", "validate", "append", "encode"], 0.0)
    answer = m.ProduceResponse(
        topics=[m.ProduceTopicResponse("t", [m.ProducePartitionResponse(0, 0, 0)])]
    )
    clock = time.perf_counter
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        partition = _partition(Path(tmp))
        decoder = FrameDecoder(1 << 30)
        for start in range(0, len(data), READ_BYTES):
            t0 = clock()
            bodies = decoder.feed_views(data[start : start + READ_BYTES])
            spent["framing"] += clock() - t0
            # As the broker does: the Produce requests of one read append together.
            batches, headers = [], []
            for body in bodies:
                t0 = clock()
                request = m.decode_request(body)
                assert isinstance(request, m.ProduceRequest)
                records = request.topics[0].partitions[0].records
                t1 = clock()
                headers.append(validate(records))
                batches.append(records)
                spent["decode"] += t1 - t0
                spent["validate"] += clock() - t1
            t0 = clock()
            partition.append_many(batches, headers, 0)
            t1 = clock()
            for _ in bodies:
                frame(m.encode_response(answer, 1))
            spent["append"] += t1 - t0
            spent["encode"] += clock() - t1
        partition.log.close()
    return {step: seconds / n_batches * 1e6 for step, seconds in spent.items()}


def write_costs(n_batches: int) -> dict[str, float]:
    """µs per batch of appending `n_batches` to a fresh file with pwritev, as a segment
    does (an offset stamp and the rest of the batch), for page-aligned 16 KiB batches
    and for 16,500-byte ones, written one, 4 or 16 to a call."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        path = Path(tmp) / "segment.log"
        for size in (16_384, 16_500):
            batch = memoryview(os.urandom(size))[8:]
            for per_call in (1, 4, 16):
                pieces: list[bytes | memoryview] = [b"\0" * 8, batch] * per_call
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
                try:
                    started = time.perf_counter()
                    for position in range(0, n_batches * size, size * per_call):
                        os.pwritev(fd, pieces, position)
                    elapsed = time.perf_counter() - started
                finally:
                    os.close(fd)
                out[f"{size} B x{per_call}"] = elapsed / n_batches * 1e6
    return out


def run_costs(n_batches: int, run_batches: int = 16) -> dict[str, float]:
    """Median µs per batch of `Partition.append_many` on runs of `run_batches`, for one
    idempotent producer's batches in sequence and for plain batches: what idempotence
    adds to the append, write included, without sockets."""
    out: dict[str, float] = {}
    for name, pid in (("idempotent", 1), ("plain", -1)):
        template, count = _batch_template(pid, 0)
        # Every batch its own bytes, as read from a socket: one buffer reused would stay
        # in the CPU cache and make the plain write cheaper than the idempotent one.
        batches = [
            with_sequence(template, 0, i * count) if pid >= 0 else bytes(bytearray(template))
            for i in range(n_batches)
        ]
        headers = [validate(b) for b in batches]
        with tempfile.TemporaryDirectory(dir=".") as tmp:
            partition = _partition(Path(tmp))
            per_batch_us = []
            for start in range(0, n_batches, run_batches):
                started = time.perf_counter()
                partition.append_many(
                    batches[start : start + run_batches], headers[start : start + run_batches], 0
                )
                per_batch_us.append((time.perf_counter() - started) / run_batches * 1e6)
            partition.log.close()
        out[name] = statistics.median(per_batch_us)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--load", choices=LOADS, default="acks1")
    parser.add_argument("--batches", type=int, default=6000, help="per producer")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pieces", action="store_true")
    parser.add_argument("--writes", action="store_true")
    parser.add_argument("--runs", action="store_true")
    args = parser.parse_args()
    if args.runs:
        costs = run_costs(args.batches)
        print(
            ", ".join(f"{k} {v:.2f}" for k, v in costs.items()),
            f"µs/batch; idempotence adds {costs['idempotent'] - costs['plain']:.2f}",
        )
        return
    if args.writes:
        print(", ".join(f"{k} {v:.1f}" for k, v in write_costs(args.batches).items()), "µs/batch")
        return
    if args.pieces:
        steps = pieces(args.batches)
        print(
            ", ".join(f"{k} {v:.1f}" for k, v in steps.items()), f"= {sum(steps.values()):.1f} µs"
        )
        return
    if args.out is None:
        parser.error("--out is required for a profile")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", backend=args.backend).start()
        try:
            assert broker.proc is not None
            args.out.parent.mkdir(parents=True, exist_ok=True)
            command = [spy, "record", "--pid", str(broker.proc.pid), "--rate"]
            command += [str(SAMPLE_RATE_HZ), "--format", "flamegraph", "--output", str(args.out)]
            recorder = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # py-spy attaches
            if args.load == "acks-all-4":
                mb_s, cpu_us, per_fsync = produce_parallel(
                    broker, producers=4, acks=-1, n_batches=args.batches // 4
                )
                figures = f"{mb_s:.0f} MB/s, {cpu_us:.1f} µs/batch, {per_fsync:.1f} batches/fsync"
            else:
                mb_s, cpu_us = _produce(
                    broker, acks=1, idempotent=args.load == "acks1", n_batches=args.batches
                )
                figures = f"{mb_s:.0f} MB/s, {cpu_us:.1f} µs/batch"
            recorder.send_signal(signal.SIGINT)
            recorder.wait(60)
        finally:
            broker.kill()
    print(f"{args.load} {args.backend}: {figures} (profiled at {SAMPLE_RATE_HZ} Hz) -> {args.out}")


if __name__ == "__main__":
    main()
