"""Ctrl-C for the command-line tools' loops, as a flag rather than an exception."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def ctrl_c() -> Iterator[threading.Event]:
    """Ctrl-C sets the event, which the loop looks at, instead of raising
    KeyboardInterrupt wherever the main thread is: raised inside the client (between a
    lock's acquire and the block that releases it, or while the caller runs a callback
    the event loop handed it), it left the client waiting for ever, and the tool did not
    exit. Off the main thread, where no handler can be set, the event stays clear."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
