"""Bad arguments to the client are refused before anything is sent, naming the argument.

A wrong type raises TypeError; a value the cluster would refuse raises the `InvalidArgument` (or
`PayloadTooLarge`) it would answer, from the same `xrcore` checks; a bad client setting (a wait,
a timeout, an endpoint, a TLS file) raises ValueError, and a lone surrogate UnicodeEncodeError
(a ValueError, which the command line reports as a usage error). Every case runs against a fake
node that would answer anything, and the test reads that nothing reached it: a refused call
costs no round trip and changes nothing (a refused `client.lock()` grants no session). The sweep
these come from is described in docs/robustness.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import pytest

from tests.client.fake_node import FakeNodes, Reply
from xrcore.client import AsyncClient, Client
from xrcore.errors import InvalidArgument, PayloadTooLarge

pytestmark = pytest.mark.integration

NAN = float("nan")
# The client as Any: the calls pass what their signatures do not allow, on purpose.
Call = Callable[[Any], Awaitable[Any]]


def _deep(levels: int) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for _ in range(levels):
        nested = {"a": nested}
    return nested


async def _enter(block: Any) -> None:
    async with block:
        pass


# (call, the error, a pattern its message must match: the argument's name).
CASES: dict[str, tuple[Call, type[Exception], str]] = {
    "kv.get key int": (lambda c: c.kv.get(7), TypeError, "key must be a str"),
    "kv.put key surrogate": (
        lambda c: c.kv.put("\udcff", "v"),
        UnicodeEncodeError,
        "key is not valid UTF-8",
    ),
    "kv.put key 100,000 chars": (
        lambda c: c.kv.put("k" * 100_000, "v"),
        PayloadTooLarge,
        "key is 100000 bytes",
    ),
    "kv.put value None": (lambda c: c.kv.put("k", None), TypeError, "value must be bytes"),
    "kv.put value over the limit": (
        lambda c: c.kv.put("k", b"x" * 70_000),
        PayloadTooLarge,
        "value is 70000",
    ),
    "kv.put value surrogate": (
        lambda c: c.kv.put("k", "\udcff"),
        UnicodeEncodeError,
        "value is not valid UTF-8",
    ),
    "kv.put session_id list": (
        lambda c: c.kv.put("k", "v", session_id=["s"]),
        TypeError,
        "session_id",
    ),
    "kv.get consistency unknown": (
        lambda c: c.kv.get("k", consistency="strong"),
        InvalidArgument,
        "consistency",
    ),
    "kv.delete expected_mod_revision float": (
        lambda c: c.kv.delete("k", expected_mod_revision=1.5),
        TypeError,
        "expected_mod_revision",
    ),
    "kv.range prefix None": (lambda c: c.kv.range(None), TypeError, "prefix must be a str"),
    "kv.range limit bool": (
        lambda c: c.kv.range("", limit=True),
        TypeError,
        "limit must be an int",
    ),
    "kv.range limit 0": (
        lambda c: c.kv.range("", limit=0),
        InvalidArgument,
        "limit must be between",
    ),
    "kv.list prefix bytes": (lambda c: anext(c.kv.list(b"a")), TypeError, "prefix must be a str"),
    "kv.watch from_revision 2**64": (
        lambda c: anext(c.kv.watch("", from_revision=2**64)),
        InvalidArgument,
        "from_revision",
    ),
    "sessions.grant ttl_s str": (
        lambda c: c.sessions.grant("10"),
        TypeError,
        "ttl_s must be a number",
    ),
    "sessions.grant ttl_s inf": (lambda c: c.sessions.grant(float("inf")), ValueError, "ttl_s"),
    "sessions.grant ttl_s 1e308": (
        lambda c: c.sessions.grant(1e308),
        InvalidArgument,
        "ttl_s must be between",
    ),
    "sessions.keepalive session_id int": (
        lambda c: c.sessions.keepalive(7),
        TypeError,
        "session_id",
    ),
    "sessions.get session_id NUL": (
        lambda c: c.sessions.get("a\x00b"),
        InvalidArgument,
        "session_id",
    ),
    "locks.acquire wait_s negative": (
        lambda c: c.locks.acquire("l", "s-1", wait_s=-1),
        ValueError,
        "wait_s",
    ),
    "locks.acquire session_id None": (
        lambda c: c.locks.acquire("l", None),
        TypeError,
        "session_id",
    ),
    "locks.validate token bool": (
        lambda c: c.locks.validate("l", True),
        TypeError,
        "token must be an int",
    ),
    "jobs.submit gpus bool": (
        lambda c: c.jobs.submit("j", workload="w", gpus=True),
        TypeError,
        r"\$\.gpus",
    ),
    "jobs.submit name surrogate": (
        lambda c: c.jobs.submit("\udcff", workload="w"),
        UnicodeEncodeError,
        "name is not valid UTF-8",
    ),
    "jobs.submit args nested deeper than the stack": (
        lambda c: c.jobs.submit("j", workload="w", args=_deep(100_000)),
        ValueError,
        r"body\.args: nested too deeply",
    ),
    # What JSON's encoder would change rather than refuse (found by the job author's QA pass).
    "jobs.submit args bytes": (
        lambda c: c.jobs.submit("j", workload="w", args={"a": b"x"}),
        TypeError,
        "args must be a JSON object: Object of type bytes",
    ),
    "jobs.submit args bytes beside a field this client does not know": (
        lambda c: c.jobs.submit("j", workload="w", args={"a": b"x"}, future_field=1),
        TypeError,
        "args must be a JSON object: Object of type bytes",
    ),
    "jobs.submit args NaN": (
        lambda c: c.jobs.submit("j", workload="w", args={"a": float("nan")}),
        ValueError,
        r"body\.args\.a: nan is not a finite number",
    ),
    "jobs.submit args list": (
        lambda c: c.jobs.submit("j", workload="w", args=[1, 2]),
        TypeError,
        r"args must be a JSON object \(a dict\), not list",
    ),
    "jobs.submit args over the limit": (
        lambda c: c.jobs.submit("j", workload="w", args={"a": "x" * 70_000}),
        PayloadTooLarge,
        "args",
    ),
    "jobs.get job_id dict": (lambda c: c.jobs.get({}), TypeError, "job_id"),
    "jobs.list state int": (lambda c: c.jobs.list(state=1), TypeError, "state"),
    "jobs.cancel reason None": (lambda c: c.jobs.cancel("job-1", reason=None), TypeError, "reason"),
    "jobs.logs task_index str": (
        lambda c: c.jobs.logs("job-1", task_index="0"),
        TypeError,
        "task_index",
    ),
    "jobs.wait timeout_s str": (
        lambda c: c.jobs.wait("job-1", timeout_s="1"),
        TypeError,
        "timeout_s",
    ),
    "regions.get name surrogate": (
        lambda c: c.regions.get("\udcff"),
        UnicodeEncodeError,
        "name is not valid UTF-8",
    ),
    "tenants.set weight None": (lambda c: c.tenants.set("t", weight=None), TypeError, "weight"),
    "tenants.set cost_weight 1e308": (
        lambda c: c.tenants.set("t", cost_weight=1e308),
        InvalidArgument,
        "cost_weight",
    ),
    "cluster.transfer_leader region None": (
        lambda c: c.cluster.transfer_leader(None),
        TypeError,
        "region",
    ),
    "session() ttl_s NaN": (lambda c: _enter(c.session(ttl_s=NAN)), ValueError, "ttl_s"),
    "lock() wait_s NaN": (lambda c: _enter(c.lock("l", wait_s=NAN)), ValueError, "wait_s"),
    "lock() name int": (lambda c: _enter(c.lock(7)), TypeError, "name must be a str"),
    "lock() ttl_s 0": (
        lambda c: _enter(c.lock("l", ttl_s=0)),
        InvalidArgument,
        "ttl_s must be between",
    ),
}


@pytest.fixture(scope="module")
def fakes() -> Iterator[FakeNodes]:
    nodes = FakeNodes()
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_argument__is_refused_by_name_before_anything_is_sent(
    fakes: FakeNodes, case: str
) -> None:
    call, error, message = CASES[case]
    # A node that would grant anything: a call that reached it would not fail here.
    node = fakes.add({"*": [Reply(document={})]})

    async def scenario() -> None:
        async with AsyncClient([node.url], timeout_s=2, retry_s=1) as client:
            with pytest.raises(error, match=message):
                await call(client)

    asyncio.run(scenario())
    assert node.seen == []


def test_jobs_wait__timeout_0__returns_a_finished_job_after_one_look(fakes: FakeNodes) -> None:
    """It raised Timeout without asking, even for a job that had finished long ago."""
    job = {
        "job_id": "job-1",
        "name": "j",
        "tenant": "default",
        "state": "succeeded",
        "priority": 0,
        "submitted_at_ms": 1,
        "array_size": 1,
        "tasks": [{"index": 0, "state": "succeeded", "attempts": []}],
    }
    node = fakes.add({"GET /v1/jobs/job-1": [Reply(document=job)]})

    async def scenario() -> str:
        async with AsyncClient([node.url], timeout_s=2) as client:
            return (await client.jobs.wait("job-1", timeout_s=0)).state

    assert asyncio.run(scenario()) == "succeeded"
    assert len(node.requests("GET /v1/jobs/job-1")) == 1


def test_jobs_submit__a_field_this_client_does_not_know__is_left_to_the_cluster(
    fakes: FakeNodes,
) -> None:
    """A newer cluster may know a field an older client does not: the spec goes as given, and a
    cluster that does not know the field either refuses it."""
    node = fakes.add({"POST /v1/jobs": [Reply(document={"job_id": "job-1"})]})

    async def scenario() -> str:
        async with AsyncClient([node.url], timeout_s=2) as client:
            return await client.jobs.submit("j", workload="w", image="train:v2")

    assert asyncio.run(scenario()) == "job-1"
    (request,) = node.requests("POST /v1/jobs")
    assert request.body["image"] == "train:v2"


CONSTRUCTOR_CASES: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "endpoints None": ({"endpoints": None}, TypeError, "endpoints"),
    "endpoint surrogate": ({"endpoints": ["\udcff"]}, ValueError, "endpoint"),
    "endpoint with a line break": ({"endpoints": "h:1\r\nX: y"}, ValueError, "endpoint"),
    "endpoint host 100,000 chars": ({"endpoints": "a" * 100_000}, ValueError, "endpoint"),
    "endpoint ftp": ({"endpoints": "ftp://h:1"}, ValueError, "endpoint"),
    "timeout_s bool": ({"timeout_s": True}, TypeError, "timeout_s"),
    "timeout_s None": ({"timeout_s": None}, TypeError, "timeout_s"),
    "retry_s NaN": ({"retry_s": NAN}, ValueError, "retry_s"),
    "retry_s str": ({"retry_s": "5"}, TypeError, "retry_s"),
    "token int": ({"token": 7}, TypeError, "token"),
    "token with a line break": ({"token": "secret\r\nX-Admin: yes"}, ValueError, "token"),
    "client_id not a name": ({"client_id": "my client"}, InvalidArgument, "client_id"),
    "client_id int": ({"client_id": 7}, TypeError, "client_id"),
    "ca_file list": ({"ca_file": ["ca.pem"]}, TypeError, "ca_file"),
}


@pytest.mark.parametrize("case", sorted(CONSTRUCTOR_CASES))
def test_bad_constructor_argument__is_refused_by_name(case: str) -> None:
    arguments, error, message = CONSTRUCTOR_CASES[case]
    arguments = {"endpoints": "127.0.0.1:8700", **arguments}
    with pytest.raises(error, match=message):
        AsyncClient(**arguments)


def test_tls_file_given_as_an_int__is_refused_and_no_file_descriptor_is_closed() -> None:
    """`open(7)` opens file descriptor 7 and closes it when done: `ca_file=True` closed the
    process's stdout."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"x")
    # Closed, so that a client that reads the descriptor reaches its end rather than blocking.
    os.close(write_end)
    try:
        for name in ("ca_file", "cert_file"):
            with pytest.raises(TypeError, match=f"{name} must be a path"):
                AsyncClient("127.0.0.1:8700", **{name: cast(Any, read_end)})
        os.fstat(read_end)  # OSError (EBADF) had the client closed it
    finally:
        with contextlib.suppress(OSError):
            os.close(read_end)


def test_endpoints__one_string_may_name_several_separated_by_commas() -> None:
    # As XR_ENDPOINTS and --endpoints take them; it was refused as one malformed URL.
    with Client("http://127.0.0.1:1, http://127.0.0.1:2") as client:
        assert client.endpoints == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    with Client("127.0.0.1:1") as client:
        assert client.endpoints == ("http://127.0.0.1:1",)
