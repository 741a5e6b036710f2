"""Security: who a connection is (SASL) and the credentials that say so.

`scram` runs SCRAM-SHA-256/512 and PLAIN exchanges (pure, on `scramp`),
`credentials` holds the SCRAM credentials and the records that change them
(pure), and `credential_store` their durable log, `security/credentials.wal`.
Other domains import from here, not from the modules.
"""

from broker.security.credential_store import BOOTSTRAP_ENV, CredentialLog, CredentialStore
from broker.security.credentials import BootstrapError
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
    "BOOTSTRAP_ENV",
    "FAILURE_MESSAGE",
    "PLAIN",
    "SCRAM_MECHANISMS",
    "AuthenticationFailed",
    "BootstrapError",
    "CredentialLog",
    "CredentialStore",
    "ScramCredential",
    "ScramExchange",
    "authenticate_plain",
]
