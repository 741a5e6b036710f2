"""kcat's balanced consumer (`kcat -G group topic`, librdkafka's classic group
protocol) on the kafka listener, both backends: two kcat processes split a topic's
partitions and read every record once; stopped, they commit, and a third resumes at
the committed offsets. Skipped where kcat is not installed."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import confluent_kafka
import pytest

from client.admin import list_group_offsets
from tests.kafka.test_kafka_groups import DEADLINE_S, PARTITIONS, Stack, stack

KCAT = shutil.which("kcat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed")
__all__ = ["stack"]  # the fixture, shared with test_kafka_groups.py

REBALANCED = re.compile(r"rebalanced \(memberid \S+\): (assigned|revoked): (.*)")
PARTITION = re.compile(r"\[(\d+)\]")


class KcatMember:
    """A `kcat -G` process: what it printed (partition, offset, value per line) and the
    partitions its last rebalances left it, read from its stderr."""

    def __init__(self, stack: Stack, group: str, topic: str, *extra: str) -> None:
        assert KCAT is not None
        self.proc = subprocess.Popen(
            [
                KCAT,
                "-b",
                stack.kafka,
                "-u",  # each line as it is read: stdout is a pipe here
                "-G",
                group,
                "-f",
                "%p %o %s\n",
                "-X",
                "auto.offset.reset=earliest",
                "-X",
                "session.timeout.ms=3000",
                "-X",
                "heartbeat.interval.ms=200",
                "-X",
                "auto.commit.interval.ms=200",
                *extra,
                topic,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lock = threading.Lock()
        self.reads: list[tuple[int, int, str]] = []
        self.held: set[int] = set()
        self.log: list[str] = []
        self.readers = [
            threading.Thread(target=self._out, daemon=True),
            threading.Thread(target=self._err, daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def _out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            partition, offset, value = line.rstrip("\n").split(" ", 2)
            with self.lock:
                self.reads.append((int(partition), int(offset), value))

    def _err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.lock:
                self.log.append(line)
                found = REBALANCED.search(line)
                if found:
                    partitions = {int(p) for p in PARTITION.findall(found.group(2))}
                    if found.group(1) == "assigned":
                        self.held |= partitions
                    else:
                        self.held -= partitions

    def assignment(self) -> set[int]:
        with self.lock:
            return set(self.held)

    def values(self) -> list[str]:
        with self.lock:
            return [v for _, _, v in self.reads]

    def stop(self) -> None:
        """SIGTERM: kcat closes its consumer, which commits what it read and leaves."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(DEADLINE_S) == 0, "".join(self.log)
        for reader in self.readers:
            reader.join(DEADLINE_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(DEADLINE_S)


@pytest.fixture
def kcats() -> Iterator[list[KcatMember]]:
    made: list[KcatMember] = []
    yield made
    for member in made:
        member.kill()


def produce(stack: Stack, topic: str, tag: str, count: int) -> set[str]:
    producer = confluent_kafka.Producer({"bootstrap.servers": stack.kafka})
    values = [f"{tag}-{i}" for i in range(count)]
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % PARTITIONS)
    assert producer.flush(DEADLINE_S) == 0
    return set(values)


def wait_for(what: str, done: Callable[[], bool], *members: KcatMember) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            logs = "\n".join("".join(m.log) for m in members)
            raise AssertionError(f"{what} within {DEADLINE_S}s\n{logs}")
        time.sleep(0.05)


def test_two_kcat_members_split_then_a_third_resumes_at_their_commits(
    stack: Stack, kcats: list[KcatMember]
) -> None:
    topic = stack.new_topic("kcat-group")
    group = f"g-{uuid.uuid4().hex[:8]}"
    a = KcatMember(stack, group, topic)
    kcats.append(a)
    wait_for("no assignment", lambda: a.assignment() == set(range(PARTITIONS)), a)
    b = KcatMember(stack, group, topic)
    kcats.append(b)

    def split() -> bool:
        held = [a.assignment(), b.assignment()]
        return all(held) and sum(map(len, held)) == PARTITIONS == len(held[0] | held[1])

    wait_for("no split", split, a, b)
    sent = produce(stack, topic, "first", 40)
    wait_for("not every record read", lambda: set(a.values() + b.values()) >= sent, a, b)
    assert sorted(a.values() + b.values()) == sorted(sent), "a record read twice"
    for member in (a, b):
        assert {p for p, _, _ in member.reads} <= member.assignment()
    a.stop()
    b.stop()
    committed = list_group_offsets(stack.broker.address("mb"), group)
    assert {tp.partition: om.offset for tp, om in committed.items()} == {
        p: 10 for p in range(PARTITIONS)
    }

    more = produce(stack, topic, "second", 20)
    assert KCAT is not None
    done = subprocess.run(
        [KCAT, "-b", stack.kafka, "-G", group, "-e", "-f", "%s\n", topic],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == sorted(more), done.stderr
