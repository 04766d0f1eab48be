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
bounded, so a snapshot stays small whatever the cluster holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from node.api.app import principal, read, services, still_authorized, stream_slot
from node.api.auth import Permission, Principal
from node.api.wire import open_event_stream, respond, write_to_stream
from xrcore import StateMachine, regions
from xrcore.model import Job, Task, TaskState

__all__ = ["STATIC_FILES", "routes", "snapshot"]

routes = web.RouteTableDef()

_UI_DIR = Path(__file__).resolve().parent.parent / "ui"
# The page's files: URL path -> (file name, content type). `node.api.auth.ROUTE_RULES` makes the
# same paths public, so they are served without a token.
STATIC_FILES: dict[str, tuple[str, str]] = {
    "/ui": ("index.html", "text/html; charset=utf-8"),
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

# Bounds on one snapshot.
JOBS_SHOWN_MAX = 50
TASKS_SHOWN_MAX = 16
LOCKS_SHOWN_MAX = 100
SESSIONS_SHOWN_MAX = 100
# The stream sends at most one snapshot per interval, and a comment line when nothing was sent
# for the keepalive interval (so proxies and the browser keep the connection open).
_EVENTS_INTERVAL_S = 0.25
_KEEPALIVE_S = 10.0
_ACTIVE = (TaskState.ASSIGNED, TaskState.RUNNING)


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


def _region_load(machine: StateMachine) -> dict[str, dict[str, int]]:
    """Tasks assigned to and running in each region, of every tenant (a count, no names: what
    a region's free GPU memory already tells any caller who may read regions)."""
    load: dict[str, dict[str, int]] = {}
    for job in machine.jobs.values():
        for task in job.tasks:
            if task.state in _ACTIVE and task.region is not None:
                counts = load.setdefault(task.region, {"assigned": 0, "running": 0})
                counts[task.state.value] += 1
    return load


def _task_view(task: Task) -> dict[str, Any]:
    return {
        "index": task.index,
        "state": task.state.value,
        "region": task.region,
        "failures": task.failures,
        "done": task.done,
        "total": task.total,
        "reason": task.reason,
        "error": task.error,
        "attempts": [
            {
                "number": attempt.number,
                "region": attempt.region,
                "token": attempt.token,
                "started_at_ms": attempt.started_at_ms,
                "ended_at_ms": attempt.ended_at_ms,
                "outcome": attempt.outcome,
                "error": attempt.error,
            }
            for attempt in task.attempts
        ],
    }


def _job_view(job: Job) -> dict[str, Any]:
    tasks = job.tasks
    states: dict[str, int] = {}
    for task in tasks:
        states[task.state.value] = states.get(task.state.value, 0) + 1
    return {
        "job_id": job.job_id,
        "name": job.spec.name,
        "state": job.state,
        "priority": job.spec.priority,
        "workload": job.spec.workload,
        "entrypoint": job.spec.entrypoint,
        "submitted_at_ms": job.submitted_at_ms,
        "array_size": job.spec.array_size,
        "cancel_reason": job.cancel_reason,
        "task_states": states,
        "done": sum(task.done for task in tasks),
        "total": sum(task.total for task in tasks),
        "regions": sorted({task.region for task in tasks if task.region is not None}),
        # Why the job is not finished yet: the first unfinished task's reason.
        "reason": next(
            (task.reason for task in tasks if not task.state.terminal and task.reason), ""
        ),
        "tasks": [_task_view(task) for task in tasks[:TASKS_SHOWN_MAX]],
    }


def _tenant_jobs(machine: StateMachine, tenant: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    counts: dict[str, int] = {}
    newest: list[Job] = []
    for job_id in reversed(machine.jobs):
        job = machine.jobs[job_id]
        if job.spec.tenant != tenant:
            continue
        counts[job.state] = counts.get(job.state, 0) + 1
        if len(newest) < JOBS_SHOWN_MAX:
            newest.append(job)
    return [_job_view(job) for job in newest], counts


def _tenant_locks(machine: StateMachine, caller: Principal) -> tuple[list[dict[str, Any]], int]:
    shown: list[dict[str, Any]] = []
    count = 0
    for name, lock in machine.locks.items():
        unscoped = caller.unscoped(name)
        if unscoped is None:
            continue
        count += 1
        if len(shown) < LOCKS_SHOWN_MAX:
            shown.append(
                {
                    "name": unscoped,
                    "holder": lock.holder,
                    "token": lock.token,
                    "granted_at_ms": lock.granted_at_ms,
                    "waiters": list(lock.waiters),
                }
            )
    shown.sort(key=lambda lock: lock["name"])
    return shown, count


def _tenant_sessions(machine: StateMachine, caller: Principal) -> tuple[list[dict[str, Any]], int]:
    shown: list[dict[str, Any]] = []
    count = 0
    for session in machine.sessions.values():
        if session.owner != caller.tenant:
            continue
        count += 1
        if len(shown) < SESSIONS_SHOWN_MAX:
            shown.append(
                {
                    "session_id": session.session_id,
                    "ttl_ms": session.ttl_ms,
                    "remaining_ms": max(0, session.deadline_ms - machine.lease_clock_ms),
                    "granted_at_ms": session.granted_at_ms,
                    "locks": [caller.unscoped(name) for name in session.locks],
                    "keys": len(session.keys),
                }
            )
    return shown, count


def _key_count(machine: StateMachine, caller: Principal) -> int:
    # Keys under "<tenant>/" sort between that prefix and "<tenant>0" ("0" follows "/").
    keys = machine.sorted_keys
    return bisect_left(keys, f"{caller.tenant}0") - bisect_left(keys, caller.prefix)


def snapshot(machine: StateMachine, caller: Principal) -> dict[str, Any]:
    """What the dashboard shows of the replicated state, as `caller` may see it."""
    load = _region_load(machine)
    region_views = regions.list_(machine)
    for view in region_views:
        view["load"] = load.get(view["name"], {"assigned": 0, "running": 0})
        del view["raft_address"]
    job_views, job_counts = _tenant_jobs(machine, caller.tenant)
    lock_views, lock_count = _tenant_locks(machine, caller)
    session_views, session_count = _tenant_sessions(machine, caller)
    return {
        "index": machine.index,
        "now_ms": machine.now_ms,
        "revision": machine.revision,
        "regions": region_views,
        "jobs": job_views,
        "job_counts": job_counts,
        "locks": lock_views,
        "lock_count": lock_count,
        "sessions": session_views,
        "session_count": session_count,
        "key_count": _key_count(machine, caller),
    }


def _node(request: web.Request, region_by_address: dict[str, str]) -> dict[str, Any]:
    """This node's view of the Raft group."""
    node = services(request)
    status = node.store.status()
    leader = status["leader"]
    return {
        "region": node.config.region.name,
        "state": status["state"],
        "leader": leader,
        "leader_region": None if leader is None else region_by_address.get(leader),
        "has_quorum": status["has_quorum"],
        "term": status["term"],
        "commit_index": status["commit_index"],
        "applied_index": status["applied_index"],
        "members": [
            {
                "region": region_by_address.get(member["address"]),
                "connected": member["connected"],
                "match_index": member["match_index"],
            }
            for member in status["members"]
        ],
    }


_Found = tuple[dict[str, Any], dict[str, str]]


def _query(caller: Principal) -> Callable[[StateMachine], _Found]:
    """The snapshot, and region names by Raft address (to name the leader), in one read."""

    def query(machine: StateMachine) -> _Found:
        addresses = {region.raft_address: name for name, region in machine.regions.items()}
        return snapshot(machine, caller), addresses

    return query


def _document(
    request: web.Request,
    caller: Principal,
    found: _Found,
    *,
    stale: bool,
) -> dict[str, Any]:
    state, region_by_address = found
    return {
        "principal": {"name": caller.name, "role": caller.role, "tenant": caller.tenant},
        "node": _node(request, region_by_address),
        **state,
        "stale": stale,
    }


def _caller(request: web.Request) -> Principal:
    # The snapshot shows regions and cluster status besides the tenant's own data.
    caller = principal(request, Permission.READ_CLUSTER)
    caller.require(Permission.DATA)
    return caller


@routes.get("/v1/ui/state")
async def state(request: web.Request) -> web.Response:
    caller = _caller(request)
    result = await read(request, _query(caller))
    return respond(request, _document(request, caller, result.value, stale=result.stale))


def _event(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n"


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
                document = _document(
                    request, caller, store.replica.read(_query(caller)), stale=True
                )
                sent_index = document["index"]
                await write_to_stream(request, response, _event("state", document))
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
