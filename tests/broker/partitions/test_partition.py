"""Partition = log + producer state: snapshots and replay across unclean restarts.

What is tried: an idempotent producer appends across many segment rolls (so
several snapshots exist), then the partition is reopened as after kill -9 with
(a) all snapshots intact, (b) the newest snapshot corrupted, (c) every snapshot
corrupted, (d) a snapshot from past a truncated log end. In each case the whole
5-batch duplicate window must still be recognised and the next sequence must
follow on, because the state is rebuilt from an older snapshot or the log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.partitions.partition import Partition, ProducerLimits
from broker.storage.log import LogConfig
from protocol.batch import build_batch, validate
from protocol.errors import ErrorCode

PID = 7
LIMITS = ProducerLimits(max_producers=1000, expiration_ms=86_400_000)
CONFIG = LogConfig(segment_bytes=2048)


def _batch(seq: int, count: int = 2) -> bytes:
    return build_batch(
        [(1_000 + seq, None, b"%d" % (seq + i) + b"x" * 100, None) for i in range(count)],
        producer_id=PID,
        producer_epoch=0,
        base_sequence=seq,
    )


def _open(directory: Path, clean: bool = False) -> Partition:
    return Partition.open("t", 0, directory, CONFIG, LIMITS, clean_shutdown=clean, now_ms=10_000)


def _fill(directory: Path, batches: int = 40) -> list[tuple[int, int]]:
    """Append `batches` idempotent batches; return (seq, base_offset) of each."""
    p = _open(directory, clean=True)
    sent = []
    for i in range(batches):
        seq = 2 * i
        data = _batch(seq)
        r = p.append(data, validate(data), 10_000)
        assert r.error == ErrorCode.NONE and not r.duplicate
        sent.append((seq, r.base_offset))
    assert len(p.log.snapshots()) >= 2, "the test needs rolls, hence snapshots"
    # No close(): the process dies here, leaving the snapshots of past rolls only.
    return sent


def _assert_window_intact(p: Partition, sent: list[tuple[int, int]]) -> None:
    for seq, base in sent[-5:]:
        data = _batch(seq)
        r = p.append(data, validate(data), 10_000)
        assert (r.error, r.base_offset, r.duplicate) == (ErrorCode.NONE, base, True), seq
    seq, _ = sent[-6]
    data = _batch(seq)
    assert p.append(data, validate(data), 10_000).error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    next_seq = sent[-1][0] + 2
    data = _batch(next_seq)
    r = p.append(data, validate(data), 10_000)
    assert r.error == ErrorCode.NONE and not r.duplicate
    assert r.base_offset == sent[-1][1] + 2


@pytest.mark.parametrize("corrupt", ["none", "newest", "all"])
def test_window_survives_unclean_restart_with_corrupt_snapshots(
    tmp_path: Path, corrupt: str
) -> None:
    sent = _fill(tmp_path)
    paths = sorted(tmp_path.glob("*.snapshot"), reverse=True)  # newest first
    assert paths
    targets = {"none": [], "newest": paths[:1], "all": paths}[corrupt]
    for path in targets:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
    p = _open(tmp_path)
    _assert_window_intact(p, sent)
    p.close()


def test_snapshot_beyond_the_log_end_is_ignored(tmp_path: Path) -> None:
    """A torn tail cut below the newest snapshot's offset: that snapshot describes
    batches that no longer exist and must not be used."""
    sent = _fill(tmp_path)
    newest_offset = int(max(tmp_path.glob("*.snapshot")).stem)
    segments = sorted(tmp_path.glob("*.log"))
    last = segments[-1]
    # Drop the whole last segment's contents and part of the one before: a torn tail.
    last.write_bytes(b"")
    before = segments[-2]
    before.write_bytes(before.read_bytes()[:-50])
    p = _open(tmp_path)
    end = p.log.log_end_offset
    assert end < newest_offset
    kept = [(seq, base) for seq, base in sent if base + 2 <= end]
    # The producer's state is what the surviving log says, not what the snapshot said.
    seq, base = kept[-1]
    data = _batch(seq)
    r = p.append(data, validate(data), 10_000)
    assert (r.base_offset, r.duplicate) == (base, True)
    lost_seq = kept[-1][0] + 2
    data = _batch(lost_seq)
    r = p.append(data, validate(data), 10_000)
    assert r.error == ErrorCode.NONE and not r.duplicate and r.base_offset == end
    p.close()
