"""The sync faces' event loop: one daemon thread per client running the async core.

The caller's thread never sees an event loop. Slow calls (connect, metadata,
poll) cross over with `BlockingPortal.call`; the producer's hot path never
crosses at all (it appends to the thread-safe accumulator) and only nudges the
sender with `call_soon_threadsafe`, which does not wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import sniffio
from anyio.from_thread import BlockingPortal, start_blocking_portal


def _backend() -> tuple[str, dict[str, Any]]:
    try:
        import uvloop  # noqa: F401  (optional speedup of the portal's asyncio loop)
    except ImportError:
        return "asyncio", {}
    return "asyncio", {"use_uvloop": True}


class PortalThread:
    """A daemon thread with a running event loop and a portal into it."""

    def __init__(self, name: str) -> None:
        backend, options = _backend()
        self._stack = contextlib.ExitStack()
        self.portal: BlockingPortal = self._stack.enter_context(
            start_blocking_portal(backend, options, name=name)
        )

    def close(self) -> None:
        self._stack.close()


def threadsafe_caller() -> Callable[[Callable[[], object]], object]:
    """A non-blocking way to run a callable on the current event loop from any thread."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    return asyncio.get_running_loop().call_soon_threadsafe
