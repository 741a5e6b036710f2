"""kio's reader allocates a compact array's count before reading its items, and a count
near 2**32 aborts the broker's process (Rust's out-of-memory abort: no exception to
catch). `broker/kafka/entities.py` `check_counts` walks a flexible request as kio reads
it and refuses such a count first. Here: the walk ends where the request ends for a
request of every flexible version served, and a 20-byte request with a huge count
closes the connection instead of ending the broker (in a child process, so that a
regression aborts the child, not the test run)."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.serial import entity_reader, entity_writer

from broker.kafka.apis import SERVED
from broker.kafka.entities import Plan, _plans, build, check_counts, request_class

ROOT = Path(__file__).resolve().parents[2]
HUGE = b"\xfe\xff\xff\xff\x0f"  # an unsigned varint of 2**32 - 2: a count of 2**32 - 3
FLEXIBLE = [
    (api.key, version)
    for api in SERVED
    for version in range(api.min_version, api.max_version + 1)
    if getattr(request_class(api.key, version), "__flexible__", False)
]
_VALUES = {"string": "s", "bytes": b"b", "records": b"r", "uuid": uuid.UUID(int=1)}


def one_of_everything(cls: type) -> dict[str, Any]:
    """Values for `cls` with one item in every array, all the way down."""
    values: dict[str, Any] = {}
    for plan in _plans(cls):
        if plan.tagged:
            continue
        item = one_of_everything(plan.nested) if plan.nested else _value(plan)
        values[plan.name] = [item] if plan.many else item
    return values


def _value(plan: Plan) -> Any:
    return _VALUES.get(plan.kind, 1)


def request_body(key: int, version: int) -> bytes:
    cls = request_class(key, version)
    assert cls is not None
    head: Any = cls.__header_schema__  # type: ignore[attr-defined]
    out = io.BytesIO()
    entity_writer(head)(
        out, head(request_api_key=key, request_api_version=version, correlation_id=7, client_id="c")
    )
    entity_writer(cls)(out, build(cls, one_of_everything(cls)))
    return out.getvalue()


@pytest.mark.parametrize(("key", "version"), FLEXIBLE)
def test_the_walk_ends_where_the_request_kio_wrote_ends(key: int, version: int) -> None:
    """kio's writer wrote the request, one item in every array, and its reader reads it
    back (the offset kio's reader returns skips nested arrays, so the request's own
    length is the reference)."""
    cls = request_class(key, version)
    assert cls is not None
    body = request_body(key, version)
    _header, used = entity_reader(cls.__header_schema__)(body, 0)  # type: ignore[attr-defined]
    request, _ = entity_reader(cls)(body, used)
    assert request == build(cls, one_of_everything(cls))
    assert check_counts(cls, body + b"trailing") == len(body)


def test_every_served_api_with_arrays_has_flexible_versions_walked() -> None:
    assert len(FLEXIBLE) > 40
    assert (3, 12) in FLEXIBLE and (1, 12) in FLEXIBLE


def _decode_in_a_child(body: bytes) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        "from broker.kafka import KafkaCodec\n"
        "from protocol.framing import FrameError\n"
        "try:\n"
        "    KafkaCodec((), 1).decode(bytes.fromhex(sys.argv[1]))\n"
        "except FrameError as exc:\n"
        "    print('refused:', exc)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, body.hex()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_huge_top_level_count_closes_the_connection_not_the_broker() -> None:
    """Metadata v12 (allowed before authentication) with 2**32 - 3 topics, 20 bytes."""
    body = struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + HUGE + b"\x00\x00\x00"
    done = _decode_in_a_child(body)
    assert done.returncode == 0, done.stderr[-500:]
    assert "refused:" in done.stdout and "counts 4294967293 items" in done.stdout


def test_a_huge_nested_count_closes_the_connection_not_the_broker() -> None:
    """Fetch v12 whose one topic has 2**32 - 3 partitions: the count found under an
    array, after a long varint put there (the topic name's high bytes) to wake the walk."""
    cls = request_class(1, 12)
    assert cls is not None
    values = one_of_everything(cls)
    values["topics"][0]["topic"] = "é" * 3
    values["topics"][0]["partitions"] = []
    body = request_body_of(cls, values)
    empty_partitions = "é".encode() * 3 + b"\x01"
    assert body.count(empty_partitions) == 1
    body = body.replace(empty_partitions, empty_partitions[:-1] + HUGE)
    done = _decode_in_a_child(body)
    assert done.returncode == 0, done.stderr[-500:]
    assert "refused:" in done.stdout and "partitions counts 4294967293 items" in done.stdout


def request_body_of(cls: Any, values: dict[str, Any]) -> bytes:
    head: Any = cls.__header_schema__
    out = io.BytesIO()
    entity_writer(head)(
        out,
        head(
            request_api_key=cls.__api_key__,
            request_api_version=cls.__version__,
            correlation_id=7,
            client_id="c",
        ),
    )
    entity_writer(cls)(out, build(cls, values))
    return out.getvalue()
