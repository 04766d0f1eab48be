"""The OpenAPI 3.1 document served at /v1/openapi.json.

Each operation is described here, next to its path and method; tests check that the document
is valid OpenAPI 3.1 and that its operations are exactly the application's routes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from node.api.wire import respond

__all__ = ["OPERATIONS", "document", "routes"]

routes = web.RouteTableDef()

# (method, path) -> summary. Paths use OpenAPI's {name} syntax.
OPERATIONS: dict[tuple[str, str], str] = {
    ("get", "/healthz"): "Liveness: 200 while the process serves requests",
    ("get", "/readyz"): "Readiness: 200 when a read barrier commits",
    ("get", "/metrics"): "Prometheus metrics",
    ("get", "/v1/openapi.json"): "This document",
    ("get", "/v1/kv"): "List keys under a prefix, paged",
    ("get", "/v1/kv/{key}"): "Read a key",
    ("put", "/v1/kv/{key}"): "Write a key, optionally compare-and-set",
    ("delete", "/v1/kv/{key}"): "Delete a key, optionally compare-and-delete",
    ("post", "/v1/sessions"): "Grant a session (a lease with a TTL)",
    ("get", "/v1/sessions/{session_id}"): "Read a session",
    ("post", "/v1/sessions/{session_id}/keepalive"): "Renew a session's TTL",
    ("delete", "/v1/sessions/{session_id}"): "Revoke a session, releasing its locks and keys",
    ("post", "/v1/locks/{name}/acquire"): "Acquire a lock, optionally waiting in FIFO order",
    ("post", "/v1/locks/{name}/release"): "Release a lock or leave its queue",
    ("get", "/v1/locks/{name}"): "Inspect a lock: holder, token, waiters",
    ("post", "/v1/locks/{name}/validate"): "Check whether a fencing token is current",
    ("post", "/v1/jobs"): "Submit a job",
    ("get", "/v1/jobs"): "List jobs, filtered and paged",
    ("get", "/v1/jobs/{job_id}"): "Read a job, optionally waiting for it to finish",
    ("post", "/v1/jobs/{job_id}/cancel"): "Cancel a job",
    ("get", "/v1/jobs/{job_id}/events"): "A job's timeline of attempts",
    ("get", "/v1/regions"): "List regions",
    ("get", "/v1/regions/{name}"): "Read a region",
    ("get", "/v1/cluster/status"): "This node's view of the Raft group",
    ("get", "/v1/cluster/members"): "Members, their regions and replication progress",
    ("post", "/v1/cluster/transfer-leader"): "Move leadership to a region",
    ("get", "/v1/watch"): "KV changes from a revision: long poll, or Server-Sent Events",
}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "definite"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "definite": {"type": "boolean"},
            },
        }
    },
}


def _operation(method: str, path: str, summary: str) -> dict[str, Any]:
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in ("key", "session_id", "name", "job_id")
        if "{" + name + "}" in path
    ]
    operation: dict[str, Any] = {
        "summary": summary,
        "operationId": method
        + path.replace("/", "_")
        .replace("{", "")
        .replace("}", "")
        .replace("-", "_")
        .replace(".", "_"),
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": {}}}},
            "default": {
                "description": "An error",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
        },
    }
    if parameters:
        operation["parameters"] = parameters
    if method in ("post", "put"):
        operation["requestBody"] = {
            "required": False,
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "application/msgpack": {"schema": {"type": "object"}},
            },
        }
    return operation


def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), summary in OPERATIONS.items():
        paths.setdefault(path, {})[method] = _operation(method, path, summary)
    return {
        "openapi": "3.1.0",
        "info": {"title": "xr node API", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


@routes.get("/v1/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return respond(request, document())
