"""The first hour: a start that cannot succeed ends in one line that names the thing and
the fix, with an exit code of its own that the systemd unit does not restart on.

Tried, on both backends: the port and the metrics port held by another socket (exit 4,
before recovery), an address that is not this machine's (exit 2); and the unit file and
docs/operations.md against the exit codes `broker.cli` defines.
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import cli
from harness.broker_process import BrokerProcess, serve_once

ROOT = Path(__file__).resolve().parent.parent
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
    """The reason of the one refusal line, after nothing but the starting line."""
    lines = stderr.splitlines()
    assert len(lines) == 2 and "event=starting " in lines[0], stderr
    m = REFUSAL.search(lines[1])
    assert m, stderr
    return m.group(1)


def test_port_in_use_is_one_line_and_exit_code_4(
    tmp_path: Path, backend: str, held_port: int
) -> None:
    r = serve_once(tmp_path / "data", "--backend", backend, "--port", str(held_port))
    assert r.returncode == cli.EXIT_ADDRESS_IN_USE == 4
    # Before recovery: no event=recovered line comes first.
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
