"""Who is calling, and what they may do.

Bearer tokens come from the configuration as SHA-256 digests; a presented token is hashed and
looked up (digests are compared as dictionary keys of equal length, so no token is ever compared
character by character against a secret). Each token has a role and a tenant:

- `tenant`: its own tenant's keys, sessions, locks, jobs and watches; reads regions and cluster
  status.
- `operator`: as a tenant, and reads cluster members.
- `admin`: everything, including leadership transfer.

Every object a tenant creates lives in its namespace: keys and lock names are stored as
`<tenant>/<name>`, sessions carry the tenant as owner, jobs carry it in their spec. Another
tenant's object answers 404, exactly as a missing one, so names do not leak across tenants.
With no tokens configured authentication is off and every caller is an admin of tenant
`default` (a local development cluster).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

from aiohttp import web

from node.config import AuthConfig
from xrcore.errors import Forbidden, Unauthenticated

__all__ = [
    "Authenticator",
    "Permission",
    "Principal",
]


class Permission(StrEnum):
    DATA = "data"
    READ_CLUSTER = "read_cluster"
    READ_MEMBERS = "read_members"
    ADMIN = "admin"


_ROLE_PERMISSIONS: dict[str, frozenset[Permission]] = {
    "tenant": frozenset({Permission.DATA, Permission.READ_CLUSTER}),
    "operator": frozenset({Permission.DATA, Permission.READ_CLUSTER, Permission.READ_MEMBERS}),
    "admin": frozenset(Permission),
}


@dataclass(frozen=True)
class Principal:
    name: str
    role: str
    tenant: str

    def require(self, permission: Permission) -> None:
        if permission not in _ROLE_PERMISSIONS[self.role]:
            raise Forbidden(f"role {self.role!r} may not do this (needs {permission.value})")

    # The tenant's namespace.
    def scoped(self, name: str) -> str:
        return f"{self.tenant}/{name}"

    @property
    def prefix(self) -> str:
        return f"{self.tenant}/"

    def unscoped(self, name: str) -> str | None:
        """The caller's name for a stored name, or None when it is another tenant's."""
        prefix = self.prefix
        return name[len(prefix) :] if name.startswith(prefix) else None


ANONYMOUS_ADMIN = Principal(name="anonymous", role="admin", tenant="default")


class Authenticator:
    def __init__(self, config: AuthConfig) -> None:
        self.enabled = bool(config.tokens)
        self.open_health = config.open_health
        self._by_digest = {
            token.sha256.lower(): Principal(name=token.name, role=token.role, tenant=token.tenant)
            for token in config.tokens
        }

    def authenticate(self, request: web.Request) -> Principal:
        if not self.enabled:
            return ANONYMOUS_ADMIN
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("this request needs an Authorization: Bearer <token> header")
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        principal = self._by_digest.get(digest)
        if principal is None:
            raise Unauthenticated("the bearer token is not valid")
        return principal
