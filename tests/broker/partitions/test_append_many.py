"""Appending a run of batches in one write (Partition.append_many) is appending them
one by one, only cheaper.

What is tried: random runs of one producer's batches (in order, resent from the
cache or from the run itself, with gaps, old and new epochs, none at all) and of
plain batches, appended both ways into two fresh partitions with small segments;
the answers, the log bytes, the segments and the producer state must be equal. A
write that fails in the middle of a run must leave the log and the producer state
as they were, refuse every batch it held (and a resend of one of them in the same
run), and the same run must then append as if nothing had happened. A run must
take one write per segment, not one per batch.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.partitions.partition import AppendResult, Partition, ProducerLimits
from broker.storage.log import LogConfig
from protocol.batch import NO_PRODUCER_ID, build_batch, validate
from protocol.errors import ErrorCode

PID = 7
NOW_MS = 10_000
LIMITS = ProducerLimits(max_producers=1000, expiration_ms=86_400_000)
CONFIG = LogConfig(segment_bytes=1024)  # a roll every few batches: runs cross them


def _batch(seq: int, count: int, epoch: int = 0, producer_id: int = PID) -> bytes:
    return build_batch(
        [(1_000 + seq + i, None, b"%d" % (seq + i) + b"x" * 150, None) for i in range(count)],
        producer_id=producer_id,
        producer_epoch=epoch if producer_id != NO_PRODUCER_ID else -1,
        base_sequence=seq if producer_id != NO_PRODUCER_ID else -1,
    )


def _open(directory: Path) -> Partition:
    return Partition.open("t", 0, directory, CONFIG, LIMITS, clean_shutdown=True, now_ms=NOW_MS)


def _state(p: Partition) -> tuple[Any, ...]:
    """Everything an append may change, as comparable values."""
    # The logs, and the producer-state snapshots the rolls of a run wrote.
    files = sorted(
        (path.name, path.read_bytes())
        for suffix in ("*.log", "*.snapshot")
        for path in p.log.directory.glob(suffix)
    )
    return (
        p.log.log_end_offset,
        p.log.size_bytes,
        p.log.segment_bases,
        files,
        p.producers.encode_snapshot(p.log.log_end_offset),
    )


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[bytes], list[bytes]]:
    """(batches appended before, the run): one producer's batches, each the next in
    sequence or a resend, a gap, an older or a newer epoch; or plain batches."""
    if draw(st.booleans()):
        count = draw(st.integers(1, 6))
        return [], [_batch(0, 1, producer_id=NO_PRODUCER_ID) for _ in range(count)]
    sent: list[tuple[int, int, int]] = []  # (seq, count, epoch) of every batch in sequence
    batches: list[bytes] = []
    epoch, next_seq = 1, 0
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["next", "next", "next", "resend", "gap", "old", "new"]))
        count = draw(st.integers(1, 3))
        if kind == "resend" and sent:
            batches.append(_batch(*draw(st.sampled_from(sent[-7:]))))
            continue
        if kind == "gap":
            batches.append(_batch(next_seq + 1, count, epoch))
            continue
        if kind == "old":
            batches.append(_batch(next_seq, count, epoch - 1))
            continue
        if kind == "new":
            epoch, next_seq = epoch + 1, 0
        sent.append((next_seq, count, epoch))
        batches.append(_batch(next_seq, count, epoch))
        next_seq += count
    split = draw(st.integers(0, len(batches) - 1))
    return batches[:split], batches[split:]


# The property compares appends, not durability: in memory (tmpfs, where fsync returns at
# once) the 150 examples' thousands of snapshot and directory fsyncs do not wait on a disk.
_MEMORY = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _append_both_ways(
    before: list[bytes], run: list[bytes]
) -> tuple[list[AppendResult], list[AppendResult], tuple[Any, ...], tuple[Any, ...]]:
    with TemporaryDirectory(dir=_MEMORY) as one_dir, TemporaryDirectory(dir=_MEMORY) as many_dir:
        one, many = _open(Path(one_dir)), _open(Path(many_dir))
        for data in before:
            assert one.append(data, validate(data), NOW_MS) == many.append(
                data, validate(data), NOW_MS
            )
        one_by_one = [one.append(data, validate(data), NOW_MS) for data in run]
        together = many.append_many(run, [validate(data) for data in run], NOW_MS)
        states = _state(one), _state(many)
        one.log.close()
        many.log.close()
    return one_by_one, together, *states


@settings(max_examples=150, deadline=None)
@given(runs())
def test_a_run_appends_as_one_batch_after_another(drawn: tuple[list[bytes], list[bytes]]) -> None:
    one_by_one, together, state_one, state_many = _append_both_ways(*drawn)
    assert together == one_by_one
    assert state_many == state_one


def test_a_run_in_one_segment_is_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = Partition.open("t", 0, tmp_path, LogConfig(), LIMITS, clean_shutdown=True, now_ms=NOW_MS)
    run = [_batch(seq, 1) for seq in range(8)]
    calls: list[int] = []
    real = os.pwritev

    def counting(fd: int, buffers: list[bytes], offset: int) -> int:
        calls.append(len(buffers))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", counting)
    results = p.append_many(run, [validate(b) for b in run], NOW_MS)
    assert [r.base_offset for r in results] == list(range(8))
    assert calls == [16], "one pwritev: an offset stamp and the rest of each of 8 batches"
    monkeypatch.undo()
    assert p.log.read(0, 1 << 20) == b"".join(
        (offset).to_bytes(8, "big") + data[8:] for offset, data in enumerate(run)
    )
    p.log.close()


def test_failed_write_refuses_the_run_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _open(tmp_path / "failed")
    twin = _open(tmp_path / "twin")  # the same history, never failed
    for seq in range(0, 6, 2):
        data = _batch(seq, 2)
        assert p.append(data, validate(data), NOW_MS) == twin.append(data, validate(data), NOW_MS)
    before = _state(p)
    # The next six in sequence, then resends of the first of them (out of the 5-batch
    # window by then) and of the last: verdicts reached on the run's own batches.
    run = [_batch(seq, 2) for seq in range(6, 18, 2)] + [_batch(6, 2), _batch(16, 2)]
    headers = [validate(b) for b in run]

    def full_disk(fd: int, buffers: list[bytes], offset: int) -> int:
        os.pwrite(fd, b"".join(bytes(b) for b in buffers)[:100], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full_disk)
    refused = p.append_many(run, headers, NOW_MS)
    monkeypatch.undo()
    assert [r.error for r in refused] == [ErrorCode.KAFKA_STORAGE_ERROR] * len(run)
    assert _state(p) == before
    results = p.append_many(run, headers, NOW_MS)
    assert results == [twin.append(data, validate(data), NOW_MS) for data in run]
    assert [(r.error, r.base_offset, r.duplicate) for r in results[-2:]] == [
        (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, -1, False),
        (ErrorCode.NONE, 16, True),
    ]
    p.log.close()
    twin.log.close()


def test_a_run_of_several_producers_goes_batch_by_batch(tmp_path: Path) -> None:
    p = _open(tmp_path)
    run = [_batch(0, 1, producer_id=1), _batch(0, 1, producer_id=2), _batch(1, 1, producer_id=1)]
    results = p.append_many(run, [validate(b) for b in run], NOW_MS)
    assert [(r.error, r.base_offset) for r in results] == [
        (ErrorCode.NONE, 0),
        (ErrorCode.NONE, 1),
        (ErrorCode.NONE, 2),
    ]
    p.log.close()
