"""Malformed and oversize requests through the app factory: each answers 4xx with a message that
names the problem, and changes nothing (the KV revision, the job list and lock queues are checked
before and after). Also the bound on waiting requests (429 with Retry-After)."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import msgspec
import pytest

from tests.node.conftest import BODY_BYTES_MAX, WAIT_MAX_S, Answer, ApiNode, eventually
from xrcore.limits import KEY_BYTES_MAX, VALUE_BYTES_MAX

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}
MSGPACK = {"Content-Type": "application/msgpack"}


# (method, path, body, headers, status, words the message contains)
MALFORMED: dict[str, tuple[str, str, bytes | None, dict[str, str], int, str]] = {
    "invalid JSON": ("PUT", "/v1/kv/limits-key", b'{"value": ', JSON, 400, "not valid JSON"),
    "invalid msgpack": ("PUT", "/v1/kv/limits-key", b"\xc1", MSGPACK, 400, "not valid msgpack"),
    "body not an object": ("PUT", "/v1/kv/limits-key", b'["value"]', JSON, 400, "an object"),
    "msgpack keys not text": (
        "PUT",
        "/v1/kv/limits-key",
        msgspec.msgpack.encode({1: "x"}),
        MSGPACK,
        400,
        "keys",
    ),
    "no body": ("PUT", "/v1/kv/limits-key", None, {}, 400, "needs a body"),
    # Nesting past the decoder's recursion was a 500 with a traceback in the log.
    "JSON nested too deeply": (
        "PUT",
        "/v1/kv/limits-key",
        b'{"value": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        JSON,
        400,
        "nested too deeply",
    ),
    "msgpack nested too deeply": (
        "PUT",
        "/v1/kv/limits-key",
        b"\x81\xa5value" + b"\x91" * 100_000 + b"\xc0",
        MSGPACK,
        400,
        "nested too deeply",
    ),
    # A small compressed body can inflate without end: the node takes none.
    "compressed body": (
        "PUT",
        "/v1/kv/limits-key",
        gzip.compress(b'{"value": "x"}'),
        {**JSON, "Content-Encoding": "gzip"},
        400,
        "not accepted compressed (Content-Encoding: gzip)",
    ),
    "unknown field": (
        "PUT",
        "/v1/kv/limits-key",
        b'{"value": "x", "ttl": 5}',
        JSON,
        400,
        "unknown field(s) ttl",
    ),
    "wrong type": ("PUT", "/v1/kv/limits-key", b'{"value": 5}', JSON, 400, "'value' must be"),
    "missing field": ("PUT", "/v1/kv/limits-key", b"{}", JSON, 400, "'value' is required"),
    "negative expected revision": (
        "PUT",
        "/v1/kv/limits-key",
        b'{"value": "x", "expected_mod_revision": -1}',
        JSON,
        400,
        "expected_mod_revision",
    ),
    "value over the size limit": (
        "PUT",
        "/v1/kv/limits-key",
        msgspec.json.encode({"value": "x" * (VALUE_BYTES_MAX + 1)}),
        JSON,
        413,
        "value is",
    ),
    "body over http.body_bytes_max": (
        "PUT",
        "/v1/kv/limits-key",
        msgspec.json.encode({"value": "x" * BODY_BYTES_MAX}),
        JSON,
        413,
        "http.body_bytes_max",
    ),
    "key over the size limit": (
        "PUT",
        "/v1/kv/" + "k" * KEY_BYTES_MAX,
        b'{"value": "x"}',
        JSON,
        400,
        "key is too long",
    ),
    "invalid base64": (
        "PUT",
        "/v1/kv/limits-key",
        b'{"value_base64": "not base64!"}',
        JSON,
        400,
        "not valid base64",
    ),
    "bad Xr-Seq": (
        "PUT",
        "/v1/kv/limits-key",
        b'{"value": "x"}',
        {**JSON, "Xr-Client-Id": "limits-client", "Xr-Seq": "first"},
        400,
        "Xr-Seq must be",
    ),
    "Xr-Seq below 1": (
        "PUT",
        "/v1/kv/limits-key",
        b'{"value": "x"}',
        {**JSON, "Xr-Client-Id": "limits-client", "Xr-Seq": "0"},
        400,
        "Xr-Seq must be",
    ),
    "Xr-Client-Id without Xr-Seq": (
        "PUT",
        "/v1/kv/limits-key",
        b'{"value": "x"}',
        {**JSON, "Xr-Client-Id": "limits-client"},
        400,
        "sent together",
    ),
    "bad Xr-Client-Id": (
        "PUT",
        "/v1/kv/limits-key",
        b'{"value": "x"}',
        {**JSON, "Xr-Client-Id": "no spaces allowed", "Xr-Seq": "1"},
        400,
        "Xr-Client-Id",
    ),
    "delete with a bad expected revision": (
        "DELETE",
        "/v1/kv/limits-key?expected_mod_revision=latest",
        None,
        {},
        400,
        "expected_mod_revision must be an integer",
    ),
    "session ttl of the wrong type": (
        "POST",
        "/v1/sessions",
        b'{"ttl_ms": "long"}',
        JSON,
        400,
        "'ttl_ms' must be an integer",
    ),
    "lock acquire without a session": (
        "POST",
        "/v1/locks/limits-lock/acquire",
        b"{}",
        JSON,
        400,
        "'session_id' is required",
    ),
    "lock wait below 0": (
        "POST",
        "/v1/locks/limits-lock/acquire",
        msgspec.json.encode({"session_id": "s1", "wait_s": -1}),
        JSON,
        400,
        "wait_s must be a number of seconds, 0 or more, got -1",
    ),
    "lock name over the size limit": (
        "POST",
        "/v1/locks/" + "n" * 200 + "/acquire",
        b'{"session_id": "s1"}',
        JSON,
        400,
        "lock name is too long",
    ),
    "transfer-leader with an unknown field": (
        "POST",
        "/v1/cluster/transfer-leader",
        b'{"region": "r0", "force": true}',
        JSON,
        400,
        "unknown field(s) force",
    ),
}


def _check_refused(answer: Answer, status: int, words: str) -> None:
    assert answer.status == status, answer.body
    error = answer.document["error"]
    assert error["definite"] is True
    assert words in error["message"], error["message"]


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_write__is_refused_with_a_clear_message_and_changes_nothing(
    api: ApiNode, case: str
) -> None:
    method, path, body, headers, status, words = MALFORMED[case]
    api.ok("PUT", "/v1/kv/limits-key", json={"value": "before"})
    revision = api.revision()
    sessions = api.store.replica.read(lambda machine: len(machine.sessions))

    token = "admin" if "transfer-leader" in path else "alpha"
    answer = api.request(method, path, body=body, headers=headers, token=token)

    _check_refused(answer, status, words)
    assert api.revision() == revision
    assert api.store.replica.read(lambda machine: len(machine.sessions)) == sessions
    assert api.ok("GET", "/v1/kv/limits-key")["value"] == "before"


JOB_CASES: dict[str, tuple[Any, str]] = {
    "unknown field": ({"name": "limits-job", "workload": "w", "cpus": 1}, "unknown job field"),
    "tenant given": ({"name": "limits-job", "workload": "w", "tenant": "beta"}, "tenant"),
    "missing name": ({"workload": "w"}, "name"),
    "wrong type": ({"name": "limits-job", "workload": "w", "array_size": "2"}, "array_size"),
    "out of bounds": ({"name": "limits-job", "workload": "w", "priority": 10_000}, "priority"),
    "args not an object": ({"name": "limits-job", "workload": "w", "args": "[1]"}, "args"),
    "body not an object": (["limits-job"], "an object"),
}


@pytest.mark.parametrize("case", sorted(JOB_CASES))
def test_malformed_job__is_refused_and_the_job_list_is_unchanged(api: ApiNode, case: str) -> None:
    body, words = JOB_CASES[case]
    before = api.ok("GET", "/v1/jobs?limit=1000")["items"]
    answer = api.request("POST", "/v1/jobs", json=body)
    _check_refused(answer, 400, words)
    assert api.ok("GET", "/v1/jobs?limit=1000")["items"] == before


def test_cancel__with_an_unknown_field__is_refused_and_the_job_stays_pending(
    api: ApiNode,
) -> None:
    job_id = api.ok("POST", "/v1/jobs", json={"name": "limits-cancel", "workload": "w"})["job_id"]
    answer = api.request("POST", f"/v1/jobs/{job_id}/cancel", json={"because": "typo"})
    _check_refused(answer, 400, "unknown field(s) because")
    assert api.ok("GET", f"/v1/jobs/{job_id}")["state"] == "pending"


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/v1/kv?limit=0", "limit must be between 1 and 1000"),
        ("/v1/kv?limit=1001", "limit must be between 1 and 1000"),
        ("/v1/kv?limit=ten", "limit must be an integer"),
        ("/v1/jobs?limit=1001", "limit must be between 1 and 1000"),
        ("/v1/jobs?state=sleeping", "state must be one of"),
        ("/v1/jobs?state=assigned", "state must be one of"),
        ("/v1/watch?from_revision=1&limit=0", "limit must be between 1 and 1000"),
        ("/v1/watch?from_revision=0", "from_revision must be between 1 and"),
        ("/v1/watch?from_revision=1&wait_s=-0.5", "wait_s must be a number of seconds, 0 or"),
        ("/v1/jobs/job-1?wait_s=-1", "wait_s must be a number of seconds, 0 or more"),
        ("/v1/jobs/job-1?wait_s=nan", "wait_s must be a number of seconds, 0 or more"),
        ("/v1/jobs/job-1?wait_s=soon", "query parameter wait_s must be a number, got 'soon'"),
        ("/v1/kv/limits-key?consistency=eventual", "consistency must be linearizable or stale"),
        ("/v1/kv?consistency=", "consistency must be linearizable or stale"),
        ("/v1/regions?consistency=strong", "consistency must be linearizable or stale"),
        ("/v1/kv?prefix=" + "p" * 1100, "prefix is longer than"),
    ],
)
def test_query_out_of_range__is_400_naming_the_parameter(
    api: ApiNode, path: str, words: str
) -> None:
    answer = api.request("GET", path)
    _check_refused(answer, 413 if "prefix" in path else 400, words)


def test_a_wait_longer_than_the_node_allows__is_served_as_its_longest(api: ApiNode) -> None:
    """A lock wait or a long poll may always end before the time asked (an event, the node
    stopping); one asking more than `http.wait_max_s` is served as that, not refused (it was
    400, and xr's client, which long-polls 20 s at a time, could not use a node with a shorter
    maximum): each answers that its wait ended. The lock's wait comes in the body, the watch's
    in the query (as the job wait's)."""
    holder, waiter = api.session(), api.session()
    api.ok("POST", "/v1/locks/limits-long/acquire", json={"session_id": holder})
    longer_s = WAIT_MAX_S * 1000
    lock = api.request(
        "POST", "/v1/locks/limits-long/acquire", json={"session_id": waiter, "wait_s": longer_s}
    )
    assert lock.status == 200, lock.body
    assert lock.document["granted"] is False and lock.document["timed_out"] is True
    # The waiter left the queue when its wait ended.
    assert api.ok("GET", "/v1/locks/limits-long")["waiters"] == []
    revision = api.ok("GET", "/v1/kv?prefix=limits-long/")["revision"]
    watch = api.request(
        "GET", f"/v1/watch?prefix=limits-long/&from_revision={revision + 1}&wait_s={longer_s}"
    )
    assert watch.status == 200, watch.body
    assert watch.document["events"] == []


def test_waiting_requests_beyond_the_maximum__get_429_with_retry_after_and_join_no_queue(
    api: ApiNode,
) -> None:
    """The node takes one waiting request (http.waiting_requests_max = 1): while a long poll
    waits, a waiting lock acquire and a waiting job get are refused, and the refused acquire
    leaves no place in the lock's queue."""
    holder, refused_waiter = api.session(), api.session()
    api.ok("POST", "/v1/locks/limits-queue/acquire", json={"session_id": holder})
    job_id = api.ok("POST", "/v1/jobs", json={"name": "limits-waiting", "workload": "w"})["job_id"]
    start = api.revision() + 1

    async def body() -> tuple[Answer, Answer, Answer]:
        watching = asyncio.ensure_future(
            api.call("GET", f"/v1/watch?prefix=limits-waiting/&from_revision={start}&wait_s=5")
        )
        await eventually(lambda: api.services.waiting == 1)
        acquire = await api.call(
            "POST",
            "/v1/locks/limits-queue/acquire",
            json={"session_id": refused_waiter, "wait_s": 2},
        )
        job = await api.call("GET", f"/v1/jobs/{job_id}?wait_s=2")
        await api.call("PUT", "/v1/kv/limits-waiting/done", json={"value": "x"})
        return acquire, job, await watching

    acquire, job, watched = api.run(body())
    for refused in (acquire, job):
        assert (refused.status, refused.error_code) == (429, "limit.capacity")
        assert refused.headers["Retry-After"] == "1"
    assert watched.status == 200
    assert api.ok("GET", "/v1/locks/limits-queue")["waiters"] == []
    # The holder lets go and nobody inherits the lock.
    api.ok("POST", "/v1/locks/limits-queue/release", json={"session_id": holder})
    assert api.request("GET", "/v1/locks/limits-queue").status == 404
