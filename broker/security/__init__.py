"""Security: who a connection is, and what it may do (docs/protocol.md section 7).

Authentication: `scram` runs SCRAM-SHA-256/512 and PLAIN exchanges (pure, on
`scramp`), `credentials` holds the SCRAM credentials and the records that change
them (pure), and `credential_store` their durable log, `security/credentials.wal`;
`sasl` is one connection's SASL state (what may run before authentication, the
rounds, the session's lifetime; pure) and `session` who the connection is.
Authorization: `acl` holds the ACL bindings, their validation, filters and the
`Authorizer` that decides requests with them (pure); `acl_store` keeps the
bindings durably in `security/acls.wal`; `authorization` judges each request by what
its class declares it needs (protocol/authorization.py) and audits the denials.
Other domains import from here, not from the modules.
"""

from broker.security.acl import (
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    canonical_host,
    validate,
    validate_filter,
)
from broker.security.acl_store import AclLog, AclLogError, AclStore, CreateResult, DeleteResult
from broker.security.authorization import Access, Audit, Denial, Judgement
from broker.security.credential_store import BOOTSTRAP_ENV, CredentialLog, CredentialStore
from broker.security.credentials import BootstrapError
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
    FAILURE_MESSAGE,
    PLAIN,
    SCRAM_MECHANISMS,
    AuthenticationFailed,
    ScramCredential,
    ScramExchange,
    authenticate_plain,
)
from broker.security.session import ANONYMOUS, DEFAULT_LISTENER, Session

__all__ = [
    "ANONYMOUS",
    "BOOTSTRAP_ENV",
    "DEFAULT_LISTENER",
    "FAILURE_MESSAGE",
    "PLAIN",
    "SCRAM_MECHANISMS",
    "Access",
    "AclBinding",
    "AclFilter",
    "AclLog",
    "AclLogError",
    "AclStore",
    "Admission",
    "Audit",
    "Authenticated",
    "AuthenticationFailed",
    "Authorizer",
    "BootstrapError",
    "Challenge",
    "CheckPlain",
    "CreateResult",
    "CredentialLog",
    "CredentialStore",
    "DeleteResult",
    "Denial",
    "Failed",
    "Judgement",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "SaslPolicy",
    "SaslState",
    "ScramCredential",
    "ScramExchange",
    "Session",
    "Unsupported",
    "authenticate_plain",
    "canonical_host",
    "validate",
    "validate_filter",
]
