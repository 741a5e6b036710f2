"""The fsync threads (broker/storage/sync_threads.py) on both backends: a job's result
and its exception come back to the caller, jobs run side by side, a cancelled caller
still waits for its job (the file must not be closed under its sync), and idle
threads leave; the C threads (broker/storage/_fdatasync_fast.c) answer as the Python
reference does, for many callers at once."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import select
import threading
import time
from pathlib import Path

import anyio
import pytest
import sniffio
import trio

from broker.storage import sync_threads


def _run(backend: str, main: object) -> None:
    options = {"use_uvloop": True} if backend == "asyncio" else {}
    anyio.run(main, backend=backend, backend_options=options)  # type: ignore[arg-type]


def test_result_and_exception_come_back(backend: str) -> None:
    async def main() -> None:
        a, b, ident = await sync_threads.run_sync(lambda a, b: (a, b, threading.get_ident()), 1, 2)
        assert (a, b) == (1, 2) and ident != threading.get_ident()
        with pytest.raises(OSError, match="injected"):
            await sync_threads.run_sync(_raise, OSError("injected"))

    _run(backend, main)


def _raise(exc: BaseException) -> None:
    raise exc


def test_jobs_run_side_by_side(backend: str) -> None:
    """Two jobs that each wait for the other: they finish only if both run at once (a
    round of the group commit and a txn.wal sync do)."""
    barrier = threading.Barrier(2, timeout=10)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(sync_threads.run_sync, barrier.wait)

    _run(backend, main)


def test_a_cancelled_caller_waits_for_its_job(backend: str) -> None:
    release = threading.Event()
    ended: list[float] = []

    def job() -> None:
        release.wait(10)
        ended.append(time.monotonic())

    async def main() -> None:
        with anyio.move_on_after(0.05) as scope:
            threading.Timer(0.3, release.set).start()
            await sync_threads.run_sync(job)
        returned = time.monotonic()
        assert scope.cancel_called  # the deadline passed while the job ran
        assert ended and ended[0] <= returned

    _run(backend, main)


def test_idle_threads_leave(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_threads, "IDLE_S", 0.05)

    async def main() -> None:
        ident = await sync_threads.run_sync(threading.get_ident)
        deadline = time.monotonic() + 10
        while any(t.ident == ident for t in threading.enumerate()):
            assert time.monotonic() < deadline, "an idle sync thread stayed"
            await anyio.sleep(0.05)
        assert await sync_threads.run_sync(lambda: 7) == 7  # a new one starts

    _run(backend, main)


def _files(tmp_path: Path) -> tuple[list[int], list[int]]:
    """A written file, a pipe's end (EINVAL), a descriptor never opened (EBADF), the file
    again: what to sync, and the descriptors to close after."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"x" * 4096)
    r, w = os.pipe()
    never_opened = 999_999  # above this process's descriptor limit
    return [fd, r, never_opened, fd], [fd, r, w]


def test_the_c_threads_answer_as_the_python_reference_does(backend: str, tmp_path: Path) -> None:
    """A differential test: each fd's errno from the C threads equals the reference's,
    and the C path was the one taken (the loop's waker exists)."""
    fast = pytest.importorskip("broker.storage._fdatasync_fast")
    assert fast is sync_threads._fdatasync_fast
    fds, to_close = _files(tmp_path)
    expected = (0, errno.EINVAL, errno.EBADF, 0)

    async def main() -> None:
        assert not _has_waker()
        assert sync_threads._fdatasync_each(fds) == expected
        assert await sync_threads.fdatasync_each(fds) == expected
        assert _has_waker()

    try:
        _run(backend, main)
    finally:
        for fd in to_close:
            os.close(fd)


def _has_waker() -> bool:
    """Whether the running loop has a waker for the C threads (without making one)."""
    if sniffio.current_async_library() == "trio":
        var = sync_threads._trio_waker
        return var is not None and var.get(None) is not None
    return asyncio.get_running_loop() in sync_threads._asyncio_wakers


def test_many_jobs_at_once_each_get_their_own_answer(backend: str, tmp_path: Path) -> None:
    """Forty callers at once on four C threads: each gets its own fds' errnos, however
    the threads' ends fold into one wake-up of the loop."""
    fds, to_close = _files(tmp_path)
    answers: dict[int, tuple[int, ...]] = {}

    async def one(i: int) -> None:
        answers[i] = await sync_threads.fdatasync_each(fds[i % 4 :])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)

    try:
        for _ in range(2):  # the second run's loop may take the first one's eventfd
            answers.clear()
            _run(backend, main)
            expected = (0, errno.EINVAL, errno.EBADF, 0)
            assert answers == {i: expected[i % 4 :] for i in range(40)}
    finally:
        for fd in to_close:
            os.close(fd)


def test_a_replaced_fdatasync_runs_in_python_threads(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that injects a failure by replacing os.fdatasync gets it called (the C
    threads could not call it)."""
    seen: list[int] = []

    def broken(fd: int) -> None:
        seen.append(fd)
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fdatasync", broken)

    async def main() -> None:
        assert await sync_threads.fdatasync_each([7, 8]) == (errno.EIO, errno.EIO)

    _run(backend, main)
    assert seen == [7, 8]


def test_a_cancelled_caller_waits_for_its_c_job(backend: str, tmp_path: Path) -> None:
    """The C path is not cancellable either: a caller cancelled before it asks still
    waits for the sync's answer (the file must not be closed under its sync)."""
    pytest.importorskip("broker.storage._fdatasync_fast")
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"x" * 4096)
    answers: list[tuple[int, ...]] = []

    async def main() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()
            answers.append(await sync_threads.fdatasync_each([fd]))
        assert scope.cancel_called

    try:
        _run(backend, main)
    finally:
        os.close(fd)
    assert answers == [(0,)]


def test_a_sync_asked_while_a_trio_run_ends_is_answered(tmp_path: Path) -> None:
    """A system task's shielded sync in its `finally`, asked once the run's waker has
    gone (its eventfd back among the spares): Python's threads answer it, where the
    ended waker would have waited for ever. Run in a thread, so a hang fails."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    answers: list[tuple[int, ...]] = []

    async def late(waker_fd: int) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                while waker_fd not in sync_threads._spare_eventfds:
                    await trio.sleep(0.001)
                answers.append(await sync_threads.fdatasync_each([fd]))

    async def main() -> None:
        await sync_threads.fdatasync_each([fd])  # the run's waker and its watcher
        waker = sync_threads._waker()
        assert waker is not None
        trio.lowlevel.spawn_system_task(late, waker.fd)

    runner = threading.Thread(target=trio.run, args=(main,), daemon=True)
    try:
        runner.start()
        runner.join(30)
    finally:
        os.close(fd)
    assert not runner.is_alive(), "the late sync was never answered"
    assert answers == [(0,)]


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_forked_child_and_its_parent_each_get_their_answers(
    tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a fork, a child's loop that waits on its own eventfd while the parent's loop
    syncs: the child made its own (sharing the parent's spare, it would have read the
    parent's wake-ups, leaving a parent's sync unanswered for ever). On the Python path
    the child starts its own thread (counting the parent's idle ones, it waited for ever)."""
    pytest.importorskip("broker.storage._fdatasync_fast")
    if path == "python":
        real = os.fdatasync
        monkeypatch.setattr(os, "fdatasync", lambda fd: real(fd))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    read_end, write_end = os.pipe()

    async def syncs(count: int) -> None:
        for _ in range(count):
            assert await sync_threads.fdatasync_each([fd]) == (0,)

    async def child() -> None:
        await syncs(1)
        os.write(write_end, b"r")  # ready: its watcher waits on its eventfd from now on
        await trio.sleep(5)

    trio.run(syncs, 1)  # leaves a spare eventfd behind
    pid = os.fork()
    if pid == 0:
        try:
            trio.run(child)
        finally:
            os._exit(0)
    try:
        ready, _, _ = select.select([read_end], [], [], 30)
        assert ready, "the child's sync was never answered"
        runner = threading.Thread(target=trio.run, args=(syncs, 200), daemon=True)
        runner.start()
        runner.join(30)
        assert not runner.is_alive(), "a parent's sync was never answered"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        for each in (fd, read_end, write_end):
            os.close(each)


def test_a_forked_child_keeps_no_eventfd_of_its_parents_loops(tmp_path: Path) -> None:
    """A parent's ended loop collected in a forked child gives the child no spare: the
    eventfd is the parent's too."""
    pytest.importorskip("broker.storage._fdatasync_fast")
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(sync_threads.fdatasync_each([fd])) == (0,)
        shared = sync_threads._asyncio_wakers[loop].fd
    finally:
        loop.close()
        os.close(fd)
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            del loop
            gc.collect()
            code = 1 if shared in sync_threads._spare_eventfds else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    del loop
    gc.collect()
    assert shared in sync_threads._spare_eventfds  # the parent's own to use again
