"""Answers that are not the xr API's: something else at an endpoint (a web server, a proxy's page),
an endpoint URL that misses the API, and documents without the fields a method reads.

Every such answer ends in a typed xrcore error or in failover, never in a KeyError or TypeError
from the client's own code, and a missing route is never taken for a missing key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tests.client.fake_node import FakeNodes, Reply, error
from xrcore.client import AsyncClient, Client
from xrcore.errors import ClusterUnavailable, NotFound, Timeout, XrError

pytestmark = pytest.mark.integration

HTML = "<html><body>It works!</body></html>"

_KEY = {
    "key": "k",
    "value": "v",
    "value_base64": "dg==",
    "create_revision": 1,
    "mod_revision": 1,
    "version": 1,
    "revision": 1,
}
_JOB = {
    "job_id": "job-1",
    "name": "j",
    "tenant": "default",
    "state": "pending",
    "priority": 0,
    "submitted_at_ms": 1,
    "array_size": 1,
    "tasks": [],
}
_SESSION = {"session_id": "s1", "ttl_ms": 5000, "remaining_ms": 5000, "granted_at_ms": 0}
_REGION = {"name": "r0", "http_address": "127.0.0.1:1", "raft_address": "127.0.0.1:2"}


# Each method of the client that reads an answer, with the route it calls and a good answer.
Call = Callable[[AsyncClient], Coroutine[Any, Any, Any]]
CALLS: dict[str, tuple[str, Call, Any]] = {
    "kv.get": ("GET /v1/kv/k", lambda client: client.kv.get("k"), _KEY),
    "kv.put": (
        "PUT /v1/kv/k",
        lambda client: client.kv.put("k", "v"),
        {"revision": 1, "previous_mod_revision": 0, "version": 1},
    ),
    "kv.delete": (
        "DELETE /v1/kv/k",
        lambda client: client.kv.delete("k"),
        {"deleted": 1, "revision": 2},
    ),
    "kv.range": (
        "GET /v1/kv",
        lambda client: client.kv.range("k"),
        {"items": [_KEY], "next": None, "revision": 1},
    ),
    "kv.watch": (
        "GET /v1/watch",
        lambda client: anext(client.kv.watch("k", from_revision=1)),
        {"events": [{**_KEY, "kind": "put"}], "next_revision": 2},
    ),
    "sessions.grant": ("POST /v1/sessions", lambda client: client.sessions.grant(5), _SESSION),
    "sessions.get": ("GET /v1/sessions/s1", lambda client: client.sessions.get("s1"), _SESSION),
    "locks.acquire": (
        "POST /v1/locks/l/acquire",
        lambda client: client.locks.acquire("l", "s1"),
        {"name": "l", "granted": True, "token": 1, "holder": "s1"},
    ),
    "locks.release": (
        "POST /v1/locks/l/release",
        lambda client: client.locks.release("l", "s1"),
        {"name": "l", "released": True},
    ),
    "jobs.submit": (
        "POST /v1/jobs",
        lambda client: client.jobs.submit("j", workload="w"),
        {"job_id": "job-1", "tasks": 1},
    ),
    "jobs.get": ("GET /v1/jobs/job-1", lambda client: client.jobs.get("job-1"), _JOB),
    "jobs.cancel": (
        "POST /v1/jobs/job-1/cancel",
        lambda client: client.jobs.cancel("job-1"),
        {"job_id": "job-1", "cancelled_tasks": 1},
    ),
    "jobs.events": (
        "GET /v1/jobs/job-1/events",
        lambda client: client.jobs.events("job-1"),
        {"job_id": "job-1", "events": [{"at_ms": 1, "kind": "submitted"}]},
    ),
    "regions.list": ("GET /v1/regions", lambda client: client.regions.list(), {"items": [_REGION]}),
    "regions.get": ("GET /v1/regions/r0", lambda client: client.regions.get("r0"), _REGION),
    "tenants.list": ("GET /v1/tenants", lambda client: client.tenants.list(), {"items": []}),
    "tenants.set": (
        "PUT /v1/tenants/t",
        lambda client: client.tenants.set("t"),
        {"name": "t", "created": True},
    ),
    "cluster.members": (
        "GET /v1/cluster/members",
        lambda client: client.cluster.members(),
        {"items": []},
    ),
    "cluster.transfer_leader": (
        "POST /v1/cluster/transfer-leader",
        lambda client: client.cluster.transfer_leader("r0"),
        {"leader_region": "r0", "transferred": True},
    ),
}


def _call(url: str | list[str], call: Call, *, timeout_s: float = 5.0) -> Any:
    async def scenario() -> Any:
        async with AsyncClient(url, timeout_s=timeout_s, retry_s=0) as client:
            return await call(client)

    return asyncio.run(scenario())


@pytest.mark.parametrize("method", list(CALLS))
def test_a_2xx_that_is_not_json__is_not_an_xr_node__the_next_endpoint_answers(
    fakes: FakeNodes, method: str
) -> None:
    route, call, good = CALLS[method]
    stranger = fakes.add({"*": [Reply(text=HTML)]})
    node = fakes.add({route: [Reply(document=good)]})
    assert _call([stranger.url, node.url], call) is not None
    assert len(stranger.seen) == 1 and len(node.seen) == 1


@pytest.mark.parametrize(
    "answer",
    [Reply(text=HTML), Reply(document=None), Reply(document=[1, 2]), Reply(document="ok")],
    ids=["html", "empty", "array", "string"],
)
def test_only_endpoints_that_are_not_xr_nodes__a_read_is_unavailable_a_write_uncertain(
    fakes: FakeNodes, answer: Reply
) -> None:
    stranger = fakes.add({"*": [answer]})
    with pytest.raises(ClusterUnavailable, match="not a JSON object") as read:
        _call(stranger.url, CALLS["kv.get"][1], timeout_s=1.0)
    assert read.value.definite
    # (The last try, cut short by the deadline, may time out: what the tries before it met is
    # what the error reports.)
    with pytest.raises(Timeout, match="not a JSON object") as write:
        _call(stranger.url, CALLS["kv.put"][1], timeout_s=1.0)
    assert not write.value.definite


@pytest.mark.parametrize("method", list(CALLS))
def test_a_json_object_without_the_fields_read__raises_a_typed_error(
    fakes: FakeNodes, method: str
) -> None:
    route, call, _ = CALLS[method]
    node = fakes.add({route: [Reply(document={"ok": True})]})
    with pytest.raises(XrError, match="the server's answer") as raised:
        _call(node.url, call)
    # The class `convert` raises for an answer of the wrong shape: indefinite, since the request
    # may have taken effect.
    assert type(raised.value) is XrError and not raised.value.definite


def test_fields_of_the_wrong_type__raise_a_typed_error(fakes: FakeNodes) -> None:
    node = fakes.add(
        {
            "GET /v1/kv/k": [Reply(document={**_KEY, "value_base64": "not base64!"})],
            "POST /v1/jobs": [Reply(document={"job_id": 7})],
            "GET /v1/regions": [Reply(document={"items": "r0"})],
        }
    )
    for method in ("kv.get", "jobs.submit", "regions.list"):
        with pytest.raises(XrError, match="the server's answer"):
            _call(node.url, CALLS[method][1])


# Not found: a missing key is None; a missing route is an error that names the path.

_GETS = ("kv.get", "sessions.get", "jobs.get", "regions.get")


@pytest.mark.parametrize("method", _GETS)
def test_the_nodes_own_not_found__is_none(fakes: FakeNodes, method: str) -> None:
    route = CALLS[method][0]
    node = fakes.add({route: [error("not_found", 404, definite=True)]})
    assert _call(node.url, CALLS[method][1]) is None


@pytest.mark.parametrize("method", _GETS)
def test_a_404_without_an_xr_error__is_an_error_naming_the_path_not_none(
    fakes: FakeNodes, method: str
) -> None:
    route, call, _ = CALLS[method]
    # What aiohttp answers for a path it has no route for.
    node = fakes.add({"*": [Reply(status=404, text="404: Not Found")]})
    with pytest.raises(XrError, match="HTTP 404 without an xr error") as raised:
        _call(node.url, call)
    assert route.partition(" ")[2] in raised.value.message
    assert not isinstance(raised.value, NotFound)


@pytest.mark.parametrize("method", _GETS)
def test_a_nodes_no_route_answer__is_an_error_naming_the_path_not_none(
    fakes: FakeNodes, method: str
) -> None:
    route, call, _ = CALLS[method]
    path = route.partition(" ")[2]
    # What a node answers when the endpoint URL has a path of its own (`http://node:8700/xr`).
    no_route = {
        "error": {
            "code": "not_found",
            "message": f"no route /xr{path}; the API is described at /v1/openapi.json",
            "definite": True,
        }
    }
    node = fakes.add({f"GET /xr{path}": [Reply(status=404, document=no_route)]})
    with pytest.raises(XrError, match=f"has no such route \\(no route /xr{path};") as raised:
        _call(f"{node.url}/xr", call)
    assert not isinstance(raised.value, NotFound)


def test_sync_client__a_2xx_that_is_not_json__fails_over(fakes: FakeNodes) -> None:
    stranger = fakes.add({"*": [Reply(text=HTML)]})
    node = fakes.add({"GET /v1/kv/k": [Reply(document=_KEY)]})
    with Client([stranger.url, node.url], timeout_s=5) as client:
        found = client.kv.get("k")
        assert found is not None and found.value == b"v"
        # The client stays on the endpoint that answered.
        assert client.kv.get("k") is not None
    assert len(stranger.seen) == 1
