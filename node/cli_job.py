"""`xr job`: submit jobs, list and inspect them, cancel them and follow them to the end."""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

import click

from node.api.jobs import JOB_STATES
from node.cli_common import (
    CommandFailed,
    FiniteFloatRange,
    client_options,
    connect,
    emit,
    format_time_ms,
    json_output,
    key_values,
    non_empty,
    one_line,
    table,
    to_document,
)
from xrcore.limits import ARRAY_SIZE_MAX, GPUS_PER_TASK_MAX, PRIORITY_MAX, PRIORITY_MIN

if TYPE_CHECKING:
    from xrcore.client import Client, Job, JobSummary, SubmittedSpec, Task

__all__ = ["job"]

# How often `xr job watch` looks at the job: a change shows at most this late.
_WATCH_POLL_S = 1.0


@click.group()
def job() -> None:
    """Submit, list, inspect, cancel and follow jobs."""


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON does not have and the API refuses.
    raise ValueError(f"{name} is not a JSON value")


def _finite_number(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        # json would read 1e999 as infinity, which the API refuses.
        raise ValueError(f"{text} is too large")
    return number


def _json_object(context: click.Context, parameter: click.Parameter, text: str | None) -> Any:
    if text is None:
        return None
    try:
        document = json.loads(text, parse_constant=_no_constant, parse_float=_finite_number)
    except ValueError as error:
        raise click.BadParameter(f"not valid JSON: {error}") from None
    except RecursionError:
        raise click.BadParameter("not valid JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise click.BadParameter("must be a JSON object, e.g. '{\"steps\": 10}'")
    return document


@job.command("submit")
@click.argument("name", callback=non_empty)
@click.option("--workload", metavar="W", help="A built-in workload to run.")
@click.option("--entrypoint", metavar="PKG.MOD:FN", help="A function to run, package.module:fn.")
@click.option(
    "--args",
    "arguments",
    metavar="JSON",
    callback=_json_object,
    help="Arguments for the workload or function, a JSON object.",
)
@click.option("--gpus", type=click.IntRange(0, GPUS_PER_TASK_MAX), default=0, help="GPUs per task.")
@click.option(
    "--array",
    "array_size",
    type=click.IntRange(1, ARRAY_SIZE_MAX),
    default=1,
    metavar="N",
    help="Run N tasks (indexes 0..N-1) [default 1].",
)
@click.option(
    "--priority",
    type=click.IntRange(PRIORITY_MIN, PRIORITY_MAX),
    default=0,
    help="Higher runs first [default 0].",
)
@click.option(
    "--cost-weight",
    type=FiniteFloatRange(0, 1000),
    metavar="W",
    help="How much price counts when placing it (0: not at all) [default: the tenant's].",
)
@click.option(
    "--carbon-weight",
    type=FiniteFloatRange(0, 1000),
    metavar="W",
    help="How much carbon counts when placing it (0: not at all) [default: the tenant's].",
)
@click.option("--wait", is_flag=True, help="Follow the job like `xr job watch` until it finishes.")
@client_options
def job_submit(
    name: str,
    workload: str | None,
    entrypoint: str | None,
    arguments: dict[str, Any] | None,
    gpus: int,
    array_size: int,
    priority: int,
    cost_weight: float | None,
    carbon_weight: float | None,
    wait: bool,
) -> int:
    """Submit a job called NAME and print its id.

    Give exactly one of --workload and --entrypoint. With --wait the exit code is 0 if the job
    succeeded and 1 if it failed or was cancelled.
    """
    if (workload is None) == (entrypoint is None):
        raise click.UsageError("give exactly one of --workload and --entrypoint")
    weights = {
        field: value
        for field, value in (("cost_weight", cost_weight), ("carbon_weight", carbon_weight))
        if value is not None
    }
    with connect() as client:
        job_id = client.jobs.submit(
            name,
            workload=workload,
            entrypoint=entrypoint,
            args=arguments or {},
            gpus=gpus,
            array_size=array_size,
            priority=priority,
            **weights,
        )
        if not wait:
            emit({"job_id": job_id}, job_id)
            return 0
        if not json_output():
            click.echo(f"submitted {job_id}")
        return _follow(client, job_id)


@job.command("ls")
# The job states the cluster filters on: a job's, not a task's ("assigned" is only a task's).
@click.option("--state", type=click.Choice(JOB_STATES), help="Only jobs in this state.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    metavar="N",
    help="At most N jobs [default: every job, read page by page].",
)
@client_options
def job_ls(state: str | None, limit: int | None) -> int:
    """List jobs in submission order."""
    from xrcore.limits import RANGE_LIMIT_MAX

    items: list[JobSummary] = []
    after: str | None = None
    with connect() as client:
        while limit is None or len(items) < limit:
            page_size = (
                RANGE_LIMIT_MAX if limit is None else min(RANGE_LIMIT_MAX, limit - len(items))
            )
            page = client.jobs.list(state=state, limit=page_size, after=after)
            items.extend(page.items)
            after = page.next
            if after is None:
                break

    def human() -> None:
        if not items:
            click.echo("no jobs")
            return
        rows = [
            [
                item.job_id,
                item.name,
                item.state,
                item.array_size,
                item.priority,
                format_time_ms(item.submitted_at_ms),
            ]
            for item in items
        ]
        click.echo(table(["JOB ID", "NAME", "STATE", "TASKS", "PRIORITY", "SUBMITTED"], rows))

    emit({"items": to_document(items)}, human)
    return 0


@job.command("show")
@click.argument("job_id", metavar="ID", callback=non_empty)
@client_options
def job_show(job_id: str) -> int:
    """Show a job: its state, each task's state, region, progress, latest metrics, result and
    attempts, and why each unfinished task is where it is or why it still waits."""
    with connect() as client:
        found = _get(client, job_id)

    def human() -> None:
        click.echo(
            key_values(
                [
                    ("job", found.job_id),
                    ("name", found.name),
                    ("state", found.state),
                    ("tenant", found.tenant),
                    ("priority", found.priority),
                    ("submitted", format_time_ms(found.submitted_at_ms)),
                    ("tasks", found.array_size),
                    ("cancel reason", found.cancel_reason or None),
                    *([] if found.spec is None else _asks(found.spec)),
                ]
            )
        )
        click.echo("")
        rows = [
            [
                task.index,
                task.state,
                task.region,
                len(task.attempts),
                task.failures,
                f"{task.done}/{task.total}" if task.total else None,
                None if task.checkpoint is None else task.checkpoint.step,
                _first_line(_present_error(task)),
            ]
            for task in found.tasks
        ]
        headers = ["TASK", "STATE", "REGION", "ATTEMPTS", "FAILURES", "PROGRESS", "CHECKPOINT"]
        click.echo(table([*headers, "ERROR"], rows))
        history = _attempt_rows(found)
        if history:
            click.echo("")
            click.echo(
                table(
                    [
                        "TASK",
                        "ATTEMPT",
                        "REGION",
                        "TOKEN",
                        "STARTED",
                        "ENDED",
                        "OUTCOME",
                        "FROM STEP",
                    ],
                    history,
                )
            )
        # Metrics and results are the job's own and may be long; a reason is the cluster's, at
        # most a message long.
        sections = [
            ("metrics (the latest each task reported):", _metrics, _bounded),
            ("results:", lambda task: task.result, _bounded),
            ("why (from the scheduler):", _present_reason, one_line),
        ]
        for title, detail, shown in sections:
            lines = [(task.index, text) for task in found.tasks if (text := detail(task))]
            if lines:
                click.echo("")
                click.echo(title)
                for index, text in lines:
                    click.echo(f"  task {index}: {shown(text)}")

    emit(found, human)
    return 0


def _metrics(task: Task) -> str | None:
    """The metrics that came with the task's latest progress report (`ctx.progress`)."""
    return ", ".join(f"{name}={value:g}" for name, value in sorted(task.metrics.items())) or None


def _present_error(task: Task) -> str | None:
    """The error that explains the task's present state: its own while it has failed, its last
    attempt's while it waits to be retried. The error of an attempt before the one that runs or
    succeeded is past: `--json` and `xr job logs --attempt N` have it."""
    last = task.attempts[-1] if task.attempts else None
    if task.state == "failed":
        return task.error
    if task.state == "pending" and last is not None and last.outcome == "failed":
        return last.error
    return None


# The task states the scheduler decides on; a finished task's reason is the old placement's.
_SCHEDULED_STATES = frozenset({"pending", "assigned", "running"})


def _present_reason(task: Task) -> str | None:
    """The scheduler's reason where it explains the task's present state.

    The cluster keeps a task's last reason after its attempt ends: a finished task still has its
    placement's, and so has a task pending again after a failed or expired attempt until the
    scheduler's next pass notes why it waits (a placement's reason starts with its region)."""
    if task.state not in _SCHEDULED_STATES or not task.reason:
        return None
    last = task.attempts[-1] if task.attempts else None
    if (
        task.state == "pending"
        and last is not None
        and last.outcome in ("failed", "lease_expired")
        and task.reason.startswith(f"{last.region}: ")
    ):
        return None
    return task.reason


# How much of a task's metrics or result one line of `xr job show` or `xr job watch` shows;
# `--json` has it all.
_DETAIL_CHARACTERS_MAX = 200


def _bounded(text: str) -> str:
    """`text` on one line, cut at `_DETAIL_CHARACTERS_MAX` characters with a note saying so."""
    shown = one_line(text)
    if len(shown) <= _DETAIL_CHARACTERS_MAX:
        return shown
    more = len(shown) - _DETAIL_CHARACTERS_MAX
    return f"{shown[:_DETAIL_CHARACTERS_MAX]}... ({more} more characters; --json has them)"


# Tasks whose attempts `xr job show` lists; `--json` has them all.
_HISTORY_TASKS_MAX = 16


def _attempt_rows(found: Job) -> list[list[Any]]:
    """Each attempt of the first tasks that had more than one (a failover, a retry, a move):
    where it ran, with which fencing token, how it ended and the checkpoint step it was given."""
    moved = [task for task in found.tasks if len(task.attempts) > 1]
    rows: list[list[Any]] = []
    for task in moved[:_HISTORY_TASKS_MAX]:
        for attempt in task.attempts:
            running = attempt.ended_at_ms is None
            rows.append(
                [
                    task.index,
                    attempt.number,
                    attempt.region,
                    attempt.token,
                    format_time_ms(attempt.started_at_ms),
                    None if running else format_time_ms(attempt.ended_at_ms),
                    "running" if running else attempt.outcome,
                    attempt.restored_step,
                ]
            )
    if len(moved) > _HISTORY_TASKS_MAX:
        more = len(moved) - _HISTORY_TASKS_MAX
        rows.append([f"... {more} more tasks with several attempts (--json)"] + [None] * 7)
    return rows


def _asks(spec: SubmittedSpec) -> list[tuple[str, Any]]:
    """What the job asked of the scheduler, for `xr job show`: its run, each task's devices,
    where it may run and how much price and carbon count."""
    devices = "a CPU slot"
    if spec.gpus:
        devices = f"{spec.gpus} GPU{'s' if spec.gpus > 1 else ''}"
    elif spec.gpu_memory_mb:
        devices = "a share of one GPU"
    details = [
        f"{spec.gpu_memory_mb} MB{' each' if spec.gpus > 1 else ''}"
        if spec.gpu_memory_mb
        else None,
        spec.gpu_model,
    ]
    shown = ", ".join(item for item in details if item)
    regions = "; ".join(
        f"{label} {', '.join(names)}"
        for label, names in (
            ("only", spec.regions_allow),
            ("not", spec.regions_deny),
            ("preferring", spec.regions_prefer),
        )
        if names
    )
    data = None
    if spec.input_size_mb:
        data = f"{spec.input_size_mb} MB" + (
            f" in {spec.input_region}" if spec.input_region else ""
        )

    def weight(value: float | None) -> str:
        return "the tenant's" if value is None else f"{value:g}"

    return [
        ("runs", spec.workload or spec.entrypoint),
        ("each task needs", devices + (f" ({shown})" if shown else "")),
        ("regions", regions or "any"),
        ("input data", data or "none"),
        (
            "weights",
            f"price {weight(spec.cost_weight)}, carbon {weight(spec.carbon_weight)}",
        ),
    ]


@job.command("cancel")
@click.argument("job_id", metavar="ID", callback=non_empty)
@click.option("--reason", default="", help="Why, kept with the job.")
@client_options
def job_cancel(job_id: str, reason: str) -> int:
    """Cancel a job's unfinished tasks."""
    with connect() as client:
        cancelled = client.jobs.cancel(job_id, reason=reason)
    emit(
        {"job_id": job_id, "cancelled_tasks": cancelled}, f"cancelled {job_id} ({cancelled} tasks)"
    )
    return 0


@job.command("watch")
@click.argument("job_id", metavar="ID", callback=non_empty)
@client_options
def job_watch(job_id: str) -> int:
    """Print the job's state changes until it finishes.

    Exit code 0 if it succeeded, 1 if it failed or was cancelled. With --json each change is one
    JSON line (the job's state and its tasks').
    """
    with connect() as client:
        return _follow(client, job_id)


def _snapshot(found: Job) -> dict[str, Any]:
    return {
        "job_id": found.job_id,
        "state": found.state,
        "tasks": [
            {
                "index": task.index,
                "state": task.state,
                "region": task.region,
                "attempts": len(task.attempts),
                "error": task.error,
                "result": task.result,
            }
            for task in found.tasks
        ],
    }


def _get(client: Client, job_id: str) -> Job:
    found = client.jobs.get(job_id)
    if found is None:
        raise CommandFailed("not_found", f"job {job_id!r} does not exist")
    return found


def _follow(client: Client, job_id: str) -> int:
    """Prints each change of the job's or its tasks' states until the job finishes."""
    previous: dict[str, Any] | None = None
    while True:
        found = _get(client, job_id)
        current = _snapshot(found)
        if current != previous:
            _print_changes(previous, current)
            previous = current
        if found.finished:
            break
        time.sleep(_WATCH_POLL_S)
    if found.state == "succeeded":
        return 0
    reason = found.cancel_reason or _first_line(
        next((error for task in found.tasks if (error := _present_error(task))), None)
    )
    raise CommandFailed(
        f"job.{found.state}",
        f"job {job_id} {found.state}" + (f": {reason}" if reason else ""),
    )


def _print_changes(previous: dict[str, Any] | None, current: dict[str, Any]) -> None:
    if json_output():
        click.echo(json.dumps(current))
        return
    before = {} if previous is None else {task["index"]: task for task in previous["tasks"]}
    if previous is None or previous["state"] != current["state"]:
        click.echo(f"job {current['job_id']}: {current['state']}")
    for task in current["tasks"]:
        if before.get(task["index"]) != task:
            where = f" in {task['region']}" if task["region"] else ""
            attempt = f" (attempt {task['attempts']})" if task["attempts"] else ""
            # A task's error is its last failed attempt's: shown while it fails or waits to be
            # retried, not beside the attempt that runs now.
            shown = task["error"] if task["state"] in ("failed", "pending") else None
            error = f": {_first_line(shown)}" if shown else ""
            returned = f", result {_bounded(task['result'])}" if task["result"] else ""
            click.echo(f"  task {task['index']}: {task['state']}{where}{attempt}{error}{returned}")


def _first_line(error: str | None) -> str | None:
    """What failed, without the traceback that follows (`xr job show --json` and
    `xr job logs` have it)."""
    if not error:
        return None
    first = error.strip().partition("\n")[0]
    return first + (" (...)" if len(first) < len(error.strip()) else "")


@job.command("logs")
@click.argument("job_id", metavar="ID", callback=non_empty)
@click.option(
    "--task",
    "task_index",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The task's index in the job array.",
)
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    default=None,
    help="The attempt's number (default: the latest).",
)
@click.option(
    "--tail-bytes",
    type=click.IntRange(1, 1 << 20),
    default=65_536,
    show_default=True,
    help="Show at most this many bytes from the end, from the first whole line in them.",
)
@client_options
def job_logs(job_id: str, task_index: int, attempt: int | None, tail_bytes: int) -> int:
    """Show a task attempt's captured output (stdout and stderr).

    The output stays on the region that ran the attempt, bounded by its executor.log_bytes_max
    (the newest part is kept); any node fetches it from there.
    """
    with connect() as client:
        logs = client.jobs.logs(
            job_id, task_index=task_index, attempt=attempt, tail_bytes=tail_bytes
        )

    def human() -> None:
        shown = _from_line_start(logs.log) if logs.truncated else logs.log
        if logs.truncated:
            click.echo(
                f"[xr: the last {len(shown.encode())} of {logs.size_bytes} bytes of task "
                f"{logs.task_index} attempt {logs.attempt} in {logs.region}]",
                err=True,
            )
        click.echo(shown, nl=False)

    emit(to_document(logs), human)
    return 0


def _from_line_start(tail: str) -> str:
    """The end of a log from the first line that starts in it: the tail was cut at a byte count,
    most likely inside a line (or a character). A tail with no line starting in it is kept
    whole."""
    _, newline, rest = tail.partition("\n")
    return rest if newline and rest else tail
