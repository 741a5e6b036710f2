"""`make bench`: run the benchmark suites, print their tables, rewrite docs/benchmarks.md.

Each suite's section in the document is replaced only when that suite ran, so
`python -m bench --suites client` refreshes one section and keeps the rest.
Every section names the command that produced it. Targets are checked as
ratios or floors against figures measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SUITES = ("broker", "codec", "metrics", "client", "txn", "spark", "offsets")


def table(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c, "")
            cells.append(
                f"{v:,.1f}"
                if isinstance(v, float)
                else f"{v:,}"
                if isinstance(v, int) and not isinstance(v, bool)
                else str(v)
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _value(rows: list[dict[str, Any]], name: str, key: str = "value") -> float:
    for row in rows:
        if row.get("benchmark") == name:
            return float(row[key])
    raise KeyError(name)


def _row(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for row in rows:
        if row.get("benchmark") == name:
            return row
    raise KeyError(name)


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _cost_verdict(row: dict[str, Any], limit_pct: float = 3.0) -> str:
    """A cost is judged by its interval: a median under the limit whose interval
    reaches over it has not shown anything yet."""
    if row["ci95_high"] <= limit_pct:
        return "met"
    if row["ci95_low"] > limit_pct:
        return "MISSED"
    return "not shown (the interval spans the limit)"


def broker_targets(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for backend in ("trio", "asyncio"):
        acks1 = _value(rows, f"produce {backend} acks=1 idempotent")
        acks_all = _value(rows, f"produce {backend} acks=-1 idempotent")
        ceiling = _value(rows, "fdatasync ceiling, one per 64 writes")
        ceiling_each = _value(rows, "fdatasync ceiling, one per 16 KiB write")
        rss = _value(rows, f"broker RSS {backend}, 100 partitions x 10,000 producers")
        # Costs compare broker CPU per batch: wall-clock MB/s on a shared machine
        # measures the neighbours as much as the broker.
        cpu = "broker_cpu_us_per_batch"
        idem_cpu = _value(rows, f"produce {backend} acks=1 idempotent", cpu)
        parallel = f"produce {backend} 4 producers acks=-1 idempotent"
        parallel_mb_s = _value(rows, parallel)
        parallel_ceiling = _value(rows, f"fdatasync ceiling, one per 64 writes ({backend} rounds)")
        costs = {
            name: _row(rows, f"cost of {name} {backend}, broker CPU per batch")
            for name in ("idempotence", "metrics")
        }
        out += [
            f"- {backend}: acks=1 idempotent {acks1:.0f} MB/s against a 150 MB/s floor: "
            f"{_verdict(acks1 >= 150)}.",
            f"- {backend}: acks=-1 {acks_all:.0f} MB/s is {acks_all / ceiling:.0%} of the "
            "fdatasync ceiling with one fsync per 64 writes (60% wanted): "
            f"{_verdict(acks_all >= 0.6 * ceiling)}; it is {acks_all / ceiling_each:.1f}x "
            "the ceiling of one fsync per 16 KiB batch.",
            f"- {backend}: broker CPU per 16 KiB batch at acks=1 is {idem_cpu:.0f} µs "
            f"(at most 30 µs wanted): {_verdict(idem_cpu <= 30)}.",
            f"- {backend}: 4 producer processes at acks=-1 reach {parallel_mb_s:.0f} MB/s, "
            f"{_row(rows, parallel)['of_ceiling']} of the fdatasync ceiling of the same rounds "
            f"(median, min-max; 60% wanted): {_verdict(parallel_mb_s >= 0.6 * parallel_ceiling)}; "
            f"{_value(rows, parallel, 'batches_per_fsync'):.0f} batches per fsync.",
            *(
                f"- {backend}: {name} costs {row['value']:+.1f}% broker CPU per batch, median of "
                f"{row['rounds']} paired rounds, 95% CI {row['ci95_low']:+.1f} to "
                f"{row['ci95_high']:+.1f}% (at most 3% wanted): {_cost_verdict(row)}."
                for name, row in costs.items()
            ),
            f"- {backend}: RSS {rss:.0f} MB with 100 partitions and 10,000 producers "
            f"(under 150 MB wanted): {_verdict(rss < 150)}.",
        ]
    return out


def codec_targets(rows: list[dict[str, Any]]) -> list[str]:
    # No target of its own: the codec must not be the slow part of a request. The
    # ratio says how it compares with decoding the same bytes into plain maps.
    decode = _value(rows, "codec Produce request decode (broker)", "ratio")
    return [
        f"- a typed, validated Produce decode runs at {decode:.1f}x plain msgpack's "
        "untyped decode of the same bytes (a hand-written codec on msgpack is at most 1x).",
    ]


def metrics_targets(rows: list[dict[str, Any]]) -> list[str]:
    # No target of its own: the broker suite's "metrics off" rows judge the cost end
    # to end; this suite says where it goes.
    produce = _value(rows, "metrics observe_request", "enabled_ns") + _value(
        rows, "metrics record_produce", "enabled_ns"
    )
    return [
        f"- a Produce to one partition costs {produce:,.0f} ns of metrics work "
        "(observe_request + record_produce); the broker suite's metrics-off rows judge "
        "the cost per batch (under 3% wanted).",
    ]


def client_targets(rows: list[dict[str, Any]]) -> list[str]:
    send = _value(rows, "producer send()", "records_per_sec")
    batch = _value(rows, "producer send_batch()", "records_per_sec")
    consume = _value(rows, "consumer poll()", "records_per_sec")
    return [
        f"- send(): {send:,.0f} records/s against 400,000: {_verdict(send >= 400_000)}.",
        f"- send_batch(): {batch:,.0f} records/s against 2,000,000: "
        f"{_verdict(batch >= 2_000_000)}.",
        f"- consumer: {consume:,.0f} records/s against 1,000,000: "
        f"{_verdict(consume >= 1_000_000)}.",
    ]


def txn_targets(rows: list[dict[str, Any]]) -> list[str]:
    plain = _value(rows, "send() idempotent, no transaction", "records_per_s")
    thousand = _value(rows, "send() in transactions of 1,000 records", "records_per_s")
    return [
        f"- transactions of 1,000 records: {thousand:,.0f} records/s, "
        f"{1 - thousand / plain:+.1%} slower than idempotent-only {plain:,.0f} "
        f"(at most 10% wanted): {_verdict(thousand >= 0.9 * plain)}.",
    ]


def spark_targets(rows: list[dict[str, Any]]) -> list[str]:
    ours = _value(rows, "spark write minibroker exactly_once", "rows_per_s")
    loose = _value(rows, "spark write minibroker at_least_once", "rows_per_s")
    ceiling = _value(rows, "spark write discard-only Python Arrow writer", "rows_per_s")
    stream = next(r for r in rows if str(r["benchmark"]).startswith("spark stream"))
    return [
        f"- exactly_once {ours:,.0f} rows/s costs {loose / ours - 1:+.1%} over at_least_once "
        f"{loose:,.0f} (at most 10% wanted): {_verdict(ours * 1.1 >= loose)}.",
        f"- minibroker write (exactly_once) is {ours / ceiling:.0%} of the discard-only "
        f"Arrow writer (50% wanted): {_verdict(ours >= 0.5 * ceiling)}; against the "
        f"1,000,000 rows/s floor: {_verdict(ours >= 1_000_000)}.",
        f"- streaming A -> B at {stream['rate_per_s']:,} records/s: end-to-end p50 "
        f"{stream['p50_ms']:,.0f} ms, p99 {stream['p99_ms']:,.0f} ms (no target; a micro-batch "
        "per trigger bounds it from below).",
    ]


def offsets_targets(rows: list[dict[str, Any]]) -> list[str]:
    small = _value(rows, "10,000 groups x 1 partitions", "rss_mb")
    cap = _value(rows, "10,000 groups x 100 partitions", "rss_mb")
    per_offset = _value(rows, "10,000 groups x 100 partitions", "bytes_per_offset")
    restart = _value(rows, "10,000 groups x 100 partitions", "restart_s")
    return [
        f"- 10,000 groups with an offset each: broker RSS {small:.0f} MB.",
        f"- 1,000,000 offsets (the default max_committed_offsets): RSS {cap:.0f} MB, "
        f"{per_offset:.0f} bytes per offset, restart {restart:.1f} s (under 512 MB "
        f"wanted): {_verdict(cap < 512)}.",
    ]


def run_suite(name: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], str, Callable]:
    if name == "broker":
        from bench import bench_broker

        return (
            bench_broker.run(args.broker_batches),
            f"python -m bench --suites broker --broker-batches {args.broker_batches}",
            broker_targets,
        )
    if name == "codec":
        from bench import bench_codec

        return (
            bench_codec.run(args.codec_number),
            f"python -m bench --suites codec --codec-number {args.codec_number}",
            codec_targets,
        )
    if name == "metrics":
        from bench import bench_metrics

        return (
            bench_metrics.run(args.metrics_number),
            f"python -m bench --suites metrics --metrics-number {args.metrics_number}",
            metrics_targets,
        )
    if name == "client":
        from bench import bench_client

        return (
            bench_client.run(args.client_records),
            f"python -m bench --suites client --client-records {args.client_records}",
            client_targets,
        )
    if name == "txn":
        from bench import bench_txn

        return (
            bench_txn.run(args.txn_records),
            f"python -m bench --suites txn --txn-records {args.txn_records}",
            txn_targets,
        )
    if name == "offsets":
        from bench import bench_offsets

        return bench_offsets.run(), "python -m bench --suites offsets", offsets_targets
    from bench import bench_spark

    return (
        bench_spark.run(args.spark_rows),
        f"python -m bench --suites spark --spark-rows {args.spark_rows}",
        spark_targets,
    )


def machine() -> str:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True)
    java_line = (java.stderr.splitlines() or ["?"])[0]
    return (
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}, {java_line}; shared and noisy, so each "
        f"figure is a median of rounds and targets compare figures of one run."
    )


def section(name: str, body: str) -> str:
    return f"<!-- suite:{name} -->\n{body}\n<!-- /suite:{name} -->"


def main() -> None:
    parser = argparse.ArgumentParser(description="run benchmarks and rewrite docs/benchmarks.md")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--broker-batches", type=int, default=6000)
    parser.add_argument("--codec-number", type=int, default=100_000)
    parser.add_argument("--metrics-number", type=int, default=200_000)
    parser.add_argument("--client-records", type=int, default=1_000_000)
    parser.add_argument("--txn-records", type=int, default=20_000)
    parser.add_argument("--spark-rows", type=int, default=5_000_000)
    args = parser.parse_args()
    suites = [s for s in args.suites.split(",") if s]
    old = DOC.read_text() if DOC.exists() else ""
    sections = {
        m.group(1): m.group(0)
        for m in re.finditer(r"<!-- suite:(\w+) -->.*?<!-- /suite:\1 -->", old, re.S)
    }
    for name in suites:
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        rows, command, targets = run_suite(name, args)
        try:
            verdicts = "\n".join(targets(rows))
        except KeyError as exc:
            verdicts = f"- targets not evaluated: no row {exc}"
        body = (
            f"## {name}\n\nMeasured {started} with `{command}` on {machine()}\n\n"
            f"{table(rows)}\n\nTargets:\n\n{verdicts}\n"
        )
        print(body)
        sections[name] = section(name, body)
    header = (
        "# Benchmarks\n\n`make bench` runs every suite below and rewrites this file; "
        "each section names the command that made its figures. Notes on the figures "
        "are in [benchmark-notes.md](benchmark-notes.md).\n"
    )
    DOC.write_text(header + "\n" + "\n\n".join(sections[s] for s in SUITES if s in sections) + "\n")


if __name__ == "__main__":
    main()
