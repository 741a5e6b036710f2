"""The base of the broker's request classes for Kafka APIs the native protocol does not
have (JoinGroup, SyncGroup, AddPartitionsToTxn...). Only a `kafka` listener's
translations build them, never a frame of the minibroker listener, so they stay out of
protocol/messages.py, the native wire contract.

A subclass is declared as protocol/messages.py declares a native request: tagged with
the Kafka API's name, with its `response` class and its `requirements` in
protocol/authorization.py's terms (docs/protocol.md section 7), so the broker's one
judge (`Apis.handle` in broker/api/dispatch.py) decides it like any other request, and
`codec.refusal` answers a refusal in its own response. It lives in its API family's
module under apis/, beside the translation that builds it; the function that runs it is
registered as every API is, by its family in broker/api/ (`apis()`, under the tag).
"""

from __future__ import annotations

from typing import Any

from protocol import messages as m


class KafkaOnlyRequest(m.Request):
    """A request of a Kafka API that the native protocol does not have."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Checked when the class is made: the judge would otherwise find a missing
        # declaration only at the first request. (Its tag is not set yet here:
        # tests/test_layout.py checks that no tag is a native API's name.)
        missing = [name for name in ("response", "requirements") if name not in vars(cls)]
        if missing:
            raise TypeError(f"{cls.__name__} declares no {' and no '.join(missing)}")
