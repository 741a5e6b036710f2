"""The minibroker wire contract, sans IO: frames, messages, record batches, error codes.

Nothing here opens a socket or imports an event loop, so the broker, the
clients and raw-protocol tests all share exactly one implementation.
"""

from protocol.batch import (
    BatchError,
    BatchHeader,
    Record,
    build_batch,
    build_batch_from_columns,
    encode_batch,
    iter_records,
    read_header,
    scan_batches,
    validate,
)
from protocol.compression import Compression
from protocol.errors import ErrorCode, ProtocolError
from protocol.framing import FrameDecoder, FrameError, FrameTooLarge, encode_frame
from protocol.records import RecordColumns, count_records, encode_rows

__all__ = [
    "BatchError",
    "BatchHeader",
    "Compression",
    "ErrorCode",
    "FrameDecoder",
    "FrameError",
    "FrameTooLarge",
    "ProtocolError",
    "Record",
    "RecordColumns",
    "build_batch",
    "build_batch_from_columns",
    "count_records",
    "encode_batch",
    "encode_frame",
    "encode_rows",
    "iter_records",
    "read_header",
    "scan_batches",
    "validate",
]
