"""Jobs: submit, list (filtered, paged), get (optionally waiting for the job to finish), cancel,
and the event timeline of a job's attempts. Jobs belong to the caller's tenant."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from aiohttp import web

from node.api.app import principal, query_wait_s, read, services, waiting_slot, write
from node.api.auth import Principal
from node.api.wire import (
    field,
    query_int,
    query_text,
    read_body,
    reject_unknown,
    respond,
)
from xrcore import jobs
from xrcore.commands import JobCancel, JobSpec, JobSubmit
from xrcore.errors import InvalidArgument, NotFound
from xrcore.limits import JOB_ID_BYTES_MAX, MESSAGE_BYTES_MAX, RANGE_LIMIT_MAX
from xrcore.model import TaskState

__all__ = ["JOB_STATES", "routes"]

routes = web.RouteTableDef()
_SPEC_FIELDS = frozenset(set(JobSpec.__struct_fields__) - {"tenant"})
_FINISHED = frozenset(state.value for state in TaskState if state.terminal)
# A job's state is derived from its tasks' (`Job.state`): a job whose tasks are assigned but not
# yet running is still pending, so "assigned" is a task state and never a job's.
JOB_STATES = ("pending", "running", "succeeded", "failed", "cancelled")


def _spec(body: dict[str, Any], caller: Principal) -> JobSpec:
    unknown = sorted(set(body) - _SPEC_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"unknown job field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_SPEC_FIELDS))}"
        )
    document = dict(body)
    args = document.get("args")
    if isinstance(args, dict):
        # Arguments may be given as an object; the spec stores them as JSON text.
        document["args"] = msgspec.json.encode(args).decode()
    elif "args" in document and not isinstance(args, str):
        # The spec's own check would say "Expected `str`", naming only the text form.
        raise InvalidArgument(f"invalid job spec: args must be a JSON object, not {_kind(args)}")
    document["tenant"] = caller.tenant
    try:
        return msgspec.convert(document, JobSpec)
    except msgspec.ValidationError as error:
        raise InvalidArgument(f"invalid job spec: {error}") from None


def _kind(value: Any) -> str:
    """What a JSON value other than an object or a string is, in words."""
    kinds = {list: "an array", bool: "a boolean", int: "a number", float: "a number"}
    return kinds.get(type(value), "null")


def _job_id(request: web.Request) -> str:
    job_id = request.match_info["job_id"]
    if len(job_id) > JOB_ID_BYTES_MAX:
        raise InvalidArgument(f"the job id is longer than {JOB_ID_BYTES_MAX} characters")
    return job_id


def _owned(caller: Principal, job_id: str, view: dict[str, Any]) -> dict[str, Any]:
    if view["tenant"] != caller.tenant:
        raise NotFound(f"job {job_id!r} does not exist")
    return view


@routes.post("/v1/jobs")
async def submit(request: web.Request) -> web.Response:
    caller = principal(request)
    spec = _spec(await read_body(request), caller)
    return respond(request, await write(request, JobSubmit(spec=spec)), status=201)


@routes.get("/v1/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    caller = principal(request)
    state = query_text(request, "state")
    if state is not None and state not in JOB_STATES:
        raise InvalidArgument(f"state must be one of {', '.join(JOB_STATES)}, not {state!r}")
    limit = query_int(request, "limit", default=100, low=1, high=RANGE_LIMIT_MAX)
    assert limit is not None
    after = query_text(request, "after", maximum_bytes=JOB_ID_BYTES_MAX)
    result = await read(
        request,
        lambda machine: jobs.list_(
            machine, tenant=caller.tenant, state=state, limit=limit, after=after
        ),
    )
    return respond(request, {**result.value, "stale": result.stale})


def _finished(view: dict[str, Any]) -> bool:
    return all(task["state"] in _FINISHED for task in view["tasks"])


@routes.get("/v1/jobs/{job_id}")
async def get(request: web.Request) -> web.Response:
    """`?wait_s=S` waits up to S seconds for the job to finish before answering."""
    caller = principal(request)
    job_id = _job_id(request)
    waited_s = query_wait_s(request)
    result = await read(request, lambda machine: jobs.get(machine, job_id))
    view = _owned(caller, job_id, result.value)
    if waited_s > 0 and not _finished(view):
        async with waiting_slot(request):
            view = await _wait_finished(request, job_id, waited_s, result.index)
    return respond(request, {**view, "stale": result.stale})


async def _wait_finished(
    request: web.Request, job_id: str, timeout_s: float, index: int
) -> dict[str, Any]:
    store = services(request).store
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + timeout_s
    while True:
        view, index = store.replica.read(lambda machine: (jobs.get(machine, job_id), machine.index))
        remaining_s = deadline_s - loop.time()
        if _finished(view) or remaining_s <= 0 or services(request).stopping.is_set():
            return view
        await store.wait_applied(index, timeout_s=min(remaining_s, 1.0))


@routes.post("/v1/jobs/{job_id}/cancel")
async def cancel(request: web.Request) -> web.Response:
    caller = principal(request)
    job_id = _job_id(request)
    body = await read_body(request, required=False)
    reject_unknown(body, {"reason"})
    reason = field(body, "reason", str, default="")
    if len(reason.encode()) > MESSAGE_BYTES_MAX:
        raise InvalidArgument(f"reason is longer than {MESSAGE_BYTES_MAX} bytes")
    found = await read(request, lambda machine: jobs.get(machine, job_id))
    _owned(caller, job_id, found.value)
    return respond(request, await write(request, JobCancel(job_id=job_id, reason=reason)))


@routes.get("/v1/jobs/{job_id}/events")
async def events(request: web.Request) -> web.Response:
    """The job's timeline: submission, then each attempt's start and end, in time order."""
    caller = principal(request)
    job_id = _job_id(request)
    result = await read(request, lambda machine: jobs.get(machine, job_id))
    view = _owned(caller, job_id, result.value)
    timeline: list[dict[str, Any]] = [
        {"at_ms": view["submitted_at_ms"], "kind": "submitted", "task_index": None}
    ]
    for task in view["tasks"]:
        for attempt in task["attempts"]:
            base = {
                "task_index": task["index"],
                "attempt": attempt["number"],
                "region": attempt["region"],
                "token": attempt["token"],
            }
            timeline.append(
                {
                    "at_ms": attempt["started_at_ms"],
                    "kind": "attempt.started",
                    "restored_step": attempt["restored_step"],
                    **base,
                }
            )
            if attempt["ended_at_ms"] is not None:
                timeline.append(
                    {
                        "at_ms": attempt["ended_at_ms"],
                        "kind": "attempt.ended",
                        "outcome": attempt["outcome"],
                        "error": attempt["error"],
                        **base,
                    }
                )
    timeline.sort(key=lambda event: event["at_ms"])
    return respond(
        request,
        {"job_id": job_id, "state": view["state"], "events": timeline, "stale": result.stale},
    )


_LOG_TAIL_BYTES_MAX = 1 << 20


@routes.get("/v1/jobs/{job_id}/logs")
async def logs(request: web.Request) -> web.Response:
    """The end of one attempt's captured output. Logs stay on the region that ran the attempt;
    another node forwards the request there."""
    caller = principal(request)
    job_id = _job_id(request)
    task_index = query_int(request, "task_index", default=0, low=0)
    number = query_int(request, "attempt", low=1)
    tail_bytes = query_int(request, "tail_bytes", default=65536, low=1, high=_LOG_TAIL_BYTES_MAX)
    assert task_index is not None and tail_bytes is not None
    result = await read(request, lambda machine: jobs.get(machine, job_id))
    view = _owned(caller, job_id, result.value)
    if task_index >= len(view["tasks"]):
        raise NotFound(f"job {job_id!r} has no task {task_index}")
    attempts = view["tasks"][task_index]["attempts"]
    chosen = next((a for a in reversed(attempts) if number is None or a["number"] == number), None)
    if chosen is None:
        raise NotFound(
            f"task {task_index} of job {job_id!r} has no attempt "
            f"{'yet' if number is None else number}"
        )
    node = services(request)
    if chosen["region"] != node.config.region.name:
        from node.api.cluster import forward_to_region

        return await forward_to_region(request, chosen["region"])
    from node.executor.executor import logs_path

    path = logs_path(node.config.data_dir, job_id, task_index, chosen["number"])
    try:
        with path.open("rb") as source:
            size = source.seek(0, 2)
            source.seek(max(0, size - tail_bytes))
            data = source.read()
    except FileNotFoundError:
        size, data = 0, b""
    return respond(
        request,
        {
            "job_id": job_id,
            "task_index": task_index,
            "attempt": chosen["number"],
            "region": chosen["region"],
            "log": data.decode(errors="replace"),
            "truncated": size > len(data),
            "size_bytes": size,
        },
    )
