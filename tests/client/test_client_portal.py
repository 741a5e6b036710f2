"""PortalThread: how the sync faces cross to their event loop (client/_portal.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import pytest
import sniffio
import trio

from client._portal import PortalThread


@pytest.fixture
def thread() -> Iterator[PortalThread]:
    portal = PortalThread("test-portal")
    yield portal
    portal.close()


async def _twice(value: int) -> int:
    await anyio.sleep(0)
    return 2 * value


async def _fails() -> None:
    await anyio.sleep(0)
    raise ValueError("from the loop")


def test_call_returns_the_result_or_raises_the_error(thread: PortalThread) -> None:
    assert thread.call(_twice, 21) == 42
    with pytest.raises(ValueError, match="from the loop"):
        thread.call(_fails)
    # A plain function runs on the loop's thread, not the caller's.
    assert thread.call(threading.get_ident) != threading.get_ident()


def test_a_call_from_inside_a_trio_program_runs_on_asyncio(thread: PortalThread) -> None:
    """The caller's context does not reach the loop: what a plain function builds there
    (the faces build their cores so) belongs to the loop's asyncio."""

    async def caller() -> str:
        event = thread.call(anyio.Event)
        await trio.lowlevel.checkpoint()
        thread.call(event.set)  # an asyncio event: set on its own loop
        assert thread.call(event.wait) is None
        return thread.call(sniffio.current_async_library)

    assert trio.run(caller) == "asyncio"


def test_call_refuses_the_loops_own_thread_and_a_closed_portal(thread: PortalThread) -> None:
    async def inner() -> None:
        thread.call(_twice, 1)

    with pytest.raises(RuntimeError, match="event loop thread"):
        thread.call(inner)
    thread.close()
    with pytest.raises(RuntimeError, match="not running"):
        thread.call(_twice, 1)
