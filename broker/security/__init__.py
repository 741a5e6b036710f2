"""Security: who may do what (PROTOCOL.md section 7, "Authorization").

`acl` holds the ACL bindings, their validation, filters and the `Authorizer` that
decides requests with them (pure). Other domains import from here, not from the
modules.
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

__all__ = [
    "AclBinding",
    "AclFilter",
    "Authorizer",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "canonical_host",
    "validate",
    "validate_filter",
]
