"""Regions and the cluster: status, members, leadership transfer.

Leadership transfer must be asked of the leader; a follower forwards the request to the leader's
HTTP address (known from the leader's region registration) with the caller's credentials.
With TLS on (`tls.cert_file`), forwarded requests go over https, verify the other node against
`tls.ca_file` and present this node's certificate (`node.tls.client_context`).
"""

from __future__ import annotations

import json
import ssl
from importlib.metadata import version as package_version
from typing import Any

import aiohttp
from aiohttp import web

from node.api.app import principal, read, services
from node.api.auth import Permission
from node.api.wire import field, read_body, reject_unknown, respond
from node.config import NodeConfig
from node.tls import client_context
from xrcore import regions
from xrcore.client._transport import read_answer
from xrcore.codec import ENVELOPE_VERSION
from xrcore.errors import ClusterUnavailable, NotFound, error_from_code

__all__ = ["FORWARD_SSL_CONTEXT", "forward_target", "routes"]

routes = web.RouteTableDef()
_FORWARD_TIMEOUT_S = 15.0
VERSION = package_version("xr")
# The client context for requests to other nodes, loaded once at start by the daemon; an app
# without it (built in a test) loads one from the configuration per forwarded request.
FORWARD_SSL_CONTEXT = web.AppKey("forward_ssl_context", ssl.SSLContext)


@routes.get("/v1/regions")
async def list_regions(request: web.Request) -> web.Response:
    principal(request, Permission.READ_CLUSTER)
    result = await read(request, regions.list_)
    return respond(request, {"items": result.value, "stale": result.stale})


@routes.get("/v1/regions/{name}")
async def get_region(request: web.Request) -> web.Response:
    principal(request, Permission.READ_CLUSTER)
    name = request.match_info["name"]
    result = await read(request, lambda machine: regions.get(machine, name))
    return respond(request, {**result.value, "stale": result.stale})


def _regions_by_raft_address(request: web.Request) -> dict[str, dict[str, Any]]:
    listed = services(request).store.replica.read(regions.list_)
    return {region["raft_address"]: region for region in listed}


def _status(request: web.Request) -> dict[str, Any]:
    node = services(request)
    status = node.store.status()
    by_address = _regions_by_raft_address(request)
    leader = status["leader"]
    return {
        "region": node.config.region.name,
        "raft_address": status["self"],
        "state": status["state"],
        "leader": leader,
        "leader_region": None if leader is None else by_address.get(leader, {}).get("name"),
        "has_quorum": status["has_quorum"],
        "term": status["term"],
        "commit_index": status["commit_index"],
        "applied_index": status["applied_index"],
        "machine_index": status["machine_index"],
        "proposals_in_flight": status["proposals_in_flight"],
        # The release this node runs, the newest log entries it can apply, and why it stopped
        # applying the log (an entry of a newer release) or None.
        "version": VERSION,
        "envelope_version": ENVELOPE_VERSION,
        "apply_halted": status["apply_halted"],
        # Deliberate bugs switched on for a test run (`raftstore.faults`); empty otherwise.
        "test_faults": node.store.faults.names(),
    }


@routes.get("/v1/cluster/status")
async def cluster_status(request: web.Request) -> web.Response:
    principal(request, Permission.READ_CLUSTER)
    return respond(request, _status(request))


@routes.get("/v1/cluster/members")
async def members(request: web.Request) -> web.Response:
    principal(request, Permission.READ_MEMBERS)
    node = services(request)
    status = node.store.status()
    by_address = _regions_by_raft_address(request)
    items = [
        {
            "raft_address": status["self"],
            "region": node.config.region.name,
            "http_address": node.config.http_advertise_address,
            "self": True,
            "leader": status["leader"] == status["self"],
            "connected": True,
            "match_index": None,
            "last_contact_s": None,
        }
    ]
    for member in status["members"]:
        region = by_address.get(member["address"], {})
        items.append(
            {
                "raft_address": member["address"],
                "region": region.get("name"),
                "http_address": region.get("http_address"),
                "self": False,
                "leader": status["leader"] == member["address"],
                "connected": member["connected"],
                "match_index": member["match_index"],
                "last_contact_s": member["last_contact_s"],
            }
        )
    return respond(request, {"items": items, "term": status["term"], "leader": status["leader"]})


@routes.post("/v1/cluster/transfer-leader")
async def transfer_leader(request: web.Request) -> web.Response:
    principal(request, Permission.ADMIN)
    body = await read_body(request)
    reject_unknown(body, {"region"})
    target = field(body, "region", str)
    node = services(request)
    by_name = {region["name"]: region for region in node.store.replica.read(regions.list_)}
    if target not in by_name:
        raise NotFound(f"region {target!r} is not registered")
    address = by_name[target]["raft_address"]
    if node.store.is_leader:
        if address == node.config.raft.self_address:
            return respond(request, {"leader_region": target, "transferred": False})
        await node.store.transfer_leadership(address)
        return respond(request, {"leader_region": target, "transferred": True})
    return await _forward_to_leader(request, body)


async def _forward_to_leader(request: web.Request, body: dict[str, Any]) -> web.Response:
    leader = services(request).store.status()["leader"]
    region = _regions_by_raft_address(request).get(leader or "")
    if region is None:
        raise ClusterUnavailable("no leader is known; retry when the cluster has elected one")
    return await _forward(request, region["name"], region["http_address"], body=body)


async def forward_to_region(request: web.Request, region_name: str) -> web.Response:
    """Answers a GET with what the named region's node answers (logs live on their region)."""
    region = services(request).store.replica.read(lambda machine: machine.regions.get(region_name))
    if region is None:
        raise NotFound(f"region {region_name!r} is not registered")
    return await _forward(request, region_name, region.http_address)


# The longest answer read from another node: the largest forwarded answer is a job log's tail of
# at most 1 MiB (`node.api.jobs`), up to 6 MiB once escaped as JSON.
_FORWARD_ANSWER_BYTES_MAX = 16 << 20


async def _forward(
    request: web.Request, region_name: str, http_address: str, *, body: Any = None
) -> web.Response:
    """Sends the request (POST with `body`, or GET) to another node with the caller's
    credentials, once: a request that was already forwarded is not forwarded again."""
    if request.headers.get("Xr-Forwarded"):
        raise ClusterUnavailable("the request was already forwarded once; retry")
    headers = {"Xr-Forwarded": "1"}
    if "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]
    base_url, ssl_context = forward_target(
        services(request).config, http_address, request.app.get(FORWARD_SSL_CONTEXT)
    )
    url = f"{base_url}{request.path_qs}"
    method = "GET" if body is None else "POST"
    try:
        async with (
            aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=_FORWARD_TIMEOUT_S)
            ) as session,
            session.request(
                method, url, json=body, headers=headers, ssl=ssl_context or True
            ) as answer,
        ):
            document = json.loads(await read_answer(answer, _FORWARD_ANSWER_BYTES_MAX))
            status = answer.status
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as error:
        raise ClusterUnavailable(f"region {region_name} could not be reached: {error}") from None
    if status >= 400 and isinstance(document, dict) and "error" in document:
        info = document["error"]
        raise error_from_code(str(info.get("code")), str(info.get("message")))
    if not isinstance(document, dict):
        raise ClusterUnavailable(f"region {region_name} answered with something not an object")
    return respond(request, document, status=status)


def forward_target(
    config: NodeConfig, http_address: str, loaded: ssl.SSLContext | None = None
) -> tuple[str, ssl.SSLContext | None]:
    """The base URL of another node's API and the TLS context to reach it with (None: plain
    http). Every node of a cluster has the same TLS settings, so this node's settings decide."""
    if config.tls.cert_file is None:
        return f"http://{http_address}", None
    return f"https://{http_address}", loaded or client_context(config.tls)
