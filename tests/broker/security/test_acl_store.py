"""The durable ACL set without a broker (broker/security/acl_store.py on
broker/storage/record_log.py): CreateAcls and DeleteAcls answers, the file across
reopens, a torn last record, a request's changes all or none, storage failures,
compaction. Crash tests of the real process come with the wiring into the server."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from broker.security import (
    AclBinding,
    AclFilter,
    AclLog,
    AclLogError,
    AclStore,
    CreateResult,
    DeleteResult,
)
from protocol.errors import ErrorCode

OK = CreateResult(ErrorCode.NONE)


def acl(name: str, operation: str = "read", principal: str = "User:alice") -> AclBinding:
    return AclBinding("topic", name, "literal", principal, "*", operation, "allow")


A, B, C, D = acl("a"), acl("b"), acl("c"), acl("d")


def opened(data_dir: Path, **kwargs: Any) -> AclStore:
    store = AclStore(AclLog(data_dir, kwargs.pop("max_bytes", 4096)), **kwargs)
    store.load()
    return store


def run(step: Callable[[], Any], backend: str = "trio") -> Any:
    """The broker's default backend; the tests of threads and cancellation take both."""

    async def main() -> Any:
        return await step()

    return anyio.run(main, backend=backend)


def test_changes_survive_a_reopen_in_order(tmp_path: Path) -> None:
    store = opened(tmp_path, super_users=["User:root"])
    assert store.log.path == tmp_path / "security" / "acls.wal"
    assert run(lambda: store.create([A, B, C])) == [OK, OK, OK]
    deleted = run(lambda: store.delete([AclFilter(resource_name="b")]))
    assert deleted == [DeleteResult(ErrorCode.NONE, [B])]
    assert run(lambda: store.create([D, B])) == [OK, OK]
    store.close()
    again = opened(tmp_path, super_users=["User:root"])
    assert list(again.authorizer) == [A, C, D, B]
    assert again.authorizer.authorize("User:alice", "10.0.0.1", "read", "topic", "d")
    assert again.authorizer.authorize("User:root", "10.0.0.1", "alter", "cluster", "cluster")
    again.close()


def test_create_answers_each_entry(tmp_path: Path) -> None:
    store = opened(tmp_path, acls_max=3)
    assert run(lambda: store.create([A])) == [OK]
    size = store.log.size_bytes
    bad = A._replace(principal="alice")
    results = run(lambda: store.create([A, B, bad, B, C, D]))
    assert [r.error for r in results] == [
        ErrorCode.NONE,  # already in force
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NONE,  # named twice, written once
        ErrorCode.NONE,
        ErrorCode.POLICY_VIOLATION,  # the fourth binding, past acls_max
    ]
    assert results[2].message is not None and "User:<name>" in results[2].message
    assert results[5].message is not None and "acls_max" in results[5].message
    assert list(store.authorizer) == [A, B, C]
    grown = store.log.size_bytes
    assert run(lambda: store.create([A, B])) == [OK, OK]
    assert store.log.size_bytes == grown > size  # nothing new: nothing written
    store.close()


def test_delete_answers_each_filter_with_what_it_matched(tmp_path: Path) -> None:
    store = opened(tmp_path)
    run(lambda: store.create([A, B, C, acl("a", "write")]))
    size = store.log.size_bytes
    results = run(
        lambda: store.delete(
            [
                AclFilter(resource_name="a"),
                AclFilter(operation="read", resource_name="a"),
                AclFilter(resource_type="queue"),
                AclFilter(resource_name="zzz"),
            ]
        )
    )
    assert results == [
        DeleteResult(ErrorCode.NONE, [A, acl("a", "write")]),
        DeleteResult(ErrorCode.NONE, [A]),  # a binding two filters match is in both
        DeleteResult(ErrorCode.INVALID_REQUEST, []),
        DeleteResult(ErrorCode.NONE, []),
    ]
    assert list(store.authorizer) == [B, C]
    assert run(lambda: store.delete([AclFilter(resource_name="zzz")])) == [
        DeleteResult(ErrorCode.NONE, [])
    ]
    assert store.log.size_bytes > size
    store.close()


def _two_requests(tmp_path: Path) -> tuple[Path, int]:
    """A file of two requests, the second creating two bindings and deleting none; the
    size of the first record alone."""
    store = opened(tmp_path)
    run(lambda: store.create([A]))
    first = store.log.size_bytes
    run(lambda: store.create([B, C]))
    store.close()
    return store.log.path, first


@pytest.mark.parametrize("kept_bytes", [3, 8, 9, -1])
def test_a_torn_last_request_recovers_to_the_state_before_it_whole(
    tmp_path: Path, kept_bytes: int
) -> None:
    """The second request's record cut inside its head, after it, inside its body, and
    short of its last byte."""
    path, first = _two_requests(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: first + kept_bytes] if kept_bytes > 0 else data[:kept_bytes])
    store = opened(tmp_path)
    assert list(store.authorizer) == [A]  # neither B nor C: the request is all or none
    assert path.stat().st_size == first  # the torn tail is cut
    assert run(lambda: store.create([D])) == [OK]
    store.close()
    assert list(opened(tmp_path).authorizer) == [A, D]


def test_garbage_after_the_last_record_is_cut(tmp_path: Path) -> None:
    path, _ = _two_requests(tmp_path)
    whole = path.stat().st_size
    with path.open("ab") as f:
        f.write(b"\x00\x00\x00\x10garbage-of-a-torn-write")
    store = opened(tmp_path)
    assert list(store.authorizer) == [A, B, C]
    assert path.stat().st_size == whole
    store.close()


def test_damage_before_the_end_stops_the_load(tmp_path: Path) -> None:
    path, _ = _two_requests(tmp_path)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF  # inside the first record's body
    path.write_bytes(bytes(data))
    with pytest.raises(AclLogError, match=r"acls\.wal: record at byte 0"):
        opened(tmp_path)


def test_a_record_that_does_not_fit_the_bindings_stops_the_load(tmp_path: Path) -> None:
    log = AclLog(tmp_path)
    log.open(lambda body: None)
    log.append_now(["create", [list(A)]])
    log.append_now(["delete", [list(B)]])  # B was never created
    log.close()
    with pytest.raises(AclLogError, match=r"acls\.wal: .*not in force"):
        opened(tmp_path)


def test_a_failed_write_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = opened(tmp_path)
    run(lambda: store.create([A, B]))
    size = store.log.size_bytes

    def full(fd: int, data: Any, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    results = run(lambda: store.create([C, D, A]))
    assert [r.error for r in results] == [
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.NONE,  # in force before, and still
    ]
    assert results[0].message is not None and "No space left" in results[0].message
    deleted = run(lambda: store.delete([AclFilter(resource_name="a"), AclFilter(host="zz")]))
    assert deleted == [
        DeleteResult(ErrorCode.KAFKA_STORAGE_ERROR, []),
        DeleteResult(ErrorCode.INVALID_REQUEST, []),
    ]
    assert list(store.authorizer) == [A, B]
    monkeypatch.undo()
    assert store.log.size_bytes == size == store.log.path.stat().st_size
    assert run(lambda: store.create([C])) == [OK]  # the file is as it was: writes go on
    store.close()
    assert list(opened(tmp_path).authorizer) == [A, B, C]


def test_a_failed_fdatasync_stops_changes_until_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    store = opened(tmp_path)
    run(lambda: store.create([A]), backend)

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    results = run(lambda: store.create([B, C]), backend)
    assert {r.error for r in results} == {ErrorCode.KAFKA_STORAGE_ERROR}
    assert list(store.authorizer) == [A]
    monkeypatch.undo()
    later = run(lambda: store.create([D]), backend)
    assert later[0].error == ErrorCode.KAFKA_STORAGE_ERROR
    assert later[0].message is not None and "failed earlier" in later[0].message
    deleted = run(lambda: store.delete([AclFilter()]), backend)
    assert deleted[0].error == ErrorCode.KAFKA_STORAGE_ERROR
    store.close()
    # Whether the unsynced record reached the disk is the kernel's business; here it did.
    again = opened(tmp_path)
    assert list(again.authorizer) == [A, B, C]
    assert run(lambda: again.create([D]), backend) == [OK]
    again.close()


def test_compaction_keeps_the_set_and_bounds_the_file(tmp_path: Path) -> None:
    store = opened(tmp_path, max_bytes=4096)
    keep = [acl(f"keep-{i}") for i in range(20)]
    run(lambda: store.create(keep))
    churn = [acl(f"churn-{i}", "write", f"User:{i}") for i in range(10)]
    largest = 0
    for _ in range(100):
        run(lambda: store.create(churn))
        run(lambda: store.delete([AclFilter(operation="write")]))
        largest = max(largest, store.log.size_bytes)
    assert largest <= 4096 + 1024  # compacted once past max_bytes, not after
    assert list(store.authorizer) == keep
    store.close()
    again = opened(tmp_path, max_bytes=4096)
    assert list(again.authorizer) == keep
    again.close()


def test_a_file_grown_past_the_set_is_compacted_on_load(tmp_path: Path) -> None:
    store = opened(tmp_path, max_bytes=1 << 20)  # no compaction while running
    run(lambda: store.create([A, B]))
    for _ in range(200):
        run(lambda: store.create([C, D]))
        run(lambda: store.delete([AclFilter(resource_name="c"), AclFilter(resource_name="d")]))
    store.close()
    grown = store.log.path.stat().st_size
    again = opened(tmp_path, max_bytes=1024)
    assert list(again.authorizer) == [A, B]
    assert again.log.path.stat().st_size < 200 < grown
    again.close()


def test_a_cancelled_request_still_installs_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A client gone while its record syncs: memory must still hold what the file holds,
    or the next request could write a record that replays as damage."""
    store = opened(tmp_path)
    synced = os.fdatasync

    def slow(fd: int) -> None:
        time.sleep(0.2)
        synced(fd)

    monkeypatch.setattr(os, "fdatasync", slow)

    async def main() -> None:
        with anyio.move_on_after(0.05):
            await store.create([A])
        assert A in store.authorizer
        assert await store.create([A]) == [OK]

    anyio.run(main, backend=backend)
    store.close()
    assert list(opened(tmp_path).authorizer) == [A]
