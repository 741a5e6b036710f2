"""The transaction coordinator's durable log, `<data_dir>/transactions/txn.wal`.

A record log (broker/storage/record_log.py: CRC-framed records, group fsync, torn-tail
recovery, compaction) whose every record is one change, appended and fdatasynced
before the change is answered. Its msgpack body:

| field    | what                                                            |
|----------|-----------------------------------------------------------------|
| entries  | whole `TxnEntry`s (broker/transactions/state.py encodes them)            |
| apps     | `AppVersion`s recorded by CommitTxns                            |
| removed  | transactional ids forgotten (expired or evicted)                |

Records hold whole entries, so replaying the file in order and keeping the last
record per id rebuilds the state; compaction writes one record of the whole
state once the file has grown past `transaction_log_max_bytes`.
"""

from __future__ import annotations

from pathlib import Path

from broker.storage import RecordLog, RecordLogError

DIRECTORY = "transactions"
FILE = "txn.wal"


class TxnLogError(RecordLogError):
    """The transaction log is damaged before its end; the broker will not start on it."""


class TxnLog(RecordLog):
    error = TxnLogError

    def __init__(self, data_dir: Path, max_bytes: int) -> None:
        super().__init__(data_dir / DIRECTORY, FILE, max_bytes)
