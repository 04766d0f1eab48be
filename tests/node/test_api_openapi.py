"""The OpenAPI document: valid OpenAPI 3.1, one operation per route of the application (so a route
without documentation fails here), request bodies that match what handlers accept, and real
answers that match their response schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from openapi_spec_validator import validate

from node.api.app import create_app
from node.api.openapi import OPERATIONS, document
from node.api.ui import STATIC_FILES
from node.config import load_config
from raftstore.store import RaftStore
from tests.node.conftest import WAIT_MAX_S, ApiNode
from xrcore.commands import JobSpec

pytestmark = pytest.mark.integration


def _routes(tmp_path: Path) -> set[tuple[str, str]]:
    """(method, path) of every route the application registers, in OpenAPI's path syntax."""
    config = load_config(
        environ={},
        overrides={
            "region.name": "r0",
            "raft.address": "127.0.0.1:1",
            "data_dir": str(tmp_path),
        },
    )
    # The store is never started: registering routes needs only the object.
    app = create_app(config, store=RaftStore(config.raft))
    found = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        resource = route.resource
        assert resource is not None
        # The web dashboard's page and files (`node.api.ui.STATIC_FILES`) are not API
        # operations; its data routes under /v1/ui are, and are documented.
        if resource.canonical in STATIC_FILES:
            continue
        found.add((route.method.lower(), resource.canonical))
    return found


def _documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method, path) for path, item in document["paths"].items() for method in item}


def test_document__is_valid_openapi_3_1() -> None:
    validate(document())


def test_document__describes_exactly_the_applications_routes(tmp_path: Path) -> None:
    assert _documented(document()) == _routes(tmp_path)


def test_job_spec_schema__has_every_job_spec_field_but_the_tenant() -> None:
    schema = document()["components"]["schemas"]["JobSpec"]
    assert set(schema["properties"]) == set(JobSpec.__struct_fields__) - {"tenant"}
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("schema", "body", "accepted"),
    [
        ("KvPut", {"value": "x", "expected_mod_revision": 0, "session_id": None}, True),
        ("KvPut", {"value_base64": "eA=="}, True),
        ("KvPut", {"value": "x", "value_base64": "eA=="}, False),
        ("KvPut", {"value": "x", "ttl": 5}, False),
        ("KvPut", {}, False),
        ("SessionGrant", {"ttl_ms": 600_000}, True),
        ("SessionGrant", {"ttl_ms": 1}, False),
        ("LockAcquire", {"session_id": "s1", "wait_s": WAIT_MAX_S}, True),
        # Longer than the node waits: served as its longest wait (`node.api.app.wait_s`).
        ("LockAcquire", {"session_id": "s1", "wait_s": WAIT_MAX_S + 1}, True),
        ("LockAcquire", {"session_id": "s1", "wait_s": -1}, False),
        ("LockValidate", {"token": 0}, False),
        ("JobSpec", {"name": "job", "workload": "w", "args": {"steps": 3}}, True),
        ("JobSpec", {"name": "job", "workload": "w", "tenant": "beta"}, False),
        ("JobSpec", {"name": "job", "workload": "w", "priority": 10_000}, False),
        ("JobCancel", {}, True),
        ("JobCancel", {"because": "typo"}, False),
        ("TransferLeader", {"region": "r0", "force": True}, False),
    ],
)
def test_request_schemas__accept_and_refuse_what_the_handlers_do(
    schema: str, body: dict[str, Any], accepted: bool
) -> None:
    described = document(wait_max_s=WAIT_MAX_S)
    validator = jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{schema}", "components": described["components"]}
    )
    assert validator.is_valid(body) == accepted


def test_open_operations__are_exactly_health_metrics_and_the_document() -> None:
    opened = {operation.path for operation in OPERATIONS if operation.open}
    assert opened == {"/healthz", "/readyz", "/metrics", "/v1/openapi.json"}
    for path in opened:
        assert document()["paths"][path]["get"]["security"] == []


def test_writes__take_the_idempotency_headers() -> None:
    paths = document()["paths"]
    for operation in OPERATIONS:
        parameters = paths[operation.path][operation.method].get("parameters", [])
        names = {parameter["$ref"].rsplit("/", 1)[1] for parameter in parameters}
        assert {"client_id", "seq"} <= names or not operation.write, operation.path


def test_served_document__carries_the_nodes_wait_maximum(api: ApiNode) -> None:
    served = api.request("GET", "/v1/openapi.json", token=None)
    assert served.status == 200
    validate(served.document)
    parameters = served.document["components"]["parameters"]
    assert f"At most {WAIT_MAX_S:g} s are waited" in parameters["watch_wait_s"]["description"]
    assert "maximum" not in parameters["watch_wait_s"]["schema"]


# Real answers against their schemas.


def _check(document: dict[str, Any], name: str, instance: Any) -> None:
    """Validates `instance` against schema `name`, and checks that each of its top-level fields
    is documented (the schemas of answers stay open to new fields, so validation alone would
    not notice an undocumented one)."""
    schemas = document["components"]["schemas"]
    jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    ).validate(instance)
    if isinstance(instance, dict):
        assert set(instance) <= set(schemas[name]["properties"]), (name, instance)


def _schema_of(document: dict[str, Any], method: str, path: str, status: int) -> str:
    response = document["paths"][path][method]["responses"][str(status)]
    if "$ref" in response:
        response = document["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    reference: str = response["content"]["application/json"]["schema"]["$ref"]
    return reference.rsplit("/", 1)[1]


def test_answers__match_their_documented_schemas(api: ApiNode) -> None:
    described = api.ok("GET", "/v1/openapi.json", token=None)
    session_id = api.session()
    job_id = api.ok("POST", "/v1/jobs", json={"name": "openapi-job", "workload": "w"})["job_id"]
    api.ok("PUT", "/v1/kv/openapi-key", json={"value": "x"})
    start = api.revision()
    region = api.register_region()
    cases: list[tuple[str, str, str, dict[str, Any]]] = [
        ("put", "/v1/kv/{key}", "/v1/kv/openapi-key", {"json": {"value": "y"}}),
        ("get", "/v1/kv/{key}", "/v1/kv/openapi-key", {}),
        ("get", "/v1/kv", "/v1/kv?prefix=openapi", {}),
        ("post", "/v1/sessions", "/v1/sessions", {"json": {"ttl_ms": 600_000}}),
        ("get", "/v1/sessions/{session_id}", f"/v1/sessions/{session_id}", {}),
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/openapi-lock/acquire",
            {"json": {"session_id": session_id}},
        ),
        ("get", "/v1/locks/{name}", "/v1/locks/openapi-lock", {}),
        (
            "post",
            "/v1/locks/{name}/validate",
            "/v1/locks/openapi-lock/validate",
            {"json": {"token": 1}},
        ),
        ("get", "/v1/jobs/{job_id}", f"/v1/jobs/{job_id}", {}),
        ("get", "/v1/jobs", "/v1/jobs?limit=5", {}),
        ("get", "/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/events", {}),
        ("get", "/v1/regions", "/v1/regions", {}),
        ("get", "/v1/regions/{name}", f"/v1/regions/{region}", {}),
        ("get", "/v1/cluster/status", "/v1/cluster/status", {}),
        ("get", "/v1/cluster/members", "/v1/cluster/members", {"token": "admin"}),
        ("get", "/v1/watch", f"/v1/watch?prefix=openapi&from_revision={start}", {}),
        ("get", "/healthz", "/healthz", {}),
        ("get", "/readyz", "/readyz", {}),
        ("post", "/v1/jobs/{job_id}/cancel", f"/v1/jobs/{job_id}/cancel", {}),
        ("delete", "/v1/kv/{key}", "/v1/kv/openapi-key", {}),
        ("delete", "/v1/sessions/{session_id}", f"/v1/sessions/{session_id}", {}),
    ]
    for method, template, path, options in cases:
        answer = api.request(method.upper(), path, **options)
        assert answer.status < 300, (path, answer.body)
        _check(described, _schema_of(described, method, template, answer.status), answer.document)


def test_error_answers__match_the_error_schema(api: ApiNode) -> None:
    described = api.ok("GET", "/v1/openapi.json", token=None)
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/v1/kv/openapi-missing", {}),
        ("PUT", "/v1/kv/openapi-key", {"json": {"valeu": "typo"}}),
        ("GET", "/v1/kv", {"token": None}),
        ("GET", "/v1/cluster/members", {}),
        ("GET", "/v1/no-such-route", {}),
    ]
    for method, path, options in cases:
        answer = api.request(method, path, **options)
        assert answer.status >= 400
        _check(described, "Error", answer.document)
