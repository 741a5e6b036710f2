"""The transactional history check (tests/reliability/txn_history.py) at a quick size:
150 transactions from 2 producer processes against a broker killed every ~2 s and
down for up to 3.5 s (longer, at times, than the producers' delivery_timeout_ms), on
each backend, read back with no anomaly; then the same with confluent-kafka's producers
and consumers through a kafka listener.

Pauses of up to 0.6 s before 1 commit in 5 stretch the 150 transactions over a few
kills; `make txn-history` runs the full size. The classification itself is checked
on a made-up history, where each anomaly is planted once.
"""

from __future__ import annotations

from pathlib import Path

from tests.reliability.txn_history import Settings, Txn, check_backend, classify, summary


def test_transactions_under_kills_read_back_as_reported(
    tmp_path: Path, backend: str, seed: int
) -> None:
    settings = Settings(
        transactions=150,
        backends=(backend,),
        producers=2,
        kill_interval_s=2.0,
        downtime_max_s=3.5,
        pause_max_s=0.6,
        max_seconds=120.0,
        seed=seed,
    )
    result = check_backend(settings, backend, tmp_path / "out")
    report = summary(settings, [result])
    assert not result.failures, report
    assert not result.anomalies, report
    assert result.kills >= 1, report
    assert result.outcomes["committed"] > 0 and result.outcomes["aborted"] > 0, report
    assert result.records_committed > 0, report


def test_confluent_kafka_transactions_under_kills_read_back_as_reported(
    tmp_path: Path, backend: str, seed: int
) -> None:
    """The same check with confluent-kafka's transactional producers and read_committed
    consumers through the broker's kafka listener (`--client confluent`)."""
    settings = Settings(
        transactions=150,
        backends=(backend,),
        producers=2,
        kill_interval_s=2.0,
        downtime_max_s=3.5,
        pause_max_s=0.6,
        max_seconds=120.0,
        seed=seed,
        client="confluent",
    )
    result = check_backend(settings, backend, tmp_path / "out")
    report = summary(settings, [result])
    assert not result.failures, report
    assert not result.anomalies, report
    assert result.kills >= 1, report
    assert result.outcomes["committed"] > 0 and result.outcomes["aborted"] > 0, report
    assert result.records_committed > 0, report


def _txn(name: str, outcome: str, *records: tuple[int, bytes]) -> Txn:
    return Txn(name, 0, list(records), {"outcome": outcome, "sent": len(records)})


def test_each_planted_anomaly_is_found() -> None:
    txns = {
        t.id: t
        for t in (
            _txn("p0.t0", "committed", (0, b"a0"), (1, b"a1")),
            _txn("p0.t1", "abortable", (0, b"b0")),  # visible: the defect hunted
            _txn("p0.t2", "committed", (1, b"c0")),  # missing
            _txn("p0.t3", "unknown", (2, b"d0"), (3, b"d1")),  # half visible
            _txn("p0.t4", "committed", (2, b"e0")),  # before d0 in partition 2
            _txn("p1.t0", "unknown", (3, b"f0")),  # invisible: allowed
        )
    }
    committed = {
        0: [(0, b"a0"), (2, b"b0")],
        1: [(0, b"a1"), (2, b"a1")],
        2: [(0, b"e0"), (1, b"d0"), (2, b"zz")],
        3: [],
    }
    uncommitted = {**committed, 1: [(0, b"a1"), (1, b"c0"), (2, b"a1")]}
    in_run = {(1, 0): {b"a1"}, (1, 1): {b"c0"}}
    anomalies = classify(txns, committed, uncommitted, in_run, {3: (4, 6)})
    found = sorted((a["kind"], a.get("txn")) for a in anomalies)
    assert found == [
        ("aborted_read", "p0.t1"),
        ("duplicate", "p0.t0"),
        ("fractured_read", "p0.t3"),
        ("inconsistent_read", "p0.t2"),
        ("lost_write", "p0.t2"),
        ("order", "p0.t3"),
        ("phantom", None),
        ("stuck_lso", None),
    ]
