"""Who may open one more connection, pure: the broker's `max_connections`, each
listener's own `max_connections` and each client address's
`max_connections_per_ip` (Kafka's `max.connections`, `listener.name.X.max.connections`
and `max.connections.per.ip` with its overrides).

A connection that has not authenticated yet (a `sasl_*` listener's before SaslAuthenticate
succeeds, a `tls` listener's during its handshake) holds its room only until a
connection needs it: at a full listener, or a full broker, the oldest such
connection is closed to make room, and an authenticated one is never closed for
another. So bare sockets, on one listener or many, cannot lock authenticated clients
out; they can only push each other out. An address at its own limit is refused.

No IO and no clock: the server asks `admit` at each accept and closes what it says.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class Refused:
    """No room for the connection: `reason` names the limit, for the log."""

    reason: str


class ConnectionLimits(Generic[C]):
    """The open connections, by listener and client address, and which have not
    authenticated yet (oldest first)."""

    def __init__(
        self,
        max_connections: int,
        per_listener: Mapping[str, int],
        per_ip: int,
        per_ip_overrides: Mapping[str, int],
    ) -> None:
        """`per_listener`: a listener's own limit (a listener not named has none of
        its own); `per_ip_overrides`: an address's limit in place of `per_ip`."""
        self.max_connections = max_connections
        self._per_listener_max = dict(per_listener)
        self._per_ip = per_ip
        self._per_ip_overrides = dict(per_ip_overrides)
        self._open: dict[C, tuple[str, str]] = {}  # connection -> (listener, host)
        self._unauthenticated: dict[C, None] = {}  # in the order they opened
        self._listener_count: Counter[str] = Counter()
        self._host_count: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, listener: str, host: str) -> Refused | list[C]:
        """Whether a connection from `host` may open on `listener`: Refused, or the
        unauthenticated connections to close first to make room for it (often none),
        which count as closed from now on."""
        host_max = self._per_ip_overrides.get(host, self._per_ip)
        if self._host_count[host] >= host_max:
            return Refused(f"max_connections_per_ip={host_max} for {host}")
        evict: list[C] = []
        listener_max = self._per_listener_max.get(listener)
        if listener_max is not None and self._listener_count[listener] >= listener_max:
            victim = self._oldest_unauthenticated(listener)
            if victim is None:
                return Refused(f"max_connections={listener_max} of listener {listener}")
            evict.append(victim)
        if len(self._open) - len(evict) >= self.max_connections:
            victim = self._oldest_unauthenticated(None, evict)
            if victim is None:
                return Refused(f"max_connections={self.max_connections}")
            evict.append(victim)
        for victim in evict:
            self.closed(victim)
        return evict

    def opened(self, conn: C, listener: str, host: str, *, authenticated: bool) -> None:
        """`conn` is open (after `admit` let it)."""
        self._open[conn] = (listener, host)
        self._listener_count[listener] += 1
        self._host_count[host] += 1
        if not authenticated:
            self._unauthenticated[conn] = None

    def authenticated(self, conn: C) -> None:
        """`conn` has authenticated: it keeps its room from now on."""
        self._unauthenticated.pop(conn, None)

    def closed(self, conn: C) -> None:
        """`conn` is closed, or being closed (closing twice is a no-op)."""
        where = self._open.pop(conn, None)
        if where is None:
            return
        self._unauthenticated.pop(conn, None)
        for counts, key in ((self._listener_count, where[0]), (self._host_count, where[1])):
            counts[key] -= 1
            if not counts[key]:
                del counts[key]  # many addresses come and go: keep only those open

    def _oldest_unauthenticated(self, listener: str | None, taken: Sequence[C] = ()) -> C | None:
        for conn in self._unauthenticated:
            if conn not in taken and (listener is None or self._open[conn][0] == listener):
                return conn
        return None
