"""Jobs, their tasks and attempts: the lifecycle as a table, fenced by attempt tokens.

A job has one task per array index. A task is placed in a region (assign), started there by an
executor (claim, which creates an attempt with a new fencing token and a lease that the executor
renews with heartbeats), and ends in exactly one terminal state. Every update
from an executor carries its attempt's token; an update with any other token is from a stale
attempt (a zombie) and is rejected without changing anything. An attempt whose lease runs out on
the lease clock is ended by the state machine and its task goes back to pending, keeping its last
committed checkpoint, so the next attempt resumes from there.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from xrcore import tenants
from xrcore._validate import check_page_limit
from xrcore.commands import (
    JobCancel,
    JobSpec,
    JobSubmit,
    SchedulePass,
    TaskAssign,
    TaskCheckpoint,
    TaskClaim,
    TaskComplete,
    TaskFail,
    TaskHeartbeat,
    TaskUnassign,
    TaskYield,
)
from xrcore.errors import (
    CapacityExceeded,
    CheckpointNotNewer,
    InvalidArgument,
    InvalidTransition,
    NotFound,
    StaleSchedule,
    StaleToken,
)
from xrcore.model import Attempt, Checkpoint, DurationStats, Effect, Job, Task, TaskState

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = [
    "SPEED_MAX",
    "SPEED_MIN",
    "TRANSITIONS",
    "Event",
    "Job",
    "assign",
    "cancel",
    "checkpoint",
    "claim",
    "complete",
    "expire_attempt",
    "fail",
    "get",
    "heartbeat",
    "list_",
    "live_deadlines",
    "schedule_pass",
    "submit",
    "unassign",
    "yield_",
]


class Event(StrEnum):
    ASSIGN = "assign"
    UNASSIGN = "unassign"
    CLAIM = "claim"
    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    LEASE_LOST = "lease_lost"
    PREEMPT = "preempt"
    CANCEL = "cancel"


P, A, R = TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING
S, F, C = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED

# Every allowed task transition; anything else is rejected by `_move`.
TRANSITIONS: dict[tuple[TaskState, Event], TaskState] = {
    (P, Event.ASSIGN): A,
    (A, Event.UNASSIGN): P,
    (A, Event.CLAIM): R,
    (R, Event.COMPLETE): S,
    (R, Event.RETRY): P,
    (R, Event.FAIL): F,
    (R, Event.LEASE_LOST): P,
    (R, Event.PREEMPT): P,
    (P, Event.CANCEL): C,
    (A, Event.CANCEL): C,
    (R, Event.CANCEL): C,
}


def _check_move(task: Task, event: Event) -> TaskState:
    target = TRANSITIONS.get((task.state, event))
    if target is None:
        raise InvalidTransition(f"task {task.index} is {task.state.value}; it cannot {event.value}")
    return target


def _move(machine: StateMachine, task: Task, target: TaskState) -> None:
    """Moves a task to a state `_check_move` allowed, keeping the count of active tasks."""
    if target.terminal:
        machine.tasks_active -= 1
    if target in (TaskState.PENDING, TaskState.CANCELLED):
        task.region = None
    task.state = target
    task.updated_at_ms = machine.now_ms
    machine.schedule_revision += 1


def _job(machine: StateMachine, job_id: str) -> Job:
    job = machine.jobs.get(job_id)
    if job is None:
        raise NotFound(f"job {job_id!r} does not exist")
    return job


def _task(machine: StateMachine, job_id: str, task_index: int) -> tuple[Job, Task]:
    job = _job(machine, job_id)
    if task_index >= len(job.tasks):
        raise NotFound(f"job {job_id!r} has no task {task_index}")
    return job, job.tasks[task_index]


def _live(machine: StateMachine, job_id: str, task_index: int, token: int) -> tuple[Task, Attempt]:
    """The running attempt that `token` names, or `StaleToken`."""
    _, task = _task(machine, job_id, task_index)
    attempt = task.live_attempt()
    if attempt is None or attempt.token != token:
        current = None if attempt is None else attempt.token
        raise StaleToken(
            f"token {token} is not the live attempt of {job_id}[{task_index}] "
            f"(task is {task.state.value}, live token {current})"
        )
    return task, attempt


def _end_attempt(machine: StateMachine, job_id: str, task: Task, outcome: str) -> None:
    attempt = task.attempts[-1]
    attempt.ended_at_ms = machine.now_ms
    attempt.outcome = outcome
    machine.effects.append(
        Effect(
            kind="attempt.ended",
            job_id=job_id,
            task_index=task.index,
            token=attempt.token,
            reason=outcome,
        )
    )


# Commands.


def submit(machine: StateMachine, command: JobSubmit, index: int) -> dict[str, Any]:
    spec = command.spec
    limits = machine.limits
    if machine.tasks_active + spec.array_size > limits.tasks_active_max:
        raise CapacityExceeded(
            f"{machine.tasks_active} tasks are active; {spec.array_size} more would pass the "
            f"maximum of {limits.tasks_active_max}"
        )
    # A tenant at its own jobs quota makes room from its own finished jobs, never another's.
    evicted = tenants.jobs_to_evict(machine, spec.tenant, spec.array_size)
    if not evicted and len(machine.jobs) >= limits.jobs_max:
        oldest = next((job_id for job_id, job in machine.jobs.items() if _finished(job)), None)
        if oldest is None:
            raise CapacityExceeded(f"the maximum of {limits.jobs_max} unfinished jobs is reached")
        evicted = [oldest]
    for job_id in evicted:
        del machine.jobs[job_id]
    job_id = f"job-{index}"
    tasks = [
        Task(index=position, updated_at_ms=machine.now_ms) for position in range(spec.array_size)
    ]
    machine.jobs[job_id] = Job(
        job_id=job_id, spec=spec, submitted_at_ms=machine.now_ms, tasks=tasks
    )
    machine.tasks_active += spec.array_size
    machine.schedule_revision += 1
    return {"job_id": job_id, "tasks": spec.array_size}


def _finished(job: Job) -> bool:
    return all(task.state.terminal for task in job.tasks)


def cancel(machine: StateMachine, command: JobCancel, index: int) -> dict[str, Any]:
    job = _job(machine, command.job_id)
    if _finished(job):
        raise InvalidTransition(f"job {command.job_id!r} has already finished ({job.state})")
    cancelled = 0
    for task in job.tasks:
        if task.state.terminal:
            continue
        target = _check_move(task, Event.CANCEL)
        if task.state is TaskState.RUNNING:
            _end_attempt(machine, job.job_id, task, "cancelled")
        _move(machine, task, target)
        cancelled += 1
    job.cancel_reason = command.reason
    return {"job_id": job.job_id, "cancelled_tasks": cancelled}


def assign(machine: StateMachine, command: TaskAssign, index: int) -> dict[str, Any]:
    job, task = _task(machine, command.job_id, command.task_index)
    if command.region not in machine.regions:
        raise NotFound(f"region {command.region!r} is not registered")
    if not job.spec.allows(command.region):
        raise InvalidArgument(f"job {job.job_id!r} does not allow region {command.region!r}")
    target = _check_move(task, Event.ASSIGN)
    _move(machine, task, target)
    task.region = command.region
    task.moving_to = None
    return {"job_id": job.job_id, "task_index": task.index, "region": command.region}


def unassign(machine: StateMachine, command: TaskUnassign, index: int) -> dict[str, Any]:
    job, task = _task(machine, command.job_id, command.task_index)
    _move(machine, task, _check_move(task, Event.UNASSIGN))
    return {"job_id": job.job_id, "task_index": task.index}


def claim(machine: StateMachine, command: TaskClaim, index: int) -> dict[str, Any]:
    job, task = _task(machine, command.job_id, command.task_index)
    target = _check_move(task, Event.CLAIM)
    if task.region != command.region:
        raise InvalidTransition(
            f"task {job.job_id}[{task.index}] is assigned to {task.region!r}, "
            f"not {command.region!r}"
        )
    deadline_ms = machine.lease_clock_ms + command.lease_ttl_ms
    token = machine.issue_token()
    restored = task.checkpoint
    attempt = Attempt(
        number=len(task.attempts) + 1,
        token=token,
        region=command.region,
        executor_id=command.executor_id,
        started_at_ms=machine.now_ms,
        lease_ttl_ms=command.lease_ttl_ms,
        deadline_ms=deadline_ms,
        restored_step=None if restored is None else restored.step,
    )
    task.attempts.append(attempt)
    _move(machine, task, target)
    machine.watch_attempt(deadline_ms, job.job_id, task.index, token)
    return {
        "job_id": job.job_id,
        "task_index": task.index,
        "token": token,
        "attempt": attempt.number,
        "checkpoint": None if restored is None else _checkpoint_view(restored),
    }


def heartbeat(machine: StateMachine, command: TaskHeartbeat, index: int) -> dict[str, Any]:
    task, attempt = _live(machine, command.job_id, command.task_index, command.token)
    attempt.deadline_ms = machine.lease_clock_ms + attempt.lease_ttl_ms
    machine.watch_attempt(attempt.deadline_ms, command.job_id, task.index, attempt.token)
    task.done = command.done
    task.total = command.total
    task.metrics = dict(command.metrics)
    task.updated_at_ms = machine.now_ms
    return {
        "token": attempt.token,
        "lease_remaining_ms": attempt.lease_ttl_ms,
        # The executor checkpoints and stops the attempt, then sends `TaskYield`.
        "preempt": attempt.preempt_requested_ms is not None,
    }


def yield_(machine: StateMachine, command: TaskYield, index: int) -> dict[str, Any]:
    """A preempted attempt has checkpointed and stopped: its task goes back to pending without
    counting a failure, and resumes from its last committed checkpoint."""
    task, attempt = _live(machine, command.job_id, command.task_index, command.token)
    if attempt.preempt_requested_ms is None:
        raise InvalidTransition(
            f"task {command.job_id}[{command.task_index}] was not asked to yield; only "
            "preempted attempts yield"
        )
    target = _check_move(task, Event.PREEMPT)
    _end_attempt(machine, command.job_id, task, "preempted")
    _move(machine, task, target)
    return {"job_id": command.job_id, "task_index": task.index, "state": task.state.value}


def checkpoint(machine: StateMachine, command: TaskCheckpoint, index: int) -> dict[str, Any]:
    task, attempt = _live(machine, command.job_id, command.task_index, command.token)
    previous = task.checkpoint
    if previous is not None and command.step <= previous.step:
        raise CheckpointNotNewer(
            f"checkpoint step {command.step} is not newer than the committed step {previous.step}"
        )
    task.checkpoint = Checkpoint(
        step=command.step,
        uri=command.uri,
        checksum=command.checksum,
        size_bytes=command.size_bytes,
        token=attempt.token,
        committed_at_ms=machine.now_ms,
    )
    task.updated_at_ms = machine.now_ms
    return {"step": command.step, "token": attempt.token}


def complete(machine: StateMachine, command: TaskComplete, index: int) -> dict[str, Any]:
    task, _ = _live(machine, command.job_id, command.task_index, command.token)
    target = _check_move(task, Event.COMPLETE)
    _end_attempt(machine, command.job_id, task, "succeeded")
    task.result = command.result
    _move(machine, task, target)
    _record_duration(machine, machine.jobs[command.job_id], task)
    return {"job_id": command.job_id, "task_index": task.index, "state": task.state.value}


def fail(machine: StateMachine, command: TaskFail, index: int) -> dict[str, Any]:
    job, _ = _task(machine, command.job_id, command.task_index)
    task, attempt = _live(machine, command.job_id, command.task_index, command.token)
    failures = task.failures + 1
    retry = (
        command.retryable
        and failures < job.spec.max_attempts
        and len(task.attempts) < machine.limits.attempts_total_max
    )
    target = _check_move(task, Event.RETRY if retry else Event.FAIL)
    attempt.error = command.error
    _end_attempt(machine, job.job_id, task, "failed")
    task.failures = failures
    task.error = command.error
    _move(machine, task, target)
    return {
        "job_id": job.job_id,
        "task_index": task.index,
        "state": task.state.value,
        "retrying": retry,
    }


def expire_attempt(
    machine: StateMachine, job_id: str, task_index: int, token: int, deadline_ms: int
) -> None:
    """Ends an attempt whose lease ran out, if that deadline is still the live one."""
    job = machine.jobs.get(job_id)
    if job is None:
        return
    task = job.tasks[task_index]
    attempt = task.live_attempt()
    if attempt is None or attempt.token != token or attempt.deadline_ms != deadline_ms:
        return
    exhausted = len(task.attempts) >= machine.limits.attempts_total_max
    target = _check_move(task, Event.FAIL if exhausted else Event.LEASE_LOST)
    _end_attempt(machine, job_id, task, "lease_expired")
    if exhausted:
        task.error = f"lease lost; {len(task.attempts)} attempts in all"
    _move(machine, task, target)


def duration_key(job: Job) -> str:
    """Run times are learned per tenant and entrypoint (or built-in workload)."""
    return f"{job.spec.tenant}/{job.spec.entrypoint or job.spec.workload}"


# The `speed` label's range (a node refuses a label outside it at its configuration check).
SPEED_MIN = 0.01
SPEED_MAX = 100.0


def region_speed(machine: StateMachine, region: str) -> float:
    """A region's relative device speed, from its `speed` label (1.0 when absent or invalid)."""
    record = machine.regions.get(region)
    text = "" if record is None else record.labels.get("speed", "")
    try:
        speed = float(text)
    except ValueError:
        return 1.0
    return speed if SPEED_MIN <= speed <= SPEED_MAX else 1.0


def _record_duration(machine: StateMachine, job: Job, task: Task) -> None:
    """Adds a completed task's run time (all its attempts, normalized by each region's speed) to
    its tenant and entrypoint's statistics."""
    run_ms = 0
    for attempt in task.attempts:
        ended = attempt.ended_at_ms if attempt.ended_at_ms is not None else machine.now_ms
        run_ms += int(max(ended - attempt.started_at_ms, 0) * region_speed(machine, attempt.region))
    key = duration_key(job)
    stats = machine.durations.pop(key, None)
    if stats is None:
        stats = DurationStats(count=1, mean_ms=run_ms, deviation_ms=run_ms // 2)
        if len(machine.durations) >= machine.limits.durations_max:
            del machine.durations[next(iter(machine.durations))]
    else:
        stats.count += 1
        stats.mean_ms += (run_ms - stats.mean_ms) // 4
        stats.deviation_ms += (abs(run_ms - stats.mean_ms) - stats.deviation_ms) // 4
    # Re-inserted last: the table drops the least recently updated first.
    machine.durations[key] = stats


def schedule_pass(machine: StateMachine, command: SchedulePass, index: int) -> dict[str, Any]:
    """Applies one scheduling pass's decisions together, if computed from the current revision."""
    if command.revision != machine.schedule_revision:
        raise StaleSchedule(
            f"pass computed at scheduling revision {command.revision}; it is now "
            f"{machine.schedule_revision}"
        )
    seen: set[tuple[str, int]] = set()
    moves: list[tuple[Task, TaskState, str, str | None]] = []
    for placement in command.assigns:
        job, task = _task(machine, placement.job_id, placement.task_index)
        if placement.region not in machine.regions:
            raise NotFound(f"region {placement.region!r} is not registered")
        if not job.spec.allows(placement.region):
            raise InvalidArgument(f"job {job.job_id!r} does not allow region {placement.region!r}")
        moves.append((task, _check_move(task, Event.ASSIGN), placement.reason, placement.region))
    for taken in command.unassigns:
        _, task = _task(machine, taken.job_id, taken.task_index)
        moves.append((task, _check_move(task, Event.UNASSIGN), taken.reason, None))
    ended: list[tuple[str, Task]] = []
    asked: list[tuple[Task, Attempt, str, str | None]] = []
    for preemption in command.preempts:
        task, attempt = _live(machine, preemption.job_id, preemption.task_index, preemption.token)
        if preemption.moving_to is not None and preemption.moving_to not in machine.regions:
            raise NotFound(f"region {preemption.moving_to!r} is not registered")
        if preemption.force:
            moves.append((task, _check_move(task, Event.PREEMPT), preemption.reason, None))
            ended.append((preemption.job_id, task))
        elif attempt.preempt_requested_ms is None:
            asked.append((task, attempt, preemption.reason, preemption.moving_to))
        else:
            raise InvalidTransition(
                f"task {preemption.job_id}[{preemption.task_index}] was already asked to yield"
            )
    refs = [(item.job_id, item.task_index) for item in command.assigns]
    refs += [(item.job_id, item.task_index) for item in command.unassigns]
    refs += [(item.job_id, item.task_index) for item in command.preempts]
    for key in refs:
        if key in seen:
            raise InvalidArgument(f"task {key[0]}[{key[1]}] is decided twice")
        seen.add(key)
    waiting = []
    for note in command.waiting:
        _, task = _task(machine, note.job_id, note.task_index)
        waiting.append((task, note.reason))
    # Everything checked: apply.
    for task, attempt, reason, moving_to in asked:
        attempt.preempt_requested_ms = machine.now_ms
        task.reason = reason
        task.moving_to = moving_to
        machine.schedule_revision += 1
    for job_id, task in ended:
        _end_attempt(machine, job_id, task, "preempted")
    for task, target, reason, region in moves:
        _move(machine, task, target)
        task.region = region
        task.reason = reason
        if target is TaskState.ASSIGNED:
            # Placed: a move up is over (wherever the pass put it).
            task.moving_to = None
    for task, reason in waiting:
        if task.state is TaskState.PENDING:
            task.reason = reason
    return {
        "assigned": len(command.assigns),
        "unassigned": len(command.unassigns),
        "preempted": len(command.preempts),
        "schedule_revision": machine.schedule_revision,
    }


def live_deadlines(machine: StateMachine) -> list[tuple[int, str, int, int]]:
    return [
        (attempt.deadline_ms, job.job_id, task.index, attempt.token)
        for job in machine.jobs.values()
        for task in job.tasks
        if (attempt := task.live_attempt()) is not None
    ]


# Queries.


def _checkpoint_view(point: Checkpoint) -> dict[str, Any]:
    return {
        "step": point.step,
        "uri": point.uri,
        "checksum": point.checksum,
        "size_bytes": point.size_bytes,
        "token": point.token,
        "committed_at_ms": point.committed_at_ms,
    }


def _task_view(task: Task) -> dict[str, Any]:
    live = task.live_attempt()
    return {
        "index": task.index,
        "state": task.state.value,
        "region": task.region,
        "token": None if live is None else live.token,
        "failures": task.failures,
        "done": task.done,
        "total": task.total,
        "metrics": dict(task.metrics),
        "checkpoint": None if task.checkpoint is None else _checkpoint_view(task.checkpoint),
        "result": task.result,
        "error": task.error,
        "reason": task.reason,
        "moving_to": task.moving_to,
        "attempts": [
            {
                "number": attempt.number,
                "token": attempt.token,
                "region": attempt.region,
                "executor_id": attempt.executor_id,
                "started_at_ms": attempt.started_at_ms,
                "ended_at_ms": attempt.ended_at_ms,
                "outcome": attempt.outcome,
                "restored_step": attempt.restored_step,
                "error": attempt.error,
            }
            for attempt in task.attempts
        ],
    }


def _spec_view(spec: JobSpec) -> dict[str, Any]:
    """The job's spec as it was submitted: every field, the defaults included, `args` as an
    object."""
    view: dict[str, Any] = {}
    for name in spec.__struct_fields__:
        value = getattr(spec, name)
        view[name] = list(value) if isinstance(value, tuple) else value
    view["args"] = json.loads(spec.args)
    return view


def _job_view(job: Job, *, with_tasks: bool) -> dict[str, Any]:
    view: dict[str, Any] = {
        "job_id": job.job_id,
        "name": job.spec.name,
        "tenant": job.spec.tenant,
        "state": job.state,
        "priority": job.spec.priority,
        "submitted_at_ms": job.submitted_at_ms,
        "array_size": job.spec.array_size,
        "cancel_reason": job.cancel_reason,
    }
    if with_tasks:
        view["spec"] = _spec_view(job.spec)
        view["tasks"] = [_task_view(task) for task in job.tasks]
    return view


def get(machine: StateMachine, job_id: str) -> dict[str, Any]:
    return _job_view(_job(machine, job_id), with_tasks=True)


def list_(
    machine: StateMachine,
    *,
    tenant: str | None = None,
    state: str | None = None,
    limit: int = 100,
    after: str | None = None,
) -> dict[str, Any]:
    """Jobs in submission order, filtered, at most `limit`, starting after job `after`."""
    check_page_limit(limit)
    items: list[dict[str, Any]] = []
    started = after is None
    more = False
    for job_id, job in machine.jobs.items():
        if not started:
            started = job_id == after
            continue
        if tenant is not None and job.spec.tenant != tenant:
            continue
        if state is not None and job.state != state:
            continue
        if len(items) == limit:
            more = True
            break
        items.append(_job_view(job, with_tasks=False))
    return {"items": items, "next": items[-1]["job_id"] if more else None}
