"""Storage: the bytes on disk and the discipline that keeps them.

Segments and their indexes, the partition log, crash recovery, the CRC-framed
record log that the transaction and offset logs are written in, the aborted-
transaction index, the data directory's lock and marker, and the durable-file
primitives. The pure parts (`offset_index`, `recovery`, `txn_index`) take and
return bytes and values; `segment`, `log`, `record_log`, `data_dir` and
`fileio` do the file IO around them, and `sync_threads` runs their fsyncs off
the event loop. Other domains import from here, not from
the modules.
"""

from broker.storage.data_dir import DataDir, DataDirError, PreviousShutdown, cannot_use
from broker.storage.fileio import fsync_dir, seal, unseal, write_atomic
from broker.storage.log import (
    CorruptBatchError,
    FileSpan,
    LogConfig,
    OffsetOutOfRange,
    PartitionLog,
    StorageError,
)
from broker.storage.record_log import RecordLog, RecordLogError
from broker.storage.segment import TXN_INDEX_SUFFIX, file_name
from broker.storage.sync_threads import fdatasync_each
from broker.storage.txn_index import (
    AbortedIndex,
    AbortedTxn,
    TxnIndexError,
    decode_entries,
    encode_entries,
)

__all__ = [
    "TXN_INDEX_SUFFIX",
    "AbortedIndex",
    "AbortedTxn",
    "CorruptBatchError",
    "DataDir",
    "DataDirError",
    "FileSpan",
    "LogConfig",
    "OffsetOutOfRange",
    "PartitionLog",
    "PreviousShutdown",
    "RecordLog",
    "RecordLogError",
    "StorageError",
    "TxnIndexError",
    "cannot_use",
    "decode_entries",
    "encode_entries",
    "fdatasync_each",
    "file_name",
    "fsync_dir",
    "seal",
    "unseal",
    "write_atomic",
]
