"""What a connection that has not authenticated may claim of the broker (issue 39,
items 1 and 2), on the real broker process, both backends: frames no larger than
authentication needs, a bounded time to authenticate, and no room taken from
authenticated clients or from another listener."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, frame_of_length, values_batch
from tests.security_fixtures import listeners

PREAUTH_BYTES_MAX = 512 * 1024
USERS = "alice:alice-pw"


def start(tmp_path: Path, backend: str, settings: str = "") -> BrokerProcess:
    config = (
        settings
        + listeners(("sasl", "sasl_plaintext"))
        + '[[listeners]]\nname = "kafka"\nhost = "127.0.0.1"\nport = 0\n'
        'security = "sasl_plaintext"\nprotocol = "kafka"\n'
    )
    return BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=config,
        env={"MINIBROKER_BOOTSTRAP_USERS": USERS},
    ).start()


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    proc = start(tmp_path, backend)
    try:
        yield proc
    finally:
        proc.kill()


@pytest.mark.parametrize("listener", ["sasl", "kafka"])
def test_a_frame_over_the_cap_before_authentication_closes_at_once(
    broker: BrokerProcess, listener: str
) -> None:
    """Only the length prefix is sent: the broker must not wait for (or hold) the rest."""
    with WireClient(broker.address(listener), timeout_s=5) as c:
        c.send_raw(frame_of_length(PREAUTH_BYTES_MAX + 1))
        assert c.is_closed_by_peer()
    assert broker.log_shows("before authentication exceeds sasl_server_max_receive_bytes")


def test_a_frame_under_the_cap_waits_and_after_authentication_more_is_allowed(
    broker: BrokerProcess,
) -> None:
    with WireClient(broker.address("sasl"), timeout_s=1) as c:
        c.send_raw(frame_of_length(PREAUTH_BYTES_MAX))
        assert not c.is_closed_by_peer()  # held for the rest, as any begun request
    with WireClient(broker.address("sasl"), timeout_s=10) as c:
        c.authenticate("alice", "alice-pw")
        assert c.create_topic("big") == 0
        batch = values_batch([b"x" * (PREAUTH_BYTES_MAX + 1024)])
        assert c.produce("big", 0, batch)["error"] == 0
