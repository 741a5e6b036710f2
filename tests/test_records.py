"""The one records encoder (protocol/records.py).

Every path (rows, the column fast path, the accumulator, send_batch's columns)
gives the same bytes, and the bytes of before the encoders were merged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest

from client.accumulator import RecordAccumulator
from client.columns import Columns
from protocol.batch import (
    CONTROL_COMMIT,
    build_batch,
    build_batch_from_columns,
    build_control_batch,
    validate,
)
from protocol.compression import Compression
from protocol.records import RecordColumns, encode_rows

# sha256 of batches built by the four encoders this module replaced (main at c2e5e23).
GOLDEN = [
    (
        lambda: build_batch(
            [
                (1000, b"k", b"v", [("h", b"x")]),
                (1005, None, b"w" * 300, None),
                (999, b"k2", None, None),
            ],
            producer_id=7,
            producer_epoch=2,
            base_sequence=40,
        ),
        "f954706123e762d4aa64c18ce566d01175bafd1bff144f9d35cc13d636f1ad09",
    ),
    (
        lambda: build_batch_from_columns(
            [b"a" * 20, b"b" * 70000, b""], [b"k1", b"k2" * 200, b"k3"], 123
        ),
        "e9a6da5f19020dcf84fe2978328936f7fa1b93a8a090fc8e38fbe221c50db6b4",
    ),
    (
        lambda: build_batch_from_columns(
            [b"x" * 100] * 40,
            None,
            5,
            producer_id=1,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),
        "fb5e7ad9156c8f81c37a0312c542043ef322bd6c179d25702c33d641e31c1c5f",
    ),
    (
        lambda: build_control_batch(
            CONTROL_COMMIT, producer_id=3, producer_epoch=1, timestamp_ms=5
        ),
        "9f7ed0fe69230ba86ee0e30545eec0d29a2cd72707e99caefe3611f650217645",
    ),
]


@pytest.mark.parametrize(("build", "digest"), GOLDEN)
def test_batches_are_byte_identical_to_the_replaced_encoders(
    build: Callable[[], bytes], digest: str
) -> None:
    assert hashlib.sha256(build()).hexdigest() == digest


COLUMN_CASES = [
    ([b"v" * (i * 37 % 300) for i in range(500)], None, None),  # the values-only join
    ([b"v%d" % i for i in range(500)], [b"k%d" % i for i in range(500)], None),  # keyed join
    ([None, b"a", b"b" * 70_000], [b"k1", None, b"k3"], None),  # None: the row path
    ([b"a", b"b"], None, [[("h", b"x"), ("i", b"")], None]),  # headers: the row path
]


@pytest.mark.parametrize(("values", "keys", "headers"), COLUMN_CASES)
def test_the_column_path_and_the_row_path_give_the_same_bytes(
    values: list, keys: list | None, headers: list | None
) -> None:
    rows = [
        (0, None if keys is None else keys[i], v, None if headers is None else headers[i])
        for i, v in enumerate(values)
    ]
    columns = RecordColumns(values, keys, headers)
    assert columns.encode() == encode_rows(rows)
    assert columns.encode(1, 3) == encode_rows(rows[1:3])
    batch = build_batch_from_columns(values, keys, 77, headers=headers)
    assert batch == build_batch([(77 + delta, k, v, h) for delta, k, v, h in rows])
    assert validate(batch).record_count == len(values)


def test_the_producer_paths_give_the_same_bytes_as_build_batch() -> None:
    acc = RecordAccumulator(batch_size=100_000, clock=lambda: 0.0)
    acc.set_producer_id(9, 1)
    acc.append("t", 0, 1_000, b"k", b"v1", [("h", b"x")], None)
    acc.append("t", 0, 1_003, None, b"v2", None, None)
    acc.append_encoded("t", 1, Columns([b"a", b"bb"]).encode(0, 2), 2, 2_000)
    [[by_send, by_send_batch]] = acc.drain(0, 1)
    assert by_send.wire(9, 1, Compression.GZIP) == build_batch(
        [(1_000, b"k", b"v1", [("h", b"x")]), (1_003, None, b"v2", None)],
        producer_id=9,
        producer_epoch=1,
        base_sequence=0,
        compression=Compression.GZIP,
    )
    assert by_send_batch.wire(9, 1, Compression.NONE) == build_batch_from_columns(
        [b"a", b"bb"], None, 2_000, producer_id=9, producer_epoch=1, base_sequence=0
    )
