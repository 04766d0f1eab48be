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
from node.api.ui import STATIC_FILES
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
