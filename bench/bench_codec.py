"""Messages per second through the wire codec (protocol/messages.py), in process.

The hot path of every request is one decode on the broker and one encode on the
client, and the reverse for the answer. Each case is timed beside plain
`msgpack` on the same bytes (decode to generic maps, encode of the same maps):
the floor any hand-written codec on top of msgpack would start from, since it
must decode first and then check and copy every field. Best of `REPEAT` rounds;

    .venv/bin/python -m bench.bench_codec [--number N]

prints the rows alone, without touching docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
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
        topics=[m.ProduceTopic("orders", [m.ProducePartition(0, batch)])],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=100_000, help="calls per round")
    for row in run(parser.parse_args().number):
        print(
            f"{row['benchmark']:44s} {row['messages_per_sec']:12,.0f}/s  "
            f"plain msgpack {row['plain_msgpack_per_sec']:12,.0f}/s  x{row['ratio']}"
        )


if __name__ == "__main__":
    main()
