"""Daemon behaviour of `minibroker serve`: SIGHUP reload, pid file, JSON logs."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch


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
    """Old records (timestamps of 2001) survive under retention_ms = -1; SIGHUP with
    retention_ms lowered to a minute deletes every closed segment at once and says
    what it applied and what would need a restart."""
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


def _event(broker: BrokerProcess, event: str) -> dict[str, object]:
    """The JSON record of the broker's first `event` line, once the log shows it."""
    assert broker.log_shows(f'"event": "{event}"')
    records = [json.loads(line) for line in broker.log_lines]
    return next(r for r in records if r.get("event") == event)


def test_pid_file_and_json_logs(tmp_path: Path) -> None:
    """JSON lines carry numbers and booleans as JSON numbers and booleans, and a new
    data dir says so instead of claiming an unclean shutdown."""
    pid_file = tmp_path / "broker.pid"
    broker = BrokerProcess(
        tmp_path / "data", extra_args=["--pid-file", str(pid_file), "--log-format", "json"]
    )
    # The harness looks for `event=listening ... port=N`; JSON lines carry it in "message".
    broker.start()
    try:
        assert broker.proc is not None
        assert pid_file.read_text().strip() == str(broker.proc.pid)
        starting = _event(broker, "starting")
        assert starting["pid"] == broker.proc.pid and starting["previous_shutdown"] == "none"
        listening = _event(broker, "listening")
        assert listening["port"] == broker.port and listening["level"] == "info"
        recovered = _event(broker, "recovered")
        assert (recovered["topics"], recovered["previous_shutdown"]) == (0, "none")
        assert isinstance(recovered["seconds"], float)
        assert broker.terminate() == 0
        assert _event(broker, "stopped")["clean"] is True
        assert not pid_file.exists()
        broker.start()
        assert _event(broker, "starting")["previous_shutdown"] == "clean"
        broker.kill()
        broker.start()
        assert _event(broker, "starting")["previous_shutdown"] == "unclean"
    finally:
        broker.kill()


def test_evicted_producer_ids_are_forgotten_and_counted(tmp_path: Path) -> None:
    """With max_producers_per_partition=2, a third producer evicts the least
    recently used one: its next in-sequence batch is UNKNOWN_PRODUCER_ID, and
    /metrics counts the eviction."""
    import urllib.request

    conf = tmp_path / "b.toml"
    conf.write_text("max_producers_per_partition = 2\n")
    broker = BrokerProcess(tmp_path / "data", extra_args=["--config", str(conf)]).start()
    try:
        with WireClient(broker.bootstrap) as c:
            c.create_topic("e", 1)
            producers = [c.init_producer() for _ in range(3)]
            for pid, epoch in producers:
                batch = values_batch([b"v"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
                assert c.produce("e", 0, batch)["error"] == 0
            pid, epoch = producers[0]
            batch = values_batch([b"w"], producer_id=pid, producer_epoch=epoch, base_sequence=1)
            assert c.produce("e", 0, batch)["error"] == 59  # UNKNOWN_PRODUCER_ID
        url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'minibroker_producer_events_total{kind="evicted"} 1.0' in text
        assert 'minibroker_active_producer_ids{partition="0",topic="e"} 2.0' in text
    finally:
        broker.kill()
