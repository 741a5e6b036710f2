"""The sync faces' event loop: one daemon thread per client running the async core.

The caller's thread never sees an event loop. Calls into the core (connect,
metadata, poll, a transaction's steps) cross over with `PortalThread.call`: one
`call_soon_threadsafe` there and one lock release back, where
`BlockingPortal.call` waited twice (for its task to be spawned, then for the
answer) and cost about 60-90 µs per call against about 20 (docs/benchmark-notes.md,
"The sync SDK's round trip"); the producer's hot path never crosses at all (it appends to the
thread-safe accumulator) and only nudges the sender with `call_soon_threadsafe`,
which does not wait. A call that may run the application's callbacks (the
consumer's rebalance listener) crosses with `call_serving`, so that they run on
the caller's thread while the core awaits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar, overload

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
        self._loop: asyncio.AbstractEventLoop = self.portal.call(asyncio.get_running_loop)
        self._loop_thread: int = self.portal.call(threading.get_ident)
        self._running = True
        self._context = contextvars.Context()
        self._context.run(sniffio.current_async_library_cvar.set, "asyncio")

    @overload
    def call(self, func: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T: ...
    @overload
    def call(self, func: Callable[..., T], *args: Any) -> T: ...
    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        """`portal.call(func, *args)` in one hop each way: `func(*args)` runs on the event
        loop (as a task of its own when it returns an awaitable) and this thread waits on
        a lock that the outcome releases. Its result, or its exception raised here."""
        done = threading.Lock()
        done.acquire()
        outcome = self._start(func, args, lambda: done.release())
        done.acquire()
        return outcome.result()

    def call_serving(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`call(func, *args)`, running meanwhile on this thread the functions that
        `on_caller` hands over from the event loop."""
        jobs: _Jobs = queue.SimpleQueue()
        outer, self._serving = self._serving, jobs
        try:
            outcome: _Outcome[T] = self._start(func, args, lambda: jobs.put(None))
            while (job := jobs.get()) is not None:
                job()
            return outcome.result()
        finally:
            self._serving = outer

    def _start(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        finished: Callable[[], object],
    ) -> _Outcome[Any]:
        """Have the event loop run `func(*args)`; `finished()` runs once its outcome is in
        the returned `_Outcome`, on the loop's thread."""
        if not self._running:
            raise RuntimeError("This portal is not running")
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("This method cannot be called from the event loop thread")
        outcome: _Outcome[Any] = _Outcome()

        def settle(task: asyncio.Future[Any]) -> None:
            if task.cancelled():
                outcome.error = asyncio.CancelledError()
            else:
                outcome.error = task.exception()
                if outcome.error is None:
                    outcome.value = task.result()
            finished()

        def begin() -> None:
            try:
                result = func(*args)
                if inspect.isawaitable(result):
                    # The outcome holds the task: the loop keeps only a weak reference.
                    outcome.task = task = asyncio.ensure_future(result)
                    task.add_done_callback(settle)
                    return
                outcome.value = result
            except BaseException as exc:
                outcome.error = exc
            finished()

        # In a context of its own that says asyncio runs here, as the portal's tasks: the
        # caller's (a trio program's, say) must not reach the loop, and a constructor run
        # outside any task must make its AnyIO locks and events for this loop.
        self._loop.call_soon_threadsafe(begin, context=self._context.copy())
        return outcome

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
                self.call(done.set)

        jobs.put(job)
        await done.wait()
        if failure:
            raise failure[0]
        if not outcome:  # a BaseException left the caller's thread instead
            raise RuntimeError("the callback was interrupted on the caller's thread")
        return outcome[0]

    def close(self) -> None:
        self._running = False
        self._stack.close()


class _Outcome(Generic[T]):
    """What a call on the event loop came to: its value or its exception."""

    __slots__ = ("error", "task", "value")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.task: asyncio.Future[T] | None = None
        self.value: T

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value


def threadsafe_caller() -> Callable[[Callable[[], object]], object]:
    """A non-blocking way to run a callable on the current event loop from any thread."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    return asyncio.get_running_loop().call_soon_threadsafe
