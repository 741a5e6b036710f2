"""The SASL state of one connection, without sockets (broker/security/sasl.py): which
APIs run before authentication, the mechanism and round sequencing, session
lifetimes from now_ms, and the close after expiry."""

from __future__ import annotations

import pytest
from scramp import ScramClient

from broker.security.sasl import (
    Admission,
    Authenticated,
    Challenge,
    CheckPlain,
    Failed,
    SaslPolicy,
    SaslState,
    Unsupported,
)
from broker.security.scram import (
    AuthenticationFailed,
    ScramCredential,
    authenticate_plain,
    credential_from_password,
)

SECRET = b"s" * 32
USERS = {"alice": "alice-pw", "bob": "bob-pw"}
CREDENTIALS = {
    (user, mech): credential_from_password(mech, password, 4096)
    for user, password in USERS.items()
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512")
}
POLICY = SaslPolicy(("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"), True, 0)


def lookup(user: str, mechanism: str) -> ScramCredential | None:
    return CREDENTIALS.get((user, mechanism))


def state() -> SaslState:
    return SaslState(lookup, SECRET)


def scram(
    s: SaslState,
    user: str,
    password: str,
    mechanism: str = "SCRAM-SHA-256",
    policy: SaslPolicy = POLICY,
    now_ms: int = 0,
) -> Authenticated | Failed:
    client = ScramClient([mechanism], user, password)
    first = s.authenticate(mechanism, client.get_client_first().encode(), policy, now_ms)
    if isinstance(first, Failed):
        return first
    assert isinstance(first, Challenge)
    client.set_server_first(first.auth_bytes.decode())
    final = s.authenticate(mechanism, client.get_client_final().encode(), policy, now_ms)
    assert isinstance(final, Authenticated | Failed)
    if isinstance(final, Authenticated):
        client.set_server_final(final.auth_bytes.decode())  # the server proved itself too
    return final


def plain(s: SaslState, user: str, password: str, now_ms: int = 0) -> Authenticated | Failed:
    """PLAIN as the server runs it: the check (a worker thread there), then its outcome."""
    step = s.authenticate("PLAIN", f"\0{user}\0{password}".encode(), POLICY, now_ms)
    assert isinstance(step, CheckPlain)
    try:
        found: str | None = authenticate_plain(step.message, lookup, SECRET)
        reason = ""
    except AuthenticationFailed as exc:
        found, reason = None, exc.reason
    return s.plain_checked(found, reason, POLICY, now_ms)


def test_before_authentication_only_api_versions_and_sasl_authenticate_run() -> None:
    s = state()
    assert s.admit("ApiVersions", 0) is Admission.ANSWER
    assert s.admit("SaslAuthenticate", 0) is Admission.ANSWER
    for api in ("Metadata", "Produce", "Fetch", "DescribeUserScramCredentials", "Nonsense"):
        assert s.admit(api, 0) is Admission.REFUSE
    assert s.principal is None and not s.closed  # refusals keep the connection


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_in_two_rounds_authenticates(mechanism: str) -> None:
    s = state()
    done = scram(s, "alice", "alice-pw", mechanism)
    assert done == Authenticated("User:alice", done.auth_bytes, 0, False)
    assert done.auth_bytes.startswith(b"v=")
    assert s.principal == "User:alice" and s.expires_at_ms is None
    assert s.admit("Produce", 10**12) is Admission.ANSWER


def test_plain_is_checked_off_the_loop_then_authenticates() -> None:
    s = state()
    assert plain(s, "bob", "bob-pw") == Authenticated("User:bob", b"", 0, False)
    assert s.admit("Metadata", 0) is Admission.ANSWER


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "alice-pw")])
def test_wrong_password_and_unknown_user_fail_alike_and_close(user: str, password: str) -> None:
    for run in (scram, plain):
        s = state()
        failed = run(s, user, password)
        assert isinstance(failed, Failed), run
        assert s.closed and s.principal is None


@pytest.mark.parametrize(
    ("mechanism", "message"),
    [
        ("SCRAM-SHA-256", b"n,,n=,r=abc"),
        ("SCRAM-SHA-512", b"\xff\xfe"),
        ("SCRAM-SHA-256", b"n,,n=alice,r=" + b"a" * 5000),
        ("PLAIN", b"alice\0alice-pw"),
    ],
)
def test_malformed_messages_fail(mechanism: str, message: bytes) -> None:
    s = state()
    step = s.authenticate(mechanism, message, POLICY, 0)
    if isinstance(step, CheckPlain):
        with pytest.raises(AuthenticationFailed):
            authenticate_plain(step.message, lookup, SECRET)
        step = s.plain_checked(None, "malformed", POLICY, 0)
    assert isinstance(step, Failed) and s.closed


def test_a_failure_says_for_the_log_which_user_was_named() -> None:
    for run in (scram, plain):
        s = state()
        failed = run(s, "nobody", "x")
        assert isinstance(failed, Failed) and failed.user == "nobody"


def test_unknown_or_disabled_mechanisms_are_33_and_keep_the_connection() -> None:
    s = state()
    only_scram = SaslPolicy(("SCRAM-SHA-512",), True, 0)
    for mechanism in ("GSSAPI", "SCRAM-SHA-256", "PLAIN", "x" * 1000):
        step = s.authenticate(mechanism, b"n,,n=alice,r=abc", only_scram, 0)
        assert isinstance(step, Unsupported) and "enabled: SCRAM-SHA-512" in step.message
        assert len(step.message) < 200
    assert not s.closed
    assert isinstance(scram(s, "alice", "alice-pw", "SCRAM-SHA-512", only_scram), Authenticated)


def test_plain_without_tls_is_refused_unless_allowed() -> None:
    s = state()
    no_plain_here = SaslPolicy(("PLAIN",), False, 0)
    step = s.authenticate("PLAIN", b"\0alice\0alice-pw", no_plain_here, 0)
    assert isinstance(step, Unsupported) and "allow_plain_without_tls" in step.message
    assert not s.closed


def test_a_replayed_client_final_fails() -> None:
    s = state()
    client = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
    first = s.authenticate("SCRAM-SHA-256", client.get_client_first().encode(), POLICY, 0)
    assert isinstance(first, Challenge)
    client.set_server_first(first.auth_bytes.decode())
    final = client.get_client_final().encode()
    assert isinstance(s.authenticate("SCRAM-SHA-256", final, POLICY, 0), Authenticated)
    # The same client-final again: it is no round 2 now, and as a round 1 it is nonsense.
    again = s.authenticate("SCRAM-SHA-256", final, POLICY, 0)
    assert isinstance(again, Failed)
    # ... and on a fresh connection, against a fresh server nonce, it fails as well.
    other = state()
    newcomer = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
    other_first = other.authenticate(
        "SCRAM-SHA-256", newcomer.get_client_first().encode(), POLICY, 0
    )
    assert isinstance(other_first, Challenge)
    assert isinstance(other.authenticate("SCRAM-SHA-256", final, POLICY, 0), Failed)


def test_channel_binding_required_by_the_client_fails() -> None:
    s = state()
    step = s.authenticate("SCRAM-SHA-256", b"p=tls-unique,,n=alice,r=abcdef", POLICY, 0)
    assert isinstance(step, Failed) and s.closed


def test_a_request_between_the_rounds_abandons_the_exchange() -> None:
    s = state()
    client = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
    first = s.authenticate("SCRAM-SHA-256", client.get_client_first().encode(), POLICY, 0)
    assert isinstance(first, Challenge)
    client.set_server_first(first.auth_bytes.decode())
    assert s.admit("Metadata", 0) is Admission.REFUSE
    step = s.authenticate("SCRAM-SHA-256", client.get_client_final().encode(), POLICY, 0)
    assert isinstance(step, Failed)


def test_round_two_of_another_mechanism_is_a_new_attempt() -> None:
    s = state()
    client = ScramClient(["SCRAM-SHA-256"], "alice", "alice-pw")
    s.authenticate("SCRAM-SHA-256", client.get_client_first().encode(), POLICY, 0)
    assert isinstance(s.authenticate("GSSAPI", b"", POLICY, 0), Unsupported)
    # The round 1 it abandoned cannot be finished any more.
    assert isinstance(scram(s, "alice", "alice-pw", "SCRAM-SHA-512"), Authenticated)


def test_the_session_ends_after_connections_max_reauth_ms() -> None:
    s = state()
    policy = SaslPolicy(("SCRAM-SHA-256",), True, 1000)
    done = scram(s, "alice", "alice-pw", policy=policy, now_ms=5000)
    assert isinstance(done, Authenticated) and done.session_lifetime_ms == 1000
    assert s.expires_at_ms == 6000
    assert s.admit("Produce", 5999) is Admission.ANSWER
    # Re-authentication before the end starts a new lifetime.
    again = scram(s, "alice", "alice-pw", policy=policy, now_ms=5900)
    assert isinstance(again, Authenticated) and again.reauthenticated
    assert s.expires_at_ms == 6900
    assert s.admit("Produce", 6500) is Admission.ANSWER
    # After the end, the first request closes the connection, a SaslAuthenticate too.
    assert s.admit("Produce", 6900) is Admission.CLOSE
    assert s.admit("SaslAuthenticate", 7000) is Admission.CLOSE


def test_reauthentication_as_another_principal_fails() -> None:
    s = state()
    assert isinstance(scram(s, "alice", "alice-pw"), Authenticated)
    failed = plain(s, "bob", "bob-pw")
    assert isinstance(failed, Failed) and "User:bob" in failed.reason
    assert s.closed and s.principal == "User:alice"


def test_the_state_and_plain_step_keep_secrets_out_of_their_reprs() -> None:
    s = state()
    step = s.authenticate("PLAIN", b"\0alice\0hunter2", POLICY, 0)
    assert "hunter2" not in repr(step) and "hunter2" not in repr(s)
