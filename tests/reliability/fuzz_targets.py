"""Fuzz targets shared by Hypothesis, atheris (`make fuzz`) and the crash replays.

`one_input(data)` treats the first byte as a selector. Below `SECURITY_SELECTORS`
the rest of the bytes go through the frame decoder (fed in chunks) and every body
it yields through `decode_request`, or straight into `decode_request`, or into the
batch validator (selector % 3). From `SECURITY_SELECTORS` on they go to the pure
code behind the security and administration APIs, which the broker runs on what a
client sends, and from `V2_SELECTORS` to the validator of Kafka's v2 batches:

- `sasl_rounds`: two SaslAuthenticate rounds of one connection's `SaslState` (a
  mechanism, a client-first and a client-final, or PLAIN's message checked as the
  broker checks it), against a store that knows one user;
- `admin_request`: a decoded CreateAcls, DescribeAcls, DeleteAcls,
  DescribeUserScramCredentials, AlterUserScramCredentials, DescribeConfigs or
  IncrementalAlterConfigs, judged and applied as the broker's handlers do (ACL
  validation and the `Authorizer`, the credential state's `alter`/`describe`, a
  topic's config overrides);
- `batch_v2_bytes`: the bytes as a v2 batch whose magic, batch_length and CRC-32C
  are made right first, so mutations reach the records parser and the codecs
  rather than stopping at the CRC;
- `kafka_before_authentication` (selector `KAFKA_SELECTOR`): a Kafka request frame
  body decoded by a SASL kafka listener's codec and, whatever API it is, refused as
  a connection not yet authenticated refuses it (58), encoded as the API's response.

Each may raise only the errors the contract names: FrameError or RequestRefused for
frames and requests, BatchError for batches, ConfigError for a refused config
change; a SASL failure is an answer (`Failed`, `Unsupported`), never an exception.
Anything else escapes, and the fuzzer keeps the input as a crash file.
"""

from __future__ import annotations

import contextlib
import io
import struct

import crc32c
import msgspec
from kio.serial import entity_writer

from broker.config import BrokerConfig, ConfigError, altered_overrides, describe_topic
from broker.kafka import KafkaCodec
from broker.kafka.entities import build, request_class
from broker.security import (
    AclBinding,
    AclFilter,
    AuthenticationFailed,
    Authorizer,
    CheckPlain,
    SaslPolicy,
    SaslState,
    ScramCredential,
    authenticate_plain,
    validate,
    validate_filter,
)
from broker.security import credentials as creds
from broker.security.scram import ITERATIONS_MIN, credential_from_password
from protocol import messages as m
from protocol.batch import LENGTH_PREFIX_BYTES, MAGIC_AT, MAGIC_V2, BatchError
from protocol.batch import validate as validate_batch
from protocol.batch_v2 import CRC_V2_AT, CRC_V2_START, HEADER_V2_BYTES
from protocol.errors import ErrorCode
from protocol.framing import FrameDecoder, FrameError
from protocol.messages import RequestRefused, decode_request

FRAME_BYTES_MAX = 1 << 16
SECURITY_SELECTORS = 0xF0
"""Selectors from here on feed the security targets; 0xF0..0xF7 SASL, 0xF8.. the rest."""
V2_SELECTORS = 0xFC
"""Selectors from here on feed `batch_v2_bytes` (0xF8..0xFB stay the admin target's)."""
KAFKA_SELECTOR = 0xFF
"""The last selector feeds `kafka_before_authentication` (0xFC..0xFE stay v2's)."""
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "GSSAPI")
USER, PASSWORD = "alice", "alice-password"
MOCK_SECRET = b"\x07" * 32
# The least iterations the broker accepts: the fuzzer should spend its time parsing.
_KNOWN = {
    mechanism: credential_from_password(mechanism, PASSWORD, ITERATIONS_MIN, b"s" * 16)
    for mechanism in MECHANISMS[:2]
}
_POLICY = SaslPolicy(MECHANISMS[:3], plain_allowed=True, reauth_ms=60_000)


def frames(data: bytes, chunk: int) -> None:
    decoder = FrameDecoder(FRAME_BYTES_MAX)
    for start in range(0, len(data), max(chunk, 1)):
        try:
            bodies = decoder.feed_bodies(data[start : start + max(chunk, 1)])
        except FrameError:
            return
        for body in bodies:
            request_bytes(body)


def request_bytes(body: bytes) -> None:
    with contextlib.suppress(FrameError, RequestRefused):
        decode_request(body)


def batch_bytes(data: bytes) -> None:
    with contextlib.suppress(BatchError):
        validate_batch(data, max_bytes=1 << 20)


def batch_v2_bytes(data: bytes) -> None:
    batch = bytearray(data)
    if len(batch) >= HEADER_V2_BYTES:
        batch[MAGIC_AT] = MAGIC_V2
        struct.pack_into(">i", batch, 8, len(batch) - LENGTH_PREFIX_BYTES)
        struct.pack_into(">I", batch, CRC_V2_AT, crc32c.crc32c(bytes(batch[CRC_V2_START:])))
    with contextlib.suppress(BatchError):
        validate_batch(bytes(batch), max_bytes=1 << 20)


def _lookup(user: str, mechanism: str) -> ScramCredential | None:
    return _KNOWN.get(mechanism) if user == USER else None


def sasl_rounds(data: bytes) -> None:
    """Byte 0: the mechanism; bytes 1-2: the length of the first message; then the first
    message and the second. Both go to one connection's state, as two consecutive
    SaslAuthenticate requests."""
    if len(data) < 3:
        return
    mechanism = MECHANISMS[data[0] % len(MECHANISMS)]
    split = 3 + int.from_bytes(data[1:3], "big")
    state = SaslState(_lookup, MOCK_SECRET)
    for message in (data[3:split], data[split:]):
        step = state.authenticate(mechanism, message, _POLICY, now_ms=0)
        if isinstance(step, CheckPlain):
            try:
                user = authenticate_plain(step.message, _lookup, MOCK_SECRET)
            except AuthenticationFailed as exc:
                state.plain_checked(None, exc.reason, _POLICY, now_ms=0)
            else:
                state.plain_checked(user, "", _POLICY, now_ms=0)
        if state.closed:
            return


def _binding(wire: m.AclBinding) -> AclBinding:
    return AclBinding(*msgspec.structs.astuple(wire))


def _filter(wire: m.AclBindingFilter) -> AclFilter:
    return AclFilter(*msgspec.structs.astuple(wire))


def admin_request(body: bytes) -> None:
    """A request body decoded, then judged by the pure code its handler runs."""
    try:
        request = decode_request(body)
    except (FrameError, RequestRefused):
        return
    authorizer = Authorizer(["User:admin"])
    if isinstance(request, m.CreateAclsRequest):
        for wire in request.creations:
            binding = _binding(wire)
            if validate(binding) is None:
                authorizer.add(binding)
        for binding in list(authorizer):
            authorizer.authorize(binding.principal, "10.0.0.1", "describe", "topic", "t")
            authorizer.remove(binding)
    elif isinstance(request, m.DescribeAclsRequest | m.DeleteAclsRequest):
        described = isinstance(request, m.DescribeAclsRequest)
        filters = [request.filter] if described else request.filters
        for wire_filter in filters:
            acl_filter = _filter(wire_filter)
            if validate_filter(acl_filter) is None:
                authorizer.describe(acl_filter)
    elif isinstance(request, m.AlterUserScramCredentialsRequest):
        state = creds.CredentialState()
        _, record = creds.alter(state, request.deletions, request.upsertions)
        if record is not None:
            state.apply(record)
        creds.describe(state, None)
    elif isinstance(request, m.DescribeUserScramCredentialsRequest):
        creds.describe(creds.CredentialState(), request.users)
    elif isinstance(request, m.IncrementalAlterConfigsRequest):
        for resource in request.resources:
            ops = [(op.name, op.op, op.value) for op in resource.ops]
            with contextlib.suppress(ConfigError):
                describe_topic(BrokerConfig(), altered_overrides({}, ops))


def kafka_before_authentication(body: bytes) -> None:
    """Byte 0 on: a Kafka request frame body, as a SASL kafka listener's connection
    meets it before authenticating: the codec decodes it (FrameError: the connection
    closes) and refuses what it yields as the server does (broker/network/server.py
    `_admit`), in the API's own response."""
    codec = KafkaCodec(MECHANISMS[:3], default_partitions=1)
    try:
        request = codec.decode(body)
    except FrameError:
        return
    if isinstance(request, bytes) or not request.expects_answer():
        return
    refused = m.error_response(ErrorCode.SASL_AUTHENTICATION_FAILED, "authenticate first")
    codec.encode(refused, request.cid)


def smallest_kafka_request(key: int, version: int, correlation_id: int) -> bytes:
    """A Kafka request frame body of (key, version) with every field at its zero (a
    Produce with acks 1, so that it is answered): the least a client may ask."""
    cls = request_class(key, version)
    assert cls is not None, (key, version)
    header_cls = cls.__header_schema__  # type: ignore[attr-defined]
    header = {
        "request_api_key": key,
        "request_api_version": version,
        "correlation_id": correlation_id,
        "client_id": "smallest",
    }
    out = io.BytesIO()
    entity_writer(header_cls)(out, build(header_cls, header))
    entity_writer(cls)(out, build(cls, {"acks": 1} if key == 0 else {}))
    return out.getvalue()


def one_input(data: bytes) -> None:
    if not data:
        return
    selector, rest = data[0], data[1:]
    if selector >= SECURITY_SELECTORS:
        if selector < SECURITY_SELECTORS + 8:
            sasl_rounds(rest)
        elif selector < V2_SELECTORS:
            admin_request(rest)
        elif selector < KAFKA_SELECTOR:
            batch_v2_bytes(rest)
        else:
            kafka_before_authentication(rest)
    elif selector % 3 == 0:
        frames(rest, 1 + selector // 3)
    elif selector % 3 == 1:
        request_bytes(rest)
    else:
        batch_bytes(rest)
