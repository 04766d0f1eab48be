"""`PUT /v1/test/drops`: the peers a node started with `XR_TEST_PARTITIONS=1` drops Raft messages
to and from (`raftstore.testnet`). Registered only on such a node, in a test run; admins only."""

from __future__ import annotations

from aiohttp import web

from node.api.app import principal, services
from node.api.auth import Permission
from node.api.wire import field, read_body, reject_unknown, respond
from xrcore.errors import InvalidArgument

__all__ = ["routes"]

routes = web.RouteTableDef()


@routes.put("/v1/test/drops")
async def set_drops(request: web.Request) -> web.Response:
    principal(request, Permission.ADMIN)
    body = await read_body(request)
    reject_unknown(body, {"peers"})
    peers = field(body, "peers", list)
    if not all(isinstance(peer, str) for peer in peers):
        raise InvalidArgument("peers must be a list of Raft addresses (host:port)")
    drops = services(request).store.drops
    assert drops is not None
    drops.set(peers)
    return respond(request, {"peers": drops.peers})
