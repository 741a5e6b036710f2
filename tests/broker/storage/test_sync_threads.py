"""The fsync threads (broker/storage/sync_threads.py) on both backends: a job's result
and its exception come back to the caller, jobs run side by side, a cancelled caller
still waits for its job (the file must not be closed under its sync), and idle
threads leave."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

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
