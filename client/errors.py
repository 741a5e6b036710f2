"""Exceptions raised by the client, each carrying the wire error code when one applies.

Kafka users catch by class (`ProducerFencedError`, ...) or inspect `.code`
(an `ErrorCode`); `retriable` tells whether the client would retry it on its own.
"""

from __future__ import annotations

from protocol.errors import RETRIABLE, ErrorCode


class MinibrokerError(Exception):
    """Base class of every client error; `code` is the broker's error code or None."""

    def __init__(self, message: str, code: ErrorCode | int | None = None) -> None:
        super().__init__(message)
        self.code: ErrorCode | int | None = None if code is None else _as_code(code)

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE


class ProducerFencedError(MinibrokerError):
    """A newer producer with the same id (or transactional_id) took over; fatal."""


class IllegalStateError(MinibrokerError):
    """A call the producer's state does not allow (Kafka's IllegalStateException): send()
    on a transactional producer outside a begun transaction, commit before begin, ..."""


class TransactionAbortableError(MinibrokerError):
    """A batch of the current transaction failed (or the broker ended it): the transaction
    can only be aborted; `abort_transaction()` then lets the producer go on."""


class TransactionAbortedError(MinibrokerError):
    """The record's transaction was aborted before the record was sent."""


class CommitTxnsError(MinibrokerError):
    """CommitTxns ended none of the listed transactions; `errors` maps each transactional id
    to its error code (0 for the entries that were fine but not ended because of others)."""

    def __init__(self, message: str, code: int, errors: dict[str, int]) -> None:
        super().__init__(message, code)
        self.errors = errors


class DeliveryTimeoutError(MinibrokerError):
    """The record was not acknowledged within delivery_timeout_ms; it may or may not be stored."""


class CorruptRecordError(MinibrokerError):
    """A fetched batch failed its CRC or could not be decoded."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        super().__init__(
            f"corrupt record batch in {topic}-{partition} at offset {offset}: {reason}",
            ErrorCode.CORRUPT_MESSAGE,
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset


class MinibrokerTimeoutError(MinibrokerError, TimeoutError):
    """A blocking call (metadata, buffer space, flush, get) did not finish in time."""


class ConnectionLostError(MinibrokerError):
    """The connection to the broker failed or closed; requests on it have unknown outcome."""


class RecordTooLargeError(MinibrokerError):
    """A record is larger than max_request_size or buffer_memory."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.MESSAGE_TOO_LARGE)


class OffsetOutOfRangeError(MinibrokerError):
    """The fetch position is outside the log and auto_offset_reset is "none"."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        super().__init__(
            f"offset {offset} is out of range for {topic}-{partition}",
            ErrorCode.OFFSET_OUT_OF_RANGE,
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset


class UnknownTopicError(MinibrokerError):
    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        self.topic = topic


class TopicAlreadyExistsError(MinibrokerError):
    def __init__(self, topic: str, message: str | None = None) -> None:
        super().__init__(
            message or f"topic {topic!r} already exists", ErrorCode.TOPIC_ALREADY_EXISTS
        )
        self.topic = topic


def _as_code(code: ErrorCode | int) -> ErrorCode | int:
    try:
        return ErrorCode(code)
    except ValueError:
        return code


FENCING_CODES = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})
# Fatal for a transactional producer: its transactional id is no longer bound to its pid.
TXN_FATAL_CODES = FENCING_CODES | {ErrorCode.INVALID_PRODUCER_ID_MAPPING}


def error_for(code: int, context: str, message: str | None = None) -> MinibrokerError:
    """The exception for a broker error `code` met while doing `context`."""
    text = f"{context}: {ErrorCode.name_of(code)}"
    if message:
        text += f" ({message})"
    if code in FENCING_CODES:
        return ProducerFencedError(
            text + "; another producer instance with a newer epoch took over", code
        )
    if code == ErrorCode.INVALID_PRODUCER_ID_MAPPING:
        return ProducerFencedError(
            text + "; the transactional id is no longer bound to this producer id", code
        )
    if code == ErrorCode.MESSAGE_TOO_LARGE:
        return RecordTooLargeError(text)
    return MinibrokerError(text, code)
