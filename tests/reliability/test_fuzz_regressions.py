"""Every file the fuzzer kept (tests/reliability/crashes/) and every seed of its corpus,
replayed through the fuzz target: each raises only the errors the contract names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.fuzz_targets import one_input
from tests.reliability.make_corpus import seeds

HERE = Path(__file__).parent
KEPT = sorted((HERE / "crashes").glob("*")) + sorted((HERE / "corpus").glob("*"))


@pytest.mark.parametrize("path", KEPT, ids=[p.name for p in KEPT])
def test_kept_input_replays_cleanly(path: Path) -> None:
    one_input(path.read_bytes())


def test_corpus_is_seeded_from_real_frames() -> None:
    """The committed corpus holds every seed make_corpus writes, byte for byte."""
    for name, data in seeds().items():
        assert (HERE / "corpus" / name).read_bytes() == data, name
