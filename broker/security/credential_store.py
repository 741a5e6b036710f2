"""SCRAM credentials on disk: `<data_dir>/security/credentials.wal` (docs/protocol.md
section 7, "SCRAM credentials").

The state and its records are pure (broker/security/credentials.py); this module
orders the IO around them. A record log (broker/storage/record_log.py: CRC-framed
records, group fdatasync, a torn last record cut on open, compaction) holds them;
every change is written and fdatasynced before it is applied and answered, and
one request at a time is judged, written and applied, so memory always holds
what replaying the file gives. The first record of a new file is the mock secret
that unknown users' credentials are made from: kept, so that an unknown user
looks the same across restarts too.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from broker.security.credentials import (
    SECRET_BYTES,
    CredentialState,
    CredentialStateError,
    alter,
    bootstrap_record,
    describe,
    parse_bootstrap_users,
    secret_record,
)
from broker.security.scram import ScramCredential
from broker.storage import RecordLog, RecordLogError
from protocol import messages as m

log = logging.getLogger(f"minibroker.{__name__}")

DIRECTORY = "security"
FILE = "credentials.wal"
LOG_MAX_BYTES = 1024 * 1024
"""Past this (and twice its last compacted size) the file is rewritten as the state."""
BOOTSTRAP_ENV = "MINIBROKER_BOOTSTRAP_USERS"


class CredentialLogError(RecordLogError):
    """The credentials log is damaged before its end; the broker will not start on it."""


class CredentialLog(RecordLog):
    error = CredentialLogError
    failure_event = "credentials"

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir / DIRECTORY, FILE, LOG_MAX_BYTES)


class CredentialStore:
    """The broker's SCRAM credentials: look-ups for authentication, the two admin APIs,
    and the bootstrap users."""

    def __init__(self, data_dir: Path) -> None:
        self.log = CredentialLog(data_dir)
        self.state = CredentialState()
        self._lock = anyio.Lock()

    def open(self) -> None:
        """Read the file (cutting a torn tail) and, for a new one, write the mock secret.
        Before serving: blocks on fdatasync."""
        # The keys allow a dictionary attack on the passwords: no one but the broker's
        # user may read them, whatever the umask.
        self.log.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.log.directory.chmod(0o700)
        self.log.open(self._replay)
        if self.state.mock_secret is None:
            self._write_now(secret_record(secrets.token_bytes(SECRET_BYTES)))
        log.info("event=credentials_opened path=%s users=%d", self.log.path, len(self.state.users))

    def close(self) -> None:
        self.log.close()

    @property
    def mock_secret(self) -> bytes:
        assert self.state.mock_secret is not None, "open() first"
        return self.state.mock_secret

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        """A scram.CredentialLookup over the store: safe from a worker thread."""
        return self.state.lookup(user, mechanism)

    def bootstrap(self, environ: Mapping[str, str]) -> list[str]:
        """Create the users of MINIBROKER_BOOTSTRAP_USERS when the store holds none; the
        names created (none when the store had users or the variable is unset). Before
        serving: blocks on Hi and fdatasync. BootstrapError for a bad value, naming
        the entry and never a password."""
        if self.state.users:
            return []
        users = parse_bootstrap_users(environ.get(BOOTSTRAP_ENV, ""))
        if not users:
            return []
        self._write_now(bootstrap_record(users))
        names = [u.user for u in users]
        log.info("event=credentials_bootstrapped users=%r", names)
        return names

    def describe(
        self, request: m.DescribeUserScramCredentialsRequest
    ) -> m.DescribeUserScramCredentialsResponse:
        return m.DescribeUserScramCredentialsResponse(results=describe(self.state, request.users))

    async def alter(
        self, request: m.AlterUserScramCredentialsRequest
    ) -> m.AlterUserScramCredentialsResponse:
        """Judge, write durably, apply, answer: one request at a time. OSError when the
        record could not be made durable; then nothing changed."""
        async with self._lock:
            results, record = alter(self.state, request.deletions, request.upsertions)
            if record is not None:
                await self._write_durably(record)
                if self.log.wants_compaction():
                    # Every record written is applied (writes hold the lock until then),
                    # so the old file may go.
                    self.log.compact_or_refuse(self.state.snapshot())
        changed = [r.user for r in results if r.error == 0]
        if changed:
            log.info("event=credentials_altered users=%r", changed)
        return m.AlterUserScramCredentialsResponse(results=results)

    def _replay(self, record: Any) -> None:
        try:
            self.state.apply(record)
        except CredentialStateError as exc:
            raise CredentialLogError(f"{self.log.path}: {exc}") from exc

    def _write_now(self, record: list[Any]) -> None:
        self.log.append_now(record)
        self.state.apply(record)

    async def _write_durably(self, record: list[Any]) -> None:
        """Write `record`, wait until it is durable, apply it. A failed write leaves the
        file as it was; after a failed fdatasync the file's state is unknown, so the
        log takes no more writes until a restart reads it again (RecordLog.failure_event)."""
        await self.log.durable_or_refuse(self.log.write(record))
        self.state.apply(record)
