"""The locks resource through the app factory: acquire, release, show, validate, and waiting
acquires that are granted, time out, or lose their client, each leaving the queue as it should.

Waits are observed through the node's count of waiting requests, never through elapsed time."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import msgspec
import pytest

from node.api.app import SERVICES, create_app
from tests.node.conftest import Answer, ApiNode, eventually
from xrcore.commands import Command, LockLeave, LockRelease
from xrcore.errors import Timeout

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


@pytest.mark.parametrize("leave_command", [True, False], ids=["lock.leave", "lock.release"])
@pytest.mark.parametrize("ended", ["client gone", "timed out"])
def test_a_wait_that_ends_unanswered__never_releases_the_grant_its_session_got_elsewhere(
    api: ApiNode, monkeypatch: pytest.MonkeyPatch, leave_command: bool, ended: str
) -> None:
    """A client waits for a lock on node A; its connection to A breaks (or A's wait ends) and
    it retries the same session on node B, where the holder's release grants it the lock. Only
    then does A's leave reach the log (held back here, as a partition between A and the leader
    would). With `lock.leave` the session keeps its lock, and a wait on A that timed out
    answers the grant; with `lock.release` (the control, `http.lock_leave_command = false`)
    A's leave releases the lock B just handed out, and a third session gets it while the
    client believes it holds it. Node A is a second app on the same store."""
    config = dataclasses.replace(
        api.config,
        http=msgspec.structs.replace(api.config.http, lock_leave_command=leave_command),
    )
    node_a = create_app(config, store=api.store)
    holder, waiter, third = api.session(), api.session(), api.session()
    name = f"lock-stale-leave-{leave_command}-{ended.replace(' ', '-')}"
    api.ok("POST", f"/v1/locks/{name}/acquire", json={"session_id": holder})
    propose = api.store.propose
    held = {"arrived": asyncio.Event(), "go": asyncio.Event(), "applied": asyncio.Event()}

    async def held_back(command: Command, **options: Any) -> Any:
        leaving = isinstance(command, (LockLeave, LockRelease)) and command.session_id == waiter
        if not leaving:
            return await propose(command, **options)
        held["arrived"].set()
        await held["go"].wait()
        try:
            return await propose(command, **options)
        finally:
            held["applied"].set()

    async def body() -> tuple[Answer | None, Answer]:
        client_a = await api.serve(node_a)
        wait_s = 5 if ended == "client gone" else 0.3
        on_a = asyncio.ensure_future(
            api.call(
                "POST",
                f"/v1/locks/{name}/acquire",
                json={"session_id": waiter, "wait_s": wait_s},
                client=client_a,
            )
        )
        await eventually(lambda: node_a[SERVICES].waiting == 1)
        if ended == "client gone":
            on_a.cancel()
            await asyncio.gather(on_a, return_exceptions=True)
        await held["arrived"].wait()
        # The client's retry through node B, then the holder lets go: B grants.
        on_b = asyncio.ensure_future(
            api.call("POST", f"/v1/locks/{name}/acquire", json={"session_id": waiter, "wait_s": 5})
        )
        await eventually(lambda: api.services.waiting == 1)
        await api.call("POST", f"/v1/locks/{name}/release", json={"session_id": holder})
        granted = await on_b
        # Then A's leave reaches the log, and a third session asks for the lock.
        held["go"].set()
        await held["applied"].wait()
        answer_a = None if ended == "client gone" else await on_a
        await api.call("POST", f"/v1/locks/{name}/acquire", json={"session_id": third})
        return answer_a, granted

    monkeypatch.setattr(api.store, "propose", held_back)
    answer_a, granted = api.run(body())
    monkeypatch.undo()
    token = granted.document["token"]
    assert (granted.document["granted"], granted.document["holder"]) == (True, waiter)
    shown = api.ok("GET", f"/v1/locks/{name}")
    if leave_command:
        assert (shown["holder"], shown["token"]) == (waiter, token)
        if answer_a is not None:
            assert (answer_a.document["granted"], answer_a.document["token"]) == (True, token)
    else:
        # The control: the lock the client was told it holds went to the third session.
        assert shown["holder"] == third and shown["token"] > token
        if answer_a is not None:
            assert answer_a.document["granted"] is False
    for session in (holder, waiter, third):
        api.request("DELETE", f"/v1/sessions/{session}")


def test_a_wait_whose_leave_the_log_does_not_answer__is_not_answered_not_granted(
    api: ApiNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session is still queued and may yet be granted: the answer is the log's error, whose
    outcome is unknown, and not "not granted", after which a caller would not release."""
    holder, waiter = api.session(), api.session()
    api.ok("POST", "/v1/locks/lock-leave-lost/acquire", json={"session_id": holder})
    propose = api.store.propose

    async def leave_times_out(command: Command, **options: Any) -> Any:
        if isinstance(command, LockLeave):
            raise Timeout("the log did not answer in time (test)")
        return await propose(command, **options)

    monkeypatch.setattr(api.store, "propose", leave_times_out)
    answer = api.request(
        "POST", "/v1/locks/lock-leave-lost/acquire", json={"session_id": waiter, "wait_s": 0.2}
    )
    monkeypatch.undo()
    assert answer.status >= 500 and answer.document["error"]["definite"] is False, answer
    assert _waiters(api, "lock-leave-lost") == [waiter]
    for session in (holder, waiter):
        api.request("DELETE", f"/v1/sessions/{session}")
    assert api.request("GET", "/v1/locks/lock-leave-lost").status == 404
