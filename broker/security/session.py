"""Who is at the other end of one connection, as authentication left it.

A `Session` belongs to one connection: the listener it came in on, the address
it came from, and the principal that authorization decides for. Until a
connection authenticates (or on a listener without authentication) the
principal is `User:ANONYMOUS` (docs/protocol.md section 7, "Principal").
"""

from __future__ import annotations

from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"
DEFAULT_LISTENER = "default"
"""The name of the one plaintext listener that `host`/`port` describe."""


@dataclass(slots=True)
class Session:
    listener: str
    peer_host: str
    principal: str = ANONYMOUS
