"""The client's failover, retry and exactly-once rules, against scripted fake nodes.

Each test scripts what the nodes answer and then reads what the client sent: which endpoint, how
often, with which idempotency key. No cluster runs here, so every path (a refused endpoint, a
dropped connection, a 429 with Retry-After, a deadline) is reached on purpose, not by luck.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from tests.client.fake_node import DROP, FakeNodes, Reply, error, refused_url
from xrcore.client import AsyncClient, Client, LockLost, WatchEvent
from xrcore.client._transport import ANSWER_BYTES_MAX, Transport
from xrcore.errors import (
    CapacityExceeded,
    ClusterUnavailable,
    Compacted,
    CompareFailed,
    Overloaded,
    Timeout,
    XrError,
)

pytestmark = pytest.mark.integration

PUT_OK = Reply(document={"revision": 1, "previous_mod_revision": 0, "version": 1})


T = TypeVar("T")


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(scenario())


def test_failover__refused_endpoint_then_503__reaches_the_answer(fakes: FakeNodes) -> None:
    node = fakes.add({"PUT /v1/kv/k": [error("cluster.unavailable", 503, definite=True), PUT_OK]})

    async def scenario() -> None:
        async with AsyncClient([refused_url(), node.url], timeout_s=5) as client:
            result = await client.kv.put("k", "v")
        assert result.revision == 1

    run(scenario)
    tries = node.requests("PUT /v1/kv/k")
    assert len(tries) == 2
    assert tries[0].headers["Xr-Seq"] == tries[1].headers["Xr-Seq"]


def test_write__retried_after_a_dropped_connection__resends_the_same_key(
    fakes: FakeNodes,
) -> None:
    node = fakes.add({"PUT /v1/kv/k": [DROP, PUT_OK]})
    with Client(node.url, timeout_s=5, client_id="writer-1") as client:
        client.kv.put("k", "v")
        client.kv.put("k", "w")
    tries = node.requests("PUT /v1/kv/k")
    assert len(tries) == 3
    keys = [(item.headers["Xr-Client-Id"], int(item.headers["Xr-Seq"])) for item in tries]
    assert keys[0] == keys[1], "the retry must re-send the same (client id, seq)"
    assert keys[0][0] == "writer-1" and keys[2][0] == "writer-1"
    assert keys[2][1] > keys[1][1], "a new write draws a new seq"


def test_indefinite_error__is_retried_on_the_next_endpoint_with_the_same_key(
    fakes: FakeNodes,
) -> None:
    first = fakes.add({"PUT /v1/kv/k": [error("cluster.leader_changed", 503, definite=False)]})
    second = fakes.add({"PUT /v1/kv/k": [PUT_OK]})
    with Client([first.url, second.url], timeout_s=5) as client:
        client.kv.put("k", "v")
    sent = first.requests("PUT /v1/kv/k") + second.requests("PUT /v1/kv/k")
    assert len(sent) == 2
    assert len({item.headers["Xr-Seq"] for item in sent}) == 1


def test_definite_error__is_raised_at_once_as_its_own_class(fakes: FakeNodes) -> None:
    node = fakes.add({"PUT /v1/kv/k": [error("kv.compare_failed", 409, definite=True)]})
    with Client(node.url, timeout_s=5) as client, pytest.raises(CompareFailed) as raised:
        client.kv.put("k", "v", expected_mod_revision=3)
    assert raised.value.definite
    assert raised.value.message == "scripted kv.compare_failed"
    assert len(node.requests("PUT /v1/kv/k")) == 1


def test_429__waits_retry_after_then_retries(fakes: FakeNodes) -> None:
    node = fakes.add(
        {
            "PUT /v1/kv/k": [
                error("cluster.overloaded", 429, definite=True, retry_after="0.01"),
                PUT_OK,
            ]
        }
    )
    with Client(node.url, timeout_s=5) as client:
        client.kv.put("k", "v")
    tries = node.requests("PUT /v1/kv/k")
    assert len(tries) == 2
    assert tries[0].headers["Xr-Seq"] == tries[1].headers["Xr-Seq"]


def test_429__with_retry_after_past_the_deadline__raises_the_429(fakes: FakeNodes) -> None:
    node = fakes.add(
        {"PUT /v1/kv/k": [error("cluster.overloaded", 429, definite=True, retry_after="60")]}
    )
    with Client(node.url, timeout_s=1) as client, pytest.raises(Overloaded) as raised:
        client.kv.put("k", "v")
    assert raised.value.definite
    assert len(node.requests("PUT /v1/kv/k")) == 1


def test_429_without_retry_after__a_refusal_the_log_stored__is_raised_at_once(
    fakes: FakeNodes,
) -> None:
    # A tenant at its quota (or a full table) is refused by the state machine, and the refusal
    # is stored under the write's key: the client asked again for its whole timeout (10 s and
    # ten requests) to be told the same. The node sends such a 429 without Retry-After.
    node = fakes.add({"PUT /v1/kv/k": [error("limit.capacity", 429, definite=True), PUT_OK]})
    with Client(node.url, timeout_s=30) as client, pytest.raises(CapacityExceeded) as raised:
        client.kv.put("k", "v")
    assert raised.value.definite
    assert len(node.requests("PUT /v1/kv/k")) == 1


def test_deadline__nothing_answers__cluster_unavailable_is_definite() -> None:
    with (
        Client([refused_url(), refused_url()], timeout_s=0.3) as client,
        pytest.raises(ClusterUnavailable) as raised,
    ):
        client.kv.put("k", "v")
    assert raised.value.definite


def test_deadline__a_write_sent_without_answer__timeout_is_indefinite(fakes: FakeNodes) -> None:
    node = fakes.add({"PUT /v1/kv/k": [DROP]})
    with Client(node.url, timeout_s=0.5) as client, pytest.raises(Timeout) as raised:
        client.kv.put("k", "v")
    assert not raised.value.definite
    assert len(node.requests("PUT /v1/kv/k")) >= 2


def test_deadline__a_read_that_only_saw_leader_changes__is_unavailable(
    fakes: FakeNodes,
) -> None:
    node = fakes.add({"GET /v1/kv/k": [error("cluster.leader_changed", 503, definite=False)]})
    with Client(node.url, timeout_s=0.3) as client, pytest.raises(ClusterUnavailable):
        client.kv.get("k")


def test_reads__carry_no_idempotency_key_and_every_call_carries_the_token(
    fakes: FakeNodes,
) -> None:
    node = fakes.add(
        {
            "GET /v1/kv/k": [error("not_found", 404, definite=True)],
            "PUT /v1/kv/k": [PUT_OK],
        }
    )
    with Client(node.url, token="secret-token", timeout_s=5) as client:
        assert client.kv.get("k") is None
        client.kv.put("k", b"\x00\xff")
    read, write = node.seen
    assert "Xr-Seq" not in read.headers and "Xr-Client-Id" not in read.headers
    assert "Xr-Seq" in write.headers
    assert write.body == {"value_base64": "AP8="}
    assert all(item.headers["Authorization"] == "Bearer secret-token" for item in node.seen)


def test_answer_without_an_xr_error__5xx_is_retried_and_4xx_raised(fakes: FakeNodes) -> None:
    node = fakes.add(
        {
            "GET /v1/kv/a": [Reply(status=502, document="bad gateway"), Reply(document=_key("a"))],
            "GET /v1/kv/b": [Reply(status=418, document=None)],
        }
    )
    with Client(node.url, timeout_s=5) as client:
        found = client.kv.get("a")
        assert found is not None and found.value == b"a"
        with pytest.raises(XrError) as raised:
            client.kv.get("b")
    assert "418" in raised.value.message
    assert len(node.requests("GET /v1/kv/a")) == 2


def test_watch__resumes_after_a_dropped_poll_from_the_next_revision(fakes: FakeNodes) -> None:
    node = fakes.add(
        {
            "GET /v1/watch": [
                Reply(document=_events([5, 6], next_revision=7)),
                DROP,
                Reply(document=_events([7], next_revision=8)),
            ]
        }
    )

    async def scenario() -> list[WatchEvent]:
        async with AsyncClient(node.url, timeout_s=5) as client:
            watch = client.kv.watch("p/", from_revision=5)
            seen = [await anext(watch) for _ in range(3)]
            await watch.aclose()
            return seen

    seen = run(scenario)
    assert [event.revision for event in seen] == [5, 6, 7]
    polls = node.requests("GET /v1/watch")
    assert [poll.query["from_revision"] for poll in polls] == ["5", "7", "7"]
    assert all(poll.query["prefix"] == "p/" for poll in polls)
    assert all(0 < float(poll.query["wait_s"]) <= 20 for poll in polls)


def test_watch__an_outage_longer_than_retry_s__ends_it_with_how_long_it_retried(
    fakes: FakeNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xrcore.client import _api
    from xrcore.client._transport import REQUEST_ID_HEADER

    # Short polls keep the test short; the rule is the same at the default 20 s.
    monkeypatch.setattr(_api, "POLL_S", 0.5)
    node = fakes.add({"GET /v1/watch": [error("cluster.unavailable", 503, definite=False)]})

    async def scenario() -> None:
        async with AsyncClient(node.url, timeout_s=0.3, retry_s=1.0) as client:
            await anext(client.kv.watch("p/", from_revision=1))

    with pytest.raises(ClusterUnavailable) as raised:
        run(scenario)
    # The message says how long the loop retried and what it allows, not only the last call's
    # deadline.
    assert "gave up after" in raised.value.message
    assert "rides out an outage of 1 s" in raised.value.message
    # The first call had a whole poll (0.5 s + 0.3 s); the second was cut to what was left of
    # the 1 s allowance (at most 0.2 s of wait), and it was the last.
    calls: dict[str, list[float]] = {}
    for poll in node.requests("GET /v1/watch"):
        calls.setdefault(poll.headers[REQUEST_ID_HEADER], []).append(float(poll.query["wait_s"]))
    waits = list(calls.values())
    assert len(waits) == 2, waits
    assert waits[0][0] == 0.5
    assert all(wait <= 0.2 for wait in waits[1])


@contextlib.contextmanager
def _unaccepting_url() -> Iterator[str]:
    """An endpoint that never completes a connection: a listening socket whose queue of
    connections is full, so the kernel drops the next one's handshake and `connect` hangs."""
    server = socket.socket()
    fillers: list[socket.socket] = []
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield f"http://127.0.0.1:{port}"
    finally:
        for filler in fillers:
            filler.close()
        server.close()


@pytest.mark.parametrize("endpoint", ["refusing", "unaccepting"])
def test_long_polls__with_no_node_reached__have_the_call_timeout_alone(endpoint: str) -> None:
    """Against endpoints that refuse connections, a watch's or `jobs.wait`'s first poll retried
    for its whole 20 s wait plus the timeout (22 s where `retry_s` asked for 3): nothing waits
    on a node that never took the request. Nor on one whose connection never completes: a try
    that ran out of time before its request was sent read as a node that took the request (a CI
    failure on a loaded machine, where connecting to a refusing port took longer than the try)."""
    with contextlib.ExitStack() as stack:
        url = refused_url() if endpoint == "refusing" else stack.enter_context(_unaccepting_url())

        async def scenario(call: Callable[[AsyncClient], Awaitable[Any]]) -> str:
            async with AsyncClient(url, timeout_s=0.5, retry_s=0.1) as client:
                with pytest.raises(ClusterUnavailable) as raised:
                    await call(client)
            return raised.value.message

        for call in (
            lambda client: anext(client.kv.watch("p/", from_revision=1)),
            lambda client: client.jobs.wait("job-1"),
        ):
            message = run(functools.partial(scenario, call))
            assert "no node could serve it within 0.5 s" in message, message


def test_lock_acquire__wait_ended_early_by_the_node__joins_again_with_a_new_key(
    fakes: FakeNodes,
) -> None:
    node = fakes.add(
        {
            "POST /v1/locks/L/acquire": [
                Reply(document={"name": "L", "granted": False, "queued": False, "timed_out": True}),
                Reply(document={"name": "L", "granted": True, "token": 7, "holder": "s1"}),
            ]
        }
    )
    with Client(node.url, timeout_s=5) as client:
        result = client.locks.acquire("L", "s1", wait_s=5)
    assert result.granted and result.token == 7
    first, second = node.requests("POST /v1/locks/L/acquire")
    assert first.headers["Xr-Seq"] != second.headers["Xr-Seq"]
    assert 0 < second.body["wait_s"] <= first.body["wait_s"] <= 5


def test_jobs_wait__long_polls_until_the_job_finishes(fakes: FakeNodes) -> None:
    node = fakes.add(
        {"GET /v1/jobs/job-1": [Reply(document=_job("pending")), Reply(document=_job("failed"))]}
    )
    with Client(node.url, timeout_s=5) as client:
        job = client.jobs.wait("job-1", timeout_s=30)
    assert job.state == "failed" and job.finished
    polls = node.requests("GET /v1/jobs/job-1")
    assert len(polls) == 2 and all(float(poll.query["wait_s"]) > 0 for poll in polls)


def test_lock_block__keepalive_not_found__marks_the_lease_lost(fakes: FakeNodes) -> None:
    session = {"session_id": "s1", "ttl_ms": 1500, "remaining_ms": 1500, "granted_at_ms": 0}
    node = fakes.add(
        {
            "POST /v1/sessions": [Reply(status=201, document=session)],
            "POST /v1/locks/L/acquire": [
                Reply(document={"name": "L", "granted": True, "token": 3, "holder": "s1"})
            ],
            "POST /v1/sessions/s1/keepalive": [error("not_found", 404, definite=True)],
            "DELETE /v1/sessions/s1": [error("not_found", 404, definite=True)],
        }
    )

    async def scenario() -> None:
        async with AsyncClient(node.url, timeout_s=5) as client:
            with pytest.raises(LockLost):
                async with client.lock("L", ttl_s=1.5) as lease:
                    assert lease.token == 3 and not lease.lost
                    while not lease.lost:
                        await asyncio.sleep(0.02)
                    with pytest.raises(LockLost):
                        lease.check()

    run(scenario)
    assert len(node.requests("POST /v1/sessions/s1/keepalive")) == 1


def test_deadline_with_a_leader_change_on_every_try__raises_timeout_for_a_write(
    fakes: FakeNodes,
) -> None:
    node = fakes.add({"*": [error("cluster.leader_changed", 503, definite=False)]})
    with Client(node.url, timeout_s=0.3) as client, pytest.raises(Timeout):
        client.sessions.grant(5)


def _key(key: str) -> dict[str, Any]:
    return {
        "key": key,
        "value": key,
        "value_base64": base64.b64encode(key.encode()).decode(),
        "create_revision": 1,
        "mod_revision": 1,
        "version": 1,
        "session_id": None,
        "revision": 1,
        "stale": False,
    }


def _events(revisions: list[int], *, next_revision: int) -> dict[str, Any]:
    events = [
        {
            "revision": revision,
            "kind": "put",
            "key": f"p/{revision}",
            "value": "v",
            "value_base64": "dg==",
            "create_revision": revision,
            "version": 1,
        }
        for revision in revisions
    ]
    return {"events": events, "next_revision": next_revision, "revision": next_revision - 1}


def _job(state: str) -> dict[str, Any]:
    return {
        "job_id": "job-1",
        "name": "j",
        "tenant": "default",
        "state": state,
        "priority": 0,
        "submitted_at_ms": 1,
        "array_size": 1,
        "cancel_reason": None,
        "tasks": [{"index": 0, "state": state, "attempts": []}],
        "stale": False,
    }


def test_watch__behind_the_retained_history__raises_compacted(fakes: FakeNodes) -> None:
    node = fakes.add({"GET /v1/watch": [error("kv.compacted", 410, definite=True)]})
    with Client(node.url, timeout_s=5) as client, pytest.raises(Compacted):
        next(iter(client.kv.watch("p/", from_revision=1)))


def test_one_client_shared_by_threads__draws_a_distinct_seq_for_every_write(
    fakes: FakeNodes,
) -> None:
    node = fakes.add({"*": [PUT_OK]})
    with Client(node.url, timeout_s=5) as client:

        def write_five(thread: int) -> None:
            for position in range(5):
                client.kv.put(f"k{thread}-{position}", "v")

        threads = [threading.Thread(target=write_five, args=(number,)) for number in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    seqs = [item.headers["Xr-Seq"] for item in node.seen]
    assert len(seqs) == 20 and len(set(seqs)) == 20


def test_closing_a_client__ends_a_watch_another_thread_is_blocked_in(fakes: FakeNodes) -> None:
    node = fakes.add({"GET /v1/watch": [Reply(document=_events([], next_revision=1), delay_s=5)]})
    outcome: list[BaseException | None] = []
    client = Client(node.url, timeout_s=5)

    def follow() -> None:
        try:
            next(iter(client.kv.watch("p/", from_revision=1)))
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=follow)
    thread.start()
    deadline_s = time.monotonic() + 10
    while not node.seen and time.monotonic() < deadline_s:
        time.sleep(0.01)
    client.close()
    thread.join(10)
    assert not thread.is_alive(), "the watching thread is stuck after close()"
    # The close's own error (a read: nothing was applied), not an outage to ride out.
    assert outcome and isinstance(outcome[0], ClusterUnavailable), outcome
    assert "the client was closed while this call ran" in str(outcome[0])


def test_non_finite_numbers__are_refused_before_anything_is_sent(fakes: FakeNodes) -> None:
    """JSON has no NaN or infinity, and the encoder would send null, which the API reads as "not
    given": a NaN weight would quietly become the tenant's."""
    node = fakes.add(
        {"POST /v1/jobs": [Reply(status=201, document={"job_id": "job-1", "tasks": 1})]}
    )

    async def scenario() -> None:
        async with AsyncClient([node.url], timeout_s=5) as client:
            with pytest.raises(ValueError, match=r"body\.cost_weight: nan is not a finite"):
                await client.jobs.submit("j", workload="w", cost_weight=float("nan"))
            with pytest.raises(ValueError, match=r"body\.args\.lr: inf is not a finite"):
                await client.jobs.submit("j", workload="w", args={"lr": float("inf")})
            assert await client.jobs.submit("j", workload="w", cost_weight=0.5) == "job-1"
            with pytest.raises(ValueError, match="timeout_s must be a number of seconds"):
                await client.jobs.wait("job-1", timeout_s=float("nan"))
            with pytest.raises(ValueError, match="wait_s must be a number of seconds"):
                await client.locks.acquire("l", "session-1", wait_s=float("nan"))

    run(scenario)
    assert len(node.requests("POST /v1/jobs")) == 1
    for timeout_s in (float("nan"), float("inf"), 0.0):
        with pytest.raises(ValueError, match="timeout_s must be a positive number"):
            AsyncClient([node.url], timeout_s=timeout_s)


# Answers too long to read: an endpoint that is not an xr node, or a broken one, sending without
# end must not take the caller's memory.

_BOUND = 1 << 20
_ENDLESS = 256 << 20


def test_answer_longer_than_the_bound__is_dropped_unread_and_the_next_endpoint_answers(
    fakes: FakeNodes,
) -> None:
    endless = fakes.add({"GET /v1/kv/k": [Reply(stream_bytes=_ENDLESS)]})
    node = fakes.add({"GET /v1/kv/k": [Reply(document={"key": "k"})]})

    async def scenario() -> Any:
        transport = Transport([endless.url, node.url], timeout_s=10, answer_bytes_max=_BOUND)
        try:
            return await transport.call("GET", "/v1/kv/k")
        finally:
            await transport.close()

    assert run(scenario) == {"key": "k"}
    # What the reader took before it closed: its bound and the sockets' buffers, not the rest.
    assert endless.streamed < _ENDLESS // 4, endless.streamed


def test_answer_announced_longer_than_the_bound__fails_the_try_by_name(fakes: FakeNodes) -> None:
    endless = fakes.add({"GET /v1/kv/k": [Reply(stream_bytes=_ENDLESS, announced=True)]})

    async def scenario() -> None:
        transport = Transport([endless.url], timeout_s=1, answer_bytes_max=_BOUND)
        try:
            await transport.call("GET", "/v1/kv/k")
        finally:
            await transport.close()

    with pytest.raises(ClusterUnavailable, match=r"longer than 1048576 bytes \(answer_bytes_max\)"):
        run(scenario)
    assert endless.streamed < _ENDLESS // 4, endless.streamed


def test_answer_bytes_max__defaults_to_a_gibibyte_and_must_be_a_positive_int() -> None:
    assert Transport("127.0.0.1:1").answer_bytes_max == ANSWER_BYTES_MAX == 1 << 30
    for bad in (0, -1):
        with pytest.raises(ValueError, match="answer_bytes_max must be a positive number"):
            Transport("127.0.0.1:1", answer_bytes_max=bad)
    for wrong in (True, 1.5, None):
        with pytest.raises(TypeError, match="answer_bytes_max must be an int"):
            Transport("127.0.0.1:1", answer_bytes_max=wrong)  # type: ignore[arg-type]
