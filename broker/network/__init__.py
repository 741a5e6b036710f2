"""The network: the broker process on AnyIO, its connections and its HTTP endpoints.

`server` listens, runs each connection's reader and writer and the process's
lifecycle and signals; `asyncio_stream` is the asyncio backend's read-ahead
connection; `http_endpoints` serves /metrics, /healthz and /readyz. Other
modules import from here, not from the modules.
"""

from broker.network.server import Broker

__all__ = ["Broker"]
