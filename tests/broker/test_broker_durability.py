"""Crashes, clean stops and a full disk against the real broker process.

What is tried, each on both backends:
- kill -9 mid-stream, then restart: every acknowledged record is there once, and
  the whole 5-batch duplicate window is still recognised;
- SIGTERM under load: exit 0 well within 10 s, a clean-shutdown marker, and a
  restart that replays nothing;
- a write past RLIMIT_FSIZE (the disk-full stand-in): KAFKA_STORAGE_ERROR, and
  nothing half-written becomes visible;
- a second broker on the same data dir refuses to start.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess, serve_once
from harness.wire import WireClient, fetched_values, values_batch
from protocol.errors import ErrorCode


def produce_seq(
    c: WireClient, topic: str, pid: int, epoch: int, seq: int, n: int, acks: int = -1
) -> dict:
    vals = [f"{seq + i}".encode() for i in range(n)]
    return c.produce(
        topic,
        0,
        values_batch(vals, producer_id=pid, producer_epoch=epoch, base_sequence=seq),
        acks=acks,
    )


def all_values(c: WireClient, topic: str) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        f = c.fetch(topic, 0, offset)
        got = fetched_values(f["records"], offset)
        if not got:
            return out
        out.extend(v for _, v in got)
        offset = got[-1][0] + 1


@pytest.mark.parametrize("small_segments", [False, True], ids=["one-segment", "rolling"])
def test_kill9_keeps_acknowledged_records_and_the_duplicate_window(
    tmp_path: Path, backend: str, small_segments: bool
) -> None:
    extra = ["--config", str(tmp_path / "b.toml")]
    (tmp_path / "b.toml").write_text("segment_bytes = 4096\n" if small_segments else "")
    broker = BrokerProcess(tmp_path / "data", backend=backend, extra_args=extra).start()
    try:
        with WireClient(broker.bootstrap) as c:
            c.create_topic("k", 1)
            pid, epoch = c.init_producer()
            seq = 0
            sent: list[tuple[int, int, int]] = []  # (seq, n, base_offset)
            for i in range(60):
                n = 1 + i % 4
                r = produce_seq(c, "k", pid, epoch, seq, n, acks=-1 if i % 2 else 1)
                assert r["error"] == 0
                sent.append((seq, n, r["base_offset"]))
                seq += n
        broker.restart(kill=True)
        assert broker.log_shows("previous_shutdown=unclean")
        with WireClient(broker.bootstrap) as c:
            for s, n, base in sent[-5:]:
                r = produce_seq(c, "k", pid, epoch, s, n)
                assert (r["error"], r["base_offset"], r["duplicate"]) == (0, base, True)
            s, n, _ = sent[-6]
            assert (
                produce_seq(c, "k", pid, epoch, s, n)["error"]
                == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
            )
            assert (
                produce_seq(c, "k", pid, epoch, seq + 1, 1)["error"]
                == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
            )
            assert produce_seq(c, "k", pid, epoch, seq, 1)["error"] == 0
            values = all_values(c, "k")
        assert values == [str(i).encode() for i in range(seq + 1)]
    finally:
        broker.kill()


def test_sigterm_under_load_is_clean_and_loses_nothing(tmp_path: Path, backend: str) -> None:
    """2000 pipelined acks=-1 batches, SIGTERM after the first reply: every batch the
    broker appended gets its reply before the connection closes, and none is lost."""
    broker = BrokerProcess(tmp_path / "data", backend=backend).start()
    try:
        with WireClient(broker.bootstrap) as c:
            c.create_topic("g", 1)
            pid, epoch = c.init_producer()
            for seq in range(2000):
                batch = values_batch(
                    [str(seq).encode()], producer_id=pid, producer_epoch=epoch, base_sequence=seq
                )
                c.send(
                    "Produce",
                    acks=-1,
                    timeout_ms=10_000,
                    topics=[{"topic": "g", "partitions": [{"partition": 0, "records": batch}]}],
                )
            acked = [c.recv()]
            started = time.monotonic()
            assert broker.proc is not None
            broker.proc.send_signal(15)
            try:
                while True:
                    acked.append(c.recv())
            except ConnectionError:
                pass
            assert broker.proc.wait(10) == 0
            assert time.monotonic() - started < 10
        assert all(r["topics"][0]["partitions"][0]["error"] == 0 for r in acked)
        assert (tmp_path / "data" / ".clean_shutdown").exists()
        broker.start()
        assert broker.log_shows("previous_shutdown=clean")
        assert "producer_state_replayed" not in broker.log_text()
        with WireClient(broker.bootstrap) as c:
            values = all_values(c, "g")
        assert values == [str(i).encode() for i in range(len(values))]
        assert len(values) == len(acked), "a batch was appended but its reply never sent"
    finally:
        broker.kill()


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def test_disk_full_answers_storage_error_and_leaves_nothing_half_written(
    tmp_path: Path, backend: str
) -> None:
    broker = BrokerProcess(tmp_path / "data", backend=backend, preexec_fn=_limit_file_size).start()
    try:
        with WireClient(broker.bootstrap) as c:
            c.create_topic("full", 1)
            pid, epoch = c.init_producer()
            acked: list[bytes] = []
            for seq in range(100):
                value = str(seq).encode() + b"x" * 3000
                batch = values_batch(
                    [value], producer_id=pid, producer_epoch=epoch, base_sequence=seq
                )
                r = c.produce("full", 0, batch)
                if r["error"]:
                    break
                acked.append(value)
            assert r["error"] == ErrorCode.KAFKA_STORAGE_ERROR
            # The failed batch changed neither log nor producer state: a retry is no duplicate.
            again = c.produce("full", 0, batch)
            assert again["error"] == ErrorCode.KAFKA_STORAGE_ERROR and not again["duplicate"]
            assert c.fetch("full", 0, 0)["high_watermark"] == len(acked)
            assert all_values(c, "full") == acked
        assert broker.log_shows("event=storage_error")
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            assert all_values(c, "full") == acked
    finally:
        broker.kill()


def test_second_broker_on_same_data_dir_refuses(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        second = serve_once(tmp_path / "data")
        assert second.returncode == 3
        assert "locked by another running broker" in second.stderr
    finally:
        broker.kill()


def test_refuses_incompatible_format_version(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "format_version").write_text("99\n")
    r = serve_once(data)
    assert r.returncode == 3 and "format version" in r.stderr


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))


def test_create_topics_within_the_open_file_limit(tmp_path: Path) -> None:
    """Tried: with RLIMIT_NOFILE=400, a topic of 1000 partitions (each keeps a file
    open). It is refused with a message naming the limit, leaves nothing behind, and
    the broker still creates a small topic and restarts."""
    broker = BrokerProcess(tmp_path / "data", preexec_fn=_limit_open_files).start()
    try:
        with WireClient(broker.bootstrap) as c:
            r = c.call("CreateTopics", topics=[{"name": "huge", "partitions": 1000}])
            assert r["topics"][0]["error"] == ErrorCode.INVALID_PARTITIONS
            assert "RLIMIT_NOFILE=400" in r["topics"][0]["message"]
            assert c.create_topic("small", 50) == 0
        assert not (tmp_path / "data" / "topics" / "huge").exists()
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            names = {t["name"] for t in c.call("Metadata", topics=None)["topics"]}
        assert names == {"small"}
    finally:
        broker.kill()


def test_inflight_limit_of_one_still_answers_a_pipeline_in_order(tmp_path: Path) -> None:
    conf = tmp_path / "b.toml"
    conf.write_text("max_inflight_requests_per_connection = 1\n")
    broker = BrokerProcess(tmp_path / "data", extra_args=["--config", str(conf)]).start()
    try:
        with WireClient(broker.bootstrap) as c:
            cids = [c.send("ApiVersions") for _ in range(200)]
            assert [c.recv()["cid"] for _ in cids] == cids
    finally:
        broker.kill()
