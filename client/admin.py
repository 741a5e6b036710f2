"""Small admin helpers (topics, settings, transactions, consumer groups) for the CLI, tests
and scripts.

Each helper opens one connection, does its requests and closes it. The async
versions run in the caller's event loop; the sync ones run the async version on
a short-lived portal thread, so they also work when called from inside a loop.

The topic helpers are Kafka's Admin calls too: `create_topic`, `list_topics`,
`describe_topic`, `delete_topics`, `describe_configs` (every setting of topics or of
the broker, typed) and `incremental_alter_configs` (set or delete topic settings).
A helper naming several topics or resources raises for the first one the broker
refused, naming every refused one; the others were done.

The transaction helpers are what an outside coordinator (a Spark driver) and an
operator use: `commit_transactions` / `abort_transactions` end prepared
transactions by their `TxnHandle`s with one CommitTxns (atomic over all of them,
idempotent per `app_id`/`app_version`); `list_transactions`, `describe_txn_apps`
and `abort_transaction` (one lingering transaction, by its transactional id).

The group helpers are Kafka's Admin calls: `list_groups`, `describe_groups`,
`list_group_offsets` (OffsetFetch) and `alter_group_offsets` (OffsetCommit from
outside the group, member "" and epoch -1, which the broker refuses while the
group has members).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
from anyio.from_thread import start_blocking_portal

from client.config import DEFAULT_BOOTSTRAP, parse_bootstrap
from client.connection import Connection, open_connection
from client.coordinator import commit_errors, commit_topics, normalize_offsets
from client.errors import (
    CommitTxnsError,
    ConnectionLostError,
    MinibrokerTimeoutError,
    NonEmptyGroupError,
    TopicAlreadyExistsError,
    UnknownTopicError,
    error_for,
)
from client.group_membership import to_wire
from client.replies import check, list_offsets_request, metadata_request, offsets, partition_count
from client.types import (
    AlterConfigOp,
    CommitTxnsResult,
    ConfigDescription,
    ConfigEntry,
    ConfigResource,
    OffsetAndMetadata,
    PartitionDescription,
    TopicDescription,
    TopicPartition,
    TxnHandle,
)
from protocol.errors import RETRIABLE, ErrorCode
from protocol.framing import DEFAULT_FRAME_BYTES_MAX
from protocol.messages import (
    ISOLATION_READ_UNCOMMITTED,
    NO_OFFSET,
    TIMESTAMP_EARLIEST,
    TIMESTAMP_LATEST,
    AlterableConfigResource,
    CommitTxnsRequest,
    CreatableTopic,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeTxnAppsRequest,
    GroupDescription,
    GroupListing,
    IncrementalAlterConfigsRequest,
    ListGroupsRequest,
    ListTransactionsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    Request,
    TransactionListing,
    TxnApp,
    TxnRef,
)
from protocol.messages import AlterConfigOp as WireConfigOp
from protocol.messages import ConfigResource as WireConfigResource

# A transaction an operator can abort: begun or prepared, not yet decided.
OPEN_TXN_STATES = ("ONGOING", "PREPARED")

T = TypeVar("T")
TIMEOUT_S = 30.0


async def _with_connection(
    bootstrap: str | Sequence[str], work: Callable[[Connection], Awaitable[T]]
) -> T:
    host, port = parse_bootstrap(bootstrap)[0]
    outcome: list[Any] = []
    with anyio.fail_after(TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            # Failures, connecting included, are re-raised below, outside the task
            # group, so callers get the error itself and not an ExceptionGroup.
            try:
                conn = await open_connection(
                    tg,
                    host,
                    port,
                    client_id="minibroker-admin",
                    timeout_s=TIMEOUT_S,
                    max_response_bytes=DEFAULT_FRAME_BYTES_MAX,
                )
            except Exception as exc:
                outcome.append(exc)
            else:
                try:
                    outcome.append(await work(conn))
                except Exception as exc:
                    outcome.append(exc)
                finally:
                    await conn.aclose()
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


async def _request(conn: Connection, request: Request) -> Any:
    response = await conn.request(request, TIMEOUT_S)
    check(response, request.api)
    return response


async def create_topic_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    name: str = "",
    partitions: int = 1,
    config: dict[str, Any] | None = None,
    *,
    exist_ok: bool = False,
) -> None:
    """Create `name`; TopicAlreadyExistsError if it exists (unless exist_ok)."""

    async def work(conn: Connection) -> None:
        response = await _request(
            conn, CreateTopicsRequest(topics=[CreatableTopic(name, partitions, config)])
        )
        for result in response.topics:
            if result.error == ErrorCode.TOPIC_ALREADY_EXISTS:
                if not exist_ok:
                    raise TopicAlreadyExistsError(name, result.message)
            elif result.error:
                raise error_for(result.error, f"create topic {name!r}", result.message)

    await _with_connection(bootstrap, work)


async def list_topics_async(bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP) -> list[str]:
    """Names of every topic, sorted."""

    async def work(conn: Connection) -> list[str]:
        response = await _request(conn, MetadataRequest(topics=None))
        return sorted(t.name for t in response.topics if not t.error)

    return await _with_connection(bootstrap, work)


async def describe_topic_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, name: str = ""
) -> TopicDescription:
    """Each partition of `name` with its leader and its beginning and end offsets."""

    async def work(conn: Connection) -> TopicDescription:
        metadata = await _request(conn, metadata_request(name, allow_auto_create=False))
        count = partition_count(metadata, name)
        entry = metadata.topic(name)
        if count is None or entry is None:
            raise UnknownTopicError(name)
        partitions = list(range(count))
        leaders = {p.partition: p.leader for p in entry.partitions}
        found: dict[tuple[int, int], int] = {}
        for timestamp in (TIMESTAMP_EARLIEST, TIMESTAMP_LATEST):
            request = list_offsets_request(
                [(name, p) for p in partitions], timestamp, ISOLATION_READ_UNCOMMITTED
            )
            for tp, offset in offsets(await _request(conn, request)).items():
                found[(tp.partition, timestamp)] = offset
        return TopicDescription(
            name,
            [
                PartitionDescription(
                    p,
                    leaders[p],
                    found.get((p, TIMESTAMP_EARLIEST), -1),
                    found.get((p, TIMESTAMP_LATEST), -1),
                )
                for p in partitions
            ],
        )

    return await _with_connection(bootstrap, work)


async def delete_topics_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, topics: Iterable[str] = ()
) -> None:
    """Delete `topics`, each whole, with its records and every group's committed offsets
    of it; a topic of the same name created later starts empty at offset 0.

    Raises for the first topic refused (UnknownTopicError when it does not exist;
    CONCURRENT_TRANSACTIONS, retriable, while an open transaction holds data or offsets
    of it); the others named were deleted."""
    names = list(topics)

    async def work(conn: Connection) -> None:
        response = await _request(conn, DeleteTopicsRequest(topics=names))
        _raise_refused("delete topic", [(r.name, r.error, r.message) for r in response.topics])

    await _with_connection(bootstrap, work)


async def describe_configs_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    resources: Iterable[ConfigResource] = (),
) -> list[ConfigDescription]:
    """Every setting of each resource (a topic: its overrides and the broker's values it
    follows; the broker "0": its settings), in the order asked. Raises for the first
    resource refused (UnknownTopicError for a topic that does not exist)."""
    asked = list(resources)

    async def work(conn: Connection) -> list[ConfigDescription]:
        request = DescribeConfigsRequest(
            resources=[WireConfigResource(r.type, r.name) for r in asked]
        )
        response = await _request(conn, request)
        _raise_refused(
            "describe configs of",
            [(_shown(r.type, r.name), r.error, None) for r in response.results],
        )
        return [
            ConfigDescription(
                ConfigResource(r.type, r.name),
                [
                    ConfigEntry(e.name, e.value, e.source, e.read_only, e.sensitive)
                    for e in r.configs
                ],
            )
            for r in response.results
        ]

    return await _with_connection(bootstrap, work)


async def incremental_alter_configs_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    alterations: Mapping[ConfigResource, Iterable[AlterConfigOp]] | None = None,
    *,
    validate_only: bool = False,
) -> None:
    """Set or delete topic settings ({ConfigResource("topic", name): [AlterConfigOp, ...]}),
    each topic all or nothing, durable and in force once this returns; `validate_only`
    checks them and changes nothing. Raises for the first resource refused
    (InvalidConfigError naming a setting that is not a topic's or a value out of its
    bounds, UnknownTopicError)."""
    chosen = {resource: list(ops) for resource, ops in (alterations or {}).items()}

    async def work(conn: Connection) -> None:
        request = IncrementalAlterConfigsRequest(
            resources=[
                AlterableConfigResource(
                    resource.type,
                    resource.name,
                    [WireConfigOp(o.name, o.op, o.value) for o in ops],
                )
                for resource, ops in chosen.items()
            ],
            validate_only=validate_only,
        )
        response = await _request(conn, request)
        _raise_refused(
            "alter configs of",
            [(_shown(r.type, r.name), r.error, r.message) for r in response.results],
        )

    await _with_connection(bootstrap, work)


def _shown(resource_type: str, name: str) -> str:
    return name if resource_type == "topic" else f"{resource_type} {name}"


def _raise_refused(verb: str, results: list[tuple[str, int, str | None]]) -> None:
    """Raise for the first refused of (topic or resource, error, message), naming the
    other refused ones too; nothing when none was refused."""
    refused = [(name, code, message) for name, code, message in results if code]
    if not refused:
        return
    name, code, message = refused[0]
    others = [f"{other!r}: {ErrorCode.name_of(c)}" for other, c, _ in refused[1:]]
    also = f"also refused: {'; '.join(others)}" if others else None
    if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        text = f"{verb} {name!r}: the topic does not exist"
        raise UnknownTopicError(name, f"{text}; {also}" if also else text)
    raise error_for(code, f"{verb} {name!r}", "; ".join(filter(None, [message, also])) or None)


# --------------------------------------------------------------------------- transactions


async def _end_transactions(
    bootstrap: str | Sequence[str],
    handles: Iterable[TxnHandle],
    *,
    committed: bool,
    app_id: str | None = None,
    app_version: int | None = None,
) -> CommitTxnsResult:
    """One CommitTxns, resent on a new connection after a lost answer or a retriable error
    (the broker answers a repeat as done) until TIMEOUT_S."""
    request = CommitTxnsRequest(
        transactions=[TxnRef(h.transactional_id, h.producer_id, h.producer_epoch) for h in handles],
        committed=committed,
        txn_app_id=app_id,
        txn_app_version=app_version,
    )
    verb = "commit" if committed else "abort"

    async def work(conn: Connection) -> CommitTxnsResult:
        response = await conn.request(request, TIMEOUT_S)
        if response.error:
            errors = {entry.transactional_id: entry.error for entry in response.transactions}
            failed = ", ".join(
                f"{tid}: {ErrorCode.name_of(code)}" for tid, code in errors.items() if code
            )
            raise CommitTxnsError(
                f"CommitTxns ({verb}) ended none of {len(request.transactions)} transaction(s):"
                f" {ErrorCode.name_of(response.error)}"
                + (f" ({response.message})" if response.message else "")
                + (f"; {failed}" if failed else ""),
                response.error,
                errors,
            )
        return CommitTxnsResult(response.already_committed, response.txn_app_version)

    deadline = anyio.current_time() + TIMEOUT_S
    while True:
        try:
            return await _with_connection(bootstrap, work)
        except (ConnectionLostError, MinibrokerTimeoutError, CommitTxnsError) as exc:
            lost = not isinstance(exc, CommitTxnsError)
            if not (lost or exc.code in RETRIABLE) or anyio.current_time() >= deadline:
                raise
        await anyio.sleep(0.1)


async def commit_transactions_async(
    bootstrap: str | Sequence[str],
    handles: Iterable[TxnHandle],
    *,
    app_id: str | None = None,
    app_version: int | None = None,
) -> CommitTxnsResult:
    """Commit prepared transactions, all or none, by their handles (from any process).

    With `app_id` and `app_version` the same decision records that this version of
    the app is committed; versions of an app strictly increase, so committing a
    version at or below the recorded one commits nothing, aborts the listed
    transactions still open and answers `already_committed`: a re-run
    micro-batch is never committed twice. Raises CommitTxnsError (per-entry
    errors in `.errors`) when nothing could be committed."""
    return await _end_transactions(
        bootstrap, handles, committed=True, app_id=app_id, app_version=app_version
    )


async def abort_transactions_async(
    bootstrap: str | Sequence[str],
    handles: Iterable[TxnHandle],
    *,
    app_id: str | None = None,
    app_version: int | None = None,
) -> CommitTxnsResult:
    """Abort open or prepared transactions, all or none, by their handles.

    With `app_id` and `app_version` the same decision records the version as
    finished (even with no handle): nothing more is committed under it, and a
    PrepareTxn that names it is refused and its transaction aborted."""
    return await _end_transactions(
        bootstrap, handles, committed=False, app_id=app_id, app_version=app_version
    )


async def list_transactions_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    prefix: str | None = None,
    states: Sequence[str] | None = None,
) -> list[TransactionListing]:
    """The broker's transactional ids (those starting with `prefix`, in one of `states`:
    EMPTY, ONGOING, PREPARED, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT)."""

    async def work(conn: Connection) -> list[TransactionListing]:
        request = ListTransactionsRequest(
            transactional_id_prefix=prefix, states=None if states is None else list(states)
        )
        response = await _request(conn, request)
        return sorted(response.transactions, key=lambda t: t.transactional_id)

    return await _with_connection(bootstrap, work)


async def describe_txn_apps_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, app_ids: Sequence[str] | None = None
) -> list[TxnApp]:
    """The committed version of each app (`app_ids`, or every app the broker knows)."""

    async def work(conn: Connection) -> list[TxnApp]:
        request = DescribeTxnAppsRequest(txn_app_ids=None if app_ids is None else list(app_ids))
        response = await _request(conn, request)
        return sorted(response.apps, key=lambda a: a.txn_app_id)

    return await _with_connection(bootstrap, work)


async def abort_transaction_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, transactional_id: str = ""
) -> TransactionListing | None:
    """Abort the open (ONGOING or PREPARED) transaction of `transactional_id`, for an
    operator clearing one that holds back read_committed consumers; returns what it
    aborted, or None when the id has no open transaction. The producer that owns it
    learns at its commit (TransactionAbortableError) and goes on after
    abort_transaction()."""
    for listing in await list_transactions_async(
        bootstrap, transactional_id, list(OPEN_TXN_STATES)
    ):
        if listing.transactional_id == transactional_id:
            handle = TxnHandle(transactional_id, listing.producer_id, listing.producer_epoch)
            await abort_transactions_async(bootstrap, [handle])
            return listing
    return None


# --------------------------------------------------------------------------- consumer groups


async def list_groups_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
) -> list[GroupListing]:
    """Every consumer group the broker knows: id, state and member count, sorted by id."""

    async def work(conn: Connection) -> list[GroupListing]:
        response = await _request(conn, ListGroupsRequest())
        return sorted(response.groups, key=lambda g: g.group_id)

    return await _with_connection(bootstrap, work)


async def describe_groups_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, group_ids: Sequence[str] = ()
) -> list[GroupDescription]:
    """State, epoch and members (id, epoch, client id, subscription, assignment) of each
    group; a group the broker does not know comes back with its error code set."""

    async def work(conn: Connection) -> list[GroupDescription]:
        response = await _request(conn, DescribeGroupsRequest(group_ids=list(group_ids)))
        return list(response.groups)

    return await _with_connection(bootstrap, work)


async def list_group_offsets_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    group_id: str = "",
    partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
) -> dict[TopicPartition, OffsetAndMetadata]:
    """The group's committed offsets (of `partitions`, default all of them); partitions
    without one are left out."""
    wanted = None if partitions is None else frozenset(TopicPartition(*tp) for tp in partitions)

    async def work(conn: Connection) -> dict[TopicPartition, OffsetAndMetadata]:
        request = OffsetFetchRequest(
            group_id=group_id, topics=None if wanted is None else to_wire(wanted)
        )
        response = await _request(conn, request)
        found: dict[TopicPartition, OffsetAndMetadata] = {}
        for entry in response.topics:
            for part in entry.partitions:
                tp = TopicPartition(entry.topic, part.partition)
                if part.error:
                    raise error_for(part.error, f"offsets of group {group_id!r}, {tp}")
                if part.offset != NO_OFFSET:
                    found[tp] = OffsetAndMetadata(part.offset, part.metadata)
        return dict(sorted(found.items()))

    return await _with_connection(bootstrap, work)


async def alter_group_offsets_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    group_id: str = "",
    offsets: Mapping[Any, int | OffsetAndMetadata] | None = None,
) -> None:
    """Set the group's committed offsets ({partition: offset of the next record to read}),
    from outside the group. The broker allows it only while the group has no members:
    NonEmptyGroupError otherwise."""
    chosen = normalize_offsets(offsets or {})

    async def work(conn: Connection) -> None:
        request = OffsetCommitRequest(group_id=group_id, topics=commit_topics(chosen))
        response = await conn.request(request, TIMEOUT_S)
        failed = commit_errors(response.error, response.topics, chosen)
        if not failed:
            return
        code = next(iter(failed.values()))
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.NON_EMPTY_GROUP):
            raise NonEmptyGroupError(
                f"group {group_id!r} has members: its offsets can only be altered while it "
                "has none (stop its consumers first)",
                code,
            )
        raise error_for(code, f"alter offsets of group {group_id!r}", response.message)

    await _with_connection(bootstrap, work)


def _run(func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    with start_blocking_portal() as portal:
        return portal.call(lambda: func(*args, **kwargs))


def create_topic(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    name: str = "",
    partitions: int = 1,
    config: dict[str, Any] | None = None,
    *,
    exist_ok: bool = False,
) -> None:
    _run(create_topic_async, bootstrap, name, partitions, config, exist_ok=exist_ok)


def list_topics(bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP) -> list[str]:
    return _run(list_topics_async, bootstrap)


def describe_topic(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, name: str = ""
) -> TopicDescription:
    return _run(describe_topic_async, bootstrap, name)


def delete_topics(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, topics: Iterable[str] = ()
) -> None:
    _run(delete_topics_async, bootstrap, list(topics))


def describe_configs(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    resources: Iterable[ConfigResource] = (),
) -> list[ConfigDescription]:
    return _run(describe_configs_async, bootstrap, list(resources))


def incremental_alter_configs(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    alterations: Mapping[ConfigResource, Iterable[AlterConfigOp]] | None = None,
    *,
    validate_only: bool = False,
) -> None:
    _run(
        incremental_alter_configs_async,
        bootstrap,
        {resource: list(ops) for resource, ops in (alterations or {}).items()},
        validate_only=validate_only,
    )


def commit_transactions(
    bootstrap: str | Sequence[str],
    handles: Iterable[TxnHandle],
    *,
    app_id: str | None = None,
    app_version: int | None = None,
) -> CommitTxnsResult:
    return _run(
        commit_transactions_async, bootstrap, list(handles), app_id=app_id, app_version=app_version
    )


def abort_transactions(
    bootstrap: str | Sequence[str],
    handles: Iterable[TxnHandle],
    *,
    app_id: str | None = None,
    app_version: int | None = None,
) -> CommitTxnsResult:
    return _run(
        abort_transactions_async, bootstrap, list(handles), app_id=app_id, app_version=app_version
    )


def list_transactions(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    prefix: str | None = None,
    states: Sequence[str] | None = None,
) -> list[TransactionListing]:
    return _run(list_transactions_async, bootstrap, prefix, states)


def describe_txn_apps(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, app_ids: Sequence[str] | None = None
) -> list[TxnApp]:
    return _run(describe_txn_apps_async, bootstrap, app_ids)


def abort_transaction(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, transactional_id: str = ""
) -> TransactionListing | None:
    return _run(abort_transaction_async, bootstrap, transactional_id)


def list_groups(bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP) -> list[GroupListing]:
    return _run(list_groups_async, bootstrap)


def describe_groups(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, group_ids: Sequence[str] = ()
) -> list[GroupDescription]:
    return _run(describe_groups_async, bootstrap, list(group_ids))


def list_group_offsets(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    group_id: str = "",
    partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
) -> dict[TopicPartition, OffsetAndMetadata]:
    return _run(
        list_group_offsets_async,
        bootstrap,
        group_id,
        None if partitions is None else list(partitions),
    )


def alter_group_offsets(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    group_id: str = "",
    offsets: Mapping[Any, int | OffsetAndMetadata] | None = None,
) -> None:
    _run(alter_group_offsets_async, bootstrap, group_id, dict(offsets or {}))
