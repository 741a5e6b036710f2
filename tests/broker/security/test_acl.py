"""ACL bindings and decisions without a broker (broker/security/acl.py): each rule of
docs/protocol.md section 7 "Authorization" by hand, then the index against a scan of
every binding over random bindings, queries and deletions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.security.acl import (
    ASKABLE_OPERATIONS,
    OPERATIONS,
    AclBinding,
    AclFilter,
    AclRecordError,
    Authorizer,
    canonical_host,
    create_record,
    delete_record,
    validate,
    validate_filter,
)

ALICE, BOB, CAROL = "User:alice", "User:bob", "User:carol"
HOST = "10.0.0.1"


def acl(
    name: str,
    operation: str = "read",
    permission: str = "allow",
    principal: str = ALICE,
    host: str = "*",
    pattern: str = "literal",
    resource_type: str = "topic",
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def authorizer(*bindings: AclBinding, super_users: tuple[str, ...] = ()) -> Authorizer:
    index = Authorizer(super_users)
    for b in bindings:
        assert index.add(b)
    return index


def may(
    index: Authorizer,
    operation: str,
    name: str,
    principal: str = ALICE,
    host: str = HOST,
    resource_type: str = "topic",
) -> bool:
    return index.authorize(principal, host, operation, resource_type, name)


# ------------------------------------------------------------------ matching


def test_nothing_is_allowed_without_a_binding() -> None:
    index = authorizer()
    assert not any(may(index, op, "orders") for op in ASKABLE_OPERATIONS)


def test_a_literal_name_matches_itself_only() -> None:
    index = authorizer(acl("orders"))
    assert may(index, "read", "orders")
    assert not may(index, "read", "orders2")
    assert not may(index, "read", "order")
    assert not may(index, "read", "*")  # a resource named `*` is a name like any other
    assert not may(index, "write", "orders")
    assert not may(index, "read", "orders", principal=BOB)
    assert not may(index, "read", "orders", resource_type="group")


def test_a_prefixed_name_matches_the_names_that_start_with_it() -> None:
    index = authorizer(acl("ord", "write", pattern="prefixed"), acl("x", pattern="prefixed"))
    for name in ("ord", "orders", "ord.eu"):
        assert may(index, "write", name)
    for name in ("or", "xord", "Orders", "*"):
        assert not may(index, "write", name)
    assert may(index, "read", "x") and may(index, "read", "xord")


def test_the_literal_name_star_matches_every_resource_of_its_type() -> None:
    index = authorizer(acl("*", "describe"))
    assert may(index, "describe", "anything") and may(index, "describe", "*")
    assert not may(index, "describe", "anything", resource_type="group")
    assert not may(index, "read", "anything")


def test_a_prefixed_star_is_a_prefix_not_a_wildcard() -> None:
    index = authorizer(acl("*", pattern="prefixed"))
    assert may(index, "read", "*x")
    assert not may(index, "read", "x")


def test_user_star_matches_every_principal() -> None:
    index = authorizer(acl("orders", principal="User:*"))
    assert may(index, "read", "orders", principal=ALICE)
    assert may(index, "read", "orders", principal="User:ANONYMOUS")
    assert not may(index, "read", "other", principal=BOB)


def test_a_host_matches_that_address_and_star_every_address() -> None:
    index = authorizer(acl("orders", host="10.0.0.1"), acl("orders", "write", host="*"))
    assert may(index, "read", "orders", host="10.0.0.1")
    assert not may(index, "read", "orders", host="10.0.0.2")
    assert may(index, "write", "orders", host="10.0.0.2")
    assert may(index, "write", "orders", host="::1")


def test_hosts_are_compared_in_one_spelling() -> None:
    index = authorizer(acl("a", host="2001:DB8:0::1"), acl("b", host="::ffff:10.0.0.1"))
    assert may(index, "read", "a", host=canonical_host("2001:db8::0:1"))
    assert may(index, "read", "b", host=canonical_host("10.0.0.1"))
    assert may(index, "read", "b", host=canonical_host("::ffff:10.0.0.1"))
    assert canonical_host("*") == "*"
    with pytest.raises(ValueError):
        canonical_host("localhost")


def test_the_cluster_is_named_cluster() -> None:
    index = authorizer(acl("cluster", "idempotent_write", resource_type="cluster"))
    assert may(index, "idempotent_write", "cluster", resource_type="cluster")
    assert not may(index, "idempotent_write", "cluster", principal=BOB, resource_type="cluster")


# ------------------------------------------------------------------ deny, implications


def test_deny_wins_over_allow_wherever_either_comes_from() -> None:
    index = authorizer(
        acl("*", "all", principal="User:*"),
        acl("secret", "write", "deny", pattern="prefixed"),
        acl("audit", "read", "deny", principal="User:*", host="10.0.0.9"),
    )
    assert not may(index, "write", "secret-eu")
    assert may(index, "read", "secret-eu")
    assert may(index, "write", "secret-eu", principal=BOB)
    assert not may(index, "read", "audit", principal=BOB, host="10.0.0.9")
    assert may(index, "read", "audit", principal=BOB, host="10.0.0.8")
    # A user's own allow does not undo a deny of User:*.
    index.add(acl("audit", "read", host="10.0.0.9", principal=BOB))
    assert not may(index, "read", "audit", principal=BOB, host="10.0.0.9")


# What an allow of each operation allows, written out from section 7.
ALLOWS = {
    "all": ASKABLE_OPERATIONS,
    "read": {"read", "describe"},
    "write": {"write", "describe"},
    "delete": {"delete", "describe"},
    "alter": {"alter", "describe"},
    "alter_configs": {"alter_configs", "describe_configs"},
    "describe": {"describe"},
    "describe_configs": {"describe_configs"},
    "create": {"create"},
    "idempotent_write": {"idempotent_write"},
}


@pytest.mark.parametrize("granted", sorted(OPERATIONS))
def test_an_allow_allows_its_operation_and_what_it_implies(granted: str) -> None:
    assert set(ALLOWS) == OPERATIONS
    index = authorizer(acl("t", granted))
    assert {op for op in ASKABLE_OPERATIONS if may(index, op, "t")} == ALLOWS[granted]


@pytest.mark.parametrize("denied", sorted(OPERATIONS))
def test_a_deny_denies_its_operation_alone_and_all_denies_everything(denied: str) -> None:
    index = authorizer(acl("t", "all"), acl("t", denied, "deny"))
    refused = {op for op in ASKABLE_OPERATIONS if not may(index, op, "t")}
    assert refused == (ASKABLE_OPERATIONS if denied == "all" else {denied})


def test_super_users_are_allowed_everything_even_what_is_denied() -> None:
    index = authorizer(acl("*", "all", "deny", principal="User:*"), super_users=("User:root",))
    assert all(may(index, op, "t", principal="User:root") for op in ASKABLE_OPERATIONS)
    assert index.authorize_any("User:root", HOST, "write", "topic")
    assert not may(index, "read", "t", principal=ALICE)


# ------------------------------------------------------------------ any resource of a type


@pytest.mark.parametrize(
    ("bindings", "expected"),
    [
        ([], False),
        ([acl("a", "write")], True),
        ([acl("a", "read")], False),
        ([acl("a", "write", principal=BOB)], False),
        ([acl("a", "write", host="10.0.0.2")], False),
        ([acl("a", "write", principal="User:*")], True),
        ([acl("a", "write"), acl("a", "write", "deny")], False),
        ([acl("a", "all"), acl("a", "write", "deny", principal="User:*")], False),
        ([acl("a", "write"), acl("b", "write"), acl("a", "write", "deny")], True),
        ([acl("a", "write"), acl("a", "write", "deny", pattern="prefixed")], False),
        ([acl("ab", "write", pattern="prefixed"), acl("abc", "write", "deny")], True),
        (
            [
                acl("ab", "write", pattern="prefixed"),
                acl("abc", "write", "deny", pattern="prefixed"),
            ],
            True,
        ),
        (
            [acl("ab", "write", pattern="prefixed"), acl("a", "write", "deny", pattern="prefixed")],
            False,
        ),
        ([acl("*", "write"), acl("a", "write", "deny", pattern="prefixed")], True),
        ([acl("*", "write"), acl("*", "write", "deny", pattern="prefixed")], True),
        ([acl("*", "write"), acl("*", "all", "deny", principal="User:*")], False),
        ([acl("a", "write", pattern="prefixed"), acl("*", "write", "deny")], False),
        ([acl("a", "write"), acl("a", "read", "deny")], True),
        ([acl("a", "write", resource_type="group")], False),
    ],
)
def test_write_on_any_topic(bindings: list[AclBinding], expected: bool) -> None:
    assert authorizer(*bindings).authorize_any(ALICE, HOST, "write", "topic") == expected


def test_any_resource_counts_implied_allows() -> None:
    index = authorizer(acl("a", "read"), acl("b", "describe", "deny"))
    assert index.authorize_any(ALICE, HOST, "describe", "topic")
    assert not index.authorize_any(ALICE, HOST, "describe", "group")


# ------------------------------------------------------------------ filters


ORDERS = acl("orders")
ORD_PREFIX = acl("ord", pattern="prefixed")
STAR = acl("*", "describe", principal="User:*")
GROUP = acl("orders", "read", "deny", principal=BOB, host="10.0.0.1", resource_type="group")
ALL_BINDINGS = [ORDERS, ORD_PREFIX, STAR, GROUP, acl("other", pattern="prefixed")]


@pytest.mark.parametrize(
    ("acl_filter", "expected"),
    [
        (AclFilter(), ALL_BINDINGS),
        (AclFilter(resource_type="group"), [GROUP]),
        (AclFilter(resource_name="orders"), [ORDERS, GROUP]),
        (AclFilter(resource_name="orders", pattern_type="any"), [ORDERS, GROUP]),
        (AclFilter(resource_name="ord", pattern_type="any"), [ORD_PREFIX]),
        (AclFilter(resource_name="ord", pattern_type="literal"), []),
        (AclFilter(pattern_type="prefixed"), [ORD_PREFIX, ALL_BINDINGS[4]]),
        (AclFilter("topic", "orders", "match"), [ORDERS, ORD_PREFIX, STAR]),
        (AclFilter("topic", "ord", "match"), [ORD_PREFIX, STAR]),
        (AclFilter("topic", "or", "match"), [STAR]),
        (
            AclFilter(resource_name="orders", pattern_type="match"),
            [ORDERS, ORD_PREFIX, STAR, GROUP],
        ),
        (AclFilter(pattern_type="match"), ALL_BINDINGS),
        (AclFilter(principal="User:*"), [STAR]),
        (AclFilter(host="10.0.0.1"), [GROUP]),
        (AclFilter(operation="describe"), [STAR]),
        (AclFilter(permission="deny"), [GROUP]),
        (AclFilter(operation="all"), []),
    ],
)
def test_filters(acl_filter: AclFilter, expected: list[AclBinding]) -> None:
    assert validate_filter(acl_filter) is None
    assert authorizer(*ALL_BINDINGS).describe(acl_filter) == expected


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"resource_type": "queue"}, "unknown resource_type 'queue'"),
        ({"pattern_type": "match"}, "unknown pattern_type 'match'"),
        ({"resource_name": ""}, "resource_name is empty"),
        ({"resource_name": "x" * 256}, "longer than 255"),
        ({"resource_type": "cluster", "resource_name": "kafka-cluster"}, "is 'cluster'"),
        ({"principal": "alice"}, "not User:<name>"),
        ({"principal": "User:"}, "not User:<name>"),
        ({"principal": "Group:ops"}, "not User:<name>"),
        ({"principal": "User:" + "x" * 256}, "principal is longer"),
        ({"host": "localhost"}, "not an IP address"),
        ({"host": ""}, "not an IP address"),
        ({"host": "1" * 100}, "not an IP address"),
        ({"operation": "any"}, "unknown operation 'any'"),
        ({"permission": "maybe"}, "unknown permission 'maybe'"),
    ],
)
def test_invalid_bindings_say_why(change: dict[str, str], reason: str) -> None:
    bad = ORDERS._replace(**change)
    found = validate(bad)
    assert found is not None and reason in found
    assert (validate_filter(AclFilter(**bad._asdict())) is None) == (
        change == {"pattern_type": "match"}
    )


@pytest.mark.parametrize(
    "good",
    [
        ORDERS,
        acl("cluster", "alter", resource_type="cluster"),
        acl("*", principal="User:*", host="::1"),
        acl("x" * 255, pattern="prefixed", host="fe80::1%eth0"),
        acl("t", principal="User:CN=alice,O=example"),
    ],
)
def test_valid_bindings(good: AclBinding) -> None:
    assert validate(good) is None


# ------------------------------------------------------------------ records


def test_records_replay_in_order_and_refuse_what_does_not_fit() -> None:
    index = Authorizer()
    index.apply(create_record([ORDERS, STAR, GROUP]))
    index.apply(delete_record([STAR]))
    index.apply(create_record([STAR]))
    assert list(index) == [ORDERS, GROUP, STAR]
    replayed = Authorizer()
    for record in index.snapshot():
        replayed.apply(record)
    assert list(replayed) == list(index)
    for bad in (
        create_record([ORD_PREFIX, ORDERS]),  # ORDERS is in force
        delete_record([ORDERS, ORD_PREFIX]),  # ORD_PREFIX is not
        create_record([ORD_PREFIX, ORD_PREFIX]),
        ["rename", [list(ORDERS)]],
        ["create", [list(ORDERS)[:6]]],
        ["create", [[*list(ORDERS)[:6], 1]]],
        ["create", [list(ORDERS._replace(principal="alice"))]],
        ["create"],
        "create",
        None,
    ):
        with pytest.raises(AclRecordError):
            index.apply(bad)
        assert list(index) == [ORDERS, GROUP, STAR]


def test_a_snapshot_is_cut_into_records_of_a_thousand() -> None:
    index = authorizer(*(acl(f"t{i}") for i in range(2500)))
    records = list(index.snapshot())
    assert [len(r[1]) for r in records] == [1000, 1000, 500]


def test_removing_every_binding_leaves_an_empty_index() -> None:
    bindings = [
        acl("a", "all", host="::ffff:10.0.0.1"),
        acl("a", "all", host="10.0.0.1"),  # the same host, spelt otherwise
        acl("a", "read"),
        acl("a", "write"),  # implies describe too
        acl("ab", pattern="prefixed"),
        acl("ac", pattern="prefixed"),
        acl("abc", pattern="prefixed", permission="deny"),
    ]
    index = authorizer(*bindings)
    assert not index.add(bindings[0])
    for b in reversed(bindings):
        assert index.remove(b)
        assert not index.remove(b)
    assert len(index) == 0 and index._patterns == {}  # nothing left behind to look at
    assert not may(index, "read", "a")


# ------------------------------------------------------------------ the index against a scan

NAMES = ["a", "ab", "abc", "b", "ba"]  # over "ab", so "z" starts a name no binding names
QUERY_NAMES = [*NAMES, "abd", "bab", "*", "z"]
PRINCIPALS = [ALICE, BOB, "User:*"]
QUERY_PRINCIPALS = [ALICE, BOB, CAROL]
HOSTS = ["*", "10.0.0.1", "10.0.0.2", "::ffff:10.0.0.1"]
QUERY_HOSTS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
TYPES = ["topic", "group"]
SUPER_USERS = (CAROL,)

# Weighted to what the invariant looks at (topics) and to `*`, whose rules are special.
bindings_st = st.builds(
    AclBinding,
    resource_type=st.sampled_from(["topic", "topic", "topic", "group"]),
    resource_name=st.sampled_from([*NAMES, "*", "*", "*"]),
    pattern_type=st.sampled_from(["literal", "prefixed"]),
    principal=st.sampled_from(PRINCIPALS),
    host=st.sampled_from(HOSTS),
    operation=st.sampled_from(sorted(OPERATIONS)),
    permission=st.sampled_from(["allow", "deny"]),
)
queries_st = st.tuples(
    st.sampled_from(QUERY_PRINCIPALS),
    st.sampled_from(QUERY_HOSTS),
    st.sampled_from(sorted(ASKABLE_OPERATIONS)),
    st.sampled_from(TYPES),
)
filters_st = st.builds(
    AclFilter,
    resource_type=st.none() | st.sampled_from(TYPES),
    resource_name=st.none() | st.sampled_from(QUERY_NAMES),
    pattern_type=st.none() | st.sampled_from(["literal", "prefixed", "any", "match"]),
    principal=st.none() | st.sampled_from(PRINCIPALS),
    host=st.none() | st.sampled_from(HOSTS),
    operation=st.none() | st.sampled_from(sorted(OPERATIONS)),
    permission=st.none() | st.sampled_from(["allow", "deny"]),
)


def scan_authorize(
    bindings: list[AclBinding], principal: str, host: str, op: str, rtype: str, name: str
) -> bool:
    """Section 7 read literally, over every binding."""
    if principal in SUPER_USERS:
        return True
    applying = [
        b
        for b in bindings
        if b.resource_type == rtype
        and b.principal in (principal, "User:*")
        and canonical_host(b.host) in (host, "*")
        and (
            name.startswith(b.resource_name)
            if b.pattern_type == "prefixed"
            else b.resource_name in (name, "*")
        )
    ]
    if any(b.permission == "deny" and b.operation in (op, "all") for b in applying):
        return False
    return any(b.permission == "allow" and op in ALLOWS[b.operation] for b in applying)


def scan_authorize_any(
    bindings: list[AclBinding], principal: str, host: str, op: str, rtype: str
) -> bool:
    """Some name is allowed: a name bindings name, or one no binding names ("z"), or one
    that only a prefix matches (the prefix and "z")."""
    names = {b.resource_name for b in bindings if b.resource_name != "*"} | {"z"}
    names |= {b.resource_name + "z" for b in bindings if b.pattern_type == "prefixed"}
    return any(scan_authorize(bindings, principal, host, op, rtype, n) for n in names)


def scan_filter(f: AclFilter, b: AclBinding) -> bool:
    if f.pattern_type == "match":
        named = f.resource_name is None or (
            f.resource_name.startswith(b.resource_name)
            if b.pattern_type == "prefixed"
            else b.resource_name in (f.resource_name, "*")
        )
    else:
        named = f.pattern_type in (None, "any", b.pattern_type) and f.resource_name in (
            None,
            b.resource_name,
        )
    wanted = (f.resource_type, f.principal, f.host, f.operation, f.permission)
    got = (b.resource_type, b.principal, b.host, b.operation, b.permission)
    return named and all(w is None or w == g for w, g in zip(wanted, got, strict=True))


class IndexAgainstScan(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = Authorizer(SUPER_USERS)
        self.bindings: list[AclBinding] = []

    @rule(binding=bindings_st)
    def add(self, binding: AclBinding) -> None:
        assert self.index.add(binding) == (binding not in self.bindings)
        if binding not in self.bindings:
            self.bindings.append(binding)

    @precondition(lambda self: self.bindings)
    @rule(
        which=st.integers(0, 1000),
        changed=st.sampled_from(AclBinding._fields),
        other=bindings_st,
    )
    def add_a_neighbour(self, which: int, changed: str, other: AclBinding) -> None:
        """A binding in force with one field changed: bindings that share a pattern, a host
        or what they decide are what the index's counts and clean-up are about."""
        neighbour = self.bindings[which % len(self.bindings)]._replace(
            **{changed: getattr(other, changed)}
        )
        self.add(neighbour)

    @precondition(lambda self: self.bindings)
    @rule(which=st.integers(0, 1000))
    def remove(self, which: int) -> None:
        binding = self.bindings.pop(which % len(self.bindings))
        assert self.index.remove(binding)
        assert not self.index.remove(binding)

    @rule(acl_filter=filters_st)
    def describe(self, acl_filter: AclFilter) -> None:
        assert self.index.describe(acl_filter) == [
            b for b in self.bindings if scan_filter(acl_filter, b)
        ]

    @precondition(lambda self: self.bindings)
    @rule(
        which=st.integers(0, 1000),
        kept=st.lists(st.booleans(), min_size=7, max_size=7),
        pattern_type=st.none() | st.sampled_from(["any", "match"]),
        name=st.none() | st.sampled_from(QUERY_NAMES),
    )
    def delete_by_filter(
        self, which: int, kept: list[bool], pattern_type: str | None, name: str | None
    ) -> None:
        """What DeleteAcls does: describe, then remove what was found; with a filter made
        from a binding in force, some of its fields left open, so that it finds some."""
        fields = [
            f if keep else None
            for f, keep in zip(self.bindings[which % len(self.bindings)], kept, strict=True)
        ]
        acl_filter = AclFilter(*fields)
        if pattern_type is not None:
            acl_filter = acl_filter._replace(pattern_type=pattern_type, resource_name=name)
        found = self.index.describe(acl_filter)
        assert found == [b for b in self.bindings if scan_filter(acl_filter, b)]
        for binding in found:
            assert self.index.remove(binding)
            self.bindings.remove(binding)

    @precondition(lambda self: self.bindings)
    @rule(which=st.integers(0, 1000))
    def remove_a_pattern(self, which: int) -> None:
        """Every binding of one pattern and principal, so the pattern leaves the index."""
        b = self.bindings[which % len(self.bindings)]
        whole = AclFilter(b.resource_type, b.resource_name, b.pattern_type, b.principal)
        for binding in self.index.describe(whole):
            assert self.index.remove(binding)
            self.bindings.remove(binding)

    @rule()
    def replay_a_snapshot(self) -> None:
        replayed = Authorizer(SUPER_USERS)
        for record in self.index.snapshot():
            replayed.apply(record)
        assert list(replayed) == self.bindings
        self.index = replayed

    @rule(query=queries_st, name=st.sampled_from(QUERY_NAMES))
    def decide(self, query: tuple[str, str, str, str], name: str) -> None:
        args: Any = (*query, name)
        assert self.index.authorize(*args) == scan_authorize(self.bindings, *args)

    @rule(query=queries_st)
    def any_resource(self, query: tuple[str, str, str, str]) -> None:
        assert self.index.authorize_any(*query) == scan_authorize_any(self.bindings, *query)

    @invariant()
    def same_decisions(self) -> None:
        """Every name and operation, for one principal and host: `decide` and
        `any_resource` pick the rest."""
        assert list(self.index) == self.bindings
        for op in sorted(ASKABLE_OPERATIONS):
            for name in QUERY_NAMES:
                args: Any = (ALICE, "10.0.0.1", op, "topic", name)
                assert self.index.authorize(*args) == scan_authorize(self.bindings, *args)
            query = (ALICE, "10.0.0.1", op, "topic")
            assert self.index.authorize_any(*query) == scan_authorize_any(self.bindings, *query)


IndexAgainstScan.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestIndexAgainstScan = IndexAgainstScan.TestCase
