"""Flame graph of the broker process under one of the broker suite's produce loads.

Starts a broker, attaches py-spy (`pip install py-spy`) to it, runs the load,
stops py-spy (SIGINT makes it write the SVG) and prints the load's figures, so
a profile and the numbers it explains come from the same run:

    python -m bench.profile_broker --backend trio --load acks1 --out docs/profiles/acks1-trio.svg
    python -m bench.profile_broker --load acks-all-4 --out docs/profiles/acks-all-4-trio.svg
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_broker import _produce, produce_parallel
from harness.broker_process import BrokerProcess

LOADS = ("acks1", "acks1-plain", "acks-all-4")
SAMPLE_RATE_HZ = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--load", choices=LOADS, default="acks1")
    parser.add_argument("--batches", type=int, default=6000, help="per producer")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
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
