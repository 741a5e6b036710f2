"""What the fetcher tests for both batch formats share: stored batches and a scenario."""

from __future__ import annotations

import struct
from collections.abc import Callable

from client.fetcher import FetchedRecords
from protocol.batch import CONTROL_ABORT, CONTROL_COMMIT
from protocol.messages import AbortedTransaction


def at(offset: int, batch: bytes) -> bytes:
    """`batch` as the broker stores it: base_offset stamped."""
    buf = bytearray(batch)
    struct.pack_into(">q", buf, 0, offset)
    return bytes(buf)


def take_all(fetched: FetchedRecords, step: int = 1000) -> list:
    """Every record `fetched` hands out, `step` at a time."""
    out = []
    while records := fetched.take(step):
        out += records
    return out


def check_aborted_transaction_skipped(
    txn: Callable[[int, int, list[bytes]], bytes],
    marker: Callable[[int, int, int], bytes],
    step: int = 1000,
) -> None:
    """Producer 1 aborts a transaction and commits a later one, producer 2 commits one
    between; `txn(offset, pid, values)` and `marker(offset, pid, kind)` make the stored
    batches. read_committed hands out the committed values only, the default all four."""
    data = (
        txn(0, 1, [b"aborted-1", b"aborted-2"])
        + txn(2, 2, [b"committed"])
        + marker(3, 1, CONTROL_ABORT)
        + marker(4, 2, CONTROL_COMMIT)
        + txn(5, 1, [b"later-committed"])
        + marker(6, 1, CONTROL_COMMIT)
    )
    aborted = [AbortedTransaction(producer_id=1, first_offset=0)]
    committed = FetchedRecords("t", 0, data, 0, aborted_transactions=aborted, read_committed=True)
    assert [r.value for r in take_all(committed, step)] == [b"committed", b"later-committed"]
    assert committed.position == 7
    uncommitted = FetchedRecords("t", 0, data, 0, aborted_transactions=aborted)
    assert [r.offset for r in take_all(uncommitted, step)] == [0, 1, 2, 5]
