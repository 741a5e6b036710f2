"""The retried-task case on a Spark standalone cluster on loopback: a master and two
workers started with pyspark's own `spark-class`, so every executor is its own JVM with
its own Python workers, and the driver is another process again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from harness.broker_process import BrokerProcess
from tests.spark.conftest import JVM_OPTIONS
from tests.spark.faults import FailingOnceWriter
from tests.spark.topics import new_topic, transaction_states, values

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
START_S = 90.0


class Daemon:
    """One `spark-class` process, its output in a file."""

    def __init__(self, log: Path, *args: str) -> None:
        self.log = log
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS,
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log.read_text())
            if found:
                return found
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not in time:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """A standalone master and two one-core workers on 127.0.0.1; yields the master URL."""
    if not (SPARK_HOME / "bin" / "spark-class").exists():
        pytest.skip("this pyspark has no bin/spark-class")
    daemons = [
        Daemon(
            tmp_path / "master.log",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--webui-port",
            "0",
        )
    ]
    try:
        url = daemons[0].wait_for(r"Starting Spark master at (spark://\S+)").group(1)
        for i in (1, 2):
            work = tmp_path / f"work{i}"
            work.mkdir()
            daemons.append(
                Daemon(
                    tmp_path / f"worker{i}.log",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    "1",
                    "--memory",
                    "768m",
                    "--work-dir",
                    str(work),
                    url,
                )
            )
        for worker in daemons[1:]:
            worker.wait_for("Successfully registered with master")
        yield url
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def test_a_retried_task_on_a_standalone_cluster_counts_once(
    cluster: str, shared_broker: BrokerProcess
) -> None:
    topic = new_topic(shared_broker, partitions=2)
    before = set(transaction_states(shared_broker))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.cluster_job", cluster, shared_broker.bootstrap, topic],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"executors": 2}
    assert Counter(int(v) for v in values(shared_broker, topic, 2)) == Counter(range(4000))
    pushed = Counter(int(v) for v in values(shared_broker, topic, 2, "read_uncommitted"))
    assert {v for v, n in pushed.items() if n == 2} == set(range(FailingOnceWriter.FAIL_AFTER))
    states = {t: s for t, s in transaction_states(shared_broker).items() if t not in before}
    [write_id] = {t.split(".")[0] for t in states}
    assert states[f"{write_id}.p0.a0"] == "COMPLETE_ABORT"
    assert sorted(t for t, s in states.items() if s == "COMPLETE_COMMIT") == [
        f"{write_id}.p0.a1",
        f"{write_id}.p1.a0",
        f"{write_id}.p2.a0",
        f"{write_id}.p3.a0",
    ]
