"""The sessions resource through the app factory: grant, keep alive, inspect and revoke."""

from __future__ import annotations

import pytest

from tests.node.conftest import ApiNode

pytestmark = pytest.mark.integration


def test_grant__answers_201_with_the_session_of_the_callers_tenant(api: ApiNode) -> None:
    granted = api.request("POST", "/v1/sessions", json={"ttl_ms": 600_000})
    assert granted.status == 201
    assert granted.document["ttl_ms"] == 600_000
    assert granted.document["tenant"] == "alpha"
    assert (granted.document["locks"], granted.document["keys"]) == ([], [])


def test_keepalive__renews_the_session(api: ApiNode) -> None:
    session_id = api.session()
    renewed = api.request("POST", f"/v1/sessions/{session_id}/keepalive")
    assert renewed.status == 200
    assert renewed.document["session_id"] == session_id
    assert renewed.document["remaining_ms"] == 600_000


def test_get__shows_the_session_and_its_locks(api: ApiNode) -> None:
    session_id = api.session()
    api.ok("POST", "/v1/locks/session-shown/acquire", json={"session_id": session_id})
    shown = api.request("GET", f"/v1/sessions/{session_id}")
    assert shown.status == 200
    assert shown.document["locks"] == ["session-shown"]
    assert shown.document["stale"] is False
    api.ok("DELETE", f"/v1/sessions/{session_id}")


def test_revoke__ends_the_session_and_releases_its_locks(api: ApiNode) -> None:
    session_id = api.session()
    api.ok("POST", "/v1/locks/session-revoked/acquire", json={"session_id": session_id})
    revoked = api.request("DELETE", f"/v1/sessions/{session_id}")
    assert (revoked.status, revoked.document["revoked"]) == (200, True)
    assert api.request("GET", f"/v1/sessions/{session_id}").status == 404
    assert api.request("GET", "/v1/locks/session-revoked").status == 404
    assert api.request("POST", f"/v1/sessions/{session_id}/keepalive").status == 404


def test_grant__with_a_ttl_out_of_bounds__is_400(api: ApiNode) -> None:
    refused = api.request("POST", "/v1/sessions", json={"ttl_ms": 1})
    assert (refused.status, refused.error_code) == (400, "request.invalid")
    assert "ttl_ms" in refused.document["error"]["message"]
