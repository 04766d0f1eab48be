"""Authentication, roles and tenant isolation through the app factory.

Tenant `beta` must neither see nor change tenant `alpha`'s keys, sessions, locks, jobs or watch
events: another tenant's object answers 404 exactly as a missing one, and beta's ranges, lists
and watches never show alpha's."""

from __future__ import annotations

import pytest

from node.api.app import create_app
from tests.node.conftest import ApiNode, node_config

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic dXNlcjpwYXNz"}],
    ids=["no token", "unknown token", "not a bearer token"],
)
def test_request_without_a_valid_bearer_token__is_401(
    api: ApiNode, headers: dict[str, str]
) -> None:
    for method, path in [("GET", "/v1/kv/auth-key"), ("GET", "/v1/jobs"), ("GET", "/v1/nowhere")]:
        answer = api.request(method, path, token=None, headers=headers)
        assert (answer.status, answer.error_code) == (401, "auth.unauthenticated"), path


def test_tenant__may_not_transfer_leadership_or_read_members(api: ApiNode) -> None:
    transfer = api.request("POST", "/v1/cluster/transfer-leader", json={"region": "r0"})
    assert (transfer.status, transfer.error_code) == (403, "auth.forbidden")
    members = api.request("GET", "/v1/cluster/members")
    assert (members.status, members.error_code) == (403, "auth.forbidden")
    # Regions and the cluster's status are open to tenants.
    assert api.request("GET", "/v1/cluster/status").status == 200
    assert api.request("GET", "/v1/regions").status == 200


def test_operator__reads_members_but_may_not_transfer_leadership(api: ApiNode) -> None:
    assert api.request("GET", "/v1/cluster/members", token="operator").status == 200
    transfer = api.request(
        "POST", "/v1/cluster/transfer-leader", token="operator", json={"region": "r0"}
    )
    assert (transfer.status, transfer.error_code) == (403, "auth.forbidden")


def test_health_metrics_and_the_api_description__are_open_when_open_health_is_set(
    api: ApiNode,
) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/v1/openapi.json"):
        assert api.request("GET", path, token=None).status == 200, path


def test_health_and_metrics__need_a_token_when_open_health_is_off(api: ApiNode) -> None:
    closed = node_config(api.data_dir / "closed", api.config.raft.self_address, open_health=False)

    client = api.run(api.serve(create_app(closed, store=api.store)))
    for path in ("/healthz", "/readyz", "/metrics"):
        assert api.request("GET", path, token=None, client=client).status == 401, path
        assert api.request("GET", path, token="beta", client=client).status == 200, path
    # The API's description stays public.
    assert api.request("GET", "/v1/openapi.json", token=None, client=client).status == 200


def test_keys__of_another_tenant_are_invisible_and_untouchable(api: ApiNode) -> None:
    api.ok("PUT", "/v1/kv/isolated-key", json={"value": "alpha's"})

    assert api.request("GET", "/v1/kv/isolated-key", token="beta").status == 404
    assert api.ok("DELETE", "/v1/kv/isolated-key", token="beta")["deleted"] == 0
    beta_range = api.ok("GET", "/v1/kv?prefix=isolated", token="beta")
    assert beta_range["items"] == []

    api.ok("PUT", "/v1/kv/isolated-key", token="beta", json={"value": "beta's"})
    alpha_view = api.ok("GET", "/v1/kv/isolated-key")
    assert (alpha_view["value"], alpha_view["version"]) == ("alpha's", 1)
    assert api.ok("GET", "/v1/kv/isolated-key", token="beta")["value"] == "beta's"
    # A whole-namespace range of beta's shows only beta's names.
    whole = api.ok("GET", "/v1/kv?limit=1000", token="beta")
    assert all(item["key"] is not None for item in whole["items"])
    assert [item["value"] for item in whole["items"] if item["key"] == "isolated-key"] == ["beta's"]


def test_sessions__of_another_tenant_answer_404_and_cannot_be_used(api: ApiNode) -> None:
    session_id = api.session("alpha")
    for method, path in [
        ("GET", f"/v1/sessions/{session_id}"),
        ("POST", f"/v1/sessions/{session_id}/keepalive"),
        ("DELETE", f"/v1/sessions/{session_id}"),
    ]:
        answer = api.request(method, path, token="beta")
        assert (answer.status, answer.error_code) == (404, "not_found"), (method, path)
    borrowed_lock = api.request(
        "POST", "/v1/locks/isolated-lock/acquire", token="beta", json={"session_id": session_id}
    )
    assert borrowed_lock.status == 404
    borrowed_key = api.request(
        "PUT",
        "/v1/kv/isolated-ephemeral",
        token="beta",
        json={"value": "x", "session_id": session_id},
    )
    assert borrowed_key.status == 404
    assert api.ok("GET", f"/v1/sessions/{session_id}")["locks"] == []


def test_locks__of_another_tenant_are_separate_locks(api: ApiNode) -> None:
    alpha_session, beta_session = api.session("alpha"), api.session("beta")
    alpha_grant = api.ok(
        "POST", "/v1/locks/isolated-lock/acquire", json={"session_id": alpha_session}
    )

    assert api.request("GET", "/v1/locks/isolated-lock", token="beta").status == 404
    stolen = api.request(
        "POST", "/v1/locks/isolated-lock/release", token="beta", json={"session_id": alpha_session}
    )
    assert stolen.status == 404
    validated = api.ok(
        "POST",
        "/v1/locks/isolated-lock/validate",
        token="beta",
        json={"token": alpha_grant["token"]},
    )
    assert validated["valid"] is False

    # Beta's lock of the same name is its own: granted although alpha holds alpha's.
    beta_grant = api.ok(
        "POST", "/v1/locks/isolated-lock/acquire", token="beta", json={"session_id": beta_session}
    )
    assert beta_grant["granted"] is True
    assert api.ok("GET", "/v1/locks/isolated-lock")["holder"] == alpha_session


def test_jobs__of_another_tenant_answer_404_and_never_appear_in_lists(api: ApiNode) -> None:
    job_id = api.ok("POST", "/v1/jobs", json={"name": "isolated-job", "workload": "sleep"})[
        "job_id"
    ]
    for method, path in [
        ("GET", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}?wait_s=1"),
        ("GET", f"/v1/jobs/{job_id}/events"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
    ]:
        answer = api.request(method, path, token="beta")
        assert (answer.status, answer.error_code) == (404, "not_found"), (method, path)
    listed = api.ok("GET", "/v1/jobs?limit=1000", token="beta")
    assert job_id not in [item["job_id"] for item in listed["items"]]
    assert {item["tenant"] for item in listed["items"]} <= {"beta"}
    assert api.ok("GET", f"/v1/jobs/{job_id}")["state"] == "pending"


def test_watch__never_shows_another_tenants_changes(api: ApiNode) -> None:
    start = api.revision() + 1
    api.ok("PUT", "/v1/kv/isolated-watched", json={"value": "alpha's"})
    api.ok("PUT", "/v1/kv/isolated-watched", token="beta", json={"value": "beta's"})

    seen = api.ok("GET", f"/v1/watch?from_revision={start}", token="beta")
    assert [(event["key"], event["value"]) for event in seen["events"]] == [
        ("isolated-watched", "beta's")
    ]


def test_a_write_from_a_web_page_of_another_origin__is_refused(api: ApiNode) -> None:
    """Cross-site request forgery: any page the user opened could send a form's POST (no
    preflight) to a node the browser reaches, and with authentication off it was applied (found
    by the dashboard QA pass, session 31). Programs send no Origin; the node's own origin may
    write; reads are answered whatever the Origin."""
    put = {"value": "v"}
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
        answer = api.request("PUT", "/v1/kv/csrf-key", json=put, headers={"Origin": origin})
        assert (answer.status, answer.error_code) == (403, "auth.forbidden"), origin
    assert api.request("GET", "/v1/kv/csrf-key", headers={"Origin": "null"}).status == 404
    assert api.request("PUT", "/v1/kv/csrf-key", json=put).status == 200
    own = {"Origin": "http://node.example:8700", "Host": "node.example:8700"}
    assert api.request("PUT", "/v1/kv/csrf-key", json=put, headers=own).status == 200
