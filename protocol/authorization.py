"""What each API needs from the authorizer: the vocabulary of docs/protocol.md section 7's
table ("What each API needs").

Every request class in protocol/messages.py declares its `requirements` with these
types, beside its fields, as data: the operation, the resource type, where the request
names the resources, when the need applies and what a denial covers. The broker
enforces the declarations in one place (broker/security/authorization.py, called by
`Apis.handle` in broker/api/dispatch.py), and docs/security.md's table is generated from them
(`markdown_table`). A denial's code follows from the resource type, as in Kafka
(`DENIAL_CODES`).

Three kinds of need:

- `RequestNeed`: needed on every resource it names; one denied refuses the whole
  request: the top-level `error` and every entry's answer carry the denial, and nothing
  is done.
- `EntryNeed`: needed per entry of the request (a topic with its partitions, a group,
  a config resource); a denied entry is answered with the denial and left out of what
  is done, the other entries proceed.
- `Omission`: a resource that is not allowed is left out silently: of a listing in the
  response, or of a list of names in the request.

A `Path` names where the names are: `"group_id"` (a field holding one name),
`"topics[]"` (each item of a list field), `"topics[].topic"` (a field of each item).
No path names the cluster (`CLUSTER_NAME`). `when` and `unless` name a field that must
be set (neither nil nor false) or unset for the need to apply. Pure data and lookups;
no IO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from protocol.errors import ErrorCode

ANONYMOUS: Final = "User:ANONYMOUS"
"""The principal of every connection that has not authenticated (section 7, "Principal")."""


class ResourceType:
    """What an ACL binding names (the wire's strings)."""

    TOPIC: Final = "topic"
    GROUP: Final = "group"
    TRANSACTIONAL_ID: Final = "transactional_id"
    CLUSTER: Final = "cluster"


CLUSTER_NAME: Final = "cluster"
"""The one resource name of the cluster."""


class Operation:
    """What a binding allows or denies (the wire's strings); `all` covers every other one."""

    ALL: Final = "all"
    READ: Final = "read"
    WRITE: Final = "write"
    CREATE: Final = "create"
    DELETE: Final = "delete"
    ALTER: Final = "alter"
    DESCRIBE: Final = "describe"
    DESCRIBE_CONFIGS: Final = "describe_configs"
    ALTER_CONFIGS: Final = "alter_configs"
    IDEMPOTENT_WRITE: Final = "idempotent_write"


DENIAL_CODES: Final[dict[str, ErrorCode]] = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
}
"""The answer to a denied operation on each type of resource (Kafka's)."""


@dataclass(frozen=True, slots=True)
class Path:
    """Where a message names resources: `field`, `field[]` or `field[].key`."""

    text: str
    field: str = dataclasses.field(init=False)
    each: bool = dataclasses.field(init=False)
    key: str | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        head, _, key = self.text.partition("[].")
        each = self.text.endswith("[]") or bool(key)
        name = head.removesuffix("[]")
        assert name.isidentifier() and (not key or key.isidentifier()), self.text
        object.__setattr__(self, "field", name)
        object.__setattr__(self, "each", each)
        object.__setattr__(self, "key", key or None)

    def names(self, message: Any) -> list[str]:
        """The names `message` holds at this path (none when the field is nil)."""
        value = getattr(message, self.field)
        if value is None:
            return []
        if not self.each:
            return [value]
        key = self.key
        return list(value) if key is None else [getattr(item, key) for item in value]

    def name(self, item: Any) -> str:
        """The name an item of the list holds (the item itself when the path has no key)."""
        key = self.key
        return item if key is None else getattr(item, key)  # type: ignore[no-any-return]


def _is_set(message: Any, name: str) -> bool:
    value = getattr(message, name)
    return value is not None and value is not False


@dataclass(frozen=True, slots=True, kw_only=True)
class _Condition:
    when: str | None = None
    """A field that must be set (neither nil nor false) for the need to apply."""
    unless: str | None = None
    """A field that must be unset (nil or false) for the need to apply."""

    def applies(self, request: Any) -> bool:
        if self.when is not None and not _is_set(request, self.when):
            return False
        return self.unless is None or not _is_set(request, self.unless)


@dataclass(frozen=True, slots=True)
class RequestNeed(_Condition):
    """`operation` on every `resource_type` resource at `names` (the cluster when None);
    one denied refuses the whole request."""

    operation: str
    resource_type: str
    names: Path | None = None
    or_any: tuple[str, str] | None = None
    """(operation, resource type): this operation on at least one resource of that type,
    existing or not, also does (InitProducerId: write on any topic)."""

    @property
    def denied(self) -> ErrorCode:
        return DENIAL_CODES[self.resource_type]

    def resource_names(self, request: Any) -> list[str]:
        return [CLUSTER_NAME] if self.names is None else self.names.names(request)


@dataclass(frozen=True, slots=True)
class EntryNeed(_Condition):
    """`operation` on the resource each entry names (the cluster when `name` is None); a
    denied entry alone is refused."""

    operation: str
    resource_type: str
    name: str | None = None
    """The entry's field holding the name; "" for an entry that is the name itself."""
    where: tuple[str, str] | None = None
    """(field, value): the need applies to the entries whose field has that value."""
    or_cluster: bool = False
    """The same operation on the cluster also does."""
    creating: bool = False
    """The need applies only to entries naming a resource that the request would create
    (Metadata's auto-creation); the broker says which those are."""

    @property
    def denied(self) -> ErrorCode:
        return DENIAL_CODES[self.resource_type]

    def covers(self, entry: Any) -> bool:
        where = self.where
        return where is None or getattr(entry, where[0]) == where[1]

    def resource_name(self, entry: Any) -> str:
        name = self.name
        if name is None:
            return CLUSTER_NAME
        return entry if name == "" else getattr(entry, name)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Omission(_Condition):
    """`operation` on each resource at `names`; one not allowed is left out, silently: of
    the response's list (`in_response`), else of the request's list before it is handled."""

    operation: str
    resource_type: str
    names: Path
    in_response: bool = True
    within: tuple[str, ...] = ()
    """For a list nested in the response: the lists to walk down to the items that hold
    it (DescribeGroups: `groups`, then each group's `members`)."""

    def holders(self, response: Any) -> list[Any]:
        """The response's objects that hold the list at `names`."""
        holders = [response]
        for field in self.within:
            holders = [item for holder in holders for item in getattr(holder, field)]
        return holders


@dataclass(frozen=True, slots=True)
class Entries:
    """A request's entries and the response's answers to them, one each, in order: what
    entry denials leave out and answer, and what a whole-request denial answers."""

    field: str
    """The request's list of entries."""
    answers: str
    """The response's list of answers."""
    refused: Callable[[Any, ErrorCode, str], Any]
    """The answer to an entry refused with a code and a message."""
    of: Callable[[Any], Sequence[Any]] | None = None
    """The entries when they are not the items of `field` (the users that
    AlterUserScramCredentials names in two lists); such entries are never left out."""
    handled_when_none_left: bool = False
    """The request is handled even when every entry was refused (Metadata: the brokers
    are answered whatever the topics); otherwise the refusals are the whole answer."""

    def of_request(self, request: Any) -> Sequence[Any]:
        if self.of is not None:
            return self.of(request)
        entries: Sequence[Any] = getattr(request, self.field) or ()
        return entries


Need = RequestNeed | EntryNeed | Omission


@dataclass(frozen=True, slots=True)
class Requirements:
    """Everything one API needs, checked in this order: the request needs, then each
    entry's needs, then the omissions (each kind kept apart once, for the judging of
    every request)."""

    needs: tuple[Need, ...] = ()
    entries: Entries | None = None
    request_needs: tuple[RequestNeed, ...] = dataclasses.field(init=False)
    entry_needs: tuple[EntryNeed, ...] = dataclasses.field(init=False)
    omissions: tuple[Omission, ...] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        entry_needs = tuple(n for n in self.needs if isinstance(n, EntryNeed))
        assert self.entries is not None or not entry_needs
        object.__setattr__(
            self, "request_needs", tuple(n for n in self.needs if isinstance(n, RequestNeed))
        )
        object.__setattr__(self, "entry_needs", entry_needs)
        object.__setattr__(
            self, "omissions", tuple(n for n in self.needs if isinstance(n, Omission))
        )


NOTHING: Final = Requirements()
"""An API anyone may call (ApiVersions, SaslAuthenticate)."""


# ---------------------------------------------------------------------- the docs' table


def _condition(need: Need) -> str:
    if need.when is not None:
        return f" (with `{need.when}`)"
    if need.unless is not None:
        return f" (without `{need.unless}`)"
    return ""


def _resource(resource_type: str, path: str | None) -> str:
    if resource_type == ResourceType.CLUSTER:
        return "the cluster"
    return f"{resource_type.replace('_', ' ')} `{path}`"


def describe_need(need: Need, entries: Entries | None) -> tuple[str, str]:
    """(what is needed, what a denial answers) of one need, as docs/security.md shows it."""
    op = f"`{need.operation}`"
    if isinstance(need, RequestNeed):
        path = None if need.names is None else need.names.text
        what = f"{op} on {_resource(need.resource_type, path)}"
        if need.or_any is not None:
            what += f", or `{need.or_any[0]}` on any {need.or_any[1]}"
        answers = f" and every entry of `{entries.answers}`" if entries is not None else ""
        return what, f"{int(need.denied)} in `error`{answers}; nothing done"
    if isinstance(need, EntryNeed):
        assert entries is not None
        key = need.name if need.name else None
        path = f"{entries.field}[]" + (f".{key}" if key else "")
        what = f"{op} on {_resource(need.resource_type, path)}"
        if need.where is not None:
            what += f" where `{need.where[0]}` is `{need.where[1]}`"
        if need.or_cluster:
            what += f", or {op} on the cluster"
        if need.creating:
            what += ", when the request creates it"
        return what, f"{int(need.denied)} in that entry of `{entries.answers}`, which is not done"
    where = "the response's" if need.in_response else "the request's"
    nested = "".join(f"{field}[]." for field in need.within)
    what = f"{op} on {_resource(need.resource_type, nested + need.names.text)}"
    return what, f"left out of {where} `{nested}{need.names.field}`"


def markdown_table(declared: Iterable[tuple[str, Requirements]]) -> str:
    """The APIs' requirements as docs/security.md shows them: one row per need, in the
    order they are checked; an API that needs nothing gets one row saying so."""
    rows = [
        "| API | needs | denied → |",
        "|---|---|---|",
    ]
    for api, requirements in declared:
        if not requirements.needs:
            rows.append(f"| {api} | nothing | |")
        for need in requirements.needs:
            what, denied = describe_need(need, requirements.entries)
            rows.append(f"| {api}{_condition(need)} | {what} | {denied} |")
    return "\n".join(rows) + "\n"
