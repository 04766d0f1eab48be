"""The locks resource through the app factory: acquire, release, show, validate, and waiting
acquires that are granted, time out, or lose their client, each leaving the queue as it should.

Waits are observed through the node's count of waiting requests, never through elapsed time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.node.conftest import Answer, ApiNode, eventually

pytestmark = pytest.mark.integration


def _waiters(api: ApiNode, name: str) -> list[str]:
    shown = api.request("GET", f"/v1/locks/{name}")
    waiters: list[str] = [] if shown.status == 404 else shown.document["waiters"]
    return waiters


def test_acquire_show_validate_release__round_trip(api: ApiNode) -> None:
    session_id = api.session()
    granted = api.request("POST", "/v1/locks/lock-basic/acquire", json={"session_id": session_id})
    assert granted.status == 200
    assert granted.document["granted"] is True
    assert granted.document["name"] == "lock-basic"
    assert granted.document["holder"] == session_id
    token = granted.document["token"]

    shown = api.ok("GET", "/v1/locks/lock-basic")
    assert (shown["holder"], shown["token"], shown["waiters"]) == (session_id, token, [])

    valid = api.ok("POST", "/v1/locks/lock-basic/validate", json={"token": token})
    assert (valid["name"], valid["valid"], valid["current_token"]) == ("lock-basic", True, token)

    released = api.request("POST", "/v1/locks/lock-basic/release", json={"session_id": session_id})
    assert (released.status, released.document["released"]) == (200, True)
    assert api.request("GET", "/v1/locks/lock-basic").status == 404
    assert api.ok("POST", "/v1/locks/lock-basic/validate", json={"token": token})["valid"] is False


def test_acquire_without_waiting__on_a_held_lock__is_not_granted(api: ApiNode) -> None:
    holder, other = api.session(), api.session()
    api.ok("POST", "/v1/locks/lock-busy/acquire", json={"session_id": holder})
    refused = api.ok("POST", "/v1/locks/lock-busy/acquire", json={"session_id": other})
    assert (refused["granted"], refused["queued"], refused["holder"]) == (False, False, holder)
    assert _waiters(api, "lock-busy") == []


def test_release__by_a_session_that_does_not_hold_the_lock__is_409(api: ApiNode) -> None:
    session_id = api.session()
    refused = api.request(
        "POST", "/v1/locks/lock-not-held/release", json={"session_id": session_id}
    )
    assert (refused.status, refused.error_code) == (409, "lock.not_held")
    # The caller sees its own name, not the name as stored under its tenant's prefix.
    assert "'lock-not-held'" in refused.document["error"]["message"]
    assert "default/" not in refused.document["error"]["message"]


def test_waiting_acquire__is_granted_when_the_holder_releases(api: ApiNode) -> None:
    holder, waiter = api.session(), api.session()
    first = api.ok("POST", "/v1/locks/lock-handoff/acquire", json={"session_id": holder})

    async def body() -> Answer:
        waiting = asyncio.ensure_future(
            api.call(
                "POST", "/v1/locks/lock-handoff/acquire", json={"session_id": waiter, "wait_s": 5}
            )
        )
        await eventually(lambda: api.services.waiting == 1)
        await api.call("POST", "/v1/locks/lock-handoff/release", json={"session_id": holder})
        return await waiting

    granted = api.run(body())
    assert granted.status == 200
    assert (granted.document["granted"], granted.document["holder"]) == (True, waiter)
    assert granted.document["token"] > first["token"]
    assert api.ok("GET", "/v1/locks/lock-handoff")["holder"] == waiter
    assert api.services.waiting == 0


def test_waiting_acquire__that_times_out__leaves_the_queue(api: ApiNode) -> None:
    holder, waiter = api.session(), api.session()
    api.ok("POST", "/v1/locks/lock-timeout/acquire", json={"session_id": holder})
    answer = api.request(
        "POST", "/v1/locks/lock-timeout/acquire", json={"session_id": waiter, "wait_s": 0.2}
    )
    assert answer.status == 200
    assert (answer.document["granted"], answer.document["timed_out"]) == (False, True)
    assert _waiters(api, "lock-timeout") == []
    assert api.ok("GET", "/v1/locks/lock-timeout")["holder"] == holder


def test_waiting_acquire__whose_client_disconnects__leaves_the_queue(api: ApiNode) -> None:
    holder, waiter = api.session(), api.session()
    api.ok("POST", "/v1/locks/lock-gone/acquire", json={"session_id": holder})

    async def body() -> None:
        waiting = asyncio.ensure_future(
            api.call(
                "POST", "/v1/locks/lock-gone/acquire", json={"session_id": waiter, "wait_s": 5}
            )
        )
        await eventually(lambda: api.services.waiting == 1)
        # Cancelling the client's request closes its connection; the server's handler is
        # cancelled and leaves the queue in the background.
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await eventually(lambda: api.services.waiting == 0)

        def queue_left() -> bool:
            found: Any = api.store.replica.read(lambda machine: machine.locks["alpha/lock-gone"])
            return waiter not in found.waiters

        await eventually(queue_left)

    api.run(body())
    assert _waiters(api, "lock-gone") == []
    # The lock stays with its holder and is free once the holder lets go.
    api.ok("POST", "/v1/locks/lock-gone/release", json={"session_id": holder})
    assert api.request("GET", "/v1/locks/lock-gone").status == 404


def test_validate__with_a_token_that_is_not_positive__is_400(api: ApiNode) -> None:
    refused = api.request("POST", "/v1/locks/lock-any/validate", json={"token": 0})
    assert (refused.status, refused.error_code) == (400, "request.invalid")
