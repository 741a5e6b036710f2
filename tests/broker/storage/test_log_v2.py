"""A partition log holding Kafka's v2 batches (magic 2), alone and mixed with ours.

The broker stores a produced batch as it arrived, whatever its format, so the log,
its indexes, recovery, the producer state and the transaction replay must read
both. Tried through the code path a produce takes (validate, Partition.append):
idempotent and compressed v2 batches with headers; reads from every offset; an
unclean restart with the snapshots intact, corrupt or past a torn tail; a tail
cut mid-batch or failing its CRC-32C; ListOffsets by timestamp; a log that
alternates the formats; an aborted v2 transaction found again by replay.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.partitions.partition import Partition, ProducerLimits
from broker.storage.log import LogConfig
from protocol.batch import (
    CONTROL_ABORT,
    MAGIC,
    MAGIC_V2,
    build_batch,
    iter_records,
    read_header,
    scan_batches,
    validate,
)
from protocol.batch_v2 import build_control_batch_v2, encode_batch_v2
from protocol.compression import Compression
from protocol.errors import ErrorCode

PID = 7
LIMITS = ProducerLimits(max_producers=1000, expiration_ms=86_400_000)
CONFIG = LogConfig(segment_bytes=2048)
CODECS = list(Compression)
Row = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]


def _rows(seq: int, count: int = 2) -> list[Row]:
    return [
        (
            1_000 + 10 * seq + i,
            None if i % 2 else b"k%d" % seq,
            b"%d" % (seq + i) + b"x" * 100,
            [("trace", b"t%d" % i), ("empty", None)] if i % 2 == 0 else None,
        )
        for i in range(count)
    ]


def _batch(seq: int, magic: int = MAGIC_V2, count: int = 2) -> bytes:
    """An idempotent batch: v2 ones cycle through every codec, snappy included."""
    if magic == MAGIC:
        return build_batch(
            [
                (ts, k, v, [(n, h or b"") for n, h in hs or ()])
                for ts, k, v, hs in _rows(seq, count)
            ],
            producer_id=PID,
            producer_epoch=0,
            base_sequence=seq,
        )
    return encode_batch_v2(
        _rows(seq, count),
        compression=CODECS[seq // 2 % len(CODECS)],
        producer_id=PID,
        producer_epoch=0,
        base_sequence=seq,
    )


def _open(directory: Path, clean: bool = False) -> Partition:
    return Partition.open("t", 0, directory, CONFIG, LIMITS, clean_shutdown=clean, now_ms=10_000)


def _fill(directory: Path, magics: list[int]) -> list[tuple[int, int, int]]:
    """Append one 2-record batch of each magic in `magics`; (seq, base_offset, magic)."""
    p = _open(directory, clean=True)
    sent = []
    for i, magic in enumerate(magics):
        data = _batch(2 * i, magic)
        r = p.append(data, validate(data), 10_000)
        assert r.error == ErrorCode.NONE and not r.duplicate
        sent.append((2 * i, r.base_offset, magic))
    return sent


def _stored(p: Partition, offset: int = 0) -> list[tuple[int, int, tuple]]:
    """(magic, offset, record fields) of every record from `offset` on, read back."""
    out = []
    while offset < p.log.log_end_offset:
        data = p.log.read(offset, 1 << 20)
        assert data
        for pos, header in scan_batches(data):
            for r in iter_records(data, pos, header):
                if r.offset >= offset:
                    out.append((header.magic, r.offset, (r.timestamp, r.key, r.value, r.headers)))
            offset = header.next_offset
    return out


def _expected(sent: list[tuple[int, int, int]]) -> list[tuple[int, int, tuple]]:
    out = []
    for seq, base, magic in sent:
        for i, (ts, k, v, hs) in enumerate(_rows(seq)):
            if magic == MAGIC and hs:
                hs = [(n, h or b"") for n, h in hs]
            out.append((magic, base + i, (ts, k, v, hs)))
    return out


def _assert_window_intact(p: Partition, sent: list[tuple[int, int, int]]) -> None:
    for seq, base, magic in sent[-5:]:
        data = _batch(seq, magic)
        r = p.append(data, validate(data), 10_000)
        assert (r.error, r.base_offset, r.duplicate) == (ErrorCode.NONE, base, True), seq
    data = _batch(sent[-6][0])
    assert p.append(data, validate(data), 10_000).error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    data = _batch(sent[-1][0] + 2)
    r = p.append(data, validate(data), 10_000)
    assert r.error == ErrorCode.NONE and not r.duplicate
    assert r.base_offset == sent[-1][1] + 2


MIXED = [MAGIC_V2 if i % 3 else MAGIC for i in range(40)]


@pytest.mark.parametrize("magics", [[MAGIC_V2] * 40, MIXED], ids=["v2", "mixed"])
@pytest.mark.parametrize("corrupt", ["none", "newest", "all"])
def test_records_and_producer_state_survive_an_unclean_restart(
    tmp_path: Path, magics: list[int], corrupt: str
) -> None:
    sent = _fill(tmp_path, magics)
    snapshots = sorted(tmp_path.glob("*.snapshot"), reverse=True)
    assert len(snapshots) >= 2, "the test needs rolls, hence snapshots"
    for path in {"none": [], "newest": snapshots[:1], "all": snapshots}[corrupt]:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
    p = _open(tmp_path)
    assert p.log.log_end_offset == 2 * len(magics)
    assert _stored(p) == _expected(sent)
    # Reads that start inside a batch, in every segment, find their batch.
    for offset in range(1, 2 * len(magics), 7):
        assert _stored(p, offset) == _expected(sent)[offset:]
    _assert_window_intact(p, sent)
    p.close()


def test_a_tail_cut_mid_batch_or_failing_its_crc32c_is_dropped(tmp_path: Path) -> None:
    sent = _fill(tmp_path, [MAGIC_V2] * 6)
    (segment,) = tmp_path.glob("*.log")
    whole = segment.read_bytes()
    last = read_header(whole, len(whole) - len(_batch(sent[-1][0]))).base_offset
    assert last == sent[-1][1]
    segment.write_bytes(whole[:-20])  # the last batch cut short
    p = _open(tmp_path)
    assert p.log.log_end_offset == last
    assert _stored(p) == _expected(sent[:-1])
    p.close()
    damaged = bytearray(whole)
    damaged[-3] ^= 0x01  # a record byte: only the CRC-32C notices
    segment.write_bytes(bytes(damaged))
    p = _open(tmp_path)
    assert p.log.log_end_offset == last
    # The dropped batch may be sent again and is appended, not taken for a duplicate.
    data = _batch(sent[-1][0])
    r = p.append(data, validate(data), 10_000)
    assert (r.error, r.base_offset, r.duplicate) == (ErrorCode.NONE, last, False)
    p.close()


def test_list_offsets_by_timestamp_reads_v2_records(tmp_path: Path) -> None:
    sent = _fill(tmp_path, MIXED[:12])
    p = _open(tmp_path)
    records = _expected(sent)
    for magic, offset, (ts, *_) in records:
        assert p.log.offset_for_timestamp(ts) == offset, (magic, offset)
    # A time between two records of one batch: the later record.
    v2 = next(r for r in records if r[0] == MAGIC_V2 and r[1] % 2 == 0)
    assert p.log.offset_for_timestamp(v2[2][0] + 1) == v2[1] + 1
    assert p.log.offset_for_timestamp(records[-1][2][0] + 1) is None
    p.close()


def test_an_aborted_v2_transaction_is_found_again_by_replay(tmp_path: Path) -> None:
    p = _open(tmp_path, clean=True)
    data = encode_batch_v2(
        _rows(0), producer_id=PID, producer_epoch=0, base_sequence=0, transactional=True
    )
    assert p.append(data, validate(data), 10_000).error == ErrorCode.NONE
    marker = build_control_batch_v2(
        CONTROL_ABORT, producer_id=PID, producer_epoch=0, timestamp_ms=2_000
    )
    marker_offset = p.log.append(marker, validate(marker), 10_000)
    p.close_files()  # an unclean end: no snapshot, the whole log is replayed
    p = _open(tmp_path)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in p.aborted.between(0, 10)] == [
        (PID, 0, marker_offset)
    ]
    assert p.last_stable_offset == p.log.log_end_offset
    p.close()
