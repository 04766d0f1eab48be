"""Where pending tasks go: the first placement policy, a pure function of the replicated state.

Rules (the scheduling issue replaces this module with a richer policy):
- A task can go to a region that is healthy (recent heartbeat on the lease clock), that its job
  allows (allow and deny lists), and that has room: a region with GPUs gives a GPU task that many
  whole free devices of the requested model and memory, a task asking only for GPU memory a share
  of one device (`xrcore.devices`: packed best fit), and a CPU task one of its CPU slots; a
  region without GPUs (CPU mode) runs any task in one of its CPU slots, so every feature works
  on a machine without accelerators.
- Among those, regions the job prefers come first, then the least loaded (the fraction of its
  devices or slots in use), then the name, so the choice is deterministic.
- Tasks are taken in order of job priority (highest first), then submission.
- A task that failed waits out a backoff before it is placed again: base * 2^(failures - 1),
  at most max, on replicated time since its last update.
- A task whose last attempt lost its lease does not go back to that region while another region
  fits: the region most likely died, and its heartbeats take longer to go stale (10 s) than an
  attempt's lease (`executor.lease_ttl_s`), so it still looks healthy for a while.
- A task assigned to a region that became unhealthy before claiming it is taken back.
At most `decisions_max` decisions per call, so one pass is bounded however long the queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xrcore import regions
from xrcore.commands import Command, TaskAssign, TaskUnassign
from xrcore.devices import DeviceLedger
from xrcore.model import Job, Region, Task, TaskState

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = ["PlacementSettings", "place"]


@dataclass(frozen=True, kw_only=True)
class PlacementSettings:
    retry_backoff_base_ms: int = 1_000
    retry_backoff_max_ms: int = 60_000
    decisions_max: int = 256


def _uses_gpu(job: Job, region: Region) -> bool:
    """Whether the task takes GPU devices (whole or shared) in this region, or a CPU slot."""
    spec = job.spec
    return bool(region.gpus) and (spec.gpus > 0 or spec.gpu_memory_mb > 0)


@dataclass
class _Room:
    """What a region has free in this pass, updated as tasks are placed."""

    region: Region
    ledger: DeviceLedger
    free_slots: int
    capacity: int
    # Tasks counted against the region that no longer fit it (it shrank): they load it fully.
    overflow: int = 0

    @property
    def load(self) -> float:
        used = self.ledger.used + self.region.cpu_slots - self.free_slots + self.overflow
        return used / self.capacity if self.capacity else 1.0


def _rooms(machine: StateMachine) -> dict[str, _Room]:
    rooms: dict[str, _Room] = {}
    for name in sorted(machine.regions):
        region = machine.regions[name]
        if not regions.healthy(machine, region):
            continue
        rooms[name] = _Room(
            region=region,
            ledger=DeviceLedger(
                memory_mb=[gpu.memory_mb for gpu in region.gpus],
                models=[gpu.model for gpu in region.gpus],
            ),
            free_slots=region.cpu_slots,
            capacity=len(region.gpus) + region.cpu_slots,
        )
    for job in machine.jobs.values():
        for task in job.tasks:
            if task.state in (TaskState.ASSIGNED, TaskState.RUNNING) and task.region in rooms:
                room = rooms[task.region]
                if not _take(room, job, commit=True):
                    room.overflow += 1
    return rooms


def _take(room: _Room, job: Job, *, commit: bool) -> bool:
    """Whether `job`'s task fits in `room`; with `commit`, takes what it needs."""
    spec = job.spec
    if _uses_gpu(job, room.region):
        ledger = room.ledger
        if not commit:
            ledger = DeviceLedger(
                memory_mb=ledger.memory_mb,
                models=ledger.models,
                whole=set(ledger.whole),
                shared_mb=dict(ledger.shared_mb),
            )
        grant = ledger.reserve(gpus=spec.gpus, memory_mb=spec.gpu_memory_mb, model=spec.gpu_model)
        return grant is not None
    if room.free_slots < 1:
        return False
    if commit:
        room.free_slots -= 1
    return True


def _backing_off(machine: StateMachine, task: Task, settings: PlacementSettings) -> bool:
    if task.failures == 0:
        return False
    doublings: int = min(task.failures - 1, 30)
    delay_ms = min(settings.retry_backoff_max_ms, settings.retry_backoff_base_ms << doublings)
    return bool(machine.now_ms < task.updated_at_ms + delay_ms)


def _choose(job: Job, task: Task, rooms: dict[str, _Room]) -> _Room | None:
    candidates = [
        room
        for name, room in rooms.items()
        if job.spec.allows(name) and _take(room, job, commit=False)
    ]
    lost = task.attempts[-1] if task.attempts else None
    if lost is not None and lost.outcome == "lease_expired":
        elsewhere = [room for room in candidates if room.region.name != lost.region]
        candidates = elsewhere or candidates
    if not candidates:
        return None
    preferred = set(job.spec.regions_prefer)
    candidates.sort(
        key=lambda room: (room.region.name not in preferred, room.load, room.region.name)
    )
    return candidates[0]


def place(machine: StateMachine, settings: PlacementSettings | None = None) -> list[Command]:
    """The assignments (and take-backs) to propose now, at most `settings.decisions_max`."""
    settings = settings or PlacementSettings()
    rooms = _rooms(machine)
    decisions: list[Command] = []
    for job in machine.jobs.values():
        for task in job.tasks:
            if task.state is TaskState.ASSIGNED and task.region not in rooms:
                decisions.append(TaskUnassign(job_id=job.job_id, task_index=task.index))
    # Highest priority first, then submission order (the table keeps it).
    waiting = [
        (-job.spec.priority, position, job)
        for position, job in enumerate(machine.jobs.values())
        if any(task.state is TaskState.PENDING for task in job.tasks)
    ]
    waiting.sort(key=lambda item: (item[0], item[1]))
    for _, _, job in waiting:
        for task in job.tasks:
            if len(decisions) >= settings.decisions_max:
                return decisions
            if task.state is not TaskState.PENDING or _backing_off(machine, task, settings):
                continue
            room = _choose(job, task, rooms)
            if room is None:
                continue
            _take(room, job, commit=True)
            decisions.append(
                TaskAssign(job_id=job.job_id, task_index=task.index, region=room.region.name)
            )
    return decisions[: settings.decisions_max]
