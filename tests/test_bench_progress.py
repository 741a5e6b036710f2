"""`make bench` says on stderr which suite and which round it is in (bench/progress.py)."""

from __future__ import annotations

import pytest

from bench import progress


def test_suite_and_rounds_are_named_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    progress.suite("client", 5, 10)
    assert list(progress.rounds(3, "durable producer processes")) == [0, 1, 2]
    assert list(progress.rounds(7, "costs, trio", 4, 6)) == [4, 5]
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith("bench: suite 5/10: client (started ")
    assert lines[1:] == [
        "bench: client, durable producer processes: round 1/3",
        "bench: client, durable producer processes: round 2/3",
        "bench: client, durable producer processes: round 3/3",
        "bench: client, costs, trio: round 5/7",
        "bench: client, costs, trio: round 6/7",
    ]
