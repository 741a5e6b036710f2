"""SASL on a `kafka` listener: SaslHandshake (v1, answered by the listener: it names the
mechanism) and SaslAuthenticate (v0-2, one round of that mechanism's exchange, run by
the broker's SASL state as on the minibroker listener)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode as KafkaErrorCode

from broker.kafka.api import Exchange, KafkaApi, Reply, Values
from protocol import messages as m
from protocol.errors import ErrorCode


def translate_sasl_handshake(req: Any, _version: int, ex: Exchange) -> Reply:
    enabled = list(ex.sasl_mechanisms)
    if req.mechanism not in enabled:
        ex.mechanism = None
        return Reply({"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": enabled})
    ex.mechanism = req.mechanism
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


SASL_HANDSHAKE: KafkaApi[None] = KafkaApi(17, "SaslHandshake", 1, 1, translate_sasl_handshake, None)
SASL_AUTHENTICATE = KafkaApi(
    36, "SaslAuthenticate", 0, 2, translate_sasl_authenticate, answer_sasl_authenticate
)
APIS = (SASL_HANDSHAKE, SASL_AUTHENTICATE)
