"""The asynchronous API groups of `AsyncClient`: `kv`, `sessions`, `locks`, `jobs`, `regions` and
`cluster`, one class each, thin over the transport.

Each method is one call (or a loop of calls for iterators and waits) that shapes the request,
lets the transport retry and fail over, and returns the typed values of `_models`. A `get` of
something that does not exist returns None; every other miss raises `NotFound`. Long-lived
loops (a watch, waiting for a job) ride out an outage of up to `retry_s` before they raise.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator
from typing import Any, Literal
from urllib.parse import quote

import msgspec

from xrcore._validate import (
    INT_MAX,
    check_bytes,
    check_name,
    check_page_limit,
    check_range,
    check_text,
)
from xrcore.client._models import (
    ClusterStatus,
    DeleteResult,
    Job,
    JobEvent,
    JobLogs,
    JobPage,
    KeyPage,
    KeyValue,
    LockAcquisition,
    LockInfo,
    Member,
    PutResult,
    Region,
    SessionInfo,
    Tenant,
    TokenValidation,
    WatchEvent,
    convert,
    delete_result,
    field,
    key_page,
    key_value,
    watch_page,
)
from xrcore.client._transport import (
    NotUtf8,
    Transport,
    check_body,
    check_number,
    check_seconds,
    check_utf8,
)
from xrcore.commands import JobSpec, TenantSet
from xrcore.errors import (
    ClusterUnavailable,
    InvalidArgument,
    LeaderChanged,
    NotFound,
    Timeout,
    UnknownOutcome,
    XrError,
)
from xrcore.kv import REVISION_MAX
from xrcore.limits import (
    ARRAY_SIZE_MAX,
    JOB_ID_BYTES_MAX,
    KEY_BYTES_MAX,
    MESSAGE_BYTES_MAX,
    SESSION_TTL_MAX_MS,
    SESSION_TTL_MIN_MS,
    VALUE_BYTES_MAX,
)

__all__ = [
    "OUTAGE_ERRORS",
    "AsyncCluster",
    "AsyncJobs",
    "AsyncKv",
    "AsyncLocks",
    "AsyncRegions",
    "AsyncSessions",
]

# What a call raises when the cluster could not answer it in time: a long-lived loop retries
# these (with the same position) until its outage allowance runs out.
OUTAGE_ERRORS = (ClusterUnavailable, Timeout, LeaderChanged, UnknownOutcome)
# The longest one long poll asks the server to wait (a node waits at most its http.wait_max_s,
# 60 s by default, and answers that the wait ended); a loop of polls waits longer.
POLL_S = 20.0
# Keys per page of `kv.list` and events per long poll of `kv.watch`.
PAGE_LIMIT = 100
# What a `jobs.wait` with a timeout gives its last poll past the end of the wait, for the answer
# to come back or for a node that does not answer to be given up: the wait ends within
# `timeout_s` and this, not `timeout_s` and the client's whole call timeout.
WAIT_ANSWER_S = 1.0
# The least time a keep-alive try of a keeper is given (`AsyncSessions._keepalive`).
KEEPALIVE_TRY_MIN_S = 0.5


_CONSISTENCIES = ("linearizable", "stale")


# Arguments are checked before anything is sent, with the rules the cluster applies (the same
# `xrcore` checks): a wrong type raises TypeError, a value the cluster would refuse raises the
# `InvalidArgument` or `PayloadTooLarge` it would answer, a lone surrogate `NotUtf8` (a
# UnicodeEncodeError), naming the argument each time.


def check_str(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, got {type(value).__name__} {value!r:.80}")
    check_utf8(field, value)
    return value


def check_int(field: str, value: object, low: int, high: int = INT_MAX) -> int:
    # bool is an int to Python, but True is not a count.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{field} must be an int, got {type(value).__name__} {value!r:.80}")
    check_range(field, value, low, high)
    return value


def check_name_argument(field: str, value: object) -> str:
    """A session id, job id, region or tenant: a name as `xrcore._validate.check_name` has it."""
    check_name(field, check_str(field, value))
    return value  # type: ignore[return-value]


def check_key_argument(field: str, value: object) -> str:
    """A key or a lock name: 1 to KEY_BYTES_MAX bytes of UTF-8."""
    check_bytes(field, check_str(field, value), KEY_BYTES_MAX)
    return value  # type: ignore[return-value]


def check_ttl_s(ttl_s: object) -> float:
    """A session's TTL: a number of seconds the cluster accepts (1 s to 1 h)."""
    seconds = check_seconds("ttl_s", ttl_s)
    check_range("ttl_s", seconds, SESSION_TTL_MIN_MS / 1000, SESSION_TTL_MAX_MS / 1000)
    return seconds


def check_wait_s(wait_s: object) -> float:
    seconds = check_seconds("wait_s", wait_s)
    if seconds < 0:
        raise ValueError(f"wait_s must be a number of seconds, 0 or more, got {seconds}")
    return seconds


def _segment(field: str, name: object) -> str:
    """A name (session id, region, tenant) as one path segment, percent-encoded."""
    return quote(check_name_argument(field, name), safe="")


class _OutageAllowance:
    """How long a loop of calls keeps going while every call fails for want of a cluster."""

    def __init__(self, retry_s: float) -> None:
        self._retry_s = retry_s
        self._failing_since_s: float | None = None
        self._call_started_s: float | None = None

    def poll_s(self, longest_s: float) -> float:
        """The wait for the next long poll, whose start this marks: `longest_s`, or, while calls
        fail, no more than what is left of the allowance, so the loop gives up about `retry_s`
        after the outage began rather than a whole poll later."""
        now_s = asyncio.get_running_loop().time()
        self._call_started_s = now_s
        if self._failing_since_s is None:
            return longest_s
        return max(0.0, min(longest_s, self._retry_s - (now_s - self._failing_since_s)))

    def succeeded(self) -> None:
        self._failing_since_s = None

    def failed(self, error: XrError) -> None:
        """Returns when the loop may go on; once the outage (from the start of the first call
        that failed) has lasted `retry_s`, raises an error of `error`'s kind that says so."""
        now_s = asyncio.get_running_loop().time()
        if self._failing_since_s is None:
            self._failing_since_s = self._call_started_s or now_s
        failing_s = now_s - self._failing_since_s
        if failing_s >= self._retry_s:
            raise type(error)(
                f"{error.message}; gave up after {failing_s:.0f} s of retries (the loop rides "
                f"out an outage of {self._retry_s:g} s)"
            ) from error


class AsyncKv:
    """Keys in the caller's tenant namespace: get, put with compare-and-set, delete, ranges,
    and a watch of changes that resumes where it stopped."""

    def __init__(self, transport: Transport, *, retry_s: float) -> None:
        self._transport = transport
        self._retry_s = retry_s

    async def put(
        self,
        key: str,
        value: bytes | str,
        *,
        expected_mod_revision: int | None = None,
        session_id: str | None = None,
    ) -> PutResult:
        """Writes `key`. `expected_mod_revision` makes it a compare-and-set (`CompareFailed`
        when the key's mod revision differs; 0: the key must not exist). A key written with
        `session_id` is deleted when that session ends."""
        path = _key_path(key)
        body: dict[str, Any]
        if isinstance(value, str):
            check_utf8("value", value)
            check_bytes("value", value, VALUE_BYTES_MAX, empty=True)
            body = {"value": value}
        elif isinstance(value, bytes | bytearray | memoryview):
            check_bytes("value", bytes(value), VALUE_BYTES_MAX, empty=True)
            body = {"value_base64": _base64(bytes(value))}
        else:
            raise TypeError(f"value must be bytes or a str, got {type(value).__name__}")
        if expected_mod_revision is not None:
            body["expected_mod_revision"] = check_int(
                "expected_mod_revision", expected_mod_revision, 0
            )
        if session_id is not None:
            body["session_id"] = check_name_argument("session_id", session_id)
        document = await self._transport.call("PUT", path, body=body, write=True)
        return convert(document, PutResult)

    async def get(
        self, key: str, *, consistency: Literal["linearizable", "stale"] = "linearizable"
    ) -> KeyValue | None:
        """The key, or None when it does not exist. `stale` reads the answering node's state
        without a read barrier: faster, possibly behind."""
        path = _key_path(key)
        if consistency not in _CONSISTENCIES:
            raise InvalidArgument(
                f"consistency must be 'linearizable' or 'stale', got {consistency!r:.80}"
            )
        try:
            document = await self._transport.call("GET", path, query={"consistency": consistency})
        except NotFound:
            return None
        return key_value(document)

    async def delete(self, key: str, *, expected_mod_revision: int | None = None) -> DeleteResult:
        """Deletes `key`; `deleted` is False when it did not exist."""
        path = _key_path(key)
        query = None
        if expected_mod_revision is not None:
            revision = check_int("expected_mod_revision", expected_mod_revision, 0)
            query = {"expected_mod_revision": str(revision)}
        document = await self._transport.call("DELETE", path, query=query, write=True)
        return delete_result(document)

    async def range(
        self, prefix: str = "", *, limit: int = 100, after: str | None = None
    ) -> KeyPage:
        """One page of the keys starting with `prefix` in byte order, after key `after`."""
        _check_prefix(prefix)
        check_int("limit", limit, 1)
        check_page_limit(limit)
        query = {"prefix": prefix, "limit": str(limit)}
        if after is not None:
            query["after"] = check_key_argument("after", after)
        return key_page(await self._transport.call("GET", "/v1/kv", query=query))

    async def list(self, prefix: str = "") -> AsyncGenerator[KeyValue, None]:
        """Every key starting with `prefix`, page after page (each page is a separate read)."""
        _check_prefix(prefix)
        after: str | None = None
        while True:
            page = await self.range(prefix, limit=PAGE_LIMIT, after=after)
            for item in page.items:
                yield item
            if page.next is None:
                return
            after = page.next

    async def watch(
        self, prefix: str = "", *, from_revision: int
    ) -> AsyncGenerator[WatchEvent, None]:
        """Every change under `prefix` from `from_revision` on, oldest first, each once. Long
        polls; after a lost connection or a failover it resumes from the revision after the
        last event it delivered. Raises `Compacted` when that revision is no longer retained,
        and an outage error when no node answered for `retry_s`."""
        _check_prefix(prefix)
        next_revision = check_int("from_revision", from_revision, 1, REVISION_MAX)
        allowance = _OutageAllowance(self._retry_s)
        while True:
            query = {
                "prefix": prefix,
                "from_revision": str(next_revision),
                "limit": str(PAGE_LIMIT),
            }
            try:
                document = await self._transport.call(
                    "GET", "/v1/watch", query=query, wait_s=allowance.poll_s(POLL_S)
                )
            except OUTAGE_ERRORS as error:
                if self._transport.closed:
                    # The client's close ended the poll: no outage to ride out.
                    raise
                allowance.failed(error)
                continue
            allowance.succeeded()
            events, answered_next_revision = watch_page(document)
            for event in events:
                # An answer never repeats what was delivered, but a watcher must not see an
                # event twice even if a server did.
                if event.revision < next_revision:
                    continue
                next_revision = event.revision + 1
                yield event
            next_revision = max(next_revision, answered_next_revision)


class AsyncSessions:
    """Sessions: leases that hold locks and keys while their owner keeps them alive."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def grant(self, ttl_s: float) -> SessionInfo:
        """A new session that ends `ttl_s` after its last keep-alive (1 s to 1 h)."""
        ttl_ms = round(check_ttl_s(ttl_s) * 1000)
        document = await self._transport.call(
            "POST", "/v1/sessions", body={"ttl_ms": ttl_ms}, write=True
        )
        return convert(document, SessionInfo)

    async def keepalive(self, session_id: str) -> SessionInfo:
        """Renews the session for another TTL; `NotFound` when it has ended."""
        return await self._keepalive(session_id)

    async def _keepalive(
        self, session_id: str, *, timeout_s: float | None = None, ttl_s: float | None = None
    ) -> SessionInfo:
        """`keepalive` for a keeper, which must know before the TTL runs out (`timeout_s`: what
        is left of it). With the session's `ttl_s`, a try has at most a third of the TTL shared
        among the endpoints (KEEPALIVE_TRY_MIN_S at least): a silent node (paused, cut off) is
        given up soon enough for the other endpoints to be tried before the session expires."""
        try_timeout_max_s = None
        if ttl_s is not None:
            endpoints = len(self._transport.endpoints)
            try_timeout_max_s = max(KEEPALIVE_TRY_MIN_S, ttl_s / (3 * endpoints))
        document = await self._transport.call(
            "POST",
            f"/v1/sessions/{_segment('session_id', session_id)}/keepalive",
            write=True,
            timeout_s=timeout_s,
            try_timeout_max_s=try_timeout_max_s,
        )
        return convert(document, SessionInfo)

    async def revoke(self, session_id: str) -> None:
        """Ends the session: its locks pass to their next waiters and its keys are deleted."""
        await self._transport.call(
            "DELETE", f"/v1/sessions/{_segment('session_id', session_id)}", write=True
        )

    async def get(self, session_id: str) -> SessionInfo | None:
        try:
            document = await self._transport.call(
                "GET", f"/v1/sessions/{_segment('session_id', session_id)}"
            )
        except NotFound:
            return None
        return convert(document, SessionInfo)


class AsyncLocks:
    """Fenced locks held by sessions, with FIFO wait queues."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def acquire(self, name: str, session_id: str, *, wait_s: float = 0.0) -> LockAcquisition:
        """Takes the lock for the session, waiting in the lock's queue up to `wait_s`. Not
        granted: `granted` is False (with `queued` when `wait_s` was 0 and the session is now
        in the queue anyway, or `timed_out` when the wait ended)."""
        path = f"{_lock_path(name)}/acquire"
        check_name_argument("session_id", session_id)
        wait_s = check_wait_s(wait_s)
        if wait_s <= 0:
            document = await self._transport.call(
                "POST", path, body={"session_id": session_id}, write=True
            )
            return convert(document, LockAcquisition)
        loop = asyncio.get_running_loop()
        wait_until_s = loop.time() + wait_s
        while True:
            document = await self._transport.call(
                "POST",
                path,
                body={"session_id": session_id},
                write=True,
                wait_s=max(0.0, wait_until_s - loop.time()),
                wait_in="body",
            )
            result = convert(document, LockAcquisition)
            # A node that stops ends its waits early and takes the session out of the queue;
            # while the caller's wait lasts, join again (a new request, so a new seq: the old
            # one's stored answer is "queued").
            if result.granted or not result.timed_out or loop.time() >= wait_until_s - 0.1:
                return result

    async def release(self, name: str, session_id: str) -> bool:
        """Releases the lock (True), or leaves its queue (False); `LockNotHeld` otherwise."""
        path = f"{_lock_path(name)}/release"
        check_name_argument("session_id", session_id)
        document = await self._transport.call(
            "POST",
            path,
            body={"session_id": session_id},
            write=True,
        )
        return field(document, "released", bool)

    async def get(self, name: str) -> LockInfo | None:
        """The holder, token and queue of the lock, or None when nobody holds it."""
        try:
            document = await self._transport.call("GET", _lock_path(name))
        except NotFound:
            return None
        return convert(document, LockInfo)

    async def validate(self, name: str, token: int) -> TokenValidation:
        """Whether `token` is the lock's current grant, through a read barrier."""
        path = f"{_lock_path(name)}/validate"
        check_int("token", token, 1)
        document = await self._transport.call("POST", path, body={"token": token})
        return convert(document, TokenValidation)


class AsyncJobs:
    """Jobs of the caller's tenant: submit, inspect, cancel and wait for them to finish."""

    def __init__(self, transport: Transport, *, retry_s: float) -> None:
        self._transport = transport
        self._retry_s = retry_s

    async def submit(
        self,
        name: str,
        *,
        workload: str | None = None,
        entrypoint: str | None = None,
        args: dict[str, Any] | str | None = None,
        gpus: int = 0,
        array_size: int = 1,
        priority: int = 0,
        **more_spec_fields: Any,
    ) -> str:
        """Submits a job (exactly one of `workload` and `entrypoint`); returns its id. Other
        fields of the job spec (`regions_allow`, `max_attempts`, ...) go in `more_spec_fields`."""
        spec: dict[str, Any] = {
            "name": name,
            "gpus": gpus,
            "array_size": array_size,
            "priority": priority,
            **more_spec_fields,
        }
        for field_name, given in (("workload", workload), ("entrypoint", entrypoint)):
            if given is not None:
                spec[field_name] = given
        if args is not None:
            spec["args"] = args
        # NaN and infinities first, as ValueError like in every other body (the spec's own check
        # would say InvalidArgument for some fields and miss those in `args`).
        check_body(spec)
        _check_spec(spec)
        document = await self._transport.call("POST", "/v1/jobs", body=spec, write=True)
        return field(document, "job_id", str)

    async def get(self, job_id: str) -> Job | None:
        try:
            document = await self._transport.call("GET", _job_path(job_id))
        except NotFound:
            return None
        return convert(document, Job)

    async def list(
        self, *, state: str | None = None, limit: int = 100, after: str | None = None
    ) -> JobPage:
        """One page of jobs in submission order, optionally in one state, after job `after`."""
        check_int("limit", limit, 1)
        check_page_limit(limit)
        query = {"limit": str(limit)}
        if state is not None:
            query["state"] = check_name_argument("state", state)
        if after is not None:
            query["after"] = check_name_argument("after", after)
            check_bytes("after", after, JOB_ID_BYTES_MAX)
        document = await self._transport.call("GET", "/v1/jobs", query=query)
        return convert(document, JobPage)

    async def cancel(self, job_id: str, *, reason: str = "") -> int:
        """Cancels the job's unfinished tasks; returns how many were cancelled.
        `InvalidTransition` when the job has already finished."""
        path = f"{_job_path(job_id)}/cancel"
        check_text("reason", check_str("reason", reason), MESSAGE_BYTES_MAX)
        document = await self._transport.call("POST", path, body={"reason": reason}, write=True)
        return field(document, "cancelled_tasks", int)

    async def events(self, job_id: str) -> tuple[JobEvent, ...]:
        """The job's timeline: submission, then each attempt's start and end, in time order."""
        document = await self._transport.call("GET", f"{_job_path(job_id)}/events")
        return field(document, "events", tuple[JobEvent, ...])

    async def logs(
        self,
        job_id: str,
        *,
        task_index: int = 0,
        attempt: int | None = None,
        tail_bytes: int = 65_536,
    ) -> JobLogs:
        """The end of a task attempt's output (the latest attempt unless `attempt` is given),
        read from the region that ran it."""
        path = f"{_job_path(job_id)}/logs"
        check_int("task_index", task_index, 0, ARRAY_SIZE_MAX - 1)
        check_int("tail_bytes", tail_bytes, 1)
        query = {"task_index": str(task_index), "tail_bytes": str(tail_bytes)}
        if attempt is not None:
            query["attempt"] = str(check_int("attempt", attempt, 1))
        document = await self._transport.call("GET", path, query=query)
        return convert(document, JobLogs)

    async def wait(self, job_id: str, *, timeout_s: float | None = None) -> Job:
        """The job once every task has finished (succeeded, failed or cancelled). Long polls;
        `Timeout` when it has not finished within `timeout_s` (None: no limit; 0: look once),
        `NotFound` when there is no such job. When no node answered the last look, the
        outage error of that look (`ClusterUnavailable`) is raised instead, saying so: whether
        the job finished is not known. With `timeout_s`, either comes within `timeout_s` and a
        second; without, an outage is ridden out for `retry_s`."""
        path = _job_path(job_id)
        if timeout_s is not None and check_seconds("timeout_s", timeout_s) < 0:
            raise ValueError(f"timeout_s must be a number of seconds, 0 or more, got {timeout_s}")
        loop = asyncio.get_running_loop()
        deadline_s = None if timeout_s is None else loop.time() + timeout_s
        allowance = _OutageAllowance(self._retry_s)
        polled = False
        answered = False
        # The error of the last look, when no node answered it.
        outage: XrError | None = None
        while True:
            poll_s = POLL_S
            if deadline_s is not None:
                left_s = deadline_s - loop.time()
                # The job is looked at at least once, so a finished job is returned even with
                # no time to wait (timeout_s=0).
                if left_s <= 0 and polled:
                    if outage is not None:
                        assert timeout_s is not None, "a deadline comes from timeout_s"
                        raise _unanswered_wait(job_id, timeout_s, outage, answered=answered)
                    raise Timeout(f"job {job_id!r} did not finish within {timeout_s} s")
                poll_s = max(0.0, min(poll_s, left_s))
            polled = True
            wait_s = allowance.poll_s(poll_s)
            call_timeout_s = None
            if deadline_s is not None:
                # The call's own time past its wait ends by the wait's deadline (WAIT_ANSWER_S).
                left_s = deadline_s - loop.time()
                call_timeout_s = min(self._transport.timeout_s, max(WAIT_ANSWER_S, left_s - wait_s))
            try:
                document = await self._transport.call(
                    "GET", path, wait_s=wait_s, timeout_s=call_timeout_s
                )
            except OUTAGE_ERRORS as error:
                if self._transport.closed:
                    # The client's close ended the poll: no outage to ride out.
                    raise
                outage = error
                allowance.failed(error)
                continue
            answered = True
            outage = None
            allowance.succeeded()
            job = convert(document, Job)
            if job.finished:
                return job


def _unanswered_wait(job_id: str, timeout_s: float, outage: XrError, *, answered: bool) -> XrError:
    """The error of a `jobs.wait` whose time ran out while no node answered: the outage's own
    kind, since whether the job finished is not known."""
    seen = (
        "had not finished when a node last answered, and no node answered after that"
        if answered
        else "could not be looked at: no node answered"
    )
    return type(outage)(
        f"job {job_id!r} {seen} within the wait of {timeout_s:g} s, so whether it has finished "
        f"is not known; {outage.message}"
    )


class AsyncRegions:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def list(self) -> tuple[Region, ...]:
        document = await self._transport.call("GET", "/v1/regions")
        return field(document, "items", tuple[Region, ...])

    async def get(self, name: str) -> Region | None:
        try:
            document = await self._transport.call("GET", f"/v1/regions/{_segment('name', name)}")
        except NotFound:
            return None
        return convert(document, Region)


class AsyncTenants:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def list(self) -> tuple[Tenant, ...]:
        """Tenants whose scheduling settings were set (others have the defaults)."""
        document = await self._transport.call("GET", "/v1/tenants")
        return field(document, "items", tuple[Tenant, ...])

    async def set(
        self,
        name: str,
        *,
        weight: float = 1.0,
        gpus_max: int | None = None,
        tasks_max: int | None = None,
        cost_weight: float = 1.0,
        carbon_weight: float = 1.0,
        keys_max: int | None = None,
        sessions_max: int | None = None,
        clients_max: int | None = None,
        jobs_max: int | None = None,
        unfinished_tasks_max: int | None = None,
    ) -> bool:
        """Sets all of a tenant's settings (admins only); True when the tenant was new. The
        `*_max` after the weights are the tenant's shares of the replicated tables: keys in its
        namespace, sessions, client records of its writes, its jobs kept (finished ones
        included; at the quota a submission evicts its own oldest finished jobs), its unfinished
        tasks. None: no quota of its own."""
        path = f"/v1/tenants/{_segment('name', name)}"
        if "/" in name:
            raise InvalidArgument(f"a tenant name has no '/' (no token can name one), got {name!r}")
        quotas = {
            "keys_max": keys_max,
            "sessions_max": sessions_max,
            "clients_max": clients_max,
            "jobs_max": jobs_max,
            "unfinished_tasks_max": unfinished_tasks_max,
        }
        quotas = {
            field: None if value is None else check_int(field, value, 0)
            for field, value in quotas.items()
        }
        # The command the cluster would build, so its checks run here first.
        TenantSet(
            name=name,
            weight=check_number("weight", weight),
            gpus_max=None if gpus_max is None else check_int("gpus_max", gpus_max, 0),
            tasks_max=None if tasks_max is None else check_int("tasks_max", tasks_max, 0),
            cost_weight=check_number("cost_weight", cost_weight),
            carbon_weight=check_number("carbon_weight", carbon_weight),
            **quotas,
        )
        body: dict[str, Any] = {
            "weight": weight,
            "gpus_max": gpus_max,
            "tasks_max": tasks_max,
            "cost_weight": cost_weight,
            "carbon_weight": carbon_weight,
        }
        # Only the quotas set: a node of an earlier version refuses fields it does not know.
        body.update({field: value for field, value in quotas.items() if value is not None})
        document = await self._transport.call("PUT", path, body=body, write=True)
        return field(document, "created", bool)


class AsyncCluster:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def status(self) -> ClusterStatus:
        """The answering node's view: its role, the leader, term and indexes."""
        return convert(await self._transport.call("GET", "/v1/cluster/status"), ClusterStatus)

    async def members(self) -> tuple[Member, ...]:
        document = await self._transport.call("GET", "/v1/cluster/members")
        return field(document, "items", tuple[Member, ...])

    async def transfer_leader(self, region: str) -> bool:
        """Moves leadership to `region`'s node; False when it already leads."""
        check_name_argument("region", region)
        document = await self._transport.call(
            "POST", "/v1/cluster/transfer-leader", body={"region": region}
        )
        return field(document, "transferred", bool)


def _key_path(key: str) -> str:
    return f"/v1/kv/{quote(check_key_argument('key', key), safe='/')}"


def _lock_path(name: str) -> str:
    return f"/v1/locks/{quote(check_key_argument('name', name), safe='')}"


def _job_path(job_id: str) -> str:
    path = f"/v1/jobs/{_segment('job_id', job_id)}"
    check_bytes("job_id", job_id, JOB_ID_BYTES_MAX)
    return path


def _check_prefix(prefix: object) -> None:
    check_text("prefix", check_str("prefix", prefix), KEY_BYTES_MAX)


def _check_spec(spec: dict[str, Any]) -> None:
    """Runs the checks the cluster runs on a submitted spec (node/api/jobs.py): the same fields,
    converted to the same `JobSpec`. A spec with a field this version does not know is left to
    the cluster, which may be newer and know it (and whose rules for the other fields may then
    differ); a cluster that does not know it either answers `InvalidArgument` naming it. Its
    `args` are checked whatever other fields it has: a field this version does not know does
    not make bytes in them JSON."""
    document = dict(spec)
    args = document.get("args")
    if isinstance(args, dict):
        try:
            # The standard encoder first, for what msgspec would change rather than refuse:
            # NaN and infinities (sent as null) and bytes (sent as base64 text).
            json.dumps(args, allow_nan=False)
            document["args"] = msgspec.json.encode(args).decode()
        except (TypeError, RecursionError) as error:
            raise TypeError(f"args must be a JSON object: {error}") from None
        except UnicodeEncodeError as error:
            raise NotUtf8("args", error) from None
        except ValueError as error:
            raise ValueError(f"args must be a JSON object: {error}") from None
    elif "args" in document and not isinstance(args, str):
        # msgspec would say "Expected `str`", naming only the text form of args.
        raise TypeError(f"args must be a JSON object (a dict), not {type(args).__name__}")
    if not set(spec) <= _SPEC_FIELDS:
        return
    try:
        msgspec.convert(document, JobSpec)
    except msgspec.ValidationError as error:
        raise TypeError(f"job spec: {error}") from None


_SPEC_FIELDS = frozenset(set(JobSpec.__struct_fields__) - {"tenant"})


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode()
