"""send_batch's column encoder: the fast join path must produce msgpack's exact bytes."""

from __future__ import annotations

import itertools

import msgpack
import pyarrow as pa
import pytest

from client.columns import Columns, to_column
from client.errors import RecordTooLargeError


def reference(values: list, keys: list | None = None, headers: list | None = None) -> bytes:
    n = len(values)
    rows = [
        [0, None if keys is None else keys[i], values[i], None if headers is None else headers[i]]
        for i in range(n)
    ]
    return msgpack.packb(rows, use_bin_type=True)


@pytest.mark.parametrize(
    ("n", "size"),
    [(n, size) for n in (1, 15, 16, 70_000) for size in (0, 100, 255, 256, 70_000)][:-1],
)
def test_values_only_matches_msgpack(n: int, size: int) -> None:
    values = [bytes([i % 251]) * size for i in range(n)]
    assert Columns(values).encode(0, n) == reference(values)


def test_keys_slices_and_the_slow_paths_match_msgpack() -> None:
    values = [b"v%d" % i * (i % 300) for i in range(1_000)]
    keys = [b"k%d" % i for i in range(1_000)]
    assert Columns(values, keys).encode(10, 700) == reference(values[10:700], keys[10:700])
    with_none = [None if i % 7 == 0 else v for i, v in enumerate(values)]
    assert Columns(with_none, keys).encode(0, 1_000) == reference(with_none, keys)
    none_keys = [None if i % 3 == 0 else k for i, k in enumerate(keys)]
    assert Columns(values, none_keys).encode(0, 1_000) == reference(values, none_keys)
    headers = [[("h", b"x")] if i % 2 else None for i in range(1_000)]
    assert Columns(values, None, headers).encode(0, 1_000) == reference(values, None, headers)


def test_bounds_cover_every_row_within_the_limit() -> None:
    values = [b"x" * 100] * 1_000
    bounds = Columns(values).bounds(12_100)
    assert bounds[0] == (0, 100) and bounds[-1][1] == 1_000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    with pytest.raises(RecordTooLargeError):
        Columns([b"x" * 200]).bounds(100)


def test_columns_from_lists_and_arrow() -> None:
    assert to_column(["a", b"b", None, bytearray(b"c")], "values") == [b"a", b"b", None, b"c"]
    assert to_column(pa.array(["x", None]), "values") == [b"x", None]
    assert to_column(pa.chunked_array([[b"1"], [b"2"]]), "values") == [b"1", b"2"]
    with pytest.raises(TypeError):
        to_column(pa.array([1, 2]), "values")
    with pytest.raises(TypeError):
        to_column([1], "values")
    with pytest.raises(ValueError):
        Columns([b"a"], [b"k", b"l"])
