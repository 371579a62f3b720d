"""Users, roles and what each role may do.

Roles, from most to least powerful:

| role | may |
|---|---|
| ``admin`` | everything, in every tenant |
| ``operator`` | see everything; manage nodes, pools and any job; not users |
| ``tenant-admin`` | its tenant's jobs (cancel any), its users and their tokens |
| ``member`` | submit jobs in its tenant; see its tenant's jobs; cancel its own |
| ``viewer`` | read its own tenant's jobs, pools and usage |
| ``agent`` | the node-agent protocol only (register, heartbeat, assignments) |

The permission table itself is :data:`PERMISSIONS`; the API checks it, and a test walks every
role against every endpoint.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpupool.domain.pools import validate_name


class Role(enum.Enum):
    ADMIN = "admin"
    OPERATOR = "operator"
    TENANT_ADMIN = "tenant-admin"
    MEMBER = "member"
    VIEWER = "viewer"
    AGENT = "agent"


class Permission(enum.Enum):
    """Actions the API authorises. ``*_ANY`` means across tenants."""

    JOB_SUBMIT = "job:submit"
    JOB_READ = "job:read"  # jobs of one's own tenant
    JOB_READ_ANY = "job:read-any"
    JOB_CANCEL_OWN = "job:cancel-own"
    JOB_CANCEL_TENANT = "job:cancel-tenant"
    JOB_CANCEL_ANY = "job:cancel-any"
    NODE_READ = "node:read"
    NODE_MANAGE = "node:manage"
    POOL_READ = "pool:read"
    POOL_MANAGE = "pool:manage"
    TENANT_READ = "tenant:read"
    TENANT_MANAGE = "tenant:manage"
    USER_MANAGE_TENANT = "user:manage-tenant"
    USER_MANAGE_ANY = "user:manage-any"
    USAGE_READ = "usage:read"
    USAGE_READ_ANY = "usage:read-any"
    AUDIT_READ = "audit:read"
    AGENT = "agent"


_P = Permission
_READ_OWN = {_P.JOB_READ, _P.NODE_READ, _P.POOL_READ, _P.TENANT_READ, _P.USAGE_READ}

PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(p for p in Permission if p is not _P.AGENT),
    Role.OPERATOR: frozenset(
        _READ_OWN
        | {
            _P.JOB_READ_ANY,
            _P.JOB_CANCEL_OWN,
            _P.JOB_CANCEL_TENANT,
            _P.JOB_CANCEL_ANY,
            _P.JOB_SUBMIT,
            _P.NODE_MANAGE,
            _P.POOL_MANAGE,
            _P.USAGE_READ_ANY,
            _P.AUDIT_READ,
        }
    ),
    Role.TENANT_ADMIN: frozenset(
        _READ_OWN | {_P.JOB_SUBMIT, _P.JOB_CANCEL_OWN, _P.JOB_CANCEL_TENANT, _P.USER_MANAGE_TENANT}
    ),
    Role.MEMBER: frozenset(_READ_OWN | {_P.JOB_SUBMIT, _P.JOB_CANCEL_OWN}),
    Role.VIEWER: frozenset(_READ_OWN),
    Role.AGENT: frozenset({_P.AGENT}),
}


def allows(role: Role, permission: Permission) -> bool:
    """True when ``role`` holds ``permission``."""
    return permission in PERMISSIONS[role]


@dataclass(frozen=True)
class User:
    """A person (or a node agent) with one role in one tenant.

    ``tenant`` is ``None`` only for cluster-wide roles (admin, operator, agent).
    """

    name: str
    role: Role
    tenant: str | None = None

    def __post_init__(self) -> None:
        validate_name("user", self.name)
        if self.role in (Role.TENANT_ADMIN, Role.MEMBER, Role.VIEWER) and self.tenant is None:
            raise ValueError(f"user {self.name}: role {self.role.value} needs a tenant")
