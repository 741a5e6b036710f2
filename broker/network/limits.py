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

`AuthenticationTurns` bounds how many of a listener's connections not yet
authenticated run their handshake or SASL exchange at once (the others wait their
turn), so that a storm of logins cannot queue hundreds of steps on the event loop ahead
of an authenticated client's request.
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


class AuthenticationTurns(Generic[C]):
    """Which connections not yet authenticated may run their TLS handshake or SASL
    exchange now: at most `turns_max` per listener, the others wait in the order they
    asked, so that a storm of logins puts at most `turns_max` steps each on the event
    loop ahead of an authenticated client's request. Authenticated connections never
    ask. A turn lasts `turn_ms`: past it, the first connection waiting takes it, so idle
    or slow connections cannot keep logins out; its holder waits again at its next step.

    No IO and no clock: the server asks `ask` before each step (`now_ms` in), wakes the
    connections that `leave` and `expire` hand turns to, and asks `expire` at
    `next_expiry_ms`.
    """

    def __init__(self, turns_max: int, turn_ms: int) -> None:
        self.turns_max = turns_max
        self.turn_ms = turn_ms
        self._holding: dict[str, dict[C, int]] = {}  # listener -> holder -> since_ms
        self._waiting: dict[str, dict[C, None]] = {}  # listener -> waiters, oldest first
        self._listener_of: dict[C, str] = {}

    def holding(self, listener: str) -> int:
        """How many of `listener`'s connections hold a turn."""
        return len(self._holding.get(listener, ()))

    def waiting(self, listener: str) -> int:
        """How many of `listener`'s connections wait for one."""
        return len(self._waiting.get(listener, ()))

    def ask(self, conn: C, listener: str, now_ms: int) -> tuple[bool, list[C]]:
        """Whether `conn` may run its next step now (if not, it waits: the server wakes
        it when a turn is handed to it), and the other connections this hands a turn,
        to wake. A holder whose turn ran out while others wait queues again."""
        self._listener_of[conn] = listener
        holding = self._holding.setdefault(listener, {})
        waiting = self._waiting.setdefault(listener, {})
        since_ms = holding.get(conn)
        if since_ms is not None:
            if not waiting or now_ms - since_ms < self.turn_ms:
                return True, []
            del holding[conn]
        if conn not in waiting:
            waiting[conn] = None
        granted = self._fill(listener, now_ms)
        if conn in granted:
            granted.remove(conn)
            return True, granted
        return False, granted

    def leave(self, conn: C, now_ms: int) -> list[C]:
        """`conn` authenticated or closed (leaving twice is a no-op): the connections
        given its turn, to wake."""
        listener = self._listener_of.pop(conn, None)
        if listener is None:
            return []
        self._holding[listener].pop(conn, None)
        self._waiting[listener].pop(conn, None)
        return self._fill(listener, now_ms)

    def expire(self, now_ms: int) -> list[C]:
        """Turns held `turn_ms` or longer go to waiting connections, oldest turn first:
        the connections given one, to wake."""
        granted: list[C] = []
        for listener, waiting in self._waiting.items():
            holding = self._holding[listener]
            ended = [
                conn for conn, since_ms in holding.items() if now_ms - since_ms >= self.turn_ms
            ]
            for conn in ended[: len(waiting)]:
                del holding[conn]
            granted += self._fill(listener, now_ms)
        return granted

    def next_expiry_ms(self) -> int | None:
        """When `expire` may next hand a turn on: the oldest turn's end on a listener
        with connections waiting; None when no one waits."""
        ends = [
            since_ms + self.turn_ms
            for listener, waiting in self._waiting.items()
            if waiting
            for since_ms in self._holding[listener].values()
        ]
        return min(ends, default=None)

    def _fill(self, listener: str, now_ms: int) -> list[C]:
        holding = self._holding[listener]
        waiting = self._waiting[listener]
        granted: list[C] = []
        while waiting and len(holding) < self.turns_max:
            conn = next(iter(waiting))
            del waiting[conn]
            holding[conn] = now_ms
            granted.append(conn)
        return granted
