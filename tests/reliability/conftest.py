"""Shared helpers of the reliability suite: sizes, seeds, CRC-checked reads, broker RSS.

Sizes: `MINIBROKER_RELIABILITY=full` (what `make test-reliability` sets) runs the
full counts; unset, each test runs its quick count so the suite fits `make test`.
Every random choice comes from a seed that is printed in the failure report
(and can be pinned with `MINIBROKER_RELIABILITY_SEED`).
"""

from __future__ import annotations

import os
import random
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.wire import WireClient
from protocol.batch import CRC_START, HEADER_BYTES, iter_records, read_header

FULL = os.environ.get("MINIBROKER_RELIABILITY", "") == "full"


def size(quick: int, full: int) -> int:
    """`full` under MINIBROKER_RELIABILITY=full, else `quick`."""
    return full if FULL else quick


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A per-test seed, shown in the report of a failed test so the run can be replayed."""
    pinned = os.environ.get("MINIBROKER_RELIABILITY_SEED")
    value = int(pinned) if pinned else random.SystemRandom().randrange(1 << 32)
    request.node.user_properties.append(("seed", value))
    return value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    for name, value in item.user_properties:
        if name == "seed" and report.failed:
            report.sections.append(
                ("reliability seed", f"replay with MINIBROKER_RELIABILITY_SEED={value}")
            )


class CorruptBatchServed(AssertionError):
    """A fetch answer held bytes that are not a whole batch with a valid CRC."""


def checked_batches(records: bytes) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in a fetch answer; fails on any byte that is not
    part of a whole batch whose CRC matches. Only the last batch of a run may be cut
    short by partition_max_bytes, so a torn tail is allowed, a bad CRC never."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos + HEADER_BYTES <= len(records):
        header = read_header(records, pos)
        end = pos + header.size_bytes
        if end > len(records):
            break
        crc = zlib.crc32(memoryview(records)[pos + CRC_START : end])
        if crc != header.crc:
            raise CorruptBatchServed(f"batch at byte {pos} offset {header.base_offset}: bad CRC")
        out += [(r.offset, r.value) for r in iter_records(records, pos, header)]
        pos = end
    if pos == 0 and records:
        raise CorruptBatchServed(f"fetch answer of {len(records)} bytes holds no whole batch")
    return out


def read_partition(
    c: WireClient, topic: str, partition: int, *, limit_s: float = 30.0
) -> list[tuple[int, bytes]]:
    """Every (offset, value) of a partition from its start, each batch CRC-checked."""
    out: list[tuple[int, bytes]] = []
    start = c.call(
        "ListOffsets",
        isolation_level=0,
        topics=[{"topic": topic, "partitions": [{"partition": partition, "timestamp": -2}]}],
    )["topics"][0]["partitions"][0]["offset"]
    offset = start
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        f = c.fetch(topic, partition, offset)
        assert f["error"] == 0, f
        got = [(o, v) for o, v in checked_batches(f["records"]) if o >= offset]
        if not got:
            assert offset == f["high_watermark"], (offset, f["high_watermark"])
            return out
        out += got
        offset = got[-1][0] + 1
    raise AssertionError(f"{topic}-{partition}: not read to its end within {limit_s} s")


def config_file(tmp_path: Path, text: str) -> list[str]:
    """Extra args for a broker reading `text` as its TOML config."""
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return ["--config", str(path)]
