"""Replays a job trace against a scheduling policy in simulated time: no processes, no sleeping.

The simulator stands in for the running cluster around `xrcore.scheduler.schedule` (or any
function of the same type, such as the baselines in `bench/scheduler.py`):
- **Time** is a heap of events (job arrivals, transfers done, tasks done, region failures and
  recoveries). The policy is called after every batch of events at one instant that leaves a task
  pending, a task asked to yield, or room freed by a task's end or a region's recovery, and at
  least once a simulated minute while any task is pending or asked to yield, with the same
  `Cluster` view the running cluster builds (`xrcore.placement`): running tasks hold their room,
  each with its attempt's start, its last checkpoint and its fencing token.
- **Decisions** are applied as the cluster would: an assignment holds the devices at once (the
  simulator's own ledger per region, `xrcore.devices`, like each region's executor) and starts
  running once the input data and the latest checkpoint have moved (`transfer_ms`); a preemption
  stops the attempt (matching token only) and puts the task back to pending (one that moves up
  or aside keeps its `moving_to` in the view until it is assigned again); a take-back returns an
  assigned task to pending. A decision that does not fit the simulator's ledger, or breaks a
  tenant's quota, is refused and counted as a violation, which the tests require to be zero.
- **Run time** is the task's true work (which the policy never sees) divided by the region's
  speed. The policy sees estimates learned from completed tasks of the same tenant and entrypoint,
  exactly as `xrcore.jobs` learns them (integer moving averages, weight 1/4, of the run time of
  all attempts normalized by speed), or the default before any completed.
- **Checkpoints** commit every `checkpoint_interval_ms` of run time; preemption and a region's
  failure lose the work since the last one, and the next attempt moves that checkpoint from the
  region that wrote it (storage outlives a region's compute outage).
- **Failures**: when a region fails, its assigned and running tasks go back to pending and avoid
  it while another region fits (their leases expired); it returns healthy and empty at recovery.

`simulate(trace, policy)` returns per-job completion times and cluster totals (`Result`). The same
trace, policy and seed give the same result.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import cast

if __name__ == "__main__":
    # Run as a script, a module does nothing or fails on an import: say whose it is.
    print(
        f"{__file__} is a module of bench/scheduler.py, not a script: run "
        "python bench/scheduler.py",
        file=sys.stderr,
    )
    raise SystemExit(2)

from bench.scheduler_trace import MINUTE_MS, Trace, TraceJob
from xrcore.devices import DeviceLedger, Grant
from xrcore.scheduler import (
    Cluster,
    Decisions,
    RegionInfo,
    SchedulerSettings,
    TaskInfo,
    estimate_ms,
    transfer_ms,
)

__all__ = ["Policy", "Result", "SimSettings", "jain_index", "percentile", "simulate"]

Policy = Callable[[Cluster, SchedulerSettings], Decisions]

HOUR_MS = 60 * MINUTE_MS


@dataclass(frozen=True, kw_only=True)
class SimSettings:
    checkpoint_interval_ms: int = 30 * MINUTE_MS
    # A task asked to yield (a preemption without `force`) checkpoints and stops after this
    # long; None: it never yields, and only a forced preemption ends it.
    yield_ms: int | None = 30_000
    tick_ms: int = MINUTE_MS
    # A named limit on the loop: passes before the run is declared stuck.
    passes_max: int = 2_000_000
    policy: SchedulerSettings = field(default_factory=SchedulerSettings)
    # Check capacity and quotas after every pass (the tests do; the benchmark need not).
    check_invariants: bool = True


@dataclass(kw_only=True)
class Result:
    policy: str
    completion_ms: dict[str, int]  # job_id -> completion time (finish - submission)
    ideal_ms: dict[str, int]  # job_id -> its longest task's work at speed 1.0
    tenant_of: dict[str, str]
    # Per job: when its first task first started computing, and where its last task ran.
    first_start_ms: dict[str, int]
    last_region: dict[str, str]
    # GPU time held by assigned and running tasks, and GPU time of healthy regions, both over
    # the arrival window (after it, the cluster drains and utilization says little).
    busy_gpu_ms: float
    capacity_gpu_ms: float
    cost_dollars: float
    carbon_kg: float
    preemptions: int  # asked to yield or ended, for a higher priority task or to move up
    moves: int  # of those, asked to yield to move (up to a faster region, or aside)
    lost_work_gpu_ms: float  # reference GPU time lost to preemption and failures
    violations: list[str]
    unfinished: list[str]
    passes: int
    policy_seconds: float
    makespan_ms: int

    @property
    def utilization(self) -> float:
        return self.busy_gpu_ms / self.capacity_gpu_ms if self.capacity_gpu_ms else 0.0


@dataclass(eq=False)
class _Task:
    job: TraceJob
    index: int
    work_ms: int
    info: TaskInfo
    state: str = "pending"
    region: str | None = None
    grant: Grant | None = None
    token: int | None = None
    # When this attempt was assigned (holds devices) and when its computing began.
    assigned_ms: int = 0
    run_start_ms: int = 0
    done_ms: float = 0.0  # committed work (at speed 1.0), from checkpoints
    checkpointed_ms: int | None = None
    checkpoint_region: str | None = None
    attempts_run_ms: float = 0.0  # run time of all attempts, normalized by speed
    preempt_requested_ms: int | None = None  # asked to yield, not yet stopped
    avoid_region: str | None = None
    # Moving up: the faster region it was asked to yield for, until it is placed again.
    moving_to: str | None = None

    @property
    def ref(self) -> tuple[str, int]:
        return (self.job.job_id, self.index)


@dataclass
class _Stats:
    count: int = 0
    mean_ms: int = 0
    deviation_ms: int = 0

    def add(self, run_ms: int) -> None:
        # The same integer updates as `xrcore.jobs._record_duration`.
        if self.count == 0:
            self.count, self.mean_ms, self.deviation_ms = 1, run_ms, run_ms // 2
            return
        self.count += 1
        self.mean_ms += (run_ms - self.mean_ms) // 4
        self.deviation_ms += (abs(run_ms - self.mean_ms) - self.deviation_ms) // 4


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[min(int(rank), len(ordered)) - 1]


def jain_index(values: list[float]) -> float:
    """Jain's fairness index: 1 when all values are equal, 1/n when one has everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(value * value for value in values))


class _Simulation:
    def __init__(self, trace: Trace, policy: Policy, name: str, settings: SimSettings) -> None:
        self.trace = trace
        self.policy = policy
        self.settings = settings
        self.regions = {region.name: region for region in trace.regions}
        self.region_views = dict(self.regions)
        self.ledgers = {name: self._empty_ledger(region) for name, region in self.regions.items()}
        self.now_ms = 0
        self.sequence = 0
        self.events: list[tuple[int, int, str, object]] = []
        self.tasks: dict[tuple[str, int], _Task] = {}
        self.left: dict[str, int] = {}  # job_id -> tasks not yet done
        self.stats: dict[str, _Stats] = {}
        self.next_token = 1
        self.pending = 0
        self.asked: set[tuple[str, int]] = set()  # running tasks asked to yield
        self.result = Result(
            policy=name,
            completion_ms={},
            ideal_ms={},
            tenant_of={},
            first_start_ms={},
            last_region={},
            busy_gpu_ms=0.0,
            capacity_gpu_ms=0.0,
            cost_dollars=0.0,
            carbon_kg=0.0,
            preemptions=0,
            moves=0,
            lost_work_gpu_ms=0.0,
            violations=[],
            unfinished=[],
            passes=0,
            policy_seconds=0.0,
            makespan_ms=0,
        )
        for job in trace.jobs:
            self._push(job.submitted_ms, "arrive", job)
        for outage in trace.outages:
            self._push(outage.start_ms, "fail", outage.region)
            self._push(outage.end_ms, "recover", outage.region)
        self.healthy_gpus = sum(len(region.gpus) for region in trace.regions)
        self.last_account_ms = 0
        self.window_ms = int(trace.hours * HOUR_MS)
        self.held_gpus = 0.0
        # Passes in a row that decided nothing: with no events left, two mean the run is stuck.
        self._idle_passes = 0

    @staticmethod
    def _empty_ledger(region: RegionInfo) -> DeviceLedger:
        return DeviceLedger(
            memory_mb=[gpu.memory_mb for gpu in region.gpus],
            models=[gpu.model for gpu in region.gpus],
        )

    def _push(self, at_ms: int, kind: str, payload: object) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (at_ms, self.sequence, kind, payload))

    # Accounting: capacity of healthy regions and GPU time held, integrated between events.

    def _advance(self, to_ms: int) -> None:
        span_ms = min(to_ms, self.window_ms) - self.last_account_ms
        if span_ms > 0:
            self.result.capacity_gpu_ms += self.healthy_gpus * span_ms
            self.result.busy_gpu_ms += self.held_gpus * span_ms
            self.last_account_ms += span_ms
        self.now_ms = to_ms

    def _charge(self, task: _Task, from_ms: int) -> None:
        """Adds the cost and carbon of holding `task`'s devices since `from_ms`."""
        assert task.region is not None
        region = self.regions[task.region]
        self.held_gpus -= task.info.gpu_units
        gpu_ms = task.info.gpu_units * max(self.now_ms - from_ms, 0)
        hours = gpu_ms / HOUR_MS
        self.result.cost_dollars += hours * region.price_per_gpu_hour
        self.result.carbon_kg += (
            hours * self.settings.policy.gpu_power_kw * region.carbon_g_per_kwh / 1000
        )

    # Estimates and the policy's view.

    def _estimate_ms(self, job: TraceJob) -> int:
        stats = self.stats.get(job.duration_key)
        default_ms = self.settings.policy.default_estimate_ms
        if stats is None:
            return default_ms
        return estimate_ms(stats.count, stats.mean_ms, stats.deviation_ms, default_ms=default_ms)

    def _refresh(self, task: _Task) -> None:
        """Rebuilds the task's view after a change of state."""
        job = task.job
        has_checkpoint = task.checkpoint_region is not None
        task.info = replace(
            task.info,
            state=task.state,
            region=task.region,
            estimate_ms=self._estimate_ms(job),
            checkpoint_size_mb=job.checkpoint_size_mb if has_checkpoint else 0,
            checkpoint_region=task.checkpoint_region,
            started_ms=task.run_start_ms if task.state == "running" else None,
            checkpointed_ms=task.checkpointed_ms,
            token=task.token if task.state == "running" else None,
            avoid_region=task.avoid_region,
            preempt_requested_ms=task.preempt_requested_ms if task.state == "running" else None,
            moving_to=task.moving_to,
        )

    def _commit_checkpoints(self, task: _Task) -> None:
        """Brings a running task's committed work and last checkpoint up to now."""
        interval_ms = self.settings.checkpoint_interval_ms
        region = self.regions[task.region or ""]
        since_ms = task.run_start_ms
        if task.checkpointed_ms is not None and task.checkpointed_ms > since_ms:
            since_ms = task.checkpointed_ms
        count = (self.now_ms - since_ms) // interval_ms
        if count <= 0:
            return
        task.checkpointed_ms = since_ms + count * interval_ms
        task.done_ms = min(
            float(task.work_ms),
            task.done_ms + count * interval_ms * region.speed,
        )
        task.checkpoint_region = task.region
        self._refresh(task)

    def _view(self) -> Cluster:
        infos = []
        for task in self.tasks.values():
            if task.state == "running" and task.run_start_ms <= self.now_ms:
                self._commit_checkpoints(task)
            infos.append(task.info)
        return Cluster(
            now_ms=self.now_ms,
            regions=tuple(self.region_views.values()),
            tasks=tuple(infos),
            tenants=self.trace.tenants,
        )

    # Events.

    def _arrive(self, job: TraceJob) -> None:
        self.left[job.job_id] = len(job.work_ms)
        self.result.tenant_of[job.job_id] = job.tenant
        self.result.ideal_ms[job.job_id] = max(job.work_ms)
        for index, work_ms in enumerate(job.work_ms):
            info = TaskInfo(
                job_id=job.job_id,
                task_index=index,
                tenant=job.tenant,
                priority=job.priority,
                gpus=job.gpus,
                gpu_memory_mb=job.gpu_memory_mb,
                regions_allow=job.regions_allow,
                input_size_mb=job.input_size_mb,
                input_region=job.input_region,
                submitted_ms=job.submitted_ms,
                estimate_ms=self._estimate_ms(job),
            )
            task = _Task(job=job, index=index, work_ms=work_ms, info=info)
            self.tasks[task.ref] = task
            self.pending += 1

    def _start(self, ref: tuple[str, int], token: int) -> None:
        task = self.tasks.get(ref)
        if task is None or task.token != token or task.state != "assigned":
            return  # Taken back or stopped while its data moved.
        region = self.regions[task.region or ""]
        task.state = "running"
        task.run_start_ms = self.now_ms
        self.result.first_start_ms.setdefault(task.job.job_id, self.now_ms)
        remaining_ms = max(task.work_ms - task.done_ms, 0.0)
        self._push(self.now_ms + int(-(-remaining_ms // region.speed)), "finish", (ref, token))
        self._refresh(task)

    def _finish(self, ref: tuple[str, int], token: int) -> None:
        task = self.tasks.get(ref)
        if task is None or task.token != token or task.state != "running":
            return
        region = self.regions[task.region or ""]
        self._charge(task, task.assigned_ms)
        task.attempts_run_ms += (self.now_ms - task.run_start_ms) * region.speed
        self._release(task)
        del self.tasks[ref]
        self.asked.discard(ref)
        job = task.job
        self.stats.setdefault(job.duration_key, _Stats()).add(int(task.attempts_run_ms))
        # Pending siblings and later jobs of this class now see the new estimate.
        for other in self.tasks.values():
            if other.job.duration_key == job.duration_key:
                self._refresh(other)
        self.left[job.job_id] -= 1
        if self.left[job.job_id] == 0:
            del self.left[job.job_id]
            self.result.completion_ms[job.job_id] = self.now_ms - job.submitted_ms
            self.result.last_region[job.job_id] = region.name
            self.result.makespan_ms = self.now_ms

    def _stop(self, task: _Task, *, avoid: bool) -> None:
        """Ends an attempt (preempted, or its region failed): back to pending, from the last
        checkpoint."""
        region = self.regions[task.region or ""]
        self._charge(task, task.assigned_ms)
        if task.state == "running":
            self._commit_checkpoints(task)
            run_ms = self.now_ms - task.run_start_ms
            task.attempts_run_ms += run_ms * region.speed
            since_ms = max(task.run_start_ms, task.checkpointed_ms or 0)
            self.result.lost_work_gpu_ms += (
                max(self.now_ms - since_ms, 0) * region.speed * task.info.gpu_units
            )
        task.avoid_region = task.region if avoid else None
        task.preempt_requested_ms = None
        self.asked.discard(task.ref)
        self._release(task)
        task.state, task.region, task.token = "pending", None, None
        self.pending += 1
        self._refresh(task)

    def _yield(self, ref: tuple[str, int], token: int) -> None:
        """A preempted task's executor has written a checkpoint and stopped it: no work lost."""
        task = self.tasks.get(ref)
        if task is None or task.token != token or task.state != "running":
            return
        self._commit_checkpoints(task)
        since_ms = max(task.run_start_ms, task.checkpointed_ms or 0)
        if self.now_ms > since_ms:
            speed = self.regions[task.region or ""].speed
            task.done_ms = min(float(task.work_ms), task.done_ms + (self.now_ms - since_ms) * speed)
            task.checkpointed_ms = self.now_ms
            task.checkpoint_region = task.region
        self._stop(task, avoid=False)

    def _release(self, task: _Task) -> None:
        if task.grant is not None and task.region is not None:
            self.ledgers[task.region].release(task.grant)
        task.grant = None

    def _fail(self, name: str) -> None:
        if not self.region_views[name].healthy:
            return
        self.region_views[name] = replace(self.region_views[name], healthy=False)
        self.healthy_gpus -= len(self.regions[name].gpus)
        for task in list(self.tasks.values()):
            if task.region == name and task.state in ("assigned", "running"):
                self._stop(task, avoid=True)
        self.ledgers[name] = self._empty_ledger(self.regions[name])

    def _recover(self, name: str) -> None:
        if self.region_views[name].healthy:
            return
        self.region_views[name] = replace(self.region_views[name], healthy=True)
        self.healthy_gpus += len(self.regions[name].gpus)

    # Decisions.

    def _apply(self, decisions: Decisions) -> None:
        for unassign in decisions.unassigns:
            task = self.tasks.get((unassign.job_id, unassign.task_index))
            if task is not None and task.state == "assigned":
                self._stop(task, avoid=False)
        for preempt in decisions.preempts:
            task = self.tasks.get((preempt.job_id, preempt.task_index))
            if task is None or task.state != "running" or task.token != preempt.token:
                continue  # A stale fencing token: the attempt already ended.
            if preempt.force:
                if task.preempt_requested_ms is None:
                    self.result.preemptions += 1
                self._stop(task, avoid=False)
            elif task.preempt_requested_ms is None:
                # Asked to yield: the executor checkpoints and stops after `yield_ms` (or never,
                # and the policy ends it after its grace).
                self.result.preemptions += 1
                if preempt.moving_to is not None:
                    self.result.moves += 1
                task.preempt_requested_ms = self.now_ms
                task.moving_to = preempt.moving_to
                self.asked.add(task.ref)
                if self.settings.yield_ms is not None:
                    at_ms = self.now_ms + self.settings.yield_ms
                    self._push(at_ms, "yield", (task.ref, task.token))
                self._refresh(task)
        for assign in decisions.assigns:
            task = self.tasks.get((assign.job_id, assign.task_index))
            if task is None or task.state != "pending":
                self.result.violations.append(f"{assign}: not pending")
                continue
            if not self.region_views[assign.region].healthy:
                self.result.violations.append(f"{assign}: unhealthy region")
                continue
            if not task.info.allows(assign.region):
                self.result.violations.append(f"{assign}: region not allowed")
                continue
            grant = self.ledgers[assign.region].reserve(
                gpus=task.job.gpus, memory_mb=task.job.gpu_memory_mb
            )
            if grant is None:
                self.result.violations.append(f"{assign}: over capacity")
                continue
            self._assign(task, assign.region, grant)
        if self.settings.check_invariants:
            self._check_quotas()

    def _assign(self, task: _Task, region: str, grant: Grant) -> None:
        regions = self.region_views
        moving_ms = transfer_ms(
            task.job.input_size_mb, task.job.input_region, region, regions, self.settings.policy
        )
        if task.checkpoint_region is not None:
            moving_ms += transfer_ms(
                task.job.checkpoint_size_mb,
                task.checkpoint_region,
                region,
                regions,
                self.settings.policy,
            )
        task.state, task.region, task.grant = "assigned", region, grant
        task.moving_to = None
        task.token = self.next_token
        self.next_token += 1
        task.assigned_ms = self.now_ms
        self.held_gpus += task.info.gpu_units
        self.pending -= 1
        self._push(self.now_ms + int(moving_ms), "start", (task.ref, task.token))
        self._refresh(task)

    def _check_quotas(self) -> None:
        gpus: dict[str, float] = {}
        counts: dict[str, int] = {}
        for task in self.tasks.values():
            if task.state != "pending":
                gpus[task.job.tenant] = gpus.get(task.job.tenant, 0.0) + task.info.gpu_units
                counts[task.job.tenant] = counts.get(task.job.tenant, 0) + 1
        for name, tenant in self.trace.tenants.items():
            if tenant.gpus_max is not None and gpus.get(name, 0.0) > tenant.gpus_max:
                self.result.violations.append(f"{name}: {gpus[name]} GPUs over its quota")
            if tenant.tasks_max is not None and counts.get(name, 0) > tenant.tasks_max:
                self.result.violations.append(f"{name}: {counts[name]} tasks over its quota")

    # The loop.

    def run(self) -> Result:
        tick_ms = self.settings.tick_ms
        while self.events or (self.pending and self.left):
            next_event_ms = self.events[0][0] if self.events else None
            next_tick_ms = (self.now_ms // tick_ms + 1) * tick_ms
            # Ticks while tasks wait, or while asked tasks have not yielded (the policy ends
            # them after its grace).
            ticking = self.pending or self.asked
            freed = False
            if ticking and (next_event_ms is None or next_tick_ms < next_event_ms):
                if next_event_ms is None and not self._could_progress():
                    break
                self._advance(next_tick_ms)
            else:
                assert next_event_ms is not None
                self._advance(next_event_ms)
                while self.events and self.events[0][0] == next_event_ms:
                    _, _, kind, payload = heapq.heappop(self.events)
                    freed = freed or kind in ("finish", "recover")
                    self._handle(kind, payload)
            # As the running cluster passes every poll interval, a pass also follows room freed
            # with nothing waiting: the policy may move running tasks up into it.
            if self.pending or self.asked or freed:
                self._pass()
            if self.result.passes >= self.settings.passes_max:
                break
        self.result.unfinished = sorted(self.left)
        return self.result

    def _could_progress(self) -> bool:
        """With no events left, only a pass can move things; it can if any region is healthy
        and something is running or could be placed. A stuck run stops after the policy
        declined everything in an idle cluster."""
        return any(task.state != "pending" for task in self.tasks.values()) or (
            self.result.passes < self.settings.passes_max and self._idle_passes < 2
        )

    def _handle(self, kind: str, payload: object) -> None:
        if kind == "arrive":
            assert isinstance(payload, TraceJob)
            self._arrive(payload)
        elif kind == "start":
            ref, token = cast(tuple[tuple[str, int], int], payload)
            self._start(ref, token)
        elif kind == "finish":
            ref, token = cast(tuple[tuple[str, int], int], payload)
            self._finish(ref, token)
        elif kind == "yield":
            ref, token = cast(tuple[tuple[str, int], int], payload)
            self._yield(ref, token)
        elif kind == "fail":
            assert isinstance(payload, str)
            self._fail(payload)
        elif kind == "recover":
            assert isinstance(payload, str)
            self._recover(payload)

    def _pass(self) -> None:
        view = self._view()
        started = time.perf_counter()
        decisions = self.policy(view, self.settings.policy)
        self.result.policy_seconds += time.perf_counter() - started
        self.result.passes += 1
        if decisions.assigns or decisions.preempts or decisions.unassigns:
            self._idle_passes = 0
        else:
            self._idle_passes += 1
        self._apply(decisions)


def simulate(
    trace: Trace,
    policy: Policy,
    *,
    name: str = "policy",
    settings: SimSettings | None = None,
) -> Result:
    """Runs `trace` to completion under `policy`; see the module docstring."""
    return _Simulation(trace, policy, name, settings or SimSettings()).run()
