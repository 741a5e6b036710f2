"""The C batch check (protocol/_records_fast.c `plain_header`) against
protocol/batch.py `validate_reference`, its reference.

`plain_header` may only accept what the reference accepts, with the same header:
whenever it returns one, the reference takes the same bytes (their CRC made right,
which `validate` compares itself) and returns that header. Tried: batches of random
records, with and without headers, compressed or not, idempotent, transactional or
control, with producer fields valid or not; then the same bytes truncated,
extended, with a byte flipped, or a header field rewritten (lengths, counts,
attributes, epoch, sequence), under max_bytes bounds on both sides of the size.
`validate` must answer every one of them as the reference does, refusals with the
same code and message. And it must answer in C, not defer, for the plain batches
every client sends, or the broker keeps paying the reference's price.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.batch import (
    CRC_START,
    HEADER,
    BatchError,
    BatchHeader,
    build_batch,
    crc32,
    plain_header,
    validate,
    validate_reference,
)
from protocol.batch_convert import to_v2
from protocol.compression import Compression

try:
    import protocol._records_fast as built
except ImportError:  # pragma: no cover - test_records_fast says the extension must build
    built = None

pytestmark = pytest.mark.skipif(built is None, reason="protocol/_records_fast.c not built")

ints = st.one_of(st.integers(0, 127), st.integers(-(2**40), 2**40))
blobs = st.one_of(st.none(), st.binary(max_size=200))
plain_rows = st.lists(st.tuples(ints, blobs, blobs, st.none()), min_size=1, max_size=30)
header_rows = st.lists(
    st.tuples(
        ints,
        blobs,
        blobs,
        st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=4)))),
    ),
    min_size=1,
    max_size=30,
)
producers = st.one_of(
    st.just((-1, -1, -1)),
    st.tuples(st.integers(0, 2**40), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1)),
    st.tuples(st.integers(-2, 2**40), st.integers(-(2**15), 2**15 - 1), st.integers(-5, 5)),
)
# Header fields a damaged or hostile batch rewrites: (offset, struct format).
FIELDS = [(8, ">i"), (17, ">B"), (18, ">i"), (38, ">q"), (46, ">h"), (48, ">i"), (52, ">i")]


def _batch(
    rows: list[tuple], producer: tuple[int, int, int], flags: dict[str, bool], codec: int
) -> bytes:
    pid, epoch, sequence = producer
    return build_batch(
        [(1_700_000_000_000 + delta, key, value, headers) for delta, key, value, headers in rows],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        compression=codec,
        **flags,
    )


def _resealed(batch: bytes) -> bytes:
    """`batch` with its CRC made right for its bytes (when it has a whole header)."""
    if len(batch) < HEADER.size:
        return batch
    return batch[:12] + struct.pack(">I", crc32(batch[CRC_START:])) + batch[CRC_START:]


def _outcome(check: object, batch: bytes, max_bytes: int | None) -> object:
    try:
        return check(batch, max_bytes=max_bytes)  # type: ignore[operator]
    except BatchError as exc:
        return exc.code, exc.message


def agrees(batch: bytes, max_bytes: int | None = None) -> None:
    bound = -1 if max_bytes is None else max_bytes
    fast = plain_header(batch, bound, BatchHeader)
    if fast is not None:
        assert type(fast) is BatchHeader
        resealed = _resealed(batch)
        expected = validate_reference(resealed, max_bytes=max_bytes)
        assert fast._replace(crc=expected.crc) == expected, batch.hex()
        assert plain_header(resealed, bound, BatchHeader) == expected
    assert _outcome(validate, batch, max_bytes) == _outcome(validate_reference, batch, max_bytes)


def test_validate_takes_the_c_check() -> None:
    assert built is not None
    assert plain_header is built.plain_header


@settings(max_examples=200, deadline=None)
@given(plain_rows, producers, st.booleans())
def test_plain_batches_are_accepted_in_c(
    rows: list[tuple], producer: tuple[int, int, int], transactional: bool
) -> None:
    pid, epoch, sequence = producer
    batch = _batch(rows, producer, {"transactional": transactional}, Compression.NONE)
    fine = pid == -1 or (epoch >= 0 and sequence >= 0)
    fast = plain_header(batch, -1, BatchHeader)
    assert (fast is not None) == fine
    if fine:
        assert validate(batch) == fast == validate_reference(batch)
        assert plain_header(memoryview(batch), len(batch), BatchHeader) == fast
        assert plain_header(bytearray(batch), len(batch), BatchHeader) == fast
    agrees(batch)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(plain_rows, header_rows),
    producers,
    st.fixed_dictionaries({"transactional": st.booleans(), "control": st.booleans()}),
    st.sampled_from([Compression.NONE, Compression.NONE, Compression.GZIP, Compression.LZ4]),
    st.data(),
)
def test_never_accepts_what_the_reference_refuses(
    rows: list[tuple],
    producer: tuple[int, int, int],
    flags: dict[str, bool],
    codec: int,
    data: st.DataObject,
) -> None:
    batch = _batch(rows, producer, flags, codec)
    for max_bytes in (None, len(batch), len(batch) - 1):
        agrees(batch, max_bytes)
    cut = data.draw(st.integers(0, len(batch) - 1))
    agrees(batch[:cut])
    agrees(batch + data.draw(st.binary(min_size=1, max_size=4)))
    flipped = bytearray(batch)
    flipped[cut] ^= data.draw(st.integers(1, 255))
    agrees(bytes(flipped))
    agrees(_resealed(bytes(flipped)))
    at, form = data.draw(st.sampled_from(FIELDS))
    size = struct.calcsize(form)
    low, high = (0, 2 ** (8 * size) - 1) if form == ">B" else (-(2 ** (8 * size - 1)), 0)
    high = high or 2 ** (8 * size - 1) - 1
    rewritten = bytearray(batch)
    struct.pack_into(form, rewritten, at, data.draw(st.integers(low, high)))
    agrees(bytes(rewritten))
    agrees(_resealed(bytes(rewritten)))


@pytest.mark.parametrize(
    "damage",
    [
        "kafka v2",
        "count one more",
        "count one less",
        "delta not count - 1",
        "length one more",
        "gzip bit",
        "unknown codec bit",
        "idempotent without epoch",
        "idempotent without sequence",
        "over max_bytes",
        "header only",
    ],
)
def test_what_the_reference_decides(damage: str) -> None:
    rows = [(0, b"k", b"v" * 10, None), (1, None, b"w", None)]
    batch = bytearray(_batch(rows, (7, 0, 0), {}, Compression.NONE))
    max_bytes: int | None = None
    if damage == "kafka v2":
        batch = bytearray(to_v2(bytes(batch)))
    elif damage == "count one more":
        struct.pack_into(">i", batch, 52, 3)
        struct.pack_into(">i", batch, 18, 2)
    elif damage == "count one less":
        struct.pack_into(">i", batch, 52, 1)
        struct.pack_into(">i", batch, 18, 0)
    elif damage == "delta not count - 1":
        struct.pack_into(">i", batch, 18, 0)
    elif damage == "length one more":
        struct.pack_into(">i", batch, 8, len(batch) - 11)
    elif damage == "gzip bit":
        batch[17] |= Compression.GZIP
    elif damage == "unknown codec bit":
        batch[17] |= 0x07
    elif damage == "idempotent without epoch":
        struct.pack_into(">h", batch, 46, -1)
    elif damage == "idempotent without sequence":
        struct.pack_into(">i", batch, 48, -1)
    elif damage == "over max_bytes":
        max_bytes = len(batch) - 1
    elif damage == "header only":
        batch = batch[: HEADER.size]
    sealed = _resealed(bytes(batch))
    assert plain_header(sealed, -1 if max_bytes is None else max_bytes, BatchHeader) is None
    agrees(sealed, max_bytes)


def test_a_wrong_crc_is_the_references_refusal() -> None:
    batch = bytearray(_batch([(0, None, b"value", None)], (-1, -1, -1), {}, Compression.NONE))
    batch[-3] ^= 1  # in the value: the records still decode
    assert plain_header(bytes(batch), -1, BatchHeader) is not None  # the CRC is validate's
    with pytest.raises(BatchError, match="CRC mismatch"):
        validate(bytes(batch))
    agrees(bytes(batch))


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError):
        plain_header(b"", -1, int)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        plain_header("not bytes", -1, BatchHeader)  # type: ignore[arg-type]
