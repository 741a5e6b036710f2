"""Security: who may do what (PROTOCOL.md section 7, "Authorization").

`acl` holds the ACL bindings, their validation, filters and the `Authorizer` that
decides requests with them (pure); `acl_store` keeps the bindings durably in
`<data_dir>/security/acls.wal` for CreateAcls and DeleteAcls. Other domains import
from here, not from the modules.
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

__all__ = [
    "AclBinding",
    "AclFilter",
    "AclLog",
    "AclLogError",
    "AclStore",
    "Authorizer",
    "CreateResult",
    "DeleteResult",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "canonical_host",
    "validate",
    "validate_filter",
]
