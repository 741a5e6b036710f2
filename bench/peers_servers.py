"""Peer servers for bench/bench_peers.py: redis-server and nats-server on 127.0.0.1.

Each server runs in its own temporary directory on a free port and is killed on
`stop()` (also on error: the servers are context managers). A binary that is
missing is installed from Debian when running as root; when it cannot be had,
`find_binary` returns the reason instead, and the benchmark skips that peer.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TypeVar

START_TIMEOUT_S = 15.0
APT_TIMEOUT_S = 300.0
_NATS_LISTENING = re.compile(r"Listening for client connections on [\d.]+:(\d+)")
_apt_updated = False
_S = TypeVar("_S", bound="_Server")


def _apt_install(package: str) -> str | None:
    """`apt-get install -y package` (after one `apt-get update` if the first try fails);
    None on success, else why not."""
    global _apt_updated
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}

    def install() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", package],
            capture_output=True,
            text=True,
            timeout=APT_TIMEOUT_S,
            env=env,
        )

    try:
        done = install()
        if done.returncode != 0 and not _apt_updated:
            _apt_updated = True
            subprocess.run(
                ["apt-get", "update"], capture_output=True, timeout=APT_TIMEOUT_S, env=env
            )
            done = install()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"apt-get install {package} failed: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"apt-get install {package} failed: {last}"
    return None


def find_binary(name: str, package: str) -> tuple[str | None, str]:
    """(path, "") when `name` is on PATH or could be installed from Debian, else (None, reason)."""
    # Debian puts nats-server in /usr/sbin, which a non-root PATH may lack.
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path:
        return path, ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, f"{name} not found and not root with apt-get to install {package}"
    reason = _apt_install(package)
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path:
        return path, ""
    return None, reason or f"{name} still not on PATH after installing {package}"


def free_port() -> int:
    """A port that was free a moment ago (redis-server cannot bind port 0 and report it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    """A server subprocess in a temporary directory, its output drained by a thread."""

    def __init__(self, prefix: str) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix=prefix)
        self.dir = Path(self._tmp.name)
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.log_lines: list[str] = []

    def _spawn(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.dir,
        )
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log_lines.append(line.rstrip("\n"))

    def _failed(self, what: str) -> RuntimeError:
        tail = "\n".join(self.log_lines[-10:])
        self.stop()
        return RuntimeError(f"{what} did not start:\n{tail}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """SIGKILL and reap, then remove the directory; safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._tmp.cleanup()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RedisServer(_Server):
    """redis-server with the append-only file on and the given appendfsync ("always",
    "everysec"), no RDB snapshots, so AOF is the only durability."""

    def __init__(self, binary: str, appendfsync: str) -> None:
        super().__init__(f"bench-redis-{appendfsync}-")
        self.appendfsync = appendfsync
        self.binary = binary

    def start(self) -> RedisServer:
        import redis

        for _attempt in range(3):  # the free port may be taken between probe and bind
            self.port = free_port()
            self._spawn(
                [
                    self.binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(self.dir),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    self.appendfsync,
                    "--save",
                    "",
                    "--daemonize",
                    "no",
                ]
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
            try:
                while time.monotonic() < deadline and self.proc and self.proc.poll() is None:
                    try:
                        if client.ping():
                            return self
                    except redis.exceptions.ConnectionError:
                        time.sleep(0.05)
            finally:
                client.close()
            if self.proc is not None and self.proc.poll() is None:
                break
        raise self._failed(f"redis-server --appendfsync {self.appendfsync}")


class NatsServer(_Server):
    """nats-server with JetStream, its store in the temporary directory; it picks its own
    port (-p -1) and logs it."""

    def __init__(self, binary: str) -> None:
        super().__init__("bench-nats-")
        self.binary = binary

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        self._spawn(
            [self.binary, "-js", "-sd", str(self.dir / "store"), "-a", "127.0.0.1", "-p", "-1"]
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc and self.proc.poll() is None:
            for line in list(self.log_lines):
                m = _NATS_LISTENING.search(line)
                if m and any("Server is ready" in x for x in self.log_lines):
                    self.port = int(m.group(1))
                    return self
            time.sleep(0.05)
        raise self._failed("nats-server -js")

    def version(self) -> str:
        done = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        return done.stdout.strip().removeprefix("nats-server: ")
