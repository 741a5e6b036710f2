"""The pytest plugin installed with minibroker (the `minibroker` entry point of the
`pytest11` group): a real broker in a test suite, from `broker/testing.py`.

- `minibroker`: a fresh broker for each test;
- `minibroker_session`: one broker for the whole session (one per xdist worker);
- `minibroker_factory`: `minibroker_factory({"backend": "asyncio"})` starts a broker
  with settings of the test's own, stopped after the test.

Each yields a `RunningBroker`: `bootstrap_servers` for minibroker's SDK,
`kafka_bootstrap_servers` for Kafka's clients. `minibroker` and `minibroker_session`
take the settings of the `minibroker_settings` fixture, which a conftest.py may
override (session scoped, a dict of docs/configuration.md's settings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack

import pytest

from broker.testing import RunningBroker, Setting, running_broker

BrokerFactory = Callable[[Mapping[str, Setting] | None], RunningBroker]


@pytest.fixture(scope="session")
def minibroker_settings() -> Mapping[str, Setting]:
    """The settings of the `minibroker` and `minibroker_session` brokers: none."""
    return {}


@pytest.fixture
def minibroker(minibroker_settings: Mapping[str, Setting]) -> Iterator[RunningBroker]:
    """A broker of this test's own, with a native and a kafka listener."""
    with running_broker(minibroker_settings) as broker:
        yield broker


@pytest.fixture(scope="session")
def minibroker_session(minibroker_settings: Mapping[str, Setting]) -> Iterator[RunningBroker]:
    """One broker for every test of the session (of the xdist worker): topics and groups
    outlive a test, so each test names its own."""
    with running_broker(minibroker_settings) as broker:
        yield broker


@pytest.fixture
def minibroker_factory() -> Iterator[BrokerFactory]:
    """Starts brokers with the settings given, each stopped after the test."""
    with ExitStack() as stack:

        def start(settings: Mapping[str, Setting] | None = None) -> RunningBroker:
            return stack.enter_context(running_broker(settings))

        yield start
