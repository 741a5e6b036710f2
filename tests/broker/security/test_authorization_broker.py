"""Authorization through the real broker process (docs/protocol.md section 7,
docs/security.md), on both backends: every API of sections 4-7 tried by a principal
without the permission it needs (the exact code, and nothing changed: data, offsets,
transaction and group state read back by a super user) and with it; literal, prefixed
and `*` bindings, `User:*`, hosts, deny over allow, implied operations, super users, a
change seen by an open connection, producer-id theft (49, also after a restart), and
`kill -9` while an ACL change is written."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from broker.partitions import PRODUCER_EPOCH_MAX
from harness.broker_process import BrokerProcess
from harness.txn import Txn
from harness.wire import WireClient, fetched_values, values_batch
from protocol.errors import ErrorCode
from protocol.framing import encode_frame
from tests.conftest import BACKENDS

PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}
CONFIG = """\
authorizer = true
super_users = ["User:admin"]

[[listeners]]
name = "sasl"
host = "127.0.0.1"
port = 0
security = "sasl_plaintext"
"""
ENV = {"MINIBROKER_BOOTSTRAP_USERS": ",".join(f"{u}:{p}" for u, p in PASSWORDS.items())}
ALICE, BOB = "User:alice", "User:bob"

TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
TXN_DENIED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
NOT_HERS = ErrorCode.INVALID_PRODUCER_ID_MAPPING

_names = count()


def unique(prefix: str) -> str:
    """A resource name no other test of the module's broker uses."""
    return f"{prefix}{next(_names)}"


def start(data_dir: Path, backend: str, env: dict[str, str] | None = None) -> BrokerProcess:
    return BrokerProcess(
        data_dir, backend=backend, config=CONFIG, env={**ENV, **(env or {})}
    ).start()


@pytest.fixture(scope="module", params=BACKENDS)
def secured(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker per backend for the module: each test names its own resources."""
    broker = start(tmp_path_factory.mktemp("authz") / "data", request.param)
    try:
        yield broker
    finally:
        broker.kill()


def login(broker: BrokerProcess, user: str) -> WireClient:
    c = WireClient(broker.address("sasl"))
    c.authenticate(user, PASSWORDS[user])
    return c


@pytest.fixture
def admin(secured: BrokerProcess) -> Iterator[WireClient]:
    """The super user; every binding made during the test is deleted after it, so the
    module's tests share the broker but not their ACLs."""
    with login(secured, "admin") as c:
        yield c
        every = dict.fromkeys(acl("topic", "t", "read"))
        assert c.call("DeleteAcls", filters=[every])["results"][0]["error"] == 0


@pytest.fixture
def alice(secured: BrokerProcess) -> Iterator[WireClient]:
    with login(secured, "alice") as c:
        yield c


@pytest.fixture
def bob(secured: BrokerProcess) -> Iterator[WireClient]:
    with login(secured, "bob") as c:
        yield c


def acl(
    resource_type: str,
    name: str,
    operation: str,
    principal: str = ALICE,
    permission: str = "allow",
    pattern: str = "literal",
    host: str = "*",
) -> dict[str, str]:
    return {
        "resource_type": resource_type,
        "resource_name": name,
        "pattern_type": pattern,
        "principal": principal,
        "host": host,
        "operation": operation,
        "permission": permission,
    }


def grant(admin: WireClient, *bindings: dict[str, str]) -> None:
    r = admin.call("CreateAcls", creations=list(bindings))
    assert r["error"] == 0 and [x["error"] for x in r["results"]] == [0] * len(bindings), r


def revoke(admin: WireClient, *bindings: dict[str, str]) -> None:
    r = admin.call("DeleteAcls", filters=list(bindings))
    assert [len(x["deleted"]) for x in r["results"]] == [1] * len(bindings), r


def topic_with(admin: WireClient, prefix: str, partitions: int = 1) -> str:
    name = unique(prefix)
    assert admin.create_topic(name, partitions) == 0
    return name


def end_offset(c: WireClient, topic: str, partition: int = 0) -> int:
    r = c.call(
        "ListOffsets",
        isolation_level=0,
        topics=[{"topic": topic, "partitions": [{"partition": partition, "timestamp": -1}]}],
    )
    answer = r["topics"][0]["partitions"][0]
    assert answer["error"] == 0, r
    return int(answer["offset"])


def produce_request(topics: list[str], batch: bytes, **fields: Any) -> dict[str, Any]:
    return {
        "acks": -1,
        "timeout_ms": 10_000,
        "topics": [
            {"topic": t, "partitions": [{"partition": 0, "records": batch}]} for t in topics
        ],
        **fields,
    }


def partition_errors(response: dict[str, Any]) -> dict[str, list[int]]:
    return {t["topic"]: [p["error"] for p in t["partitions"]] for t in response["topics"]}


# ---------------------------------------------------------------------- ACL APIs


def test_acl_apis_need_alter_or_describe_on_the_cluster(admin: WireClient, bob: WireClient) -> None:
    name = unique("acl-")
    binding = acl("topic", name, "read", BOB)
    r = bob.call("CreateAcls", creations=[binding, binding])
    assert r["error"] == CLUSTER_DENIED and [x["error"] for x in r["results"]] == [31, 31]
    by_name = {**dict.fromkeys(binding, None), "resource_name": name}
    assert admin.call("DescribeAcls", filter=by_name)["bindings"] == []  # nothing created
    assert bob.call("DescribeAcls", filter=by_name)["error"] == CLUSTER_DENIED
    r = bob.call("DeleteAcls", filters=[by_name])
    assert r["error"] == CLUSTER_DENIED and r["results"][0]["error"] == 31

    cluster_alter = acl("cluster", "cluster", "alter", BOB)
    grant(admin, cluster_alter)
    invalid = {**binding, "operation": "fly"}
    r = bob.call("CreateAcls", creations=[binding, invalid])
    assert [x["error"] for x in r["results"]] == [0, ErrorCode.INVALID_REQUEST]
    # describe on the cluster is implied by alter.
    assert bob.call("DescribeAcls", filter=by_name)["bindings"] == [binding]
    r = bob.call("DeleteAcls", filters=[by_name])
    assert r["results"][0]["deleted"] == [binding]
    assert admin.call("DescribeAcls", filter=by_name)["bindings"] == []
    revoke(admin, cluster_alter)
    assert bob.call("DescribeAcls", filter=by_name)["error"] == CLUSTER_DENIED


def test_scram_credential_apis_need_the_cluster(
    secured: BrokerProcess, admin: WireClient, bob: WireClient
) -> None:
    r = bob.call("DescribeUserScramCredentials", users=["alice"])
    assert r["error"] == CLUSTER_DENIED and [x["error"] for x in r["results"]] == [31]
    r = bob.call(
        "AlterUserScramCredentials",
        deletions=[{"user": "alice", "mechanism": "SCRAM-SHA-256"}],
        upsertions=[],
    )
    assert r["error"] == CLUSTER_DENIED and r["results"] == [
        {"user": "alice", "error": 31, "message": r["message"]}
    ]
    # Nothing changed: alice still has both credentials and still logs in.
    described = admin.call("DescribeUserScramCredentials", users=["alice"])
    assert len(described["results"][0]["credentials"]) == 2
    login(secured, "alice").close()
    grant(admin, acl("cluster", "cluster", "describe", BOB))
    assert bob.call("DescribeUserScramCredentials", users=["alice"])["error"] == 0
    grant(admin, acl("cluster", "cluster", "alter", BOB))
    r = bob.call(
        "AlterUserScramCredentials",
        deletions=[{"user": "nobody", "mechanism": "SCRAM-SHA-256"}],
        upsertions=[],
    )
    assert r["error"] == 0 and r["results"][0]["error"] == ErrorCode.RESOURCE_NOT_FOUND


# ---------------------------------------------------------------------- topics


def test_metadata_describes_only_what_may_be_described(
    admin: WireClient, alice: WireClient
) -> None:
    seen, hidden = topic_with(admin, "md-seen-"), topic_with(admin, "md-hidden-")
    grant(admin, acl("topic", "md-seen-", "describe", pattern="prefixed"))
    r = alice.call("Metadata", topics=[seen, hidden, "md-absent"], allow_auto_create=False)
    assert r["brokers"] and {t["name"]: t["error"] for t in r["topics"]} == {
        seen: 0,
        hidden: TOPIC_DENIED,
        "md-absent": TOPIC_DENIED,  # whether it exists is not told
    }
    listed = {t["name"] for t in alice.call("Metadata", topics=None)["topics"]}
    assert seen in listed and hidden not in listed
    grant(admin, acl("topic", "*", "describe"))  # the literal name `*`: every topic
    listed = {t["name"] for t in alice.call("Metadata", topics=None)["topics"]}
    assert {seen, hidden} <= listed
    revoke(admin, acl("topic", "*", "describe"))
    # All topics named are denied: the brokers are still answered, and the topic's id
    # is not told either.
    r = alice.call("Metadata", topics=[hidden], allow_auto_create=False)
    assert r["brokers"] and r["topics"] == [
        {"name": hidden, "error": TOPIC_DENIED, "partitions": [], "topic_id": b""}
    ]


def test_auto_creation_needs_create_on_the_cluster_or_the_topic(
    admin: WireClient, alice: WireClient
) -> None:
    name = unique("auto-")
    grant(admin, acl("topic", "auto-", "describe", pattern="prefixed"))
    r = alice.call("Metadata", topics=[name], allow_auto_create=True)
    assert r["topics"][0]["error"] == TOPIC_DENIED
    absent = admin.call("Metadata", topics=[name], allow_auto_create=False)
    assert absent["topics"][0]["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    grant(admin, acl("topic", name, "create"))
    r = alice.call("Metadata", topics=[name], allow_auto_create=True)
    assert r["topics"][0]["error"] == 0 and r["topics"][0]["partitions"]


def test_create_topics_on_the_topic_or_the_cluster(admin: WireClient, bob: WireClient) -> None:
    mine, other = unique("ct-bob-"), unique("ct-other-")
    grant(admin, acl("topic", "ct-bob-", "create", BOB, pattern="prefixed"))
    r = bob.call(
        "CreateTopics",
        topics=[{"name": other, "partitions": 1}, {"name": mine, "partitions": 1}],
    )
    assert [(t["name"], t["error"]) for t in r["topics"]] == [(other, TOPIC_DENIED), (mine, 0)]
    exists = admin.call("Metadata", topics=[other, mine], allow_auto_create=False)["topics"]
    assert [t["error"] for t in exists] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0]
    grant(admin, acl("cluster", "cluster", "create", BOB))
    r = bob.call("CreateTopics", topics=[{"name": other, "partitions": 1}])
    assert r["topics"][0]["error"] == 0


def test_produce_needs_write_on_each_topic_and_appends_nothing_denied(
    admin: WireClient, alice: WireClient
) -> None:
    allowed, denied = topic_with(admin, "pr-a-"), topic_with(admin, "pr-d-")
    grant(admin, acl("topic", allowed, "write"))
    r = alice.call("Produce", **produce_request([denied, allowed], values_batch([b"v"])))
    assert partition_errors(r) == {denied: [TOPIC_DENIED], allowed: [0]}
    assert "may not write" in r["topics"][0]["partitions"][0]["message"]
    assert end_offset(admin, denied) == 0 and end_offset(admin, allowed) == 1
    # acks=0: no answer, nothing appended; the connection goes on.
    alice.send("Produce", **produce_request([denied], values_batch([b"v"]), acks=0))
    assert alice.call("ApiVersions")["error"] == 0
    assert end_offset(admin, denied) == 0


def test_a_read_of_produce_requests_is_judged_request_by_request(
    admin: WireClient, alice: WireClient
) -> None:
    """Produce requests read together append as one run, whose requests naming the topics
    of one allowed whole are judged once: a request naming other topics, or the same
    ones after a refusal, is still judged, and refused, on its own."""
    allowed, denied = topic_with(admin, "run-a-"), topic_with(admin, "run-d-")
    grant(admin, acl("topic", allowed, "write"))
    runs = [[allowed], [allowed], [allowed, denied], [denied], [denied], [allowed]]
    # One write, so that the broker reads them together.
    alice.send_raw(
        b"".join(
            encode_frame(
                {
                    "api": "Produce",
                    "v": 1,
                    "cid": 100 + i,
                    **produce_request(topics, values_batch([b"v"]), acks=1),
                }
            )
            for i, topics in enumerate(runs)
        )
    )
    answers = [alice.recv() for _ in runs]
    assert [a["cid"] for a in answers] == [100 + i for i in range(len(runs))]
    assert [partition_errors(a) for a in answers] == [
        {allowed: [0]},
        {allowed: [0]},
        {allowed: [0], denied: [TOPIC_DENIED]},
        {denied: [TOPIC_DENIED]},
        {denied: [TOPIC_DENIED]},
        {allowed: [0]},
    ]
    assert end_offset(admin, allowed) == 4 and end_offset(admin, denied) == 0


def test_deny_wins_over_allow_and_user_star(admin: WireClient, alice: WireClient) -> None:
    prefix = unique("deny-")
    open_topic = topic_with(admin, prefix + "-open-")
    closed = topic_with(admin, prefix + "-closed-")
    grant(
        admin,
        acl("topic", prefix, "read", "User:*", pattern="prefixed"),
        acl("topic", closed, "read", ALICE, permission="deny"),
    )
    assert alice.fetch(open_topic, 0, 0)["error"] == 0
    assert alice.fetch(closed, 0, 0)["error"] == TOPIC_DENIED
    # A deny of read does not deny what read implies: describe still comes from the allow.
    assert end_offset(alice, closed) == 0


def test_hosts_are_compared(admin: WireClient, alice: WireClient) -> None:
    elsewhere, here = topic_with(admin, "host-x-"), topic_with(admin, "host-y-")
    grant(
        admin,
        acl("topic", elsewhere, "describe", host="10.9.9.9"),
        acl("topic", here, "describe", host="127.0.0.1"),
    )
    r = alice.call("Metadata", topics=[elsewhere, here], allow_auto_create=False)
    assert [t["error"] for t in r["topics"]] == [TOPIC_DENIED, 0]


def test_fetch_and_list_offsets_need_read_and_describe(
    admin: WireClient, alice: WireClient
) -> None:
    name = topic_with(admin, "fe-")
    assert admin.produce(name, 0, values_batch([b"a", b"b"]))["error"] == 0
    assert alice.fetch(name, 0, 0)["error"] == TOPIC_DENIED
    r = alice.call(
        "ListOffsets",
        isolation_level=0,
        topics=[{"topic": name, "partitions": [{"partition": 0, "timestamp": -1}]}],
    )
    assert r["topics"][0]["partitions"][0]["error"] == TOPIC_DENIED
    # A Fetch whose every topic is denied is answered at once, not after max_wait_ms.
    denied = alice.fetch(name, 0, 2, max_wait_ms=60_000)
    assert denied["error"] == TOPIC_DENIED
    grant(admin, acl("topic", name, "read"))
    fetched = alice.fetch(name, 0, 0)
    assert fetched["error"] == 0
    assert [v for _, v in fetched_values(fetched["records"])] == [b"a", b"b"]
    assert end_offset(alice, name) == 2  # read implies describe


def test_a_change_applies_to_an_open_connection_from_its_next_request(
    admin: WireClient, alice: WireClient
) -> None:
    name = topic_with(admin, "live-")
    assert alice.fetch(name, 0, 0)["error"] == TOPIC_DENIED
    binding = acl("topic", name, "read")
    grant(admin, binding)
    assert alice.fetch(name, 0, 0)["error"] == 0
    revoke(admin, binding)
    assert alice.fetch(name, 0, 0)["error"] == TOPIC_DENIED


def test_super_users_need_no_acl(admin: WireClient, alice: WireClient) -> None:
    name = topic_with(admin, "su-")
    assert admin.produce(name, 0, values_batch([b"x"]))["error"] == 0
    assert admin.fetch(name, 0, 0)["error"] == 0
    assert admin.call("DescribeTxnApps", txn_app_ids=None)["error"] == 0
    # What needs nothing needs nothing; the administration APIs need their ACLs.
    assert alice.call("ApiVersions")["error"] == 0
    resources = [{"type": "topic", "name": name}]
    assert alice.call("DescribeConfigs", resources=resources)["results"][0]["error"] == (
        TOPIC_DENIED
    )
    assert admin.call("DescribeConfigs", resources=resources)["results"][0]["error"] == 0
    assert alice.call("DeleteTopics", topics=[name])["topics"][0]["error"] == TOPIC_DENIED
    assert end_offset(admin, name) == 1  # nothing deleted on the denial
    assert admin.call("DeleteTopics", topics=[name])["topics"][0]["error"] == 0


def test_super_users_are_reloaded_on_sighup(tmp_path: Path, backend: str) -> None:
    broker = start(tmp_path / "data", backend)
    try:
        with login(broker, "alice") as alice:
            assert alice.call("DescribeTxnApps", txn_app_ids=None)["error"] == CLUSTER_DENIED
            broker.config_path.write_text(
                CONFIG.replace('["User:admin"]', '["User:admin", "User:alice"]')
            )
            os.kill(broker.pid, signal.SIGHUP)
            assert broker.log_shows("event=reloaded")
            assert alice.call("DescribeTxnApps", txn_app_ids=None)["error"] == 0
    finally:
        broker.kill()


# ---------------------------------------------------------------------- producers


def test_init_producer_id_needs_idempotent_write_or_write_on_a_topic(
    admin: WireClient, bob: WireClient
) -> None:
    r = bob.call("InitProducerId")
    assert r["error"] == CLUSTER_DENIED and r["producer_id"] == -1
    grant(admin, acl("topic", unique("ipid-"), "write", BOB))
    assert bob.call("InitProducerId")["error"] == 0


def test_producer_ids_are_not_shared_between_principals(
    secured: BrokerProcess, admin: WireClient, alice: WireClient, bob: WireClient
) -> None:
    name = topic_with(admin, "theft-")
    grant(admin, acl("topic", name, "write"), acl("topic", name, "write", BOB))
    pid, epoch = alice.init_producer()
    first = values_batch([b"alice"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    assert alice.produce(name, 0, first, acks=-1)["error"] == 0
    stolen = values_batch([b"bob"], producer_id=pid, producer_epoch=epoch, base_sequence=1)
    r = bob.produce(name, 0, stolen, acks=-1)
    assert r["error"] == NOT_HERS and r["base_offset"] == -1
    assert end_offset(admin, name) == 1  # nothing appended
    # Bumping her epoch would fence her: refused too.
    r = bob.call("InitProducerId", producer_id=pid, producer_epoch=epoch)
    assert r["error"] == NOT_HERS
    # Her producer goes on as if nothing happened.
    second = values_batch([b"alice2"], producer_id=pid, producer_epoch=epoch, base_sequence=1)
    assert alice.produce(name, 0, second, acks=-1)["error"] == 0


def bump_to_the_last_epoch(c: WireClient, pid: int) -> None:
    """InitProducerId with `pid` from epoch 0 up to PRODUCER_EPOCH_MAX, pipelined a
    window at a time (each names the epoch the one before it granted)."""
    window = 200
    for first in range(0, PRODUCER_EPOCH_MAX, window):
        epochs = range(first, min(first + window, PRODUCER_EPOCH_MAX))
        cids = [c.send("InitProducerId", producer_id=pid, producer_epoch=e) for e in epochs]
        for cid, epoch in zip(cids, epochs, strict=True):
            r = c.recv()
            assert r["cid"] == cid and r["error"] == 0, r
            assert (r["producer_id"], r["producer_epoch"]) == (pid, epoch + 1), r


def test_the_id_after_an_epoch_wrap_stays_its_holders(admin: WireClient, alice: WireClient) -> None:
    """After 32,767 bumps the producer gets a new id at epoch 0: still alice's, so she
    may write with it and bump it (issue 39, item 8)."""
    name = topic_with(admin, "wrap-")
    grant(admin, acl("topic", name, "write"))
    pid, _ = alice.init_producer()
    bump_to_the_last_epoch(alice, pid)
    new_pid, epoch = alice.init_producer(producer_id=pid, producer_epoch=PRODUCER_EPOCH_MAX)
    assert new_pid != pid and epoch == 0
    batch = values_batch([b"after"], producer_id=new_pid, producer_epoch=0, base_sequence=0)
    assert alice.produce(name, 0, batch, acks=-1)["error"] == 0
    assert alice.init_producer(producer_id=new_pid, producer_epoch=0) == (new_pid, 1)


def test_producer_id_owners_survive_kill_9(tmp_path: Path, backend: str) -> None:
    broker = start(tmp_path / "data", backend)
    try:
        with login(broker, "admin") as admin:
            name = topic_with(admin, "own-")
            grant(admin, acl("topic", name, "write"), acl("topic", name, "write", BOB))
            grant(admin, acl("transactional_id", "own-tx", "write"))
            grant(admin, acl("transactional_id", "own-tx", "write", BOB))
        with login(broker, "alice") as alice:
            pid, epoch = alice.init_producer()
            batch = values_batch([b"a"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
            assert alice.produce(name, 0, batch, acks=-1)["error"] == 0
            txn = Txn(alice, "own-tx")
            assert txn.send(name, 0, [b"t"])["error"] == 0
        broker.restart(kill=True)
        with login(broker, "bob") as bob:
            stolen = values_batch([b"b"], producer_id=pid, producer_epoch=epoch, base_sequence=1)
            assert bob.produce(name, 0, stolen, acks=-1)["error"] == NOT_HERS
            r = bob.call(
                "EndTxn",
                transactional_id="own-tx",
                producer_id=txn.pid,
                producer_epoch=txn.epoch,
                committed=True,
            )
            assert r["error"] == NOT_HERS
        with login(broker, "alice") as alice:
            batch = values_batch([b"a2"], producer_id=pid, producer_epoch=epoch, base_sequence=1)
            assert alice.produce(name, 0, batch, acks=-1)["error"] == 0
            txn.c = alice
            assert txn.end(committed=True)["error"] == 0
    finally:
        broker.kill()


# ---------------------------------------------------------------------- transactions


def test_transactions_need_write_on_the_transactional_id(
    admin: WireClient, alice: WireClient, bob: WireClient
) -> None:
    name = topic_with(admin, "tx-")
    tid = unique("tx-id-")
    r = alice.call("InitProducerId", transactional_id=tid)
    assert r["error"] == TXN_DENIED
    assert not [
        t for t in admin.call("ListTransactions")["transactions"] if t["transactional_id"] == tid
    ]

    grant(admin, acl("topic", name, "write"), acl("transactional_id", tid, "write"))
    txn = Txn(alice, tid)
    assert txn.send(name, 0, [b"in"])["error"] == 0

    # Bob may write the topic but not the transactional id: his Produce is refused whole.
    grant(admin, acl("topic", name, "write", BOB))
    batch = values_batch(
        [b"x"], producer_id=txn.pid, producer_epoch=txn.epoch, base_sequence=1, transactional=True
    )
    r = bob.call("Produce", **produce_request([name], batch, transactional_id=tid))
    assert r["error"] == TXN_DENIED and partition_errors(r) == {name: [TXN_DENIED]}
    for api, extra in (
        ("EndTxn", {"committed": True}),
        ("PrepareTxn", {"prepared_timeout_ms": 60_000}),
    ):
        r = bob.call(
            api, transactional_id=tid, producer_id=txn.pid, producer_epoch=txn.epoch, **extra
        )
        assert r["error"] == TXN_DENIED, (api, r)
    state = {
        t["transactional_id"]: t["state"] for t in admin.call("ListTransactions")["transactions"]
    }
    assert state[tid] == "ONGOING"  # nothing changed
    assert end_offset(admin, name) == 1

    # With write on the id, Bob still may not use Alice's producer (49), but may fence her.
    grant(admin, acl("transactional_id", tid, "write", BOB))
    r = bob.call(
        "PrepareTxn",
        transactional_id=tid,
        producer_id=txn.pid,
        producer_epoch=txn.epoch,
        prepared_timeout_ms=60_000,
    )
    assert r["error"] == NOT_HERS
    r = bob.call("Produce", **produce_request([name], batch, transactional_id=tid))
    assert partition_errors(r) == {name: [NOT_HERS]}
    assert end_offset(admin, name) == 1
    assert txn.prepare()["error"] == 0
    assert txn.end(committed=True)["error"] == 0


def test_commit_txns_needs_every_id_and_changes_nothing_when_one_is_denied(
    admin: WireClient, alice: WireClient, bob: WireClient
) -> None:
    name = topic_with(admin, "ctx-")
    mine, theirs = unique("ctx-mine-"), unique("ctx-theirs-")
    grant(
        admin,
        acl("topic", name, "write"),
        acl("transactional_id", "ctx-", "write", pattern="prefixed"),
    )
    refs = []
    for tid in (mine, theirs):
        txn = Txn(alice, tid)
        assert txn.send(name, 0, [tid.encode()])["error"] == 0
        assert txn.prepare()["error"] == 0
        refs.append(txn.ref())
    grant(admin, acl("transactional_id", mine, "write", BOB))
    r = bob.call("CommitTxns", transactions=refs, committed=True)
    assert r["error"] == TXN_DENIED
    assert [(t["transactional_id"], t["error"]) for t in r["transactions"]] == [
        (mine, TXN_DENIED),
        (theirs, TXN_DENIED),
    ]
    states = {
        t["transactional_id"]: t["state"] for t in admin.call("ListTransactions")["transactions"]
    }
    assert states[mine] == states[theirs] == "PREPARED"
    # CommitTxns carries no owner check: an outside coordinator commits what others wrote.
    grant(admin, acl("transactional_id", theirs, "write", BOB))
    r = bob.call("CommitTxns", transactions=refs, committed=True)
    assert r["error"] == 0, r


def test_list_transactions_and_txn_apps(
    admin: WireClient, alice: WireClient, bob: WireClient
) -> None:
    tid = unique("lt-")
    grant(admin, acl("transactional_id", tid, "write"))
    Txn(alice, tid)
    listed = {t["transactional_id"] for t in bob.call("ListTransactions")["transactions"]}
    assert tid not in listed
    assert tid in {t["transactional_id"] for t in alice.call("ListTransactions")["transactions"]}
    assert bob.call("DescribeTxnApps", txn_app_ids=None)["error"] == CLUSTER_DENIED
    grant(admin, acl("cluster", "cluster", "describe", BOB))
    assert bob.call("DescribeTxnApps", txn_app_ids=None)["error"] == 0


# ---------------------------------------------------------------------- groups


def heartbeat(c: WireClient, group: str, topics: list[str]) -> dict[str, Any]:
    return c.call(
        "ConsumerGroupHeartbeat",
        group_id=group,
        member_id="",
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topics=topics,
    )


def test_heartbeats_need_read_on_the_group_and_describe_on_topics(
    admin: WireClient, alice: WireClient
) -> None:
    seen, hidden = topic_with(admin, "hb-seen-", 2), topic_with(admin, "hb-hidden-", 2)
    group = unique("hb-g-")
    r = heartbeat(alice, group, [seen, hidden])
    assert r["error"] == GROUP_DENIED
    described = admin.call("DescribeGroups", group_ids=[group])["groups"][0]
    assert described["error"] == ErrorCode.GROUP_ID_NOT_FOUND  # no member joined
    grant(admin, acl("group", group, "read"), acl("topic", seen, "describe"))
    r = heartbeat(alice, group, [seen, hidden])
    assert r["error"] == 0
    assert {a["topic"] for a in r["assignment"]} == {seen}
    members = admin.call("DescribeGroups", group_ids=[group])["groups"][0]["members"]
    assert members[0]["subscribed_topics"] == [seen]


def test_offset_commit_and_fetch(admin: WireClient, alice: WireClient) -> None:
    readable, unreadable = topic_with(admin, "oc-r-"), topic_with(admin, "oc-u-")
    group = unique("oc-g-")

    def commit(offset: int) -> dict[str, Any]:
        return alice.call(
            "OffsetCommit",
            group_id=group,
            topics=[
                {"topic": t, "partitions": [{"partition": 0, "offset": offset}]}
                for t in (readable, unreadable)
            ],
        )

    def committed(c: WireClient) -> dict[str, int]:
        r = c.call("OffsetFetch", group_id=group, topics=None)
        return {t["topic"]: t["partitions"][0]["offset"] for t in r["topics"]}

    r = commit(5)
    assert r["error"] == GROUP_DENIED and partition_errors(r) == {
        readable: [GROUP_DENIED],
        unreadable: [GROUP_DENIED],
    }
    assert committed(admin) == {}
    assert alice.call("OffsetFetch", group_id=group, topics=None)["error"] == GROUP_DENIED
    grant(admin, acl("group", group, "read"), acl("topic", readable, "read"))
    r = commit(7)
    assert partition_errors(r) == {readable: [0], unreadable: [TOPIC_DENIED]}
    assert committed(admin) == {readable: 7}
    admin.call(
        "OffsetCommit",
        group_id=group,
        topics=[{"topic": unreadable, "partitions": [{"partition": 0, "offset": 3}]}],
    )
    assert committed(admin) == {readable: 7, unreadable: 3}
    assert committed(alice) == {readable: 7}  # the other topic is left out


def test_txn_offset_commit_needs_the_id_the_group_and_each_topic(
    admin: WireClient, alice: WireClient, bob: WireClient
) -> None:
    out, read_ok, read_no = (
        topic_with(admin, "toc-out-"),
        topic_with(admin, "toc-r-"),
        topic_with(admin, "toc-n-"),
    )
    group, tid = unique("toc-g-"), unique("toc-id-")
    grant(admin, acl("topic", out, "write"), acl("transactional_id", tid, "write"))
    txn = Txn(alice, tid)
    assert txn.send(out, 0, [b"x"])["error"] == 0

    def txn_commit(c: WireClient) -> dict[str, Any]:
        return c.call(
            "TxnOffsetCommit",
            transactional_id=tid,
            producer_id=txn.pid,
            producer_epoch=txn.epoch,
            group_id=group,
            topics=[
                {"topic": t, "partitions": [{"partition": 0, "offset": 9}]}
                for t in (read_ok, read_no)
            ],
        )

    assert txn_commit(bob)["error"] == TXN_DENIED
    assert txn_commit(alice)["error"] == GROUP_DENIED
    grant(admin, acl("group", group, "read"), acl("topic", read_ok, "read"))
    assert partition_errors(txn_commit(alice)) == {read_ok: [0], read_no: [TOPIC_DENIED]}
    grant(admin, acl("transactional_id", tid, "write", BOB), acl("group", group, "read", BOB))
    grant(admin, acl("topic", read_ok, "read", BOB))
    assert txn_commit(bob)["error"] == NOT_HERS
    assert txn.end(committed=True)["error"] == 0
    r = admin.call("OffsetFetch", group_id=group, topics=None)
    assert {t["topic"]: t["partitions"][0]["offset"] for t in r["topics"]} == {read_ok: 9}


def test_list_and_describe_groups(admin: WireClient, alice: WireClient) -> None:
    name = topic_with(admin, "lg-")
    mine, other = unique("lg-mine-"), unique("lg-other-")
    for group in (mine, other):
        assert heartbeat(admin, group, [name])["error"] == 0
    grant(admin, acl("group", mine, "describe"))
    listed = {g["group_id"] for g in alice.call("ListGroups")["groups"]}
    assert mine in listed and other not in listed
    r = alice.call("DescribeGroups", group_ids=[other, mine])
    assert [(g["group_id"], g["error"]) for g in r["groups"]] == [(other, GROUP_DENIED), (mine, 0)]
    assert r["groups"][1]["state"] != "DEAD"


def test_described_members_show_only_the_topics_the_caller_may_describe(
    admin: WireClient, alice: WireClient
) -> None:
    """Issue 39, item 6: DESCRIBE on a group showed its members' subscribed and assigned
    topics, the ones the caller may not describe too. They are left out, as Metadata
    leaves them out; the group itself is unchanged."""
    seen, hidden = topic_with(admin, "dg-seen-"), topic_with(admin, "dg-hidden-")
    group = unique("dg-g-")
    assert heartbeat(admin, group, [seen, hidden])["error"] == 0

    def topics_of(member: dict[str, Any]) -> tuple[list[str], set[str]]:
        return sorted(member["subscribed_topics"]), {a["topic"] for a in member["assignment"]}

    whole = topics_of(admin.call("DescribeGroups", group_ids=[group])["groups"][0]["members"][0])
    assert whole == (sorted([seen, hidden]), {seen, hidden})
    grant(admin, acl("group", group, "describe"), acl("topic", seen, "describe"))
    described = alice.call("DescribeGroups", group_ids=[group])["groups"][0]
    assert described["error"] == 0 and len(described["members"]) == 1
    shown = described["members"][0]
    assert shown["subscribed_topics"] == [seen]
    assert [a["topic"] for a in shown["assignment"]] == [seen]
    member = admin.call("DescribeGroups", group_ids=[group])["groups"][0]["members"][0]
    assert (
        sorted(member["subscribed_topics"]),
        {a["topic"] for a in member["assignment"]},
    ) == whole


# ---------------------------------------------------------------------- audit


def test_denials_are_audited_and_counted(
    secured: BrokerProcess, admin: WireClient, bob: WireClient
) -> None:
    name = topic_with(admin, "audit-")
    for _ in range(3):
        assert bob.fetch(name, 0, 0)["error"] == TOPIC_DENIED
    line = (
        f"event=authorization_denied principal='User:bob' host=127.0.0.1 api=Fetch "
        f"resource_type=topic resource='{name}' operation=read held_back=0"
    )
    assert secured.log_shows(line)
    assert secured.log_text().count(f"resource='{name}'") == 1  # repeats held back


# ---------------------------------------------------------------------- kill -9


@pytest.mark.parametrize("point", ["acl_record_written", "acl_record_durable"])
def test_kill_9_while_acls_are_written_leaves_them_whole_or_absent(
    tmp_path: Path, backend: str, point: str
) -> None:
    data = tmp_path / "data"
    broker = start(data, backend, env={"MINIBROKER_CRASH_AT": point})
    names = [unique("crash-") for _ in range(3)]
    bindings = [acl("topic", n, "read") for n in names]
    try:
        with login(broker, "admin") as admin:
            admin.send("CreateAcls", creations=bindings)
            with pytest.raises(OSError):
                admin.recv()
        assert broker.proc is not None and broker.proc.wait(10) == -9
        wal = data / "security" / "acls.wal"
        size = wal.stat().st_size
        torn = tmp_path / "torn.wal"
        torn.write_bytes(wal.read_bytes()[: size - 5])

        def described() -> list[dict[str, str]]:
            with login(broker, "admin") as admin:
                r = admin.call("DescribeAcls", filter=dict.fromkeys(bindings[0]))
                return [b for b in r["bindings"] if b["resource_name"] in names]

        broker.env = ENV
        broker.start(broker.port)
        assert described() == bindings  # the record was written: whole
        broker.kill()
        # The same crash with the record torn (its last bytes never reached the disk):
        os.replace(torn, wal)
        broker.start(broker.port)
        assert described() == []  # absent, and the broker starts
    finally:
        broker.kill()


def test_without_the_authorizer_the_acl_apis_answer_54(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        binding = acl("topic", "t", "read")
        r = c.call("CreateAcls", creations=[binding])
        assert r["error"] == ErrorCode.SECURITY_DISABLED and r["results"][0]["error"] == 54
        assert c.call("DescribeAcls", filter=binding)["error"] == ErrorCode.SECURITY_DISABLED
        r = c.call("DeleteAcls", filters=[binding])
        assert r["error"] == ErrorCode.SECURITY_DISABLED and r["results"][0]["error"] == 54
        assert "DescribeAcls" in c.call("ApiVersions")["apis"]
        # Producer ids still work: every connection is User:ANONYMOUS, the one owner.
        pid, epoch = c.init_producer()
        assert c.create_topic("t") == 0
        batch = values_batch([b"v"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        assert c.produce("t", 0, batch)["error"] == 0
