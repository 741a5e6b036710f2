"""Consumer groups end to end: the client SDK against the real broker process, both backends.

- Three members share a 6-partition topic; one leaves, one is SIGKILLed (no
  leave: the broker's session timeout removes it), one joins. Every ownership
  interval, from the rebalance callbacks, is checked: no partition ever has two
  owners, and the broker's view (DescribeGroups) agrees at every step. Together
  the members read every record exactly once (auto-commit off, commit after
  processing).
- Committed offsets survive a broker kill -9; a new consumer resumes from them.
- A member that lost its partitions cannot commit for them, in or out of a
  transaction; one the broker forgot (a restart) is refused, learns it, rejoins
  and resumes from the committed offset.
- Static membership: a consumer started with a running one's `group_instance_id`
  takes its partitions at once and the old one can no longer commit; one that
  closes keeps its partitions for the session timeout.
- The consume-transform-produce loop of examples/exactly_once_loop.py, SIGKILLed
  at seeded random points 20 times and restarted: the output topic, read
  committed, holds each input record's transform exactly once. Killed and
  restarted under the default 45 s session timeout, it commits again in well
  under it (static membership), still exactly once.
- `minibroker groups list | describe | reset-offsets`.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import random
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from client import (
    CommitFailedError,
    Consumer,
    ConsumerRebalanceListener,
    FencedInstanceIdError,
    NonEmptyGroupError,
    Producer,
    TopicPartition,
    TxnOffsetCommitFailedError,
    UnknownMemberIdError,
)
from client.admin import (
    alter_group_offsets,
    create_topic,
    describe_groups,
    list_group_offsets,
    list_groups,
)
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from tests.reliability.conftest import config_file

ROOT = Path(__file__).resolve().parents[3]
SESSION_MS = 3_000
HEARTBEAT_MS = 100
LIMIT_S = 60.0
FAST = {"retry_backoff_ms": 20, "request_timeout_ms": 10_000, "fetch_max_wait_ms": 100}


def group_broker(
    tmp_path: Path, backend: str, session_ms: int = SESSION_MS, heartbeat_ms: int = HEARTBEAT_MS
) -> BrokerProcess:
    settings = (
        f"group_session_timeout_ms = {session_ms}\n"
        f"group_heartbeat_interval_ms = {min(heartbeat_ms, session_ms // 5)}\n"
    )
    return BrokerProcess(
        tmp_path / "data", backend=backend, extra_args=config_file(tmp_path, settings)
    ).start()


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    proc = group_broker(tmp_path, backend)
    try:
        yield proc
    finally:
        proc.kill()


def wait_for(
    condition: Callable[[], bool],
    what: str,
    step: Callable[[], object] = lambda: None,
    limit_s: float = LIMIT_S,
) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        step()
        time.sleep(0.005)


def produce(bootstrap: str, topic: str, values: dict[int, list[str]]) -> None:
    with Producer(bootstrap) as producer:
        for partition, items in values.items():
            producer.send_batch(topic, [v.encode() for v in items], partition=partition)
        producer.flush(30)


# --------------------------------------------------------------------------- ownership


class Ownership:
    """Every (partition, owner, start, end) interval seen, from callbacks of all members."""

    def __init__(self) -> None:
        self.open: dict[tuple[TopicPartition, str], float] = {}
        self.closed: list[tuple[TopicPartition, str, float, float]] = []
        self.lock = threading.Lock()

    def start(self, owner: str, partitions: Any, t: float) -> None:
        with self.lock:
            for tp in partitions:
                key = (TopicPartition(*tp), owner)
                assert key not in self.open, f"{owner} assigned {tp} twice"
                self.open[key] = t

    def end(self, owner: str, partitions: Any, t: float) -> None:
        with self.lock:
            for tp in partitions:
                key = (TopicPartition(*tp), owner)
                self.closed.append((*key, self.open.pop(key), t))

    def end_all(self, owner: str, t: float) -> None:
        self.end(owner, [tp for tp, o in list(self.open) if o == owner], t)

    def owners(self) -> dict[TopicPartition, set[str]]:
        with self.lock:
            out: dict[TopicPartition, set[str]] = {}
            for tp, owner in self.open:
                out.setdefault(tp, set()).add(owner)
            return out

    def check_single_owner(self) -> None:
        with self.lock:
            intervals = self.closed + [
                (tp, o, s, time.monotonic()) for (tp, o), s in self.open.items()
            ]
        by_partition: dict[TopicPartition, list[tuple[float, float, str]]] = {}
        for tp, owner, start, end in intervals:
            by_partition.setdefault(tp, []).append((start, end, owner))
        for tp, spans in by_partition.items():
            spans.sort()
            for (_, e1, o1), (s2, _, o2) in itertools.pairwise(spans):
                assert e1 <= s2, f"{tp} owned by {o1} until {e1} and by {o2} from {s2}"


class Member:
    """An in-process member: a sync Consumer polled by the test, committing after each poll."""

    def __init__(self, name: str, bootstrap: str, ownership: Ownership, topic: str) -> None:
        self.name = name
        self.values: list[str] = []
        owner = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
                ownership.start(owner.name, assigned, time.monotonic())

            def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
                ownership.end(owner.name, revoked, time.monotonic())

        self.consumer = Consumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id="g",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            listener=Listener(),
            client_id=name,
            **FAST,
        )

    def step(self) -> None:
        batch = self.consumer.poll(timeout_ms=10)
        values = [r.value.decode() for records in batch.values() for r in records if r.value]
        if values:
            self.values += values
            self.consumer.commit()

    def close(self) -> None:
        self.consumer.close()


class ProcessMember:
    """A member in its own process (tests/group_member.py), so it can be SIGKILLed."""

    def __init__(self, name: str, bootstrap: str, ownership: Ownership, topic: str) -> None:
        self.name = name
        self.values: list[str] = []
        self.last_event = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.group_member", bootstrap, "g", topic],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._ownership = ownership
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            kind = event["event"]
            if kind == "assigned":
                self._ownership.start(self.name, event["partitions"], event["t"])
            elif kind in ("revoked", "lost"):
                self._ownership.end(self.name, event["partitions"], event["t"])
            elif kind == "records":
                self.values += event["values"]
            self.last_event = kind

    def step(self) -> None:
        pass

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._ownership.end_all(self.name, time.monotonic())


def test_members_share_partitions_one_owner_at_a_time_and_read_every_record_once(
    broker: BrokerProcess,
) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "orders", 6)
    ownership = Ownership()
    produced: list[str] = []
    batch_no = 0

    def produce_round() -> None:
        nonlocal batch_no
        batch_no += 1
        values = {p: [f"{batch_no}-{p}-{i}" for i in range(40)] for p in range(6)}
        produce(bootstrap, "orders", values)
        produced.extend(v for items in values.values() for v in items)

    a = Member("a", bootstrap, ownership, "orders")
    b = Member("b", bootstrap, ownership, "orders")
    c = ProcessMember("c", bootstrap, ownership, "orders")
    members: list[Any] = [a, b, c]

    def step() -> None:
        for member in members:
            member.step()
        check_broker_view()

    def check_broker_view() -> None:
        (group,) = describe_groups(bootstrap, ["g"])
        held = [
            (t.topic, p)
            for member in group.members
            for t in member.assignment
            for p in t.partitions
        ]
        assert len(held) == len(set(held)), f"a partition held twice: {group}"

    def consumed() -> Counter[str]:
        return Counter(v for member in everyone for v in member.values)

    def owned_by(*names: str) -> Callable[[], bool]:
        def check() -> bool:
            owners = ownership.owners()
            by = Counter(o for tp_owners in owners.values() for o in tp_owners)
            return (
                len(owners) == 6
                and set(by) == set(names)
                and max(by.values()) - min(by.values()) <= 1
            )

        return check

    everyone: list[Any] = [a, b, c]
    try:
        wait_for(owned_by("a", "b", "c"), "three members holding two partitions each", step)
        produce_round()
        wait_for(lambda: sum(consumed().values()) >= len(produced), "round 1 read", step)

        a.close()  # leaves: revokes with its callback
        members.remove(a)
        wait_for(owned_by("b", "c"), "a's partitions moving to b and c", step)
        produce_round()
        wait_for(lambda: sum(consumed().values()) >= len(produced), "round 2 read", step)

        wait_for(lambda: c.last_event in ("committed", "assigned", "revoked"), "c idle", step)
        c.kill()  # no leave: the session timeout removes it
        members.remove(c)
        produce_round()
        wait_for(owned_by("b"), "c's partitions moving to b after its session timeout", step)
        wait_for(lambda: sum(consumed().values()) >= len(produced), "round 3 read", step)

        d = Member("d", bootstrap, ownership, "orders")
        members.append(d)
        everyone.append(d)
        wait_for(owned_by("b", "d"), "d taking half of the partitions", step)
        produce_round()
        wait_for(lambda: sum(consumed().values()) >= len(produced), "round 4 read", step)
    finally:
        for member in members:
            member.kill() if isinstance(member, ProcessMember) else member.close()
    ownership.check_single_owner()
    assert all(member.values for member in everyone), "a member read nothing"
    counts = consumed()
    assert sorted(counts) == sorted(produced)
    assert [v for v, n in counts.items() if n > 1] == []
    moved = {tp for tp, owner, _, _ in ownership.closed}
    assert len(moved) == 6  # every partition changed hands at least once


def test_committed_offsets_survive_a_broker_kill_and_a_restarted_consumer_resumes(
    broker: BrokerProcess,
) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "events", 2)
    produce(bootstrap, "events", {0: [f"a{i}" for i in range(10)], 1: [f"b{i}" for i in range(10)]})
    tp0, tp1 = TopicPartition("events", 0), TopicPartition("events", 1)
    config = {"group_id": "g", "enable_auto_commit": False, "auto_offset_reset": "earliest", **FAST}
    with Consumer("events", bootstrap_servers=bootstrap, **config) as consumer:
        wait_for(lambda: len(consumer.assignment()) == 2, "the assignment", consumer.poll)
        consumer.commit({tp0: 4, tp1: 7})
        assert consumer.committed(tp0) == 4
    broker.restart(kill=True)
    assert list_group_offsets(bootstrap, "g") == {tp0: (4, None), tp1: (7, None)}
    with Consumer("events", bootstrap_servers=bootstrap, **config) as consumer:
        got: dict[int, list[str]] = {0: [], 1: []}
        wait_for(
            lambda: len(got[0]) == 6 and len(got[1]) == 3,
            "the rest of both partitions",
            lambda: [
                got[tp.partition].extend(r.value.decode() for r in records)
                for tp, records in consumer.poll(timeout_ms=50).items()
            ],
        )
    assert got == {0: [f"a{i}" for i in range(4, 10)], 1: [f"b{i}" for i in range(7, 10)]}


def test_a_member_that_lost_its_partitions_cannot_commit_them(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "in", 1)
    tp = TopicPartition("in", 0)
    config = {"group_id": "g", "enable_auto_commit": False, **FAST}
    with Consumer("in", bootstrap_servers=bootstrap, **config) as old:
        wait_for(lambda: old.assignment() == {tp}, "the old member's assignment", old.poll)
        zombie = old.group_metadata()
        assert zombie.member_id and zombie.member_epoch > 0
    # The old member is gone (it left on close); a new one owns the partition.
    with Consumer("in", bootstrap_servers=bootstrap, **config) as new:
        wait_for(lambda: new.assignment() == {tp}, "the new member's assignment", new.poll)
        new.commit({tp: 3})
        with WireClient(bootstrap) as wire:
            refused = wire.call(
                "OffsetCommit",
                group_id="g",
                member_id=zombie.member_id,
                member_epoch=zombie.member_epoch,
                topics=[{"topic": "in", "partitions": [{"partition": 0, "offset": 9}]}],
            )
        assert refused["topics"][0]["partitions"][0]["error"] == 25  # UNKNOWN_MEMBER_ID
        with Producer(bootstrap, transactional_id="zombie-txn") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("out", b"x", partition=0)
            with pytest.raises(TxnOffsetCommitFailedError) as info:
                producer.send_offsets_to_transaction({tp: 9}, zombie)
            assert isinstance(info.value, CommitFailedError)
            producer.abort_transaction()
        assert new.committed(tp) == 3
        with pytest.raises(NonEmptyGroupError):
            alter_group_offsets(bootstrap, "g", {tp: 0})  # from outside, while it has a member
    assert list_group_offsets(bootstrap, "g") == {tp: (3, None)}


def test_a_member_the_broker_forgot_cannot_commit_and_rejoins_from_the_committed_offset(
    tmp_path: Path, backend: str
) -> None:
    # Heartbeats every 30 s: after the restart the member believes in its membership until
    # its refused commit makes it ask.
    proc = group_broker(tmp_path, backend, session_ms=150_000, heartbeat_ms=30_000)
    try:
        bootstrap = proc.bootstrap
        create_topic(bootstrap, "in", 1)
        produce(bootstrap, "in", {0: [f"v{i}" for i in range(10)]})
        tp = TopicPartition("in", 0)
        calls: list[str] = []

        class Listener(ConsumerRebalanceListener):
            def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
                calls.append("assigned")

            def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
                calls.append("lost")

        got: list[Any] = []
        config = {"group_id": "g", "enable_auto_commit": False, "auto_offset_reset": "earliest"}
        with Consumer(
            "in", bootstrap_servers=bootstrap, listener=Listener(), **config, **FAST
        ) as c:

            def take() -> None:
                got.extend(r for records in c.poll(timeout_ms=50).values() for r in records)

            wait_for(lambda: len(got) == 10, "every record", take)
            c.commit({tp: 5})
            proc.restart(kill=True)  # memberships are soft state: the broker forgets them
            with pytest.raises(UnknownMemberIdError):
                c.commit()  # offset 10, refused: this member no longer owns the partition
            assert list_group_offsets(bootstrap, "g") == {tp: (5, None)}
            del got[:]
            wait_for(lambda: len(got) == 5, "the uncommitted records again", take)
        assert calls == ["assigned", "lost", "assigned"]
        assert [r.offset for r in got] == [5, 6, 7, 8, 9]
    finally:
        proc.kill()


# --------------------------------------------------------------------------- static membership


def test_a_second_consumer_with_the_instance_id_takes_over_and_fences_the_first(
    tmp_path: Path, backend: str
) -> None:
    # A 30 s session: whatever moves within a few seconds did not wait for it.
    proc = group_broker(tmp_path, backend, session_ms=30_000)
    limit_s = 10.0
    try:
        bootstrap = proc.bootstrap
        create_topic(bootstrap, "in", 2)
        produce(bootstrap, "in", {0: ["a", "b"], 1: ["c"]})
        both = {TopicPartition("in", 0), TopicPartition("in", 1)}
        config = {
            "group_id": "g",
            "group_instance_id": "worker-1",
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            **FAST,
        }
        first = Consumer("in", bootstrap_servers=bootstrap, **config)
        wait_for(lambda: first.assignment() == both, "the first's assignment", first.poll)
        zombie = first.group_metadata()
        # The first is still running (a long pause, say) when its replacement starts.
        with Consumer("in", bootstrap_servers=bootstrap, **config) as second:
            wait_for(lambda: second.assignment() == both, "a takeover", second.poll, limit_s)
            with pytest.raises(FencedInstanceIdError):
                first.commit({TopicPartition("in", 0): 1})
            with pytest.raises(FencedInstanceIdError):
                first.poll(timeout_ms=0)  # fatal: it never rejoins to fence the second
            with Producer(bootstrap, transactional_id="zombie-txn") as producer:
                producer.init_transactions()
                producer.begin_transaction()
                with pytest.raises(TxnOffsetCommitFailedError) as info:
                    producer.send_offsets_to_transaction({TopicPartition("in", 0): 2}, zombie)
                assert info.value.code == 82  # FENCED_INSTANCE_ID
                producer.abort_transaction()
            first.close()  # no leave: the second keeps the partitions
            second.commit({TopicPartition("in", 0): 2})
            (group,) = describe_groups(bootstrap, ["g"])
            ((member_id, instance_id),) = [(m.member_id, m.instance_id) for m in group.members]
            assert (member_id, instance_id) == (second.group_metadata().member_id, "worker-1")
        # It closed: it keeps its partitions for the session, as a member at epoch -2 ...
        (group,) = describe_groups(bootstrap, ["g"])
        assert [(m.instance_id, m.member_epoch) for m in group.members] == [("worker-1", -2)]
        with pytest.raises(NonEmptyGroupError):
            alter_group_offsets(bootstrap, "g", {TopicPartition("in", 0): 0})
        # ... so a restart within it gets them back at once, from the committed offsets.
        with Consumer("in", bootstrap_servers=bootstrap, **config) as third:
            got: list[str] = []
            wait_for(
                lambda: len(got) == 1,
                "the restart's records",
                lambda: got.extend(
                    r.value.decode() for rs in third.poll(timeout_ms=50).values() for r in rs
                ),
                limit_s,
            )
            assert third.assignment() == both and got == ["c"]  # in-0 resumes at 2
    finally:
        proc.kill()


class Lines:
    """A process's stdout lines, each with the time it was read, by a thread (so a
    pipe never fills and no line waits in a buffer)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put((time.monotonic(), line))
        self._lines.put(None)

    def wait_for(self, prefix: str, timeout_s: float) -> float | None:
        """When the next line starting with `prefix` was read; None at the end or timeout."""
        deadline = time.monotonic() + timeout_s
        while (left_s := deadline - time.monotonic()) > 0:
            try:
                item = self._lines.get(timeout=left_s)
            except queue.Empty:
                return None
            if item is None:
                return None
            if item[1].startswith(prefix):
                return item[0]
        return None


def test_a_restarted_exactly_once_loop_takes_its_partitions_over_at_once(
    tmp_path: Path, backend: str
) -> None:
    """examples/exactly_once_loop.py SIGKILLed after its first commit and restarted, five
    times, under the broker's default session (45 s) and heartbeat (5 s): each restart
    commits within a tenth of the session timeout of its start (a dynamic member would
    wait for the dead one's session to run out), the group never holds the dead copy
    beside the new one, and the output is still exactly once. The measured times are
    printed (pytest -s)."""
    session_ms = 45_000
    proc = group_broker(tmp_path, backend, session_ms=session_ms, heartbeat_ms=5_000)
    try:
        bootstrap = proc.bootstrap
        create_topic(bootstrap, "a", 3)
        create_topic(bootstrap, "b", 3)
        inputs: list[str] = []
        command = [
            sys.executable,
            str(ROOT / "examples" / "exactly_once_loop.py"),
            *("--bootstrap", bootstrap, "--input", "a", "--output", "b", "--group", "upper"),
            *("--batch", "20"),
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        limit_s = session_ms / 1000 / 10
        takeovers: list[float] = []  # from a restarted copy's "started" to its first commit
        outages: list[float] = []  # from the kill to that commit
        killed_at: float | None = None
        for run in range(6):
            # Fresh input every run, so a restarted copy always has something to commit.
            values = {p: [f"r{run}-{p}-{i}" for i in range(300)] for p in range(3)}
            produce(bootstrap, "a", values)
            inputs += [v for vs in values.values() for v in vs]
            loop = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
            try:
                lines = Lines(loop)
                started = lines.wait_for("started", LIMIT_S)
                assert started is not None, f"run {run}: the loop did not start"
                committed = lines.wait_for("committed", LIMIT_S if killed_at is None else limit_s)
                assert committed is not None, (
                    f"run {run}: no commit within {limit_s} s of the start: the dead copy's "
                    f"partitions were not taken over (session timeout {session_ms} ms)"
                )
                if killed_at is not None:
                    takeovers.append(committed - started)
                    outages.append(committed - killed_at)
                (group,) = describe_groups(bootstrap, ["upper"])
                assert [m.instance_id for m in group.members] == ["upper-a"], group
            finally:
                loop.send_signal(signal.SIGKILL)
                loop.wait(10)
            killed_at = time.monotonic()
        output = _finish_and_read(command, env, bootstrap)
        expected = Counter(v.upper() for v in inputs)
        missing, doubled = sorted(expected - output), sorted(output - expected)
        assert output == expected, f"missing {missing[:5]}, doubled {doubled[:5]}"
        print(
            f"\n[{backend}] restart to first commit, ms: started->commit "
            f"{_spread(takeovers)}; kill->commit {_spread(outages)} "
            f"(session timeout {session_ms} ms)"
        )
    finally:
        proc.kill()


def _spread(seconds: list[float]) -> str:
    ms = sorted(round(s * 1000) for s in seconds)
    return f"median {statistics.median(ms):.0f} (min {ms[0]}, max {ms[-1]}; {ms})"


# --------------------------------------------------------------------------- exactly once


def test_exactly_once_loop_killed_twenty_times(tmp_path: Path, backend: str) -> None:
    seed = int(
        os.environ.get("MINIBROKER_RELIABILITY_SEED") or random.SystemRandom().randrange(1 << 32)
    )
    rng = random.Random(seed)
    proc = group_broker(tmp_path, backend, session_ms=600)
    try:
        bootstrap = proc.bootstrap
        create_topic(bootstrap, "a", 3)
        create_topic(bootstrap, "b", 3)
        inputs = {p: [f"r-{p}-{i}" for i in range(2_500)] for p in range(3)}
        produce(bootstrap, "a", inputs)
        command = [
            sys.executable,
            str(ROOT / "examples" / "exactly_once_loop.py"),
            "--bootstrap",
            bootstrap,
            "--input",
            "a",
            "--output",
            "b",
            "--group",
            "upper",
            # Five records per transaction: many transactions of a few ms each, so most
            # kills in full flow land inside one, and the input outlasts the 20 runs.
            "--batch",
            "5",
        ]
        committed_runs = 0
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for kill in range(20):
            # A few fresh records per run: once a fast loop has drained the rest, a run
            # that waits for its first commit still gets one (it waited out 60 s before).
            fresh = {p: [f"r-{p}-k{kill}-{i}" for i in range(20)] for p in range(3)}
            produce(bootstrap, "a", fresh)
            for p, values in fresh.items():
                inputs[p] += values
            loop = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
            assert loop.stdout is not None
            assert loop.stdout.readline().startswith("started"), f"kill {kill}: no start"
            if kill % 2:
                # Half the kills come after a first commit, so they land in full flow
                # however slow the machine is.
                committed_runs += _wait_for_line(loop.stdout, "committed", 60)
            # From joining the group (taking the dead predecessor's place: static
            # membership) through fetching committed offsets to many transactions in
            # full flow.
            time.sleep(rng.uniform(0, 1.2))
            loop.send_signal(signal.SIGKILL)
            loop.wait(10)
            assert loop.returncode == -signal.SIGKILL, f"kill {kill}: the loop exited (seed {seed})"
            if not kill % 2:
                committed_runs += any(line.startswith("committed") for line in loop.stdout)
        output = _finish_and_read(command, env, bootstrap)
        expected = Counter(v.upper() for values in inputs.values() for v in values)
        missing, doubled = sorted(expected - output), sorted(output - expected)
        assert output == expected, f"seed {seed}: missing {missing[:5]}, doubled {doubled[:5]}"
        assert committed_runs >= 5, f"seed {seed}: most kills came before any transaction"
    finally:
        proc.kill()


def _wait_for_line(stream: IO[str], prefix: str, timeout_s: float) -> bool:
    """Read `stream` until a line starts with `prefix`; False at its end or the timeout."""
    deadline = time.monotonic() + timeout_s
    while (left_s := deadline - time.monotonic()) > 0:
        if not select.select([stream], [], [], left_s)[0]:
            return False
        line = stream.readline()
        if not line:
            return False
        if line.startswith(prefix):
            return True
    return False


# --------------------------------------------------------------------------- the CLI


def cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minibroker_cli", *args, "--bootstrap-server", broker.bootstrap],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_cli_lists_describes_and_resets_a_group(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "t", 2)
    produce(bootstrap, "t", {0: [f"x{i}" for i in range(10)], 1: [f"y{i}" for i in range(4)]})
    tp0 = TopicPartition("t", 0)
    with Consumer(
        "t",
        bootstrap_servers=bootstrap,
        group_id="cli",
        enable_auto_commit=False,
        client_id="reader",
        **FAST,
    ) as consumer:
        wait_for(lambda: len(consumer.assignment()) == 2, "the assignment", consumer.poll)
        consumer.commit({tp0: 6})
        listed = cli(broker, "groups", "list")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[1:] == ["cli\tSTABLE\t1"]
        described = cli(broker, "groups", "describe", "cli")
        assert described.returncode == 0, described.stderr
        rows = [line.split("\t") for line in described.stdout.splitlines()]
        member_id = consumer.group_metadata().member_id
        assert ["cli", "t", "0", "6", "10", "4", member_id, "reader"] in rows
        assert ["cli", "t", "1", "-", "4", "-", member_id, "reader"] in rows
        refused = cli(broker, "groups", "reset-offsets", "cli", "--topic", "t", "--to-earliest")
        assert refused.returncode == 1
        assert "has 1 member(s)" in refused.stderr and "stop its consumers" in refused.stderr
    # The member left on close: now the group is empty and its offsets can move.
    dry = cli(broker, "groups", "reset-offsets", "cli", "--topic", "t", "--to-latest", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert list_group_offsets(bootstrap, "cli") == {tp0: (6, None)}
    latest = cli(broker, "groups", "reset-offsets", "cli", "--topic", "t", "--to-latest")
    assert latest.returncode == 0, latest.stderr
    assert list_group_offsets(bootstrap, "cli") == {
        tp0: (10, None),
        TopicPartition("t", 1): (4, None),
    }
    one = cli(
        broker,
        "groups",
        "reset-offsets",
        "cli",
        "--topic",
        "t",
        "--partition",
        "0",
        "--to-offset",
        "99",
    )
    assert one.returncode == 0, one.stderr
    assert "cli\tt\t0\t10" in one.stdout  # clamped to the log end
    earliest = cli(broker, "groups", "reset-offsets", "cli", "--topic", "t", "--to-earliest")
    assert earliest.returncode == 0
    assert list_group_offsets(bootstrap, "cli") == {
        tp0: (0, None),
        TopicPartition("t", 1): (0, None),
    }
    assert [g.group_id for g in list_groups(bootstrap)] == ["cli"]
    missing = cli(broker, "groups", "describe", "nobody")
    assert missing.returncode == 1 and "nobody" in missing.stderr


def _finish_and_read(command: list[str], env: dict[str, str], bootstrap: str) -> Counter[str]:
    """Run the loop again, each run until it has been idle for a second (and exits 0),
    until the group has committed all of topic a; then read topic b to its end as a
    read_committed consumer: what the loop wrote, counted. (Waiting for the offsets,
    not for a long idle spell, is what keeps this short.)"""
    with Consumer(bootstrap_servers=bootstrap) as probe:
        inputs = [TopicPartition("a", p) for p in probe.partitions_for_topic("a")]
        ends = probe.end_offsets(inputs)
    deadline = time.monotonic() + 120
    while True:
        final = subprocess.run(
            [*command, "--idle-exit-ms", "1000"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert final.returncode == 0, final.stderr
        held = {tp: om.offset for tp, om in list_group_offsets(bootstrap, "upper").items()}
        if all(held.get(tp, 0) == end for tp, end in ends.items()):
            break
        assert time.monotonic() < deadline, f"committed {held}, topic a ends at {ends}"
    with Consumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
    ) as reader:
        outputs = [TopicPartition("b", p) for p in reader.partitions_for_topic("b")]
        reader.assign(outputs)
        last = reader.end_offsets(outputs)
        written: Counter[str] = Counter()
        deadline = time.monotonic() + 60
        while any(reader.position(tp) < last[tp] for tp in outputs):
            positions = {tp: reader.position(tp) for tp in outputs}
            assert time.monotonic() < deadline, f"read to {positions} of {last}"
            for records in reader.poll(timeout_ms=200).values():
                written.update(r.value.decode() for r in records if r.value is not None)
        return written
