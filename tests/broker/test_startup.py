"""The first hour: a start that cannot succeed ends in one line that names the thing and
the fix, with an exit code of its own that the systemd unit does not restart on.

Tried, on both backends: the port and the metrics port held by another socket (exit 4,
before recovery), an address that is not this machine's (exit 2), a pid file that cannot
be written (exit 2), a new data dir on a full filesystem (exit 3; a 1 MiB tmpfs the test
mounts, root only); and the unit file, docs/operations.md and `make run` against what
they promise.
"""

from __future__ import annotations

import argparse
import re
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import minibroker_cli
from broker import cli
from broker.cli import build_parser
from broker.crash_points import ENV
from client import cli as client_cli
from harness.broker_process import BrokerProcess, serve_once
from harness.txn import Txn
from harness.wire import WireClient, fetched_values, values_batch

ROOT = Path(__file__).resolve().parents[2]
REFUSAL = re.compile(
    r"level=error logger=minibroker\.broker\.cli event=refused_to_start reason='(.*)'$"
)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process (here, the test) listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def refusal(stderr: str) -> str:
    """The reason of the one refusal line, which comes last, after info lines only."""
    *before, last = stderr.splitlines()
    assert all(" level=info " in line for line in before), stderr
    m = REFUSAL.search(last)
    assert m, stderr
    return m.group(1)


def test_port_in_use_is_one_line_and_exit_code_4(
    tmp_path: Path, backend: str, held_port: int
) -> None:
    r = serve_once(tmp_path / "data", "--backend", backend, "--port", str(held_port))
    assert r.returncode == cli.EXIT_ADDRESS_IN_USE == 4
    assert "event=recovered" not in r.stderr  # found before recovery, not after
    assert refusal(r.stderr) == (
        f"cannot listen on 127.0.0.1:{held_port}: address already in use; stop the process "
        "listening there, or set port (--port) to a free port"
    )
    # The refused start leaves the data dir as new as it found it.
    broker = BrokerProcess(tmp_path / "data", backend=backend).start()
    try:
        assert broker.log_shows("previous_shutdown=none")
    finally:
        broker.kill()


def test_metrics_port_in_use_is_one_line_and_exit_code_4(
    tmp_path: Path, backend: str, held_port: int
) -> None:
    r = serve_once(tmp_path / "data", "--backend", backend, "--metrics-port", str(held_port))
    assert r.returncode == cli.EXIT_ADDRESS_IN_USE
    assert "event=recovered" not in r.stderr
    assert refusal(r.stderr) == (
        f"cannot serve metrics on 127.0.0.1:{held_port}: address already in use; stop the "
        "process listening there, or set metrics_port (--metrics-port) to a free port, or to "
        "-1 to turn the metrics server off"
    )


def test_an_address_not_of_this_machine_is_a_configuration_error(tmp_path: Path) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): no machine has it.
    r = serve_once(tmp_path / "data", "--host", "192.0.2.1")
    assert r.returncode == cli.EXIT_CONFIG_ERROR
    assert refusal(r.stderr) == (
        "cannot listen on 192.0.2.1:0: Cannot assign requested address; set host (--host) "
        "to an address of this machine, or 0.0.0.0 for all"
    )


def test_a_pid_file_that_cannot_be_written_is_a_configuration_error(tmp_path: Path) -> None:
    pid_file = tmp_path / "missing" / "broker.pid"
    r = serve_once(tmp_path / "data", "--pid-file", str(pid_file))
    assert r.returncode == cli.EXIT_CONFIG_ERROR
    assert refusal(r.stderr) == (
        f"cannot write pid_file {pid_file}: No such file or directory; set pid_file "
        "(--pid-file) to a path this user may write, or leave it empty"
    )


def fill(mount_point: Path) -> Path:
    """Write a file on `mount_point` until no byte is free; return it."""
    filler = mount_point / "filler"
    with open(filler, "wb", buffering=0) as f, pytest.raises(OSError):
        for _ in range(8192):
            f.write(b"\0" * 1024)
    return filler


def test_a_new_data_dir_on_a_full_disk_is_one_line_and_exit_code_3(
    small_fs: Path, backend: str
) -> None:
    fill(small_fs)
    data = small_fs / "data"
    r = serve_once(data, "--backend", backend)
    assert r.returncode == cli.EXIT_REFUSED_TO_START
    assert refusal(r.stderr) == (
        f"data dir {data} has no space left on its filesystem ([Errno 28] No space left on "
        "device); free space there, or move data_dir (--data-dir) to a larger filesystem"
    )


def test_a_stop_on_a_full_disk_is_one_line_and_the_next_start_recovers(
    small_fs: Path, backend: str
) -> None:
    """SIGTERM when the disk filled while the broker ran: the snapshots cannot be
    written. One error line instead of a traceback, and no clean-shutdown marker, so
    the next start recovers as after a crash and serves every acknowledged record."""
    broker = BrokerProcess(small_fs / "data", backend=backend).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 1) == 0
            assert c.produce("t", 0, values_batch([b"kept"]), acks=-1)["error"] == 0
        filler = fill(small_fs)
        assert broker.terminate() == 0
        assert broker.log_shows("event=stopped clean=false reason='data dir ")
        assert "Traceback" not in broker.log_text()
        partition = small_fs / "data" / "topics" / "t" / "0"
        assert broker.log_lines[-1].endswith(
            f"has no space left on its filesystem (snapshot of {partition} at 1: [Errno 28] "
            "No space left on device); free space there, or move data_dir (--data-dir) to a "
            "larger filesystem; the next start recovers it as after a crash'"
        )
        filler.unlink()
        broker.start()
        assert broker.log_shows("previous_shutdown=unclean")
        with WireClient(broker.bootstrap) as c:
            assert [v for _, v in fetched_values(c.fetch("t", 0, 0)["records"])] == [b"kept"]
    finally:
        broker.kill()


def _limit_file_size() -> None:
    """Below the segment's size: the next append fails (EFBIG), as on a full disk."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))


def test_a_write_recovery_cannot_make_is_one_line_and_exit_code_3(
    tmp_path: Path, backend: str
) -> None:
    """A commit decided just before a kill gets its markers at the next start; when that
    write fails, the start ends in one line naming the data dir and the fix. (Two
    partitions: a commit of one is decided by its marker, which needs no write.)"""
    data = tmp_path / "data"
    broker = BrokerProcess(data, backend=backend, env={ENV: "txn_decided"}).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("t", 2) == 0
            tx = Txn(c)
            for p in range(2):
                assert tx.send("t", p, [b"x" * 200])["error"] == 0
            with pytest.raises((ConnectionError, OSError, EOFError)):
                tx.end(committed=True)
        assert broker.proc is not None
        broker.proc.wait(15)
    finally:
        broker.kill()
    r = serve_once(data, "--backend", backend, preexec_fn=_limit_file_size)
    assert r.returncode == cli.EXIT_REFUSED_TO_START
    assert "event=recovered " in r.stderr and "Traceback" not in r.stderr
    assert refusal(r.stderr) == (
        f"data dir {data} holds a file this process may not grow ([Errno 27] File too large); "
        "raise the file-size limit (ulimit -f, or LimitFSIZE= in the systemd unit)"
    )


def _exit_codes() -> dict[str, int]:
    return {k: v for k, v in vars(cli).items() if k.startswith("EXIT_")}


def test_the_unit_does_not_restart_a_start_that_cannot_succeed() -> None:
    unit = (ROOT / "deploy" / "minibroker.service").read_text()
    (listed,) = re.findall(r"^RestartPreventExitStatus=(.*)$", unit, re.M)
    assert sorted(int(code) for code in listed.split()) == sorted(_exit_codes().values())


def test_operations_guide_lists_every_exit_code() -> None:
    ops = (ROOT / "docs" / "operations.md").read_text()
    table = ops.split("### Exit codes", 1)[1]
    for name, code in _exit_codes().items():
        assert re.search(rf"^\| {code} \| ", table, re.M), name


def _make_run(*args: str, env_port: str) -> str:
    """The command `make run` would run (make -n prints it and runs nothing)."""
    r = subprocess.run(
        ["make", "-n", "run", *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PORT": env_port},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()[-1]


def test_make_run_takes_overrides_from_its_command_line_only() -> None:
    assert _make_run(env_port="3000") == ".venv/bin/minibroker serve"
    assert _make_run(
        "PORT=9093",
        "METRICS_PORT=9645",
        "DATA_DIR=/tmp/b 2",
        "ARGS=--log-level debug",
        env_port="3000",
    ) == (
        ".venv/bin/minibroker serve --port '9093' --metrics-port '9645' --data-dir '/tmp/b 2' "
        "--log-level debug"
    )


def _leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command of the parser, as the words that name it and its own parser."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield path, parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from _leaf_commands(sub, (*path, name))


COMMANDS = list(_leaf_commands(build_parser([client_cli.register])))


@pytest.mark.parametrize(("words", "parser"), COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_a_mistyped_flag_gets_its_commands_usage_and_the_closest_flag(
    words: tuple[str, ...], parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serve --metrics-prot 9644` (and the same for every command of `minibroker`): the
    usage of the command it was given to, and the flag it most likely meant."""
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    name = next((f for f in flags if f != "--help"), "--help")[2:]
    # The first two different letters swapped: no flag, nor a prefix of one.
    i = next(i for i in range(1, len(name)) if name[i] != name[i - 1])
    typo = name[: i - 1] + name[i] + name[i - 1] + name[i + 1 :]
    assert not any(f[2:].startswith(typo) for f in flags)
    # What the command requires, so that only the mistyped flag is wrong.
    needed = [a for a in parser._actions if a.required]
    needed += [g._group_actions[0] for g in parser._mutually_exclusive_groups if g.required]
    required = [
        word
        for a in needed
        for word in (
            ([a.option_strings[0]] + (["1"] if a.nargs != 0 else [])) if a.option_strings else ["x"]
        )
    ]
    with pytest.raises(SystemExit) as exit_info:
        minibroker_cli.main([*words, *required, f"--{typo}", "1"])
    assert exit_info.value.code == 2
    usage, *_, error = capsys.readouterr().err.splitlines()
    prog = " ".join(("minibroker", *words))
    assert usage.startswith(f"usage: {prog} ")
    assert error == (f"{prog}: error: unrecognized arguments: --{typo} 1 (did you mean --{name}?)")


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["serve", "--metrics-prot", "9644"],
            "minibroker serve: error: unrecognized arguments: "
            "--metrics-prot 9644 (did you mean --metrics-port?)",
        ),
        (
            ["topic", "list"],
            "minibroker: error: argument COMMAND: invalid choice: 'topic', maybe "
            "you meant 'topics'? (choose from {commands})",
        ),
        (
            ["groups", "describ", "g"],
            "minibroker groups: error: argument ACTION: invalid choice: "
            "'describ', maybe you meant 'describe'? (choose from 'list', 'describe', "
            "'reset-offsets')",
        ),
        (["serve", "--bogus"], "minibroker serve: error: unrecognized arguments: --bogus"),
    ],
)
def test_mistyped_words_name_the_closest(argv: list[str], error: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "minibroker_cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == error.format(commands=_commands())


def _commands() -> str:
    """The `minibroker` verbs as argparse lists them, in the order they were added."""
    parser = build_parser([client_cli.register])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return ", ".join(repr(name) for name in sub.choices)
