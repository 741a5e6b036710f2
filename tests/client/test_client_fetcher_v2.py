"""The SDK's fetcher reading Kafka's v2 batches (magic 2), alone and mixed with ours.

A topic written by Kafka clients through the kafka listener is served as it lies;
the SDK (and the Spark reader, which polls through it) must hand out the same
ConsumerRecords it would for our batches: offsets, timestamps (log-append time
too), keys, values, headers (a null header value as None), control batches
dropped, aborted transactions skipped under read_committed, a CRC-32C mismatch
or undecodable records named as corruption, a cut v2 header as a partial tail.
"""

from __future__ import annotations

import struct

import crc32c
import pytest

from client.errors import CorruptRecordError
from client.fetcher import FetchedRecords
from protocol.batch import build_batch, build_control_batch
from protocol.batch_v2 import build_control_batch_v2, encode_batch_v2, encode_records_v2
from protocol.compression import Compression
from tests import fetcher_support
from tests.fetcher_support import at, check_aborted_transaction_skipped

ROWS = [
    (1_000, b"k0", b"v0", [("h", b"x"), ("null", None)]),
    (1_007, None, b"v1", None),
    (1_003, b"k2", None, []),
]


def take_all(fetched: FetchedRecords) -> list:
    """Every record, two at a time: takes that end inside a batch."""
    return fetcher_support.take_all(fetched, step=2)


@pytest.mark.parametrize("codec", list(Compression))
def test_v2_records_read_as_ours_do(codec: Compression) -> None:
    fetched = FetchedRecords("t", 2, at(10, encode_batch_v2(ROWS, compression=codec)), 10)
    records = take_all(fetched)
    assert [tuple(r) for r in records] == [
        ("t", 2, 10, 1_000, b"k0", b"v0", (("h", b"x"), ("null", None))),
        ("t", 2, 11, 1_007, None, b"v1", ()),
        ("t", 2, 12, 1_003, b"k2", None, ()),
    ]
    assert fetched.next_fetch_offset == 13 and fetched.position == 13


def test_a_mixed_run_reads_in_offset_order_from_inside_a_batch() -> None:
    ours = build_batch([(5, b"a", b"ours-0", [("h", b"1")]), (6, None, b"ours-1", None)])
    data = at(0, ours) + at(2, encode_batch_v2(ROWS, compression=Compression.SNAPPY)) + at(5, ours)
    records = take_all(FetchedRecords("t", 0, data, 1))
    assert [(r.offset, r.value) for r in records] == [
        (1, b"ours-1"),
        (2, b"v0"),
        (3, b"v1"),
        (4, None),
        (5, b"ours-0"),
        (6, b"ours-1"),
    ]
    assert records[4].headers == (("h", b"1"),)
    # From inside the v2 batch too.
    assert [r.offset for r in take_all(FetchedRecords("t", 0, data, 3))] == [3, 4, 5, 6]


def test_log_append_time_gives_the_batch_max_timestamp() -> None:
    batch = encode_batch_v2(ROWS, log_append_time=True, max_timestamp=9_999)
    assert [r.timestamp for r in take_all(FetchedRecords("t", 0, batch, 0))] == [9_999] * 3


def test_a_cut_v2_header_or_batch_is_a_partial_tail() -> None:
    good = at(0, encode_batch_v2(ROWS))
    for cut in (58, 61, 80):
        fetched = FetchedRecords("t", 0, good + at(3, encode_batch_v2(ROWS))[:cut], 0)
        assert not fetched.failed and fetched.next_fetch_offset == 3
        assert len(take_all(fetched)) == 3


def test_a_crc32c_mismatch_or_bad_records_are_corruption_after_the_good_ones() -> None:
    good = at(0, encode_batch_v2(ROWS))
    bad = bytearray(at(3, encode_batch_v2(ROWS)))
    bad[-1] ^= 0xFF
    fetched = FetchedRecords("orders", 1, good + bytes(bad), 0)
    assert fetched.failed
    assert len(fetched.take(10)) == 3
    with pytest.raises(CorruptRecordError) as info:
        fetched.take(10)
    assert (info.value.topic, info.value.partition, info.value.offset) == ("orders", 1, 3)
    # A header that lies about its records, CRC-32C right: corrupt when decoded.
    lying = bytearray(encode_batch_v2(ROWS))
    records = encode_records_v2([(0, None, b"x", None)])
    lying[61:] = records
    struct.pack_into(">i", lying, 8, len(lying) - 12)
    struct.pack_into(">I", lying, 17, crc32c.crc32c(bytes(lying[21:])))
    with pytest.raises(CorruptRecordError, match="t-0 at offset 7"):
        FetchedRecords("t", 0, at(7, bytes(lying)), 7).take(10)


@pytest.mark.parametrize("v2_markers", [True, False])
def test_v2_control_batches_are_dropped_and_aborted_v2_transactions_skipped(
    v2_markers: bool,
) -> None:
    def txn(offset: int, pid: int, values: list[bytes]) -> bytes:
        rows = [(1, None, v, None) for v in values]
        return at(
            offset,
            encode_batch_v2(
                rows, producer_id=pid, producer_epoch=0, base_sequence=0, transactional=True
            ),
        )

    def marker(offset: int, pid: int, kind: int) -> bytes:
        build = build_control_batch_v2 if v2_markers else build_control_batch
        return at(offset, build(kind, producer_id=pid, producer_epoch=0, timestamp_ms=1))

    check_aborted_transaction_skipped(txn, marker, step=2)
