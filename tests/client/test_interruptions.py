"""What code inside a lock block or a stream sees when the client is closed under it, or when a
blocking call is interrupted (KeyboardInterrupt, an exception from a signal handler).

A closed client no longer keeps its sessions alive, so their locks pass on: the block must hear
that its lock is lost, not go on believing it holds it. An interrupted `next()` of a watch must
not make the watch look finished.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

import pytest

from tests.client.fake_node import FakeNode, FakeNodes, Reply, error, refused_url
from xrcore.client import AsyncClient, Client, LockLost, SessionLost
from xrcore.errors import ClusterUnavailable, Compacted, UnknownOutcome

pytestmark = pytest.mark.integration

# A bound on waits for a condition that normally holds within milliseconds.
WAIT_S = 10.0
_SESSION = {"session_id": "s1", "ttl_ms": 30_000, "remaining_ms": 30_000, "granted_at_ms": 0}


def _lock_node(fakes: FakeNodes) -> FakeNode:
    return fakes.add(
        {
            "POST /v1/sessions": [Reply(status=201, document=_SESSION)],
            "POST /v1/locks/L/acquire": [
                Reply(document={"name": "L", "granted": True, "token": 3, "holder": "s1"})
            ],
            "POST /v1/sessions/s1/keepalive": [Reply(document={**_SESSION, "locks": ["L"]})],
            "DELETE /v1/sessions/s1": [Reply(document={"session_id": "s1", "revoked": True})],
        }
    )


def _wait_until(condition: Any, what: str) -> None:
    deadline_s = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline_s:
            raise AssertionError(f"{what}: not within {WAIT_S} s")
        time.sleep(0.01)


# Closing the client inside a block.


def test_client_closed_by_another_thread__the_lease_inside_the_block_is_lost(
    fakes: FakeNodes,
) -> None:
    node = _lock_node(fakes)
    client = Client(node.url, timeout_s=5)
    entered = threading.Event()
    closed = threading.Event()
    seen: dict[str, Any] = {}

    def hold() -> None:
        try:
            with client.lock("L", ttl_s=30) as lease:
                entered.set()
                closed.wait(WAIT_S)
                seen["lost"] = lease.lost
                try:
                    lease.check()
                except LockLost as lost:
                    seen["check"] = lost
        except BaseException as error:
            seen["exit"] = error

    holder = threading.Thread(target=hold)
    holder.start()
    assert entered.wait(WAIT_S)
    client.close()
    closed.set()
    holder.join(WAIT_S)
    assert seen["lost"] is True
    assert "the client was closed" in str(seen["check"])
    # Leaving the block raises LockLost, as for any lost lock (not "the client is closed").
    assert isinstance(seen["exit"], LockLost), seen["exit"]
    assert "lock 'L' (token 3) is lost: the client was closed" in str(seen["exit"])


def test_client_closed_inside_a_session_block__check_and_exit_raise_session_lost(
    fakes: FakeNodes,
) -> None:
    node = _lock_node(fakes)
    client = Client(node.url, timeout_s=5)
    with (
        pytest.raises(SessionLost, match="the client was closed"),
        client.session(ttl_s=30) as session,
    ):
        client.close()
        assert session.lost
        with pytest.raises(SessionLost, match="no longer kept alive"):
            session.check()


def test_client_closed_inside_a_block_that_raised__keeps_its_error_with_a_note(
    fakes: FakeNodes,
) -> None:
    node = _lock_node(fakes)
    client = Client(node.url, timeout_s=5)
    with pytest.raises(ValueError, match="own") as raised, client.lock("L", ttl_s=30):
        client.close()
        raise ValueError("own")
    assert any("the client was closed" in note for note in raised.value.__notes__)


def test_async_client_closed_inside_a_lock_block__check_and_exit_raise_lock_lost(
    fakes: FakeNodes,
) -> None:
    node = _lock_node(fakes)

    async def scenario() -> None:
        client = AsyncClient(node.url, timeout_s=5)
        with pytest.raises(LockLost, match="the client was closed"):
            async with client.lock("L", ttl_s=30) as lease:
                await client.close()
                assert lease.lost
                with pytest.raises(LockLost):
                    lease.check()

    asyncio.run(scenario())


# Closing the client under a call.


def _close_during(client: Client, node: FakeNode | None, call: Any) -> BaseException:
    """What `call()`, run in another thread, raises when `client` is closed once `node` has
    seen its request (without a node: after a moment of retries)."""
    outcome: list[BaseException] = []

    def run_call() -> None:
        try:
            call()
        except BaseException as error:
            outcome.append(error)

    caller = threading.Thread(target=run_call)
    caller.start()
    if node is None:
        time.sleep(0.3)
    else:
        _wait_until(lambda: node.seen, "the request reached the node")
    closed_s = time.monotonic()
    client.close()
    caller.join(WAIT_S)
    assert not caller.is_alive(), "the call is stuck after close()"
    assert time.monotonic() - closed_s < 2.0
    assert len(outcome) == 1, "the call returned"
    return outcome[0]


def test_client_closed_while_a_write_waits_for_a_paused_node__raises_an_indefinite_error(
    fakes: FakeNodes,
) -> None:
    """It raised `RuntimeError: the client was closed while this call ran`, and the write was
    applied once the node resumed: an application that catches `XrError` never saw it."""
    node = fakes.add({"PUT /v1/kv/k": [Reply(delay_s=30.0)]})
    client = Client(node.url, timeout_s=10)
    raised = _close_during(client, node, lambda: client.kv.put("k", "v"))
    assert isinstance(raised, UnknownOutcome), repr(raised)
    assert not raised.definite
    assert raised.message.startswith(
        "PUT /v1/kv/k: the client was closed while this call ran; it may or may not have been "
        "applied"
    ), raised.message


def test_client_closed_while_a_write_reached_no_node__raises_a_definite_error() -> None:
    client = Client(refused_url(), timeout_s=30)
    raised = _close_during(client, None, lambda: client.kv.put("k", "v"))
    assert isinstance(raised, ClusterUnavailable), repr(raised)
    assert raised.definite
    assert "the client was closed while this call ran; nothing was applied" in raised.message


@pytest.mark.parametrize("reached", [True, False], ids=["sent", "not sent"])
def test_async_client_closed_while_a_write_runs__raises_an_error_that_says_if_it_applied(
    fakes: FakeNodes, reached: bool
) -> None:
    """`AsyncClient` raised `RuntimeError: the client is closed` from the call's next try."""
    url = fakes.add({"PUT /v1/kv/k": [Reply(delay_s=30.0)]}).url if reached else refused_url()

    async def scenario() -> BaseException:
        client = AsyncClient(url, timeout_s=30)
        put = asyncio.ensure_future(client.kv.put("k", "v"))
        await asyncio.sleep(0.3)
        await client.close()
        async with asyncio.timeout(2.0):
            (outcome,) = await asyncio.gather(put, return_exceptions=True)
        assert isinstance(outcome, BaseException), "the write returned"
        return outcome

    raised = asyncio.run(scenario())
    assert isinstance(raised, UnknownOutcome if reached else ClusterUnavailable), repr(raised)
    assert raised.definite is not reached
    assert "the client was closed while this call ran" in raised.message


def test_a_call_made_after_close__raises_runtime_error(fakes: FakeNodes) -> None:
    node = _lock_node(fakes)

    async def scenario() -> None:
        client = AsyncClient(node.url, timeout_s=5)
        await client.close()
        with pytest.raises(RuntimeError, match="the client is closed"):
            await client.kv.put("k", "v")

    asyncio.run(scenario())
    assert not node.seen


# Interrupted streams.


class Interrupted(Exception):
    """Raised by the test's signal handler."""


def _events(revisions: list[int], *, next_revision: int) -> dict[str, Any]:
    events = [
        {
            "revision": revision,
            "kind": "put",
            "key": f"p/{revision}",
            "value_base64": "dg==",
            "create_revision": revision,
            "version": 1,
        }
        for revision in revisions
    ]
    return {"events": events, "next_revision": next_revision}


def test_watch_interrupted_by_a_signal_handler__the_next_next_takes_up_the_same_poll(
    fakes: FakeNodes,
) -> None:
    node = fakes.add(
        {
            "GET /v1/watch": [
                # Long enough that the signal arrives while the poll waits.
                Reply(document=_events([5], next_revision=6), delay_s=1.0),
                Reply(document=_events([6], next_revision=7)),
            ]
        }
    )

    def interrupt(signal_number: int, frame: FrameType | None) -> None:
        raise Interrupted

    def send_when_polled() -> None:
        _wait_until(lambda: bool(node.seen), "the first poll")
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with Client(node.url, timeout_s=5) as client, client.kv.watch("p/", from_revision=1) as w:
            sender = threading.Thread(target=send_when_polled)
            sender.start()
            with pytest.raises(Interrupted):
                next(w)
            sender.join(WAIT_S)
            assert next(w).revision == 5
            assert next(w).revision == 6
    finally:
        signal.signal(signal.SIGUSR1, previous)
    # The interrupted poll was not sent again, nor any event skipped.
    assert [poll.query["from_revision"] for poll in node.requests("GET /v1/watch")][:2] == [
        "1",
        "6",
    ]


def test_stream_that_raised_its_own_error__does_not_look_finished_after(fakes: FakeNodes) -> None:
    node = fakes.add({"GET /v1/watch": [error("kv.compacted", 410, definite=True)]})
    with Client(node.url, timeout_s=5) as client:
        watch = client.kv.watch("p/", from_revision=1)
        with pytest.raises(Compacted):
            next(watch)
        with pytest.raises(RuntimeError, match="this stream ended with Compacted") as raised:
            next(watch)
        assert isinstance(raised.value.__cause__, Compacted)
        watch.close()
        with pytest.raises(StopIteration):
            next(watch)
