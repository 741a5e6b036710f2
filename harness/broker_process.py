"""Start the real `minibroker serve` process on loopback for integration tests and benchmarks.

The broker binds port 0 and logs the port it got; the harness reads it from the
log line `event=listening ... port=N` on stderr, so parallel tests never race
for a port. Stderr is drained by a thread into a list so the pipe never fills.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 30.0
_LISTENING = re.compile(r"event=listening .*host=(\S+) port=(\d+)")
_METRICS = re.compile(r"event=metrics_listening .*port=(\d+)")


@dataclass
class BrokerProcess:
    data_dir: Path
    backend: str = "trio"
    extra_args: Sequence[str] = ()
    env: dict[str, str] | None = None
    preexec_fn: Callable[[], object] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = None
    proc: subprocess.Popen[str] | None = None
    log_lines: list[str] = field(default_factory=list)

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

    def command(self, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
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
        env = dict(os.environ)
        env.update(self.env or {})
        self.log_lines = []
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
                m = _LISTENING.search(line)
                if m:
                    self.port = int(m.group(2))
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
