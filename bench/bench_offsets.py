"""Committed offsets: what they cost the broker in memory, and how fast they are committed.

For each case a fresh broker (trio) gets one topic, then every group commits one
offset per partition of it with OffsetCommit (member_id "", epoch -1), pipelined
over 16 connections so fsync rounds are shared. Reported: broker RSS before and
after, the growth per committed offset, commits per second, and the RSS and
start time after a kill -9 and restart (the offsets log replayed).

- 10,000 groups x 1 partition: many small groups.
- 1,000 groups x 100 partitions: fewer, wide groups.
- 10,000 groups x 100 partitions: 1,000,000 offsets, the default max_committed_offsets.

    .venv/bin/python -m bench.bench_offsets
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_broker import _rss_bytes
from bench.stats import table
from harness.broker_process import BrokerProcess
from harness.wire import WireClient

CONNECTIONS = 16
WINDOW = 64  # requests in flight per connection
CASES = ((10_000, 1), (1_000, 100), (10_000, 100))


def commit_all(bootstrap: str, groups: int, partitions: int) -> float:
    """Seconds to commit an offset for every (group, partition)."""
    topics = [
        {
            "topic": "bench",
            "partitions": [{"partition": p, "offset": 1_000 + p} for p in range(partitions)],
        }
    ]

    def worker(first: int) -> None:
        with WireClient(bootstrap, timeout_s=300) as c:
            pending = 0
            for g in range(first, groups, CONNECTIONS):
                c.send("OffsetCommit", group_id=f"group-{g:06d}", topics=topics)
                pending += 1
                if pending >= WINDOW:
                    _check(c.recv())
                    pending -= 1
            for _ in range(pending):
                _check(c.recv())

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def _check(response: dict[str, Any]) -> None:
    errors = {p["error"] for t in response["topics"] for p in t["partitions"]}
    assert response["error"] == 0 and errors == {0}, response


def case(groups: int, partitions: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            with WireClient(broker.bootstrap) as c:
                assert c.create_topic("bench", partitions) == 0
            assert broker.proc is not None
            before = _rss_bytes(broker.proc.pid)
            seconds = commit_all(broker.bootstrap, groups, partitions)
            after = _rss_bytes(broker.proc.pid)
            wal = Path(tmp) / "data" / "groups" / "offsets.wal"
            wal_bytes = wal.stat().st_size
            broker.kill()
            started = time.perf_counter()
            broker.start()
            restart_s = time.perf_counter() - started
            assert broker.proc is not None
            restarted = _rss_bytes(broker.proc.pid)
        finally:
            broker.kill()
    offsets = groups * partitions
    return {
        "benchmark": f"{groups:,} groups x {partitions} partitions",
        "offsets": offsets,
        "rss_mb": after / 2**20,
        "growth_mb": (after - before) / 2**20,
        "bytes_per_offset": (after - before) / offsets,
        "commits_per_s": groups / seconds,
        "log_mb": wal_bytes / 2**20,
        "restart_s": restart_s,
        "rss_after_restart_mb": restarted / 2**20,
    }


def run() -> list[dict[str, Any]]:
    return [case(groups, partitions) for groups, partitions in CASES]


def main() -> None:

    print(table(run()))


if __name__ == "__main__":
    main()
