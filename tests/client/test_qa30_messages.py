"""What the client's errors say when a call gives up or a lock wait ends without the grant
(found by the QA pass 30): each names what is known and claims nothing that is not.

Against scripted fake nodes (`tests/client/fake_node.py`), so every answer is reached on purpose.
"""

from __future__ import annotations

import pytest

from tests.client.fake_node import FakeNodes, Reply, error, refused_url
from xrcore.client import Client, LockNotGranted
from xrcore.errors import ClusterUnavailable

pytestmark = pytest.mark.integration

_SESSION = {"session_id": "s1", "ttl_ms": 30_000, "remaining_ms": 30_000, "granted_at_ms": 0}
_TIMED_OUT = {"name": "held", "granted": False, "queued": False, "timed_out": True}
_QUORUM_HINT = "the cluster may have no quorum (see `xr cluster status`)"


def _lock_node(fakes: FakeNodes, acquired: Reply) -> str:
    node = fakes.add(
        {
            "POST /v1/sessions": [Reply(status=201, document=_SESSION)],
            "POST /v1/locks/held/acquire": [acquired],
            "POST /v1/sessions/s1/keepalive": [Reply(document=_SESSION)],
            "DELETE /v1/sessions/s1": [Reply(document={"session_id": "s1", "revoked": True})],
        }
    )
    return node.url


def test_lock_wait_that_times_out__names_no_holder_it_was_not_told(fakes: FakeNodes) -> None:
    """It said "held by session None": a wait that times out is answered without the holder."""
    url = _lock_node(fakes, Reply(document=_TIMED_OUT))
    with (
        Client(url, timeout_s=5) as client,
        pytest.raises(LockNotGranted) as raised,
        client.lock("held", ttl_s=20, wait_s=0.2),
    ):
        pass
    assert raised.value.message == "lock 'held' was not granted within 0.2 s"


def test_lock_not_granted__names_the_holder_when_the_answer_does(fakes: FakeNodes) -> None:
    answer = {"name": "held", "granted": False, "holder": "s9", "queued": True, "position": 1}
    url = _lock_node(fakes, Reply(document=answer))
    with (
        Client(url, timeout_s=5) as client,
        pytest.raises(LockNotGranted) as raised,
        client.lock("held", ttl_s=20, wait_s=0),
    ):
        pass
    assert raised.value.message == "lock 'held' was not granted within 0 s (held by session s9)"


@pytest.mark.parametrize(
    "answer",
    [
        error("cluster.timeout", 504, definite=False),
        Reply(
            status=503,
            document={
                "error": {
                    "code": "cluster.unavailable",
                    "message": "no leader is known; retry when the cluster has elected one",
                    "definite": True,
                }
            },
        ),
    ],
    ids=["log entry not answered", "no leader"],
)
def test_a_read_that_gives_up__makes_no_claim_of_nothing_applied_and_hints_at_quorum(
    fakes: FakeNodes, answer: Reply
) -> None:
    """A GET said "nothing was applied" (it applies nothing either way), and an answer that the
    log entry was not committed in time, or that no leader is known, gave no hint why."""
    node = fakes.add({"GET /v1/kv/k": [answer]})
    with Client(node.url, timeout_s=0.5) as client, pytest.raises(ClusterUnavailable) as raised:
        client.kv.get("k")
    message = raised.value.message
    assert message.startswith("GET /v1/kv/k: no node could serve it within 0.5 s (last: "), message
    assert "nothing was applied" not in message
    assert message.endswith(f"; {_QUORUM_HINT}"), message


def test_a_write_that_reached_no_node__still_says_nothing_was_applied() -> None:
    with (
        Client(refused_url(), timeout_s=0.5) as client,
        pytest.raises(ClusterUnavailable) as raised,
    ):
        client.kv.put("k", b"v")
    message = raised.value.message
    assert "no node could serve it within 0.5 s; nothing was applied (last: " in message
    # Refused connections say nothing of the cluster's quorum.
    assert _QUORUM_HINT not in message


def test_a_node_that_never_answers__is_named_with_a_reason(fakes: FakeNodes) -> None:
    """A paused node's try ends in a TimeoutError with no text: the error ended in
    "(last: http://...: TimeoutError )"."""
    node = fakes.add({"GET /v1/kv/k": [Reply(delay_s=30.0)]})
    with Client(node.url, timeout_s=2.0) as client, pytest.raises(ClusterUnavailable) as raised:
        client.kv.get("k")
    message = raised.value.message
    assert message.endswith(f"(last: {node.url}: no answer in time)"), message


def test_health_of_a_node_that_never_answers__gives_a_reason(fakes: FakeNodes) -> None:
    """`client.health()` of a paused node said "http://...: did not answer: " and stopped."""
    node = fakes.add({"GET /readyz": [Reply(delay_s=30.0)]})
    with Client(node.url, timeout_s=0.5) as client, pytest.raises(ClusterUnavailable) as raised:
        client.health()
    assert raised.value.message == f"{node.url} did not answer: no answer in time"


def test_mutual_tls_hint__a_reset_connection_gets_it_too() -> None:
    # A node requiring client certificates hangs up on one without: aiohttp reports it as a
    # disconnection or, as often on a loaded machine, a reset connection (a CI failure).
    import errno

    import aiohttp

    from xrcore.client._transport import Transport

    transport = Transport(["https://127.0.0.1:1"])
    for hung_up in (
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer"),
        aiohttp.ClientConnectionResetError("Cannot write to closing transport"),
    ):
        assert "requires client certificates" in transport._disconnection_hint(
            "https://127.0.0.1:1", hung_up
        ), hung_up
    assert (
        transport._disconnection_hint("http://127.0.0.1:1", aiohttp.ServerDisconnectedError()) == ""
    )
