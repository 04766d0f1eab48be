"""Sessions: grant, keep alive, revoke and inspect. A session's owner is its tenant."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from node.api.app import principal, read, services, write
from node.api.auth import Principal
from node.api.wire import field, read_body, reject_unknown, respond
from xrcore import sessions
from xrcore.commands import SessionGrant, SessionKeepAlive, SessionRevoke
from xrcore.errors import NotFound

__all__ = ["own_session", "routes", "session_view"]

routes = web.RouteTableDef()


def session_view(caller: Principal, view: dict[str, Any]) -> dict[str, Any]:
    shown = dict(view)
    shown["locks"] = [caller.unscoped(name) for name in view["locks"]]
    shown["keys"] = [caller.unscoped(key) for key in view["keys"]]
    shown.pop("owner", None)
    shown["tenant"] = view["owner"]
    return shown


def _missing(session_id: str) -> NotFound:
    return NotFound(f"session {session_id!r} does not exist (it may have expired)")


async def own_session(request: web.Request, caller: Principal, session_id: str) -> None:
    """404 unless the session exists and belongs to the caller's tenant. A session's owner never
    changes, so a local read that finds it is final; only a miss needs the read barrier."""
    store = services(request).store

    def owner(machine: Any) -> str | None:
        session = machine.sessions.get(session_id)
        return None if session is None else str(session.owner)

    found = store.replica.read(owner)
    if found is None:
        found = (await store.read(owner)).value
    if found != caller.tenant:
        raise _missing(session_id)


@routes.post("/v1/sessions")
async def grant(request: web.Request) -> web.Response:
    caller = principal(request)
    body = await read_body(request)
    reject_unknown(body, {"ttl_ms"})
    result = await write(
        request, SessionGrant(ttl_ms=field(body, "ttl_ms", int), owner=caller.tenant)
    )
    return respond(request, session_view(caller, result), status=201)


@routes.get("/v1/sessions/{session_id}")
async def get(request: web.Request) -> web.Response:
    caller = principal(request)
    session_id = request.match_info["session_id"]
    result = await read(request, lambda machine: sessions.get(machine, session_id))
    if result.value["owner"] != caller.tenant:
        raise _missing(session_id)
    return respond(request, {**session_view(caller, result.value), "stale": result.stale})


@routes.post("/v1/sessions/{session_id}/keepalive")
async def keepalive(request: web.Request) -> web.Response:
    caller = principal(request)
    session_id = request.match_info["session_id"]
    await own_session(request, caller, session_id)
    result = await write(request, SessionKeepAlive(session_id=session_id))
    return respond(request, session_view(caller, result))


@routes.delete("/v1/sessions/{session_id}")
async def revoke(request: web.Request) -> web.Response:
    caller = principal(request)
    session_id = request.match_info["session_id"]
    await own_session(request, caller, session_id)
    return respond(request, await write(request, SessionRevoke(session_id=session_id)))
