"""The web dashboard: its page and static files at `/ui`, and the two data routes it reads.

The page (`node/ui/`: one HTML file, one script, one style sheet; no build step and nothing
fetched from elsewhere, so it works offline) holds no data, so it is served to anyone, like the
API's own description. Everything it shows comes from routes that authenticate like the rest of
the API and scope to the caller's tenant exactly as the jobs, KV, lock and session routes do:

- `GET /v1/ui/state`: one snapshot of this node's replica: the node's Raft status, every region
  with its health, inventory, load and round-trip times, and the caller's newest jobs (with
  their tasks, attempts and the reason each task is where it is), locks, sessions and key count.
- `GET /v1/ui/events`: the same snapshot as Server-Sent Events, sent again whenever the replica
  applies new entries, at most `1 / _EVENTS_INTERVAL_S` times a second. It counts against
  `http.streams_max` like a watch stream. The page reads it with `fetch` (an EventSource cannot
  send the Authorization header, and a token never goes into a URL).

The stream reads the local replica without a read barrier (it cannot afford one per update, and
a dashboard must keep showing a node that lost its quorum) and says `"stale": true`;
`/v1/ui/state` reads like every other read (`consistency=linearizable` by default). Each list is
bounded and each text cut, so a snapshot's size is bounded whatever the cluster holds
(docs/ui.md, "Cost and size"), and a node builds one snapshot per tenant and index, however many
dashboards ask for it (`SnapshotCache`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import weakref
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from node.api.app import principal, read, services, still_authorized, stream_slot
from node.api.auth import Permission, Principal
from node.api.wire import open_event_stream, respond, write_to_stream
from raftstore.store import RaftStore
from xrcore import StateMachine, regions
from xrcore.model import Job, Task, TaskState

__all__ = ["STATIC_FILES", "Shared", "SnapshotCache", "routes", "snapshot", "snapshot_cache"]

routes = web.RouteTableDef()

_UI_DIR = Path(__file__).resolve().parent.parent / "ui"
# The page's files: URL path -> (file name, content type). `node.api.auth.ROUTE_RULES` makes the
# same paths public, so they are served without a token.
STATIC_FILES: dict[str, tuple[str, str]] = {
    "/ui": ("index.html", "text/html; charset=utf-8"),
    # The page again for a link or bookmark with a trailing slash.
    "/ui/": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
}
# The page runs only its own script and style sheet and talks only to this node; it may not be
# framed (clickjacking) and sends no referrer.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

# Bounds on one snapshot (docs/ui.md, "Cost and size"): whatever the cluster holds, a snapshot
# carries at most these many of each list, each beside a count of all.
JOBS_SHOWN_MAX = 50
TASKS_SHOWN_MAX = 16
# A task's latest attempts (a task has up to `Limits.attempts_total_max`, 50).
ATTEMPTS_SHOWN_MAX = 8
LOCKS_SHOWN_MAX = 100
# A lock's first waiters in queue order (up to `Limits.lock_waiters_max`, 1,000).
WAITERS_SHOWN_MAX = 20
SESSIONS_SHOWN_MAX = 100
# The first of a session's locks (up to `Limits.locks_per_session_max`, 1,000).
SESSION_LOCKS_SHOWN_MAX = 20
# Reasons and errors (up to `MESSAGE_BYTES_MAX`, 4 KiB, each) and lock names (up to
# `KEY_BYTES_MAX`, 1 KiB) are cut after these many characters, saying so: the page shows a line
# of each, an attempt's error only in a tooltip.
TEXT_SHOWN_MAX = 256
ATTEMPT_ERROR_SHOWN_MAX = 128
NAME_SHOWN_MAX = 128
# The stream sends at most one snapshot per interval, and a comment line when nothing was sent
# for the keepalive interval (so proxies and the browser keep the connection open).
_EVENTS_INTERVAL_S = 0.25
_KEEPALIVE_S = 10.0
_ACTIVE = (TaskState.ASSIGNED, TaskState.RUNNING)
_UNFINISHED = frozenset({TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING})
# Tenants whose latest snapshot a node keeps (least recently used dropped first).
_TENANTS_CACHED_MAX = 32


# The page.


def _static(path: str, file_name: str, content_type: str) -> None:
    async def serve(request: web.Request) -> web.Response:
        # Read on each request (a few kilobytes): an edited file shows on reload.
        body = (_UI_DIR / file_name).read_bytes()
        if file_name == "index.html":
            # Whether to ask for a token before the first request (a 401 is no secret either).
            enabled = services(request).auth.enabled
            body = body.replace(b"{{auth}}", b"required" if enabled else b"off")
        return web.Response(body=body, headers={**_PAGE_HEADERS, "Content-Type": content_type})

    routes.get(path)(serve)


for _path, (_file_name, _content_type) in STATIC_FILES.items():
    _static(_path, _file_name, _content_type)


# The snapshot.


def _clipped(text: str | None, limit: int = TEXT_SHOWN_MAX) -> str | None:
    """A reason, error or name as the snapshot carries it: cut after `limit` characters, saying
    so."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… (cut; {len(text)} characters in all)"


def _task_view(task: Task) -> dict[str, Any]:
    return {
        "index": task.index,
        "state": task.state.value,
        "region": task.region,
        "failures": task.failures,
        "done": task.done,
        "total": task.total,
        "reason": _clipped(task.reason),
        "error": _clipped(task.error),
        "attempt_count": len(task.attempts),
        "attempts": [
            {
                "number": attempt.number,
                "region": attempt.region,
                "token": attempt.token,
                "started_at_ms": attempt.started_at_ms,
                "ended_at_ms": attempt.ended_at_ms,
                "outcome": attempt.outcome,
                "error": _clipped(attempt.error, ATTEMPT_ERROR_SHOWN_MAX),
            }
            for attempt in task.attempts[-ATTEMPTS_SHOWN_MAX:]
        ],
    }


def _job_view(job: Job) -> dict[str, Any]:
    tasks = job.tasks
    states: dict[str, int] = {}
    for task in tasks:
        states[task.state.value] = states.get(task.state.value, 0) + 1
    shown = tasks[:TASKS_SHOWN_MAX]
    return {
        "job_id": job.job_id,
        "name": job.spec.name,
        "state": job.state,
        "priority": job.spec.priority,
        "workload": job.spec.workload,
        "entrypoint": job.spec.entrypoint,
        "submitted_at_ms": job.submitted_at_ms,
        "array_size": job.spec.array_size,
        "cancel_reason": _clipped(job.cancel_reason),
        "task_states": states,
        "done": sum(task.done for task in tasks),
        "total": sum(task.total for task in tasks),
        "regions": sorted({task.region for task in tasks if task.region is not None}),
        # Why the job is not finished yet: the first unfinished task's reason.
        "reason": _clipped(
            next((task.reason for task in tasks if not task.state.terminal and task.reason), "")
        ),
        "tasks_shown": len(shown),
        "tasks": [_task_view(task) for task in shown],
    }


def _tenant_locks(machine: StateMachine, prefix: str) -> tuple[list[dict[str, Any]], int]:
    shown: list[dict[str, Any]] = []
    count = 0
    for name, lock in machine.locks.items():
        if not name.startswith(prefix):
            continue
        count += 1
        if len(shown) < LOCKS_SHOWN_MAX:
            shown.append(
                {
                    "name": _clipped(name[len(prefix) :], NAME_SHOWN_MAX),
                    "holder": lock.holder,
                    "token": lock.token,
                    "granted_at_ms": lock.granted_at_ms,
                    "waiter_count": len(lock.waiters),
                    "waiters": lock.waiters[:WAITERS_SHOWN_MAX],
                }
            )
    shown.sort(key=lambda lock: lock["name"])
    return shown, count


def _tenant_sessions(
    machine: StateMachine, tenant: str, prefix: str
) -> tuple[list[dict[str, Any]], int]:
    shown: list[dict[str, Any]] = []
    count = 0
    for session in machine.sessions.values():
        if session.owner != tenant:
            continue
        count += 1
        if len(shown) < SESSIONS_SHOWN_MAX:
            shown.append(
                {
                    "session_id": session.session_id,
                    "ttl_ms": session.ttl_ms,
                    "remaining_ms": max(0, session.deadline_ms - machine.lease_clock_ms),
                    "granted_at_ms": session.granted_at_ms,
                    # A session holds only its own tenant's locks.
                    "lock_count": len(session.locks),
                    "locks": [
                        _clipped(name[len(prefix) :], NAME_SHOWN_MAX)
                        for name in session.locks[:SESSION_LOCKS_SHOWN_MAX]
                        if name.startswith(prefix)
                    ],
                    "keys": len(session.keys),
                }
            )
    return shown, count


def _key_count(machine: StateMachine, tenant: str) -> int:
    # Keys under "<tenant>/" sort between that prefix and "<tenant>0" ("0" follows "/").
    keys = machine.sorted_keys
    return bisect_left(keys, f"{tenant}0") - bisect_left(keys, f"{tenant}/")


@dataclass(frozen=True, slots=True)
class _Jobs:
    """Each tenant's count of jobs, in all and by state, and each region's load (tasks
    assigned to and running in it, of every tenant: a count, no names, what a region's free GPU
    memory already tells any caller who may read regions), at one schedule revision. They
    change only with it: the state machine bumps `schedule_revision` with every change of a
    task's state or region and every job added or evicted (every change scheduling reads)."""

    schedule_revision: int
    # Jobs of each tenant: how many, and how many in each state.
    held: collections.Counter[str]
    counts: dict[str, dict[str, int]]
    load: dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class _Cluster:
    """What every tenant's snapshot at one index shows alike."""

    index: int
    jobs: _Jobs
    regions: list[dict[str, Any]]
    # Region names by Raft address, to name the leader.
    region_by_address: dict[str, str]


@dataclass(slots=True)
class Shared:
    """A tenant's snapshot at one index, shared by every answer that shows it."""

    index: int
    # When it was built, on the event loop's clock.
    built_s: float
    state: dict[str, Any]
    region_by_address: dict[str, str]
    # The state as JSON, encoded once for every stream that sends it.
    encoded: bytes | None = None

    def json(self) -> bytes:
        if self.encoded is None:
            self.encoded = msgspec.json.encode(self.state)
        return self.encoded


class SnapshotCache:
    """The dashboard's snapshots of one node, shared by every stream and `/v1/ui/state` answer
    that would build the same one.

    A snapshot depends on the replica's index and the caller's tenant (its name scopes the jobs,
    locks, sessions and keys); what the caller's role changes (the Raft members) is read apart,
    per answer. Each tenant's latest snapshot is kept, so fifty open dashboards of a tenant cost
    one snapshot per change, not fifty. What all tenants' snapshots share is kept too: the
    regions at the latest index, and each tenant's job counts and the regions' load at the latest
    schedule revision (`_Jobs`), so a snapshot at a new index walks the jobs only to find the
    tenant's newest, and stops there. A finished job (every task in a terminal state) never
    changes and job ids are never reused, so its state is remembered across revisions.
    """

    def __init__(self) -> None:
        # Tenant snapshots built, by tenant (tests count them).
        self.builds: collections.Counter[str] = collections.Counter()
        self._tenants: collections.OrderedDict[str, Shared] = collections.OrderedDict()
        self._cluster: _Cluster | None = None
        # Finished jobs' states by job id; ids of evicted jobs are dropped now and then.
        self._finished: dict[str, str] = {}

    def shared(
        self,
        machine: StateMachine,
        tenant: str,
        *,
        now_s: float,
        newer_than: int | None = None,
    ) -> Shared:
        """The tenant's snapshot at the machine's index. With `newer_than` (the index an event
        stream sent last), a snapshot built less than `_EVENTS_INTERVAL_S` ago at a later index
        than that one serves too: streams that wake one after another while entries apply keep
        to one snapshot per interval between them, each sent at most an interval late."""
        kept = self._tenants.get(tenant)
        if kept is not None and (
            kept.index == machine.index
            or (
                newer_than is not None
                and kept.index > newer_than
                and now_s - kept.built_s < _EVENTS_INTERVAL_S
            )
        ):
            self._tenants.move_to_end(tenant)
            return kept
        cluster = self._cluster_at(machine)
        made = Shared(
            index=machine.index,
            built_s=now_s,
            state=_tenant_state(machine, tenant, cluster),
            region_by_address=cluster.region_by_address,
        )
        self.builds[tenant] += 1
        self._tenants[tenant] = made
        self._tenants.move_to_end(tenant)
        while len(self._tenants) > _TENANTS_CACHED_MAX:
            self._tenants.popitem(last=False)
        return made

    def _cluster_at(self, machine: StateMachine) -> _Cluster:
        if self._cluster is not None and self._cluster.index == machine.index:
            return self._cluster
        jobs = self._cluster.jobs if self._cluster is not None else None
        if jobs is None or jobs.schedule_revision != machine.schedule_revision:
            jobs = self._jobs(machine)
        views = regions.list_(machine)
        for view in views:
            view["load"] = jobs.load.get(view["name"], {"assigned": 0, "running": 0})
            del view["raft_address"]
        self._cluster = _Cluster(
            index=machine.index,
            jobs=jobs,
            regions=views,
            region_by_address={
                region.raft_address: name for name, region in machine.regions.items()
            },
        )
        return self._cluster

    def _jobs(self, machine: StateMachine) -> _Jobs:
        if len(self._finished) > 2 * len(machine.jobs) + JOBS_SHOWN_MAX:
            self._finished = {
                job_id: state for job_id, state in self._finished.items() if job_id in machine.jobs
            }
        held: collections.Counter[str] = collections.Counter()
        counts: dict[str, dict[str, int]] = {}
        load: dict[str, dict[str, int]] = {}
        for job_id, job in machine.jobs.items():
            tenant = job.spec.tenant
            state = self._finished.get(job_id)
            if state is None:
                states = set()
                for task in job.tasks:
                    states.add(task.state)
                    if task.state in _ACTIVE and task.region is not None:
                        region = load.setdefault(task.region, {"assigned": 0, "running": 0})
                        region[task.state.value] += 1
                if states.isdisjoint(_UNFINISHED):
                    state = self._finished[job_id] = job.state
                else:
                    # `Job.state` of a job with a task not finished, without its three passes
                    # over the tasks (most of a snapshot's cost with thousands of jobs waiting).
                    state = "running" if TaskState.RUNNING in states else "pending"
            held[tenant] += 1
            by_state = counts.setdefault(tenant, {})
            by_state[state] = by_state.get(state, 0) + 1
        return _Jobs(
            schedule_revision=machine.schedule_revision, held=held, counts=counts, load=load
        )


def _tenant_state(machine: StateMachine, tenant: str, cluster: _Cluster) -> dict[str, Any]:
    # The tenant's newest jobs: the walk stops once it has found as many as there are to show.
    wanted = min(JOBS_SHOWN_MAX, cluster.jobs.held[tenant])
    newest: list[Job] = []
    if wanted:
        for job_id in reversed(machine.jobs):
            job = machine.jobs[job_id]
            if job.spec.tenant == tenant:
                newest.append(job)
                if len(newest) == wanted:
                    break
    prefix = f"{tenant}/"
    lock_views, lock_count = _tenant_locks(machine, prefix)
    session_views, session_count = _tenant_sessions(machine, tenant, prefix)
    return {
        "index": machine.index,
        "now_ms": machine.now_ms,
        "revision": machine.revision,
        "regions": cluster.regions,
        "jobs": [_job_view(job) for job in newest],
        "job_counts": dict(cluster.jobs.counts.get(tenant, {})),
        "locks": lock_views,
        "lock_count": lock_count,
        "sessions": session_views,
        "session_count": session_count,
        "key_count": _key_count(machine, tenant),
    }


# One cache per node (its store), made on first use.
_CACHES: weakref.WeakKeyDictionary[RaftStore, SnapshotCache] = weakref.WeakKeyDictionary()


def snapshot_cache(store: RaftStore) -> SnapshotCache:
    """The node's snapshot cache."""
    cache = _CACHES.get(store)
    if cache is None:
        cache = _CACHES[store] = SnapshotCache()
    return cache


def snapshot(machine: StateMachine, caller: Principal) -> dict[str, Any]:
    """What the dashboard shows of the replicated state, as `caller` may see it (built afresh)."""
    return SnapshotCache().shared(machine, caller.tenant, now_s=0.0).state


def _node(
    request: web.Request, caller: Principal, region_by_address: dict[str, str]
) -> dict[str, Any]:
    """This node's view of the Raft group; its members only for a caller who may read them
    (`GET /v1/cluster/members` needs the same permission)."""
    node = services(request)
    status = node.store.status()
    leader = status["leader"]
    view: dict[str, Any] = {
        "region": node.config.region.name,
        "state": status["state"],
        "leader": leader,
        "leader_region": None if leader is None else region_by_address.get(leader),
        "has_quorum": status["has_quorum"],
        "term": status["term"],
        "commit_index": status["commit_index"],
        "applied_index": status["applied_index"],
    }
    if caller.may(Permission.READ_MEMBERS):
        view["members"] = [
            {
                "region": region_by_address.get(member["address"]),
                "connected": member["connected"],
                "match_index": member["match_index"],
            }
            for member in status["members"]
        ]
    return view


def _principal_view(caller: Principal) -> dict[str, str]:
    return {"name": caller.name, "role": caller.role, "tenant": caller.tenant}


def _caller(request: web.Request) -> Principal:
    # The snapshot shows regions and cluster status besides the tenant's own data.
    caller = principal(request, Permission.READ_CLUSTER)
    caller.require(Permission.DATA)
    return caller


@routes.get("/v1/ui/state")
async def state(request: web.Request) -> web.Response:
    caller = _caller(request)
    cache = snapshot_cache(services(request).store)
    now_s = asyncio.get_running_loop().time()
    result = await read(request, functools.partial(cache.shared, tenant=caller.tenant, now_s=now_s))
    shared: Shared = result.value
    document = {
        "principal": _principal_view(caller),
        "node": _node(request, caller, shared.region_by_address),
        **shared.state,
        "stale": result.stale,
    }
    return respond(request, document)


def _state_event(request: web.Request, caller: Principal, shared: Shared) -> bytes:
    """An `event: state` with the shared snapshot's JSON, encoded once for all streams, after
    what is the caller's own (the principal, the node as it may see it)."""
    own = msgspec.json.encode(
        {
            "principal": _principal_view(caller),
            "node": _node(request, caller, shared.region_by_address),
            "stale": True,
        }
    )
    # Both are JSON objects with members: `{own...}` and `{state...}` make `{own..., state...}`.
    return b"event: state\ndata: " + own[:-1] + b"," + shared.json()[1:] + b"\n\n"


@routes.get("/v1/ui/events")
async def events(request: web.Request) -> web.StreamResponse:
    caller = _caller(request)
    with stream_slot(request):
        response = await open_event_stream(request)
        await _send_snapshots(request, response, caller)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response


async def _send_snapshots(
    request: web.Request, response: web.StreamResponse, caller: Principal
) -> None:
    """A snapshot now, then one after each batch of applied entries, until the client goes away
    or the node stops."""
    node = services(request)
    store = node.store
    cache = snapshot_cache(store)
    loop = asyncio.get_running_loop()
    sent_index = -1
    sent_s = loop.time()
    try:
        while not node.stopping.is_set():
            # A client that went away frees its stream slot within a second, even when nothing
            # changes (a write would find out only at the next keepalive).
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            # A revoked token's stream ends; the page reconnects, is refused and signs out.
            if not still_authorized(request, caller):
                return
            index = store.replica.read(lambda machine: machine.index)
            if index != sent_index:
                shared: Shared = store.replica.read(
                    functools.partial(
                        cache.shared,
                        tenant=caller.tenant,
                        now_s=loop.time(),
                        newer_than=sent_index,
                    )
                )
                sent_index = shared.index
                await write_to_stream(request, response, _state_event(request, caller, shared))
                sent_s = loop.time()
                # The throttle: entries applied meanwhile go into the next snapshot.
                await asyncio.sleep(_EVENTS_INTERVAL_S)
            elif loop.time() - sent_s >= _KEEPALIVE_S:
                await write_to_stream(request, response, b": keepalive\n\n")
                sent_s = loop.time()
            await store.wait_applied(sent_index, timeout_s=1.0)
    except ConnectionResetError:
        # The page was closed or reloaded.
        return
