"""One Kafka connection's codec: a Kafka request frame in, the broker's request out;
the broker's response out as the Kafka response that request asked for.

The connection machinery (broker/network/server.py) runs a `kafka` listener's
connections as it runs its own: the same reader, handlers, SASL state and in-order
writer, with this codec in place of msgpack. A broker request carries a `cid` of the
codec's choosing; the codec keeps, per cid, what the Kafka response needs (API key,
version, correlation id: any int32 the client picked) until it is encoded. Requests
are answered strictly in order, so those are at most the connection's in-flight
requests.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, cast

from broker.api import Answer, Outcome, SplicedReply
from broker.kafka.api import Exchange, KafkaApi, Reply
from broker.kafka.apis import API_VERSIONS, BY_KEY, SERVED, supported_ranges
from broker.kafka.apis.fetch import fetch_response
from broker.kafka.apis.produce import produce_response
from broker.kafka.apis.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE
from broker.kafka.entities import (
    HEAD,
    build,
    error_entity,
    has_error_code,
    read_request,
    request_class,
    response_class,
    write_response,
)
from broker.kafka.kafka_only import KafkaOnlyRequest
from broker.kafka.records import ONLY_V2, as_v2, only_v2
from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError
from protocol.framing import FrameError, OtherProtocol, splice_holes

CID_MASK = 2**31 - 1
BEFORE_AUTHENTICATION = frozenset({API_VERSIONS.key, SASL_HANDSHAKE.key, SASL_AUTHENTICATE.key})
"""What a SASL listener's connection may have answered before it has authenticated."""
BARE_SASL = -1
"""The version of a Call answering a bare SASL round (after a SaslHandshake v0)."""
_INT32 = struct.Struct(">i")


@dataclass(slots=True)
class Call:
    """What the response to one Kafka request needs besides the broker's answer. Not
    frozen: a frozen dataclass sets each field through object.__setattr__, 0.9 against
    0.3 µs a request here, and nothing changes a Call once made."""

    key: int
    version: int
    correlation_id: int
    asked: Any
    """What the API's answer needs of the Kafka request (its `Translated`'s), or None."""
    request: m.Request


class KafkaCodec:
    """Kafka's wire protocol for one connection of a `kafka` listener."""

    __slots__ = ("_calls", "_exchange", "_next_cid", "_readers")

    def __init__(
        self, sasl_mechanisms: tuple[str, ...], default_partitions: int, *, sasl: bool = False
    ) -> None:
        """`sasl`: the listener authenticates with SASL, so a connection starts out
        unauthenticated (`on_authenticated` ends that)."""
        self._exchange = Exchange(sasl_mechanisms, default_partitions, authenticated=not sasl)
        self._calls: dict[int, Call] = {}
        self._next_cid = 0
        self._readers = {api.key: api.reader() for api in SERVED if api.reader is not None}

    def on_authenticated(self) -> None:
        self._exchange.authenticated = True

    def decode(self, body: bytes | memoryview) -> m.Request | bytes:
        """The broker request in a Kafka request frame body, or the whole response
        frame when the listener answers it itself. FrameError: close the connection
        (bytes that are no Kafka request, an API key Kafka does not have), as Kafka
        does."""
        if self._exchange.bare_sasl_rounds:
            return self._bare_sasl_round(body)
        if len(body) < HEAD.size:
            raise FrameError(f"Kafka request of {len(body)} bytes: shorter than its header")
        key, version, correlation_id = HEAD.unpack_from(body)
        api = BY_KEY.get(key)
        if api is None or not api.serves(version):
            return self._unserved(key, version, correlation_id, api)
        asked = None
        read = self._readers.get(key)
        if read is not None:
            out = read(body, version)
        else:
            cls = request_class(key, version)
            assert cls is not None, f"kio lacks {api.name} v{version}"
            header, request = read_request(cls, body)
            try:
                translated = api.translate(request, version, self._exchange)
            except ProtocolError as exc:
                raise FrameError(f"{api.name} v{version}: {exc.message}") from exc
            # Reply and Translated are tuples and a request never is: of the checks that
            # tell them apart, the cheapest (a msgspec class's isinstance goes through
            # its metaclass), on every Fetch.
            if isinstance(translated, tuple):
                if isinstance(translated, Reply):
                    if not self._exchange.authenticated and key not in BEFORE_AUTHENTICATION:
                        return self._unauthenticated(api, version, correlation_id)
                    entity = build(response_class(key, version), translated.values)
                    return write_response(entity, correlation_id)
                asked = translated.asked
                translated = translated.request
            out = translated
            out.client_id = header.client_id
        cid = self._next_cid
        self._next_cid = (cid + 1) & CID_MASK
        out.cid = cid
        if out.expects_answer():
            self._calls[cid] = Call(key, version, correlation_id, asked, out)
        return out

    @staticmethod
    def _unauthenticated(api: KafkaApi[Any], version: int, correlation_id: int) -> bytes:
        """A request the listener would answer itself (a translation's refusal), sent
        before authentication: refused as the broker refuses every API then, in its own
        response's error; where that response has no top-level error, the connection
        closes, as Kafka closes it."""
        if not has_error_code(api.key, version):
            raise FrameError(f"{api.name} v{version} before authentication")
        message = f"{api.name} before authentication"
        entity = error_entity(api.key, version, ErrorCode.SASL_AUTHENTICATION_FAILED, message)
        return write_response(entity, correlation_id)

    def _bare_sasl_round(self, body: bytes | memoryview) -> m.Request:
        """A round of the mechanism a SaslHandshake v0 chose: the frame is its bytes."""
        ex = self._exchange
        if ex.bare_sasl_rounds < 0:
            raise FrameError("a frame after a failed SASL round (SaslHandshake v0)")
        assert ex.mechanism is not None, "a v0 handshake that chose no mechanism"
        ex.bare_sasl_rounds -= 1
        request = m.SaslAuthenticateRequest(mechanism=ex.mechanism, auth_bytes=bytes(body))
        request.cid = cid = self._next_cid
        self._next_cid = (cid + 1) & CID_MASK
        self._calls[cid] = Call(SASL_AUTHENTICATE.key, BARE_SASL, 0, None, request)
        return request

    def encode(self, response: m.Response, cid: int) -> bytes:
        """The Kafka response frame answering the request the codec gave `cid`."""
        call = self._calls.pop(cid)
        if call.version == BARE_SASL:
            return self._bare_sasl_answer(response)
        if type(response) is m.Response and (
            isinstance(call.request, KafkaOnlyRequest) or BY_KEY[call.key].name == call.request.api
        ):
            # A refusal before or instead of the handler, its entries answered one by
            # one. A Kafka API the listener runs as another native API (FindCoordinator
            # as Metadata) has other entries: it gets its own response's error, below.
            response = refusal(call.request, response)
        if type(response) is m.ProduceResponse:
            return produce_response(response, call.version, call.correlation_id)
        if type(response) is m.FetchResponse:
            # A placeholder for file bytes (pieces) is shorter than any batch: as_v2
            # leaves it as it is.
            records = [as_v2(p.records) for t in response.topics for p in t.partitions]
            return fetch_response(response, call.version, call.correlation_id, records)
        if type(response) is m.Response:
            entity = error_entity(call.key, call.version, response.error, response.message)
        else:
            answer = BY_KEY[call.key].answer
            assert answer is not None, "an API the listener answers itself has no call"
            values = answer(response, call.version, call.asked)
            entity = build(response_class(call.key, call.version), values)
        return write_response(entity, call.correlation_id)

    @staticmethod
    def converts(outcome: Outcome) -> bool:
        """Whether `outcome` is a Fetch answer holding our magic-1 batches: converting
        them to v2 is CPU work in proportion to the answer, which the connection does
        with `convert` in a worker thread, never on the event loop."""
        if isinstance(outcome, SplicedReply):
            return any(span.magics != ONLY_V2 for span in outcome.spans)
        if isinstance(outcome, Answer) and type(outcome.response) is m.FetchResponse:
            topics = outcome.response.topics
            return any(not only_v2(p.records) for t in topics for p in t.partitions)
        return False

    @staticmethod
    def convert(outcome: Outcome) -> Outcome:
        """`outcome` (one that `converts`) with its batches in Kafka's v2 form: the file
        spans holding magic-1 batches read, converted and closed (the others still go
        with sendfile), or the answer's records converted. Blocking: run it in a worker
        thread. Its size is the answer's, which Fetch bounds by `max_bytes`."""
        if isinstance(outcome, Answer):
            response = cast(m.FetchResponse, outcome.response)
            for topic in response.topics:
                for p in topic.partitions:
                    p.records = as_v2(p.records)
            return outcome
        assert isinstance(outcome, SplicedReply)
        converted: dict[bytes, bytes] = {}
        kept = []
        try:
            for hole, span in zip(outcome.holes, outcome.spans, strict=True):
                if span.magics == ONLY_V2:
                    kept.append((hole, span))
                else:
                    converted[hole] = as_v2(_read_span(span.fd, span.position, span.length))
        except BaseException:
            outcome.close()
            raise
        for hole, span in zip(outcome.holes, outcome.spans, strict=True):
            if hole in converted:
                os.close(span.fd)
        for topic in outcome.response.topics:
            for p in topic.partitions:
                p.records = converted.get(p.records, p.records)
        if not kept:
            return Answer(outcome.response)
        return SplicedReply(outcome.response, [s for _, s in kept], [h for h, _ in kept])

    def _bare_sasl_answer(self, response: m.Response) -> bytes:
        """The server's bytes of a bare round, framed by their length alone. A failure
        has no frame (KIP-43): nothing is sent, and the broker closes the connection
        after a failed authentication; any other refusal closes it at the next frame."""
        if response.error or not isinstance(response, m.SaslAuthenticateResponse):
            self._exchange.bare_sasl_rounds = -1
            return b""
        return _INT32.pack(len(response.auth_bytes)) + response.auth_bytes

    def pieces(self, reply: SplicedReply, cid: int) -> list[bytes | int]:
        """A Fetch response as bytes to send and, between them, indexes into the
        reply's file spans, which hold v2 batches alone (`convert` took the others) and
        go from the log file with sendfile."""
        call = self._calls[cid]
        holes = [
            (index, hole, span.length)
            for index, (hole, span) in enumerate(zip(reply.holes, reply.spans, strict=True))
        ]
        data = self.encode(reply.response, cid)
        compact = response_class(call.key, call.version).__flexible__  # type: ignore[attr-defined]
        return splice(data, holes, compact=compact)

    def _unserved(
        self, key: int, version: int, correlation_id: int, api: KafkaApi[Any] | None
    ) -> bytes:
        """The answer to a request of an API or version not served. KIP-511: an
        ApiVersions newer than served gets UNSUPPORTED_VERSION in a v0 response listing
        the served ranges, so the client can retry with one of them. An API Kafka has
        but this broker does not serve yet gets UNSUPPORTED_VERSION in its own response
        where that has a top-level error code (where it has per-partition codes alone,
        an empty answer would read as success: the connection closes); a version of a
        served API outside its range, or a key Kafka does not have, closes the
        connection as Kafka does."""
        if key == API_VERSIONS.key:
            values = {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": supported_ranges()}
            return write_response(build(response_class(key, 0), values), correlation_id)
        if api is None and request_class(key, version) is not None and has_error_code(key, version):
            message = "not served by this broker yet"
            entity = error_entity(key, version, ErrorCode.UNSUPPORTED_VERSION, message)
            return write_response(entity, correlation_id)
        if key < 0:  # the first byte is a msgpack map's
            raise OtherProtocol("minibroker", "a minibroker request (a msgpack map)")
        what = f"API key {key}" if api is None else f"{api.name} v{version}"
        raise FrameError(f"{what} is not served (ApiVersions lists what is)")


def refusal(request: m.Request, refused: m.Response) -> m.Response:
    """A refusal of the whole request as the request's own response, every entry
    (topic, partition, resource) answered with its code, where the request declares
    its entries: Kafka's responses to Produce, Fetch v4-6 and the others keep their
    errors there, and an empty list would read as success."""
    entries = type(request).requirements.entries
    if entries is None:
        return refused
    code = ErrorCode(refused.error)
    why = refused.message or code.name
    answers = [entries.refused(e, code, why) for e in entries.of_request(request)]
    response: Any = type(request).response
    return cast(
        m.Response,
        response(error=refused.error, message=refused.message, **{entries.answers: answers}),
    )


def splice(data: bytes, holes: list[tuple[int, bytes, int]], *, compact: bool) -> list[bytes | int]:
    """A response frame whose `records` fields are sent separately (zero-copy from a
    file): `data` carries, in place of each, a unique placeholder; `holes` lists
    (index, placeholder, real length). The result alternates bytes to send with the
    index whose bytes go there; length fields already count the real lengths."""
    pieces, total = splice_holes(data, 4, holes, lambda n: _records_length(n, compact))
    pieces[0] = _INT32.pack(total) + pieces[0]  # type: ignore[operator]
    return pieces


def _read_span(fd: int, position: int, length: int) -> bytes:
    data = os.pread(fd, length, position)
    if len(data) != length:
        raise OSError(f"log file shorter than its span ({len(data)} of {length} bytes)")
    return data


def _records_length(length: int, compact: bool) -> bytes:
    """How a `records` field's length precedes its bytes: an unsigned varint of
    length + 1 in flexible versions, an int32 before them."""
    if not compact:
        return _INT32.pack(length)
    value = length + 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
