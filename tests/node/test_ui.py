"""The web dashboard's routes through the app factory: the page is open and holds no data, its data
routes authenticate and show each tenant only its own jobs, keys, locks and sessions, the
snapshot matches its documented schema, and the event stream sends a new snapshot after a write.
The page itself is driven in a browser by `test_ui_browser.py`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import msgspec
import pytest
from aiohttp import ClientResponse

from node.api.app import create_app
from node.api.openapi import document
from node.api.ui import STATIC_FILES, Shared, snapshot_cache
from node.config import load_config
from tests.node.conftest import ApiNode, auth_headers, eventually
from xrcore.commands import TaskAssign

pytestmark = pytest.mark.integration

_STREAM_TIMEOUT_S = 20.0


def _state(api: ApiNode, token: str = "alpha") -> dict[str, Any]:
    state: dict[str, Any] = api.ok("GET", "/v1/ui/state", token=token)
    return state


def test_page_and_files__are_served_without_a_token(api: ApiNode) -> None:
    for path, (_, content_type) in STATIC_FILES.items():
        answer = api.request("GET", path, token=None)
        assert answer.status == 200, path
        assert answer.headers["Content-Type"] == content_type
        assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"]
    # A link or bookmark with a trailing slash got a 401 (session 31's dashboard pass).
    assert api.request("GET", "/ui/", token=None).body == api.request("GET", "/ui", token=None).body
    page = api.request("GET", "/ui", token=None).body.decode()
    # The node tells the page to ask for a token first; the page holds nothing else of the node.
    assert '<meta name="xr-auth" content="required">' in page


def test_page__with_authentication_off__reads_without_asking(api: ApiNode, tmp_path: Path) -> None:
    config = load_config(
        environ={},
        overrides={
            "region.name": "r0",
            "raft.address": api.config.raft.self_address,
            "data_dir": str(tmp_path),
        },
    )
    # A second application without tokens on the shared node's store.
    client = api.run(api.serve(create_app(config, store=api.store)))
    page = api.request("GET", "/ui", token=None, client=client).body.decode()
    assert '<meta name="xr-auth" content="off">' in page
    state = api.ok("GET", "/v1/ui/state", token=None, client=client)
    assert state["principal"] == {"name": "anonymous", "role": "admin", "tenant": "default"}


def test_data_routes__without_a_token__are_401(api: ApiNode) -> None:
    for path in ("/v1/ui/state", "/v1/ui/events"):
        refused = api.request("GET", path, token=None)
        assert (refused.status, refused.error_code) == (401, "auth.unauthenticated"), path


def test_state__matches_its_schema_and_shows_regions_jobs_locks_sessions_and_keys(
    api: ApiNode,
) -> None:
    region = api.register_region()
    job_id = api.ok("POST", "/v1/jobs", json={"name": "ui-shape", "workload": "gemm"})["job_id"]
    api.propose(TaskAssign(job_id=job_id, task_index=0, region=region))
    session_id = api.session()
    api.ok("POST", "/v1/locks/ui-shape-lock/acquire", json={"session_id": session_id})
    api.ok("PUT", "/v1/kv/ui-shape-key", json={"value": "x"})

    state = _state(api)

    described = document()
    jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/UiState", "components": described["components"]}
    ).validate(state)
    assert state["principal"] == {"name": "alpha", "role": "tenant", "tenant": "alpha"}
    assert state["node"]["state"] == "leader"
    assert state["node"]["leader_region"] == region
    shown_region = next(item for item in state["regions"] if item["name"] == region)
    assert shown_region["load"]["assigned"] >= 1
    job = next(item for item in state["jobs"] if item["job_id"] == job_id)
    assert (job["state"], job["regions"], job["workload"]) == ("pending", [region], "gemm")
    assert job["tasks"][0]["state"] == "assigned"
    # Newest first.
    assert state["jobs"][0]["job_id"] == job_id
    lock = next(item for item in state["locks"] if item["name"] == "ui-shape-lock")
    assert lock["holder"] == session_id
    assert lock["token"] > 0
    session = next(item for item in state["sessions"] if item["session_id"] == session_id)
    assert session["locks"] == ["ui-shape-lock"]
    assert state["key_count"] >= 1
    assert state["stale"] is False


def test_state__shows_a_tenant_none_of_another_tenants_objects(api: ApiNode) -> None:
    job_id = api.ok("POST", "/v1/jobs", json={"name": "ui-private", "workload": "gemm"})["job_id"]
    session_id = api.session()
    api.ok("POST", "/v1/locks/ui-private-lock/acquire", json={"session_id": session_id})
    api.ok("PUT", "/v1/kv/ui-private-key", json={"value": "alpha's"})
    keys_before = _state(api, "beta")["key_count"]

    beta = _state(api, "beta")
    alpha = _state(api, "alpha")

    assert beta["principal"]["tenant"] == "beta"
    assert job_id not in {job["job_id"] for job in beta["jobs"]}
    assert session_id not in {session["session_id"] for session in beta["sessions"]}
    assert "ui-private-lock" not in {lock["name"] for lock in beta["locks"]}
    assert beta["key_count"] == keys_before
    encoded = msgspec.json.encode(beta)
    for secret in (job_id.encode(), b"ui-private", session_id.encode()):
        assert secret not in encoded
    # Alpha sees its own, and the cluster-wide parts are the same for both.
    assert job_id in {job["job_id"] for job in alpha["jobs"]}
    assert [region["name"] for region in alpha["regions"]] == [
        region["name"] for region in beta["regions"]
    ]
    api.ok("PUT", "/v1/kv/ui-beta-key", json={"value": "beta's"}, token="beta")
    assert _state(api, "beta")["key_count"] == keys_before + 1


async def _next_state(stream: ClientResponse, buffer: bytearray) -> dict[str, Any]:
    """The next `state` event of a dashboard stream."""
    while True:
        end = buffer.find(b"\n\n")
        if end >= 0:
            block = bytes(buffer[:end]).decode()
            del buffer[: end + 2]
            lines = block.split("\n")
            if "event: state" in lines:
                data = next(line for line in lines if line.startswith("data: "))
                state: dict[str, Any] = msgspec.json.decode(data[len("data: ") :])
                return state
            continue
        chunk = await stream.content.readany()
        assert chunk, "the stream ended"
        buffer.extend(chunk)


def test_events__send_a_snapshot_at_once_and_another_after_a_write(api: ApiNode) -> None:
    headers = {**auth_headers("alpha"), "Accept": "text/event-stream"}

    async def body() -> tuple[dict[str, Any], dict[str, Any], str]:
        async with api.client.get("/v1/ui/events", headers=headers) as stream:
            assert stream.status == 200
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            buffer = bytearray()
            first = await asyncio.wait_for(_next_state(stream, buffer), _STREAM_TIMEOUT_S)
            submitted = await api.call(
                "POST", "/v1/jobs", json={"name": "ui-live", "workload": "gemm"}
            )
            job_id: str = submitted.document["job_id"]
            while True:
                later = await asyncio.wait_for(_next_state(stream, buffer), _STREAM_TIMEOUT_S)
                if job_id in {job["job_id"] for job in later["jobs"]}:
                    break
        # The node notices the closed stream and frees its slot, though nothing changes.
        await eventually(lambda: api.services.streams == 0)
        return first, later, job_id

    first, later, job_id = api.run(body())
    assert first["principal"]["tenant"] == "alpha"
    assert first["stale"] is True
    assert later["index"] > first["index"]
    assert later["jobs"][0]["job_id"] == job_id


def test_events__beyond_the_stream_limit__are_429(api: ApiNode) -> None:
    services = api.services
    headers = {**auth_headers("alpha"), "Accept": "text/event-stream"}

    async def body() -> tuple[int, Any]:
        # Every stream slot taken, on the node's own loop (streams are counted there).
        await eventually(lambda: services.streams == 0)
        services.streams = services.config.http.streams_max
        try:
            async with api.client.get("/v1/ui/events", headers=headers) as answer:
                # Read the body only if refused: a stream would not end.
                return answer.status, None if answer.status == 200 else await answer.json()
        finally:
            services.streams = 0

    status, refused = api.run(body())
    assert (status, refused["error"]["code"]) == (429, "limit.capacity")


def test_state_and_events__of_one_tenant__share_one_snapshot_per_index(api: ApiNode) -> None:
    """Dashboards of one tenant (streams and polls) get one snapshot per index between them,
    not one each: the node's cost of a tenant's dashboards does not grow with their number."""
    cache = snapshot_cache(api.store)
    served: list[Shared] = []
    build = cache.shared

    def recording(*arguments: Any, **options: Any) -> Shared:
        shared = build(*arguments, **options)
        if options["tenant"] == "beta":
            served.append(shared)
        return shared

    headers = {**auth_headers("beta"), "Accept": "text/event-stream"}

    async def first_state() -> int:
        async with api.client.get("/v1/ui/events", headers=headers) as stream:
            assert stream.status == 200
            state = await asyncio.wait_for(_next_state(stream, bytearray()), _STREAM_TIMEOUT_S)
            index: int = state["index"]
            return index

    async def polled() -> int:
        answer = await api.call("GET", "/v1/ui/state?consistency=stale", token="beta")
        index: int = answer.document["index"]
        return index

    async def body() -> list[int]:
        await eventually(lambda: api.services.streams == 0)
        streams = [first_state() for _ in range(3)]
        polls = [polled() for _ in range(20)]
        indexes = list(await asyncio.gather(*streams, *polls))
        # The streams' handlers have ended: none builds after the count below.
        await eventually(lambda: api.services.streams == 0)
        return indexes

    builds_before = cache.builds["beta"]
    cache.shared = recording  # type: ignore[method-assign]
    try:
        indexes = api.run(body())
    finally:
        del cache.shared
    # Lease ticks move the index meanwhile: one snapshot for each index served, whoever asked.
    by_index = {
        shared.index: {id(item) for item in served if item.index == shared.index}
        for shared in served
    }
    assert len(served) >= len(indexes) == 23
    assert all(len(built) == 1 for built in by_index.values()), by_index
    assert cache.builds["beta"] - builds_before == len(by_index) < len(indexes)


def test_answers__say_nosniff_and_no_store__the_page_keeps_its_own_headers(api: ApiNode) -> None:
    answers = {
        "state": api.request("GET", "/v1/ui/state"),
        "unauthenticated": api.request("GET", "/v1/ui/state", token=None),
        # An error that repeats what the request said, before any token is asked for.
        "reflected": api.request("GET", "/v1/openapi.json?%3Cscript%3Ealert(1)%3C/script%3E=1"),
        "msgpack": api.request("GET", "/v1/kv?limit=1", headers={"Accept": "application/msgpack"}),
    }
    assert answers["reflected"].status == 400
    for name, answer in answers.items():
        assert answer.headers["X-Content-Type-Options"] == "nosniff", name
        assert answer.headers["Cache-Control"] == "no-store", name

    async def stream_headers() -> dict[str, str]:
        await eventually(lambda: api.services.streams == 0)
        headers = {**auth_headers("alpha"), "Accept": "text/event-stream"}
        async with api.client.get("/v1/ui/events", headers=headers) as stream:
            return dict(stream.headers)

    streamed = api.run(stream_headers())
    assert streamed["X-Content-Type-Options"] == "nosniff"
    assert streamed["Cache-Control"] == "no-store"
    page = api.request("GET", "/ui", token=None)
    assert (page.headers["X-Content-Type-Options"], page.headers["Cache-Control"]) == (
        "nosniff",
        "no-cache",
    )


def test_state__shows_the_raft_members_only_to_who_may_read_them(api: ApiNode) -> None:
    # /v1/cluster/members needs read_members: a tenant is refused it, an operator is not.
    assert api.request("GET", "/v1/cluster/members", token="alpha").status == 403
    assert api.request("GET", "/v1/cluster/members", token="operator").status == 200

    tenant = _state(api, "alpha")
    operator = _state(api, "operator")

    # (The test node is a group of one: it has no peers to list.)
    assert "members" not in tenant["node"]
    assert operator["node"]["members"] == []
    described = document()
    for state in (tenant, operator):
        jsonschema.Draft202012Validator(
            {"$ref": "#/components/schemas/UiState", "components": described["components"]}
        ).validate(state)


def test_state__says_how_many_of_a_jobs_tasks_it_shows(api: ApiNode) -> None:
    job_id = api.ok(
        "POST", "/v1/jobs", json={"name": "ui-array", "workload": "gemm", "array_size": 20}
    )["job_id"]

    job = next(item for item in _state(api)["jobs"] if item["job_id"] == job_id)

    assert (job["array_size"], job["tasks_shown"], len(job["tasks"])) == (20, 16, 16)
