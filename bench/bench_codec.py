"""Messages per second through the wire codec (protocol/messages.py), in process.

The hot path of every request is one decode on the broker and one encode on the
client, and the reverse for the answer. Each case is timed beside plain
`msgpack` on the same bytes (decode to generic maps, encode of the same maps):
the floor any hand-written codec on top of msgpack would start from, since it
must decode first and then check and copy every field. Best of `REPEAT` rounds;

    .venv/bin/python -m bench.bench_codec [--number N] [--against e7c7b94]

prints the rows alone, without touching docs/benchmarks.md. `--against REV` also
times the codec of that commit (its protocol/messages.py, taken with `git show`,
which parsed msgpack maps field by field) on the same bytes, in interleaved rounds:
the before-and-after of the declared codec.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from protocol import messages as m
from protocol.batch import build_batch_from_columns

REPEAT = 5


def _cases() -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (our codec, plain msgpack on the same message)."""
    batch = build_batch_from_columns(
        [b"x" * 1000] * 16, None, 1, producer_id=1, producer_epoch=0, base_sequence=0
    )
    produce = m.ProduceRequest(
        acks=-1,
        timeout_ms=30_000,
        topics=[m.ProduceTopic("orders", [m.ProducePartition(0, memoryview(batch))])],
    )
    produce_body = m.encode_request(produce, 7)
    fetch = m.FetchRequest(
        topics=[m.FetchTopic("orders", [m.FetchPartition(i, 100, 1 << 20) for i in range(3)])]
    )
    fetch_body = m.encode_request(fetch, 9)
    answer = m.ProduceResponse(
        topics=[m.ProduceTopicResponse("orders", [m.ProducePartitionResponse(0, 0, 100, -1, 0)])]
    )
    answer_body = m.encode_response(answer, 7)
    maps = {
        body: msgpack.unpackb(body, raw=False) for body in (produce_body, fetch_body, answer_body)
    }

    def plain_decode(body: bytes) -> Callable[[], object]:
        return lambda: msgpack.unpackb(body, raw=False)

    def plain_encode(body: bytes) -> Callable[[], object]:
        return lambda: msgpack.packb(maps[body], use_bin_type=True)

    return {
        "Produce request decode (broker)": (
            lambda: m.decode_request(produce_body),
            plain_decode(produce_body),
        ),
        "Produce request encode (client)": (
            lambda: m.encode_request(produce, 7),
            plain_encode(produce_body),
        ),
        "Fetch request decode (broker)": (
            lambda: m.decode_request(fetch_body),
            plain_decode(fetch_body),
        ),
        "Produce response encode (broker)": (
            lambda: m.encode_response(answer, 7),
            plain_encode(answer_body),
        ),
        "Produce response decode (client)": (
            lambda: m.decode_response(answer_body, m.ProduceResponse),
            plain_decode(answer_body),
        ),
    }


def _per_sec(fn: Callable[[], object], number: int) -> float:
    return number / min(timeit.repeat(fn, number=number, repeat=REPEAT))


def run(number: int = 100_000) -> list[dict[str, Any]]:
    """One row per case: messages/s through our codec and through plain msgpack."""
    rows = []
    for name, (ours, plain) in _cases().items():
        ours_s = _per_sec(ours, number)
        plain_s = _per_sec(plain, number)
        rows.append(
            {
                "benchmark": f"codec {name}",
                "messages_per_sec": ours_s,
                "plain_msgpack_per_sec": plain_s,
                "ratio": round(ours_s / plain_s, 2),
            }
        )
    return rows


def _old_cases(rev: str) -> dict[str, Callable[[], object]]:
    """The same messages through the codec of commit `rev` (dicts and from_wire)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:protocol/messages.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_messages.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_messages", path)
    assert spec is not None and spec.loader is not None
    o: Any = importlib.util.module_from_spec(spec)
    sys.modules["old_messages"] = o
    spec.loader.exec_module(o)
    batch = build_batch_from_columns(
        [b"x" * 1000] * 16, None, 1, producer_id=1, producer_epoch=0, base_sequence=0
    )
    produce = o.ProduceRequest(-1, 30_000, [("orders", [(0, batch)])])
    body = msgpack.packb(o.request_to_wire(produce, 7), use_bin_type=True)
    fetch = o.FetchRequest([("orders", [o.FetchPartition(i, 100, 1 << 20) for i in range(3)])])
    fetch_body = msgpack.packb(o.request_to_wire(fetch, 9), use_bin_type=True)
    answer = o.ProduceResponse([("orders", [o.ProducePartitionResponse(0, 0, 100, -1, 0)])])
    answer_body = msgpack.packb({**answer.to_wire(), "cid": 7}, use_bin_type=True)

    def decode(raw: bytes) -> object:
        return o.parse_request(msgpack.unpackb(raw, raw=False, strict_map_key=False))

    return {
        "Produce request decode (broker)": lambda: decode(body),
        "Produce request encode (client)": lambda: msgpack.packb(
            o.request_to_wire(produce, 7), use_bin_type=True
        ),
        "Fetch request decode (broker)": lambda: decode(fetch_body),
        "Produce response encode (broker)": lambda: msgpack.packb(
            {**answer.to_wire(), "cid": 7}, use_bin_type=True
        ),
        "Produce response decode (client)": lambda: o.ProduceResponse.from_wire(
            msgpack.unpackb(answer_body, raw=False)
        ),
    }


def compare(rev: str, number: int) -> None:
    """Print before (commit `rev`) and after per case: medians of interleaved rounds."""
    old = _old_cases(rev)
    print(f"{'case':36s} {rev + '/s':>12s} {'now/s':>12s}  now/before, median (min-max)")
    for name, (ours, _) in _cases().items():
        before, after = [], []
        for _ in range(7):
            before.append(number / timeit.timeit(old[name], number=number))
            after.append(number / timeit.timeit(ours, number=number))
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        print(
            f"{name:36s} {statistics.median(before):12,.0f} {statistics.median(after):12,.0f}"
            f"  x{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=100_000, help="calls per round")
    parser.add_argument("--against", metavar="REV", help="also time this commit's codec")
    args = parser.parse_args()
    if args.against:
        compare(args.against, max(args.number // 5, 1))
        return
    for row in run(args.number):
        print(
            f"{row['benchmark']:44s} {row['messages_per_sec']:12,.0f}/s  "
            f"plain msgpack {row['plain_msgpack_per_sec']:12,.0f}/s  x{row['ratio']}"
        )


if __name__ == "__main__":
    main()
