"""The APIs declared in protocol/messages.py that the broker does not answer yet
(docs/protocol.md section 10) are refused as an unknown api is: UNSUPPORTED_VERSION(35),
whatever their fields, the connection kept, and ApiVersions does not list them."""

from __future__ import annotations

from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from protocol.errors import ErrorCode

NOT_ANSWERED = {
    "DeleteTopics": {"topics": ["t"]},
    "DescribeConfigs": {"resources": [{"type": "broker", "name": "0"}]},
    "IncrementalAlterConfigs": {"resources": [], "validate_only": True},
}


def test_declared_apis_answer_as_unknown_ones_until_built(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        listed = c.call("ApiVersions")["apis"]
        unknown = c.call("NoSuchApi", topics=["t"])
        assert unknown["error"] == ErrorCode.UNSUPPORTED_VERSION
        for api, fields in NOT_ANSWERED.items():
            assert api not in listed
            for sent in (fields, {}, {"topics": "not-a-list"}):  # well-formed or not
                answer = c.call(api, **sent)
                assert answer["error"] == ErrorCode.UNSUPPORTED_VERSION, (api, sent, answer)
                assert set(answer) == {"cid", "error", "message"}
        # Past max_entries_per_request too: not served comes first.
        many = c.call("DeleteTopics", topics=[f"t{i}" for i in range(10_001)])
        assert many["error"] == ErrorCode.UNSUPPORTED_VERSION
        assert c.call("ApiVersions")["error"] == 0  # still connected
