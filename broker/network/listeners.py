"""The broker's ports: each listener's and the metrics endpoint's, bound before
recovery and listened on after, and the TLS contexts their handshakes read.

Binding first means a port another process holds ends the start at once rather than
after recovering every partition (`ports.py` says which setting moves it). SIGHUP
reloads the certificate, key and CA files for the handshakes to come.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from anyio.abc import SocketStream, TaskGroup
from anyio.streams.stapled import MultiListener

from broker.config import DEFAULT_LISTENER, BrokerConfig, ConfigError, Listener
from broker.metrics import BrokerMetrics
from broker.network import tls
from broker.network.http_endpoints import BasicAuth, MetricsAccess, serve_http
from broker.network.ports import Endpoint, bind, listen

log = logging.getLogger(f"minibroker.{__name__}")


@dataclass(eq=False)
class Served:
    """A listener and the sockets it accepts on."""

    listener: Listener
    sockets: MultiListener[SocketStream]
    port: int
    """The port bound (the configured one, or the one port 0 picked)."""

    @property
    def advertised(self) -> tuple[str, int]:
        """What Metadata answers on this listener."""
        listener = self.listener
        return (listener.advertised_host or listener.host, listener.advertised_port or self.port)

    @property
    def insecure(self) -> bool:
        """Plaintext without authentication where others than this host can reach it."""
        return self.listener.security == "plaintext" and not _loopback(self.listener.host)


class Listeners:
    """The listeners' and the metrics endpoint's sockets, and the TLS in front of them."""

    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics) -> None:
        """ConfigError when a TLS listener's certificate, key or CA cannot be loaded."""
        self.config = config
        self.metrics = metrics
        self.port = config.port
        self._tls = any(listener.tls for listener in config.effective_listeners())
        # Read at the start of each handshake: SIGHUP replaces it, open connections keep
        # the one they shook hands with.
        self.tls_context: ssl.SSLContext | None = tls.server_context(config) if self._tls else None
        self.metrics_access = MetricsAccess(
            tls.metrics_context(config) if config.metrics_tls_certfile else None,
            BasicAuth(config.metrics_basic_auth_users) if config.metrics_basic_auth_users else None,
        )
        self._listen_at = [_endpoint(listener) for listener in config.effective_listeners()]
        self._metrics_at = Endpoint(
            "serve metrics",
            config.metrics_host,
            config.metrics_port,
            "metrics_host",
            "metrics_port",
            ", or to -1 to turn the metrics server off",
        )
        self._listen_sockets: list[list[socket.socket]] = []
        self._metrics_sockets: list[socket.socket] = []
        self._bound: list[socket.socket] = []

    def bind(self) -> None:
        """Bind every port (ListenError names the one that cannot be)."""
        self._listen_sockets = [bind(endpoint) for endpoint in self._listen_at]
        self._bound += [sock for sockets in self._listen_sockets for sock in sockets]
        self.port = self._listen_sockets[0][0].getsockname()[1]
        self._metrics_sockets = bind(self._metrics_at) if self.config.metrics_port >= 0 else []
        self._bound += self._metrics_sockets

    async def serve_metrics(self, tg: TaskGroup, is_ready: Callable[[], bool]) -> None:
        """Serve /metrics, /healthz and /readyz in `tg`, when the metrics port is on."""
        if not self._metrics_sockets:
            return
        config = self.config
        metrics_port = await tg.start(
            serve_http,
            await listen(self._metrics_at, self._metrics_sockets),
            self.metrics,
            is_ready,
            self.metrics_access,
        )
        log.info(
            "event=metrics_listening host=%s port=%d tls=%s basic_auth=%s",
            config.metrics_host,
            metrics_port,
            self.metrics_access.tls_context is not None,
            self.metrics_access.users is not None,
        )
        if (
            self.metrics_access.users is not None
            and self.metrics_access.tls_context is None
            and not _loopback(config.metrics_host)
        ):
            # The passwords would cross the network in clear.
            log.warning("event=metrics_basic_auth_without_tls host=%s", config.metrics_host)

    async def listen(self) -> list[Served]:
        """Listen on every listener's bound sockets."""
        return [
            self._served(listener, await listen(endpoint, sockets))
            for listener, endpoint, sockets in zip(
                self.config.effective_listeners(),
                self._listen_at,
                self._listen_sockets,
                strict=True,
            )
        ]

    def close(self) -> None:
        """Close the sockets a failed start left unlistened (closed twice is a no-op)."""
        for sock in self._bound:
            sock.close()

    def _served(self, listener: Listener, sockets: MultiListener[SocketStream]) -> Served:
        served = Served(listener, sockets, sockets.extra(anyio.abc.SocketAttribute.local_port))
        self.metrics.set_listener(listener.name, insecure=served.insecure)
        if served.insecure:
            log.warning(
                "event=listener_insecure listener=%s host=%s reason=%r",
                listener.name,
                listener.host,
                "plaintext without authentication on an address other hosts can reach: "
                "anyone who reaches it may read and write every topic; bind "
                "127.0.0.1, or use security tls, sasl_tls or sasl_plaintext",
            )
        return served

    def log_listening(self, served: list[Served]) -> None:
        """One `event=listening` line per listener, naming the protocol it speaks; the
        first keeps the format that tools and the test harness read (host, port and
        data_dir)."""
        first, *others = served
        log.info(
            "event=listening listener=%s security=%s host=%s port=%d protocol=%s data_dir=%s",
            first.listener.name,
            first.listener.security,
            first.listener.host,
            first.port,
            first.listener.protocol,
            self.config.data_path.resolve(),
        )
        for other in others:
            log.info(
                "event=listening listener=%s security=%s host=%s port=%d protocol=%s",
                other.listener.name,
                other.listener.security,
                other.listener.host,
                other.port,
                other.listener.protocol,
            )

    def reload_tls(self, config: BrokerConfig) -> None:
        """Read the certificate, key and CA files again for the handshakes to come; when
        they do not load, the running ones stay."""
        self.config = config
        if self.metrics_access.tls_context is not None:
            try:
                self.metrics_access.tls_context = tls.metrics_context(config)
            except ConfigError as exc:
                log.error("event=metrics_tls_reload_failed error=%r", str(exc))
            else:
                log.info("event=metrics_tls_reloaded certfile=%s", config.metrics_tls_certfile)
        if not self._tls:
            return
        try:
            self.tls_context = tls.server_context(config)
        except ConfigError as exc:
            log.error("event=tls_reload_failed error=%r", str(exc))
            return
        log.info(
            "event=tls_reloaded certfile=%s cafile=%s client_auth=%s",
            config.tls_certfile,
            config.tls_cafile or "none",
            config.tls_client_auth,
        )


def _endpoint(listener: Listener) -> Endpoint:
    """Where `listener` binds, and the settings a message about it names."""
    if listener.name == DEFAULT_LISTENER:
        return Endpoint("listen", listener.host, listener.port, "host", "port")
    where = f"of [[listeners]] {listener.name!r}"
    return Endpoint(
        f"listen ({listener.name})", listener.host, listener.port, f"host {where}", f"port {where}"
    )


def _loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only: a loopback address or name.
    Anything else (a hostname, "", 0.0.0.0, ::) may be reached from other hosts."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
