"""fdatasync off the event loop, in threads that wake the loop without costing it turns.

`fdatasync_each` hands a round's files to C threads (broker/storage/_fdatasync_fast.c)
that sync them and add to an eventfd the loop waits on, neither step taking the GIL;
a Python thread pays a GIL hand-over each way, about 0.1 ms of each fsync round
(docs/benchmark-notes.md, "The fsync hand-over in C"). Where the extension did not
build, or a test replaced `os.fdatasync`, the syncs run in Python threads through
`run_sync`, the reference: a thread waiting on a queue that hands its result back with
the backend's own thread-safe call, about 130 µs a round trip on trio and 75 on asyncio
against `anyio.to_thread.run_sync`'s 200 and 120 ("Where a commit's time goes"). Both
kinds of thread are shared by every caller of the process; the Python ones leave after
`IDLE_S` without work, so a process that opens many logs does not keep a thread per log.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import sniffio

try:
    from broker.storage import _fdatasync_fast
except ImportError:  # the optional extension did not build: Python threads sync
    _fdatasync_fast = None  # type: ignore[assignment]

T = TypeVar("T")

# The C threads call the real fdatasync: a test that replaces it gets Python's threads.
_FDATASYNC = os.fdatasync

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


async def fdatasync_each(fds: Sequence[int]) -> tuple[int, ...]:
    """fdatasync each of `fds` in order, off the event loop: each call's errno, 0 where
    it succeeded. Not cancellable, as `run_sync` is not."""
    job = waker = None
    if (
        _fdatasync_fast is not None
        and os.fdatasync is _FDATASYNC
        and len(fds) <= _fdatasync_fast.FDS_MAX
    ):
        # No eventfd or no C thread to be had (EMFILE, EAGAIN) is not a failed sync:
        # Python's threads sync instead.
        with contextlib.suppress(OSError):
            waker = _waker()
            job = None if waker is None else _fdatasync_fast.submit(waker.fd, fds)
    if job is None or waker is None:
        return await run_sync(_fdatasync_each, fds)
    done = anyio.Event()
    waker.pending.append((job, done.set))
    with anyio.CancelScope(shield=True):
        await done.wait()
    return job.errors


def _fdatasync_each(fds: Sequence[int]) -> tuple[int, ...]:
    """fdatasync_each's reference, for a Python thread."""
    errors = []
    for fd in fds:
        try:
            os.fdatasync(fd)
        except OSError as exc:
            errors.append(exc.errno or errno.EIO)
        else:
            errors.append(0)
    return tuple(errors)


# Eventfds of event loops that ended, for the next ones: never closed, since a C thread
# may still add to one (it only wakes its next loop once, for nothing).
_spare_eventfds: list[int] = []


class _Waker:
    """One event loop's end of the C threads: the eventfd it waits readable on and the
    jobs it waits for, each with what to call when it ends."""

    def __init__(self) -> None:
        try:
            self.fd = _spare_eventfds.pop()
        except IndexError:
            self.fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.pending: list[tuple[Any, Callable[[], object]]] = []
        self.closed = False
        self._pid = os.getpid()

    def reap(self) -> None:
        """Call the ends of the jobs done. The count is read first: a job marks itself
        done before it adds to it, so one that ends after the read wakes us again."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)
        waiting = []
        for job, finished in self.pending:
            if job.done:
                finished()
            else:
                waiting.append((job, finished))
        self.pending = waiting

    def retire(self) -> None:
        # Not in a forked child (a parent's loop collected there): the fd is shared.
        if os.getpid() == self._pid:
            _spare_eventfds.append(self.fd)


_asyncio_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waker] = (
    weakref.WeakKeyDictionary()
)
_trio_waker: Any = None  # a trio.lowlevel.RunVar, made on trio's first use


def _waker() -> _Waker | None:
    """The running loop's waker, made and watched on its first use; None once its
    watcher has ended (a trio run shutting down)."""
    global _trio_waker
    if sniffio.current_async_library() == "trio":
        import trio

        if _trio_waker is None:
            _trio_waker = trio.lowlevel.RunVar("minibroker_fdatasync_waker")
        try:
            waker: _Waker = _trio_waker.get()
        except LookupError:
            waker = _Waker()
            _trio_waker.set(waker)
            trio.lowlevel.spawn_system_task(_watch_on_trio, waker, name="minibroker-fdatasync")
        return None if waker.closed else waker
    loop = asyncio.get_running_loop()
    found = _asyncio_wakers.get(loop)
    if found is None:
        found = _asyncio_wakers[loop] = _Waker()
        loop.add_reader(found.fd, found.reap)
        weakref.finalize(loop, found.retire)
    return found


async def _watch_on_trio(waker: _Waker) -> None:
    import trio

    try:
        while True:
            await trio.lowlevel.wait_readable(waker.fd)
            waker.reap()
    finally:
        # The run is ending: later callers (a system task's shielded sync) use Python's
        # threads, and the jobs already given end before the eventfd goes.
        waker.closed = True
        with trio.CancelScope(shield=True):
            while waker.pending:
                await trio.lowlevel.wait_readable(waker.fd)
                waker.reap()
        waker.retire()


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads, and shares its parent's spare
    eventfds, where a loop of each would read the other's wake-ups: the child starts
    its own threads and its loops make their own eventfds."""
    global _trio_waker, _jobs, _lock, _idle
    _jobs, _lock, _idle = queue.SimpleQueue(), threading.Lock(), 0
    for fd in _spare_eventfds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _spare_eventfds.clear()
    _asyncio_wakers.clear()
    _trio_waker = None


os.register_at_fork(after_in_child=_forget_after_fork)
