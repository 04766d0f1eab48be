"""Health, readiness and metrics.

`/healthz` answers 200 while the process serves requests. `/readyz` answers 200 only when this
node can serve reads and writes: it knows a leader that has a quorum and a read barrier commits
within a second; otherwise 503 with the reason, so a load balancer takes it out of rotation.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from node.api.app import services
from node.api.wire import respond
from xrcore.errors import XrError

__all__ = ["routes"]

routes = web.RouteTableDef()
_READY_BARRIER_S = 1.0


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return respond(request, {"status": "ok", "region": services(request).config.region.name})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    node = services(request)
    store = node.store
    status = store.status()
    reason = None
    if node.stopping.is_set():
        reason = "the node is stopping"
    elif status["apply_halted"] is not None:
        reason = f"this node must be upgraded: {status['apply_halted']}"
    elif status["leader"] is None:
        reason = "no leader is known"
    else:
        try:
            await store.read(lambda machine: machine.index, timeout_s=_READY_BARRIER_S)
        except XrError as error:
            reason = f"a read barrier did not commit: {error.message}"
    document = {
        "ready": reason is None,
        "region": node.config.region.name,
        "leader": status["leader"],
        "term": status["term"],
        "reason": reason,
    }
    return respond(request, document, status=200 if reason is None else 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(services(request).metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
