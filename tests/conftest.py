"""Shared fixtures: a real broker process per test, on either AnyIO backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess

BACKENDS = ("trio", "asyncio")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    """A running broker on loopback with a fresh data dir, on each backend in turn."""
    proc = BrokerProcess(tmp_path / "data", backend=backend).start()
    try:
        yield proc
    finally:
        proc.kill()
