"""Tenants' scheduling settings through the API (admins set, operators and admins list every
tenant, a tenant sees only its own record), and a scheduling pass's reasons in a job's tasks."""

from __future__ import annotations

import re

import pytest

from tests.node.conftest import ApiNode
from xrcore.placement import place

pytestmark = pytest.mark.integration


def test_an_admin_sets_a_tenant_an_operator_lists_it_and_a_tenant_sees_only_its_own(
    api: ApiNode,
) -> None:
    created = api.ok(
        "PUT", "/v1/tenants/research", token="admin", json={"weight": 2, "gpus_max": 8}
    )
    assert created == {"name": "research", "created": True}
    api.ok("PUT", "/v1/tenants/alpha", token="admin", json={"weight": 1})
    own = api.ok("GET", "/v1/tenants", token="alpha")["items"]
    assert [item["name"] for item in own] == ["alpha"]
    listed = api.ok("GET", "/v1/tenants", token="operator")["items"]
    research = next(item for item in listed if item["name"] == "research")
    # Fields left out take their defaults: setting a tenant replaces all its settings.
    assert research == {
        "name": "research",
        "weight": 2.0,
        "gpus_max": 8,
        "tasks_max": None,
        "cost_weight": 1.0,
        "carbon_weight": 1.0,
        "keys_max": None,
        "sessions_max": None,
        "clients_max": None,
        "jobs_max": None,
        "unfinished_tasks_max": None,
    }
    again = api.ok("PUT", "/v1/tenants/research", token="admin", json={"tasks_max": 3})
    assert again["created"] is False


def test_a_tenant_at_its_keys_quota_is_refused_with_429_and_others_are_not(api: ApiNode) -> None:
    # The tables' capacities are the cluster's: one tenant filled them for all (session 30).
    api.ok("PUT", "/v1/tenants/beta", token="admin", json={"keys_max": 0, "sessions_max": 0})
    try:
        listed = api.ok("GET", "/v1/tenants", token="beta")["items"]
        assert (listed[0]["keys_max"], listed[0]["sessions_max"]) == (0, 0)
        refused = api.request("PUT", "/v1/kv/quota/a", token="beta", json={"value": "x"})
        assert (refused.status, refused.error_code) == (429, "limit.capacity")
        # How many keys beta holds depends on the tests before, on the node they share.
        message = refused.document["error"]["message"]
        assert re.fullmatch(
            r"tenant 'beta' holds \d+ keys, and its quota is 0 \(xr tenant set beta --keys-max\)",
            message,
        ), message
        # Stored under the write's key: asking again would repeat it, so no Retry-After.
        assert "Retry-After" not in refused.headers
        session = api.request("POST", "/v1/sessions", token="beta", json={"ttl_ms": 60_000})
        assert (session.status, session.error_code) == (429, "limit.capacity")
        api.ok("PUT", "/v1/kv/quota/a", token="alpha", json={"value": "x"})
    finally:
        api.ok("PUT", "/v1/tenants/beta", token="admin", json={})
    api.ok("PUT", "/v1/kv/quota/a", token="beta", json={"value": "x"})


def test_a_tenant_name_with_a_slash_is_refused(api: ApiNode) -> None:
    # No token can belong to such a tenant, so its quotas would never apply.
    answer = api.request("PUT", "/v1/tenants/a%2Fb", token="admin", json={"keys_max": 1})
    assert (answer.status, answer.error_code) == (400, "request.invalid")
    assert "has no '/'" in answer.document["error"]["message"]


def test_a_tenant_may_not_set_tenants(api: ApiNode) -> None:
    answer = api.request("PUT", "/v1/tenants/alpha", token="alpha", json={"weight": 100})
    assert (answer.status, answer.error_code) == (403, "auth.forbidden")


@pytest.mark.parametrize(
    "body",
    [
        {"weight": 0},
        {"weight": -1},
        {"gpus_max": -1},
        {"cost_weight": "high"},
        {"nope": 1},
        {"keys_max": -1},
        {"jobs_max": "many"},
    ],
)
def test_bad_tenant_settings_are_refused_naming_the_field(
    api: ApiNode, body: dict[str, object]
) -> None:
    answer = api.request("PUT", "/v1/tenants/bad", token="admin", json=body)
    assert answer.status == 400, answer.body
    assert next(iter(body)) in answer.document["error"]["message"]


def test_a_job_shows_why_its_task_waits(api: ApiNode) -> None:
    submitted = api.ok(
        "POST",
        "/v1/jobs",
        json={"name": "needs-a-lot", "workload": "gemm", "gpus": 64, "regions_allow": ["r0"]},
    )
    job_id = submitted["job_id"]
    api.register_region()

    decisions = api.services.store.replica.read(place)
    assert decisions is not None
    api.propose(decisions)
    task = api.ok("GET", f"/v1/jobs/{job_id}")["tasks"][0]
    assert task["state"] == "pending"
    assert task["reason"], task


def test_metrics_show_regions_and_attempts_by_outcome(api: ApiNode) -> None:
    api.register_region()
    answer = api.request("GET", "/metrics")
    text = answer.body.decode()
    assert 'xr_region_cpu_slots{in_region="r0",region="r0"}' in text
    assert 'xr_region_tasks_running{in_region="r0",region="r0"} 0.0' in text
    assert 'xr_task_attempts{outcome="lease_expired",region="r0"}' in text
