"""Authorization without a broker: the requirements every request class declares
(protocol/authorization.py, docs/protocol.md section 7's table) and their enforcement
(broker/security/authorization.py) against an `Authorizer` in memory, the audit's
holding back of repeats, and where producer ids' owners are kept (broker/partitions/producer_ids.py,
the transaction entries). tests/broker/security/test_authorization_broker.py proves the
same through the real broker process."""

from __future__ import annotations

import dataclasses
import logging
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from broker.partitions.producer_ids import ID_BLOCK_SIZE, ProducerIdManager
from broker.security import Access, AclBinding, Audit, Authorizer, Denial
from broker.storage import unseal
from broker.transactions.state import TxnEntry
from protocol import messages as m
from protocol.authorization import (
    ANONYMOUS,
    DENIAL_CODES,
    Omission,
    RequestNeed,
    Requirements,
)
from protocol.errors import ErrorCode

ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(
    resource_type: str,
    name: str,
    operation: str,
    permission: str = "allow",
    principal: str = ALICE,
    pattern: str = "literal",
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def access(*bindings: AclBinding, existing: tuple[str, ...] = ("orders",)) -> Access:
    authorizer = Authorizer(["User:admin"])
    for b in bindings:
        authorizer.add(b)
    return Access(authorizer, lambda rtype, name: rtype == "topic" and name not in existing)


# ---------------------------------------------------------------------- the declarations


def _element(owner: type[msgspec.Struct], field: str) -> Any:
    """The type of the items of `owner`'s list field (None-able or not)."""
    hint = typing.get_type_hints(owner)[field]
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is list:
            return typing.get_args(arg)[0]
    raise AssertionError(f"{owner.__name__}.{field} is not a list")


def _has(owner: Any, name: str) -> bool:
    return isinstance(owner, type) and name in getattr(owner, "__struct_fields__", ())


@pytest.mark.parametrize("cls", m.REQUEST_CLASSES, ids=lambda c: c.__name__)
def test_every_request_class_declares_what_it_needs(cls: type[m.Request]) -> None:
    """Declared on the class itself (never inherited by accident), and every name the
    declaration uses is a field of the message it reads."""
    assert "requirements" in vars(cls), f"{cls.__name__} declares no requirements"
    requirements: Requirements = cls.requirements
    entries = requirements.entries
    if entries is not None:
        assert _has(cls, entries.field) and _has(cls.response, entries.answers)
        item = _element(cls, entries.field)
        for need in requirements.entry_needs:
            if need.name:
                assert _has(item, need.name), (need, item)
            if need.where is not None:
                assert _has(item, need.where[0]), need
    for need in requirements.needs:
        assert need.resource_type in DENIAL_CODES
        assert need.when is None or _has(cls, need.when)
        assert need.unless is None or _has(cls, need.unless)
        if isinstance(need, RequestNeed | Omission) and need.names is not None:
            owner = cls.response if isinstance(need, Omission) and need.in_response else cls
            for field in need.within if isinstance(need, Omission) else ():
                owner = _element(owner, field)
            path = need.names
            assert _has(owner, path.field), (need, owner)
            if path.key is not None:
                assert _has(_element(owner, path.field), path.key), need


def test_the_table_of_section_7_is_declared() -> None:
    """The needs docs/protocol.md section 7 names, spot-checked against the declaration:
    operation, resource type and the code a denial answers."""

    def needs(api: str) -> set[tuple[str, str, str, int]]:
        declared = m.REQUEST_TYPES[api].requirements.needs
        return {
            (
                type(n).__name__,
                n.operation,
                n.resource_type,
                0 if isinstance(n, Omission) else n.denied,
            )
            for n in declared
        }

    assert needs("ApiVersions") == needs("SaslAuthenticate") == set()
    assert needs("Produce") == {
        ("RequestNeed", "write", "transactional_id", 53),
        ("EntryNeed", "write", "topic", 29),
    }
    assert needs("Fetch") == {("EntryNeed", "read", "topic", 29)}
    assert needs("ListOffsets") == {("EntryNeed", "describe", "topic", 29)}
    assert needs("CommitTxns") == {("RequestNeed", "write", "transactional_id", 53)}
    assert needs("ListTransactions") == {("Omission", "describe", "transactional_id", 0)}
    assert needs("DescribeTxnApps") == {("RequestNeed", "describe", "cluster", 31)}
    assert needs("ConsumerGroupHeartbeat") == {
        ("RequestNeed", "read", "group", 30),
        ("Omission", "describe", "topic", 0),
    }
    assert needs("TxnOffsetCommit") == {
        ("RequestNeed", "write", "transactional_id", 53),
        ("RequestNeed", "read", "group", 30),
        ("EntryNeed", "read", "topic", 29),
    }
    assert needs("OffsetFetch") == {
        ("RequestNeed", "describe", "group", 30),
        ("Omission", "describe", "topic", 0),
    }
    assert needs("ListGroups") == {("Omission", "describe", "group", 0)}
    assert needs("DescribeGroups") == {
        ("EntryNeed", "describe", "group", 30),
        ("Omission", "describe", "topic", 0),
    }
    for api in ("CreateAcls", "DeleteAcls", "AlterUserScramCredentials"):
        assert needs(api) == {("RequestNeed", "alter", "cluster", 31)}
    for api in ("DescribeAcls", "DescribeUserScramCredentials"):
        assert needs(api) == {("RequestNeed", "describe", "cluster", 31)}


def test_the_docs_table_is_the_declaration() -> None:
    """docs/security.md's table is generated from the declarations (as
    docs/configuration.md's is from the settings): regenerate it with
    `python -c 'from protocol.messages import requirements_table; print(requirements_table())'`."""
    docs = Path(__file__).resolve().parents[3] / "docs" / "security.md"
    assert m.requirements_table() in docs.read_text()


# ---------------------------------------------------------------------- whole requests


def produce(*topics: str, tid: str | None = None, acks: int = -1) -> m.ProduceRequest:
    return m.ProduceRequest(
        acks=acks,
        transactional_id=tid,
        topics=[
            m.ProduceTopic(t, [m.ProducePartition(0, b"x"), m.ProducePartition(1, b"y")])
            for t in topics
        ],
    )


def test_a_request_need_denied_refuses_everything_with_its_code() -> None:
    a = access(acl("topic", "orders", "write"))
    judged = a.judge(produce("orders", tid="t1"), ALICE, HOST)
    assert judged.refused and judged.denials == [Denial("transactional_id", "t1", "write")]
    refusal = judged.refusal
    assert isinstance(refusal, m.ProduceResponse)
    assert refusal.error == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert [(p.partition, p.error) for p in refusal.topics[0].partitions] == [(0, 53), (1, 53)]
    # acks=0: refused all the same, and no answer at all.
    judged = a.judge(produce("orders", tid="t1", acks=0), ALICE, HOST)
    assert judged.refused and judged.refusal is None


def test_commit_txns_needs_every_id_and_answers_53_in_each_entry() -> None:
    a = access(acl("transactional_id", "w-", "write", pattern="prefixed"))
    req = m.CommitTxnsRequest(
        transactions=[m.TxnRef("w-1", 1, 0), m.TxnRef("x-2", 2, 0)], committed=True
    )
    judged = a.judge(req, ALICE, HOST)
    assert judged.refused and judged.denials == [Denial("transactional_id", "x-2", "write")]
    assert isinstance(judged.refusal, m.CommitTxnsResponse)
    assert judged.refusal.error == 53
    assert [(t.transactional_id, t.error) for t in judged.refusal.transactions] == [
        ("w-1", 53),
        ("x-2", 53),
    ]
    req.transactions.pop()
    assert not a.judge(req, ALICE, HOST).refused


def test_init_producer_id_idempotent_write_on_cluster_or_write_on_any_topic() -> None:
    req = m.InitProducerIdRequest()
    assert access().judge(req, ALICE, HOST).refusal.error == 31  # type: ignore[union-attr]
    assert not access(acl("cluster", "cluster", "idempotent_write")).judge(req, ALICE, HOST).refused
    assert (
        not access(acl("topic", "logs-", "write", pattern="prefixed"))
        .judge(req, ALICE, HOST)
        .refused
    )
    # A write on any topic is not a write on a transactional id.
    txn = m.InitProducerIdRequest(transactional_id="t1")
    judged = access(acl("topic", "*", "write")).judge(txn, ALICE, HOST)
    assert judged.refusal is not None and judged.refusal.error == 53
    assert not access(acl("transactional_id", "t1", "write")).judge(txn, ALICE, HOST).refused


def test_acl_apis_need_the_cluster_and_answer_31_per_entry() -> None:
    req = m.CreateAclsRequest(creations=[m.AclBinding(*acl("topic", "x", "read"))] * 2)
    judged = access(acl("cluster", "cluster", "describe")).judge(req, ALICE, HOST)
    assert isinstance(judged.refusal, m.CreateAclsResponse)
    assert judged.refusal.error == 31
    assert [r.error for r in judged.refusal.results] == [31, 31]
    assert not access(acl("cluster", "cluster", "alter")).judge(req, ALICE, HOST).refused
    # describe is implied by alter; alter is not implied by all else than `all`.
    describe = m.DescribeAclsRequest(filter=m.AclBindingFilter(*[None] * 7))
    assert not access(acl("cluster", "cluster", "alter")).judge(describe, ALICE, HOST).refused
    assert not access(acl("cluster", "cluster", "all")).judge(req, ALICE, HOST).refused


def test_alter_scram_credentials_answers_31_once_per_user_named() -> None:
    s256 = "SCRAM-SHA-256"
    req = m.AlterUserScramCredentialsRequest(
        deletions=[m.ScramCredentialDeletion("bob", s256)],
        upsertions=[
            m.ScramCredentialUpsertion("carol", s256, 4096, b"s" * 16, b"p" * 32),
            m.ScramCredentialUpsertion("bob", "SCRAM-SHA-512", 4096, b"s" * 16, b"p" * 64),
        ],
    )
    judged = access().judge(req, ALICE, HOST)
    assert isinstance(judged.refusal, m.AlterUserScramCredentialsResponse)
    assert [(r.user, r.error) for r in judged.refusal.results] == [("bob", 31), ("carol", 31)]


def test_super_users_and_deny_over_allow() -> None:
    a = access(acl("topic", "*", "write"), acl("topic", "orders", "write", "deny"))
    assert a.judge(produce("orders"), ALICE, HOST).denials == [Denial("topic", "orders", "write")]
    assert not a.judge(produce("orders"), "User:admin", HOST).denials
    assert a.judge(produce("other"), ALICE, HOST).denials == []
    # Another principal has nothing: `User:*` would be needed.
    assert a.judge(produce("other"), BOB, HOST).refused


# ---------------------------------------------------------------------- entries


def test_denied_entries_are_left_out_and_answered_in_their_place() -> None:
    a = access(acl("topic", "a", "write"), acl("topic", "c", "write"))
    judged = a.judge(produce("a", "b", "c"), ALICE, HOST)
    assert not judged.refused
    assert [t.topic for t in judged.request.topics] == ["a", "c"]  # type: ignore[attr-defined]
    assert judged.denials == [Denial("topic", "b", "write")]
    handled = m.ProduceResponse(
        topics=[
            m.ProduceTopicResponse(
                "a", [m.ProducePartitionResponse(0), m.ProducePartitionResponse(1)]
            ),
            m.ProduceTopicResponse(
                "c", [m.ProducePartitionResponse(0), m.ProducePartitionResponse(1)]
            ),
        ]
    )
    judged.finish(handled)
    assert [(t.topic, [p.error for p in t.partitions]) for t in handled.topics] == [
        ("a", [0, 0]),
        ("b", [29, 29]),
        ("c", [0, 0]),
    ]
    assert "may not write topic 'b'" in (handled.topics[1].partitions[0].message or "")


def test_every_entry_denied_is_answered_without_the_handler() -> None:
    req = m.FetchRequest(topics=[m.FetchTopic("secret", [m.FetchPartition(0, 0)])])
    judged = access().judge(req, ALICE, HOST)
    assert judged.refused and isinstance(judged.refusal, m.FetchResponse)
    assert judged.refusal.error == 0
    assert judged.refusal.topics[0].partitions[0].error == 29


def test_metadata_is_handled_with_no_topic_left_for_its_brokers() -> None:
    req = m.MetadataRequest(topics=["secret"])
    judged = access().judge(req, ALICE, HOST)
    assert not judged.refused and judged.request.topics == []  # type: ignore[attr-defined]
    response = m.MetadataResponse(brokers=[m.BrokerMetadata(0, "h", 1)])
    judged.finish(response)
    assert [(t.name, t.error) for t in response.topics] == [("secret", 29)]


def test_metadata_auto_creation_needs_create_on_the_cluster_or_the_topic() -> None:
    req = m.MetadataRequest(topics=["orders", "new"], allow_auto_create=True)
    describe_all = acl("topic", "*", "describe")
    judged = access(describe_all).judge(req, ALICE, HOST)
    # "orders" exists: describe suffices; "new" would be created: create is needed.
    assert judged.request.topics == ["orders"]  # type: ignore[attr-defined]
    assert judged.denials == [Denial("topic", "new", "create")]
    for grant in (acl("topic", "new", "create"), acl("cluster", "cluster", "create")):
        assert access(describe_all, grant).judge(req, ALICE, HOST).denials == []
    # Without allow_auto_create, nothing is created and describe is all it takes.
    req.allow_auto_create = False
    assert access(describe_all).judge(req, ALICE, HOST).denials == []


def test_create_topics_on_the_topic_or_the_cluster() -> None:
    req = m.CreateTopicsRequest(topics=[m.CreatableTopic("a", 1), m.CreatableTopic("b", 1)])
    judged = access(acl("topic", "a", "create")).judge(req, ALICE, HOST)
    assert [t.name for t in judged.request.topics] == ["a"]  # type: ignore[attr-defined]
    response = m.CreateTopicsResponse(topics=[m.CreateTopicResult("a")])
    judged.finish(response)
    assert [(t.name, t.error) for t in response.topics] == [("a", 0), ("b", 29)]
    assert access(acl("cluster", "cluster", "create")).judge(req, ALICE, HOST).denials == []


def test_describe_configs_of_the_broker_needs_the_cluster() -> None:
    req = m.DescribeConfigsRequest(
        resources=[m.ConfigResource("topic", "orders"), m.ConfigResource("broker", "0")]
    )
    judged = access(acl("topic", "orders", "alter_configs")).judge(req, ALICE, HOST)
    assert judged.denials == [Denial("cluster", "cluster", "describe_configs")]
    response = m.DescribeConfigsResponse(results=[m.DescribeConfigsResult("topic", "orders")])
    judged.finish(response)
    assert [(r.type, r.error) for r in response.results] == [("topic", 0), ("broker", 31)]


def test_offset_commit_group_first_then_each_topic() -> None:
    req = m.OffsetCommitRequest(
        group_id="g",
        topics=[
            m.OffsetCommitTopic("a", [m.OffsetCommitPartition(0, 5)]),
            m.OffsetCommitTopic("b", [m.OffsetCommitPartition(0, 5)]),
        ],
    )
    judged = access(acl("topic", "*", "read")).judge(req, ALICE, HOST)
    assert judged.refusal is not None and judged.refusal.error == 30
    assert isinstance(judged.refusal, m.OffsetCommitResponse)
    assert [p.error for t in judged.refusal.topics for p in t.partitions] == [30, 30]
    judged = access(acl("group", "g", "read"), acl("topic", "a", "read")).judge(req, ALICE, HOST)
    assert judged.denials == [Denial("topic", "b", "read")]


def test_describe_groups_answers_30_for_the_group_denied() -> None:
    req = m.DescribeGroupsRequest(group_ids=["g1", "g2"])
    judged = access(
        acl("group", "g", "describe", pattern="prefixed"), acl("group", "g2", "describe", "deny")
    ).judge(req, ALICE, HOST)
    response = m.DescribeGroupsResponse(groups=[m.GroupDescription("g1", state="STABLE")])
    judged.finish(response)
    assert [(g.group_id, g.error) for g in response.groups] == [("g1", 0), ("g2", 30)]


# ---------------------------------------------------------------------- omissions


def test_listings_leave_out_what_may_not_be_described_and_audit_nothing() -> None:
    a = access(acl("group", "pay", "read", pattern="prefixed"))
    judged = a.judge(m.ListGroupsRequest(), ALICE, HOST)
    assert not judged.refused and judged.denials == []
    response = m.ListGroupsResponse(
        groups=[m.GroupListing("payments", "STABLE"), m.GroupListing("billing", "EMPTY")]
    )
    judged.finish(response)
    assert [g.group_id for g in response.groups] == ["payments"]  # read implies describe

    judged = access(acl("topic", "orders", "describe")).judge(m.MetadataRequest(), ALICE, HOST)
    response_md = m.MetadataResponse(topics=[m.TopicMetadata("orders"), m.TopicMetadata("x")])
    judged.finish(response_md)
    assert [t.name for t in response_md.topics] == ["orders"]

    txns = access(acl("transactional_id", "*", "describe")).judge(
        m.ListTransactionsRequest(), BOB, HOST
    )
    listing = m.ListTransactionsResponse(transactions=[m.TransactionListing("t", 1, 0, "EMPTY")])
    txns.finish(listing)
    assert listing.transactions == []  # the ACL is alice's


def test_a_heartbeat_subscribes_to_the_topics_it_may_describe() -> None:
    req = m.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="",
        member_epoch=0,
        rebalance_timeout_ms=1000,
        subscribed_topics=["orders", "secret"],
    )
    a = access(acl("group", "g", "read"), acl("topic", "orders", "read"))
    judged = a.judge(req, ALICE, HOST)
    assert judged.request.subscribed_topics == ["orders"]  # type: ignore[attr-defined]
    assert req.subscribed_topics == ["orders", "secret"]  # the decoded request is untouched
    assert judged.denials == []
    assert a.judge(req, BOB, HOST).refusal.error == 30  # type: ignore[union-attr]


def test_offset_fetch_leaves_out_topics() -> None:
    req = m.OffsetFetchRequest(group_id="g", topics=None)
    judged = access(acl("group", "g", "describe"), acl("topic", "a", "describe")).judge(
        req, ALICE, HOST
    )
    response = m.OffsetFetchResponse(
        topics=[m.OffsetFetchTopic("a", []), m.OffsetFetchTopic("b", [])]
    )
    judged.finish(response)
    assert [t.topic for t in response.topics] == ["a"]


def test_a_change_applies_to_the_next_judgement() -> None:
    a = access()
    req = m.ListOffsetsRequest(
        topics=[m.ListOffsetsTopic("orders", [m.ListOffsetsPartition(0, -1)])]
    )
    assert a.judge(req, ALICE, HOST).refused
    binding = acl("topic", "orders", "describe")
    a.authorizer.add(binding)
    assert not a.judge(req, ALICE, HOST).refused
    a.authorizer.remove(binding)
    assert a.judge(req, ALICE, HOST).refused


# ---------------------------------------------------------------------- audit


def test_audit_logs_a_denial_once_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    audit = Audit(repeat_s=60, keys_max=2, clock=lambda: now[0])
    denial = Denial("topic", "orders", "write")
    with caplog.at_level(logging.INFO, logger="minibroker.audit"):
        for _ in range(5):
            audit.denied(BOB, HOST, "Produce", [denial])
        now[0] += 61
        audit.denied(BOB, HOST, "Produce", [denial])
    lines = [r.getMessage() for r in caplog.records if r.name == "minibroker.audit"]
    assert len(lines) == 2
    assert lines[0] == (
        "event=authorization_denied principal='User:bob' host=10.0.0.1 api=Produce "
        "resource_type=topic resource='orders' operation=write held_back=0"
    )
    assert lines[1].endswith("held_back=4")
    # Bounded: the oldest key is forgotten once keys_max are held.
    audit.denied(BOB, HOST, "Fetch", [denial])
    audit.denied(BOB, HOST, "ListOffsets", [denial])
    assert len(audit._last) == 2


# ---------------------------------------------------------------------- producer ids


def test_producer_ids_belong_to_their_principal_across_restarts(tmp_path: Path) -> None:
    ids = ProducerIdManager(tmp_path)
    anonymous = ids.allocate()
    alice = [ids.allocate(ALICE) for _ in range(ID_BLOCK_SIZE + 1)]
    bob = ids.allocate(BOB)
    more_anonymous = ids.allocate()
    assert anonymous + 1 == more_anonymous  # the anonymous block is drawn on
    assert {ids.owner(p) for p in alice} == {ALICE}
    assert ids.owner(bob) == BOB and ids.owner(anonymous) == ANONYMOUS
    assert all(ids.is_issued(p) for p in (anonymous, *alice, bob, more_anonymous))
    # Reserved for a principal, not handed out: not issued.
    assert not ids.is_issued(bob + 1) and not ids.is_issued(alice[-1] + 1)
    assert not ids.is_issued(more_anonymous + 1)

    again = ProducerIdManager(tmp_path)
    assert {again.owner(p) for p in alice} == {ALICE}
    assert again.owner(bob) == BOB and again.owner(anonymous) == ANONYMOUS
    assert all(again.is_issued(p) for p in (anonymous, *alice, bob))
    fresh = again.allocate(ALICE)
    assert fresh > max([*alice, bob, more_anonymous]) and again.owner(fresh) == ALICE
    assert not again.is_issued(fresh + 1)


def test_anonymous_producer_ids_keep_the_file_as_it_was(tmp_path: Path) -> None:
    ids = ProducerIdManager(tmp_path)
    ids.allocate()
    body = unseal((tmp_path / "producer_id_block").read_bytes())
    assert (
        body is not None and msgspec.msgpack.decode(body) == ID_BLOCK_SIZE
    )  # a bare bound, as before owners existed


def test_a_transactional_entry_keeps_its_principal() -> None:
    entry = TxnEntry("t", 7, 0, "EMPTY", 60_000, 1)
    assert entry.principal == ANONYMOUS and len(entry.encode()) == 11
    alice = dataclasses.replace(entry, principal=ALICE)
    assert TxnEntry.decode(alice.encode()) == alice
    assert TxnEntry.decode(entry.encode()) == entry
    assert TxnEntry.decode(entry.encode()[:10]).principal == ANONYMOUS  # before groups
