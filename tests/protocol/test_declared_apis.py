"""Every API declared in protocol/messages.py is answered and listed by ApiVersions
(docs/protocol.md section 10); an api this broker does not know is UNSUPPORTED_VERSION(35),
whatever its fields, and the connection is kept."""

from __future__ import annotations

from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from protocol.errors import ErrorCode
from protocol.messages import REQUEST_TYPES


def test_every_declared_api_is_listed_and_an_unknown_one_refused(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        listed = c.call("ApiVersions")["apis"]
        assert set(listed) == set(REQUEST_TYPES)
        for sent in ({"topics": ["t"]}, {}, {"topics": "not-a-list"}):  # well-formed or not
            unknown = c.call("NoSuchApi", **sent)
            assert unknown["error"] == ErrorCode.UNSUPPORTED_VERSION, (sent, unknown)
            assert set(unknown) == {"cid", "error", "message"}
        assert c.call("ApiVersions")["error"] == 0  # still connected
