"""Hostile input: property-based fuzzing of the decoders, and abusive but valid
msgpack against the real broker.

Properties (Hypothesis), for ANY input:
- FrameDecoder, fed any bytes in any chunking, yields bodies or raises FrameError;
- decode_request raises only FrameError or RequestRefused, for any bytes and for
  the msgpack of any map (with or without a plausible api, v and cid);
- protocol.batch.validate raises only BatchError, for any bytes and for a valid
  batch with bytes flipped or cut;
- two SaslAuthenticate rounds of any mechanism and any bytes end in an answer (a
  challenge, a success, 33 or 58), never an exception; any security or
  administration request that decodes is judged by the pure code behind its handler
  (ACL validation and the Authorizer, the SCRAM credential state, topic config
  overrides) without an exception but ConfigError.

Against a real broker with a SASL listener and the authorizer on: malformed
SaslAuthenticate payloads (each answered 58 and the connection closed, or 33 and
the connection kept, or 42), and malformed ACL, credential, topic and config
requests sent unauthenticated (refused) and as a super user (refused entry by
entry, or whole); the bindings, users, topics and configs are unchanged after, and
the broker keeps serving.

Against the real broker, on each backend, each abusive request on a fresh
connection: huge and duplicated lists, 100k nested arrays, 2^64-1 and -2^63,
non-finite floats where ints belong, path-like topic names (`../x`, `/abs`,
`a/b`, `..`, NUL), 1 MiB strings in every field. Allowed: an error answer or a
closed connection. Meanwhile another connection's ApiVersions answers within
1 s, the broker stays up, and nothing appears outside the data dir.
"""

from __future__ import annotations

import contextlib
import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch
from protocol.batch import BatchError, build_batch, iter_records, scan_batches, validate
from protocol.framing import FrameDecoder, FrameError, decode_body, frame
from protocol.messages import APIS, RequestRefused, decode_request
from tests.reliability.conftest import size
from tests.reliability.fuzz_targets import MECHANISMS, admin_request, sasl_rounds

EXAMPLES = size(300, 3_000)
PROPERTY = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
MiB_STRING = "x" * (1 << 20)
U64_MAX = 2**64 - 1
I64_MIN = -(2**63)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(I64_MIN, U64_MAX)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
FIELDS = (
    "topics",
    "partitions",
    "partition",
    "records",
    "acks",
    "timeout_ms",
    "fetch_offset",
    "name",
    "config",
    "transactional_id",
    "producer_id",
    "producer_epoch",
    "allow_auto_create",
    "max_wait_ms",
    "isolation_level",
    "client_id",
)


def request_maps(fields: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """Maps with or without a plausible api, v and cid, and any of `fields`."""
    return st.fixed_dictionaries(
        {},
        optional={
            "api": st.sampled_from(APIS) | st.text(max_size=10) | scalars,
            "v": st.sampled_from([1, 0, 2, -1, True]) | scalars,
            "cid": st.integers(-5, 2**31 + 5) | scalars,
            **{name: values for name in fields},
        },
    )


requests = request_maps(FIELDS)


def decode_only_allowed(body: bytes) -> None:
    with contextlib.suppress(FrameError, RequestRefused):
        decode_request(body)


@PROPERTY
@given(data=st.binary(max_size=300), chunk=st.integers(1, 64), limit=st.integers(0, 200))
def test_frame_decoder_raises_only_frame_error(data: bytes, chunk: int, limit: int) -> None:
    decoder = FrameDecoder(limit)
    try:
        for start in range(0, len(data), chunk):
            for body in decoder.feed_bodies(data[start : start + chunk]):
                assert len(body) <= limit
                decode_only_allowed(body)
    except FrameError:
        pass


@PROPERTY
@given(body=st.binary(max_size=300))
def test_decode_request_of_any_bytes(body: bytes) -> None:
    decode_only_allowed(body)


@PROPERTY
@given(message=requests)
def test_decode_request_of_any_map(message: dict[str, Any]) -> None:
    decode_only_allowed(msgpack.packb(message, use_bin_type=True))


@PROPERTY
@given(
    # Drawn without client_id rather than filtered: a filter throws half the draws away.
    message=request_maps(tuple(f for f in FIELDS if f != "client_id")),
    junk=st.binary(min_size=1, max_size=4),
)
def test_decode_request_of_a_map_with_undecodable_text(
    message: dict[str, Any], junk: bytes
) -> None:
    """A str whose bytes are not UTF-8 (msgpack allows it on the wire) in client_id."""
    body = msgpack.packb({**message, "client_id": "\x00" * len(junk)}, use_bin_type=True)
    decode_only_allowed(body.replace(b"\x00" * len(junk), b"\xff" + junk[1:], 1))


@PROPERTY
@given(data=st.binary(max_size=400))
def test_validate_of_any_bytes(data: bytes) -> None:
    with contextlib.suppress(BatchError):
        validate(data, max_bytes=1 << 20)


@PROPERTY
@given(
    records=st.lists(st.binary(max_size=30), min_size=1, max_size=5),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4),
    cut=st.integers(0, 10_000),
    compression=st.sampled_from([0, 1, 2, 3]),
)
def test_validate_of_damaged_batches(
    records: list[bytes], flips: list[tuple[int, int]], cut: int, compression: int
) -> None:
    data = bytearray(build_batch([(0, None, v, None) for v in records], compression=compression))
    for at, mask in flips:
        data[at % len(data)] ^= mask
    with contextlib.suppress(BatchError):
        validate(bytes(data[: max(cut, 1)]), max_bytes=1 << 20)


SECURITY_APIS = (
    "SaslAuthenticate",
    "CreateAcls",
    "DescribeAcls",
    "DeleteAcls",
    "DescribeUserScramCredentials",
    "AlterUserScramCredentials",
    "DeleteTopics",
    "DescribeConfigs",
    "IncrementalAlterConfigs",
)
SECURITY_FIELDS = (
    "mechanism",
    "auth_bytes",
    "creations",
    "filter",
    "filters",
    "users",
    "deletions",
    "upsertions",
    "topics",
    "resources",
)
binding_like = st.fixed_dictionaries(
    {},
    optional={
        name: st.none() | st.text(max_size=12) | st.sampled_from(["*", "User:*", "topic"])
        for name in (
            "resource_type",
            "resource_name",
            "pattern_type",
            "principal",
            "host",
            "operation",
            "permission",
        )
    },
)
security_requests = st.fixed_dictionaries(
    {"api": st.sampled_from(SECURITY_APIS), "v": st.just(1), "cid": st.integers(1, 100)},
    optional={
        **{name: values for name in SECURITY_FIELDS},
        "creations": st.lists(binding_like, max_size=3),
        "filter": binding_like,
        "filters": st.lists(binding_like, max_size=3),
    },
)


@PROPERTY
@given(
    mechanism=st.integers(0, len(MECHANISMS) - 1),
    first=st.binary(max_size=200) | st.text(max_size=60).map(lambda t: f"n,,n={t},r=abc".encode()),
    second=st.binary(max_size=200)
    | st.text(max_size=60).map(lambda t: f"c=biws,r={t},p=AAAA".encode()),
)
def test_sasl_rounds_of_any_bytes(mechanism: int, first: bytes, second: bytes) -> None:
    sasl_rounds(bytes([mechanism]) + len(first).to_bytes(2, "big") + first + second)


@PROPERTY
@given(message=security_requests)
def test_security_requests_of_any_map(message: dict[str, Any]) -> None:
    admin_request(msgpack.packb(message, use_bin_type=True))


# --- against the real broker ------------------------------------------------------------

Raw = bytes  # a frame body sent as is


def nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


def raw_map(fields: dict[str, Any], extra_key: str, extra_value: bytes) -> Raw:
    """A msgpack map of `fields` plus one key whose value is the raw msgpack `extra_value`."""
    head = msgpack.packb(fields, use_bin_type=True)
    assert 0x80 <= head[0] < 0x8F
    return bytes([head[0] + 1]) + head[1:] + msgpack.packb(extra_key) + extra_value


def fetch_of(partitions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "api": "Fetch",
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "topics": [{"topic": "real", "partitions": partitions}],
    }


def produce_of(topic: Any, partition: Any = 0, acks: Any = -1, timeout_ms: Any = 1000) -> dict:
    return {
        "api": "Produce",
        "acks": acks,
        "timeout_ms": timeout_ms,
        "topics": [{"topic": topic, "partitions": [{"partition": partition, "records": BATCH}]}],
    }


BATCH = values_batch([b"hostile"])
PATHS = ["../x", "../../escape", "../../../escape", "/abs/escape", "a/b", "..", ".", "a\x00b", ""]
TEMPLATES: dict[str, dict[str, Any]] = {
    "Metadata": {"api": "Metadata", "topics": ["real"], "allow_auto_create": True},
    "CreateTopics": {"api": "CreateTopics", "topics": [{"name": "n", "partitions": 1}]},
    "InitProducerId": {"api": "InitProducerId", "transactional_id": "t", "producer_id": -1},
    "Produce": produce_of("real"),
    "Fetch": fetch_of([{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}]),
}


def huge_strings() -> Iterator[tuple[str, dict[str, Any]]]:
    """Each template with one field, at any depth, replaced by a 1 MiB string."""

    def walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
        if isinstance(value, dict):
            for key, inner in value.items():
                for where, replaced in walk(inner, f"{path}.{key}"):
                    yield where, {**value, key: replaced}
        elif isinstance(value, list):
            for where, replaced in walk(value[0], f"{path}[0]"):
                yield where, [replaced, *value[1:]]
        yield path, MiB_STRING

    for api, template in TEMPLATES.items():
        for where, message in walk(template, api):
            if where != api and not where.endswith(".api") and isinstance(message, dict):
                yield where, message


def abuses() -> Iterator[tuple[str, dict[str, Any] | Raw]]:
    base = msgpack.packb({"api": "Metadata", "v": 1, "cid": 9}, use_bin_type=True)
    yield "100k nested arrays", raw_map(msgpack.unpackb(base), "topics", nested(100_000))
    yield (
        "100k nested arrays in a batch field",
        raw_map({"api": "Produce", "v": 1, "cid": 9, "acks": 1}, "topics", nested(100_000)),
    )
    for number in (U64_MAX, I64_MIN, 2**63, math.inf, -math.inf, math.nan, 1.5):
        yield (
            f"partitions={number}",
            {
                "api": "CreateTopics",
                "topics": [{"name": f"num{abs(hash(number))}", "partitions": number}],
            },
        )
        yield f"produce partition={number}", produce_of("real", partition=number)
        yield f"produce acks={number}", produce_of("real", acks=number)
        yield (
            f"fetch_offset={number}",
            fetch_of([{"partition": 0, "fetch_offset": number, "partition_max_bytes": 1024}]),
        )
        yield (
            f"partition_max_bytes={number}",
            fetch_of([{"partition": 0, "fetch_offset": 0, "partition_max_bytes": number}]),
        )
        yield (
            f"producer_epoch={number}",
            {
                "api": "InitProducerId",
                "producer_id": number,
                "producer_epoch": number,
            },
        )
        yield f"cid={number}", {"api": "ApiVersions", "cid": number}
        yield f"v={number}", {"api": "ApiVersions", "v": number}
    for name in PATHS:
        yield (
            f"create {name!r}",
            {"api": "CreateTopics", "topics": [{"name": name, "partitions": 1}]},
        )
        yield f"metadata {name!r}", {"api": "Metadata", "topics": [name], "allow_auto_create": True}
        yield f"produce {name!r}", produce_of(name)
    yield (
        "create with path-like config",
        {
            "api": "CreateTopics",
            "topics": [{"name": "cfg", "partitions": 1, "config": {"../x": "../../escape"}}],
        },
    )
    yield from (("1 MiB " + where, message) for where, message in huge_strings())
    # Last: on a broker without a per-request bound these stall it for minutes.
    many = [f"t{i}" for i in range(100_000)]
    yield "metadata 100k duplicates", {"api": "Metadata", "topics": ["real"] * 100_000}
    yield (
        "metadata 100k names auto-create",
        {
            "api": "Metadata",
            "topics": many,
            "allow_auto_create": True,
        },
    )
    yield (
        "create 100k topics",
        {
            "api": "CreateTopics",
            "topics": [{"name": n, "partitions": 1} for n in many],
        },
    )
    yield (
        "create duplicates",
        {
            "api": "CreateTopics",
            "topics": [{"name": "dup", "partitions": 1}] * 2,
        },
    )
    yield (
        "produce 100k duplicate topics",
        {
            **produce_of("real"),
            "topics": produce_of("real")["topics"] * 100_000,
        },
    )
    yield (
        "fetch 100k duplicate partitions",
        fetch_of([{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}] * 100_000),
    )


# Integer extremes that may be answered with success: the contract clamps a fetch's
# byte limit (at least one whole batch, at most fetch_max_bytes), and InitProducerId
# treats a negative producer_id as "none given". Floats there are still refused.
LENIENT = ("partition_max_bytes=", "producer_epoch=")


def success_allowed(what: str) -> bool:
    return what.startswith(LENIENT) and what.split("=")[1].lstrip("-").isdigit()


def errors_in(answer: Any) -> list[int]:
    """Every `error` of the nested results of an answer."""
    if isinstance(answer, dict):
        found = [answer["error"]] if isinstance(answer.get("error"), int) else []
        return found + [e for k, v in answer.items() if k != "error" for e in errors_in(v)]
    if isinstance(answer, list):
        return [e for item in answer for e in errors_in(item)]
    return []


def is_error_answer(answer: dict[str, Any]) -> bool:
    """A top-level error, or an error in every one of the nested results."""
    nested = errors_in({k: v for k, v in answer.items() if k != "error"})
    return answer.get("error", 0) != 0 or (bool(nested) and all(nested))


def tree(root: Path, skip: Path) -> set[str]:
    return {
        str(p.relative_to(root)) for p in root.rglob("*") if p != skip and skip not in p.parents
    }


def send_abuse(bootstrap: str, abuse: dict[str, Any] | Raw, cid: int) -> dict[str, Any] | None:
    """Send one abusive request; its answer, or None when the broker closed the connection."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        if isinstance(abuse, bytes):
            body = abuse
        else:
            body = msgpack.packb({"v": 1, "cid": cid, **abuse}, use_bin_type=True)
        try:
            sock.sendall(frame(body))
            decoder = FrameDecoder(1 << 26)
            for _ in range(10_000):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    return None
                bodies = decoder.feed_bodies(chunk)
                if bodies:
                    return decode_body(bodies[0])
        except (ConnectionResetError, BrokenPipeError):
            return None
    raise AssertionError("no answer in 10,000 reads")


def test_abusive_requests_get_an_error_or_a_close(broker: BrokerProcess, tmp_path: Path) -> None:
    (tmp_path / "abs").mkdir()
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("real", 1) == 0
        assert c.produce("real", 0, values_batch([b"kept"]))["error"] == 0
    before = tree(tmp_path, tmp_path / "data")
    failures: list[str] = []
    tried = 0
    with WireClient(broker.bootstrap, timeout_s=1.0) as probe:
        for cid, (what, abuse) in enumerate(abuses(), start=100):
            tried += 1
            # Another connection is answered within 1 s while the abuse is being handled.
            probe_frame = probe.send("ApiVersions")
            started = time.monotonic()
            try:
                answer = send_abuse(broker.bootstrap, abuse, cid)
            except TimeoutError:
                failures.append(f"{what}: no answer and no close within 10 s")
                break
            try:
                assert probe.recv()["cid"] == probe_frame
            except (TimeoutError, ConnectionError) as stalled:
                failures.append(f"{what}: ApiVersions not answered within 1 s ({stalled!r})")
                break
            if answer is not None and not is_error_answer(answer) and not success_allowed(what):
                failures.append(f"{what}: answered without an error: {str(answer)[:200]}")
            if broker.proc is None or broker.proc.poll() is not None:
                failures.append(f"{what}: the broker died")
                break
            if time.monotonic() - started > 10:
                failures.append(f"{what}: took {time.monotonic() - started:.1f} s")
    after = tree(tmp_path, tmp_path / "data")
    if after != before:
        failures.append(f"created outside the data dir: {sorted(after - before)[:10]}")
    if list((tmp_path / "abs").iterdir()):
        failures.append("wrote into an absolute path named as a topic")
    topics = sorted(p.name for p in (tmp_path / "data" / "topics").iterdir())
    escaped = [t for t in topics if t in ("x", "escape", "..", ".") or "\x00" in t]
    if escaped:
        failures.append(f"path-like topic directories: {escaped}")
    try:
        with WireClient(broker.bootstrap, timeout_s=10) as c:
            if [r.value for r in _records(c)] != [b"kept"]:
                failures.append("the record written before the abuse changed")
    except OSError as stalled:
        failures.append(f"the broker did not answer a Fetch within 10 s after: {stalled!r}")
    print(f"hostile inputs tried on {broker.backend}: {tried}; failures: {len(failures)}")
    assert not failures, f"{len(failures)} failures in {tried} abuses:\n" + "\n".join(failures)


def _records(c: WireClient) -> list[Any]:
    data = c.fetch("real", 0, 0)["records"]
    return [r for pos, h in scan_batches(data) for r in iter_records(data, pos, h)]


# --- a SASL listener and the authorizer --------------------------------------------------

ADMIN_PASSWORD = "admin-password"
SCRAM_FIRST = b"n,,n=admin,r=abcdefgh"
SECURED = (
    'sasl_mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]\n'
    "allow_plain_without_tls = true\n"
    "authentication_failure_delay_ms = 10\n"
    "authorizer = true\n"
    'super_users = ["User:admin"]\n'
    '[[listeners]]\nname = "sasl"\nhost = "127.0.0.1"\nport = 0\nsecurity = "sasl_plaintext"\n'
)


def sasl_abuses() -> Iterator[tuple[str, dict[str, Any] | Raw, tuple[int, ...]]]:
    """(what, the request, the codes allowed): each SaslAuthenticate on a fresh
    connection. 58 is answered and closes the connection, 33 keeps it; a request that
    does not decode is answered 42 or closed (protocol.md section 1); no code allowed:
    closed unanswered (a frame over sasl_server_max_receive_bytes before
    authentication)."""
    scram = "SCRAM-SHA-256"
    for name, auth_bytes in (("1 MiB", b"n,,n=admin,r=" + b"x" * (1 << 20)),):
        yield (
            f"SCRAM {name}",
            {"api": "SaslAuthenticate", "mechanism": scram, "auth_bytes": auth_bytes},
            (),
        )
    for name, auth_bytes in (
        ("empty", b""),
        ("not UTF-8", b"\xff\xfe\xfd"),
        ("256 KiB", b"n,,n=admin,r=" + b"x" * (1 << 18)),
        ("no user", b"n,,n=,r=abc"),
        ("no nonce", b"n,,n=admin"),
        ("channel binding", b"p=tls-unique,,n=admin,r=abc"),
        ("NUL", b"n,,n=ad\x00min,r=abc"),
        ("client-final first", b"c=biws,r=abc,p=AAAA"),
        ("bad gs2 header", b"q,,n=admin,r=abc"),
    ):
        yield (
            f"SCRAM {name}",
            {"api": "SaslAuthenticate", "mechanism": scram, "auth_bytes": auth_bytes},
            (58,),
        )
    for name, auth_bytes in (
        ("two fields", b"\0admin"),
        ("four fields", b"\0admin\0pw\0more"),
        ("field over 255 bytes", b"\0" + b"a" * 300 + b"\0pw"),
        ("not UTF-8", b"\0\xff\0pw"),
        ("empty password", b"\0admin\0"),
        ("authzid for another", b"root\0admin\0" + ADMIN_PASSWORD.encode()),
    ):
        yield (
            f"PLAIN {name}",
            {"api": "SaslAuthenticate", "mechanism": "PLAIN", "auth_bytes": auth_bytes},
            (58,),
        )
    for mechanism in ("GSSAPI", "", "x" * (1 << 18), "scram-sha-256"):
        yield (
            f"mechanism {mechanism[:20]!r}",
            {"api": "SaslAuthenticate", "mechanism": mechanism, "auth_bytes": b"x"},
            (33,),
        )
    for name, fields in (
        ("auth_bytes as text", {"mechanism": scram, "auth_bytes": "n,,n=admin,r=abc"}),
        ("auth_bytes an int", {"mechanism": scram, "auth_bytes": U64_MAX}),
        ("mechanism nil", {"mechanism": None, "auth_bytes": b"x"}),
        ("mechanism a list", {"mechanism": [scram], "auth_bytes": b"x"}),
        ("no auth_bytes", {"mechanism": scram}),
    ):
        yield name, {"api": "SaslAuthenticate", **fields}, (42,)
    yield (
        "100k nested arrays as auth_bytes",
        raw_map(
            {"api": "SaslAuthenticate", "v": 1, "cid": 9, "mechanism": scram},
            "auth_bytes",
            nested(100_000),
        ),
        (42,),
    )


def bad_binding(**changed: Any) -> dict[str, Any]:
    good = {
        "resource_type": "topic",
        "resource_name": "real",
        "pattern_type": "literal",
        "principal": "User:mallory",
        "host": "*",
        "operation": "write",
        "permission": "allow",
    }
    return {**good, **changed}


def admin_abuses() -> Iterator[tuple[str, dict[str, Any]]]:
    """Security and administration requests that must change nothing: every one is
    refused whole or entry by entry."""
    for name, changed in (
        ("resource_type", {"resource_type": "nope"}),
        ("principal without User:", {"principal": "mallory"}),
        ("principal User:", {"principal": "User:"}),
        ("host not an IP", {"host": "evil.example.com"}),
        ("cluster named x", {"resource_type": "cluster", "resource_name": "x"}),
        ("empty name", {"resource_name": ""}),
        ("1 MiB name", {"resource_name": MiB_STRING}),
        ("operation", {"operation": "ALL"}),
        ("permission", {"permission": "maybe"}),
        ("pattern match", {"pattern_type": "match"}),
        ("nil principal", {"principal": None}),
        ("int name", {"resource_name": 7}),
    ):
        yield f"CreateAcls {name}", {"api": "CreateAcls", "creations": [bad_binding(**changed)]}
    yield (
        "CreateAcls 100k",
        {"api": "CreateAcls", "creations": [bad_binding(operation="ALL")] * 100_000},
    )
    for name, changed in (
        ("resource_type", {"resource_type": "nope"}),
        ("host", {"host": "::x"}),
        ("pattern", {"pattern_type": "glob"}),
    ):
        yield f"DeleteAcls {name}", {"api": "DeleteAcls", "filters": [bad_binding(**changed)]}
        yield f"DescribeAcls {name}", {"api": "DescribeAcls", "filter": bad_binding(**changed)}
    yield "DescribeAcls without filter", {"api": "DescribeAcls"}
    upsertion = {
        "user": "mallory",
        "mechanism": "SCRAM-SHA-256",
        "iterations": 4096,
        "salt": b"s" * 16,
        "salted_password": b"p" * 32,
    }
    for name, changed in (
        ("iterations 2^64-1", {"iterations": U64_MAX}),
        ("iterations -1", {"iterations": -1}),
        ("iterations 1", {"iterations": 1}),
        ("empty salt", {"salt": b""}),
        ("short salted_password", {"salted_password": b"p"}),
        ("empty user", {"user": ""}),
        ("1 MiB user", {"user": MiB_STRING}),
        ("mechanism MD5", {"mechanism": "MD5"}),
        ("not SASLprep", {"user": "mal\u00adlory"}),
        ("salt as text", {"salt": "ssss"}),
    ):
        yield (
            f"AlterUserScramCredentials {name}",
            {
                "api": "AlterUserScramCredentials",
                "deletions": [],
                "upsertions": [{**upsertion, **changed}],
            },
        )
    yield (
        "AlterUserScramCredentials twice",
        {"api": "AlterUserScramCredentials", "deletions": [], "upsertions": [upsertion, upsertion]},
    )
    yield (
        "AlterUserScramCredentials delete unknown",
        {
            "api": "AlterUserScramCredentials",
            "deletions": [{"user": "nobody", "mechanism": "SCRAM-SHA-256"}],
            "upsertions": [],
        },
    )
    yield (
        "DescribeUserScramCredentials duplicates",
        {"api": "DescribeUserScramCredentials", "users": ["admin", "admin"]},
    )
    yield (
        "DescribeUserScramCredentials 1 MiB",
        {"api": "DescribeUserScramCredentials", "users": [MiB_STRING]},
    )
    yield (
        "DescribeUserScramCredentials 100k",
        {"api": "DescribeUserScramCredentials", "users": [f"u{i}" for i in range(100_000)]},
    )
    for name in PATHS:
        yield f"DeleteTopics {name!r}", {"api": "DeleteTopics", "topics": [name]}
    yield "DeleteTopics duplicates", {"api": "DeleteTopics", "topics": ["real", "real"]}
    yield "DeleteTopics 100k", {"api": "DeleteTopics", "topics": [f"t{i}" for i in range(100_000)]}
    yield (
        "DescribeConfigs type",
        {"api": "DescribeConfigs", "resources": [{"type": "nope", "name": "real"}]},
    )
    yield (
        "DescribeConfigs 1 MiB",
        {"api": "DescribeConfigs", "resources": [{"type": "topic", "name": MiB_STRING}]},
    )
    for name, op in (
        ("op explode", {"name": "retention.ms", "op": "explode", "value": "1"}),
        ("path-like key", {"name": "../x", "op": "set", "value": "1"}),
        ("1 MiB value", {"name": "retention.ms", "op": "set", "value": MiB_STRING}),
        ("float value", {"name": "retention.ms", "op": "set", "value": "1e3"}),
        ("below the bounds", {"name": "retention.ms", "op": "set", "value": "-5"}),
        ("broker setting", {"name": "authorizer", "op": "set", "value": "false"}),
    ):
        yield (
            f"IncrementalAlterConfigs {name}",
            {
                "api": "IncrementalAlterConfigs",
                "resources": [{"type": "topic", "name": "real", "ops": [op]}],
            },
        )


def answer_of(client: WireClient, abuse: dict[str, Any] | Raw, cid: int) -> dict[str, Any] | None:
    """Send one request on `client`; its answer, or None when the broker closed."""
    body = (
        abuse
        if isinstance(abuse, bytes)
        else msgpack.packb({"v": 1, "cid": cid, **abuse}, use_bin_type=True)
    )
    try:
        client.send_raw(frame(body))
        return client.recv()
    except (ConnectionError, OSError):
        return None


def security_state(c: WireClient) -> tuple[Any, ...]:
    """What the abuses must not change: the bindings, the users, the topics, the config."""
    acls = c.call(
        "DescribeAcls", filter=dict.fromkeys(bad_binding(), None) | {"pattern_type": "any"}
    )
    users = c.call("DescribeUserScramCredentials", users=None)
    topics = c.call("Metadata", topics=None)
    configs = c.call("DescribeConfigs", resources=[{"type": "topic", "name": "real"}])
    return (
        acls["bindings"],
        users["results"],
        sorted(t["name"] for t in topics["topics"]),
        configs["results"],
    )


def test_hostile_security_requests_change_nothing(tmp_path: Path, backend: str) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=SECURED,
        env={"MINIBROKER_BOOTSTRAP_USERS": f"admin:{ADMIN_PASSWORD},alice:alice-password"},
    ).start()
    address = broker.address("sasl")
    failures: list[str] = []
    try:
        with WireClient(address) as admin:
            admin.authenticate("admin", ADMIN_PASSWORD)
            assert admin.create_topic("real", 1) == 0
            assert admin.produce("real", 0, values_batch([b"kept"]))["error"] == 0
            created = admin.call(
                "CreateAcls", creations=[bad_binding(principal="User:alice", operation="read")]
            )
            assert created["results"][0]["error"] == 0, created
            before = security_state(admin)
        tried = 0
        for cid, (what, abuse, allowed) in enumerate(sasl_abuses(), start=100):
            tried += 1
            with WireClient(address, timeout_s=10) as c:
                answer = answer_of(c, abuse, cid)
                if answer is None:
                    # Only a request that does not decode may be closed unanswered.
                    if allowed and 42 not in allowed:
                        failures.append(f"{what}: closed unanswered, expected {allowed}")
                    continue
                if not allowed:
                    failures.append(f"{what}: answered {str(answer)[:200]}, expected a close")
                if answer.get("error") not in allowed:
                    failures.append(f"{what}: answered {str(answer)[:200]}, expected {allowed}")
                elif answer["error"] == 58 and not c.is_closed_by_peer():
                    failures.append(f"{what}: 58 but the connection stayed open")
                elif answer["error"] == 33 and c.call("ApiVersions")["error"] != 0:
                    failures.append(f"{what}: 33 but the connection does not serve on")
        # A SCRAM round 1 then garbage: the exchange fails and the connection closes.
        with WireClient(address, timeout_s=10) as c:
            assert c.sasl("SCRAM-SHA-256", SCRAM_FIRST)["error"] == 0
            if c.sasl("SCRAM-SHA-256", b"c=biws,r=wrong,p=AAAA")["error"] != 58:
                failures.append("a wrong client-final was not answered 58")
            elif not c.is_closed_by_peer():
                failures.append("a wrong client-final left the connection open")
        for cid, (what, abuse) in enumerate(admin_abuses(), start=1000):
            tried += 2
            # Unauthenticated: refused before the handler, the connection stays.
            with WireClient(address, timeout_s=10) as c:
                answer = answer_of(c, abuse, cid)
                if answer is not None and answer.get("error") not in (58, 42):
                    failures.append(f"{what} unauthenticated: {str(answer)[:200]}")
            # As the super user: the handler refuses it.
            with WireClient(address, timeout_s=10) as c:
                c.authenticate("admin", ADMIN_PASSWORD, "SCRAM-SHA-512")
                answer = answer_of(c, abuse, cid)
                if answer is not None and not is_error_answer(answer):
                    failures.append(f"{what}: answered without an error: {str(answer)[:200]}")
            if broker.proc is None or broker.proc.poll() is not None:
                failures.append(f"{what}: the broker died")
                break
        with WireClient(address, timeout_s=10) as admin:
            admin.authenticate("admin", ADMIN_PASSWORD)
            after = security_state(admin)
            if after != before:
                failures.append(f"the state changed:\n{before}\n{after}")
            if [r.value for r in _records(admin)] != [b"kept"]:
                failures.append("the record written before the abuse changed")
        with WireClient(address, timeout_s=10) as alice:
            alice.authenticate("alice", "alice-password", "PLAIN")
            if alice.call("ApiVersions")["error"] != 0:
                failures.append("alice cannot use the broker after the abuse")
        print(f"security abuses tried on {backend}: {tried}; failures: {len(failures)}")
        # Secrets stay out of the log, whatever was sent.
        for secret in (ADMIN_PASSWORD, "alice-password"):
            if secret in broker.log_text():
                failures.append(f"the log shows the password {secret!r}")
    finally:
        broker.kill()
    assert not failures, "\n".join(failures)
