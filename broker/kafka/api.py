"""What each module of broker/kafka/apis/ declares for one Kafka API: a `KafkaApi`, its
versions and the two halves of its translation, so that the request decoder,
ApiVersions and the response encoder all read one declaration.

A translation turns a Kafka request (a kio entity) into the broker's own request
(protocol/messages.py, or a Kafka-only one: kafka_only.py), so that it runs through
the same handlers, authorizer and SASL state as the minibroker listener's. It returns
the broker request; a `Translated` when the Kafka response needs more of the Kafka
request than the broker's answer carries (the API's own typed `asked`); or a `Reply`:
what the listener answers without the handlers (a SaslHandshake, a part of the request
the broker does not serve), as the values of the Kafka response (entities.build).
An answer turns the broker's response, with that `asked`, into the Kafka response's
values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, NamedTuple, TypeVar

from protocol import messages as m

MILLISECOND = timedelta(milliseconds=1)
Values = dict[str, Any]
"""A Kafka response's values, as entities.build takes them."""

A = TypeVar("A")


class Reply(NamedTuple):
    """An answer the listener gives itself: the Kafka response's values."""

    values: Values


class Translated(NamedTuple, Generic[A]):
    """A broker request, and what its Kafka response needs of the Kafka request."""

    request: m.Request
    asked: A


@dataclass(slots=True)
class Exchange:
    """What a connection's Kafka requests leave for the ones after them."""

    sasl_mechanisms: tuple[str, ...]
    default_partitions: int
    mechanism: str | None = None
    """The mechanism SaslHandshake chose, for the SaslAuthenticate after it."""
    bare_sasl_rounds: int = 0
    """After a SaslHandshake v0, how many of the next frames are the mechanism's own
    bytes, with no Kafka header (KIP-43): PLAIN's one round, SCRAM's two."""
    authenticated: bool = True
    """False on a SASL listener until the connection has authenticated: until then no
    answer of a translation's own goes out but to ApiVersions and SASL's requests."""


Translation = Callable[[Any, int, Exchange], "m.Request | Translated[A] | Reply"]
"""(Kafka request, its version, the connection's exchange) -> what the broker runs."""
Answer = Callable[[Any, int, A], Values]
"""(broker response, the request's version, its `asked`) -> the Kafka response's values."""
Read = Callable[[bytes | memoryview, int], m.Request]
"""(request frame body, its version) -> the broker's request, its client id included."""


@dataclass(frozen=True, slots=True)
class KafkaApi(Generic[A]):
    """One Kafka API served, by Kafka's key and name, the versions answered, and how
    its requests and answers are translated. `A` is the type of what the answer needs
    of the Kafka request (None when the translation never returns a `Translated`);
    `answer` is None for an API the listener always answers itself. `reader`, on the hot
    path only (Produce), makes a connection's reader of the frame body straight into the
    broker's request, which kio's reader and `translate` would make of it (tests hold it
    to them); such an API's translation never returns a `Translated` or a `Reply`."""

    key: int
    name: str
    min_version: int
    max_version: int
    translate: Translation[A]
    answer: Answer[A] | None
    reader: Callable[[], Read] | None = None

    def serves(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


def ms(value: Any) -> int:
    """A kio duration (timedelta) in whole milliseconds, exactly: through float seconds,
    1001 ms came out as 1000."""
    return int(value // MILLISECOND)
