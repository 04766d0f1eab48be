"""Query parameters a route does not declare are refused before the handler runs
(`node.api.params`)."""

from __future__ import annotations

import pytest

from node.api.openapi import OPERATIONS
from node.api.params import allowed_query_parameters
from tests.node.conftest import ApiNode

pytestmark = pytest.mark.integration


def test_delete__with_a_misspelt_compare_parameter__is_refused_and_the_key_stays(
    api: ApiNode,
) -> None:
    put = api.ok("PUT", "/v1/kv/params-typo", json={"value": "keep me"})
    refused = api.request(
        "DELETE", f"/v1/kv/params-typo?expected_mod_revison={put['revision'] + 1}"
    )
    assert refused.status == 400
    assert refused.document["error"]["code"] == "request.invalid"
    assert "'expected_mod_revison'" in refused.document["error"]["message"]
    assert "expected_mod_revision" in refused.document["error"]["message"]
    assert api.ok("GET", "/v1/kv/params-typo")["value"] == "keep me"


def test_declared_parameters__are_accepted_and_head_is_checked_as_get(api: ApiNode) -> None:
    api.ok("PUT", "/v1/kv/params-known", json={"value": "x"})
    assert api.request("GET", "/v1/kv/params-known?consistency=stale").status == 200
    assert api.request("GET", "/v1/kv?prefix=params-&limit=5").status == 200
    assert api.request("HEAD", "/v1/kv/params-known?consistency=stale").status == 200
    assert api.request("HEAD", "/v1/kv/params-known?nonsense=1").status == 400


def test_a_route_without_query_parameters__refuses_any(api: ApiNode) -> None:
    answer = api.request("POST", "/v1/sessions?ttl_ms=5000", json={"ttl_ms": 600_000})
    assert answer.status == 400
    assert "takes: none" in answer.document["error"]["message"]


def test_every_documented_operation__has_its_query_parameters_known() -> None:
    allowed = allowed_query_parameters()
    assert set(allowed) == {(operation.method.upper(), operation.path) for operation in OPERATIONS}
    assert allowed[("DELETE", "/v1/kv/{key}")] == {"expected_mod_revision"}
    assert allowed[("GET", "/v1/watch")] >= {"from_revision", "prefix", "wait_s"}
