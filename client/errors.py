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


class NoBrokersAvailable(MinibrokerError):
    """No bootstrap server could be reached, and none ever was (kafka-python's
    NoBrokersAvailable): a wrong address or a broker that is down, not a passing failure.
    The cause is the last connection error. Retriable: a later call tries again."""

    @property
    def retriable(self) -> bool:
        return True


class AuthenticationFailedError(MinibrokerError):
    """The broker did not accept this client's credentials, or this client did not accept
    the broker's (kafka-python's AuthenticationFailedError, Kafka's
    AuthenticationException): a SASL exchange failed, the broker does not offer the
    mechanism, the broker's SCRAM signature did not verify, or the TLS handshake
    failed (a certificate refused either way).

    Fatal, never retried: a client that failed to authenticate raises it from every
    later call that needs the broker, without another attempt, since credentials do
    not fix themselves; make a new client with the right settings. `broker` is the
    address, `mechanism` the SASL mechanism or "TLS". No message ever holds a secret."""

    def __init__(
        self, message: str, *, broker: str, mechanism: str, code: ErrorCode | int | None = None
    ) -> None:
        super().__init__(message, ErrorCode.SASL_AUTHENTICATION_FAILED if code is None else code)
        self.broker = broker
        self.mechanism = mechanism

    @property
    def retriable(self) -> bool:
        return False


class AuthorizationFailedError(MinibrokerError):
    """The broker's authorizer refused this principal the operation (Kafka's
    AuthorizationException): TOPIC_(29), GROUP_(30), CLUSTER_(31) or
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED(53), named in the message. Not retriable:
    an operator must grant an ACL first (`minibroker acls add`)."""


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


class CommitFailedError(MinibrokerError):
    """The group refused an offset commit from this member (Kafka's CommitFailedException):
    it was fenced, removed or is behind the group's epoch, so the partitions may belong
    to another member already. Not retriable as is; the consumer rejoins by itself."""


class FencedMemberEpochError(CommitFailedError):
    """FENCED_MEMBER_EPOCH(110): the member's epoch is not its current one."""


class StaleMemberEpochError(CommitFailedError):
    """STALE_MEMBER_EPOCH(113): a commit carried an epoch older than the member's."""


class UnknownMemberIdError(CommitFailedError):
    """UNKNOWN_MEMBER_ID(25): the group no longer (or never) had this member; from outside
    the group (member id ""), the group has members and refuses the commit."""


class TxnOffsetCommitFailedError(CommitFailedError, TransactionAbortableError):
    """send_offsets_to_transaction() was refused because the consumer's member was fenced
    (its epoch, or FENCED_INSTANCE_ID: another consumer took its group_instance_id): the
    transaction can only be aborted (it is both a CommitFailedError and abortable)."""


class FencedInstanceIdError(MinibrokerError):
    """FENCED_INSTANCE_ID(82): another consumer joined with this one's `group_instance_id`
    and took its partitions (static membership). Fatal for this consumer, as in Kafka:
    raised by the commit that learnt it and by every later poll; rejoining would only
    fence the newer consumer in turn."""


class UnstableOffsetCommitError(MinibrokerError):
    """UNSTABLE_OFFSET_COMMIT(88): a transaction holding offsets of this partition is still
    open; the committed offset is known once it ends. Retriable."""

    @property
    def retriable(self) -> bool:
        return True


class GroupMaxSizeReachedError(MinibrokerError):
    """GROUP_MAX_SIZE_REACHED(81): the group holds its broker-wide maximum of members; fatal
    for this consumer, as in Kafka."""


class NonEmptyGroupError(MinibrokerError):
    """The group has members, so its offsets cannot be altered from outside it (Kafka's
    kafka-consumer-groups refuses --reset-offsets on an active group the same way)."""


class NoOffsetForPartitionError(MinibrokerError):
    """A partition has no committed offset (or its position left the log) and
    auto_offset_reset is "none"."""

    def __init__(self, topic: str, partition: int, why: str) -> None:
        super().__init__(f"{topic}-{partition}: {why} and auto_offset_reset is 'none'")
        self.topic = topic
        self.partition = partition


class UnknownPartitionError(MinibrokerError):
    """The topic exists without this partition number (Kafka's producer refuses such a
    record at send(), without waiting)."""

    def __init__(self, topic: str, partition: int, count: int) -> None:
        super().__init__(
            f"partition {partition} of {topic!r} does not exist "
            f"({count} partition{'' if count == 1 else 's'})",
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        )
        self.topic = topic
        self.partition = partition


class UnknownTopicError(MinibrokerError):
    def __init__(self, topic: str, message: str | None = None) -> None:
        super().__init__(
            message or f"topic {topic!r} does not exist", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
        self.topic = topic


class InvalidConfigError(MinibrokerError):
    """INVALID_CONFIG(40): a topic setting that does not exist or a value out of its
    bounds (Kafka's InvalidConfigurationException); the message names it."""


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


MEMBER_ERRORS: dict[int, type[CommitFailedError]] = {
    ErrorCode.FENCED_MEMBER_EPOCH: FencedMemberEpochError,
    ErrorCode.STALE_MEMBER_EPOCH: StaleMemberEpochError,
    ErrorCode.UNKNOWN_MEMBER_ID: UnknownMemberIdError,
}
"""Codes by which a group refuses a member's request, and the exception each raises."""
# The codes whose exception is a class of its own.
_ERRORS_BY_CODE: dict[int, type[MinibrokerError]] = {
    **MEMBER_ERRORS,
    ErrorCode.UNSTABLE_OFFSET_COMMIT: UnstableOffsetCommitError,
    ErrorCode.GROUP_MAX_SIZE_REACHED: GroupMaxSizeReachedError,
    ErrorCode.FENCED_INSTANCE_ID: FencedInstanceIdError,
    ErrorCode.NON_EMPTY_GROUP: NonEmptyGroupError,
    ErrorCode.INVALID_CONFIG: InvalidConfigError,
}

AUTHORIZATION_CODES = frozenset(
    {
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)

FENCING_CODES = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})
# Fatal for a transactional producer: its transactional id is no longer bound to its pid.
TXN_FATAL_CODES = FENCING_CODES | {ErrorCode.INVALID_PRODUCER_ID_MAPPING}


RESOURCE_OF_CODE: dict[int, str] = {
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: "topic",
    ErrorCode.GROUP_AUTHORIZATION_FAILED: "group",
}


def denial(code: int, principal: str | None, operation: str, name: str) -> str | None:
    """The broker's wording of a denial (broker/security/authorization.py) for the answers
    that carry only its code (Metadata's topics, Fetch's partitions), so that denials read
    the same everywhere; None for a code that is no such denial."""
    resource = RESOURCE_OF_CODE.get(code)
    if resource is None:
        return None
    return f"{principal or 'this client'} may not {operation} {resource} {name!r}"


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
    if code in AUTHORIZATION_CODES:
        return AuthorizationFailedError(text, code)
    by_code = _ERRORS_BY_CODE.get(code)
    if by_code is not None:
        return by_code(text, code)
    return MinibrokerError(text, code)
