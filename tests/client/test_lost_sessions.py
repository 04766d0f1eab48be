"""What `client.lock()` and the keep-alives of its session do when the session cannot be kept
(found by a QA pass with paused nodes): a lock never granted says why, as `LockNotGranted`, and a
silent node does not hold a keep-alive up until the session expires.

Against scripted fake nodes (`tests/client/fake_node.py`), so every silence is on purpose.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.client.fake_node import FakeNode, FakeNodes, Reply
from xrcore.client import Client, LockNotGranted

pytestmark = pytest.mark.integration


def _session(ttl_ms: int) -> dict[str, Any]:
    return {"session_id": "s1", "ttl_ms": ttl_ms, "remaining_ms": ttl_ms, "granted_at_ms": 0}


_REVOKED = Reply(document={"session_id": "s1", "revoked": True})
_SESSION_GONE = Reply(
    status=404,
    document={
        "error": {
            "code": "not_found",
            "message": "session 's1' does not exist (it may have expired)",
            "definite": True,
        }
    },
)


def _lock_node(fakes: FakeNodes, *, ttl_ms: int, acquired: Reply, kept: Reply) -> FakeNode:
    return fakes.add(
        {
            "POST /v1/sessions": [Reply(status=201, document=_session(ttl_ms))],
            "POST /v1/locks/L/acquire": [acquired],
            "POST /v1/sessions/s1/keepalive": [kept],
            "DELETE /v1/sessions/s1": [_REVOKED],
        }
    )


def test_lock__session_revoked_while_waiting__is_not_granted_with_the_reason(
    fakes: FakeNodes,
) -> None:
    """The acquire's `NotFound` about a session the application never saw came out of
    `lock()` unchanged."""
    node = _lock_node(
        fakes, ttl_ms=30_000, acquired=_SESSION_GONE, kept=Reply(document=_session(30_000))
    )
    with (
        Client(node.url, timeout_s=5) as client,
        pytest.raises(LockNotGranted) as raised,
        client.lock("L", ttl_s=30, wait_s=20),
    ):
        pass
    assert raised.value.definite
    assert raised.value.message == (
        "lock 'L' was not granted: session s1 ended (revoked or expired) (the cluster answered: "
        "session 's1' does not exist (it may have expired))"
    )


def test_lock__session_not_kept_alive_while_waiting__is_not_granted_with_the_keepers_reason(
    fakes: FakeNodes,
) -> None:
    """The QA pass's case: the keep-alives could not get through within the TTL, the session
    expired while the acquire was still retried, and `lock()` raised the acquire's `NotFound`."""
    node = _lock_node(
        fakes,
        ttl_ms=1_000,
        acquired=Reply(status=404, document=_SESSION_GONE.document, delay_s=1.5),
        kept=Reply(delay_s=30.0),
    )
    with (
        Client(node.url, timeout_s=5) as client,
        pytest.raises(LockNotGranted) as raised,
        client.lock("L", ttl_s=1, wait_s=20),
    ):
        pass
    assert raised.value.message.startswith(
        "lock 'L' was not granted: no keep-alive of session s1 succeeded within its TTL of 1.0 s"
    ), raised.value.message
    assert "session 's1' does not exist" in raised.value.message


def test_lock__granted_after_its_session_was_lost__is_not_handed_out(fakes: FakeNodes) -> None:
    node = _lock_node(
        fakes,
        ttl_ms=1_000,
        acquired=Reply(
            document={"name": "L", "granted": True, "token": 4, "holder": "s1"}, delay_s=1.5
        ),
        kept=Reply(delay_s=30.0),
    )
    with (
        Client(node.url, timeout_s=5) as client,
        pytest.raises(LockNotGranted, match=r"within its TTL .*the grant \(token 4\) came later"),
        client.lock("L", ttl_s=1, wait_s=20),
    ):
        pass
    # The session is ended, so the lock passes on at once rather than at the end of the TTL.
    assert node.requests("DELETE /v1/sessions/s1")


def test_keepalive__two_silent_endpoints__reaches_the_third_within_the_ttl(
    fakes: FakeNodes,
) -> None:
    """Each silent endpoint took half the call's timeout (here 1 s of the 2 s left), so with two
    paused nodes of three the keep-alive never reached the live one before the TTL ran out: a
    try now has at most a third of the TTL shared among the endpoints."""
    ttl_ms = 3_000
    silent = [
        fakes.add(
            {
                "POST /v1/sessions": [Reply(status=201, document=_session(ttl_ms))],
                "POST /v1/sessions/s1/keepalive": [Reply(delay_s=30.0)],
                "DELETE /v1/sessions/s1": [_REVOKED],
            }
        )
        for _ in range(2)
    ]
    live = fakes.add(
        {
            "POST /v1/sessions/s1/keepalive": [Reply(document=_session(ttl_ms))],
            "DELETE /v1/sessions/s1": [_REVOKED],
        }
    )
    endpoints = [*(node.url for node in silent), live.url]
    with (
        Client(endpoints, timeout_s=5) as client,
        client.session(ttl_s=ttl_ms / 1000) as session,
    ):
        time.sleep(ttl_ms / 1000 + 0.5)
        assert not session.lost
    assert live.requests("POST /v1/sessions/s1/keepalive")


def test_keepalive__a_slow_answer_is_still_waited_for_at_least_half_a_second(
    fakes: FakeNodes,
) -> None:
    """A try's share of a short TTL has a floor, so a cluster that answers in 0.3 s (a write
    across regions) keeps a 1 s session with three endpoints (a third of the TTL shared among
    them is 0.11 s)."""
    node = fakes.add(
        {
            "POST /v1/sessions": [Reply(status=201, document=_session(1_000))],
            "POST /v1/sessions/s1/keepalive": [Reply(document=_session(1_000), delay_s=0.3)],
            "DELETE /v1/sessions/s1": [_REVOKED],
        }
    )
    with (
        Client([node.url, node.url, node.url], timeout_s=5) as client,
        client.session(ttl_s=1) as session,
    ):
        time.sleep(1.5)
        assert not session.lost
    assert node.requests("POST /v1/sessions/s1/keepalive")
