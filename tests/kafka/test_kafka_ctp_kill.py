"""Consume-transform-produce with confluent-kafka through kills, on both backends: the
loop (tests/kafka/kafka_ctp_loop.py, a process of its own: a read_committed static group
member and a transactional producer sending its offsets with the group metadata) runs
while the broker is SIGKILLed and restarted on its data dir, then is SIGKILLed itself
and restarted, and finally drains the input; the output, read at read_committed, holds
every input exactly once."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest

from tests.conftest import BACKENDS
from tests.kafka.kafka_support import DEADLINE_S, KafkaStack, stack_per_backend
from tests.kafka.test_kafka_transactions import PARTITIONS, read_all

ROOT = Path(__file__).resolve().parents[2]
PER_PARTITION = 150  # input records per partition and round


@pytest.fixture(scope="module", params=BACKENDS)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaStack]:
    yield from stack_per_backend(request, tmp_path_factory, "ctp-kill", proxied=False)


class Loop:
    """One run of the loop, its output lines read by a thread as they come."""

    def __init__(self, stack: KafkaStack, *args: str) -> None:
        command = [sys.executable, "-m", "tests.kafka.kafka_ctp_loop", stack.kafka, *args]
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def wait_for(self, prefix: str) -> bool:
        """Whether a line starting with `prefix` comes before the loop ends (or the
        deadline passes); the lines read meanwhile are kept in `seen`."""
        deadline = time.monotonic() + DEADLINE_S
        while (left_s := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left_s)
            except queue.Empty:
                return False
            if line is None:
                return False
            self.seen.append(line)
            if line.startswith(prefix):
                return True
        return False

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def produce_inputs(bootstrap: str, topic: str, tag: str) -> list[bytes]:
    values = [f"{tag}-{p}-{i}".encode() for p in range(PARTITIONS) for i in range(PER_PARTITION)]
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i // PER_PARTITION)
    assert producer.flush(DEADLINE_S) == 0
    return values


def test_consume_transform_produce_is_exactly_once_through_kills(stack: KafkaStack) -> None:
    """The loop gets through the broker's kill by itself (its open transaction's
    requests fail, it aborts and reads the batch again; its consumer rejoins the group
    the restart forgot, answered UNKNOWN_MEMBER_ID meanwhile), and a restarted loop
    takes over from the committed offsets."""
    source = stack.new_topic("ctp-kill-in", partitions=PARTITIONS)
    sink = stack.new_topic("ctp-kill-out", partitions=PARTITIONS)
    group = f"ctp-kill-{uuid.uuid4().hex[:8]}"
    inputs = produce_inputs(stack.kafka, source, "r1")
    loop = Loop(stack, source, sink, group)
    try:
        assert loop.wait_for("committed"), loop.seen
        # The broker dies under the running loop, mid-transaction or between two.
        stack.broker.restart()
        assert loop.wait_for("committed"), loop.seen
        inputs += produce_inputs(stack.kafka, source, "r2")
        assert loop.wait_for("committed"), loop.seen
        # The loop dies mid-run and is restarted: the new instance fences the old
        # transactional id and aborts what it left open.
        loop.kill()
        loop = Loop(stack, source, sink, group)
        assert loop.wait_for("committed"), loop.seen
    finally:
        loop.kill()
    drain = Loop(stack, source, sink, group, "--idle-exit-ms", "2000")
    try:
        assert drain.proc.wait(DEADLINE_S) == 0, drain.seen
    finally:
        drain.kill()
    output = Counter(read_all("confluent-kafka", stack.kafka, sink, len(inputs), "read_committed"))
    expected = Counter(v.upper() for v in inputs)
    missing, doubled = sorted(expected - output), sorted(output - expected)
    assert output == expected, f"missing {missing[:5]}, doubled {doubled[:5]}"
