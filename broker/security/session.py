"""Who is at the other end of one connection, as authentication left it.

A `Session` belongs to one connection: the listener it came in on, the address
it came from, and the principal that authorization decides for. Until a
connection authenticates (or on a listener without authentication) the
principal is `User:ANONYMOUS` (docs/protocol.md section 7, "Principal"); a TLS
client certificate on a listener without SASL makes it `User:<CN>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.config import DEFAULT_LISTENER
from broker.security.sasl import SaslState
from protocol.authorization import ANONYMOUS

__all__ = ["ANONYMOUS", "DEFAULT_LISTENER", "Session"]


@dataclass(slots=True)
class Session:
    listener: str
    """The name of the listener the connection came in on."""
    peer_host: str
    principal: str = ANONYMOUS
    advertised: tuple[str, int] | None = None
    """The advertised (host, port) of that listener, which Metadata answers; None only
    for a session made outside a listener (a unit test)."""
    sasl: SaslState | None = None
    """On a sasl_* listener, the connection's authentication (broker/security/sasl.py)."""
