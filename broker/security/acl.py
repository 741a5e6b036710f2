"""ACL bindings and the decisions they make, pure logic (docs/protocol.md section 7,
"Authorization").

An `AclBinding` allows or denies a principal, from a host, one operation on the
resources its pattern names; `validate` says why a binding from a request is refused
(INVALID_REQUEST). An `AclFilter` selects bindings for DescribeAcls and DeleteAcls.
The `Authorizer` holds the bindings in force and decides requests with them:

- super users are allowed everything;
- a literal name matches itself, the literal name `*` every resource of its type, a
  prefixed name every name that starts with it; `User:*` matches every principal and
  the host `*` every host;
- deny wins over allow; with no binding that allows, the answer is no;
- `all` covers every operation; an allow of read, write, delete or alter also allows
  describe, and of alter_configs describe_configs (an allow only: a deny of read
  denies read alone).

A decision must not cost a scan of every binding, so the `Authorizer` indexes them
by (resource type, principal, operation), with `all` and the implications of an allow
expanded when a binding is added; under each, literal names in a dict and prefixes in
a dict with the lengths that occur, so a name's matches cost one look-up per prefix
length in use. Each pattern keeps the hosts it allows and denies from, counted by
the bindings that name them, so a removal keeps the index in step.

Changes are records, msgpack lists whose first item names their kind, applied in
order; broker/security/acl_store.py appends them to `security/acls.wal`:

| kind     | fields after the kind                                   |
|----------|---------------------------------------------------------|
| "create" | [binding, ...]: each absent before, none twice          |
| "delete" | [binding, ...]: each present before, none twice         |

A binding is the list of its seven strings in `AclBinding`'s order. No IO.
"""

from __future__ import annotations

import bisect
import ipaddress
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

# The request declarations' terms, which bindings name too.
from protocol.authorization import CLUSTER_NAME as CLUSTER_NAME
from protocol.authorization import Operation as Operation
from protocol.authorization import ResourceType as ResourceType
from protocol.messages import IDENTIFIER_CHARS_MAX


class PatternType:
    """How a binding's name matches; ANY and MATCH are for filters only."""

    LITERAL: Final = "literal"
    PREFIXED: Final = "prefixed"
    ANY: Final = "any"
    MATCH: Final = "match"


class Permission:
    """Whether a binding allows or denies; deny wins."""

    ALLOW: Final = "allow"
    DENY: Final = "deny"


RESOURCE_TYPES: Final = frozenset(
    {ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER}
)
PATTERN_TYPES: Final = frozenset({PatternType.LITERAL, PatternType.PREFIXED})
FILTER_PATTERN_TYPES: Final = PATTERN_TYPES | {PatternType.ANY, PatternType.MATCH}
# What a request may be asked to have: `all` is only ever granted or denied.
ASKABLE_OPERATIONS: Final = frozenset(
    {
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
    }
)
OPERATIONS: Final = ASKABLE_OPERATIONS | {Operation.ALL}
PERMISSIONS: Final = frozenset({Permission.ALLOW, Permission.DENY})
_IMPLIED_BY_ALLOW: Final = {
    Operation.READ: Operation.DESCRIBE,
    Operation.WRITE: Operation.DESCRIBE,
    Operation.DELETE: Operation.DESCRIBE,
    Operation.ALTER: Operation.DESCRIBE,
    Operation.ALTER_CONFIGS: Operation.DESCRIBE_CONFIGS,
}

WILDCARD: Final = "*"
"""The literal resource name that matches every name of its type, and the host that
matches every host."""
USER_PREFIX: Final = "User:"
ANY_PRINCIPAL: Final = "User:*"

NAME_CHARS_MAX: Final = IDENTIFIER_CHARS_MAX  # the longest topic, group or transactional id
PRINCIPAL_CHARS_MAX: Final = len(USER_PREFIX) + IDENTIFIER_CHARS_MAX
HOST_CHARS_MAX: Final = 64  # an IPv6 address with a scope id fits; bounds the parse

CREATE: Final = "create"
DELETE: Final = "delete"
BINDINGS_PER_SNAPSHOT_RECORD: Final = 1000  # compaction's records stay small


class AclRecordError(ValueError):
    """A persisted record that does not decode to a consistent change."""


class AclBinding(NamedTuple):
    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str


class AclFilter(NamedTuple):
    """Selects bindings: None matches anything; `pattern_type` ANY (or None) matches either
    pattern type with the name equal, MATCH every binding that applies to the literal
    `resource_name` (the name itself, `*`, and the prefixes it starts with)."""

    resource_type: str | None = None
    resource_name: str | None = None
    pattern_type: str | None = None
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None

    def matches(self, binding: AclBinding) -> bool:
        return (
            _equal_or_any(self.resource_type, binding.resource_type)
            and self._matches_pattern(binding)
            and _equal_or_any(self.principal, binding.principal)
            and _equal_or_any(self.host, binding.host)
            and _equal_or_any(self.operation, binding.operation)
            and _equal_or_any(self.permission, binding.permission)
        )

    def _matches_pattern(self, binding: AclBinding) -> bool:
        name = self.resource_name
        if self.pattern_type == PatternType.MATCH:
            if name is None:
                return True
            if binding.pattern_type == PatternType.LITERAL:
                return binding.resource_name in (name, WILDCARD)
            return name.startswith(binding.resource_name)
        if self.pattern_type not in (None, PatternType.ANY, binding.pattern_type):
            return False
        return _equal_or_any(name, binding.resource_name)


def _equal_or_any(wanted: str | None, value: str) -> bool:
    return wanted is None or wanted == value


# ---------------------------------------------------------------------- validation


def validate(binding: AclBinding) -> str | None:
    """Why `binding` may not be created (the INVALID_REQUEST message), or None."""
    return _invalid(binding, PATTERN_TYPES)


def validate_filter(acl_filter: AclFilter) -> str | None:
    """Why `acl_filter` may not be used (INVALID_REQUEST), or None: what is given is held to
    a binding's rules, and `pattern_type` may also be any or match."""
    return _invalid(acl_filter, FILTER_PATTERN_TYPES)


def _invalid(fields: AclBinding | AclFilter, pattern_types: frozenset[str]) -> str | None:
    rtype, name, pattern, principal, host, operation, permission = fields
    if rtype is not None and rtype not in RESOURCE_TYPES:
        return f"unknown resource_type {rtype!r}; known: {', '.join(sorted(RESOURCE_TYPES))}"
    if pattern is not None and pattern not in pattern_types:
        return f"unknown pattern_type {pattern!r}; known: {', '.join(sorted(pattern_types))}"
    if name is not None:
        if not name:
            return "resource_name is empty"
        if len(name) > NAME_CHARS_MAX:
            return f"resource_name is longer than {NAME_CHARS_MAX} characters"
        if rtype == ResourceType.CLUSTER and name != CLUSTER_NAME:
            return f"the cluster's resource_name is {CLUSTER_NAME!r}, not {name!r}"
    if principal is not None:
        if len(principal) > PRINCIPAL_CHARS_MAX:
            return f"principal is longer than {PRINCIPAL_CHARS_MAX} characters"
        if not principal.startswith(USER_PREFIX) or principal == USER_PREFIX:
            return f"principal {principal!r} is not User:<name> or User:*"
    if host is not None:
        try:
            canonical_host(host)
        except ValueError:
            return f"host {host[:HOST_CHARS_MAX]!r} is not an IP address or *"
    if operation is not None and operation not in OPERATIONS:
        return f"unknown operation {operation!r}; known: {', '.join(sorted(OPERATIONS))}"
    if permission is not None and permission not in PERMISSIONS:
        return f"unknown permission {permission!r}; known: allow, deny"
    return None


def canonical_host(host: str) -> str:
    """The one spelling of an IP address that decisions compare (`*` stays `*`; an IPv4
    address mapped into IPv6 is the IPv4 address); ValueError when it is neither.

    A binding's host is compared in this form, so the caller of `authorize` passes the
    connection's address through it too (once per connection)."""
    if host == WILDCARD:
        return host
    if len(host) > HOST_CHARS_MAX:
        raise ValueError(f"host is longer than {HOST_CHARS_MAX} characters")
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def decided_operations(permission: str, operation: str) -> frozenset[str]:
    """The operations a binding of `permission` and `operation` decides: every one for
    `all`; for an allow, also those its operation implies."""
    if operation == Operation.ALL:
        return ASKABLE_OPERATIONS
    implied = _IMPLIED_BY_ALLOW.get(operation) if permission == Permission.ALLOW else None
    return frozenset({operation} if implied is None else {operation, implied})


# ---------------------------------------------------------------------- records


def create_record(bindings: Iterable[AclBinding]) -> list[Any]:
    return [CREATE, [list(b) for b in bindings]]


def delete_record(bindings: Iterable[AclBinding]) -> list[Any]:
    return [DELETE, [list(b) for b in bindings]]


def decode_binding(item: Any) -> AclBinding:
    """A binding read back from a record, held to `validate`; AclRecordError if it is not one."""
    if not (
        isinstance(item, list)
        and len(item) == len(AclBinding._fields)
        and all(isinstance(v, str) for v in item)
    ):
        raise AclRecordError(f"binding {item!r:.200} is not a list of seven strings")
    binding = AclBinding(*item)
    reason = validate(binding)
    if reason is not None:
        raise AclRecordError(f"binding {item!r:.200}: {reason}")
    return binding


# ---------------------------------------------------------------------- the index


@dataclass(slots=True)
class _Hosts:
    """The hosts that one pattern's bindings allow and deny one operation from, each
    counted by the bindings that name it (an allow of read and one of write both allow
    describe; `::ffff:10.0.0.1` and `10.0.0.1` are one host)."""

    allow: Counter[str] = field(default_factory=Counter)
    deny: Counter[str] = field(default_factory=Counter)

    def of(self, permission: str) -> Counter[str]:
        return self.allow if permission == Permission.ALLOW else self.deny


def _names(hosts: Counter[str], host: str) -> bool:
    return host in hosts or WILDCARD in hosts


@dataclass(slots=True)
class _Patterns:
    """The patterns of one (resource type, principal, operation)."""

    literal: dict[str, _Hosts] = field(default_factory=dict)
    prefixed: dict[str, _Hosts] = field(default_factory=dict)
    prefix_lengths: list[int] = field(default_factory=list)
    """The lengths of `prefixed`'s keys, ascending, each once."""
    length_counts: Counter[int] = field(default_factory=Counter)

    def matching(self, name: str) -> list[_Hosts]:
        """The hosts of every pattern that matches the resource `name`."""
        found = []
        hosts = self.literal.get(name)
        if hosts is not None:
            found.append(hosts)
        if name != WILDCARD:
            hosts = self.literal.get(WILDCARD)
            if hosts is not None:
                found.append(hosts)
        if self.prefix_lengths:
            found += self.prefix_covered(name)
        return found

    def prefix_covered(self, name: str) -> list[_Hosts]:
        """The hosts of every prefixed pattern that `name` starts with."""
        found = []
        size = len(name)
        for length in self.prefix_lengths:
            if length > size:
                break
            hosts = self.prefixed.get(name[:length])
            if hosts is not None:
                found.append(hosts)
        return found

    def hosts_of(self, pattern_type: str, name: str) -> _Hosts:
        """The pattern's hosts, made when new."""
        table = self.literal if pattern_type == PatternType.LITERAL else self.prefixed
        hosts = table.get(name)
        if hosts is None:
            hosts = table[name] = _Hosts()
            if table is self.prefixed:
                self.length_counts[len(name)] += 1
                if self.length_counts[len(name)] == 1:
                    bisect.insort(self.prefix_lengths, len(name))
        return hosts

    def drop(self, pattern_type: str, name: str) -> None:
        """Forget a pattern whose last binding went."""
        if pattern_type == PatternType.LITERAL:
            del self.literal[name]
            return
        del self.prefixed[name]
        self.length_counts[len(name)] -= 1
        if self.length_counts[len(name)] == 0:
            del self.length_counts[len(name)]
            self.prefix_lengths.remove(len(name))

    def __bool__(self) -> bool:
        return bool(self.literal or self.prefixed)


class Authorizer:
    """The ACL bindings in force, indexed for decisions; changed by records (`apply`) or
    directly (`add`, `remove`). Bindings keep the order they were created in."""

    def __init__(self, super_users: Iterable[str] = ()) -> None:
        self.super_users: frozenset[str] = frozenset()
        self.set_super_users(super_users)
        self._bindings: dict[AclBinding, None] = {}
        # (resource type, principal, operation decided) -> its patterns
        self._patterns: dict[tuple[str, str, str], _Patterns] = {}

    def set_super_users(self, super_users: Iterable[str]) -> None:
        """The principals allowed everything from now on (the setting, at start and reload)."""
        users = frozenset(super_users)
        assert all(u.startswith(USER_PREFIX) for u in users), users
        self.super_users = users

    def __len__(self) -> int:
        return len(self._bindings)

    def __contains__(self, binding: object) -> bool:
        return binding in self._bindings

    def __iter__(self) -> Iterator[AclBinding]:
        return iter(self._bindings)

    # ------------------------------------------------------------------ decisions

    def authorize(
        self, principal: str, host: str, operation: str, resource_type: str, resource_name: str
    ) -> bool:
        """Whether `principal`, connected from `host` (`canonical_host`'s form), may do
        `operation` on the resource."""
        assert operation in ASKABLE_OPERATIONS, operation
        if principal in self.super_users:
            return True
        allowed = False
        for who in (principal, ANY_PRINCIPAL):
            patterns = self._patterns.get((resource_type, who, operation))
            if patterns is None:
                continue
            for hosts in patterns.matching(resource_name):
                if _names(hosts.deny, host):
                    return False
                allowed = allowed or _names(hosts.allow, host)
        return allowed

    def authorize_any(self, principal: str, host: str, operation: str, resource_type: str) -> bool:
        """Whether `authorize` allows `operation` on at least one resource of the type, existing
        or not (InitProducerId without a transactional id: write on any topic).

        Costs a look at each pattern of the principal (and of User:*) for the type and
        operation, not at every binding. Names are taken as unbounded: a prefix or `*`
        that allows is undone only by a deny of `*` or of a prefix of it, never by
        literal denies, which leave longer names allowed."""
        assert operation in ASKABLE_OPERATIONS, operation
        if principal in self.super_users:
            return True
        mine = [
            p
            for who in dict.fromkeys((principal, ANY_PRINCIPAL))
            if (p := self._patterns.get((resource_type, who, operation))) is not None
        ]
        if any(_names(h.deny, host) for p in mine if (h := p.literal.get(WILDCARD))):
            return False
        for patterns in mine:
            for name, hosts in patterns.literal.items():
                if not _names(hosts.allow, host):
                    continue
                # `*` allows every name, and no deny of `*` applies (looked at above).
                if name == WILDCARD or not any(
                    _names(h.deny, host) for p in mine for h in p.matching(name)
                ):
                    return True
            for prefix, hosts in patterns.prefixed.items():
                if _names(hosts.allow, host) and not any(
                    _names(h.deny, host) for p in mine for h in p.prefix_covered(prefix)
                ):
                    return True
        return False

    def describe(self, acl_filter: AclFilter) -> list[AclBinding]:
        """The bindings `acl_filter` matches, in the order they were created. A scan: for
        DescribeAcls and DeleteAcls, which are rare; decisions use the index."""
        return [b for b in self._bindings if acl_filter.matches(b)]

    # ------------------------------------------------------------------ changes

    def add(self, binding: AclBinding) -> bool:
        """Put `binding` in force; False when it already was."""
        assert validate(binding) is None, binding
        if binding in self._bindings:
            return False
        self._bindings[binding] = None
        rtype, name, pattern_type, principal, host, operation, permission = binding
        host = canonical_host(host)
        for decided in decided_operations(permission, operation):
            patterns = self._patterns.setdefault((rtype, principal, decided), _Patterns())
            patterns.hosts_of(pattern_type, name).of(permission)[host] += 1
        return True

    def remove(self, binding: AclBinding) -> bool:
        """Take `binding` out of force; False when it was not in force."""
        if binding not in self._bindings:
            return False
        del self._bindings[binding]
        rtype, name, pattern_type, principal, host, operation, permission = binding
        host = canonical_host(host)
        for decided in decided_operations(permission, operation):
            key = (rtype, principal, decided)
            patterns = self._patterns[key]
            hosts = patterns.hosts_of(pattern_type, name)
            counts = hosts.of(permission)
            counts[host] -= 1
            assert counts[host] >= 0, binding
            if counts[host] == 0:
                del counts[host]
                if not hosts.allow and not hosts.deny:
                    patterns.drop(pattern_type, name)
                    if not patterns:
                        del self._patterns[key]
        return True

    def apply(self, record: Any) -> None:
        """Apply one record (new, or read back from the log); AclRecordError when it is
        malformed or does not fit the bindings in force, before anything changed."""
        try:
            kind, items = record
            items = list(items)
        except (TypeError, ValueError) as exc:
            raise AclRecordError(f"acl record {record!r:.200}: {exc}") from exc
        bindings = [decode_binding(item) for item in items]
        if len(set(bindings)) != len(bindings):
            raise AclRecordError(f"acl record {record!r:.200} names a binding twice")
        if kind == CREATE:
            present = [b for b in bindings if b in self._bindings]
            if present:
                raise AclRecordError(f"acl record creates {present[0]} that is in force")
            for binding in bindings:
                self.add(binding)
        elif kind == DELETE:
            absent = [b for b in bindings if b not in self._bindings]
            if absent:
                raise AclRecordError(f"acl record deletes {absent[0]} that is not in force")
            for binding in bindings:
                self.remove(binding)
        else:
            raise AclRecordError(f"acl record of unknown kind {kind!r:.50}")

    def snapshot(self) -> Iterator[list[Any]]:
        """ "create" records of every binding in force, in order: the whole set, for compaction."""
        ordered = list(self._bindings)
        for start in range(0, len(ordered), BINDINGS_PER_SNAPSHOT_RECORD):
            yield create_record(ordered[start : start + BINDINGS_PER_SNAPSHOT_RECORD])
