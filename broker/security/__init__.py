"""Security: who a connection is (SASL).

`scram` runs SCRAM-SHA-256/512 and PLAIN exchanges (pure, on `scramp`). Other
domains import from here, not from the modules.
"""

from broker.security.scram import (
    FAILURE_MESSAGE,
    PLAIN,
    SCRAM_MECHANISMS,
    AuthenticationFailed,
    ScramCredential,
    ScramExchange,
    authenticate_plain,
)

__all__ = [
    "FAILURE_MESSAGE",
    "PLAIN",
    "SCRAM_MECHANISMS",
    "AuthenticationFailed",
    "ScramCredential",
    "ScramExchange",
    "authenticate_plain",
]
