"""The scheduling policy in the running cluster: the replicated state as the policy's view, and the
policy's decisions as one `SchedulePass` command.

The leader calls `place` on its local replica; the pass carries the scheduling revision it was
computed from, and the state machine refuses it if anything scheduling reads has changed since
(`jobs.schedule_pass`), so two leaders' passes can never both apply. The policy itself is
`xrcore.scheduler`; this module only translates:
- regions: health from heartbeats on the lease clock, devices from the last heartbeat, the
  `speed` label as relative device speed (1.0 when absent), prices, carbon and round-trip times
  as registered and measured;
- tasks: running and assigned tasks hold their room; a pending task that failed is not eligible
  until its backoff (base * 2^(failures - 1), at most max, on replicated time) has passed; a task
  whose last attempt lost its lease avoids that region while another fits (the region most likely
  died, and its heartbeats take longer to go stale than an attempt's lease); the latest
  checkpoint's region and size, and the input's, are what placing elsewhere has to move;
- run-time estimates from `machine.durations` (per tenant and entrypoint), or the policy's
  conservative default.
Tasks moving up or aside (`SchedulerSettings.move_ups_max`): the replicated `Task` keeps the
region a mover is bound for (`moving_to`) from the pass that asks it to yield until it is placed
again, and the view carries it, so every pass, on any leader, holds the same room for it.
Waiting reasons are sent only when they changed, so a stable queue writes nothing to the log: the
view carries each task's reason (`TaskInfo.reason`) and the policy leaves out the unchanged ones
before counting its budget of reasons, so that budget goes to the reasons that changed and every
waiting task gets its own within a few passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from xrcore import regions
from xrcore._clocktext import utc_text
from xrcore.commands import Placement, Preemption, SchedulePass, Waiting
from xrcore.jobs import duration_key, region_speed
from xrcore.limits import SCHEDULE_DECISIONS_MAX
from xrcore.model import Job, Task, TaskState
from xrcore.scheduler import (
    Cluster,
    GpuInfo,
    RegionInfo,
    SchedulerSettings,
    TaskInfo,
    TenantInfo,
    clip_reason,
    estimate_ms,
    schedule,
)

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = ["PlacementSettings", "cluster_view", "place"]

MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class PlacementSettings:
    retry_backoff_base_ms: int = 1_000
    retry_backoff_max_ms: int = 60_000
    decisions_max: int = 256
    # Pending tasks one pass looks at, at most (`_in_view`): the leader computes a pass on the
    # thread that runs Raft, so its time must stay well under an election timeout.
    pending_max: int = 10_000
    policy: SchedulerSettings = field(default_factory=SchedulerSettings)


def _time_text(time_ms: int) -> str:
    return utc_text(time_ms, seconds=True)


def _backoff_until_ms(task: Task, settings: PlacementSettings) -> int | None:
    if task.failures == 0:
        return None
    doublings: int = min(task.failures - 1, 30)
    delay_ms = min(settings.retry_backoff_max_ms, settings.retry_backoff_base_ms << doublings)
    return task.updated_at_ms + delay_ms


def _task_info(
    machine: StateMachine, job: Job, task: Task, settings: PlacementSettings
) -> TaskInfo | None:
    spec = job.spec
    if task.state.terminal:
        return None
    stats = machine.durations.get(duration_key(job))
    estimate = (
        settings.policy.default_estimate_ms
        if stats is None
        else estimate_ms(
            stats.count,
            stats.mean_ms,
            stats.deviation_ms,
            default_ms=settings.policy.default_estimate_ms,
        )
    )
    last = task.attempts[-1] if task.attempts else None
    checkpoint_region = None
    checkpoint_size_mb = 0
    if task.checkpoint is not None:
        checkpoint_size_mb = -(-task.checkpoint.size_bytes // MIB)
        checkpoint_region = next(
            (a.region for a in task.attempts if a.token == task.checkpoint.token), None
        )
    eligible, waiting = True, ""
    if task.state is TaskState.PENDING:
        until_ms = _backoff_until_ms(task, settings)
        if until_ms is not None and machine.now_ms < until_ms:
            eligible = False
            waiting = f"backing off after {task.failures} failure(s) until {_time_text(until_ms)}"
    live = task.live_attempt()
    return TaskInfo(
        job_id=job.job_id,
        task_index=task.index,
        tenant=spec.tenant,
        priority=spec.priority,
        state=task.state.value,
        region=task.region,
        gpus=spec.gpus,
        gpu_memory_mb=spec.gpu_memory_mb,
        gpu_model=spec.gpu_model,
        regions_allow=spec.regions_allow,
        regions_deny=spec.regions_deny,
        regions_prefer=spec.regions_prefer,
        input_size_mb=spec.input_size_mb,
        input_region=spec.input_region,
        checkpoint_size_mb=checkpoint_size_mb,
        checkpoint_region=checkpoint_region,
        submitted_ms=job.submitted_at_ms,
        estimate_ms=estimate,
        started_ms=None if live is None else live.started_at_ms,
        checkpointed_ms=None if task.checkpoint is None else task.checkpoint.committed_at_ms,
        token=None if live is None else live.token,
        preempt_requested_ms=None if live is None else live.preempt_requested_ms,
        moving_to=task.moving_to,
        cost_weight=spec.cost_weight,
        carbon_weight=spec.carbon_weight,
        eligible=eligible,
        waiting=waiting,
        reason=task.reason,
        avoid_region=(
            last.region if last is not None and last.outcome == "lease_expired" else None
        ),
    )


def cluster_view(machine: StateMachine, settings: PlacementSettings) -> Cluster:
    """The replicated state as the scheduling policy sees it."""
    region_views = tuple(
        RegionInfo(
            name=region.name,
            healthy=regions.healthy(machine, region),
            gpus=tuple(GpuInfo(model=gpu.model, memory_mb=gpu.memory_mb) for gpu in region.gpus),
            cpu_slots=region.cpu_slots,
            price_per_gpu_hour=region.price_per_gpu_hour,
            carbon_g_per_kwh=region.carbon_g_per_kwh,
            speed=region_speed(machine, region.name),
            rtt_ms=dict(region.rtt_ms),
        )
        for region in machine.regions.values()
    )
    tasks = tuple(
        info
        for job, task in _in_view(machine, settings.pending_max)
        if (info := _task_info(machine, job, task, settings)) is not None
    )
    tenants = {
        name: TenantInfo(
            name=name,
            weight=tenant.weight,
            gpus_max=tenant.gpus_max,
            tasks_max=tenant.tasks_max,
            cost_weight=tenant.cost_weight,
            carbon_weight=tenant.carbon_weight,
        )
        for name, tenant in machine.tenants.items()
    }
    return Cluster(now_ms=machine.now_ms, regions=region_views, tasks=tasks, tenants=tenants)


def _in_view(machine: StateMachine, pending_max: int) -> list[tuple[Job, Task]]:
    """The unfinished tasks a pass looks at, in submission order: every task that holds room or
    is bound for it (assigned, running, moving), and at most `pending_max` pending ones.

    The policy serves each priority class's tenants in turn and each tenant's tasks in
    submission order, so the pending tasks kept are the first of each (priority, tenant) queue,
    the bound shared between the queues as evenly as their lengths allow (a queue shorter than
    its share gives the rest to the others). Without a bound, one tenant's 100,000 queued tasks
    made every pass take over a second on the leader's Raft thread, and the cluster lost its
    leader again and again. A task further back in its queue waits, with its reason unchanged,
    until the tasks ahead of it are placed or end (as Slurm's `default_queue_depth`): a tenant
    whose first tasks cannot run can hold up its own later ones, never another tenant's."""
    kept: list[tuple[int, Job, Task]] = []
    queues: dict[tuple[int, str], list[tuple[int, Job, Task]]] = {}
    position = 0
    for job in machine.jobs.values():
        queue: list[tuple[int, Job, Task]] | None = None
        for task in job.tasks:
            state = task.state
            if state.terminal:
                continue
            position += 1
            if state is not TaskState.PENDING or task.moving_to is not None:
                kept.append((position, job, task))
                continue
            if queue is None:
                queue = queues.setdefault((job.spec.priority, job.spec.tenant), [])
            if len(queue) < pending_max:
                queue.append((position, job, task))
    remaining = pending_max
    by_length = sorted(queues.values(), key=len)
    for order, queue in enumerate(by_length):
        share = min(len(queue), remaining // (len(by_length) - order))
        kept.extend(queue[:share])
        remaining -= share
    kept.sort(key=lambda item: item[0])
    return [(job, task) for _, job, task in kept]


def place(machine: StateMachine, settings: PlacementSettings | None = None) -> SchedulePass | None:
    """One scheduling pass as a command, or None when it would change nothing."""
    settings = settings or PlacementSettings()
    decisions_max = min(settings.decisions_max, SCHEDULE_DECISIONS_MAX // 2)
    policy = replace(
        settings.policy,
        decisions_max=decisions_max,
        reasons_max=SCHEDULE_DECISIONS_MAX - decisions_max,
    )
    decisions = schedule(cluster_view(machine, settings), policy)
    waiting = []
    for (job_id, task_index), reason in decisions.waiting.items():
        if machine.jobs[job_id].tasks[task_index].reason != clip_reason(reason):
            waiting.append(
                Waiting(job_id=job_id, task_index=task_index, reason=clip_reason(reason))
            )
    if not len(decisions) and not waiting:
        return None
    return SchedulePass(
        revision=machine.schedule_revision,
        assigns=tuple(
            Placement(
                job_id=item.job_id,
                task_index=item.task_index,
                region=item.region,
                reason=clip_reason(item.reason),
            )
            for item in decisions.assigns
        ),
        unassigns=tuple(
            Waiting(job_id=item.job_id, task_index=item.task_index, reason=clip_reason(item.reason))
            for item in decisions.unassigns
        ),
        preempts=tuple(
            Preemption(
                job_id=item.job_id,
                task_index=item.task_index,
                token=item.token,
                reason=clip_reason(item.reason),
                force=item.force,
                moving_to=item.moving_to,
            )
            for item in decisions.preempts
        ),
        waiting=tuple(waiting),
    )
