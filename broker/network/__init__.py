"""The network: the broker process on AnyIO, its connections and its HTTP endpoints.

`server` listens, runs each connection's reader and writer and the process's
lifecycle and signals; `ports` binds the listener and metrics ports (a ListenError
names the address and the setting that moves it); `asyncio_stream` is the asyncio
backend's read-ahead connection; `http_endpoints` serves /metrics, /healthz and
/readyz. Other modules import from here, not from the modules.
"""

from broker.network.ports import ListenError
from broker.network.server import Broker

__all__ = ["Broker", "ListenError"]
