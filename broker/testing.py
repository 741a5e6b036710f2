"""A real broker for an application's own tests and scripts, with nothing but pip.

`running_broker()` starts `minibroker serve` in a new process, in a temporary directory,
with a native listener and a kafka listener on free loopback ports; it returns once both
listen (it waits for the broker's `event=listening` lines, not for a fixed time), and on
leaving it kills the process and removes the directory:

    from broker.testing import running_broker

    with running_broker() as broker:
        producer = Producer(bootstrap_servers=broker.bootstrap_servers)  # the SDK
        kafka_producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap_servers)

The pytest plugin, `broker/pytest_plugin.py`, serves it as the fixtures `minibroker`
(one per test), `minibroker_session` (one per session and xdist worker) and
`minibroker_factory`. The broker runs the code this process imported `broker` from.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 30.0
"""How long a start may take before it is given up (a loaded CI machine's worst case;
a start takes about 0.4 s)."""

Setting = str | int | float | bool
NATIVE, KAFKA = "minibroker", "kafka"
_LISTENING = re.compile(r"event=listening listener=(\S+) .*host=(\S+) port=(\d+)")


class BrokerStartError(RuntimeError):
    """The broker exited or did not listen in time; the message holds its log."""


@dataclass(frozen=True)
class RunningBroker:
    """A started broker: where its clients connect, and what it logged so far."""

    bootstrap_servers: str
    """host:port of the native listener, for minibroker's SDK and command line."""
    kafka_bootstrap_servers: str
    """host:port of the kafka listener, for Kafka's clients (kafka-python, confluent-kafka,
    aiokafka, ...)."""
    data_dir: Path
    pid: int
    log_lines: list[str] = field(default_factory=list, repr=False, compare=False)
    """The broker's log, one line per entry, appended as the broker writes it."""

    @property
    def log_text(self) -> str:
        return "\n".join(self.log_lines)


def settings_file(settings: Mapping[str, Setting]) -> str:
    """TOML of the broker's settings (docs/configuration.md) and its two listeners. JSON
    writes strings, numbers and booleans as TOML reads them."""
    top = "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())
    listeners = "".join(
        f'\n[[listeners]]\nname = "{name}"\nhost = "127.0.0.1"\nport = 0\nprotocol = "{name}"\n'
        for name in (NATIVE, KAFKA)
    )
    return top + listeners


@contextmanager
def running_broker(
    settings: Mapping[str, Setting] | None = None, *, start_timeout_s: float = START_TIMEOUT_S
) -> Iterator[RunningBroker]:
    """A broker process in a temporary directory, for the `with` block; `settings` are
    the broker's (`{"backend": "asyncio", "auto_create_topics": False}`). Raises
    BrokerStartError with the broker's log when it does not start."""
    with tempfile.TemporaryDirectory(prefix="minibroker-") as tmp:
        root = Path(tmp)
        config = root / "broker.toml"
        config.write_text(settings_file(settings or {}))
        data_dir = root / "data"
        serve = ["serve", "--config", str(config), "--data-dir", str(data_dir)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", *serve, "--metrics-port", "-1"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=_same_broker_env(),
        )
        try:
            ports, log_lines = _wait_until_listening(proc, start_timeout_s)
            yield RunningBroker(
                bootstrap_servers=f"127.0.0.1:{ports[NATIVE]}",
                kafka_bootstrap_servers=f"127.0.0.1:{ports[KAFKA]}",
                data_dir=data_dir,
                pid=proc.pid,
                log_lines=log_lines,
            )
        finally:
            # The data goes with the directory: nothing is left to stop cleanly for.
            proc.kill()
            proc.wait()


def _same_broker_env() -> dict[str, str]:
    """The environment with this process's `broker` package first on the path, so the
    broker that runs is the one imported here (a source tree as well as an install)."""
    env = dict(os.environ)
    source = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    return env


def _wait_until_listening(
    proc: subprocess.Popen[str], timeout_s: float
) -> tuple[dict[str, int], list[str]]:
    """Each listener's port, once both have logged `event=listening`; a thread reads the
    log on (into the list returned) so the pipe never fills."""
    ports: dict[str, int] = {}
    lines: list[str] = []
    settled = threading.Event()  # both listen, or the process ended

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            listening = _LISTENING.search(line)
            if listening:
                ports[listening.group(1)] = int(listening.group(3))
                if {NATIVE, KAFKA} <= ports.keys():
                    settled.set()
        settled.set()

    threading.Thread(target=read, name="minibroker-log", daemon=True).start()
    in_time = settled.wait(timeout_s)
    if in_time and {NATIVE, KAFKA} <= ports.keys():
        return ports, lines
    proc.kill()
    why = f"exited with {proc.wait()}" if in_time else f"took over {timeout_s} s"
    log = "\n".join(lines)
    raise BrokerStartError(f"the broker did not start ({why}); its log:\n{log}")
