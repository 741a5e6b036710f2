"""A broker with a minibroker listener and a kafka listener, on each backend in turn."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess

BOTH_LISTENERS = (
    '[[listeners]]\nname = "minibroker"\nhost = "127.0.0.1"\nport = 0\n'
    '[[listeners]]\nname = "kafka"\nhost = "127.0.0.1"\nport = 0\nprotocol = "kafka"\n'
)


@dataclass(frozen=True)
class TwoListeners:
    """A running broker and the host:port of each of its two listeners."""

    broker: BrokerProcess
    minibroker: str
    kafka: str


@pytest.fixture
def two_listeners(tmp_path: Path, backend: str) -> Iterator[TwoListeners]:
    proc = BrokerProcess(tmp_path / "data", backend=backend, config=BOTH_LISTENERS).start()
    try:
        yield TwoListeners(proc, proc.address("minibroker"), proc.address("kafka"))
    finally:
        proc.kill()
