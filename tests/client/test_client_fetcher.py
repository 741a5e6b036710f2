"""Sans-IO tests of fetched-record decoding: skipping, control and aborted batches, corruption."""

from __future__ import annotations

import gc

import msgpack
import pytest

import client.fetcher
from client.errors import CorruptRecordError, MinibrokerError
from client.fetcher import FetchedRecords
from protocol.batch import (
    CONTROL_COMMIT,
    build_batch,
    build_batch_from_columns,
    build_control_batch,
    encode_batch,
)
from protocol.compression import Compression
from tests.fetcher_support import at, check_aborted_transaction_skipped, take_all


def values_batch(offset: int, values: list[bytes], **kwargs: object) -> bytes:
    return at(offset, build_batch_from_columns(values, None, 1_000, **kwargs))  # type: ignore[arg-type]


def test_records_have_offsets_timestamps_keys_and_headers() -> None:
    batch = at(
        10,
        build_batch(
            [(1_000, b"k0", b"v0", None), (1_007, None, b"v1", [("h", b"x")])],
            compression=Compression.ZSTD,
        ),
    )
    fetched = FetchedRecords("t", 2, batch, 10)
    r0, r1 = take_all(fetched)
    assert (r0.topic, r0.partition, r0.offset, r0.timestamp, r0.key, r0.value) == (
        "t",
        2,
        10,
        1_000,
        b"k0",
        b"v0",
    )
    assert r0.headers == () and list(r1.headers) == [("h", b"x")]
    assert (r1.offset, r1.timestamp) == (11, 1_007)
    assert fetched.next_fetch_offset == 12 and fetched.exhausted


def test_records_below_the_fetch_offset_are_skipped() -> None:
    data = values_batch(0, [b"a", b"b", b"c"]) + values_batch(3, [b"d", b"e"])
    fetched = FetchedRecords("t", 0, data, 2)
    assert [r.value for r in take_all(fetched)] == [b"c", b"d", b"e"]
    assert fetched.position == 5


def test_take_respects_max_records_across_batches() -> None:
    data = values_batch(0, [b"%d" % i for i in range(5)]) + values_batch(5, [b"5", b"6"])
    fetched = FetchedRecords("t", 0, data, 0)
    assert [r.offset for r in fetched.take(3)] == [0, 1, 2]
    assert fetched.position == 3
    assert [r.offset for r in fetched.take(3)] == [3, 4, 5]
    assert [r.offset for r in fetched.take(3)] == [6]
    assert fetched.take(3) == []


def test_a_trailing_partial_batch_is_ignored() -> None:
    whole = values_batch(0, [b"a"])
    partial = values_batch(1, [b"b" * 100])[:80]
    fetched = FetchedRecords("t", 0, whole + partial, 0)
    assert [r.value for r in take_all(fetched)] == [b"a"]
    assert fetched.next_fetch_offset == 1


def test_only_a_partial_batch_asks_for_a_larger_fetch_size() -> None:
    fetched = FetchedRecords("t", 0, values_batch(0, [b"b" * 100])[:80], 0)
    with pytest.raises(MinibrokerError, match="max_partition_fetch_bytes"):
        fetched.take(10)


def test_crc_mismatch_names_topic_partition_and_offset_after_the_good_records() -> None:
    good = values_batch(0, [b"a", b"b"])
    bad = bytearray(values_batch(2, [b"c"]))
    bad[-1] ^= 0xFF
    fetched = FetchedRecords("orders", 3, good + bytes(bad), 0)
    assert fetched.failed
    assert [r.value for r in fetched.take(10)] == [b"a", b"b"]
    with pytest.raises(CorruptRecordError) as info:
        fetched.take(10)
    assert (info.value.topic, info.value.partition, info.value.offset) == ("orders", 3, 2)
    assert "orders-3" in str(info.value) and "offset 2" in str(info.value)
    with pytest.raises(CorruptRecordError):
        fetched.take(10)  # sticky until the consumer seeks


def test_records_that_do_not_match_a_valid_header_are_corrupt() -> None:
    payload = msgpack.packb([[0, None, b"a", None], [0, None, b"b", None]])
    batch = encode_batch(payload, record_count=3, base_timestamp=0, max_timestamp=0)
    with pytest.raises(CorruptRecordError, match="t-0 at offset 5"):
        FetchedRecords("t", 0, at(5, batch), 5).take(10)


def test_control_batches_are_always_dropped() -> None:
    data = (
        values_batch(0, [b"a"])
        + at(
            1, build_control_batch(CONTROL_COMMIT, producer_id=1, producer_epoch=0, timestamp_ms=5)
        )
        + values_batch(2, [b"b"])
    )
    fetched = FetchedRecords("t", 0, data, 0)
    assert [r.offset for r in take_all(fetched)] == [0, 2]


def test_read_committed_drops_aborted_transactions() -> None:
    def txn(offset: int, pid: int, values: list[bytes]) -> bytes:
        return at(
            offset,
            build_batch_from_columns(
                values,
                None,
                1,
                producer_id=pid,
                producer_epoch=0,
                base_sequence=0,
                transactional=True,
            ),
        )

    def marker(offset: int, pid: int, kind: int) -> bytes:
        return at(
            offset, build_control_batch(kind, producer_id=pid, producer_epoch=0, timestamp_ms=1)
        )

    check_aborted_transaction_skipped(txn, marker)


def test_the_c_decode_gives_the_columnar_decodes_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain batches are decoded in C (protocol.records.plain_rows); the records must be
    those of the columnar decode it stands in for, skipped offsets, keys, deltas and
    compression included, and untracked by the cyclic GC (they cannot form cycles)."""
    data = (
        values_batch(0, [b"a", b"", b"c"])
        + at(3, build_batch([(1_000, b"k", b"v", None), (1_009, None, None, None)]))
        + values_batch(5, [b"x" * 300] * 40, compression=Compression.LZ4)
        + at(45, build_batch([(2_000, b"k", b"h", [("n", b"v")]), (2_001, None, b"p", None)]))
    )
    for first in (0, 2, 4, 30):
        fast = take_all(FetchedRecords("t", 1, data, first))
        with monkeypatch.context() as patched:
            patched.setattr(client.fetcher, "plain_rows", lambda *args: None)
            slow = take_all(FetchedRecords("t", 1, data, first))
        assert fast == slow and [type(r) for r in fast] == [type(r) for r in slow]
        assert [r.offset for r in fast] == list(range(first, 47))
        assert not any(gc.is_tracked(r) for r in fast[: 45 - first])
