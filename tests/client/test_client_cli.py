"""The client subcommands of `minibroker`, run as a user would: `python -m minibroker_cli ...`."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from harness.broker_process import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]


def cli(broker: BrokerProcess, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return run_cli(*args, "--bootstrap-server", broker.bootstrap, stdin=stdin)


def run_cli(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minibroker_cli", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
    )


class Running:
    """A CLI process whose stdout and stderr lines are read as they come, to act on one."""

    def __init__(self, broker: BrokerProcess, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minibroker_cli", *args, "--bootstrap-server", broker.bootstrap],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._arrived: queue.Queue[tuple[str, str]] = queue.Queue()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(name, pipe), daemon=True)
            for name, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, pipe: IO[bytes]) -> None:
        for line in pipe:
            self._arrived.put((name, line.decode().rstrip("\n")))

    def wait_for(self, stream: str, pattern: str, timeout: float = 30) -> str:
        """The first line of `stream` matching `pattern`, waiting up to `timeout` s."""
        deadline = time.monotonic() + timeout
        for line in self.lines[stream]:
            if re.search(pattern, line):
                return line
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {pattern!r} on {stream} in {timeout} s: {self.lines}"
            try:
                name, line = self._arrived.get(timeout=remaining)
            except queue.Empty:
                continue
            self.lines[name].append(line)
            if name == stream and re.search(pattern, line):
                return line

    def interrupt(self, timeout: float = 30) -> int:
        """Ctrl-C; the exit code, once the process ended (within `timeout` s)."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
        while not self._arrived.empty():
            name, line = self._arrived.get()
            self.lines[name].append(line)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


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


def test_unreachable_broker_is_named_within_one_backoff_cycle() -> None:
    started = time.monotonic()
    result = run_cli("produce", "orders", "--bootstrap-server", "127.0.0.1:1", stdin=b"x\n")
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert re.fullmatch(
        rb"minibroker: cannot connect to 127\.0\.0\.1:1 \(connection refused\) "
        rb"after 6 attempts in \d+\.\d s\n",
        result.stderr,
    ), result.stderr
    assert elapsed < 20  # the backoff cycle is 1.6 s; max_block_ms (60 s) is not waited out


def test_missing_partition_is_an_error_at_once(trio_broker: BrokerProcess) -> None:
    cli(trio_broker, "topics", "create", "orders", "--partitions", "3")
    message = b"minibroker: partition 7 of 'orders' does not exist (3 partitions)\n"
    started = time.monotonic()
    produced = cli(trio_broker, "produce", "orders", "--partition", "7", stdin=b"x\n")
    assert (produced.returncode, produced.stderr) == (1, message)
    consumed = cli(trio_broker, "consume", "orders", "--partition", "7")
    assert (consumed.returncode, consumed.stderr, consumed.stdout) == (1, message, b"")
    assert time.monotonic() - started < 30  # max_block_ms (60 s) is not waited out


def test_produce_says_when_it_created_the_topic(trio_broker: BrokerProcess) -> None:
    cli(trio_broker, "topics", "create", "orders")
    existing = cli(trio_broker, "produce", "orders", stdin=b"x\n")
    assert existing.stderr == b"1 record(s) sent to orders\n"
    mistyped = cli(trio_broker, "produce", "ordres", stdin=b"x\n")
    assert mistyped.returncode == 0
    assert mistyped.stderr.decode().splitlines() == [
        "minibroker: topic 'ordres' did not exist: the broker created it with 1 partition "
        "(allow_auto_create_topics=False prevents this)",
        "1 record(s) sent to ordres",
    ]


def test_consume_from_past_the_end_says_where_it_starts(trio_broker: BrokerProcess) -> None:
    cli(trio_broker, "topics", "create", "orders", "--partitions", "2")
    cli(trio_broker, "produce", "orders", "--partition", "1", stdin=b"a\nb\n")
    result = cli(trio_broker, "consume", "orders", "--offset", "99999999", "--timeout-ms", "1000")
    assert (result.returncode, result.stdout) == (0, b"")
    lines = result.stderr.decode().splitlines()
    assert sorted(lines[:2]) == [
        f"minibroker: offset 99999999 is out of range for orders-{p}: reset to {end}, the "
        "latest offset (auto_offset_reset='latest')"
        for p, end in ((0, 0), (1, 2))
    ]
    assert re.fullmatch(r"0 records consumed from orders in [\d.]+ s \(.*\)", lines[2]), lines


def test_progress_lines_off_a_terminal(trio_broker: BrokerProcess) -> None:
    # ~2 s of records at 5,000/s, a line every 300 ms: several lines before the final one.
    produced = cli(
        trio_broker,
        "perf-produce",
        *("--topic", "perf", "--num-records", "10000", "--throughput", "5000"),
        *("--reporting-interval", "300"),
    )
    assert produced.returncode == 0, produced.stderr
    lines = produced.stdout.decode().splitlines()
    window = r"\d+ records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
    assert len(lines) >= 3 and all(
        re.match(window + r"[\d.]+ ms max latency\.$", x) for x in lines[:-1]
    )
    assert lines[-1].startswith("10000 records sent")

    consumed = cli(
        trio_broker,
        "perf-consume",
        *("--topic", "perf", "--messages", "20000", "--timeout-ms", "1500"),
        *("--reporting-interval", "200"),
    )
    assert consumed.returncode == 1  # fewer records than asked for
    *progress, header, values = consumed.stdout.decode().splitlines()
    assert progress and all(
        re.fullmatch(r"10000 of 20000 records consumed in [\d.]+ s \(.*\)", x) for x in progress
    ), progress
    assert header.startswith("start.time") and values.split(", ")[4] == "10000"

    # consume's records go to stdout, so its progress goes to stderr.
    records = cli(
        trio_broker,
        "consume",
        *("perf", "--from-beginning", "--timeout-ms", "1500", "--reporting-interval", "200"),
    )
    assert records.returncode == 0 and len(records.stdout.splitlines()) == 10000
    progress = records.stderr.decode().splitlines()
    assert len(progress) >= 3 and all(
        re.fullmatch(r"10000 records consumed from perf in [\d.]+ s \(.*\)", x) for x in progress
    ), progress


def test_ctrl_c_prints_a_summary(trio_broker: BrokerProcess) -> None:
    producing = Running(
        trio_broker,
        *("perf-produce", "--topic", "perf", "--num-records", "100000000"),
        *("--throughput", "20000", "--reporting-interval", "200"),
    )
    try:
        producing.wait_for("stdout", r"records sent")
        assert producing.interrupt() == 130
    finally:
        producing.kill()
    final = producing.lines["stdout"][-1]
    assert re.fullmatch(
        r"\d+ records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
        r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99.9th\.",
        final,
    ), final
    assert producing.lines["stderr"][-1] == "minibroker: interrupted"

    for args, summary in (
        (
            ("perf-consume", "--topic", "perf", "--messages", "100000000"),
            ("stdout", r"\d{4}-.*, [\d.]+, [\d.]+, [1-9]\d*, [\d.]+"),
        ),
        (
            ("consume", "perf", "--from-beginning"),
            ("stderr", r"interrupted: [1-9]\d* records consumed from perf in [\d.]+ s \(.*\)"),
        ),
    ):
        running = Running(
            trio_broker, *args, "--timeout-ms", "60000", "--reporting-interval", "100"
        )
        try:
            # A progress line with records in it: the loop is running and has read some.
            where = "stdout" if args[0] == "perf-consume" else "stderr"
            running.wait_for(where, r"^[1-9]\d*( of \d+)? records consumed")
            assert running.interrupt() == 130
        finally:
            running.kill()
        stream, pattern = summary
        assert re.fullmatch(pattern, running.lines[stream][-1]), running.lines


def test_the_bootstrap_address_comes_from_the_environment(trio_broker: BrokerProcess) -> None:
    """After `make run PORT=19092`, `export MINIBROKER_BOOTSTRAP_SERVERS=127.0.0.1:19092`
    points every command there; --bootstrap-server still wins."""
    env = {"MINIBROKER_BOOTSTRAP_SERVERS": trio_broker.bootstrap}
    created = run_cli("topics", "create", "orders", env=env)
    assert created.returncode == 0, created.stderr
    listed = run_cli("topics", "list", env=env)
    assert listed.stdout.split() == [b"orders"]
    elsewhere = run_cli("topics", "list", "--bootstrap-server", "127.0.0.1:1", env=env)
    assert elsewhere.returncode == 1 and b"127.0.0.1:1" in elsewhere.stderr


def test_client_config_takes_every_client_setting(
    trio_broker: BrokerProcess, tmp_path: Path
) -> None:
    config = tmp_path / "client.toml"
    config.write_text(
        'allow_auto_create_topics = false\nclient_id = "orders-cli"\nmax_block_ms = 2000\n'
    )
    where = ("--client-config", str(config))
    produced = cli(trio_broker, "produce", "ordres", *where, stdin=b"x\n")
    assert produced.returncode == 1
    assert b"'ordres'" in produced.stderr and b"created" not in produced.stderr
    assert cli(trio_broker, "topics", "list", *where).stdout.split() == []
    config.write_text("linger_ms = 5\n")  # the command's own --linger-ms
    both = cli(trio_broker, "produce", "orders", *where, stdin=b"x\n")
    assert both.returncode == 2
    assert (
        both.stderr
        == (
            f"minibroker: --client-config {config}: linger_ms is set by this command's own "
            "flags; set it there\n"
        ).encode()
    )
    config.write_text("lingr_ms = 5\n")
    mistyped = cli(trio_broker, "topics", "list", *where)
    assert mistyped.returncode == 2
    assert (
        b"lingr_ms is not a setting of the SDK's producer, consumer or admin helpers; "
        b"did you mean 'linger_ms'?" in mistyped.stderr
    )


def test_users_add_without_a_terminal_points_at_password_stdin() -> None:
    """No controlling terminal (a new session) and nothing on stdin: one line, no
    traceback, naming --password-stdin (the broker is not reached)."""
    added = subprocess.run(
        [sys.executable, "-m", "minibroker_cli", "users", "add", "alice"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        start_new_session=True,
    )
    assert added.returncode == 2
    assert added.stderr.decode().splitlines() == [
        "minibroker: no terminal to ask for the password on: give it on stdin with "
        "--password-stdin (printf '%s\\n' \"$PASSWORD\" | minibroker users add alice "
        "--password-stdin)"
    ]
