"""fdatasync off the event loop, in threads that wake the loop with its own call.

`anyio.to_thread.run_sync` costs about 200 µs a round trip on trio here and 120
on asyncio (its thread cache, an outcome, a copied context, the loop's wake-up);
a thread waiting on a queue that hands its result back with the backend's own
thread-safe call costs about 130 and 75 (docs/benchmark-notes.md, "Where a
commit's time goes"). Every durable write pays a round trip per fsync round, so
the group commit and the record logs hand their syncs over here. The threads are
shared by every caller of the process and leave after `IDLE_S` without work, so
a process that opens many logs does not keep a thread per log.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import sniffio

T = TypeVar("T")

IDLE_S = 10.0

CallSoon = Callable[[Callable[[], object]], object]
# (function, its arguments, the caller's loop's thread-safe call, the outcome's slot,
# the caller's event's set).
_Job = tuple[Callable[..., Any], tuple[Any, ...], CallSoon, list[Any], Callable[[], object]]

_jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
_lock = threading.Lock()
_idle = 0


async def run_sync(func: Callable[..., T], *args: Any) -> T:
    """`func(*args)` in a worker thread; its result, or its exception raised here. Not
    cancellable, as `anyio.to_thread.run_sync` is not: a sync of a file must end
    before the caller may close it."""
    global _idle
    done = anyio.Event()
    outcome: list[Any] = []
    with _lock:
        start = _idle == 0
        if not start:
            _idle -= 1
    if start:
        threading.Thread(target=_work, name="minibroker-sync", daemon=True).start()
    _jobs.put((func, args, _call_soon(), outcome, done.set))
    with anyio.CancelScope(shield=True):
        await done.wait()
    ok, value = outcome
    if not ok:
        raise value
    return value


def _call_soon() -> CallSoon:
    """The running loop's way to have a function called on it from another thread."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    return asyncio.get_running_loop().call_soon_threadsafe


def _work() -> None:
    global _idle
    while True:
        try:
            func, args, call_soon, outcome, finished = _jobs.get(timeout=IDLE_S)
        except queue.Empty:
            with _lock:
                if _idle > 0 and _jobs.empty():
                    _idle -= 1
                    return
            continue
        try:
            outcome += (True, func(*args))
        except BaseException as exc:  # handed to the caller, who raises it
            outcome += (False, exc)
        with _lock:
            _idle += 1
        # Should the caller's loop have ended, no one waits.
        with contextlib.suppress(Exception):
            call_soon(finished)
