"""Crash recovery: torn tails, flipped bytes, damaged indexes and recovery points."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.storage.log import LogConfig, PartitionLog
from broker.storage.offset_index import SegmentIndex
from broker.storage.recovery import decode_recovery_point, encode_recovery_point, scan_segment
from protocol.batch import BatchHeader, build_batch, scan_batches, validate

T0_MS = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=128)


def make_batch(i: int) -> bytes:
    """Batch number i: 1..3 records, 5..60-byte values, timestamps that wander."""
    return build_batch(
        [
            (T0_MS + (i * 7919) % 500 + j, None, bytes([i % 256]) * (5 + (i * 13) % 56), None)
            for j in range(1 + i % 3)
        ]
    )


def stamped(offset: int, batch: bytes) -> bytes:
    return offset.to_bytes(8, "big") + batch[8:]


def build_log(directory: Path, count: int) -> list[bytes]:
    """A cleanly closed log of `count` batches; returns them as stored."""
    log = PartitionLog.open(directory, CONFIG, clean_shutdown=True, now_ms=T0_MS)
    stored = []
    for i in range(count):
        batch = make_batch(i)
        stored.append(stamped(log.append(batch, validate(batch), T0_MS), batch))
    log.close()
    return stored


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def batches_in(path: Path) -> list[tuple[int, BatchHeader]]:
    data = path.read_bytes()
    found = list(scan_batches(data))
    assert sum(h.size_bytes for _, h in found) == len(data)
    return found


def read_all(log: PartitionLog) -> bytes:
    return b"".join(data for _, data in log.batches_from(0))


def open_log(directory: Path, *, clean: bool) -> PartitionLog:
    return PartitionLog.open(directory, CONFIG, clean_shutdown=clean, now_ms=T0_MS)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    directory = tmp_path_factory.mktemp("pristine") / "t-0"
    stored = build_log(directory, 24)
    assert len(segment_files(directory)) >= 3
    return directory, stored


@pytest.fixture
def copy(pristine: tuple[Path, list[bytes]], tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine[0], tmp_path / "t-0"))


def test_torn_tail_at_every_byte_keeps_the_whole_batches_before_it(
    pristine: tuple[Path, list[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Durability is not under test here, and a thousand reopens' fsyncs would take a minute.
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    source, stored = pristine
    last = segment_files(source)[-1]
    last_base = int(last.stem)
    boundaries = batches_in(last)
    prefix = b"".join(stored)[: -last.stat().st_size]
    for cut in range(last.stat().st_size):
        directory = Path(shutil.copytree(source, tmp_path / f"cut{cut}"))
        with open(directory / last.name, "r+b") as f:
            f.truncate(cut)
        if cut % 2:
            (directory / "recovery-point").unlink()
        log = open_log(directory, clean=False)
        whole = [(pos, h) for pos, h in boundaries if pos + h.size_bytes <= cut]
        kept_bytes = sum(h.size_bytes for _, h in whole)
        end = whole[-1][1].next_offset if whole else last_base
        assert log.log_end_offset == end, cut
        assert log.recovery.truncated_bytes == cut - kept_bytes
        assert log.recovery.segments_scanned == (len(segment_files(source)) if cut % 2 else 1)
        assert (directory / last.name).stat().st_size == kept_bytes
        batch = make_batch(999)
        assert log.append(batch, validate(batch), T0_MS) == end
        assert read_all(log) == prefix + last.read_bytes()[:kept_bytes] + stamped(end, batch)
        log.close()
        shutil.rmtree(directory)


@pytest.mark.parametrize(
    ("field", "at"),
    [("records", 60), ("crc", 13), ("batch_length", 11), ("base_offset", 7), ("magic", 16)],
)
def test_flipped_byte_truncates_from_that_batch(copy: Path, field: str, at: int) -> None:
    last = segment_files(copy)[-1]
    found = batches_in(last)
    position, header = found[len(found) // 2]
    data = bytearray(last.read_bytes())
    data[position + at] ^= 0x40
    last.write_bytes(bytes(data))
    log = open_log(copy, clean=False)
    assert log.log_end_offset == header.base_offset, field
    assert last.stat().st_size == position
    assert log.recovery.truncated_bytes == len(data) - position
    assert log.recovery.batches_scanned == len(found) // 2


def test_corruption_in_an_earlier_segment_deletes_the_later_ones(
    copy: Path, pristine: tuple[Path, list[bytes]]
) -> None:
    files = segment_files(copy)
    victim = files[1]
    position, header = batches_in(victim)[1]
    data = bytearray(victim.read_bytes())
    data[position + 70] ^= 0xFF
    victim.write_bytes(bytes(data))
    (copy / "recovery-point").unlink()
    log = open_log(copy, clean=False)
    assert segment_files(copy) == files[:2]
    assert not list(copy.glob(f"{int(files[2].stem):020d}.*"))
    assert log.recovery.segments_deleted == len(files) - 2
    assert log.recovery.segments_scanned == 2
    assert log.log_end_offset == header.base_offset
    assert read_all(log) == b"".join(pristine[1])[: files[0].stat().st_size + position]
    batch = make_batch(1)
    assert log.append(batch, validate(batch), T0_MS) == header.base_offset


def _swap_first_entries(data: bytes) -> bytes:
    return data[8:16] + data[:8] + data[16:]


def _shift_last_position(data: bytes) -> bytes:
    position = int.from_bytes(data[-4:], "big")
    return data[:-4] + (position + 1).to_bytes(4, "big")


@pytest.mark.parametrize(
    ("segment", "suffix", "damage"),
    [
        (0, ".index", None),
        (1, ".timeindex", None),
        (-1, ".index", None),
        (-1, ".timeindex", None),
        (0, ".index", lambda data: data[:-3]),
        (1, ".index", _swap_first_entries),
        (1, ".index", _shift_last_position),
        (0, ".timeindex", lambda data: b""),
        (-1, ".timeindex", lambda data: data[:-16]),
    ],
)
def test_missing_or_corrupt_index_is_rebuilt(
    copy: Path, segment: int, suffix: str, damage: Callable[[bytes], bytes] | None
) -> None:
    reference = open_log(copy, clean=True)
    offsets = range(reference.log_start_offset, reference.log_end_offset)
    reads = [reference.read(offset, 200) for offset in offsets]
    times = [reference.offset_for_timestamp(T0_MS + t) for t in range(-1, 510, 3)]
    reference.close()
    originals = {path.name: path.read_bytes() for path in copy.glob("*index")}

    path = copy / (segment_files(copy)[segment].stem + suffix)
    if damage is None:
        path.unlink()
    else:
        path.write_bytes(damage(path.read_bytes()))
    log = open_log(copy, clean=True)
    assert log.recovery.segments_scanned == 1
    assert log.recovery.truncated_bytes == 0
    assert [log.read(offset, 200) for offset in offsets] == reads
    assert [log.offset_for_timestamp(T0_MS + t) for t in range(-1, 510, 3)] == times
    log.close()
    assert {path.name: path.read_bytes() for path in copy.glob("*index")} == originals


def test_leftover_tmp_and_orphan_index_files_are_removed(copy: Path) -> None:
    leftovers = [
        "00000000000000000000.index.tmp",
        "recovery-point.tmp",
        "00000000000000000007.snapshot.tmp",
    ]
    orphans = ["00000000000000099999.index", "00000000000000099999.timeindex"]
    for name in leftovers + orphans:
        (copy / name).write_bytes(b"junk")
    open_log(copy, clean=True).close()
    assert not [name for name in leftovers + orphans if (copy / name).exists()]


@pytest.mark.parametrize("content", [None, b"", b"\x00" * 12, b"garbage!", b"\x01" * 13])
def test_unusable_recovery_point_means_a_full_scan(copy: Path, content: bytes | None) -> None:
    originals = {path.name: path.read_bytes() for path in copy.glob("*index")}
    point = copy / "recovery-point"
    if content is None:
        point.unlink()
    else:
        point.write_bytes(content)
    log = open_log(copy, clean=False)
    assert log.recovery.segments_scanned == len(segment_files(copy))
    assert log.recovery.truncated_bytes == 0
    assert log.flushed_offset == log.log_start_offset
    log.close()
    assert {path.name: path.read_bytes() for path in copy.glob("*index")} == originals


def test_recovery_starts_at_the_segment_holding_the_recovery_point(copy: Path) -> None:
    files = segment_files(copy)
    point = int(files[1].stem) + 1
    (copy / "recovery-point").write_bytes(encode_recovery_point(point))
    log = open_log(copy, clean=False)
    assert log.recovery.segments_scanned == len(files) - 1
    assert log.flushed_offset == point
    fds, end = log.sync_targets()
    assert len(fds) == len(files) - 1 and end == log.log_end_offset


def test_snapshots_past_the_recovered_log_end_are_deleted(copy: Path) -> None:
    log = open_log(copy, clean=True)
    end = log.log_end_offset
    for offset in (0, end - 5, end):
        log.write_snapshot(offset, b"state")
    log.close()
    last = segment_files(copy)[-1]
    position, header = batches_in(last)[-1]
    with open(last, "r+b") as f:
        f.truncate(position + 1)
    log = open_log(copy, clean=False)
    assert log.log_end_offset == header.base_offset
    assert [offset for offset, _ in log.snapshots()] == [end - 5, 0]


def test_clean_flag_with_a_torn_tail_still_recovers(copy: Path) -> None:
    last = segment_files(copy)[-1]
    _, header = batches_in(last)[-1]
    with open(last, "ab") as f:
        f.write(b"\x00" * 100)
    log = open_log(copy, clean=True)
    assert log.recovery.truncated_bytes == 100
    assert log.log_end_offset == header.next_offset


def test_recovery_point_encoding() -> None:
    assert decode_recovery_point(encode_recovery_point(12345)) == 12345
    data = bytearray(encode_recovery_point(12345))
    data[3] ^= 1
    assert decode_recovery_point(bytes(data)) is None
    assert decode_recovery_point(b"") is None


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 8), cut_fraction=st.floats(0, 1), garbage=st.binary(max_size=200))
@example(count=1, cut_fraction=0.9921875, garbage=b"\xc0")
def test_scan_keeps_exactly_the_valid_prefix(
    count: int, cut_fraction: float, garbage: bytes
) -> None:
    base_offset = 500
    batches, ends, next_offsets = [], [0], [base_offset]
    for i in range(count):
        batch = make_batch(i)
        batches.append(stamped(next_offsets[-1], batch))
        ends.append(ends[-1] + len(batch))
        next_offsets.append(next_offsets[-1] + validate(batch).record_count)
    whole = b"".join(batches)
    data = whole[: int(len(whole) * cut_fraction)] + garbage
    # Whole batches up to where the data parts from the log; the garbage may restore
    # the bytes just cut (a batch ending in 0xc0 cut by one, 0xc0 appended), and then
    # that batch is whole again.
    kept = max(i for i, end in enumerate(ends) if data[:end] == whole[:end])
    scan = scan_segment(
        data,
        SegmentIndex.empty(base_offset, index_interval_bytes=100, segment_index_bytes=1024),
    )
    assert (scan.valid_bytes, scan.batch_count, scan.next_offset) == (
        ends[kept],
        kept,
        next_offsets[kept],
    )
