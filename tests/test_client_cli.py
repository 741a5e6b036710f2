"""The client subcommands of `minibroker`, run as a user would: `python -m minibroker_cli ...`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess

ROOT = Path(__file__).resolve().parent.parent


def cli(broker: BrokerProcess, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minibroker_cli", *args, "--bootstrap-server", broker.bootstrap],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )


@pytest.fixture
def trio_broker(tmp_path: Path):
    proc = BrokerProcess(tmp_path / "data", backend="trio").start()
    try:
        yield proc
    finally:
        proc.kill()


def test_topics_create_list_describe(trio_broker: BrokerProcess) -> None:
    created = cli(trio_broker, "topics", "create", "orders", "--partitions", "3")
    assert created.returncode == 0, created.stderr
    again = cli(trio_broker, "topics", "create", "orders", "--partitions", "3")
    assert again.returncode == 1 and b"already exists" in again.stderr
    assert cli(trio_broker, "topics", "create", "orders", "--if-not-exists").returncode == 0
    listed = cli(trio_broker, "topics", "list")
    assert listed.stdout.split() == [b"orders"]
    described = cli(trio_broker, "topics", "describe", "orders").stdout.decode()
    assert "PartitionCount: 3" in described
    assert (
        len(re.findall(r"Partition: \d+\tLeader: 0\tBeginningOffset: 0\tEndOffset: 0", described))
        == 3
    )
    missing = cli(trio_broker, "topics", "describe", "nope")
    assert missing.returncode == 1 and b"does not exist" in missing.stderr


def test_produce_lines_and_consume_them(trio_broker: BrokerProcess) -> None:
    cli(trio_broker, "topics", "create", "lines")
    sent = cli(
        trio_broker,
        "produce",
        "lines",
        "--key-separator",
        ":",
        stdin=b"k1:hello\nk2:world\nno key here\n",
    )
    assert sent.returncode == 0, sent.stderr
    assert b"3 record(s) sent" in sent.stderr

    values = cli(trio_broker, "consume", "lines", "--from-beginning", "--timeout-ms", "1000")
    assert values.stdout.decode().splitlines() == ["hello", "world", "no key here"]

    rows = cli(trio_broker, "consume", "lines", "--offset", "1", "--count", "2", "--format", "json")
    records = [json.loads(line) for line in rows.stdout.decode().splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in records] == [
        (1, "k2", "world"),
        (2, None, "no key here"),
    ]


def test_produce_whole_files(trio_broker: BrokerProcess, tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"\xff\x00binary")
    (tmp_path / "b.txt").write_bytes(b"two\nlines")
    sent = cli(trio_broker, "produce", "files", str(tmp_path / "a.bin"), str(tmp_path / "b.txt"))
    assert sent.returncode == 0, sent.stderr
    rows = cli(
        trio_broker, "consume", "files", "--from-beginning", "--count", "2", "--format", "json"
    )
    values = [json.loads(line)["value"] for line in rows.stdout.decode().splitlines()]
    assert values == ["base64:/wBiaW5hcnk=", "two\nlines"]


@pytest.mark.parametrize("api", ["send", "batch"])
def test_perf_produce_then_perf_consume(trio_broker: BrokerProcess, api: str) -> None:
    produced = cli(
        trio_broker,
        "perf-produce",
        "--topic",
        "perf",
        "--num-records",
        "20000",
        "--record-size",
        "100",
        "--api",
        api,
        "--records-per-call",
        "5000",
    )
    assert produced.returncode == 0, produced.stderr
    final = produced.stdout.decode().strip().splitlines()[-1]
    assert re.match(
        r"20000 records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
        r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99.9th\.",
        final,
    ), final
    consumed = cli(trio_broker, "perf-consume", "--topic", "perf", "--messages", "20000")
    assert consumed.returncode == 0, consumed.stderr
    header, values = consumed.stdout.decode().strip().splitlines()
    assert header.startswith("start.time, end.time, data.consumed.in.MB")
    assert values.split(", ")[4] == "20000"


def test_bad_settings_are_usage_errors(trio_broker: BrokerProcess) -> None:
    result = cli(trio_broker, "perf-produce", "--topic", "x", "--num-records", "1", "--acks", "1")
    assert result.returncode == 2 and b"requires acks='all'" in result.stderr
