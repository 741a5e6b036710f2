"""The writers' transactions: one per task attempt, ended by the driver all at once.

Each task attempt writes in its own transaction, named `<prefix>.p<partition>.a<attempt>`,
so attempts never fence each other, and prepares it instead of committing: the
handle goes to the driver in the commit message. The driver then ends the write:

- commit: one CommitTxns makes the winning attempts visible and records the write's
  app version in the same durable decision (a retried commit answers
  `already_committed` and commits nothing twice); then every other transaction of
  the write still open (failed attempts, losing speculative copies) is aborted.
- abort: the app version is recorded as finished first, then every open
  transaction of the write is aborted.

Recording first is what closes the race with tasks Spark leaves running after the
job has ended: their PrepareTxn names the same app version, which the broker then
refuses, aborting the transaction (docs/transactions.md, "PrepareTxn"), so no
transaction of an ended write waits for its prepared timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from client import TxnHandle
    from client.admin import Bootstrap

log = logging.getLogger(f"minibroker.{__name__}")

# Transactions can appear while the driver sweeps (tasks still running): look again,
# a bounded number of times; what is left is aborted by the broker's timeouts.
SWEEP_ROUNDS = 5


def transactional_id(prefix: str, partition: int, attempt: int) -> str:
    return f"{prefix}.p{partition}.a{attempt}"


def sweep_prefix(prefix: str) -> str:
    """What every transactional id of the write starts with, and no other write's."""
    return prefix + "."


@dataclass(frozen=True)
class Ended:
    """How ending a write went: `already` when its app version had been recorded before
    (a retried commit), `aborted` the other transactions of the write aborted."""

    already: bool
    aborted: int


def commit(
    bootstrap: Bootstrap,
    prefix: str,
    handles: Sequence[TxnHandle],
    app_id: str,
    app_version: int,
) -> Ended:
    """Commit the winners' transactions under (app_id, app_version), then abort the rest.

    Raises CommitTxnsError when nothing could be committed (Spark then calls abort)."""
    from client.admin import commit_transactions

    result = commit_transactions(bootstrap, handles, app_id=app_id, app_version=app_version)
    return Ended(result.already_committed, abort_open(bootstrap, prefix))


def abort(
    bootstrap: Bootstrap, prefix: str, app_id: str | None = None, app_version: int | None = None
) -> int:
    """Abort every open transaction of the write; with an app, record its version as
    finished first, so that a task preparing later is refused. Returns how many."""
    from client.admin import abort_transactions

    if app_id is not None:
        abort_transactions(bootstrap, [], app_id=app_id, app_version=app_version)
    return abort_open(bootstrap, prefix)


def committed(bootstrap: Bootstrap, prefix: str) -> bool:
    """Whether any transaction of the write was committed (ids not yet expired)."""
    from client.admin import list_transactions

    return bool(list_transactions(bootstrap, sweep_prefix(prefix), ["COMPLETE_COMMIT"]))


def abort_open(bootstrap: Bootstrap, prefix: str) -> int:
    """Abort the ONGOING and PREPARED transactions whose id starts with the write's prefix."""
    from client import TxnHandle
    from client.admin import OPEN_TXN_STATES, abort_transactions, list_transactions
    from client.errors import CommitTxnsError

    aborted = 0
    for _ in range(SWEEP_ROUNDS):
        listed = list_transactions(bootstrap, sweep_prefix(prefix), OPEN_TXN_STATES)
        if not listed:
            return aborted
        handles = [TxnHandle(t.transactional_id, t.producer_id, t.producer_epoch) for t in listed]
        try:
            abort_transactions(bootstrap, handles)
        except CommitTxnsError as exc:
            # One of them ended or was taken over since the listing: all or nothing
            # aborted none, so list again.
            log.info("aborting leftovers of %s: %s; listing again", prefix, exc)
            continue
        aborted += len(handles)
    left = list_transactions(bootstrap, sweep_prefix(prefix), OPEN_TXN_STATES)
    if left:
        log.warning(
            "%d transactions of %s still open after %d rounds; the broker aborts them at "
            "their timeout (minibroker txn list --prefix %s)",
            len(left),
            prefix,
            SWEEP_ROUNDS,
            sweep_prefix(prefix),
        )
    return aborted
