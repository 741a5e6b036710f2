"""SASL server side (broker/security/scram.py): RFC 7677's SCRAM-SHA-256 exchange byte for
byte, SCRAM-SHA-512 against scramp's client, the failures that must all look the same,
and PLAIN (RFC 4616)."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scramp import ScramClient, ScramMechanism

from broker.security.scram import (
    DEFAULT_ITERATIONS,
    FAILURE_MESSAGE,
    SCRAM_MECHANISMS,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    AuthenticationFailed,
    ScramCredential,
    ScramExchange,
    authenticate_plain,
    credential_from_password,
    credential_from_salted_password,
    parse_plain,
)

SECRET = b"s" * 32

# RFC 7677 section 3, the SCRAM-SHA-256 example.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def users(**passwords: str) -> dict[tuple[str, str], ScramCredential]:
    """Both mechanisms' credentials for each user, at the contract's minimum iterations."""
    return {
        (user, mech): credential_from_password(mech, password, 4096)
        for user, password in passwords.items()
        for mech in SCRAM_MECHANISMS
    }


STORE = users(alice="wonderland", bob="builder")


def lookup(user: str, mechanism: str) -> ScramCredential | None:
    return STORE.get((user, mechanism))


def rfc_exchange() -> ScramExchange:
    credential = credential_from_password(SCRAM_SHA_256, "pencil", 4096, RFC_SALT)
    known = {("user", SCRAM_SHA_256): credential}
    return ScramExchange(
        SCRAM_SHA_256, lambda u, m: known.get((u, m)), SECRET, server_nonce=RFC_SERVER_NONCE
    )


def test_rfc_7677_exchange_byte_for_byte() -> None:
    exchange = rfc_exchange()
    assert exchange.server_first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert exchange.user is None
    assert exchange.server_final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert exchange.user == "user"


def test_credential_from_salted_password_is_rfc_5802s() -> None:
    """KIP-554 sends Hi(password); the keys the broker derives from it are those of the
    password itself, for both mechanisms, and RFC 7677's StoredKey/ServerKey."""
    for mech in SCRAM_MECHANISMS:
        name = "sha256" if mech == SCRAM_SHA_256 else "sha512"
        salted = hashlib.pbkdf2_hmac(name, b"pencil", RFC_SALT, 4096)
        derived = credential_from_salted_password(mech, RFC_SALT, salted, 4096)
        assert derived == credential_from_password(mech, "pencil", 4096, RFC_SALT)
        salt, stored, server, _ = ScramMechanism(mech).make_auth_info(
            "pencil", iteration_count=4096, salt=RFC_SALT
        )
        assert (derived.salt, derived.stored_key, derived.server_key) == (salt, stored, server)
    rfc = credential_from_password(SCRAM_SHA_256, "pencil", 4096, RFC_SALT)
    # RFC 7677's example, as scramp's own tests give its keys.
    assert base64.b64encode(rfc.stored_key) == b"WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY="
    assert base64.b64encode(rfc.server_key) == b"wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="


def test_keys_stay_out_of_the_repr() -> None:
    text = repr(STORE[("alice", SCRAM_SHA_256)])
    assert "stored_key" not in text and "server_key" not in text
    assert "wonderland" not in repr(parse_plain(b"\0alice\0wonderland"))


def client_round_trip(
    mech: str, user: str, password: str, binding: tuple[str, bytes] | None = None
) -> ScramExchange:
    """A whole exchange driven by scramp's client; raises AuthenticationFailed."""
    client = ScramClient([mech], user, password, channel_binding=binding)
    exchange = ScramExchange(mech, lookup, SECRET)
    first = client.get_client_first()
    client.set_server_first(exchange.server_first(first.encode()).decode())
    client.set_server_final(exchange.server_final(client.get_client_final().encode()).decode())
    return exchange


@pytest.mark.parametrize("mech", SCRAM_MECHANISMS)
def test_scramp_client_authenticates(mech: str) -> None:
    assert client_round_trip(mech, "alice", "wonderland").user == "alice"


def test_gs2_flag_y_is_accepted() -> None:
    """RFC 5802: `y` says the client could bind but thinks the server cannot; it cannot."""
    client = ScramClient([SCRAM_SHA_512], "bob", "builder", channel_binding=("tls-unique", b"x"))
    assert client.get_client_first().startswith("y,,")
    binding = ("tls-unique", b"x")  # the client can bind; it asks for the non-PLUS mechanism
    assert client_round_trip(SCRAM_SHA_512, "bob", "builder", binding).user == "bob"


def test_server_nonce_is_fresh_per_attempt() -> None:
    nonces = set()
    for _ in range(3):
        first = ScramExchange(SCRAM_SHA_256, lookup, SECRET).server_first(
            b"n,,n=alice,r=clientnonce"
        )
        nonce = first.split(b",")[0].removeprefix(b"r=clientnonce")
        assert len(nonce) >= 32
        nonces.add(nonce)
    assert len(nonces) == 3


def failure(run: Callable[[], object]) -> AuthenticationFailed:
    with pytest.raises(AuthenticationFailed) as caught:
        run()
    assert str(caught.value) == FAILURE_MESSAGE
    return caught.value


def test_wrong_password_and_unknown_user_fail_alike_at_the_proof() -> None:
    wrong = failure(lambda: client_round_trip(SCRAM_SHA_256, "alice", "not-it"))
    unknown = failure(lambda: client_round_trip(SCRAM_SHA_256, "mallory", "anything"))
    assert str(wrong) == str(unknown)
    assert (wrong.reason, unknown.reason) != ("", "")
    # Both get a server-first; an unknown user's salt and iterations are the same at
    # every try, like a real user's, and look like the bootstrap users'.
    firsts = [
        ScramExchange(SCRAM_SHA_256, lookup, SECRET).server_first(b"n,,n=mallory,r=abc")
        for _ in range(2)
    ]
    salts = {f.split(b",")[1] for f in firsts}
    assert len(salts) == 1
    assert len(base64.b64decode(salts.pop()[2:])) == 32 and firsts[0].endswith(b",i=8192")
    # A different secret (another broker) gives another salt: the secret is the key.
    other = ScramExchange(SCRAM_SHA_256, lookup, b"t" * 32).server_first(b"n,,n=mallory,r=abc")
    assert other.split(b",")[1] != firsts[0].split(b",")[1]


def test_an_unknown_user_fails_even_with_a_proof_that_matches_the_mock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No one can make a proof for a mock credential (its ClientKey exists nowhere); were
    the mock made from a password, the exchange would still refuse the unknown user."""
    from broker.security import scram

    made_up = credential_from_password(SCRAM_SHA_256, "guessed", 4096)
    monkeypatch.setattr(scram, "mock_credential", lambda mech, user, secret: made_up)
    refused = failure(lambda: client_round_trip(SCRAM_SHA_256, "mallory", "guessed"))
    assert refused.reason == "unknown user"
    STORE[("mallory", SCRAM_SHA_256)] = made_up
    try:  # the same messages pass for a user the broker knows
        assert client_round_trip(SCRAM_SHA_256, "mallory", "guessed").user == "mallory"
    finally:
        del STORE[("mallory", SCRAM_SHA_256)]


def test_a_replayed_client_final_fails() -> None:
    exchange = rfc_exchange()
    exchange.server_first(RFC_CLIENT_FIRST)
    exchange.server_final(RFC_CLIENT_FINAL)
    failure(lambda: exchange.server_final(RFC_CLIENT_FINAL))  # the same attempt, again
    failure(lambda: exchange.server_first(RFC_CLIENT_FIRST))
    # In a new attempt the server nonce differs, so the old proof is for another message.
    fresh = ScramExchange(
        SCRAM_SHA_256,
        lambda u, m: credential_from_password(m, "pencil", 4096, RFC_SALT),
        SECRET,
    )
    fresh.server_first(RFC_CLIENT_FIRST)
    failure(lambda: fresh.server_final(RFC_CLIENT_FINAL))


def test_a_failed_attempt_stays_failed() -> None:
    exchange = rfc_exchange()
    failure(lambda: exchange.server_final(RFC_CLIENT_FINAL))  # out of turn
    failure(lambda: exchange.server_first(RFC_CLIENT_FIRST))  # and over, for good
    assert exchange.user is None


@pytest.mark.parametrize(
    "client_first",
    [
        b"p=tls-server-end-point,,n=user,r=rOprNGfwEbeRWgbNEkqO",  # channel binding required
        b"p=tls-unique,,n=user,r=rOprNGfwEbeRWgbNEkqO",
        b"x,,n=user,r=abc",  # not a gs2 flag
        b"n,a=other,n=user,r=abc",  # an authzid
        b"n,,n=user",  # no nonce
        b"n,,r=abc,n=user",  # out of order
        b"n,,m=ext,n=user,r=abc",  # a mandatory extension
        b"n,,n=,r=abc",  # empty name
        b"n,,n=us=er,r=abc",  # a bad escape
        b"n,,n=user,r=a,b",  # a nonce with a comma
        b"n,,n=user,r=\x7f",  # a nonce outside printable ASCII
        b"n,,n=\xff,r=abc",  # not UTF-8
        b"n,,n=user,r=" + b"a" * 5000,  # too long
        b"",
    ],
)
def test_malformed_or_binding_client_first_fails(client_first: bytes) -> None:
    exchange = rfc_exchange()
    failure(lambda: exchange.server_first(client_first))
    failure(lambda: exchange.server_final(RFC_CLIENT_FINAL))


@pytest.mark.parametrize(
    "client_final",
    [
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=!!notbase64",
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"  # header changed to y
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA",  # short proof
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",  # no proof
        b"garbage",
    ],
)
def test_malformed_client_final_fails(client_final: bytes) -> None:
    exchange = rfc_exchange()
    exchange.server_first(RFC_CLIENT_FIRST)
    failure(lambda: exchange.server_final(client_final))


@settings(max_examples=200, deadline=None)
@given(first=st.binary(max_size=200), final=st.binary(max_size=200))
def test_any_bytes_fail_as_authentication_failed(first: bytes, final: bytes) -> None:
    """Nothing a client sends escapes as another exception."""
    exchange = ScramExchange(SCRAM_SHA_512, lookup, SECRET)
    steps = ((exchange.server_first, b"n,,n=alice,r=x" + first), (exchange.server_final, final))
    for step, message in steps:
        try:
            step(message)
        except AuthenticationFailed as exc:
            assert str(exc) == FAILURE_MESSAGE


def test_unknown_mechanism_is_the_callers_business() -> None:
    with pytest.raises(ValueError):
        ScramExchange("SCRAM-SHA-1", lookup, SECRET)


# --------------------------------------------------------------------------- PLAIN


def test_plain_good_password() -> None:
    assert authenticate_plain(b"\0alice\0wonderland", lookup, SECRET) == "alice"
    assert authenticate_plain(b"alice\0alice\0wonderland", lookup, SECRET) == "alice"


def test_plain_checks_the_sha_256_credential_when_it_is_the_only_one() -> None:
    only = {("carol", SCRAM_SHA_256): credential_from_password(SCRAM_SHA_256, "pw-c", 4096)}
    assert authenticate_plain(b"\0carol\0pw-c", lambda u, m: only.get((u, m)), SECRET) == "carol"


def test_plain_does_the_same_derivation_for_an_unknown_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unknown user's PLAIN check runs the same PBKDF2 (hash, iterations) as a known
    user's at the default iterations (a bootstrap user's credential), so its time does
    not tell the two apart (issue 39, item 5)."""
    known = {
        ("carol", mech): credential_from_password(mech, "pw-c", DEFAULT_ITERATIONS)
        for mech in SCRAM_MECHANISMS
    }
    derived: list[tuple[str, int]] = []
    pbkdf2 = hashlib.pbkdf2_hmac

    def known_lookup(user: str, mechanism: str) -> ScramCredential | None:
        return known.get((user, mechanism))

    def recording(name: str, password: bytes, salt: bytes, iterations: int) -> bytes:
        derived.append((name, iterations))
        return pbkdf2(name, password, salt, iterations)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", recording)
    works = []
    for message in (b"\0carol\0wrong", b"\0mallory\0wrong"):
        derived.clear()
        failure(functools.partial(authenticate_plain, message, known_lookup, SECRET))
        works.append(list(derived))
    assert works[0] == works[1] == [("sha512", DEFAULT_ITERATIONS)]


@pytest.mark.parametrize(
    "message",
    [
        b"\0alice\0not-it",  # wrong password
        b"\0mallory\0wonderland",  # unknown user
        b"bob\0alice\0wonderland",  # authzid is someone else
        b"alice\0wonderland",  # two fields
        b"\0alice\0wonder\0land",  # four
        b"\0\0wonderland",  # empty user
        b"\0alice\0",  # empty password
        b"\0alice\0" + b"w" * 256,  # a field over 255 bytes
        b"\0al\xffice\0wonderland",  # not UTF-8
        b"",
    ],
)
def test_plain_failures_look_the_same(message: bytes) -> None:
    failure(lambda: authenticate_plain(message, lookup, SECRET))


NonceOf = Callable[[str, str], str]


def librdkafka_final(exchange: ScramExchange, password: str, nonce_of: NonceOf) -> bytes:
    """A client-final as librdkafka writes it, its nonce chosen by `nonce_of(client's,
    server-first's)`, with a proof made by RFC 5802's formulas over that very message."""
    client_first_bare = "n=alice,r=rdkafkanonce"
    server_first = exchange.server_first(f"n,,{client_first_bare}".encode()).decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha512", password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    without_proof = f"c=biws,r={nonce_of('rdkafkanonce', fields['r'])}"
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.sha512(client_key).digest(), auth_message, "sha512").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_librdkafkas_doubled_client_nonce_is_taken_as_kafka_3_9_takes_it() -> None:
    """librdkafka before 2.6.1 sends its nonce and then the server's whole nonce, which
    begins with it (Debian's kcat could not log in)."""
    exchange = ScramExchange(SCRAM_SHA_512, lookup, SECRET)
    final = librdkafka_final(exchange, "wonderland", lambda mine, combined: mine + combined)
    assert exchange.server_final(final).startswith(b"v=") and exchange.user == "alice"
    right = ScramExchange(SCRAM_SHA_512, lookup, SECRET)
    final = librdkafka_final(right, "wonderland", lambda _mine, combined: combined)
    assert right.server_final(final).startswith(b"v="), "the RFC's own form, still"


@pytest.mark.parametrize(
    "nonce_of",
    [
        lambda mine, combined: "x" + combined,  # ends with the server's, another prefix
        lambda mine, combined: combined + combined,
        lambda mine, combined: mine + mine + combined,
        lambda mine, combined: mine + combined[:-1],
        lambda mine, combined: mine + "0" * (len(combined) - len(mine)),  # not this attempt's
    ],
)
def test_no_other_nonce_is_taken(nonce_of: NonceOf) -> None:
    exchange = ScramExchange(SCRAM_SHA_512, lookup, SECRET)
    final = librdkafka_final(exchange, "wonderland", nonce_of)
    failure(lambda: exchange.server_final(final))


def test_the_doubled_nonce_still_needs_the_password() -> None:
    exchange = ScramExchange(SCRAM_SHA_512, lookup, SECRET)
    final = librdkafka_final(exchange, "not-it", lambda mine, combined: mine + combined)
    failure(lambda: exchange.server_final(final))
