"""Authorization on every route, and tenant isolation on every resource.

`EXPECTED` decides, for each operation of the OpenAPI document, who may call it; it is written
here, apart from the code's `ROUTE_RULES`, and must name exactly the document's operations, so a
route added without a decision fails `test_expected_table__covers_exactly_the_documents_operations`.
Each operation is then called by each role, without a token and with a bad one.

The isolation tests let tenant `alpha` create one object of each kind and check that tenant
`beta` gets 404 (never 403: a 403 would tell that the name exists) on each, and that beta's lists,
watches (long poll and stream), job events and logs, dashboard state and events never show it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from node.api.app import create_app
from node.api.auth import ROLE_PERMISSIONS, ROUTE_RULES, Access, Permission
from node.api.openapi import OPERATIONS
from node.api.testnet import routes as testnet_routes
from node.config import NodeConfig
from tests.node.conftest import TOKENS, ApiNode, auth_headers
from xrcore.commands import LockAcquire

pytestmark = pytest.mark.integration

REPOSITORY = Path(__file__).resolve().parent.parent.parent
ALL_ROLES = frozenset({"admin", "operator", "tenant"})
PUBLIC = "public"
OPEN_HEALTH = "open_health"

# operation id -> the roles that may call it, or PUBLIC (no token ever), or OPEN_HEALTH (no token
# while auth.open_health is set, any valid token otherwise).
EXPECTED: dict[str, frozenset[str] | str] = {
    "healthz": OPEN_HEALTH,
    "readyz": OPEN_HEALTH,
    "metrics": OPEN_HEALTH,
    "openapi": PUBLIC,
    "kvRange": ALL_ROLES,
    "kvGet": ALL_ROLES,
    "kvPut": ALL_ROLES,
    "kvDelete": ALL_ROLES,
    "sessionGrant": ALL_ROLES,
    "sessionGet": ALL_ROLES,
    "sessionKeepAlive": ALL_ROLES,
    "sessionRevoke": ALL_ROLES,
    "lockAcquire": ALL_ROLES,
    "lockRelease": ALL_ROLES,
    "lockGet": ALL_ROLES,
    "lockValidate": ALL_ROLES,
    "jobSubmit": ALL_ROLES,
    "jobList": ALL_ROLES,
    "jobGet": ALL_ROLES,
    "jobCancel": ALL_ROLES,
    "jobEvents": ALL_ROLES,
    "jobLogs": ALL_ROLES,
    "tenantList": ALL_ROLES,
    "tenantSet": frozenset({"admin"}),
    "regionList": ALL_ROLES,
    "regionGet": ALL_ROLES,
    "clusterStatus": ALL_ROLES,
    "clusterMembers": frozenset({"operator", "admin"}),
    "clusterTransferLeader": frozenset({"admin"}),
    "snapshotSave": frozenset({"admin"}),
    "snapshotHash": frozenset({"admin"}),
    "watch": ALL_ROLES,
    "uiState": ALL_ROLES,
    "uiEvents": ALL_ROLES,
}

# A value for each path parameter that names nothing, so no call finds an object.
_PATH_VALUES = {
    "key": "authz-probe",
    "session_id": "authz-no-such-session",
    "name": "authz-probe",
    "job_id": "job-authz-none",
}
# The callers: each role's token, no token, a token nobody configured.
_CALLERS: dict[str, dict[str, str]] = {
    "admin": auth_headers("admin"),
    "operator": auth_headers("operator"),
    "tenant": auth_headers("alpha"),
    "no token": {},
    "bad token": {"Authorization": "Bearer not-a-configured-token"},
}


def _with_open_health(config: NodeConfig, open_health: bool) -> NodeConfig:
    auth = msgspec.structs.replace(config.auth, open_health=open_health)
    return dataclasses.replace(config, auth=auth)


def _client(api: ApiNode, app: web.Application) -> TestClient[Any, Any]:
    # An application of its own on the shared node's store, so its stream count is its own.
    return api.run(api.serve(app))


async def _status(client: TestClient[Any, Any], method: str, path: str, caller: str) -> int:
    """The status only: the body of a stream is never read, and a write's body is refused by
    validation (an unknown field) so nothing is created."""
    body = None
    headers = dict(_CALLERS[caller])
    if method in ("PUT", "POST"):
        body = msgspec.json.encode({"authz_probe": 1})
        headers["Content-Type"] = "application/json"
    async with client.request(method, path, data=body, headers=headers) as answer:
        status: int = answer.status
        answer.close()
        return status


def _concrete(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda found: _PATH_VALUES[found.group(1)], path)


def _expectation(rule: frozenset[str] | str, caller: str, *, open_health: bool) -> str:
    """ "allowed" (anything but 401 and 403), "401" or "403"."""
    if rule == PUBLIC or (rule == OPEN_HEALTH and open_health):
        return "allowed"
    if caller in ("no token", "bad token"):
        return "401"
    if rule == OPEN_HEALTH or caller in rule:
        return "allowed"
    return "403"


def test_expected_table__covers_exactly_the_documents_operations() -> None:
    documented = {operation.operation_id for operation in OPERATIONS}
    assert set(EXPECTED) == documented, (
        "a route was added or removed: decide who may call it in EXPECTED and in "
        "node.api.auth.ROUTE_RULES, and regenerate the table in docs/authorization.md"
    )


def test_the_codes_rules__grant_what_the_table_expects() -> None:
    # Handlers check permissions too, so a rule weaker than the handler's check would pass the
    # calls below while the documented table (rendered from the rules) said too much.
    for operation in OPERATIONS:
        rule = ROUTE_RULES[(operation.method.upper(), operation.path)]
        if isinstance(rule, Access):
            granted: frozenset[str] | str = rule.value
        else:
            granted = frozenset(role for role in ALL_ROLES if rule in ROLE_PERMISSIONS[role])
        assert granted == EXPECTED[operation.operation_id], operation.operation_id


def test_every_route_the_node_serves__has_a_rule(api: ApiNode) -> None:
    app = create_app(api.config, store=api.store)
    app.router.add_routes(testnet_routes)
    served = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    assert served == set(ROUTE_RULES), "every served route has a rule, and no rule is stale"


@pytest.mark.parametrize("open_health", [True, False], ids=["open health", "closed health"])
def test_every_operation__answers_each_caller_as_the_table_says(
    api: ApiNode, open_health: bool
) -> None:
    client = _client(api, create_app(_with_open_health(api.config, open_health), store=api.store))
    wrong: list[str] = []
    for operation in OPERATIONS:
        rule = EXPECTED[operation.operation_id]
        method, path = operation.method.upper(), _concrete(operation.path)
        for caller in _CALLERS:
            expected = _expectation(rule, caller, open_health=open_health)
            status = api.run(_status(client, method, path, caller))
            got = str(status) if status in (401, 403) else "allowed"
            if got != expected:
                wrong.append(f"{method} {path} as {caller}: {status}, expected {expected}")
    assert wrong == []


def test_a_route_without_a_rule__needs_an_admin(api: ApiNode) -> None:
    async def unlisted(request: web.Request) -> web.Response:
        return web.json_response({"reached": True})

    app = create_app(api.config, store=api.store)
    app.router.add_get("/v1/authz-unlisted", unlisted)
    client = _client(api, app)
    assert api.request("GET", "/v1/authz-unlisted", token="alpha", client=client).status == 403
    assert api.request("GET", "/v1/authz-unlisted", token="operator", client=client).status == 403
    assert api.request("GET", "/v1/authz-unlisted", token="admin", client=client).status == 200
    assert api.request("GET", "/v1/authz-unlisted", token=None, client=client).status == 401


def test_the_conftest_roles__are_the_ones_the_table_names() -> None:
    assert {role for _, role, _ in TOKENS.values()} == ALL_ROLES == set(ROLE_PERMISSIONS)


# The table in docs/authorization.md.

_TABLE_BEGIN = "<!-- permissions:begin (tests/node/test_authz.py checks this table) -->"
_TABLE_END = "<!-- permissions:end -->"


def _roles_cell(rule: Permission | Access) -> str:
    if rule is Access.PUBLIC:
        return "anyone, no token"
    if rule is Access.OPEN_HEALTH:
        return "anyone while `auth.open_health`; else any token"
    roles = [role for role in ("tenant", "operator", "admin") if rule in ROLE_PERMISSIONS[role]]
    return ", ".join(roles)


def permission_table() -> str:
    """The markdown tables of docs/authorization.md, from the code."""
    lines = ["| role | permissions |", "| --- | --- |"]
    for role in ("tenant", "operator", "admin"):
        granted = [p.value for p in Permission if p in ROLE_PERMISSIONS[role]]
        lines.append(f"| `{role}` | {', '.join(f'`{name}`' for name in granted)} |")
    lines += ["", "| operation | route | needs | who |", "| --- | --- | --- | --- |"]
    for operation in OPERATIONS:
        rule = ROUTE_RULES[(operation.method.upper(), operation.path)]
        lines.append(
            f"| `{operation.operation_id}` | `{operation.method.upper()} {operation.path}` "
            f"| `{rule.value}` | {_roles_cell(rule)} |"
        )
    return "\n".join(lines)


def test_docs_table__is_the_codes_table() -> None:
    text = (REPOSITORY / "docs" / "authorization.md").read_text()
    begin, end = text.index(_TABLE_BEGIN) + len(_TABLE_BEGIN), text.index(_TABLE_END)
    expected = permission_table()
    assert text[begin:end].strip() == expected, (
        "docs/authorization.md's table is out of date; it should read:\n" + expected
    )


# Tenant isolation: alpha's objects, as beta sees them.


@dataclasses.dataclass(frozen=True)
class _AlphaObjects:
    key: str
    session_id: str
    lock: str
    job_id: str
    first_revision: int


@pytest.fixture(scope="module")
def alpha_objects(api: ApiNode) -> _AlphaObjects:
    region = api.register_region()
    first_revision = api.revision() + 1
    api.ok("PUT", "/v1/kv/authz-iso/key", json={"value": "alpha's"})
    session_id = api.session("alpha")
    # Set-up through the log (what the lock routes do is checked in test_api_locks.py).
    api.propose(LockAcquire(name="alpha/authz-iso-lock", session_id=session_id))
    job_id = api.ok("POST", "/v1/jobs", json={"name": "authz-iso-job", "workload": "sleep"})[
        "job_id"
    ]
    api.start_task(job_id, region, executor_id="authz-executor", lease_ttl_ms=600_000)
    api.ok("PUT", "/v1/tenants/alpha", token="admin", json={"weight": 1})
    api.ok("PUT", "/v1/tenants/beta", token="admin", json={"weight": 1})
    return _AlphaObjects(
        key="authz-iso/key",
        session_id=session_id,
        lock="authz-iso-lock",
        job_id=job_id,
        first_revision=first_revision,
    )


def test_alpha_reaches_its_own_objects(api: ApiNode, alpha_objects: _AlphaObjects) -> None:
    # The other tests' 404s mean something only if alpha's own calls find the objects.
    objects = alpha_objects
    for path in (
        f"/v1/kv/{objects.key}",
        f"/v1/sessions/{objects.session_id}",
        f"/v1/locks/{objects.lock}",
        f"/v1/jobs/{objects.job_id}",
        f"/v1/jobs/{objects.job_id}/events",
        f"/v1/jobs/{objects.job_id}/logs",
    ):
        assert api.request("GET", path).status == 200, path


def test_each_of_alphas_objects__answers_beta_404_not_403(
    api: ApiNode, alpha_objects: _AlphaObjects
) -> None:
    objects = alpha_objects
    calls: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", f"/v1/kv/{objects.key}", None),
        ("GET", f"/v1/sessions/{objects.session_id}", None),
        ("POST", f"/v1/sessions/{objects.session_id}/keepalive", None),
        ("DELETE", f"/v1/sessions/{objects.session_id}", None),
        ("GET", f"/v1/locks/{objects.lock}", None),
        ("POST", f"/v1/locks/{objects.lock}/release", {"session_id": objects.session_id}),
        ("GET", f"/v1/jobs/{objects.job_id}", None),
        ("POST", f"/v1/jobs/{objects.job_id}/cancel", None),
        ("GET", f"/v1/jobs/{objects.job_id}/events", None),
        ("GET", f"/v1/jobs/{objects.job_id}/logs", None),
        ("GET", f"/v1/jobs/{objects.job_id}/logs?task_index=0&attempt=1", None),
        ("PUT", "/v1/kv/authz-borrowed", {"value": "x", "session_id": objects.session_id}),
    ]
    for method, path, body in calls:
        answer = api.request(method, path, token="beta", json=body)
        assert (answer.status, answer.error_code) == (404, "not_found"), (method, path)
    # Beta's answer for alpha's job is the answer for a job that does not exist.
    missing = api.request("GET", "/v1/jobs/job-999999999/logs", token="beta").document
    stolen = api.request("GET", f"/v1/jobs/{objects.job_id}/logs", token="beta").document
    assert stolen["error"]["message"] == missing["error"]["message"].replace(
        "job-999999999", objects.job_id
    )
    # Nothing of alpha's changed.
    assert api.ok("GET", f"/v1/locks/{objects.lock}")["holder"] == objects.session_id
    assert api.ok("GET", f"/v1/jobs/{objects.job_id}")["state"] != "cancelled"


def test_betas_lists__never_show_alphas_objects(api: ApiNode, alpha_objects: _AlphaObjects) -> None:
    keys = api.ok("GET", "/v1/kv?limit=1000", token="beta")["items"]
    assert alpha_objects.key not in [item["key"] for item in keys]
    assert api.ok("GET", "/v1/kv?prefix=authz-iso/", token="beta")["items"] == []
    jobs = api.ok("GET", "/v1/jobs?limit=1000", token="beta")["items"]
    assert alpha_objects.job_id not in [item["job_id"] for item in jobs]
    # Tenants: beta reads only its own record; operators read every tenant's.
    beta_tenants = api.ok("GET", "/v1/tenants", token="beta")["items"]
    assert [item["name"] for item in beta_tenants] == ["beta"]
    operator_tenants = api.ok("GET", "/v1/tenants", token="operator")["items"]
    assert {"alpha", "beta"} <= {item["name"] for item in operator_tenants}


def test_betas_long_poll_watch__never_shows_alphas_keys(
    api: ApiNode, alpha_objects: _AlphaObjects
) -> None:
    api.ok("PUT", "/v1/kv/authz-iso/key", token="beta", json={"value": "beta's"})
    for prefix in ("", "authz-iso/", "alpha/", "../alpha/"):
        seen = api.ok(
            "GET",
            f"/v1/watch?prefix={prefix}&from_revision={alpha_objects.first_revision}&limit=1000",
            token="beta",
        )
        assert "alpha's" not in [event["value"] for event in seen["events"]], prefix


async def _first_sse_event(response: ClientResponse) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    while True:
        line = (await response.content.readline()).decode().rstrip("\n")
        if line.startswith(":"):
            continue
        if not line and fields:
            return fields
        name, _, value = line.partition(": ")
        if name:
            fields[name] = msgspec.json.decode(value) if name == "data" else value


def test_betas_watch_stream__never_shows_alphas_keys(
    api: ApiNode, alpha_objects: _AlphaObjects
) -> None:
    # Alpha's put is the first change from first_revision on: a leak would be the first event.
    api.ok("PUT", "/v1/kv/authz-iso/streamed", token="beta", json={"value": "beta's"})
    headers = {**auth_headers("beta"), "Accept": "text/event-stream"}
    path = f"/v1/watch?from_revision={alpha_objects.first_revision}"
    client = _client(api, create_app(api.config, store=api.store))

    async def first() -> dict[str, Any]:
        async with client.get(path, headers=headers) as stream:
            assert stream.status == 200
            event = await _first_sse_event(stream)
            stream.close()
            return event

    event = api.run(first())
    assert event["data"]["value"] == "beta's"


def test_betas_dashboard_state_and_events__never_show_alphas_objects(
    api: ApiNode, alpha_objects: _AlphaObjects
) -> None:
    client = _client(api, create_app(api.config, store=api.store))

    async def streamed() -> dict[str, Any]:
        async with client.get("/v1/ui/events", headers=auth_headers("beta")) as stream:
            assert stream.status == 200
            event = await _first_sse_event(stream)
            stream.close()
            data: dict[str, Any] = event["data"]
            return data

    for state in (api.ok("GET", "/v1/ui/state", token="beta"), api.run(streamed())):
        assert state["principal"]["tenant"] == "beta"
        assert alpha_objects.job_id not in [job["job_id"] for job in state["jobs"]]
        assert alpha_objects.lock not in [lock["name"] for lock in state["locks"]]
        shown_sessions = [session["session_id"] for session in state["sessions"]]
        assert alpha_objects.session_id not in shown_sessions
        assert alpha_objects.session_id not in msgspec.json.encode(state).decode()
