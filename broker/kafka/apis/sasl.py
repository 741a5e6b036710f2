"""SASL on a `kafka` listener: SaslHandshake (v0-1, answered by the listener: it names the
mechanism) and SaslAuthenticate (v0-2, one round of that mechanism's exchange, run by
the broker's SASL state as on the minibroker listener). After a v0 handshake the rounds
come as bare frames instead (KIP-43), which the codec reads as SaslAuthenticate; Kafka
4.0 dropped v0 (KIP-896), but librdkafka before 2.10 (kcat 1.7.1, Debian's) logs in
only when ApiVersions lists it, and then uses v1 and SaslAuthenticate."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker.kafka.api import Exchange, KafkaApi, Reply, Values
from broker.security import PLAIN
from protocol import messages as m
from protocol.errors import ErrorCode


def translate_sasl_handshake(req: Any, version: int, ex: Exchange) -> Reply:
    """The mechanism for the rounds after it, when the listener offers it (PLAIN only
    where it is allowed: a client refused here has not sent its password yet)."""
    enabled = list(ex.sasl_mechanisms)
    if req.mechanism not in enabled:
        ex.mechanism = None
        return Reply({"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": enabled})
    ex.mechanism = req.mechanism
    if version == 0:
        ex.bare_sasl_rounds = 1 if req.mechanism == PLAIN else 2
    return Reply({"error_code": ErrorCode.NONE, "mechanisms": enabled})


def translate_sasl_authenticate(req: Any, _version: int, ex: Exchange) -> m.Request | Reply:
    if ex.mechanism is None:
        return Reply(
            {
                "error_code": KafkaErrorCode.illegal_sasl_state,
                "error_message": "SaslHandshake first: it names the mechanism",
            }
        )
    return m.SaslAuthenticateRequest(mechanism=ex.mechanism, auth_bytes=bytes(req.auth_bytes))


def answer_sasl_authenticate(r: m.SaslAuthenticateResponse, _version: int, _asked: None) -> Values:
    return {
        "error_code": r.error,
        "error_message": r.error_message or r.message,
        "auth_bytes": r.auth_bytes,
        "session_lifetime": r.session_lifetime_ms,
    }


SASL_HANDSHAKE: KafkaApi[None] = KafkaApi(17, "SaslHandshake", 0, 1, translate_sasl_handshake, None)
SASL_AUTHENTICATE = KafkaApi(
    36, "SaslAuthenticate", 0, 2, translate_sasl_authenticate, answer_sasl_authenticate
)
APIS = (SASL_HANDSHAKE, SASL_AUTHENTICATE)
