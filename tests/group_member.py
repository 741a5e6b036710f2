"""One consumer-group member as its own process, for tests that SIGKILL a member.

    python -m tests.group_member BOOTSTRAP GROUP TOPIC

Consumes TOPIC in GROUP with auto-commit off and commits after processing each
poll. It reports on stdout, one JSON object per line (times are
`time.monotonic()`, which all processes of the machine share):
{"event": "assigned" | "revoked" | "lost", "t": ..., "partitions": [[topic, p]]},
{"event": "records", "values": [...]} then {"event": "committed"} once those
records' offsets are durable.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from client import Consumer, ConsumerRebalanceListener, TopicPartition


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class Reporter(ConsumerRebalanceListener):
    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        report(event="assigned", t=time.monotonic(), partitions=sorted(assigned))

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        report(event="revoked", t=time.monotonic(), partitions=sorted(revoked))

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        report(event="lost", t=time.monotonic(), partitions=sorted(lost))


def main(bootstrap: str, group: str, topic: str) -> None:
    with Consumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        listener=Reporter(),
    ) as consumer:
        report(event="started")
        while True:
            batch = consumer.poll(timeout_ms=100)
            values = [r.value.decode() for records in batch.values() for r in records if r.value]
            if values:
                report(event="records", values=values)
                consumer.commit()
                report(event="committed")


if __name__ == "__main__":
    main(*sys.argv[1:4])
