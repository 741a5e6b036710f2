"""The sync faces' event loop: one daemon thread per client running the async core.

The caller's thread never sees an event loop. Slow calls (connect, metadata,
poll) cross over with `BlockingPortal.call`; the producer's hot path never
crosses at all (it appends to the thread-safe accumulator) and only nudges the
sender with `call_soon_threadsafe`, which does not wait. A call that may run the
application's callbacks (the consumer's rebalance listener) crosses with
`call_serving`, so that they run on the caller's thread while the core awaits them.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import sniffio
from anyio.from_thread import BlockingPortal, start_blocking_portal

T = TypeVar("T")
_Jobs = queue.SimpleQueue[Callable[[], object] | None]


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
        # The queue of the call_serving in progress, where on_caller puts its functions.
        self._serving: _Jobs | None = None

    def call_serving(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`portal.call(func, *args)`, running meanwhile on this thread the functions that
        `on_caller` hands over from the event loop."""
        jobs: _Jobs = queue.SimpleQueue()
        outer, self._serving = self._serving, jobs
        try:
            future = self.portal.start_task_soon(func, *args)
            future.add_done_callback(lambda _: jobs.put(None))
            while (job := jobs.get()) is not None:
                job()
            return future.result()
        finally:
            self._serving = outer

    async def on_caller(self, func: Callable[..., T], *args: Any) -> T:
        """Run `func(*args)` on the thread waiting in `call_serving`: its result, or its
        exception raised here."""
        jobs = self._serving
        if jobs is None:
            raise RuntimeError("no thread waits in call_serving to run the callback")
        done = anyio.Event()
        outcome: list[T] = []
        failure: list[Exception] = []

        def job() -> None:
            try:
                outcome.append(func(*args))
            except Exception as exc:
                failure.append(exc)
            finally:
                self.portal.call(done.set)

        jobs.put(job)
        await done.wait()
        if failure:
            raise failure[0]
        if not outcome:  # a BaseException left the caller's thread instead
            raise RuntimeError("the callback was interrupted on the caller's thread")
        return outcome[0]

    def close(self) -> None:
        self._stack.close()


def threadsafe_caller() -> Callable[[Callable[[], object]], object]:
    """A non-blocking way to run a callable on the current event loop from any thread."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    return asyncio.get_running_loop().call_soon_threadsafe
