"""Tenants' settings: fair-share weight, GPU and task quotas, price and carbon weights, and
shares of the replicated tables (keys, sessions, client records, jobs, unfinished tasks).

Anyone who may read the cluster may list them, but a caller without `read_tenants` (the `tenant`
role) sees only its own tenant's record: the names of the other tenants are theirs. Only admins
set them. A tenant never set has the defaults, so setting tenants is optional.
"""

from __future__ import annotations

from aiohttp import web

from node.api.app import principal, read, write
from node.api.auth import Permission
from node.api.wire import field, read_body, reject_unknown, respond
from xrcore import tenants
from xrcore.commands import TABLE_QUOTAS, TenantSet
from xrcore.errors import InvalidArgument

__all__ = ["routes"]

routes = web.RouteTableDef()

_FIELDS = frozenset(
    {"weight", "gpus_max", "tasks_max", "cost_weight", "carbon_weight", *TABLE_QUOTAS}
)


@routes.get("/v1/tenants")
async def list_tenants(request: web.Request) -> web.Response:
    caller = principal(request, Permission.READ_CLUSTER)
    result = await read(request, tenants.list_)
    items = result.value["items"]
    if not caller.may(Permission.READ_TENANTS):
        items = [item for item in items if item["name"] == caller.tenant]
    return respond(request, {**result.value, "items": items, "stale": result.stale})


@routes.put("/v1/tenants/{name}")
async def set_tenant(request: web.Request) -> web.Response:
    principal(request, Permission.ADMIN)
    body = await read_body(request)
    reject_unknown(body, _FIELDS)
    name = request.match_info["name"]
    if "/" in name:
        # Accepted by the state machine (earlier entries may hold one), but no token can belong
        # to such a tenant, so its settings and quotas would never apply.
        raise InvalidArgument(f"a tenant name has no '/' (no token can name one), got {name!r}")
    command = TenantSet(
        name=name,
        weight=field(body, "weight", float, default=1.0),
        gpus_max=field(body, "gpus_max", int, default=None, nullable=True),
        tasks_max=field(body, "tasks_max", int, default=None, nullable=True),
        cost_weight=field(body, "cost_weight", float, default=1.0),
        carbon_weight=field(body, "carbon_weight", float, default=1.0),
        **{name: field(body, name, int, default=None, nullable=True) for name in TABLE_QUOTAS},
    )
    return respond(request, await write(request, command))
