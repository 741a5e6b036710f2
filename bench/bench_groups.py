"""What consumer groups cost the broker: RSS for `max_groups` (10,000) groups.

    python -m bench.bench_groups [--groups 10000] [--members 1] [--backend trio]

Starts the real broker, creates a topic of 6 partitions, and joins `--members`
members into each of `--groups` groups (pipelined over one connection), then
heartbeats every member once more (each reporting what it owns, as a consumer
does). Prints the broker's RSS before and after, per group, and the rate of joins
and heartbeats.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.broker_process import BrokerProcess
from harness.wire import WireClient

PIPELINE = 500


def _pipelined(c: WireClient, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for start in range(0, len(requests), PIPELINE):
        chunk = requests[start : start + PIPELINE]
        for request in chunk:
            c.send("ConsumerGroupHeartbeat", **request)
        out += [c.recv() for _ in chunk]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--backend", default="trio")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", backend=args.backend).start()
        try:
            with WireClient(broker.bootstrap, timeout_s=120) as c:
                assert c.create_topic("t", 6) == 0
                before = broker.rss_kib()
                joins = [
                    {
                        "group_id": f"group-{g:05d}",
                        "member_id": "",
                        "member_epoch": 0,
                        "rebalance_timeout_ms": 60_000,
                        "subscribed_topics": ["t"],
                        "client_id": "bench",
                    }
                    for g in range(args.groups)
                    for _ in range(args.members)
                ]
                started = time.perf_counter()
                joined = _pipelined(c, joins)
                join_s = time.perf_counter() - started
                assert all(r["error"] == 0 for r in joined), joined[:3]
                beats = [
                    {
                        "group_id": j["group_id"],
                        "member_id": r["member_id"],
                        "member_epoch": r["member_epoch"],
                        "rebalance_timeout_ms": 60_000,
                        "owned": r["assignment"],
                    }
                    for j, r in zip(joins, joined, strict=True)
                ]
                started = time.perf_counter()
                answered = _pipelined(c, beats)
                beat_s = time.perf_counter() - started
                assert all(r["error"] == 0 for r in answered), answered[:3]
                listed = c.call("ListGroups")["groups"]
                assert len(listed) == args.groups
                after = broker.rss_kib()
        finally:
            broker.kill()
    members = args.groups * args.members
    print(f"backend={args.backend} groups={args.groups:,} members_per_group={args.members}")
    print(f"rss_before_kib={before:,} rss_after_kib={after:,} delta_kib={after - before:,}")
    print(f"per_group_kib={(after - before) / args.groups:.2f}")
    print(f"joins_per_s={members / join_s:,.0f} heartbeats_per_s={members / beat_s:,.0f}")


if __name__ == "__main__":
    main()
