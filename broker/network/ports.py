"""The broker's two ports: bound before recovery, listened on when they serve.

Binding first means a port another process holds ends the start at once, in one
line naming the address and the setting that moves it, rather than as a traceback
after recovery (which can take minutes after a crash). A bound socket that does not
listen yet refuses connections, so clients see the port closed, as before, until
the broker serves.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from anyio.abc import SocketListener, SocketStream
from anyio.streams.stapled import MultiListener

__all__ = ["Endpoint", "ListenError", "bind", "listen"]

BACKLOG = 65536  # anyio's create_tcp_listener's; the kernel caps it at net.core.somaxconn
# Port 0 on a host with several addresses binds the port the first one got on the
# others too; another process may hold it there, then a new port is tried.
EPHEMERAL_TRIES = 10


class ListenError(Exception):
    """A port the broker cannot bind or listen on; the message names the address and the
    setting that moves it. `in_use`: another socket holds the address."""

    def __init__(self, message: str, *, in_use: bool) -> None:
        super().__init__(message)
        self.in_use = in_use


@dataclass(frozen=True)
class Endpoint:
    """One of the broker's ports and the settings that place it, for the messages."""

    purpose: str  # what the port is for, as the message says it
    host: str
    port: int
    host_setting: str
    port_setting: str
    port_hint: str = ""  # more a user may do about a port in use

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def error(self, exc: OSError) -> ListenError:
        """`exc` of a bind or listen, said as what to do about it."""
        fix = {
            errno.EADDRINUSE: "stop the process listening there, or set "
            f"{_setting(self.port_setting)} to a free port{self.port_hint}",
            errno.EACCES: f"ports below 1024 need privileges: set {_setting(self.port_setting)} "
            "to 1024 or above",
            errno.EADDRNOTAVAIL: f"set {_setting(self.host_setting)} to an address of this "
            "machine, or 0.0.0.0 for all",
        }.get(exc.errno or 0, "")
        reason = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        return ListenError(
            f"cannot {self.purpose} on {self.address}: {reason}" + (f"; {fix}" if fix else ""),
            in_use=exc.errno == errno.EADDRINUSE,
        )


def _setting(name: str) -> str:
    """A setting as a message names it: with its flag where it has one (a listener's
    host and port, in a `[[listeners]]` table, have none)."""
    return name if " " in name else f"{name} (--{name.replace('_', '-')})"


def bind(endpoint: Endpoint) -> list[socket.socket]:
    """Bound sockets (not listening yet) for every address of `endpoint.host`, as
    anyio's `create_tcp_listener` binds them. Raises ListenError."""
    try:
        infos = socket.getaddrinfo(
            endpoint.host,
            endpoint.port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE | socket.AI_ADDRCONFIG,
        )
    except socket.gaierror as exc:
        raise ListenError(
            f"cannot {endpoint.purpose} on {endpoint.address}: {exc.strerror}; set "
            f"{_setting(endpoint.host_setting)} to an address or name of this machine",
            in_use=False,
        ) from exc
    addresses = sorted({(family, sockaddr) for family, _, _, _, sockaddr in infos})
    for _ in range(EPHEMERAL_TRIES):
        try:
            return _bind_all(addresses, endpoint.port)
        except OSError as exc:
            if not (exc.errno == errno.EADDRINUSE and endpoint.port == 0):
                raise endpoint.error(exc) from exc
    raise endpoint.error(OSError(errno.EADDRINUSE, "address already in use"))


def _bind_all(
    addresses: Sequence[tuple[socket.AddressFamily, tuple[Any, ...]]], port: int
) -> list[socket.socket]:
    bound: list[socket.socket] = []
    try:
        for family, sockaddr in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            bound.append(sock)
            sock.setblocking(False)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # A restart must not wait for the last run's connections in TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((sockaddr[0], port, *sockaddr[2:]))
            port = port or sock.getsockname()[1]
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


async def listen(endpoint: Endpoint, sockets: list[socket.socket]) -> MultiListener[SocketStream]:
    """Listen on the sockets `bind` returned. Raises ListenError: with SO_REUSEADDR a
    bound socket does not keep out another that binds and listens first."""
    listeners: list[SocketListener] = []
    try:
        for sock in sockets:
            try:
                sock.listen(BACKLOG)
            except OSError as exc:
                raise endpoint.error(exc) from exc
            listeners.append(await SocketListener.from_socket(sock))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return MultiListener(listeners)
