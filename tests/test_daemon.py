"""Daemon behaviour of `minibroker serve`: SIGHUP reload, pid file, JSON logs."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tests.broker_process import BrokerProcess
from tests.wire import WireClient, values_batch


def _earliest(c: WireClient, topic: str) -> int:
    r = c.call(
        "ListOffsets", topics=[{"topic": topic, "partitions": [{"partition": 0, "timestamp": -2}]}]
    )
    return r["topics"][0]["partitions"][0]["offset"]


def _wait_for(predicate, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_sighup_applies_a_new_retention(tmp_path: Path, backend: str) -> None:
    """Old records (timestamps of 2001) survive under the default 7-day retention
    only because the broker has not re-read its config; SIGHUP with retention_ms
    lowered deletes every closed segment at once and says what it applied."""
    conf = tmp_path / "b.toml"
    conf.write_text("segment_bytes = 2048\nretention_ms = -1\n")
    broker = BrokerProcess(
        tmp_path / "data", backend=backend, extra_args=["--config", str(conf)]
    ).start()
    try:
        with WireClient(broker.bootstrap) as c:
            c.create_topic("r", 1)
            for i in range(20):
                c.produce(
                    "r", 0, values_batch([b"%d" % i + b"x" * 500], timestamp_ms=1_000_000_000_000)
                )
            assert _earliest(c, "r") == 0
            conf.write_text("segment_bytes = 2048\nretention_ms = 60000\nmax_connections = 7\n")
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGHUP)
            assert _wait_for(lambda: "event=reloaded" in broker.log_text())
            assert _earliest(c, "r") > 0
            # The active segment is never deleted, and appends go on.
            assert c.produce("r", 0, values_batch([b"after"]))["error"] == 0
        line = next(ln for ln in broker.log_lines if "event=reloaded" in ln)
        assert "retention_ms=60000" in line and "needs_restart=max_connections" in line
    finally:
        broker.kill()


def test_pid_file_and_json_logs(tmp_path: Path) -> None:
    pid_file = tmp_path / "broker.pid"
    broker = BrokerProcess(
        tmp_path / "data", extra_args=["--pid-file", str(pid_file), "--log-format", "json"]
    )
    # The harness looks for `event=listening ... port=N`; JSON lines carry it in "message".
    broker.start()
    try:
        assert broker.proc is not None
        assert pid_file.read_text().strip() == str(broker.proc.pid)
        records = [json.loads(line) for line in broker.log_lines]
        listening = next(r for r in records if r.get("event") == "listening")
        assert listening["port"] == str(broker.port) and listening["level"] == "info"
        assert broker.terminate() == 0
        assert not pid_file.exists()
    finally:
        broker.kill()
