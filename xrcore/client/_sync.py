"""`Client`: the synchronous client, the same surface as `AsyncClient` without `await`.

    with Client(["10.0.0.1:8700", "10.0.0.2:8700"]) as client:
        client.kv.put("config/mode", "fast")
        with client.lock("trainer", ttl_s=10) as lease:
            storage.write(data, fencing_token=lease.token)

There is one implementation: each `Client` owns an `AsyncClient` running on a private event loop
in a daemon thread, and every method hands its coroutine to that loop
(`asyncio.run_coroutine_threadsafe`) and waits for the result. So methods, iterators and context
managers work from any plain thread, several threads may share one client, and a lease's
keep-alive keeps running while the calling thread is busy. Methods must not be called from the
client's own loop thread (they would wait on themselves).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, TypeVar

from xrcore.client._api import (
    AsyncCluster,
    AsyncJobs,
    AsyncKv,
    AsyncLocks,
    AsyncRegions,
    AsyncSessions,
    AsyncTenants,
)
from xrcore.client._async import AsyncClient
from xrcore.client._leases import KeptSession, Lease
from xrcore.client._models import (
    ClusterStatus,
    DeleteResult,
    Health,
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
)

__all__ = [
    "Client",
    "Cluster",
    "Jobs",
    "Kv",
    "Locks",
    "Regions",
    "Sessions",
    "Stream",
    "Tenants",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
# How long closing waits for the loop thread to finish; it is a daemon, so a stuck one is left.
_CLOSE_JOIN_S = 10.0


class _Loop:
    """A private event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="xr-client-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def closing(self) -> bool:
        """Whether `close` has begun (the loop may still run)."""
        return self._closing

    def run(self, work: Awaitable[T], *, timeout_s: float | None = None) -> T:
        """Runs `work` on the loop and waits for its result (or its exception) here; with
        `timeout_s`, at most that long (TimeoutError, and the work is cancelled)."""
        future = self.start(work)
        try:
            return self.result(future, timeout_s=timeout_s)
        except BaseException:
            # KeyboardInterrupt and the like: do not leave the call running on the loop.
            future.cancel()
            raise

    def start(self, work: Awaitable[T]) -> concurrent.futures.Future[T]:
        """Starts `work` on the loop; `result` waits for it."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a Client method was called from the client's own event loop")
        if self.loop.is_closed():
            if inspect.iscoroutine(work):
                work.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(_awaited(work), self.loop)

    def result(self, future: concurrent.futures.Future[T], *, timeout_s: float | None = None) -> T:
        """The result of work `start`ed, waited for here (an interruption of the wait, such as
        KeyboardInterrupt, is raised and leaves the work running)."""
        try:
            return future.result(timeout_s)
        except concurrent.futures.CancelledError:
            if self._closing:
                raise RuntimeError("the client was closed while this call ran") from None
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self._closing = True
        # The client's close has ended its calls (each with its `XrError`); whatever else still
        # runs is cancelled, and raises RuntimeError in its thread, rather than wait forever on a
        # stopped loop; iterators left open are closed on their own loop rather than by the
        # garbage collector after it is gone.
        with contextlib.suppress(RuntimeError, TimeoutError):
            self.run(_cancel_pending(), timeout_s=_CLOSE_JOIN_S)
            self.run(self.loop.shutdown_asyncgens(), timeout_s=_CLOSE_JOIN_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(_CLOSE_JOIN_S)
        if not self._thread.is_alive():
            self.loop.close()


async def _awaited(work: Awaitable[T]) -> T:
    return await work


async def _cancel_pending() -> None:
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def _next_of(items: AsyncIterator[T]) -> list[T]:
    """The next item as a list of one, or an empty list at the end (StopAsyncIteration is not
    meant to cross `run_coroutine_threadsafe`)."""
    try:
        return [await anext(items)]
    except StopAsyncIteration:
        return []


class Stream(Generic[T]):
    """A blocking iterator over an asynchronous one on the client's loop (`kv.list`,
    `kv.watch`). `close()` (or leaving a `with` block) stops it and frees its request.

    A `next()` interrupted while it waits (KeyboardInterrupt, an exception raised by a signal
    handler) leaves the step it waited for running: the stream's next `next()` takes up that
    same step, so no item is lost or repeated. A stream that raised an error of its own (a
    watch's `Compacted`, an outage longer than `retry_s`, the client's close) has ended: a
    later `next()` raises RuntimeError naming that error, never StopIteration, so a watch,
    which never ends by itself, does not look finished. Open a new one (a watch from the
    revision after the last event received)."""

    def __init__(self, loop: _Loop, items: AsyncIterator[T]) -> None:
        self._loop = loop
        self._items = items
        self._closed = False
        # The step a `next()` was interrupted in, which the next `next()` takes up.
        self._pending: concurrent.futures.Future[list[T]] | None = None
        self._failure: BaseException | None = None

    def __iter__(self) -> Stream[T]:
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        if self._failure is not None:
            raise RuntimeError(
                f"this stream ended with {type(self._failure).__name__}: {self._failure}; open "
                "a new one (a watch from the revision after the last event received)"
            ) from self._failure
        if self._pending is None:
            self._pending = self._loop.start(_next_of(self._items))
        pending = self._pending
        try:
            found = self._loop.result(pending)
        except BaseException as error:
            if pending.done() and not pending.cancelled() and pending.exception() is error:
                # The stream's own error, which ended it. Anything else interrupted the wait,
                # and the step goes on for the next `next()` to take up.
                self._pending = None
                self._failure = error
            raise
        self._pending = None
        if not found:
            self._closed = True
            raise StopIteration
        return found[0]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        closing = getattr(self._items, "aclose", None)
        if closing is not None and not self._loop.loop.is_closed():
            # Bounded: after an interrupt the generator may still be finishing its cancelled
            # step ("already running"); the client's close cancels whatever is left.
            with contextlib.suppress(RuntimeError, TimeoutError):
                self._loop.run(closing(), timeout_s=_CLOSE_JOIN_S)

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class _HeldBlock(Protocol[T_co]):
    """`SessionContext` and `LockContext`, as `_Block` uses them."""

    async def __aenter__(self) -> T_co: ...

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    def leave_closed(self, error: BaseException | None) -> None: ...


class _Block(Generic[T]):
    """A blocking context manager over an asynchronous one on the client's loop. What
    `__aexit__` raises (a lost lock) is raised in the thread that leaves the block, also when
    the client was closed inside the block (which marks its session or lock lost)."""

    def __init__(self, loop: _Loop, block: _HeldBlock[T]) -> None:
        self._loop = loop
        self._block = block

    def __enter__(self) -> T:
        return self._loop.run(self._block.__aenter__())

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._loop.closing:
            try:
                self._loop.run(self._block.__aexit__(kind, error, traceback))
                return
            except RuntimeError:
                # Closed by another thread while this one was leaving.
                if not self._loop.closing:
                    raise
        # The client was closed inside the block: no request can be sent any more, and the
        # close marked the session (and lock) lost, which is raised here as on any exit.
        self._block.leave_closed(error)


class Kv:
    """See `AsyncKv`."""

    def __init__(self, loop: _Loop, kv: AsyncKv) -> None:
        self._loop = loop
        self._kv = kv

    def put(
        self,
        key: str,
        value: bytes | str,
        *,
        expected_mod_revision: int | None = None,
        session_id: str | None = None,
    ) -> PutResult:
        return self._loop.run(
            self._kv.put(
                key, value, expected_mod_revision=expected_mod_revision, session_id=session_id
            )
        )

    def get(
        self, key: str, *, consistency: Literal["linearizable", "stale"] = "linearizable"
    ) -> KeyValue | None:
        return self._loop.run(self._kv.get(key, consistency=consistency))

    def delete(self, key: str, *, expected_mod_revision: int | None = None) -> DeleteResult:
        return self._loop.run(self._kv.delete(key, expected_mod_revision=expected_mod_revision))

    def range(self, prefix: str = "", *, limit: int = 100, after: str | None = None) -> KeyPage:
        return self._loop.run(self._kv.range(prefix, limit=limit, after=after))

    def list(self, prefix: str = "") -> Stream[KeyValue]:
        return Stream(self._loop, self._kv.list(prefix))

    def watch(self, prefix: str = "", *, from_revision: int) -> Stream[WatchEvent]:
        return Stream(self._loop, self._kv.watch(prefix, from_revision=from_revision))


class Sessions:
    """See `AsyncSessions`."""

    def __init__(self, loop: _Loop, sessions: AsyncSessions) -> None:
        self._loop = loop
        self._sessions = sessions

    def grant(self, ttl_s: float) -> SessionInfo:
        return self._loop.run(self._sessions.grant(ttl_s))

    def keepalive(self, session_id: str) -> SessionInfo:
        return self._loop.run(self._sessions.keepalive(session_id))

    def revoke(self, session_id: str) -> None:
        self._loop.run(self._sessions.revoke(session_id))

    def get(self, session_id: str) -> SessionInfo | None:
        return self._loop.run(self._sessions.get(session_id))


class Locks:
    """See `AsyncLocks`."""

    def __init__(self, loop: _Loop, locks: AsyncLocks) -> None:
        self._loop = loop
        self._locks = locks

    def acquire(self, name: str, session_id: str, *, wait_s: float = 0.0) -> LockAcquisition:
        return self._loop.run(self._locks.acquire(name, session_id, wait_s=wait_s))

    def release(self, name: str, session_id: str) -> bool:
        return self._loop.run(self._locks.release(name, session_id))

    def get(self, name: str) -> LockInfo | None:
        return self._loop.run(self._locks.get(name))

    def validate(self, name: str, token: int) -> TokenValidation:
        return self._loop.run(self._locks.validate(name, token))


class Jobs:
    """See `AsyncJobs`."""

    def __init__(self, loop: _Loop, jobs: AsyncJobs) -> None:
        self._loop = loop
        self._jobs = jobs

    def submit(
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
        return self._loop.run(
            self._jobs.submit(
                name,
                workload=workload,
                entrypoint=entrypoint,
                args=args,
                gpus=gpus,
                array_size=array_size,
                priority=priority,
                **more_spec_fields,
            )
        )

    def get(self, job_id: str) -> Job | None:
        return self._loop.run(self._jobs.get(job_id))

    def list(
        self, *, state: str | None = None, limit: int = 100, after: str | None = None
    ) -> JobPage:
        return self._loop.run(self._jobs.list(state=state, limit=limit, after=after))

    def cancel(self, job_id: str, *, reason: str = "") -> int:
        return self._loop.run(self._jobs.cancel(job_id, reason=reason))

    def events(self, job_id: str) -> tuple[JobEvent, ...]:
        return self._loop.run(self._jobs.events(job_id))

    def logs(
        self,
        job_id: str,
        *,
        task_index: int = 0,
        attempt: int | None = None,
        tail_bytes: int = 65_536,
    ) -> JobLogs:
        return self._loop.run(
            self._jobs.logs(job_id, task_index=task_index, attempt=attempt, tail_bytes=tail_bytes)
        )

    def wait(self, job_id: str, *, timeout_s: float | None = None) -> Job:
        return self._loop.run(self._jobs.wait(job_id, timeout_s=timeout_s))


class Regions:
    """See `AsyncRegions`."""

    def __init__(self, loop: _Loop, regions: AsyncRegions) -> None:
        self._loop = loop
        self._regions = regions

    def list(self) -> tuple[Region, ...]:
        return self._loop.run(self._regions.list())

    def get(self, name: str) -> Region | None:
        return self._loop.run(self._regions.get(name))


class Tenants:
    """See `AsyncTenants`."""

    def __init__(self, loop: _Loop, tenants: AsyncTenants) -> None:
        self._loop = loop
        self._tenants = tenants

    def list(self) -> tuple[Tenant, ...]:
        return self._loop.run(self._tenants.list())

    def set(
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
        return self._loop.run(
            self._tenants.set(
                name,
                weight=weight,
                gpus_max=gpus_max,
                tasks_max=tasks_max,
                cost_weight=cost_weight,
                carbon_weight=carbon_weight,
                keys_max=keys_max,
                sessions_max=sessions_max,
                clients_max=clients_max,
                jobs_max=jobs_max,
                unfinished_tasks_max=unfinished_tasks_max,
            )
        )


class Cluster:
    """See `AsyncCluster`."""

    def __init__(self, loop: _Loop, cluster: AsyncCluster) -> None:
        self._loop = loop
        self._cluster = cluster

    def status(self) -> ClusterStatus:
        return self._loop.run(self._cluster.status())

    def members(self) -> tuple[Member, ...]:
        return self._loop.run(self._cluster.members())

    def transfer_leader(self, region: str) -> bool:
        return self._loop.run(self._cluster.transfer_leader(region))


class Client:
    """A blocking client of the cluster at `endpoints`; the arguments are `AsyncClient`'s."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        client_id: str | None = None,
        retry_s: float = 30.0,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        # Built before the thread starts, so a bad argument leaves no thread behind.
        self._async = AsyncClient(
            endpoints,
            token=token,
            timeout_s=timeout_s,
            client_id=client_id,
            retry_s=retry_s,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        self._loop = _Loop()
        self.kv = Kv(self._loop, self._async.kv)
        self.sessions = Sessions(self._loop, self._async.sessions)
        self.locks = Locks(self._loop, self._async.locks)
        self.jobs = Jobs(self._loop, self._async.jobs)
        self.regions = Regions(self._loop, self._async.regions)
        self.tenants = Tenants(self._loop, self._async.tenants)
        self.cluster = Cluster(self._loop, self._async.cluster)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._async.endpoints

    def health(self) -> Health:
        return self._loop.run(self._async.health())

    def session(self, *, ttl_s: float = 10.0) -> AbstractContextManager[KeptSession]:
        """`with client.session(ttl_s=10) as session:`; see `AsyncClient.session`."""
        return _Block(self._loop, self._async.session(ttl_s=ttl_s))

    def lock(
        self, name: str, *, ttl_s: float = 10.0, wait_s: float = 30.0
    ) -> AbstractContextManager[Lease]:
        """`with client.lock(name) as lease:`; see `AsyncClient.lock`. A lost lock is raised as
        `LockLost` in the thread that entered the block, at `lease.check()` and on leaving it."""
        return _Block(self._loop, self._async.lock(name, ttl_s=ttl_s, wait_s=wait_s))

    def close(self) -> None:
        """Closes the connections and stops the loop thread. Calls still running in other
        threads end at once, as `AsyncClient.close` says: `UnknownOutcome` (indefinite) when a
        try of a write had been sent, else `ClusterUnavailable` (definite). The sessions and
        locks of blocks still running (in any thread) are no longer kept alive and are marked
        lost at once: `check()` and leaving the block raise `LockLost` (or `SessionLost`). Safe
        to call twice."""
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._async.close())
        finally:
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({list(self.endpoints)!r}, client_id={self.client_id!r})"
