"""The admin helpers for ACLs and SCRAM users: their types, the wire they make, and that a
password never leaves the client (the broker's own check of what it receives)."""

from __future__ import annotations

import pytest

from broker.security.scram import credential_from_password, credential_from_salted_password
from client import admin
from client.config import AdminConfig
from client.types import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from protocol.messages import AlterUserScramCredentialsRequest, decode_request
from tests.fake_secure_broker import FakeSecureBroker, running

SECRET = "pa55-w0rd-never-sent"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_acl_types_take_strings_in_any_case_and_refuse_what_the_broker_would() -> None:
    binding = AclBinding(
        "User:alice", "*", "Read", "ALLOW", ResourcePattern("topic", "orders", "prefixed")
    )  # type: ignore[arg-type]
    assert binding.operation is AclOperation.READ
    assert binding.permission_type is AclPermissionType.ALLOW
    assert binding.resource_pattern == ResourcePattern(
        ResourceType.TOPIC, "orders", PatternType.PREFIXED
    )
    assert str(binding) == "allow User:alice read on topic 'orders' (prefixed) from *"
    with pytest.raises(ValueError, match="principal is User:<name>"):
        AclBinding(
            "alice", "*", AclOperation.READ, AclPermissionType.ALLOW, binding.resource_pattern
        )
    with pytest.raises(ValueError, match="operation must be one of all, read"):
        AclBinding("User:a", "*", "reed", "allow", binding.resource_pattern)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="literal or prefixed"):
        ResourcePattern(ResourceType.TOPIC, "orders", PatternType.MATCH)
    assert AclBindingFilter(operation="write").operation is AclOperation.WRITE  # type: ignore[arg-type]
    assert ResourcePatternFilter(pattern_type="match").pattern_type is PatternType.MATCH  # type: ignore[arg-type]


def test_bindings_and_filters_on_the_wire() -> None:
    binding = AclBinding(
        "User:alice",
        "10.0.0.1",
        AclOperation.IDEMPOTENT_WRITE,
        AclPermissionType.DENY,
        ResourcePattern(ResourceType.CLUSTER, "cluster"),
    )
    wire = admin._binding_to_wire(binding)
    assert (wire.resource_type, wire.pattern_type, wire.operation, wire.permission) == (
        "cluster",
        "literal",
        "idempotent_write",
        "deny",
    )
    assert admin._binding_from_wire(wire) == binding
    everything = admin._filter_to_wire(AclBindingFilter())
    assert all(getattr(everything, f) is None for f in everything.__struct_fields__)
    some = admin._filter_to_wire(
        AclBindingFilter(
            principal="User:bob",
            resource_pattern=ResourcePatternFilter(ResourceType.GROUP, "g", PatternType.MATCH),
        )
    )
    assert (some.principal, some.resource_type, some.resource_name, some.pattern_type) == (
        "User:bob",
        "group",
        "g",
        "match",
    )


def test_upsertions_are_checked_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="iterations must be 4096 to 16384"):
        UserScramCredentialUpsertion("alice", SECRET, iterations=1000)
    with pytest.raises(ValueError, match="mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512"):
        UserScramCredentialUpsertion("alice", SECRET, mechanism="PLAIN")
    with pytest.raises(ValueError, match="must not be empty"):
        UserScramCredentialDeletion("")
    upsertion = UserScramCredentialUpsertion("alice", SECRET, salt=b"0123456789ab")
    assert SECRET not in repr(upsertion) and "0123456789ab" not in repr(upsertion)


@pytest.mark.anyio
async def test_alter_sends_kip_554s_salted_password_never_the_password() -> None:
    broker = FakeSecureBroker()
    async with running(broker) as bootstrap:
        results = await admin.alter_user_scram_credentials_async(
            AdminConfig(bootstrap_servers=bootstrap),
            [
                UserScramCredentialUpsertion("alice", SECRET, "SCRAM-SHA-512", iterations=4096),
                UserScramCredentialUpsertion("alice", SECRET, "SCRAM-SHA-256"),
                UserScramCredentialDeletion("bob", "SCRAM-SHA-256"),
            ],
        )
    assert sorted((r.user, r.error) for r in results) == [("alice", None), ("bob", None)]
    (body,) = [b for b in broker.bodies if b"AlterUserScramCredentials" in b]
    assert SECRET.encode() not in body
    request = decode_request(body)
    assert isinstance(request, AlterUserScramCredentialsRequest)
    assert [(d.user, d.mechanism) for d in request.deletions] == [("bob", "SCRAM-SHA-256")]
    sha512, sha256 = request.upsertions
    assert (sha512.iterations, sha256.iterations) == (4096, 8192)
    assert sha512.salt != sha256.salt and len(sha512.salt) == 32
    for upsertion in request.upsertions:
        # What the broker stores from it is what it would make from the password itself.
        assert credential_from_salted_password(
            upsertion.mechanism, upsertion.salt, upsertion.salted_password, upsertion.iterations
        ) == credential_from_password(
            upsertion.mechanism, SECRET, upsertion.iterations, upsertion.salt
        )


def test_helpers_take_a_bootstrap_string_or_an_admin_config() -> None:
    assert admin.admin_config("h:1").servers == [("h", 1)]
    config = AdminConfig(bootstrap_servers="h:2", client_id="ops")
    assert admin.admin_config(config) is config
