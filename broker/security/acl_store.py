"""The durable ACL set, `<data_dir>/security/acls.wal`: CreateAcls and DeleteAcls
(docs/protocol.md section 7, "Authorization").

The bindings, their index and their records are pure (broker/security/acl.py); this
module orders the IO around them. The file is a record log
(broker/storage/record_log.py: CRC-framed records, fdatasync in a worker thread,
torn-tail recovery, atomic rewrite) holding one record per request that changed
something, so a request's changes are all in force after a crash or none are. A
record is written and fdatasynced before it is installed in memory and answered, and
one lock serialises the changes from the judgement to the install: the limit and
the duplicate checks must see every change before them, and ACL changes are rare.

When the file has grown past `max_bytes` and twice the bytes of the bindings in
force, it is rewritten with the bindings in force alone (compaction).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import msgpack

from broker.crash_points import crash_point
from broker.security.acl import (
    AclBinding,
    AclFilter,
    AclRecordError,
    Authorizer,
    create_record,
    delete_record,
    validate,
    validate_filter,
)
from broker.storage import RecordLog, RecordLogError
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")

DIRECTORY = "security"
FILE = "acls.wal"
ACLS_MAX = 100_000
"""Bindings in force at most: each costs memory and a share of every compaction."""
LOG_BYTES_MAX = 1024 * 1024
"""The size below which the file is never compacted."""


class AclLogError(RecordLogError):
    """The ACL log is damaged before its end; the broker will not start on it."""


class AclLog(RecordLog):
    error = AclLogError
    failure_event = "acl_log"

    def __init__(self, data_dir: Path, max_bytes: int = LOG_BYTES_MAX) -> None:
        super().__init__(data_dir / DIRECTORY, FILE, max_bytes)


class CreateResult(NamedTuple):
    """One creation's answer: NONE once the binding is durably in force."""

    error: ErrorCode
    message: str | None = None


class DeleteResult(NamedTuple):
    """One filter's answer: the bindings it took out of force."""

    error: ErrorCode
    deleted: list[AclBinding]


_CREATED = CreateResult(ErrorCode.NONE)


def _binding_bytes(binding: AclBinding) -> int:
    """What the binding takes in a compacted file."""
    return len(msgpack.packb(list(binding), use_bin_type=True))


class AclStore:
    def __init__(
        self, acl_log: AclLog, super_users: Iterable[str] = (), acls_max: int = ACLS_MAX
    ) -> None:
        assert acls_max > 0
        self.log = acl_log
        self.acls_max = acls_max
        self.authorizer = Authorizer(super_users)
        self._lock = anyio.Lock()
        self._live_bytes = 0  # of the bindings in force, as compaction writes them

    def load(self) -> None:
        """Read the log into memory, compacting it when due (AclLogError when it is damaged)."""
        records = self.log.open(self._replay)
        self._live_bytes = sum(_binding_bytes(b) for b in self.authorizer)
        log.info("event=acls_loaded bindings=%d records=%d", len(self.authorizer), records)
        if self._wants_compaction():
            self.log.compact_or_refuse(list(self.authorizer.snapshot()))

    def _replay(self, body: Any) -> None:
        try:
            self.authorizer.apply(body)
        except AclRecordError as exc:
            raise AclLogError(f"{self.log.path}: {exc}") from exc

    # ------------------------------------------------------------------ CreateAcls

    async def create(self, bindings: Sequence[AclBinding]) -> list[CreateResult]:
        """Put the valid `bindings` in force, durably, all or none: one result per binding.
        A binding already in force (or named twice) is answered NONE and written once; an
        invalid one INVALID_REQUEST; one past `acls_max` POLICY_VIOLATION."""
        results: list[CreateResult | None] = [None] * len(bindings)
        async with self._lock:
            waiting: dict[AclBinding, list[int]] = {}  # new binding -> the entries naming it
            for i, binding in enumerate(bindings):
                reason = validate(binding)
                if reason is not None:
                    results[i] = CreateResult(ErrorCode.INVALID_REQUEST, reason)
                elif binding in waiting:
                    waiting[binding].append(i)
                elif binding in self.authorizer:
                    results[i] = _CREATED
                elif len(self.authorizer) + len(waiting) >= self.acls_max:
                    results[i] = CreateResult(
                        ErrorCode.POLICY_VIOLATION,
                        f"acls_max is reached: {self.acls_max} bindings are in force",
                    )
                else:
                    waiting[binding] = [i]
            if waiting:
                failure = await self._write(create_record(waiting), list(waiting), [])
                if failure is not None:
                    for i in (i for entries in waiting.values() for i in entries):
                        results[i] = CreateResult(ErrorCode.KAFKA_STORAGE_ERROR, failure)
        return [_CREATED if r is None else r for r in results]

    # ------------------------------------------------------------------ DeleteAcls

    async def delete(self, filters: Sequence[AclFilter]) -> list[DeleteResult]:
        """Take every binding a valid filter matches out of force, durably, all or none:
        one result per filter, with the bindings it matched (a binding two filters match
        is in both). An invalid filter is answered INVALID_REQUEST and deletes nothing."""
        results: list[DeleteResult] = []
        async with self._lock:
            doomed: dict[AclBinding, None] = {}
            for acl_filter in filters:
                if validate_filter(acl_filter) is not None:
                    results.append(DeleteResult(ErrorCode.INVALID_REQUEST, []))
                    continue
                matched = self.authorizer.describe(acl_filter)
                doomed.update(dict.fromkeys(matched))
                results.append(DeleteResult(ErrorCode.NONE, matched))
            if doomed:
                failure = await self._write(delete_record(doomed), [], list(doomed))
                if failure is not None:
                    results = [
                        DeleteResult(ErrorCode.KAFKA_STORAGE_ERROR, [])
                        if r.error == ErrorCode.NONE
                        else r
                        for r in results
                    ]
        return results

    # ------------------------------------------------------------------ the log

    async def _write(
        self, record: list[Any], created: list[AclBinding], deleted: list[AclBinding]
    ) -> str | None:
        """Write `record` (creating and deleting those bindings), wait until it is durable,
        install it, compact when due; under the lock. The reason when it could not be
        written: then nothing changed. After a failed fdatasync the file's state is
        unknown (and after a failed compaction, the file handle's), so the log takes no
        more changes until a restart reads the file again (RecordLog.failure_event)."""
        # A record written must be installed, or memory would lag the file and the next
        # change could write a record that replays as damage. RecordLog waits for its
        # fdatasync thread without a checkpoint today; the shield makes it this code's
        # promise rather than a detail of RecordLog's.
        with anyio.CancelScope(shield=True):
            try:
                end = self.log.write(record)
            except OSError as exc:
                return f"acl log: {exc}"  # the file is as it was
            crash_point("acl_record_written")
            try:
                await self.log.durable_or_refuse(end)
            except OSError as exc:
                return f"acl log: {exc}"
            crash_point("acl_record_durable")
            self.authorizer.apply(record)
            self._live_bytes += sum(map(_binding_bytes, created))
            self._live_bytes -= sum(map(_binding_bytes, deleted))
            assert self._live_bytes >= 0
            log.info(
                "event=acls_changed created=%d deleted=%d bindings=%d",
                len(created),
                len(deleted),
                len(self.authorizer),
            )
            if self._wants_compaction():
                snapshot = list(self.authorizer.snapshot())
                await anyio.to_thread.run_sync(self.log.compact_or_refuse, snapshot)
        return None

    def _wants_compaction(self) -> bool:
        return self.log.size_bytes > max(self.log.max_bytes, 2 * self._live_bytes)

    def close(self) -> None:
        self.log.close()
