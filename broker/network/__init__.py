"""The network: listeners, connections, flow control and codecs on AnyIO, and the HTTP
endpoints.

`listeners` binds the listener and metrics ports before recovery and listens after
(`ports` names the address and the setting that moves a port in use) and holds the
TLS contexts; `server` runs each connection's reader and writer; `asyncio_stream` is
the asyncio backend's read-ahead connection; `tls` the handshake; `http_endpoints`
serves /metrics, /healthz and /readyz. The network knows the APIs only by the outcomes
of requests (broker/api/outcomes.py): the composition root, broker/app.py, hands it
the APIs and the sessions. Other modules import from here, not from the modules.
"""

from broker.network.listeners import Listeners, Served
from broker.network.ports import ListenError
from broker.network.server import Server

__all__ = ["ListenError", "Listeners", "Served", "Server"]
