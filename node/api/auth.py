"""Who is calling, and what they may do.

Bearer tokens come from the configuration as SHA-256 digests; a presented token is hashed and
looked up (digests are compared as dictionary keys of equal length, so no token is ever compared
character by character against a secret). Each token has a role and a tenant, and each role a
set of permissions (`ROLE_PERMISSIONS`):

- `tenant`: its own tenant's keys, sessions, locks, jobs and watches; reads regions, cluster
  status and its own tenant's scheduling settings.
- `operator`: as a tenant, and reads cluster members and every tenant's settings.
- `admin`: everything, including leadership transfer and setting tenants.

Every route has a rule (`ROUTE_RULES`, keyed by method and route as the OpenAPI document names
them): public, open while `auth.open_health` is set, or a permission. The HTTP middleware checks
it before the handler runs, so a handler cannot forget to; a route without a rule needs
`admin` (fail closed), and `tests/node/test_authz.py` fails until the rule is written down.

Every object a tenant creates lives in its namespace: keys and lock names are stored as
`<tenant>/<name>`, sessions carry the tenant as owner, jobs carry it in their spec. Another
tenant's object answers 404, exactly as a missing one, so names do not leak across tenants.
With no tokens configured authentication is off and every caller is an admin of tenant
`default` (a local development cluster).

Tokens come from `auth.tokens` and from `auth.tokens_file`, a TOML file of `[[tokens]]` tables
that is read again when it changes (checked at most once per `TOKENS_FILE_CHECK_INTERVAL_S`, on
the request path) or on `reload` (SIGHUP; see `node.api.app`), so tokens are added, rotated and
revoked without a restart. An invalid file stops the node at start (a `ConfigError`); later it is
refused with a logged error naming the file and the problem, and the previous tokens stay.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import msgspec
from aiohttp import web

from node.config import AuthConfig, ConfigError, TokenConfig
from node.config import _check_auth as check_auth
from node.files import CONFIG_BYTES_MAX, read_text_bounded
from raftstore.clock import Clock, RealClock
from xrcore.errors import Forbidden, Unauthenticated

__all__ = [
    "ROLE_PERMISSIONS",
    "ROUTE_RULES",
    "TOKENS_FILE_CHECK_INTERVAL_S",
    "Access",
    "Authenticator",
    "Permission",
    "Principal",
    "Rule",
    "TokensFileError",
    "load_tokens_file",
    "rule_for",
]

log = logging.getLogger("xr.auth")

# The tokens file is looked at (one stat) at most this often on the request path.
TOKENS_FILE_CHECK_INTERVAL_S = 1.0


class Permission(StrEnum):
    DATA = "data"
    READ_CLUSTER = "read_cluster"
    READ_MEMBERS = "read_members"
    # Every tenant's scheduling settings; without it a caller sees only its own tenant's.
    READ_TENANTS = "read_tenants"
    ADMIN = "admin"


ROLE_PERMISSIONS: dict[str, frozenset[Permission]] = {
    "tenant": frozenset({Permission.DATA, Permission.READ_CLUSTER}),
    "operator": frozenset(
        {
            Permission.DATA,
            Permission.READ_CLUSTER,
            Permission.READ_MEMBERS,
            Permission.READ_TENANTS,
        }
    ),
    "admin": frozenset(Permission),
}


class Access(StrEnum):
    """Routes that need no permission."""

    # No token, whatever the configuration: the API's description and the dashboard's files.
    PUBLIC = "public"
    # No token while `auth.open_health` is true (the default); any valid token otherwise.
    OPEN_HEALTH = "open_health"


Rule = Permission | Access

# (method, route) -> what a caller needs. Routes are aiohttp's canonical form, which is also the
# OpenAPI document's (`node.api.openapi.OPERATIONS`); HEAD follows GET.
ROUTE_RULES: dict[tuple[str, str], Rule] = {
    # Health and the API's description.
    ("GET", "/healthz"): Access.OPEN_HEALTH,
    ("GET", "/readyz"): Access.OPEN_HEALTH,
    ("GET", "/metrics"): Access.OPEN_HEALTH,
    ("GET", "/v1/openapi.json"): Access.PUBLIC,
    # The dashboard's page and files hold no data (`node.api.ui.STATIC_FILES`).
    ("GET", "/ui"): Access.PUBLIC,
    ("GET", "/ui/"): Access.PUBLIC,
    ("GET", "/ui/app.js"): Access.PUBLIC,
    ("GET", "/ui/style.css"): Access.PUBLIC,
    # The tenant's own objects.
    ("GET", "/v1/kv"): Permission.DATA,
    ("GET", "/v1/kv/{key}"): Permission.DATA,
    ("PUT", "/v1/kv/{key}"): Permission.DATA,
    ("DELETE", "/v1/kv/{key}"): Permission.DATA,
    ("POST", "/v1/sessions"): Permission.DATA,
    ("GET", "/v1/sessions/{session_id}"): Permission.DATA,
    ("POST", "/v1/sessions/{session_id}/keepalive"): Permission.DATA,
    ("DELETE", "/v1/sessions/{session_id}"): Permission.DATA,
    ("POST", "/v1/locks/{name}/acquire"): Permission.DATA,
    ("POST", "/v1/locks/{name}/release"): Permission.DATA,
    ("GET", "/v1/locks/{name}"): Permission.DATA,
    ("POST", "/v1/locks/{name}/validate"): Permission.DATA,
    ("POST", "/v1/jobs"): Permission.DATA,
    ("GET", "/v1/jobs"): Permission.DATA,
    ("GET", "/v1/jobs/{job_id}"): Permission.DATA,
    ("POST", "/v1/jobs/{job_id}/cancel"): Permission.DATA,
    ("GET", "/v1/jobs/{job_id}/events"): Permission.DATA,
    ("GET", "/v1/jobs/{job_id}/logs"): Permission.DATA,
    ("GET", "/v1/watch"): Permission.DATA,
    # The dashboard's data: the tenant's own objects besides regions and cluster status; every
    # role has both permissions, and the handler checks the second.
    ("GET", "/v1/ui/state"): Permission.DATA,
    ("GET", "/v1/ui/events"): Permission.DATA,
    # The cluster.
    ("GET", "/v1/tenants"): Permission.READ_CLUSTER,
    ("PUT", "/v1/tenants/{name}"): Permission.ADMIN,
    ("GET", "/v1/regions"): Permission.READ_CLUSTER,
    ("GET", "/v1/regions/{name}"): Permission.READ_CLUSTER,
    ("GET", "/v1/cluster/status"): Permission.READ_CLUSTER,
    ("GET", "/v1/cluster/members"): Permission.READ_MEMBERS,
    ("POST", "/v1/cluster/transfer-leader"): Permission.ADMIN,
    # Backups hold every tenant's data (`node.api.snapshot`).
    ("GET", "/v1/snapshot"): Permission.ADMIN,
    ("GET", "/v1/snapshot/hash"): Permission.ADMIN,
    # Test runs only (`node.api.testnet`, never in the document).
    ("PUT", "/v1/test/drops"): Permission.ADMIN,
}


def rule_for(request: web.Request) -> Rule | None:
    """The request's route's rule; None when no route matched (the caller then needs a valid
    token and gets the router's 404 or 405); `admin` for a route nobody wrote a rule for."""
    resource = request.match_info.route.resource
    if resource is None:
        return None
    method = "GET" if request.method == "HEAD" else request.method
    return ROUTE_RULES.get((method, resource.canonical), Permission.ADMIN)


@dataclass(frozen=True)
class Principal:
    name: str
    role: str
    tenant: str

    def may(self, permission: Permission) -> bool:
        return permission in ROLE_PERMISSIONS[self.role]

    def require(self, permission: Permission) -> None:
        if not self.may(permission):
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


# The tokens file.


class TokensFileError(Exception):
    """The tokens file cannot be used; the message says why (never a digest or a token)."""


class _TokensFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tokens: list[TokenConfig] = []


def load_tokens_file(path: Path) -> list[TokenConfig]:
    """The file's tokens, checked by the same rules as `auth.tokens` (`node.config`'s own check,
    so the two cannot drift): unique names and digests, 64 hex digits, a known role, a tenant."""
    try:
        text = read_text_bounded(path, CONFIG_BYTES_MAX)
    except (OSError, UnicodeDecodeError) as error:
        raise TokensFileError(f"cannot read it: {error}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise TokensFileError(f"it is not valid TOML: {error}") from None
    try:
        tokens = msgspec.convert(document, _TokensFile).tokens
    except msgspec.ValidationError as error:
        raise TokensFileError(f"it does not hold [[tokens]] tables as expected: {error}") from None
    try:
        check_auth(AuthConfig(tokens=tokens))
    except ConfigError as error:
        # The check names the setting; here the same position is the file's `tokens` array.
        raise TokensFileError(str(error).replace("setting auth.tokens.", "tokens.", 1)) from None
    for position, token in enumerate(tokens):
        if not token.name:
            raise TokensFileError(f"tokens.{position}.name: must not be empty")
    return tokens


def _table(
    configured: Iterable[TokenConfig], from_file: Iterable[TokenConfig]
) -> dict[str, Principal]:
    """Principals by token digest. Names and tokens must be unique across `auth.tokens` and the
    file: one name is one identity in the audit log, and one token must not mean two callers."""
    by_digest: dict[str, Principal] = {}
    names: set[str] = set()
    for source, tokens in (("auth.tokens", configured), ("the tokens file", from_file)):
        for token in tokens:
            if token.name in names:
                raise TokensFileError(
                    f"token name {token.name!r} in {source} is used twice "
                    "(names are unique across auth.tokens and the tokens file)"
                )
            names.add(token.name)
            digest = token.sha256.lower()
            if digest in by_digest:
                raise TokensFileError(
                    f"token {token.name!r} in {source} has the same digest as token "
                    f"{by_digest[digest].name!r}"
                )
            by_digest[digest] = Principal(name=token.name, role=token.role, tenant=token.tenant)
    return by_digest


_Signature = tuple[int, int, int, int]


def _signature(path: Path) -> _Signature | None:
    """What tells a changed file: a new inode (a file renamed over the old one), a new size or a
    new modification or change time. None when it cannot be read."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


class Authenticator:
    def __init__(self, config: AuthConfig, *, clock: Clock | None = None) -> None:
        self.open_health = config.open_health
        self.tokens_file = Path(config.tokens_file) if config.tokens_file else None
        # A tokens file turns authentication on even while it is empty: emptying it revokes
        # every token in it, and must not open the cluster to anyone.
        self.enabled = bool(config.tokens) or self.tokens_file is not None
        self._configured = tuple(config.tokens)
        self._clock = clock or RealClock()
        self._checked_s = -math.inf
        self._seen: _Signature | None = None
        try:
            self._by_digest = _table(self._configured, ())
            if self.tokens_file is not None:
                self._seen = _signature(self.tokens_file)
                self._by_digest = _table(self._configured, load_tokens_file(self.tokens_file))
        except TokensFileError as error:
            raise ConfigError(
                f"setting auth.tokens_file: {config.tokens_file!r}: {error}"
            ) from None

    @property
    def token_names(self) -> list[str]:
        return sorted(principal.name for principal in self._by_digest.values())

    def _identities(self) -> dict[str, tuple[str, Principal]]:
        return {
            principal.name: (digest, principal) for digest, principal in self._by_digest.items()
        }

    def authenticate(self, request: web.Request) -> Principal:
        if not self.enabled:
            return ANONYMOUS_ADMIN
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("this request needs an Authorization: Bearer <token> header")
        self._check_file()
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        principal = self._by_digest.get(digest)
        if principal is None:
            raise Unauthenticated("the bearer token is not valid")
        return principal

    def _check_file(self) -> None:
        if self.tokens_file is None:
            return
        now_s = self._clock.monotonic_s()
        if now_s - self._checked_s < TOKENS_FILE_CHECK_INTERVAL_S:
            return
        self._checked_s = now_s
        if _signature(self.tokens_file) != self._seen:
            self.reload()

    def reload(self) -> bool:
        """Reads the tokens file again (SIGHUP, or a change seen on the request path). On an
        invalid file logs an error naming it and the problem, keeps the previous tokens and
        returns False."""
        if self.tokens_file is None:
            return False
        # Remembered before reading, so a file changed while it is read is read again, and a
        # bad file is reported once, not at every check.
        self._seen = _signature(self.tokens_file)
        before = self._identities()
        try:
            by_digest = _table(self._configured, load_tokens_file(self.tokens_file))
        except TokensFileError as error:
            log.error(
                "auth.tokens_file %s is refused: %s; the previous %d tokens stay in use",
                self.tokens_file,
                error,
                len(before),
            )
            return False
        self._by_digest = by_digest
        after = self._identities()
        changed = [name for name in before.keys() & after.keys() if before[name] != after[name]]
        log.info(
            "auth.tokens_file %s loaded: %d tokens in use; added: %s; changed: %s; removed: %s",
            self.tokens_file,
            len(after),
            ", ".join(sorted(after.keys() - before.keys())) or "none",
            ", ".join(sorted(changed)) or "none",
            ", ".join(sorted(before.keys() - after.keys())) or "none",
        )
        return True
