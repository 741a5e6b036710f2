"""The machine's own limits, measured in the same run as the figures they bound.

A broker figure means little alone on a shared 2-core VM: 300 MB/s is fast
or slow depending on what the disk, the loopback and the codecs allow today.
This suite measures those ceilings, each a median of `RUNS` runs with its
min-max, and `LIMIT_OF` names, for each minibroker figure of the other
suites, the ceiling it is held against (`python -m bench` adds an
`of_limit` column to those rows):

- loopback TCP: one process pumps 256 KiB sends to another (the upper bound of
  any produce or fetch over a socket here);
- sequential writes of 16 KiB chunks: buffered (page cache only), and with one
  fdatasync per write and per 64 writes (`bench_broker.fdatasync_ceiling_mb_s`);
  fdatasync calls per second at 16 KiB follow from the first;
- the codecs on the produce path: msgpack packing 100-byte records, CRC-32
  (the isal one the broker uses), and the broker's record count (C walk).

    python -m bench.bench_limits [--scale 0.1]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from bench import progress
from bench.bench_broker import BATCH_BYTES, RECORD_BYTES, WINDOW, fdatasync_ceiling_mb_s
from bench.stats import table
from protocol.batch import crc32
from protocol.records import RecordColumns, count_records

RUNS = 5
PUMP_CHUNK_BYTES = 256 * 1024
PUMP_BYTES_FULL = 2 << 30
WRITE_CHUNKS_FULL = 16_384  # 256 MiB of 16 KiB chunks
CODEC_CALLS_FULL = 20_000
RECORDS_PER_BATCH = (BATCH_BYTES - 56) // (RECORD_BYTES + 7)

LOOPBACK = "loopback TCP pump, 256 KiB sends"
WRITE_BUFFERED = "sequential write, 16 KiB chunks, page cache"
FSYNC_EACH = "sequential write, one fdatasync per 16 KiB"
FSYNC_WINDOW = f"sequential write, one fdatasync per {WINDOW} x 16 KiB"
FSYNC_CALLS = "fdatasync calls/s at 16 KiB"
PACK = "msgpack pack, 100-byte records"
CRC = "crc32 (isal), 16 KiB"
COUNT = "record count (C walk), 16 KiB batch"

# Which ceiling bounds which minibroker figure: benchmark-name prefix -> limit row.
LIMIT_OF: dict[str, str] = {
    "produce trio acks=1": WRITE_BUFFERED,
    "produce asyncio acks=1": WRITE_BUFFERED,
    "produce trio acks=-1": FSYNC_WINDOW,
    "produce asyncio acks=-1": FSYNC_WINDOW,
    "produce trio 4 producers acks=-1": FSYNC_WINDOW,
    "produce asyncio 4 producers acks=-1": FSYNC_WINDOW,
    "produce trio 4 producers acks=1": WRITE_BUFFERED,
    "produce asyncio 4 producers acks=1": WRITE_BUFFERED,
    "fetch trio": LOOPBACK,
}


def _sink(port: int, total_bytes: int) -> None:
    """The pump's receiving end, in its own process (the other core)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buf = bytearray(PUMP_CHUNK_BYTES)
        received = 0
        while received < total_bytes:
            n = sock.recv_into(buf)
            if not n:
                return
            received += n
        sock.sendall(b"k")


def loopback_mb_s(total_bytes: int) -> float:
    """MB/s of one TCP connection on 127.0.0.1 between two processes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        sink = multiprocessing.get_context("spawn").Process(target=_sink, args=(port, total_bytes))
        sink.start()
        try:
            listener.settimeout(30)
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(60)
                chunk = os.urandom(PUMP_CHUNK_BYTES)
                started = time.perf_counter()
                assert total_bytes % PUMP_CHUNK_BYTES == 0, total_bytes
                for _ in range(total_bytes // PUMP_CHUNK_BYTES):
                    conn.sendall(chunk)
                conn.recv(1)  # the sink has it all
                elapsed = time.perf_counter() - started
        finally:
            sink.join(30)
            if sink.is_alive():
                sink.kill()
    return total_bytes / elapsed / 1e6


def _per_second(action: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        action()
    return calls / (time.perf_counter() - started)


def _row(name: str, values: list[float], unit: str, **extra: Any) -> dict[str, Any]:
    return {
        "benchmark": name,
        "value": statistics.median(values),
        "unit": unit,
        "min_max": f"{min(values):,.1f}-{max(values):,.1f}",
        "runs": len(values),
        **extra,
    }


def run(scale: float = 1.0) -> list[dict[str, Any]]:
    pump_bytes = max(64, int(PUMP_BYTES_FULL * scale) // PUMP_CHUNK_BYTES) * PUMP_CHUNK_BYTES
    chunks = max(WINDOW * 4, int(WRITE_CHUNKS_FULL * scale))
    calls = max(1000, int(CODEC_CALLS_FULL * scale))
    values = [os.urandom(RECORD_BYTES) for _ in range(RECORDS_PER_BATCH)]
    rows_to_pack = [(0, None, v, None) for v in values]
    batch_records = RecordColumns(list[bytes | None](values)).encode()
    payload = os.urandom(BATCH_BYTES)
    figures: dict[str, list[float]] = {
        name: [] for name in (LOOPBACK, WRITE_BUFFERED, FSYNC_EACH, FSYNC_WINDOW, PACK, CRC, COUNT)
    }
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        directory = Path(tmp)
        # One run of every limit per round, so drift on the machine hits them alike.
        for _ in progress.rounds(RUNS, "limits"):
            figures[LOOPBACK].append(loopback_mb_s(pump_bytes))
            figures[WRITE_BUFFERED].append(fdatasync_ceiling_mb_s(directory, chunks, 0))
            figures[FSYNC_EACH].append(fdatasync_ceiling_mb_s(directory, chunks // 8, 1))
            figures[FSYNC_WINDOW].append(fdatasync_ceiling_mb_s(directory, chunks, WINDOW))
            rate = _per_second(lambda: msgpack.packb(rows_to_pack, use_bin_type=True), calls)
            figures[PACK].append(rate * RECORDS_PER_BATCH / 1e6)
            figures[CRC].append(_per_second(lambda: crc32(payload), calls * 10) * BATCH_BYTES / 1e9)
            figures[COUNT].append(_per_second(lambda: count_records(batch_records), calls * 10))
    mb_s_per_call = BATCH_BYTES / 1e6
    return [
        _row(LOOPBACK, figures[LOOPBACK], "MB/s"),
        _row(WRITE_BUFFERED, figures[WRITE_BUFFERED], "MB/s"),
        _row(FSYNC_EACH, figures[FSYNC_EACH], "MB/s"),
        _row(FSYNC_WINDOW, figures[FSYNC_WINDOW], "MB/s"),
        _row(FSYNC_CALLS, [v / mb_s_per_call for v in figures[FSYNC_EACH]], "calls/s"),
        _row(PACK, figures[PACK], "M records/s"),
        _row(CRC, figures[CRC], "GB/s"),
        _row(COUNT, [v / 1e6 for v in figures[COUNT]], "M batches/s"),
    ]


def limit_of(benchmark: str) -> str | None:
    """The limit row that bounds a minibroker figure, by the longest matching prefix."""
    found = [prefix for prefix in LIMIT_OF if benchmark.startswith(prefix)]
    return LIMIT_OF[max(found, key=len)] if found else None


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """No target of their own: these bound the others. One line says how they relate."""
    value = {row["benchmark"]: row["value"] for row in rows}
    return [
        f"- no target: ceilings for the other suites. Grouping {WINDOW} writes per fdatasync "
        f"gives {value[FSYNC_WINDOW] / value[FSYNC_EACH]:.1f}x one fdatasync per write; "
        f"the page cache takes {value[WRITE_BUFFERED]:,.0f} MB/s and the loopback "
        f"{value[LOOPBACK]:,.0f} MB/s.",
    ]


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    rows = run(args.scale)
    print(table(rows))
    print("\n".join(targets(rows)))


if __name__ == "__main__":
    main()
