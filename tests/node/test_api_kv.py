"""The KV resource through the app factory: get, put with compare-and-set, delete, paged ranges,
msgpack bodies, and writes retried with the same idempotency key."""

from __future__ import annotations

import base64

import msgspec
import pytest

from tests.node.conftest import ApiNode

pytestmark = pytest.mark.integration


def test_put_then_get__returns_the_value_and_its_revisions(api: ApiNode) -> None:
    put = api.request("PUT", "/v1/kv/kv-basic", json={"value": "hello"})
    assert put.status == 200
    assert put.document["version"] == 1
    assert put.document["previous_mod_revision"] == 0
    assert int(put.headers["Xr-Index"]) > 0
    assert put.headers["Xr-Request-Id"]

    got = api.request("GET", "/v1/kv/kv-basic")
    assert got.status == 200
    assert got.document["key"] == "kv-basic"
    assert got.document["value"] == "hello"
    assert base64.b64decode(got.document["value_base64"]) == b"hello"
    assert got.document["mod_revision"] == put.document["revision"]
    assert got.document["stale"] is False


def test_get__with_stale_consistency__says_it_may_be_stale(api: ApiNode) -> None:
    api.ok("PUT", "/v1/kv/kv-stale", json={"value": "x"})
    got = api.request("GET", "/v1/kv/kv-stale?consistency=stale")
    assert (got.status, got.document["value"], got.document["stale"]) == (200, "x", True)


def test_get__of_a_missing_key__is_404(api: ApiNode) -> None:
    got = api.request("GET", "/v1/kv/kv-never-written")
    assert (got.status, got.error_code) == (404, "not_found")
    assert got.document["error"]["definite"] is True


def test_keys_with_slashes__are_one_key(api: ApiNode) -> None:
    api.ok("PUT", "/v1/kv/kv-nested/a/b", json={"value": "deep"})
    assert api.ok("GET", "/v1/kv/kv-nested/a/b")["key"] == "kv-nested/a/b"


@pytest.mark.parametrize("encoded", ["kv-line%0Abreak", "kv-trailing%0A", "%0Akv-leading"])
def test_keys_with_line_breaks__are_put_read_and_deleted(api: ApiNode, encoded: str) -> None:
    """A key is any text; the route once matched keys with `.+`, so these answered 404."""
    key = encoded.replace("%0A", "\n")
    api.ok("PUT", f"/v1/kv/{encoded}", json={"value": "x"})
    got = api.ok("GET", f"/v1/kv/{encoded}")
    assert (got["key"], got["value"]) == (key, "x")
    assert api.ok("DELETE", f"/v1/kv/{encoded}")["deleted"] == 1


def test_put_with_expected_mod_revision__sets_only_when_it_matches(api: ApiNode) -> None:
    created = api.request("PUT", "/v1/kv/kv-cas", json={"value": "1", "expected_mod_revision": 0})
    assert created.status == 200
    revision = created.document["revision"]

    stale = api.request("PUT", "/v1/kv/kv-cas", json={"value": "2", "expected_mod_revision": 0})
    assert (stale.status, stale.error_code) == (409, "kv.compare_failed")
    assert api.ok("GET", "/v1/kv/kv-cas")["value"] == "1"

    matched = api.request(
        "PUT", "/v1/kv/kv-cas", json={"value": "2", "expected_mod_revision": revision}
    )
    assert (matched.status, matched.document["version"]) == (200, 2)
    assert api.ok("GET", "/v1/kv/kv-cas")["value"] == "2"


def test_delete__removes_the_key_and_compare_and_delete_checks_the_revision(
    api: ApiNode,
) -> None:
    revision = api.ok("PUT", "/v1/kv/kv-delete", json={"value": "x"})["revision"]
    refused = api.request("DELETE", f"/v1/kv/kv-delete?expected_mod_revision={revision + 100}")
    assert (refused.status, refused.error_code) == (409, "kv.compare_failed")

    deleted = api.request("DELETE", f"/v1/kv/kv-delete?expected_mod_revision={revision}")
    assert (deleted.status, deleted.document["deleted"]) == (200, 1)
    assert api.request("GET", "/v1/kv/kv-delete").status == 404
    # Deleting what is not there is not an error: nothing was deleted.
    assert api.ok("DELETE", "/v1/kv/kv-delete")["deleted"] == 0


def test_range__pages_through_a_prefix_in_key_order(api: ApiNode) -> None:
    names = [f"kv-range/{position:02d}" for position in range(7)]
    for name in reversed(names):
        api.ok("PUT", f"/v1/kv/{name}", json={"value": name})
    api.ok("PUT", "/v1/kv/kv-rangeX", json={"value": "outside the prefix"})

    seen: list[str] = []
    after = None
    for _ in range(10):
        query = "prefix=kv-range/&limit=3" + ("" if after is None else f"&after={after}")
        page = api.ok("GET", f"/v1/kv?{query}")
        assert len(page["items"]) <= 3
        seen.extend(item["key"] for item in page["items"])
        after = page["next"]
        if after is None:
            break
    assert seen == names


def test_msgpack__request_and_response_carry_bytes_that_are_not_text(api: ApiNode) -> None:
    value = b"\xff\x00binary"
    put = api.request(
        "PUT",
        "/v1/kv/kv-msgpack",
        body=msgspec.msgpack.encode({"value": value}),
        headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
    )
    assert put.status == 200
    assert put.headers["Content-Type"].startswith("application/msgpack")

    got = api.request("GET", "/v1/kv/kv-msgpack", headers={"Accept": "application/msgpack"})
    assert got.headers["Content-Type"].startswith("application/msgpack")
    assert got.document["value"] is None
    assert base64.b64decode(got.document["value_base64"]) == value
    # The same document in JSON.
    assert api.ok("GET", "/v1/kv/kv-msgpack")["value_base64"] == got.document["value_base64"]


def test_put_with_value_base64__stores_the_decoded_bytes(api: ApiNode) -> None:
    encoded = base64.b64encode(b"\x01\x02").decode()
    api.ok("PUT", "/v1/kv/kv-base64", json={"value_base64": encoded})
    got = api.ok("GET", "/v1/kv/kv-base64")
    assert (got["value"], got["value_base64"]) == ("\x01\x02", encoded)


def test_retried_put__with_the_same_client_id_and_seq__applies_once(api: ApiNode) -> None:
    headers = {"Xr-Client-Id": "kv-retry-client", "Xr-Seq": "1"}
    first = api.request("PUT", "/v1/kv/kv-retry", json={"value": "a"}, headers=headers)
    again = api.request("PUT", "/v1/kv/kv-retry", json={"value": "a"}, headers=headers)
    assert first.status == again.status == 200
    assert again.document == first.document
    assert api.ok("GET", "/v1/kv/kv-retry")["version"] == 1

    following = api.request(
        "PUT", "/v1/kv/kv-retry", json={"value": "b"}, headers={**headers, "Xr-Seq": "2"}
    )
    assert following.document["version"] == 2


def test_put_under_a_session__is_deleted_when_the_session_is_revoked(api: ApiNode) -> None:
    session_id = api.session()
    api.ok("PUT", "/v1/kv/kv-ephemeral", json={"value": "x", "session_id": session_id})
    assert api.ok("GET", "/v1/kv/kv-ephemeral")["session_id"] == session_id
    assert api.ok("GET", f"/v1/sessions/{session_id}")["keys"] == ["kv-ephemeral"]

    api.ok("DELETE", f"/v1/sessions/{session_id}")
    assert api.request("GET", "/v1/kv/kv-ephemeral").status == 404
