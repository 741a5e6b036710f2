"""Start the real `minibroker serve` process on loopback for integration tests and benchmarks.

The harness gives each broker ports of its own below the kernel's ephemeral range
(`reserve_port`): a test kills a broker and starts it again on the same ports, and a
port that bind(0) handed out could be taken by another test's listener in between.
It reads the ports back from the log lines `event=listening ... port=N` on stderr.
Stderr is drained by a thread into a list so the pipe never fills.

A broker may be given a settings file (`config`, TOML text). Each `port = 0` line in
it gets a reserved port at the first start, so restarts bind the same ones; the
harness learns every listener's port from its `event=listening listener=NAME ...
port=N` line (`listener_ports`, `address`).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 30.0
RESERVED_PORTS = 12_000
"""How many ports below the ephemeral range the harness hands out, split between
pytest-xdist's workers."""
_ANY_PORT = re.compile(r"(?m)^port = 0[ \t]*$")
_reserved = itertools.count()


def _port_slice() -> range:
    """This process's ports: below the ephemeral range, where neither bind(0) nor
    connect() ever picks one, a slice per xdist worker so workers never share one."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    span = range(max(1024, low - RESERVED_PORTS), low)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker[2:]) % count if worker[2:].isdigit() else 0
    size = len(span) // count
    return range(span.start + index * size, span.start + (index + 1) * size)


def reserve_port() -> int:
    """A port no socket holds now and no automatic bind will take later (`_port_slice`),
    for a broker that must restart on it; each call of a process hands out the next."""
    ports = _port_slice()
    # Processes outside xdist (benchmarks, a second session) start at their own place.
    offset = os.getpid() * 7919
    for _ in range(len(ports)):
        port = ports[(offset + next(_reserved)) % len(ports)]
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {ports}")


_LISTENING = re.compile(r"event=listening .*host=(\S+) port=(\d+)")
_LISTENER = re.compile(r"event=listening listener=(\S+) .*host=(\S+) port=(\d+)")
_METRICS = re.compile(r"event=metrics_listening .*port=(\d+)")


@dataclass
class BrokerProcess:
    data_dir: Path
    backend: str = "trio"
    extra_args: Sequence[str] = ()
    env: dict[str, str] | None = None
    preexec_fn: Callable[[], object] | None = None
    config: str | None = None
    """TOML text of a settings file, written beside the data dir and passed with --config."""
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = None
    proc: subprocess.Popen[str] | None = None
    log_lines: list[str] = field(default_factory=list)
    listener_ports: dict[str, int] = field(default_factory=dict)
    """The port of each listener, by name, as the broker logged it."""

    @property
    def pid(self) -> int:
        """The running broker's process id."""
        assert self.proc is not None, "the broker was not started"
        return self.proc.pid

    def rss_kib(self) -> int:
        """The broker's resident set in KiB (VmRSS, from /proc)."""
        return rss_kib(self.pid)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def address(self, listener: str) -> str:
        """host:port of the listener named `listener` (loopback: tests bind 127.0.0.1)."""
        return f"127.0.0.1:{self.listener_ports[listener]}"

    @property
    def config_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.toml"

    def _listener_names(self) -> list[str]:
        """The listeners the settings file declares (none: the one of --host/--port)."""
        if self.config is None:
            return []
        return [entry["name"] for entry in tomllib.loads(self.config).get("listeners", [])]

    def command(self, port: int) -> list[str]:
        # With [[listeners]], --host and --port may not be given (they are the shorthand
        # for the one listener of a broker without them).
        address = [] if self._listener_names() else ["--host", "127.0.0.1", "--port", str(port)]
        config = [] if self.config is None else ["--config", str(self.config_path)]
        return [
            sys.executable,
            "-m",
            "broker",
            "serve",
            *address,
            *config,
            "--data-dir",
            str(self.data_dir),
            "--backend",
            self.backend,
            # Tests run brokers side by side: never the fixed default metrics port. A
            # restart keeps the metrics port it had, so that port 0 cannot hand the
            # metrics listener the broker port the killed process just freed.
            "--metrics-port",
            str(self.metrics_port or 0),
            *self.extra_args,
        ]

    def start(self, port: int | None = None) -> BrokerProcess:
        """Start (or restart, on the same port when it had one) and wait until it listens."""
        port = self.port if port is None else port
        if not port:
            port = reserve_port()
        if not self.metrics_port:
            self.metrics_port = reserve_port()
        env = dict(os.environ)
        env.update(self.env or {})
        if self.config is not None:
            self.config = _ANY_PORT.sub(lambda _: f"port = {reserve_port()}", self.config)
            self.config_path.write_text(self.config)
        expected = set(self._listener_names())
        self.log_lines = []
        self.listener_ports = {}
        self.proc = subprocess.Popen(
            self.command(port),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=self.preexec_fn,
        )
        listening = threading.Event()

        def drain() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log_lines.append(line.rstrip("\n"))
                m = _METRICS.search(line)
                if m:
                    self.metrics_port = int(m.group(1))
                named = _LISTENER.search(line)
                if named:
                    self.listener_ports[named.group(1)] = int(named.group(3))
                m = _LISTENING.search(line)
                if m:
                    if len(self.listener_ports) <= 1:  # the first listener's line
                        self.port = int(m.group(2))
                    if expected <= self.listener_ports.keys():
                        listening.set()

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not listening.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("broker did not start:\n" + "\n".join(self.log_lines))
        return self

    def kill(self) -> None:
        """SIGKILL: the unclean crash that recovery must survive."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait: the graceful stop; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def restart(self, *, kill: bool = True) -> BrokerProcess:
        if kill:
            self.kill()
        else:
            self.terminate()
        return self.start(self.port)

    def restart_after_crash_point(self) -> BrokerProcess:
        """Wait for the process armed at a crash point (broker/crash_points.py) to kill
        itself there, then start it again on the same port, unarmed."""
        assert self.proc is not None
        self.proc.wait(15)
        self.env = None
        return self.start(self.port)

    def log_text(self) -> str:
        return "\n".join(self.log_lines)

    def log_shows(self, text: str, timeout_s: float = 10.0) -> bool:
        """Whether `text` appears in the log within `timeout_s`: a thread reads the
        broker's stderr, so a line may land a moment after the reply it goes with."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log_text():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process has run, user and kernel, its exited threads included
    (/proc/<pid>/stat, in clock ticks of 10 ms)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_once(
    data_dir: Path, *args: str, preexec_fn: Callable[[], object] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m broker serve` on `data_dir` in the foreground, for a start that must fail;
    `args` come last, so they override the port 0 and the metrics port -1 it starts with."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--metrics-port",
            "-1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=preexec_fn,
    )
