"""Torn and corrupt storage: damage every kind of file the broker keeps, then start it.

The pristine data dir: 2 topics of 2 partitions, 1 KiB segments (several per
partition, with offset and time indexes and producer-state snapshots), an
idempotent producer's acks=-1 batches, 3 plain producer ids and one
transactional id; then the broker is stopped by kill -9 or by SIGTERM.

Each trial copies it, picks one file of one kind (kinds are listed from the
data dir itself: `.log`, `.index`, `.timeindex`, `.snapshot`, `recovery-point`,
`topic.meta`, `producer_id_block`, `txn.wal`, `offsets.wal`, `credentials.wal`,
`format_version`, the clean-shutdown marker, and any kind that appears later), and damages it at a
seeded random point: truncate there, flip one byte there, or append junk (a
torn extra write). Then the broker starts, and either

- refuses to start, naming the damaged file in its log, or
- starts, and: every fetched batch has a valid CRC; each partition holds a
  prefix of what was acknowledged, at the same offsets; no batch lying before
  the damage is dropped (for damage outside a `.log`, nothing at all is); a
  Metadata with allow_auto_create leaves the data alone; new writes go to every
  partition and read back; for damage outside a `.log` the last acknowledged
  batch of every partition is still recognised as a duplicate (the producer
  state survived), new producer ids differ from every id issued before, and the
  transactional id keeps its producer id with a higher epoch (or, when the
  transaction log itself lost its record, gets a producer id never issued
  before: its old instance stays fenced), and the group's committed offsets are
  all there (or, when the offsets log lost its last record, those of the last
  commit are gone and the rest are there).

Trials: every (kind, damage) pair once, after a randomly chosen stop, quick;
3 times after each kind of stop under MINIBROKER_RELIABILITY=full.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch
from protocol.batch import scan_batches
from protocol.errors import ErrorCode
from tests.reliability.conftest import FULL, checked_batches, config_file, size

TOPICS = ("alpha", "beta")
PARTITIONS = 2
BATCHES = 24  # per partition: about 5 segments of 1 KiB
TXN_ID = "tx-reliability"
GROUP = "g-reliability"
CONFIG = "segment_bytes = 1024\nindex_interval_bytes = 128\n"
DAMAGES = ("truncate", "flip", "append")
KINDS = (
    ".log",
    ".index",
    ".timeindex",
    ".snapshot",
    "recovery-point",
    "topic.meta",
    "producer_id_block",
    "txn.wal",
    "offsets.wal",
    "credentials.wal",
    "format_version",
    ".clean_shutdown",
)
STOPS = ("kill", "sigterm")


@dataclass(frozen=True)
class Pristine:
    data: Path
    records: dict[tuple[str, int], list[tuple[int, bytes]]]  # acknowledged, in offset order
    last_batch: dict[tuple[str, int], tuple[int, int, list[bytes]]]  # base, seq, values
    producer: tuple[int, int]
    issued: frozenset[int]
    txn: tuple[int, int]
    offsets: list[dict[tuple[str, int], int]]  # committed, one commit after the other


def build_pristine(root: Path, stop: str) -> Pristine:
    broker = BrokerProcess(root / "data", extra_args=config_file(root, CONFIG)).start()
    records: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    last: dict[tuple[str, int], tuple[int, int, list[bytes]]] = {}
    try:
        with WireClient(broker.bootstrap) as c:
            for topic in TOPICS:
                assert c.create_topic(topic, PARTITIONS) == 0
            pid, epoch = c.init_producer()
            issued = {pid} | {c.init_producer()[0] for _ in range(3)}
            txn = c.init_producer(transactional_id=TXN_ID)
            issued.add(txn[0])
            for topic in TOPICS:
                for partition in range(PARTITIONS):
                    seq = 0
                    acked: list[tuple[int, bytes]] = []
                    for i in range(BATCHES):
                        n = 1 + i % 3
                        values = [
                            b"%s-%d-%d-%s" % (topic.encode(), partition, seq + j, b"v" * (i * 7))
                            for j in range(n)
                        ]
                        batch = values_batch(
                            values, producer_id=pid, producer_epoch=epoch, base_sequence=seq
                        )
                        r = c.produce(topic, partition, batch, acks=-1)
                        assert r["error"] == 0, r
                        acked += [(r["base_offset"] + j, v) for j, v in enumerate(values)]
                        last[(topic, partition)] = (r["base_offset"], seq, values)
                        seq += n
                    records[(topic, partition)] = acked
            committed = [{(t, 0): 3 for t in TOPICS}, {(TOPICS[0], 1): 5}]
            for offsets in committed:
                r = c.call("OffsetCommit", group_id=GROUP, topics=commit_topics(offsets))
                assert {p["error"] for t in r["topics"] for p in t["partitions"]} == {0}, r
    finally:
        if stop == "kill":
            broker.kill()
        else:
            assert broker.terminate() == 0
    return Pristine(root / "data", records, last, (pid, epoch), frozenset(issued), txn, committed)


def commit_topics(offsets: dict[tuple[str, int], int]) -> list[dict[str, object]]:
    topics: dict[str, list[dict[str, int]]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append({"partition": partition, "offset": offset})
    return [{"topic": t, "partitions": ps} for t, ps in topics.items()]


def offsets_kept(p: Pristine, damage: Damage) -> dict[tuple[str, int], int]:
    """The group's offsets after the damage: all of them, unless the offsets log was cut
    or flipped; then a torn last record is cut, so the commits from the damaged one on
    are lost (a damaged first record followed by a good one refuses the start)."""
    first, last = p.offsets
    if kind_of(damage.path) != "offsets.wal" or damage.how == "append":
        return {**first, **last}
    content = (p.data / damage.path).read_bytes()
    first_end = 8 + int.from_bytes(content[:4], "big")  # length and crc, then the body
    return first if damage.at >= first_end else {}


def committed_offsets(c: WireClient) -> dict[tuple[str, int], int]:
    r = c.call("OffsetFetch", group_id=GROUP, topics=None)
    assert r["error"] == 0, r
    return {(t["topic"], p["partition"]): p["offset"] for t in r["topics"] for p in t["partitions"]}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pristine]:
    return {stop: build_pristine(tmp_path_factory.mktemp(stop), stop) for stop in STOPS}


def kind_of(path: Path) -> str:
    return (
        path.suffix if path.suffix in (".log", ".index", ".timeindex", ".snapshot") else path.name
    )


def damage_files(data: Path) -> dict[str, list[Path]]:
    """Every file the broker keeps, by kind (the lock file is the running broker's, not state)."""
    kinds: dict[str, list[Path]] = {}
    for path in sorted(data.rglob("*")):
        if path.is_file() and path.name != ".lock":
            kinds.setdefault(kind_of(path), []).append(path.relative_to(data))
    return kinds


@dataclass(frozen=True)
class Damage:
    path: Path  # relative to the data dir
    how: str
    at: int

    def apply(self, data: Path, rng: random.Random) -> None:
        target = data / self.path
        content = bytearray(target.read_bytes() if target.exists() else b"")
        if self.how == "truncate":
            content = content[: self.at]
        elif self.how == "flip":
            content[self.at] ^= rng.randrange(1, 256)
        else:
            content += rng.randbytes(rng.randrange(1, 200))
        target.write_bytes(bytes(content))


def choose(path: Path, data: Path, how: str, rng: random.Random) -> Damage:
    length = (data / path).stat().st_size if (data / path).exists() else 0
    if length == 0 and how != "append":
        how = "append"  # an empty file can only grow
    at = rng.randrange(length) if how != "append" else length
    return Damage(path, how, at)


def must_survive(p: Pristine, damage: Damage) -> dict[tuple[str, int], int]:
    """How many acknowledged records of each partition lie before the damage."""
    keep = {key: len(records) for key, records in p.records.items()}
    if kind_of(damage.path) != ".log" or damage.how == "append":
        return keep
    topic, partition = damage.path.parts[1], int(damage.path.parts[2])
    content = (p.data / damage.path).read_bytes()
    first_lost = int(damage.path.stem)  # the segment's base offset
    for pos, header in scan_batches(content):
        if pos + header.size_bytes > damage.at:
            break
        first_lost = header.next_offset
    keep[(topic, partition)] = sum(o < first_lost for o, _ in p.records[(topic, partition)])
    return keep


def read_all(c: WireClient, topic: str, partition: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = 0
    for _ in range(10_000):
        r = c.call(
            "Fetch",
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            topics=[
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "fetch_offset": offset,
                            "partition_max_bytes": 4096,
                        }
                    ],
                }
            ],
        )
        assert r["error"] == 0, f"Fetch {topic}-{partition} at {offset} answered {r}"
        f = r["topics"][0]["partitions"][0]
        if f["error"] != 0:
            # Refusing to serve is allowed; what was read must still be a valid prefix.
            assert f["error"] in (ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.CORRUPT_MESSAGE), f
            return out
        got = [(o, v) for o, v in checked_batches(f["records"]) if o >= offset]
        if not got:
            return out
        out += got
        offset = got[-1][0] + 1
    raise AssertionError("read did not end")


def check_started(broker: BrokerProcess, p: Pristine, damage: Damage) -> None:
    keep = must_survive(p, damage)
    outside_log = kind_of(damage.path) != ".log"
    with WireClient(broker.bootstrap, timeout_s=10) as c:
        for topic in TOPICS:
            md = c.call("Metadata", topics=[topic], allow_auto_create=True)["topics"][0]
            assert md["error"] == 0 and len(md["partitions"]) == PARTITIONS, md
        for (topic, partition), acked in p.records.items():
            stored = read_all(c, topic, partition)
            assert stored == acked[: len(stored)], f"{topic}-{partition}: not a prefix of the acked"
            assert len(stored) >= keep[(topic, partition)], (
                f"{topic}-{partition}: {keep[(topic, partition)] - len(stored)} acknowledged "
                f"records before the damage were dropped"
            )
            if outside_log:
                base, seq, values = p.last_batch[(topic, partition)]
                pid, epoch = p.producer
                again = values_batch(
                    values, producer_id=pid, producer_epoch=epoch, base_sequence=seq
                )
                r = c.produce(topic, partition, again, acks=-1)
                assert (r["error"], r["base_offset"], r["duplicate"]) == (0, base, True), r
            new = c.produce(topic, partition, values_batch([b"after"]), acks=-1)
            assert new["error"] == 0, new
            f = c.fetch(topic, partition, new["base_offset"])
            assert checked_batches(f["records"])[-1] == (new["base_offset"], b"after")
        if outside_log:
            assert c.init_producer()[0] not in p.issued, "a producer id was handed out twice"
            pid, epoch = c.init_producer(transactional_id=TXN_ID)
            # A cut or flipped transaction log record reads as a torn last write: the id is
            # forgotten, and then it must get a fresh producer id, so the old one stays fenced.
            forgotten = kind_of(damage.path) == "txn.wal" and damage.how != "append"
            assert (pid == p.txn[0] and epoch > p.txn[1]) or (forgotten and pid not in p.issued), (
                (pid, epoch),
                p.txn,
            )
            assert committed_offsets(c) == offsets_kept(p, damage)


def run_trial(p: Pristine, damage: Damage, root: Path, backend: str, rng: random.Random) -> str:
    data = Path(shutil.copytree(p.data, root / "data"))
    damage.apply(data, rng)
    broker = BrokerProcess(data, backend=backend)
    try:
        broker.start()
    except RuntimeError as refused:
        names = (damage.path.name, damage.path.name.replace("_", " "))
        assert any(name in str(refused) for name in names), (
            f"refused to start without naming the file:\n{refused}"
        )
        return "refused"
    try:
        check_started(broker, p, damage)
        return "recovered"
    except (AssertionError, OSError) as failure:
        tail = "\n".join(broker.log_lines[-5:])
        raise AssertionError(f"{failure!r}\nbroker log ends:\n{tail}") from None
    finally:
        broker.kill()
        shutil.rmtree(root)


def test_every_kind_of_file_is_covered(pristine: dict[str, Pristine]) -> None:
    """The data dir holds no kind of file that the damage trials below do not try."""
    kinds = set(damage_files(pristine["kill"].data)) | set(damage_files(pristine["sigterm"].data))
    assert kinds == set(KINDS), f"new or missing kinds of file: {kinds ^ set(KINDS)}"


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_file_recovers_or_refuses(
    pristine: dict[str, Pristine], tmp_path: Path, backend: str, seed: int, kind: str
) -> None:
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    failures: list[str] = []
    trial = 0
    for how in DAMAGES:
        for stop in STOPS if FULL else (rng.choice(STOPS),):
            p = pristine[stop]
            # After kill -9 there is no marker: creating one is the damage (a false "clean").
            absent = [Path(kind)] if kind == ".clean_shutdown" else []
            candidates = damage_files(p.data).get(kind, absent)
            for _ in range(size(1, 3) if candidates else 0):
                damage = choose(rng.choice(candidates), p.data, how, rng)
                trial += 1
                try:
                    outcome = run_trial(p, damage, tmp_path / f"t{trial}", backend, rng)
                except AssertionError as failure:
                    failures.append(f"stop={stop} {damage}: {failure}")
                    outcome = "failed"
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"corruption seed={seed} backend={backend} kind={kind}: trials={trial} {outcomes}")
    assert trial >= len(DAMAGES), "the kind was never tried"
    assert not failures, f"seed={seed}: {len(failures)}/{trial} trials failed:\n" + "\n".join(
        failures
    )
