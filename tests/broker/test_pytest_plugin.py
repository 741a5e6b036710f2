"""The `minibroker` pytest plugin and `running_broker`, used as an application's own
test suite uses them: the fixtures it installs, with kafka-python and the SDK, on each
backend (this module overrides `minibroker_settings`, as a user's conftest.py may)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Mapping
from pathlib import Path

import kafka
import pytest

from broker.testing import BrokerStartError, RunningBroker, Setting, running_broker
from client import Consumer, Producer, TopicPartition
from client.admin import create_topic

BACKENDS = ("trio", "asyncio")
TIMEOUT_MS = 20_000


@pytest.fixture(scope="session", params=BACKENDS)
def minibroker_settings(request: pytest.FixtureRequest) -> Mapping[str, Setting]:
    return {"backend": request.param}


def _topic(broker: RunningBroker) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, name, partitions=1)
    return name


def _read_with_kafka_python(broker: RunningBroker, topic: str, count: int) -> list[bytes]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=broker.kafka_bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=TIMEOUT_MS,
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        values = []
        for record in consumer:
            values.append(record.value)
            if len(values) == count:
                break
        return values
    finally:
        consumer.close()


def test_the_sdk_writes_what_kafka_python_reads(minibroker: RunningBroker) -> None:
    topic = _topic(minibroker)
    with Producer(minibroker.bootstrap_servers) as producer:
        for i in range(3):
            producer.send(topic, f"order-{i}".encode())
    assert _read_with_kafka_python(minibroker, topic, 3) == [b"order-0", b"order-1", b"order-2"]


def test_kafka_python_writes_what_the_sdk_reads(minibroker_session: RunningBroker) -> None:
    topic = _topic(minibroker_session)
    producer = kafka.KafkaProducer(bootstrap_servers=minibroker_session.kafka_bootstrap_servers)
    try:
        for i in range(3):
            producer.send(topic, f"paid-{i}".encode()).get(timeout=TIMEOUT_MS / 1000)
    finally:
        producer.close()
    with Consumer(
        TopicPartition(topic, 0),
        bootstrap_servers=minibroker_session.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=TIMEOUT_MS,
    ) as consumer:
        values = [record.value for _, record in zip(range(3), consumer, strict=False)]
    assert values == [b"paid-0", b"paid-1", b"paid-2"]


def test_each_test_has_a_broker_of_its_own(
    minibroker: RunningBroker, minibroker_session: RunningBroker
) -> None:
    assert minibroker.pid != minibroker_session.pid
    assert minibroker.data_dir != minibroker_session.data_dir
    assert minibroker.bootstrap_servers != minibroker_session.bootstrap_servers


def test_the_factory_starts_brokers_with_the_settings_given(minibroker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = minibroker_factory({"backend": "asyncio", "auto_create_topics": False})
    assert "backend=asyncio" in broker.log_text


def test_a_broker_is_gone_after_its_block() -> None:
    started = time.monotonic()
    with running_broker() as broker:
        ready_s = time.monotonic() - started
        assert broker.data_dir.is_dir()
        assert "event=listening listener=kafka" in broker.log_text
    print(f"start to ready: {ready_s:.3f} s")
    assert not broker.data_dir.parent.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(broker.pid, 0)


def test_a_broker_that_cannot_start_says_why() -> None:
    with (
        pytest.raises(BrokerStartError, match="unknown setting 'auto_create_topic'"),
        running_broker({"auto_create_topic": False}),
    ):
        pass


def test_the_plugin_is_installed_with_the_package() -> None:
    """pip installs the plugin from pyproject.toml's pytest11 entry point; this suite
    loads the same module (tests/conftest.py) while an older install lacks it."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    module = importlib.import_module(project["project"]["entry-points"]["pytest11"]["minibroker"])
    assert {"minibroker", "minibroker_session", "minibroker_factory"} <= set(vars(module))


# A user's test module: each test notes which session broker served it, on which worker.
_USER_TESTS = """
import os
from pathlib import Path


def _note(broker):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = f"{worker} {broker.pid} {broker.kafka_bootstrap_servers} {broker.data_dir}\\n"
    with open(Path(__file__).parent / "served.txt", "a") as f:
        f.write(line)


def test_one(minibroker_session):
    _note(minibroker_session)


def test_two(minibroker_session):
    _note(minibroker_session)
"""


@pytest.mark.wire  # it starts brokers, through a pytest of its own
def test_each_xdist_worker_has_a_session_broker_of_its_own(tmp_path: Path) -> None:
    """A user's suite under `pytest -n 2 --dist each` (every test on both workers): one
    session broker per worker, on its own ports and directory, each gone after."""
    (tmp_path / "test_user.py").write_text(_USER_TESTS)
    env = dict(os.environ)
    # The plugin by name whether or not this install has its entry point yet.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "xdist.plugin", "-p", "broker.pytest_plugin",
         "-p", "no:cacheprovider", "-n", "2", "--dist", "each", "test_user.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    served = [line.split() for line in (tmp_path / "served.txt").read_text().splitlines()]
    assert len(served) == 4
    by_worker = {
        worker: {tuple(rest) for w, *rest in served if w == worker} for worker, *_ in served
    }
    assert sorted(by_worker) == ["gw0", "gw1"]
    assert all(len(brokers) == 1 for brokers in by_worker.values())  # one per session
    (first,), (second,) = by_worker.values()
    assert first[0] != second[0] and first[1] != second[1] and first[2] != second[2]
    assert not any(Path(broker[2]).exists() for broker in (first, second))
