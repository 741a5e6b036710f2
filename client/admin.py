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

The security helpers are Kafka's too: `create_acls`, `describe_acls`,
`delete_acls`, `describe_user_scram_credentials` and
`alter_user_scram_credentials` (the password stays here: KIP-554's salted
password is what is sent).

Every helper's first argument says where to connect: a bootstrap string (or
list) for a plaintext broker, or an `AdminConfig` with the security settings
(TLS, SASL) of client/config.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import anyio
from anyio.from_thread import start_blocking_portal

from client.config import DEFAULT_BOOTSTRAP, AdminConfig
from client.connection import Connection, open_connection
from client.coordinator import commit_errors, commit_topics, normalize_offsets
from client.errors import (
    CommitTxnsError,
    ConnectionLostError,
    MinibrokerError,
    MinibrokerTimeoutError,
    NonEmptyGroupError,
    TopicAlreadyExistsError,
    UnknownTopicError,
    error_for,
)
from client.group_membership import to_wire
from client.replies import check, list_offsets_request, metadata_request, offsets, partition_count
from client.security import new_salt, salted_password
from client.types import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AlterConfigOp,
    AlterUserScramCredentialsResult,
    CommitTxnsResult,
    ConfigDescription,
    ConfigEntry,
    ConfigResource,
    CreateAclsResult,
    DeleteAclsResult,
    OffsetAndMetadata,
    PartitionDescription,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    ScramCredentialInfo,
    TopicDescription,
    TopicPartition,
    TxnHandle,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from protocol import messages as m
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

Bootstrap: TypeAlias = "str | Sequence[str] | AdminConfig"
"""Where an admin helper connects: bootstrap servers, or an AdminConfig (with security)."""


def admin_config(bootstrap: Bootstrap) -> AdminConfig:
    """`bootstrap` as an AdminConfig (a plaintext one for a bootstrap string)."""
    if isinstance(bootstrap, AdminConfig):
        return bootstrap
    return AdminConfig(bootstrap_servers=bootstrap)


async def _with_connection(bootstrap: Bootstrap, work: Callable[[Connection], Awaitable[T]]) -> T:
    config = admin_config(bootstrap)
    host, port = config.servers[0]
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
                    client_id=config.client_id,
                    timeout_s=TIMEOUT_S,
                    max_response_bytes=DEFAULT_FRAME_BYTES_MAX,
                    security=config.security,
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
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


async def list_topics_async(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> list[str]:
    """Names of every topic, sorted."""

    async def work(conn: Connection) -> list[str]:
        response = await _request(conn, MetadataRequest(topics=None))
        return sorted(t.name for t in response.topics if not t.error)

    return await _with_connection(bootstrap, work)


async def describe_topic_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, name: str = ""
) -> TopicDescription:
    """Each partition of `name` with its leader and its beginning and end offsets."""

    async def work(conn: Connection) -> TopicDescription:
        metadata = await _request(conn, metadata_request(name, allow_auto_create=False))
        count = partition_count(metadata, name, conn.principal)
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, topics: Iterable[str] = ()
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
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
    bootstrap: Bootstrap,
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
    bootstrap: Bootstrap,
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
    bootstrap: Bootstrap,
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, app_ids: Sequence[str] | None = None
) -> list[TxnApp]:
    """The committed version of each app (`app_ids`, or every app the broker knows)."""

    async def work(conn: Connection) -> list[TxnApp]:
        request = DescribeTxnAppsRequest(txn_app_ids=None if app_ids is None else list(app_ids))
        response = await _request(conn, request)
        return sorted(response.apps, key=lambda a: a.txn_app_id)

    return await _with_connection(bootstrap, work)


async def abort_transaction_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, transactional_id: str = ""
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> list[GroupListing]:
    """Every consumer group the broker knows: id, state and member count, sorted by id."""

    async def work(conn: Connection) -> list[GroupListing]:
        response = await _request(conn, ListGroupsRequest())
        return sorted(response.groups, key=lambda g: g.group_id)

    return await _with_connection(bootstrap, work)


async def describe_groups_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, group_ids: Sequence[str] = ()
) -> list[GroupDescription]:
    """State, epoch and members (id, epoch, client id, subscription, assignment) of each
    group; a group the broker does not know comes back with its error code set."""

    async def work(conn: Connection) -> list[GroupDescription]:
        response = await _request(conn, DescribeGroupsRequest(group_ids=list(group_ids)))
        return list(response.groups)

    return await _with_connection(bootstrap, work)


async def list_group_offsets_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
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


# --------------------------------------------------------------------------- ACLs


def _security_error(code: int, context: str, message: str | None = None) -> MinibrokerError:
    """error_for, with what SECURITY_DISABLED means for an operator."""
    if code == ErrorCode.SECURITY_DISABLED:
        return error_for(
            code, context, message or "the broker's authorizer is off (authorizer = false)"
        )
    return error_for(code, context, message)


async def _security_request(conn: Connection, request: Request, context: str) -> Any:
    response = await conn.request(request, TIMEOUT_S)
    if response.error:
        raise _security_error(response.error, context, response.message)
    return response


def _pattern_filter_to_wire(
    pattern: ResourcePatternFilter,
) -> tuple[str | None, str | None, str | None]:
    return (
        None if pattern.resource_type is None else pattern.resource_type.value,
        pattern.resource_name,
        None if pattern.pattern_type is None else pattern.pattern_type.value,
    )


def _binding_to_wire(binding: AclBinding) -> m.AclBinding:
    p = binding.resource_pattern
    return m.AclBinding(
        resource_type=p.resource_type.value,
        resource_name=p.resource_name,
        pattern_type=p.pattern_type.value,
        principal=binding.principal,
        host=binding.host,
        operation=binding.operation.value,
        permission=binding.permission_type.value,
    )


def _binding_from_wire(wire: m.AclBinding) -> AclBinding:
    return AclBinding(
        principal=wire.principal,
        host=wire.host,
        operation=AclOperation(wire.operation),
        permission_type=AclPermissionType(wire.permission),
        resource_pattern=ResourcePattern(
            ResourceType(wire.resource_type), wire.resource_name, PatternType(wire.pattern_type)
        ),
    )


def _filter_to_wire(acl_filter: AclBindingFilter) -> m.AclBindingFilter:
    resource_type, resource_name, pattern_type = _pattern_filter_to_wire(
        acl_filter.resource_pattern
    )
    return m.AclBindingFilter(
        resource_type=resource_type,
        resource_name=resource_name,
        pattern_type=pattern_type,
        principal=acl_filter.principal,
        host=acl_filter.host,
        operation=None if acl_filter.operation is None else acl_filter.operation.value,
        permission=None if acl_filter.permission_type is None else acl_filter.permission_type.value,
    )


async def create_acls_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, bindings: Sequence[AclBinding] = ()
) -> CreateAclsResult:
    """Create ACLs (durable before the answer); each binding is created or refused on its
    own (`failed` pairs it with its error). Raises AuthorizationFailedError without alter
    on the cluster, MinibrokerError (SECURITY_DISABLED) when the broker's authorizer is
    off."""
    chosen = list(bindings)

    async def work(conn: Connection) -> CreateAclsResult:
        request = m.CreateAclsRequest(creations=[_binding_to_wire(b) for b in chosen])
        response = await _security_request(conn, request, "create ACLs")
        created: list[AclBinding] = []
        failed: list[tuple[AclBinding, MinibrokerError]] = []
        for binding, result in zip(chosen, response.results, strict=True):
            if result.error:
                failed.append(
                    (
                        binding,
                        _security_error(result.error, f"create ACL {binding}", result.message),
                    )
                )
            else:
                created.append(binding)
        return CreateAclsResult(created, failed)

    if not chosen:
        return CreateAclsResult([], [])
    return await _with_connection(bootstrap, work)


async def describe_acls_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, acl_filter: AclBindingFilter | None = None
) -> list[AclBinding]:
    """The ACLs that `acl_filter` matches (default: every ACL)."""
    wire = _filter_to_wire(acl_filter or AclBindingFilter())

    async def work(conn: Connection) -> list[AclBinding]:
        response = await _security_request(
            conn, m.DescribeAclsRequest(filter=wire), "describe ACLs"
        )
        return [_binding_from_wire(b) for b in response.bindings]

    return await _with_connection(bootstrap, work)


async def delete_acls_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, filters: Sequence[AclBindingFilter] = ()
) -> list[DeleteAclsResult]:
    """Delete every ACL each filter matches; one result per filter, in order, with what it
    deleted or its error (an invalid filter is refused on its own)."""
    chosen = list(filters)

    async def work(conn: Connection) -> list[DeleteAclsResult]:
        request = m.DeleteAclsRequest(filters=[_filter_to_wire(f) for f in chosen])
        response = await _security_request(conn, request, "delete ACLs")
        return [
            DeleteAclsResult(
                acl_filter,
                [_binding_from_wire(b) for b in result.deleted],
                _security_error(result.error, "delete ACLs") if result.error else None,
            )
            for acl_filter, result in zip(chosen, response.results, strict=True)
        ]

    if not chosen:
        return []
    return await _with_connection(bootstrap, work)


# --------------------------------------------------------------------------- SCRAM users


async def describe_user_scram_credentials_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, users: Sequence[str] | None = None
) -> list[UserScramCredentialsDescription]:
    """The SCRAM mechanisms and iterations of `users` (default: every user), sorted by user;
    a named user without credentials is left out."""

    async def work(conn: Connection) -> list[UserScramCredentialsDescription]:
        request = m.DescribeUserScramCredentialsRequest(
            users=None if users is None else list(users)
        )
        response = await _security_request(conn, request, "describe SCRAM credentials")
        found = []
        for result in response.results:
            if result.error == ErrorCode.RESOURCE_NOT_FOUND:
                continue
            if result.error:
                raise _security_error(
                    result.error, f"describe SCRAM credentials of {result.user!r}"
                )
            found.append(
                UserScramCredentialsDescription(
                    result.user,
                    [ScramCredentialInfo(c.mechanism, c.iterations) for c in result.credentials],
                )
            )
        return sorted(found, key=lambda d: d.user)

    return await _with_connection(bootstrap, work)


async def alter_user_scram_credentials_async(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    alterations: Sequence[UserScramCredentialUpsertion | UserScramCredentialDeletion] = (),
) -> list[AlterUserScramCredentialsResult]:
    """Set (upsert) or delete SCRAM credentials; one result per user, in the order users are
    first named, each all or nothing. An upsertion's password never leaves the client:
    the request carries KIP-554's Hi(password, salt, iterations) (computed in a worker
    thread: thousands of HMACs)."""
    chosen = list(alterations)
    upsertions: list[m.ScramCredentialUpsertion] = []
    for alteration in chosen:
        if isinstance(alteration, UserScramCredentialUpsertion):
            salt = alteration.salt or new_salt()
            salted = await anyio.to_thread.run_sync(
                salted_password,
                alteration.mechanism,
                alteration.password,
                salt,
                alteration.iterations,
            )
            upsertions.append(
                m.ScramCredentialUpsertion(
                    user=alteration.user,
                    mechanism=alteration.mechanism,
                    iterations=alteration.iterations,
                    salt=salt,
                    salted_password=salted,
                )
            )
    request = m.AlterUserScramCredentialsRequest(
        deletions=[
            m.ScramCredentialDeletion(user=a.user, mechanism=a.mechanism)
            for a in chosen
            if isinstance(a, UserScramCredentialDeletion)
        ],
        upsertions=upsertions,
    )

    async def work(conn: Connection) -> list[AlterUserScramCredentialsResult]:
        response = await _security_request(conn, request, "alter SCRAM credentials")
        return [
            AlterUserScramCredentialsResult(
                r.user,
                _security_error(r.error, f"alter SCRAM credentials of {r.user!r}", r.message)
                if r.error
                else None,
            )
            for r in response.results
        ]

    if not chosen:
        return []
    return await _with_connection(bootstrap, work)


def _run(func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    with start_blocking_portal() as portal:
        return portal.call(lambda: func(*args, **kwargs))


def create_topic(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    name: str = "",
    partitions: int = 1,
    config: dict[str, Any] | None = None,
    *,
    exist_ok: bool = False,
) -> None:
    _run(create_topic_async, bootstrap, name, partitions, config, exist_ok=exist_ok)


def list_topics(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> list[str]:
    return _run(list_topics_async, bootstrap)


def describe_topic(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, name: str = "") -> TopicDescription:
    return _run(describe_topic_async, bootstrap, name)


def delete_topics(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, topics: Iterable[str] = ()) -> None:
    _run(delete_topics_async, bootstrap, list(topics))


def describe_configs(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    resources: Iterable[ConfigResource] = (),
) -> list[ConfigDescription]:
    return _run(describe_configs_async, bootstrap, list(resources))


def incremental_alter_configs(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
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
    bootstrap: Bootstrap,
    handles: Iterable[TxnHandle],
    *,
    app_id: str | None = None,
    app_version: int | None = None,
) -> CommitTxnsResult:
    return _run(
        commit_transactions_async, bootstrap, list(handles), app_id=app_id, app_version=app_version
    )


def abort_transactions(
    bootstrap: Bootstrap,
    handles: Iterable[TxnHandle],
    *,
    app_id: str | None = None,
    app_version: int | None = None,
) -> CommitTxnsResult:
    return _run(
        abort_transactions_async, bootstrap, list(handles), app_id=app_id, app_version=app_version
    )


def list_transactions(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    prefix: str | None = None,
    states: Sequence[str] | None = None,
) -> list[TransactionListing]:
    return _run(list_transactions_async, bootstrap, prefix, states)


def describe_txn_apps(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, app_ids: Sequence[str] | None = None
) -> list[TxnApp]:
    return _run(describe_txn_apps_async, bootstrap, app_ids)


def abort_transaction(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, transactional_id: str = ""
) -> TransactionListing | None:
    return _run(abort_transaction_async, bootstrap, transactional_id)


def list_groups(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> list[GroupListing]:
    return _run(list_groups_async, bootstrap)


def describe_groups(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, group_ids: Sequence[str] = ()
) -> list[GroupDescription]:
    return _run(describe_groups_async, bootstrap, list(group_ids))


def list_group_offsets(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
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
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    group_id: str = "",
    offsets: Mapping[Any, int | OffsetAndMetadata] | None = None,
) -> None:
    _run(alter_group_offsets_async, bootstrap, group_id, dict(offsets or {}))


def create_acls(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, bindings: Sequence[AclBinding] = ()
) -> CreateAclsResult:
    return _run(create_acls_async, bootstrap, list(bindings))


def describe_acls(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, acl_filter: AclBindingFilter | None = None
) -> list[AclBinding]:
    return _run(describe_acls_async, bootstrap, acl_filter)


def delete_acls(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, filters: Sequence[AclBindingFilter] = ()
) -> list[DeleteAclsResult]:
    return _run(delete_acls_async, bootstrap, list(filters))


def describe_user_scram_credentials(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, users: Sequence[str] | None = None
) -> list[UserScramCredentialsDescription]:
    return _run(describe_user_scram_credentials_async, bootstrap, users)


def alter_user_scram_credentials(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    alterations: Sequence[UserScramCredentialUpsertion | UserScramCredentialDeletion] = (),
) -> list[AlterUserScramCredentialsResult]:
    return _run(alter_user_scram_credentials_async, bootstrap, list(alterations))
