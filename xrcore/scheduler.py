"""The scheduling policy: where pending tasks go, which running tasks make way, and why.

A pure function of a `Cluster` view (regions with their inventory, prices and round-trip times;
pending and running tasks; tenants with quotas and preferences) to `Decisions`. The running
cluster builds the view from the replicated state (`xrcore.placement`); the simulator in
`bench/scheduler_sim.py` builds it from a trace. Same view, same policy, same decisions.

One pass, in order:
1. **Rooms.** Each healthy region's free devices (`xrcore.devices`: whole GPUs, or memory shares
   of one GPU) and CPU slots, after what its assigned and running tasks hold. A region without
   GPUs runs tasks that ask for no GPU in CPU slots, and tasks that ask for GPUs (a count or
   memory) only in a cluster where no region, healthy or not, has GPUs (CPU mode, so every rule
   works on machines without accelerators); a node whose CUDA failed starts in CPU mode, and
   must not draw GPU jobs away from the regions that have GPUs.
2. **Order.** Priority classes, highest first. Within a class, tenants take turns by weighted
   dominant resource share (DRF: a tenant's largest fraction of the cluster's GPUs or CPU slots,
   divided by its weight), recomputed after every placement; each tenant's tasks in submission
   order. A task counts toward its tenant's share and quota (GPUs or tasks) for what it holds
   where it runs (in a region without GPUs, a slot) from the moment it is placed or room is
   held for it (preemption, victims yielding, tasks moving aside), so a tenant at its quota
   neither places nor makes room for more. A tenant at its quota is skipped, and says so.
3. **Choice.** Among the regions a task fits now (health, allow and deny lists, GPU count, model
   and memory, gang: all of a task's GPUs in one region), the lowest score, in milliseconds:
   the estimated completion time (moving the input data and the latest checkpoint to the region,
   from size, bandwidth and round-trip time, plus the run time scaled by the region's speed), plus
   price and carbon converted to time at the job's weights (`cost_weight` and `carbon_weight`
   in its spec, each defaulting to its tenant's), plus a best-fit term that keeps
   large blocks of devices whole for multi-GPU tasks. Preferred regions come first. A task whose
   last attempt lost its lease avoids that region while another fits. Array tasks each take the
   region where they finish soonest, so siblings fill the fastest regions first and finish
   together.
4. **Reservation and backfill.** The first task in order that fits nowhere (the head) reserves
   the region where it will fit soonest, from running tasks' estimated ends. Later tasks may use
   that region only if they finish before the reservation or leave the head's devices free
   (EASY backfill), so small tasks fill gaps without delaying the head.
5. **Preemption.** A task that fits nowhere may preempt running tasks of lower priority in one
   region, those that lose the least work since their last checkpoint first, only those that
   have run `preemption_min_run_ms`, at most `preemptions_max` per pass; the devices they free
   are held for it. A victim is asked to yield: its executor has it checkpoint and stop, and it
   goes back to pending without counting a failure. While victims are leaving, the task waits
   for them rather than preempting more (no storms); a victim that has not yielded after
   `preemption_grace_ms` is ended at once and resumes from its last committed checkpoint.
6. **Moving up.** After placing, a running task is asked to yield (a preemption with `moving_to`)
   when a faster region it may use has room the pass left unused and moving there (the input and
   the checkpoint, then the estimated rest of its run at that speed) saves at least
   `move_up_saving_min_ms` and `move_up_saving_fraction` of its estimated rest where it runs,
   at no higher price and carbon at its job's weights; the most time saved per device-hour
   taken in the faster region first (its room is what is scarce, and mean completion time
   counts jobs, not GPUs), only after `move_up_min_run_ms` in its attempt, and at most
   `move_ups_max` tasks moving at once. The room is held for the mover (`TaskInfo.moving_to`, in
   the view while it yields and while it waits) and it is placed there before any other task.
   Each move goes to a strictly faster region, so no task moves back and forth.
7. **Moving aside.** Before moving up, a task that may run in only one region (allow and deny
   lists, GPU model and memory) and waits there for room has running tasks that may run
   elsewhere (a task with preferred regions only in another of them, so one placed outside
   them never moves aside) asked to yield and move (a preemption with `moving_to`, like moving
   up) to regions no faster than theirs (a faster region's room is for moving up) with room the
   pass left unused, when together they free enough for it, each loses at most
   `move_aside_loss_max_ms` of completion time (moving its data, a slower run) and of price and
   carbon at its job's weights, and all of them lose less than the waiting task is expected to
   wait otherwise (from running tasks' estimated ends). The smallest tasks go first; only after
   `move_up_min_run_ms` in their attempt, within the same `move_ups_max`. The region is held for
   the waiting task while they leave. Waiting tasks are served in placement order, one per
   region and pass. A task moved aside may later move up, but never aside to a faster region nor
   up by a saving that small, so it does not move back and forth.
Every assignment and every waiting task carries a reason in words.

Duration estimates (`DurationStats`) come from completed tasks per tenant and entrypoint, with a
conservative default; they feed backfill, reservations and the cost of preemption.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from xrcore._clocktext import utc_text
from xrcore.devices import DeviceLedger, Grant
from xrcore.limits import MESSAGE_BYTES_MAX

__all__ = [
    "Assign",
    "Cluster",
    "Decisions",
    "GpuInfo",
    "Preempt",
    "RegionInfo",
    "SchedulerSettings",
    "TaskInfo",
    "TenantInfo",
    "Unassign",
    "clip_reason",
    "estimate_ms",
    "schedule",
    "transfer_ms",
]

MIB_BITS = 8 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    decisions_max: int = 256
    # Waiting reasons carried per pass. Only reasons that differ from the one a task shows
    # (`TaskInfo.reason`) are carried and counted, so each pass spends the budget on new reasons
    # and every waiting task gets its own within a few passes; the rest keep theirs until then.
    reasons_max: int = 256
    preemptions_max: int = 4
    preemption_min_run_ms: int = 120_000
    # A victim asked to yield has this long to checkpoint and stop before it is ended at once.
    preemption_grace_ms: int = 60_000
    # An entrypoint with no completed run is assumed to take an hour, longer than most DNN jobs
    # (Philly's median is tens of minutes), so a wrong short guess rarely lets backfill delay
    # the head; measured run times replace it after the first completion.
    default_estimate_ms: int = 3_600_000
    # Price and carbon in the score: $1 is worth `ms_per_dollar` of completion time, 1 kg CO2
    # `ms_per_kg_carbon`, each multiplied by the tenant's weight for it.
    ms_per_dollar: float = 600_000.0
    ms_per_kg_carbon: float = 600_000.0
    gpu_power_kw: float = 0.7
    # Best fit: the score of leaving a region's free devices fragmented, scaled by the fraction
    # of its devices that stay free.
    best_fit_ms: float = 30_000.0
    # Tasks in CPU slots spread over regions: the score of a region's fraction of slots in use.
    spread_ms: float = 30_000.0
    # A preferred region wins over any other that fits.
    prefer_ms: float = 1e12
    # Network model for moving data: one TCP stream with this window over the round-trip time,
    # capped at the link rate; a transfer costs 3 round trips of set-up.
    tcp_window_mib: float = 16.0
    link_mbps: float = 10_000.0
    unknown_rtt_ms: float = 100.0
    # Moving up: after placing, a running task is asked to yield and move to a faster region
    # whose room this pass left unused, when moving (data, then the estimated rest of its run
    # there) saves at least `move_up_saving_min_ms` and `move_up_saving_fraction` of its
    # estimated rest where it runs, and costs no more at the tenant's price and carbon weights.
    # The room there is held for it until it is placed there. At most `move_ups_max` tasks move
    # at once (0: never), each only after `move_up_min_run_ms` in its attempt.
    move_ups_max: int = 4
    move_up_min_run_ms: int = 600_000
    move_up_saving_min_ms: int = 3_600_000
    move_up_saving_fraction: float = 0.3
    # Moving aside (off: False): a running task that may run elsewhere makes way for a waiting
    # task that may run only where it runs, moving to a region no faster, when it loses at
    # most `move_aside_loss_max_ms` (and as much in price and carbon) by moving. Movers count
    # toward `move_ups_max` and wait `move_up_min_run_ms` in their attempt first.
    move_aside: bool = True
    move_aside_loss_max_ms: int = 600_000


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    model: str
    memory_mb: int


@dataclass(frozen=True, kw_only=True)
class RegionInfo:
    name: str
    healthy: bool = True
    gpus: tuple[GpuInfo, ...] = ()
    cpu_slots: int = 0
    price_per_gpu_hour: float = 0.0
    carbon_g_per_kwh: float = 0.0
    # Relative throughput of the region's devices (1.0 = the reference device).
    speed: float = 1.0
    rtt_ms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TaskInfo:
    job_id: str
    task_index: int
    tenant: str = "default"
    priority: int = 0
    state: str = "pending"  # "pending", "assigned" or "running"
    region: str | None = None  # where an assigned or running task is
    gpus: int = 0
    gpu_memory_mb: int = 0
    gpu_model: str | None = None
    regions_allow: tuple[str, ...] = ()
    regions_deny: tuple[str, ...] = ()
    regions_prefer: tuple[str, ...] = ()
    input_size_mb: int = 0
    input_region: str | None = None
    checkpoint_size_mb: int = 0
    checkpoint_region: str | None = None
    submitted_ms: int = 0
    # Estimated run time on a speed-1.0 device.
    estimate_ms: int = 3_600_000
    # Running tasks: when the attempt started and when it last committed a checkpoint.
    started_ms: int | None = None
    checkpointed_ms: int | None = None
    token: int | None = None
    # Running tasks asked to make way (preempted) and not yet stopped: when they were asked.
    preempt_requested_ms: int | None = None
    # Pending tasks: False while backing off after a failure (with the reason in `waiting`).
    eligible: bool = True
    waiting: str = ""
    # The reason the task shows now (the last one recorded); a waiting reason equal to it is not
    # carried in `Decisions.waiting` again.
    reason: str = ""
    # The region whose lease on this task just expired: avoided while another region fits.
    avoid_region: str | None = None
    # Moving up: the faster region a running task was asked to yield for, or a pending task
    # yielded for. Its room there is held for it until it is placed there.
    moving_to: str | None = None
    # The job's own weights for price and carbon (`TenantInfo.cost_weight`, `carbon_weight`);
    # None: its tenant's.
    cost_weight: float | None = None
    carbon_weight: float | None = None

    @property
    def ref(self) -> tuple[str, int]:
        return (self.job_id, self.task_index)

    def allows(self, region: str) -> bool:
        if region in self.regions_deny:
            return False
        return not self.regions_allow or region in self.regions_allow

    @property
    def gpu_units(self) -> float:
        """GPUs this task holds for quotas and fair share: whole devices, or one shared."""
        if self.gpus:
            return float(self.gpus)
        return 1.0 if self.gpu_memory_mb else 0.0


@dataclass(frozen=True, kw_only=True)
class TenantInfo:
    name: str
    weight: float = 1.0
    gpus_max: int | None = None
    tasks_max: int | None = None
    cost_weight: float = 1.0
    carbon_weight: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Cluster:
    now_ms: int
    regions: tuple[RegionInfo, ...]
    tasks: tuple[TaskInfo, ...]
    tenants: Mapping[str, TenantInfo] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Assign:
    job_id: str
    task_index: int
    region: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Unassign:
    job_id: str
    task_index: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class Preempt:
    """Asks a running task to checkpoint and make way; with `force`, ends it at once."""

    job_id: str
    task_index: int
    token: int
    region: str
    reason: str
    force: bool = False
    # Moving up: the faster region whose room is held for the task once it has yielded.
    moving_to: str | None = None

    @classmethod
    def of(
        cls, task: TaskInfo, reason: str, *, force: bool = False, moving_to: str | None = None
    ) -> Preempt:
        """The preemption of running `task` (its current attempt, where it runs)."""
        assert task.token is not None and task.region is not None
        return cls(
            job_id=task.job_id,
            task_index=task.task_index,
            token=task.token,
            region=task.region,
            reason=reason,
            force=force,
            moving_to=moving_to,
        )


@dataclass(kw_only=True)
class Decisions:
    assigns: list[Assign] = field(default_factory=list)
    unassigns: list[Unassign] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    # Why each waiting task considered in this pass is still pending, where that differs from
    # the reason it shows (`TaskInfo.reason`), at most `reasons_max`.
    waiting: dict[tuple[str, int], str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.assigns) + len(self.unassigns) + len(self.preempts)


# Estimates and costs.


def estimate_ms(count: int, mean_ms: int, deviation_ms: int, *, default_ms: int) -> int:
    """A conservative run time: the mean of past runs plus two mean deviations, or the default
    before any run completed."""
    if count == 0:
        return default_ms
    return mean_ms + 2 * deviation_ms


def _rtt_ms(regions: Mapping[str, RegionInfo], source: str, target: str, default: float) -> float:
    if source == target:
        return 0.0
    for near, far in ((source, target), (target, source)):
        region = regions.get(near)
        if region is not None and far in region.rtt_ms:
            return region.rtt_ms[far]
    return default


def transfer_ms(
    size_mb: int,
    source: str | None,
    target: str,
    regions: Mapping[str, RegionInfo],
    settings: SchedulerSettings,
) -> float:
    """Time to move `size_mb` from `source` to `target`: set-up round trips plus size over the
    bandwidth one TCP stream gets at that round-trip time."""
    if size_mb <= 0 or source is None or source == target:
        return 0.0
    rtt = max(_rtt_ms(regions, source, target, settings.unknown_rtt_ms), 0.1)
    window_mbps = settings.tcp_window_mib * 8 * 1000.0 / rtt
    bandwidth_mbps = min(settings.link_mbps, window_mbps)
    return 3 * rtt + size_mb * 8 * 1000.0 / bandwidth_mbps * 1.048576


# Rooms.


def _asks_gpu(task: TaskInfo) -> bool:
    return task.gpus > 0 or task.gpu_memory_mb > 0


def _uses_gpu(task: TaskInfo, region: RegionInfo) -> bool:
    return bool(region.gpus) and _asks_gpu(task)


def _billed_devices(task: TaskInfo, region: RegionInfo) -> float:
    """Devices price and carbon are counted on: the task's GPUs; in a region without GPUs (CPU
    mode, where every task takes a slot) the slot stands for one device, so prices and carbon
    steer placement the same way there; a CPU task in a GPU region costs nothing extra."""
    if not region.gpus:
        return max(task.gpu_units, 1.0)
    return task.gpu_units if _uses_gpu(task, region) else 0.0


@dataclass
class _Room:
    region: RegionInfo
    ledger: DeviceLedger
    free_slots: int
    # (estimated end, task) of what holds room here, for reservations and preemption.
    holders: list[tuple[float, TaskInfo]] = field(default_factory=list)
    # Devices held for a task that preempted others here (or reserved as the head's).
    held_for: tuple[str, int] | None = None
    uniform: bool = False  # every device the same model and memory
    devices: int = 0  # how many the region has
    # What each task here holds: its devices, or None for a CPU slot. The view does not say
    # which devices a running task has, so they are reconstructed by the same ledger rules.
    grants: dict[tuple[str, int], Grant | None] = field(default_factory=dict)
    # Per task shape (GPUs, memory, model): whether it fits the empty region.
    ever_fits: dict[tuple[int, int, str | None], bool] = field(default_factory=dict)
    # Whether a task that asks for GPUs may take a CPU slot here: in a region without GPUs only
    # when no region of the cluster has any (CPU mode); never where the region has GPUs.
    gpu_tasks_in_slots: bool = False

    def __post_init__(self) -> None:
        models, memory = set(self.ledger.models), set(self.ledger.memory_mb)
        self.uniform = len(memory) == 1 and len(models) <= 1
        self.devices = len(self.ledger.memory_mb)

    def lowest_priority(self) -> int:
        return min((holder.priority for _, holder in self.holders), default=1 << 30)

    @property
    def free_gpus(self) -> int:
        # Whole and shared devices are disjoint (a shared device is never handed out whole).
        ledger = self.ledger
        return self.devices - len(ledger.whole) - len(ledger.shared_mb)

    def copy_ledger(self) -> DeviceLedger:
        return DeviceLedger(
            memory_mb=self.ledger.memory_mb,
            models=self.ledger.models,
            whole=set(self.ledger.whole),
            shared_mb=dict(self.ledger.shared_mb),
        )

    def trial(self) -> _Room:
        """A copy to try releases and placements on."""
        return _Room(
            region=self.region,
            ledger=self.copy_ledger(),
            free_slots=self.free_slots,
            holders=list(self.holders),
            grants=dict(self.grants),
            gpu_tasks_in_slots=self.gpu_tasks_in_slots,
        )

    def takes_in_slot(self, task: TaskInfo) -> bool:
        """Whether `task`, which does not use this region's GPUs, may take a CPU slot here."""
        return self.gpu_tasks_in_slots or not _asks_gpu(task)

    def fits(self, task: TaskInfo) -> bool:
        if _uses_gpu(task, self.region):
            if task.gpus > self.free_gpus:
                return False  # The common case in a full cluster; no ledger copy.
            if task.gpus and not self.ledger.shared_mb and self.uniform:
                # All devices alike and none shared: counting is enough.
                model = self.ledger.models[0] if self.ledger.models else None
                return (task.gpu_model is None or task.gpu_model == model) and (
                    task.gpu_memory_mb <= self.ledger.memory_mb[0]
                )
            grant = self.copy_ledger().reserve(
                gpus=task.gpus, memory_mb=task.gpu_memory_mb, model=task.gpu_model
            )
            return grant is not None
        return self.free_slots >= 1 and self.takes_in_slot(task)

    def take(self, task: TaskInfo) -> bool:
        """Gives `task` what it needs here, if it fits."""
        if _uses_gpu(task, self.region):
            grant = self.ledger.reserve(
                gpus=task.gpus, memory_mb=task.gpu_memory_mb, model=task.gpu_model
            )
            if grant is None:
                return False
            self.grants[task.ref] = grant
            return True
        if self.free_slots < 1:
            return False
        self.free_slots -= 1
        self.grants[task.ref] = None
        return True

    def release(self, task: TaskInfo) -> None:
        """Frees what `task` holds here (nothing, if it held nothing: the region shrank)."""
        if task.ref not in self.grants:
            return
        grant = self.grants.pop(task.ref)
        if grant is None:
            self.free_slots = min(self.region.cpu_slots, self.free_slots + 1)
        else:
            self.ledger.release(grant)

    def room_for(self, task: TaskInfo) -> int:
        """How much of what `task` needs is free here: matching untouched devices (whole-GPU
        tasks), free memory on the best matching device (shares), or CPU slots."""
        if not _uses_gpu(task, self.region):
            return self.free_slots if self.takes_in_slot(task) else 0
        ledger = self.ledger
        matching = [
            device
            for device in range(len(ledger.memory_mb))
            if device not in ledger.whole
            and (
                task.gpu_model is None
                or not ledger.models
                or ledger.models[device] == task.gpu_model
            )
        ]
        if task.gpus:
            return sum(
                1
                for device in matching
                if device not in ledger.shared_mb and ledger.memory_mb[device] >= task.gpu_memory_mb
            )
        return max(
            (ledger.memory_mb[device] - ledger.shared_mb.get(device, 0) for device in matching),
            default=0,
        )

    def could_ever_fit(self, task: TaskInfo) -> bool:
        """Whether the task fits this region when it is empty."""
        if _uses_gpu(task, self.region):
            shape = (task.gpus, task.gpu_memory_mb, task.gpu_model)
            known = self.ever_fits.get(shape)
            if known is None:
                empty = DeviceLedger(memory_mb=self.ledger.memory_mb, models=self.ledger.models)
                grant = empty.reserve(
                    gpus=task.gpus, memory_mb=task.gpu_memory_mb, model=task.gpu_model
                )
                known = self.ever_fits[shape] = grant is not None
            return known
        return self.region.cpu_slots > 0 and self.takes_in_slot(task)


def _rooms(cluster: Cluster) -> dict[str, _Room]:
    rooms: dict[str, _Room] = {}
    cpu_mode = not _has_gpus(cluster)
    for region in sorted(cluster.regions, key=lambda item: item.name):
        if not region.healthy:
            continue
        rooms[region.name] = _Room(
            region=region,
            ledger=DeviceLedger(
                memory_mb=[gpu.memory_mb for gpu in region.gpus],
                models=[gpu.model for gpu in region.gpus],
            ),
            free_slots=region.cpu_slots,
            gpu_tasks_in_slots=cpu_mode,
        )
    for task in cluster.tasks:
        if task.state == "pending" or task.region not in rooms:
            continue
        room = rooms[task.region]
        # A task that no longer fits (the region shrank) holds nothing more. A task that asks
        # for GPUs and runs in a slot (placed in CPU mode) holds its slot.
        room.take(task)
        started = task.started_ms if task.started_ms is not None else cluster.now_ms
        end = started + task.estimate_ms / max(room.region.speed, 1e-6)
        room.holders.append((max(end, float(cluster.now_ms)), task))
    for task in cluster.tasks:
        # Moving up: the room a mover will take is held for it from the pass that asked it to
        # yield until it is placed there. It is not among the holders: no reservation counts on
        # it ending, and no preemption takes it.
        target = task.moving_to
        if target is not None and target in rooms and target != task.region and _moving(task):
            rooms[target].take(task)
    for room in rooms.values():
        room.holders.sort(key=_holder_order)
    return rooms


def _has_gpus(cluster: Cluster) -> bool:
    """Whether any region of the cluster, healthy or not, has GPUs: then tasks that ask for
    GPUs run only on GPUs. Not only the healthy ones: while a GPU region is down its tasks wait
    for it, instead of moving to a node in CPU mode (one whose CUDA failed) for good."""
    return any(region.gpus for region in cluster.regions)


def _holder_order(item: tuple[float, TaskInfo]) -> tuple[float, tuple[str, int]]:
    """Holders by estimated end, then by task."""
    return (item[0], item[1].ref)


def _moving(task: TaskInfo) -> bool:
    """Whether `task` is moving up: asked to yield for a faster region, or yielded for one."""
    if task.moving_to is None:
        return False
    if task.state == "running":
        return task.preempt_requested_ms is not None
    return task.state == "pending"


# Tenants and fair share.


@dataclass
class _Usage:
    gpus: float = 0.0
    tasks: int = 0
    slots: int = 0


class _Share:
    """Per-tenant usage against cluster totals: quotas and weighted dominant shares."""

    def __init__(self, cluster: Cluster, rooms: Mapping[str, _Room]) -> None:
        self.tenants = cluster.tenants
        self._defaults: dict[str, TenantInfo] = {}
        # In CPU mode (no region has GPUs) every task holds a slot and none is charged GPUs.
        self.gpu_cluster = _has_gpus(cluster)
        self.total_gpus = sum(len(room.region.gpus) for room in rooms.values()) or 1
        self.total_slots = sum(room.region.cpu_slots for room in rooms.values()) or 1
        self.usage: dict[str, _Usage] = {}
        regions = {region.name: region for region in cluster.regions}
        for task in cluster.tasks:
            if task.state != "pending":
                self.add(task, regions.get(task.region or ""))

    def tenant(self, name: str) -> TenantInfo:
        info = self.tenants.get(name)
        if info is None:
            info = self._defaults.get(name)
            if info is None:
                info = self._defaults[name] = TenantInfo(name=name)
        return info

    def on_gpus(self, task: TaskInfo, region: RegionInfo | None) -> bool:
        """Whether `task` holds GPUs in `region` (None: where it would run), or a CPU slot."""
        if region is None:
            return self.gpu_cluster and _asks_gpu(task)
        return _uses_gpu(task, region)

    def add(self, task: TaskInfo, region: RegionInfo | None) -> None:
        """Counts `task`, placed in `region` or with room held for it there, for what it holds
        there: its GPUs, or one CPU slot."""
        usage = self.usage.setdefault(task.tenant, _Usage())
        usage.tasks += 1
        if self.on_gpus(task, region):
            usage.gpus += task.gpu_units
        else:
            usage.slots += 1

    def dominant(self, tenant: str) -> float:
        usage = self.usage.get(tenant)
        if usage is None:
            return 0.0
        share = max(usage.gpus / self.total_gpus, usage.slots / self.total_slots)
        return share / max(self.tenant(tenant).weight, 1e-9)

    def over_quota(self, task: TaskInfo) -> str | None:
        info = self.tenant(task.tenant)
        if info.gpus_max is None and info.tasks_max is None:
            return None
        usage = self.usage.get(task.tenant) or _Usage()
        gpus = task.gpu_units if self.on_gpus(task, None) else 0.0
        if info.gpus_max is not None and usage.gpus + gpus > info.gpus_max:
            return (
                f"tenant {task.tenant!r} holds {usage.gpus:g} of its quota of "
                f"{_count(info.gpus_max, 'GPU')}; this task needs {gpus:g} more"
            )
        if info.tasks_max is not None and usage.tasks + 1 > info.tasks_max:
            return (
                f"tenant {task.tenant!r} has {_count(usage.tasks, 'task')} running, assigned "
                f"or with room held, and its quota is {info.tasks_max}"
            )
        return None


def _count(number: float, noun: str) -> str:
    """`number` and `noun`, plural unless it is one."""
    return f"{number:g} {noun}" if number == 1 else f"{number:g} {noun}s"


# Scores.


@dataclass(slots=True)
class _Option:
    score: float
    room: _Room
    finish_ms: float
    moving_ms: float
    run_ms: float
    devices: float
    # The score's other terms: price and carbon as time at the weights, and the best-fit term
    # (GPU tasks) or the spread term (tasks in CPU slots).
    price_ms: float = 0.0
    fit_ms: float = 0.0

    def explain(self, settings: SchedulerSettings) -> str:
        region = self.room.region
        hours = self.run_ms / 3_600_000
        dollars = region.price_per_gpu_hour * self.devices * hours
        carbon_kg = region.carbon_g_per_kwh * settings.gpu_power_kw * self.devices * hours / 1000
        return (
            f"est. finish in {_minutes(self.finish_ms)} (run {_minutes(self.run_ms)} at speed "
            f"{region.speed:g}, data {self.moving_ms / 1000:.1f} s), {_dollars_text(dollars)}, "
            f"{_carbon_text(carbon_kg)}"
        )

    def margin(self, best: _Option, task: TaskInfo, tenant: TenantInfo) -> str:
        """What puts this option's score above `best`'s: the terms that differ, largest first,
        as time (the score is in milliseconds)."""
        if (self.room.region.name in task.regions_prefer) != (
            best.room.region.name in task.regions_prefer
        ):
            return "not among the job's preferred regions"
        fit = "free devices left fragmented" if self.room.region.gpus else "slots in use"
        weights = (tenant.cost_weight, tenant.carbon_weight)
        price = "price and carbon" + (
            "" if weights == (1.0, 1.0) else f" (weights {weights[0]:g} and {weights[1]:g})"
        )
        terms = [
            ("finish", self.finish_ms - best.finish_ms),
            (price, self.price_ms - best.price_ms),
            (fit, self.fit_ms - best.fit_ms),
        ]
        shown = [
            f"{name} {_signed_time(delta_ms)}"
            for name, delta_ms in sorted(terms, key=lambda term: -abs(term[1]))
            if abs(delta_ms) >= 50
        ]
        total = f"scores {_signed_time(self.score - best.score)}"
        return f"{total}: {', '.join(shown)}" if shown else total


def _price_ms(
    region: RegionInfo,
    devices: float,
    run_ms: float,
    tenant: TenantInfo,
    settings: SchedulerSettings,
) -> float:
    """Price and carbon of `devices` for `run_ms` in `region`, as time at `tenant`'s weights
    (`_Pass.prefs`: the job's own where it has them)."""
    if not devices:
        return 0.0
    device_hours = devices * run_ms / 3_600_000
    return device_hours * (
        tenant.cost_weight * region.price_per_gpu_hour * settings.ms_per_dollar
        + tenant.carbon_weight
        * region.carbon_g_per_kwh
        * settings.gpu_power_kw
        / 1000
        * settings.ms_per_kg_carbon
    )


def _score(
    task: TaskInfo,
    room: _Room,
    regions: Mapping[str, RegionInfo],
    tenant: TenantInfo,
    settings: SchedulerSettings,
) -> _Option:
    region = room.region
    moving_ms = 0.0
    if task.input_size_mb:
        moving_ms += transfer_ms(
            task.input_size_mb, task.input_region, region.name, regions, settings
        )
    if task.checkpoint_size_mb:
        moving_ms += transfer_ms(
            task.checkpoint_size_mb, task.checkpoint_region, region.name, regions, settings
        )
    run_ms = task.estimate_ms / max(region.speed, 1e-6)
    finish_ms = moving_ms + run_ms
    devices = _billed_devices(task, region)
    price_ms = _price_ms(region, devices, run_ms, tenant, settings)
    score = finish_ms + price_ms
    fit_ms = 0.0
    if _uses_gpu(task, region):
        free_after = room.free_gpus - task.gpus
        fit_ms = settings.best_fit_ms * free_after / len(region.gpus)
    elif region.cpu_slots:
        # CPU slots are interchangeable units: spread them by load instead.
        used_after = region.cpu_slots - room.free_slots + 1
        fit_ms = settings.spread_ms * used_after / region.cpu_slots
    score += fit_ms
    if region.name in task.regions_prefer:
        score -= settings.prefer_ms
    return _Option(score, room, finish_ms, moving_ms, run_ms, devices, price_ms, fit_ms)


def _own_weights(task: TaskInfo) -> str:
    """The job's own price and carbon weights, for a reason; empty when it uses its tenant's."""
    own = [
        f"{name} weight {value:g}"
        for name, value in (("price", task.cost_weight), ("carbon", task.carbon_weight))
        if value is not None
    ]
    return f" (the job's {' and '.join(own)})" if own else ""


def _time_text(time_ms: float) -> str:
    """An absolute time, so a reason stays the same from pass to pass while nothing changes."""
    return utc_text(time_ms)


def _minutes(value_ms: float) -> str:
    return f"{value_ms / 60_000:.1f} min"


def _named_for(task: TaskInfo, reader: TaskInfo) -> str:
    """`task` as the reason of `reader`'s task names it: by job and index within a tenant, and
    only as another tenant's task across tenants (a tenant sees no other tenant's job ids)."""
    if task.tenant == reader.tenant:
        return f"{task.job_id}[{task.task_index}]"
    return "a task of another tenant"


def _signed_time(value_ms: float) -> str:
    """A difference of time with its sign, in seconds under a minute, else minutes."""
    if abs(value_ms) < 60_000:
        return f"{value_ms / 1000:+.1f} s"
    return f"{value_ms / 60_000:+.1f} min"


def _dollars_text(dollars: float) -> str:
    """Dollars to the cent, or to two significant digits under a cent (not $0.00)."""
    return f"${dollars:.2f}" if dollars == 0 or dollars >= 0.01 else f"${dollars:.2g}"


def _carbon_text(carbon_kg: float) -> str:
    """Carbon in kg to two decimals, or in grams (two significant digits) under 10 g."""
    if carbon_kg == 0 or carbon_kg >= 0.01:
        return f"{carbon_kg:.2f} kg CO2"
    return f"{carbon_kg * 1000:.2g} g CO2"


# The pass.


@dataclass
class _Reservation:
    task: TaskInfo
    region: str
    start_ms: float  # when the head is expected to fit there


def _earliest_fit(task: TaskInfo, room: _Room, now_ms: int) -> float | None:
    """When `task` is expected to fit `room`, releasing holders in order of estimated end."""
    if room.fits(task):
        return float(now_ms)
    trial = room.trial()
    for end, holder in room.holders:
        trial.release(holder)
        if trial.fits(task):
            return end
    return None


@dataclass
class _Move:
    task: TaskInfo
    option: _Option  # in the faster region, for the estimated rest of the run
    saving_ms: float
    rest_here_ms: float
    here_speed: float

    @property
    def gain(self) -> float:
        """Completion time saved per unit of device time taken there (`_Pass._move_up`)."""
        return self.saving_ms / (max(self.task.gpus, 1) * max(self.option.run_ms, 1.0))


_submission_order = operator.attrgetter("submitted_ms", "job_id", "task_index")


def _order(pending: list[TaskInfo]) -> list[list[tuple[str, list[TaskInfo]]]]:
    """Pending tasks grouped by priority class (highest first), then by tenant, each tenant's
    tasks in submission order."""
    classes: dict[int, dict[str, list[TaskInfo]]] = {}
    for task in pending:
        classes.setdefault(task.priority, {}).setdefault(task.tenant, []).append(task)
    ordered = []
    for priority in sorted(classes, reverse=True):
        tenants = classes[priority]
        for tasks in tenants.values():
            tasks.sort(key=_submission_order)
        ordered.append(sorted(tenants.items()))
    return ordered


class _Pass:
    def __init__(self, cluster: Cluster, settings: SchedulerSettings) -> None:
        self.cluster = cluster
        self.settings = settings
        self.now_ms = cluster.now_ms
        self.rooms = _rooms(cluster)
        self.regions = {region.name: region for region in cluster.regions}
        self.share = _Share(cluster, self.rooms)
        self.decisions = Decisions()
        self.reservation: _Reservation | None = None
        self.preempted: set[tuple[str, int]] = set()
        self.waiting_noted = 0
        self.no_room: dict[tuple[object, ...], str] = {}
        # Tasks left waiting for room in the one region they may run in, in placement order,
        # with that region; and per shape that found no room, that region (or None).
        self.pinned_waiting: list[tuple[TaskInfo, str]] = []
        self.no_room_only: dict[tuple[object, ...], str | None] = {}
        # The healthy regions' rooms each allow and deny list admits (rooms do not change
        # during a pass).
        self.allowed: dict[tuple[tuple[str, ...], tuple[str, ...]], list[_Room]] = {}
        # Per allow and deny list, task devices and price and carbon weights: those rooms by
        # the bound of their score per millisecond of estimate (`_lazy_options`).
        self.room_rates: dict[tuple[object, ...], list[tuple[float, _Room]]] = {}

    def prefs(self, task: TaskInfo) -> TenantInfo:
        """`task`'s tenant, with the job's own price and carbon weights where it has them."""
        tenant = self.share.tenant(task.tenant)
        if task.cost_weight is None and task.carbon_weight is None:
            return tenant
        return replace(
            tenant,
            cost_weight=tenant.cost_weight if task.cost_weight is None else task.cost_weight,
            carbon_weight=(
                tenant.carbon_weight if task.carbon_weight is None else task.carbon_weight
            ),
        )

    def wait(self, task: TaskInfo, reason: str) -> None:
        """Gives waiting `task` its reason, unless it shows that one already: only changed
        reasons count toward `reasons_max`, so a long queue whose reasons stay the same does not
        keep the budget from the tasks behind it."""
        if reason == task.reason or (
            task.reason.endswith("...") and clip_reason(reason) == task.reason
        ):
            return
        if self.waiting_noted < self.settings.reasons_max:
            self.decisions.waiting[task.ref] = reason
            self.waiting_noted += 1

    def full(self) -> bool:
        return len(self.decisions) >= self.settings.decisions_max

    def run(self) -> Decisions:
        for task in self.cluster.tasks:
            if task.state == "assigned" and task.region not in self.rooms:
                self.decisions.unassigns.append(
                    Unassign(
                        job_id=task.job_id,
                        task_index=task.task_index,
                        reason=f"region {task.region} became unhealthy before claiming it",
                    )
                )
        for task in self.cluster.tasks:
            asked_ms = task.preempt_requested_ms
            if asked_ms is None or task.token is None or task.region is None:
                continue
            if self.now_ms - asked_ms >= self.settings.preemption_grace_ms:
                self.decisions.preempts.append(
                    Preempt.of(
                        task,
                        f"preempted: did not yield within "
                        f"{self.settings.preemption_grace_ms // 1000} s, so ended at once",
                        force=True,
                    )
                )
        pending, movers = [], []
        for task in self.cluster.tasks:
            if task.state != "pending":
                continue
            if not task.eligible:
                self.wait(task, task.waiting or "backing off after a failure")
                continue
            pending.append(task)
            if task.moving_to is not None:
                movers.append(task)
        if movers:
            movers.sort(key=lambda task: (-task.priority, task.submitted_ms, task.ref))
            placed = self._place_movers(movers)
            pending = [task for task in pending if task.ref not in placed]
        for tenants in _order(pending):
            self._place_class(tenants)
            if self.full():
                break
        self._move_aside()
        self._move_up()
        return self.decisions

    def _place_class(self, tenants: list[tuple[str, list[TaskInfo]]]) -> None:
        """Tenants of one priority class take turns by weighted dominant share."""
        # Per tenant: its share, its next task's submission (equal shares: the tenant whose
        # next task was submitted first goes first), its name, and where it is in its queue.
        # A tenant's share changes only when one of its own tasks is placed or has room held
        # for it (preemption, victims yielding): such a task counts as placed, so the tenant's
        # next task neither passes its quota nor preempts more for room it could not use.
        heap = [
            (self.share.dominant(name), tasks[0].submitted_ms, name, 0, tasks)
            for name, tasks in tenants
        ]
        heapq.heapify(heap)
        while heap and not self.full():
            dominant, _, name, position, tasks = heapq.heappop(heap)
            task = tasks[position]
            quota = self.share.over_quota(task)
            if quota is not None:
                self.wait(task, quota)
            elif (room := self._place(task)) is not None:
                self.share.add(task, room.region)
                dominant = self.share.dominant(name)
            position += 1
            if position < len(tasks):
                entry = (dominant, tasks[position].submitted_ms, name, position, tasks)
                heapq.heappush(heap, entry)

    def _place(self, task: TaskInfo) -> _Room | None:
        """Places `task`, or holds room for it where others make way for it: that room (the
        task then counts toward its tenant's share and quota), or None when it waits."""
        # Room only shrinks during a pass (preemption holds what it frees), so a task of a shape
        # that found no room waits like the one before it: a full cluster costs O(1) per task.
        shape = (
            task.gpus,
            task.gpu_memory_mb,
            task.gpu_model,
            task.regions_allow,
            task.regions_deny,
            task.priority,
        )
        known = self.no_room.get(shape)
        if known is not None:
            self.wait(task, known)
            only = self.no_room_only.get(shape)
            if only is not None:
                self.pinned_waiting.append((task, only))
            return None
        lists = (task.regions_allow, task.regions_deny)
        allowed = self.allowed.get(lists)
        if allowed is None:
            allowed = [room for name, room in self.rooms.items() if task.allows(name)]
            self.allowed[lists] = allowed
        if not allowed:
            self.wait(task, self._none_allowed(task))
            return None
        tenant = self.prefs(task)
        fitting: list[_Room] = []
        if task.avoid_region is None and not task.regions_prefer:
            # The common case: rooms checked and scored lazily, best first; `fitting` fills
            # with the rooms that fit as they are checked (all of them once `options` ends).
            options = self._lazy_options(task, allowed, tenant, fitting)
        else:
            mine = (None, task.ref)
            fitting = [room for room in allowed if room.held_for in mine and room.fits(task)]
            if task.avoid_region is not None:
                elsewhere = [room for room in fitting if room.region.name != task.avoid_region]
                fitting = elsewhere or fitting
            options = self._options(task, fitting, tenant)
        seen: list[_Option] = []
        for option in options:
            seen.append(option)
            if self._backfill_conflict(task, option):
                continue
            if len(seen) > 1:
                # A better option was left for the head of the queue.
                best, reservation = seen[0], self.reservation
                assert reservation is not None
                runner_up = (
                    f"; {best.room.region.name} scores better ({best.explain(self.settings)})"
                    f" but would delay {_named_for(reservation.task, task)}, which holds a "
                    "reservation there"
                )
            else:
                other = next(options, None)
                runner_up = (
                    f"; next best {other.room.region.name} ({other.explain(self.settings)}; "
                    f"{other.margin(option, task, tenant)})"
                    if other is not None
                    else ""
                )
            self._assign(
                task,
                option,
                f"{option.room.region.name}: {option.explain(self.settings)}{runner_up}"
                f"{_own_weights(task)}",
            )
            return option.room
        if fitting:
            assert self.reservation is not None
            self.wait(
                task,
                f"would delay {_named_for(self.reservation.task, task)}, which holds a "
                f"reservation in {self.reservation.region}",
            )
            return None
        ever = [room for room in allowed if room.could_ever_fit(task)]
        if not ever:
            self.no_room[shape] = _never_fits(task, allowed)
            self.wait(task, self.no_room[shape])
            return None
        held = self._awaiting_yield(task, ever) or self._preempt_for(task, ever)
        if held is not None:
            return held
        only = ever[0].region.name if len(ever) == 1 else None
        if only is not None:
            self.pinned_waiting.append((task, only))
        if self.reservation is None:
            self._reserve(task, ever)
            return None
        names = ", ".join(room.region.name for room in ever)
        self.no_room[shape] = f"no room now in {names}"
        self.no_room_only[shape] = only
        self.wait(task, self.no_room[shape])
        return None

    def _options(self, task: TaskInfo, rooms: list[_Room], tenant: TenantInfo) -> Iterator[_Option]:
        """`task`'s options in `rooms`, best score first (then region name), as `_score` ranks
        them; a room is scored only once its lower bound could come first. The bound is the
        score without moving data and without the best-fit term, both never negative, added
        in the same order, so it is never above the score even in floating point."""
        settings = self.settings
        bounds: list[tuple[float, str, _Room]] = []
        for room in rooms:
            region = room.region
            run_ms = task.estimate_ms / max(region.speed, 1e-6)
            devices = _billed_devices(task, region)
            bound = run_ms + _price_ms(region, devices, run_ms, tenant, settings)
            if region.name in task.regions_prefer:
                bound -= settings.prefer_ms
            bounds.append((bound, region.name, room))
        heapq.heapify(bounds)
        scored: list[tuple[float, str, _Option]] = []
        while bounds or scored:
            while bounds and (not scored or bounds[0][0] <= scored[0][0]):
                _, name, room = heapq.heappop(bounds)
                option = _score(task, room, self.regions, tenant, settings)
                heapq.heappush(scored, (option.score, name, option))
            yield heapq.heappop(scored)[2]

    def _none_allowed(self, task: TaskInfo) -> str:
        """Why no healthy region is one `task` may use: none is healthy, or its lists leave no
        region of the cluster at all (a name that is no region's, or every region denied), which
        waiting will not mend until the cluster or the job changes."""
        if not any(task.allows(name) for name in self.regions):
            if task.regions_allow:
                listed = ", ".join(sorted(task.regions_allow))
                return (
                    f"its regions_allow ({listed}) leaves no region of the cluster "
                    f"(regions: {', '.join(sorted(self.regions)) or 'none'})"
                )
            return "its regions_deny names every region of the cluster"
        return "no healthy region that the job allows"

    def _lazy_options(
        self, task: TaskInfo, allowed: list[_Room], tenant: TenantInfo, fitting: list[_Room]
    ) -> Iterator[_Option]:
        """What `_options` yields for the rooms of `allowed` that fit `task` now (none held for
        another), without checking or scoring every room: rooms are taken in the order of
        their bound per millisecond of estimate, which depends only on the region, the
        tenant's weights and the task's devices (cached per pass), and checked and scored only
        while the estimate times that rate could reach the best score found (with a margin of
        10^-9 over rounding: a room left out has a bound, so a score, above the best). Adds the
        rooms that fit to `fitting` as it finds them. Not for tasks with preferred regions,
        whose bound is not proportional to the estimate."""
        settings = self.settings
        uses_gpu = task.gpus > 0 or task.gpu_memory_mb > 0
        key = (
            task.regions_allow,
            task.regions_deny,
            task.gpu_units,
            uses_gpu,
            tenant.cost_weight,
            tenant.carbon_weight,
        )
        order = self.room_rates.get(key)
        if order is None:
            rates = []
            for room in allowed:
                region = room.region
                run_ms = 1.0 / max(region.speed, 1e-6)
                devices = _billed_devices(task, region)
                rate = run_ms + _price_ms(region, devices, run_ms, tenant, settings)
                rates.append((rate, region.name, room))
            rates.sort(key=lambda item: (item[0], item[1]))
            order = self.room_rates[key] = [(rate, room) for rate, _, room in rates]
        estimate_ms = task.estimate_ms
        mine = (None, task.ref)
        gpus = task.gpus
        position = 0
        scored: list[tuple[float, str, _Option]] = []
        while True:
            while position < len(order) and (
                not scored or estimate_ms * order[position][0] <= scored[0][0] * (1.0 + 1e-9)
            ):
                room = order[position][1]
                position += 1
                if room.held_for not in mine:
                    continue
                if gpus and room.devices and room.free_gpus < gpus:
                    continue  # Too few free devices: no need for the full check.
                if not room.fits(task):
                    continue
                fitting.append(room)
                option = _score(task, room, self.regions, tenant, settings)
                heapq.heappush(scored, (option.score, room.region.name, option))
            if not scored:
                return
            yield heapq.heappop(scored)[2]

    def _assign(self, task: TaskInfo, option: _Option, reason: str) -> None:
        option.room.take(task)
        end = self.now_ms + option.finish_ms
        bisect.insort(option.room.holders, (end, task), key=_holder_order)
        if option.room.held_for == task.ref:
            option.room.held_for = None
        self.decisions.assigns.append(
            Assign(
                job_id=task.job_id,
                task_index=task.task_index,
                region=option.room.region.name,
                reason=reason,
            )
        )

    def _place_movers(self, movers: list[TaskInfo]) -> set[tuple[str, int]]:
        """Places tasks that yielded to move up in the room held for them, before any other
        task; one that no longer fits there (the region shrank, or its tenant's quota did) is
        placed like any other."""
        placed: set[tuple[str, int]] = set()
        for task in movers:
            if self.full():
                break
            room = self.rooms.get(task.moving_to or "")
            if room is None or not task.allows(room.region.name):
                continue
            room.release(task)  # The hold, taken when the rooms were counted.
            if self.share.over_quota(task) is not None or not room.fits(task):
                continue
            option = _score(task, room, self.regions, self.prefs(task), self.settings)
            self._assign(
                task,
                option,
                f"{room.region.name}: moved (up or aside) as asked when it yielded, room held for "
                f"it since; {option.explain(self.settings)}",
            )
            self.share.add(task, room.region)
            placed.add(task.ref)
        return placed

    def _move_up(self) -> None:
        """Asks running tasks to yield and move to a faster region whose room this pass left
        unused, the most time saved per device-hour there first, and holds that room for
        them."""
        settings = self.settings
        if settings.move_ups_max <= 0 or self.full():
            return
        open_rooms = [
            room
            for room in self.rooms.values()
            if room.held_for is None and (room.free_gpus > 0 or room.free_slots > 0)
        ]
        if not open_rooms:
            return
        budget = self._moves_left()
        if budget <= 0:
            return
        fastest = max(room.region.speed for room in open_rooms)
        # Highest gain per device-hour first: the completion time a move saves, over the device
        # time it takes in the faster region (its GPUs times its run there). The room of a
        # faster region is what is scarce; a 1-GPU task gains as much per device-hour of it as
        # an 8-GPU task gains with 8, and mean completion time counts jobs, not GPUs. Found
        # lazily: each task enters with an upper bound of its key (the fastest open region, no
        # data to move: (fastest / speed here - 1) / GPUs) and is weighed region by region only
        # when that bound comes first, so a pass with many running tasks weighs only the best
        # few. A move's key is its gain, or its data-free gain ((speed there / speed here - 1)
        # / GPUs, never below the gain but for the rest's rounding to whole milliseconds) when
        # within a billionth of it, so tasks of one speed and size tie exactly, and at equal
        # keys a weighed move comes before a bound (kind 0 before 1): ties go to the task
        # weighed first, and the first of a class of equal bounds is taken without weighing
        # the rest of the class.
        heap: list[tuple[float, int, tuple[str, int], str, int]] = []
        entries: list[tuple[TaskInfo, _Room, float] | _Move] = []
        for task in self.cluster.tasks:
            if (
                task.state != "running"
                or task.preempt_requested_ms is not None
                or task.token is None
                or task.started_ms is None
                or task.ref in self.preempted
                or self.now_ms - task.started_ms < settings.move_up_min_run_ms
            ):
                continue
            here = self.rooms.get(task.region or "")
            if here is None or here.region.speed >= fastest:
                continue
            here_speed = max(here.region.speed, 1e-6)
            rest_ms = self._rest_ms(task, here_speed)
            rest_here_ms = rest_ms / here_speed
            # Even with no data to move, the fastest open region must save enough.
            best_ms = rest_here_ms - rest_ms / fastest
            if best_ms < settings.move_up_saving_min_ms or best_ms < (
                settings.move_up_saving_fraction * rest_here_ms
            ):
                continue
            entries.append((task, here, rest_ms))
            bound = (fastest / here_speed - 1.0) / max(task.gpus, 1)
            heap.append((-bound, 1, task.ref, "", len(entries) - 1))
        heapq.heapify(heap)
        moved: set[tuple[str, int]] = set()
        while heap and budget > 0 and not self.full():
            index = heapq.heappop(heap)[-1]
            entry = entries[index]
            if not isinstance(entry, _Move):
                task, here, rest_ms = entry
                for room in open_rooms:
                    if room.region.speed <= here.region.speed or not task.allows(room.region.name):
                        continue
                    if task.regions_prefer and room.region.name not in task.regions_prefer:
                        continue
                    if _uses_gpu(task, room.region) and task.gpus > room.free_gpus:
                        continue
                    move = self._move(task, here, room, rest_ms)
                    if move is not None:
                        entries.append(move)
                        here_speed = max(move.here_speed, 1e-6)
                        ideal = (room.region.speed / here_speed - 1.0) / max(task.gpus, 1)
                        key = ideal if move.gain >= ideal * (1.0 - 1e-9) else move.gain
                        name = room.region.name
                        heapq.heappush(heap, (-key, 0, task.ref, name, len(entries) - 1))
                continue
            move = entry
            task, room = move.task, move.option.room
            if task.ref in moved or room.held_for is not None or not room.fits(task):
                continue
            if self._backfill_conflict(task, move.option):
                continue
            room.take(task)  # Held for it until it is placed there.
            moved.add(task.ref)
            self.preempted.add(task.ref)
            budget -= 1
            self.decisions.preempts.append(
                Preempt.of(
                    task,
                    f"moving to faster region {room.region.name} (speed "
                    f"{room.region.speed:g} over {move.here_speed:g}): est. "
                    f"{_minutes(move.rest_here_ms)} left here, "
                    f"{_minutes(move.option.finish_ms)} there with the data; checkpoints, "
                    f"stops and resumes there (room held)",
                    moving_to=room.region.name,
                )
            )

    def _moves_left(self) -> int:
        """How many more tasks may be asked to move (up or aside): `move_ups_max` less those
        moving in the view and those this pass asked."""
        moving = sum(1 for task in self.cluster.tasks if _moving(task))
        asked = sum(1 for item in self.decisions.preempts if item.moving_to is not None)
        return self.settings.move_ups_max - moving - asked

    def _move_aside(self) -> None:
        """Asks running tasks that may run elsewhere to move to regions no faster, to
        make room for waiting tasks that may run only where they run (in placement order)."""
        settings = self.settings
        if not settings.move_aside or not self.pinned_waiting:
            return
        budget = self._moves_left()
        if budget <= 0 or self.full():
            return
        # Per region, a shape (GPUs, memory, model) that found no movers is not tried again.
        tried: set[tuple[str, int, int, str | None]] = set()
        for task, region in self.pinned_waiting:
            if budget <= 0 or self.full():
                return
            shape = (region, task.gpus, task.gpu_memory_mb, task.gpu_model)
            room = self.rooms[region]
            if shape in tried or room.held_for is not None or room.fits(task):
                continue
            # Its tenant's later tasks may have reached the quota since its turn: moving others
            # aside for it now would make room it could not take.
            if self.share.over_quota(task) is not None:
                continue
            moves = self._aside_moves(task, room, budget)
            if moves is None:
                tried.add(shape)
                continue
            for move in moves:
                mover = move.task
                self.preempted.add(mover.ref)
                budget -= 1
                self.decisions.preempts.append(
                    Preempt.of(
                        mover,
                        f"moving aside to {move.option.room.region.name} (speed "
                        f"{move.option.room.region.speed:g}, here {move.here_speed:g}) for "
                        f"{_named_for(task, mover)}, which may run only in {region}: est. "
                        f"{_minutes(move.rest_here_ms)} left here, "
                        f"{_minutes(move.option.finish_ms)} there with the data; checkpoints, "
                        f"stops and resumes there (room held)",
                        moving_to=move.option.room.region.name,
                    )
                )
            room.held_for = task.ref
            self.share.add(task, room.region)
            reason = (
                f"{len(moves)} task(s) that may run elsewhere are moving out of {region}, the "
                "only region it may run in, to make room for it"
            )
            if task.ref in self.decisions.waiting:
                self.decisions.waiting[task.ref] = reason
            else:
                self.wait(task, reason)

    def _aside_moves(self, task: TaskInfo, room: _Room, budget: int) -> list[_Move] | None:
        """Running tasks in `room` that may move elsewhere and together free enough for `task`,
        each with where it goes (that room taken for it), or None (nothing taken)."""
        settings = self.settings
        start = _earliest_fit(task, room, self.now_ms)
        wait_ms = float("inf") if start is None else start - self.now_ms
        candidates = []
        for _, holder in room.holders:
            if (
                holder.state != "running"
                or holder.preempt_requested_ms is not None
                or holder.token is None
                or holder.started_ms is None
                or holder.ref in self.preempted
                or self.now_ms - holder.started_ms < settings.move_up_min_run_ms
            ):
                continue
            move = self._aside(holder, room)
            if move is not None:
                candidates.append(move)
        # The smallest first (they find room elsewhere most easily, and free no more than
        # needed), then those that lose least.
        candidates.sort(key=lambda move: (move.task.gpus, -move.saving_ms, move.task.ref))
        trial = room.trial()
        chosen: list[_Move] = []
        lost_ms = 0.0
        for move in candidates:
            target = move.option.room
            if len(chosen) >= budget or lost_ms - move.saving_ms >= wait_ms:
                break
            probe = trial.trial()
            probe.release(move.task)
            if probe.room_for(task) <= trial.room_for(task) or not target.fits(move.task):
                continue  # It frees nothing `task` can use, or an earlier mover took the room.
            target.take(move.task)
            chosen.append(move)
            lost_ms -= move.saving_ms
            trial = probe
            if trial.fits(task):
                return chosen
        for move in chosen:
            move.option.room.release(move.task)
        return None

    def _aside(self, task: TaskInfo, here: _Room) -> _Move | None:
        """Where running `task` would move aside to (the best-scored open room no faster than
        `here`), if it loses little enough there."""
        settings = self.settings
        here_speed = max(here.region.speed, 1e-6)
        rest_ms = self._rest_ms(task, here_speed)
        rest_here_ms = rest_ms / here_speed
        tenant = self.prefs(task)
        devices = _billed_devices(task, here.region)
        stay_ms = rest_here_ms + _price_ms(here.region, devices, rest_here_ms, tenant, settings)
        # What moving costs: the checkpoint from here, and the input from where it lives.
        moved = replace(task, checkpoint_region=here.region.name, estimate_ms=int(rest_ms))
        best: _Option | None = None
        for room in self.rooms.values():
            region = room.region
            if (
                room is here
                or room.held_for is not None
                or region.speed > here.region.speed
                or not task.allows(region.name)
                or (task.regions_prefer and region.name not in task.regions_prefer)
                or not room.fits(task)
            ):
                continue
            option = _score(moved, room, self.regions, tenant, settings)
            if option.finish_ms - rest_here_ms > settings.move_aside_loss_max_ms:
                continue
            go_ms = option.finish_ms + _price_ms(
                region, option.devices, option.run_ms, tenant, settings
            )
            if go_ms - stay_ms > settings.move_aside_loss_max_ms:
                continue
            if self._backfill_conflict(task, option):
                continue
            if best is None or (option.score, region.name) < (best.score, best.room.region.name):
                best = option
        if best is None:
            return None
        return _Move(
            task=task,
            option=best,
            saving_ms=rest_here_ms - best.finish_ms,
            rest_here_ms=rest_here_ms,
            here_speed=here.region.speed,
        )

    def _rest_ms(self, task: TaskInfo, speed: float) -> float:
        """The estimated rest of a running task's work, at speed 1.0. This attempt's work is all
        the view shows done; a task past its estimate is expected to run about as long again as
        this attempt has (run times are heavy-tailed)."""
        assert task.started_ms is not None
        done_ms = max(self.now_ms - task.started_ms, 0) * speed
        rest_ms = task.estimate_ms - done_ms
        return rest_ms if rest_ms > 0 else done_ms

    def _move(self, task: TaskInfo, here: _Room, room: _Room, rest_ms: float) -> _Move | None:
        """The saving of moving running `task` from `here` to `room`, if it passes the
        thresholds."""
        settings = self.settings
        rest_here_ms = rest_ms / max(here.region.speed, 1e-6)
        # What moving costs: the checkpoint from here, and the input from where it lives.
        moved = replace(task, checkpoint_region=here.region.name, estimate_ms=int(rest_ms))
        tenant = self.prefs(task)
        option = _score(moved, room, self.regions, tenant, settings)
        saving_ms = rest_here_ms - option.finish_ms
        if saving_ms < settings.move_up_saving_min_ms:
            return None
        if saving_ms < settings.move_up_saving_fraction * rest_here_ms:
            return None
        devices = _billed_devices(task, here.region)
        stay_ms = rest_here_ms + _price_ms(here.region, devices, rest_here_ms, tenant, settings)
        go_ms = option.finish_ms + _price_ms(
            room.region, option.devices, option.run_ms, tenant, settings
        )
        if go_ms >= stay_ms:
            return None
        return _Move(
            task=task,
            option=option,
            saving_ms=saving_ms,
            rest_here_ms=rest_here_ms,
            here_speed=here.region.speed,
        )

    def _backfill_conflict(self, task: TaskInfo, option: _Option) -> bool:
        """Whether placing `task` there would delay the head's reservation."""
        reservation = self.reservation
        if reservation is None or reservation.region != option.room.region.name:
            return False
        if self.now_ms + option.finish_ms <= reservation.start_ms:
            return False
        # It outlasts the reservation: allowed only if the head still fits when it comes.
        trial = option.room.trial()
        trial.take(task)
        for end, holder in trial.holders:
            if end <= reservation.start_ms:
                trial.release(holder)
        return not trial.fits(reservation.task)

    def _reserve(self, task: TaskInfo, rooms: list[_Room]) -> None:
        best: tuple[float, str] | None = None
        for room in rooms:
            start = _earliest_fit(task, room, self.now_ms)
            if start is not None and (best is None or (start, room.region.name) < best):
                best = (start, room.region.name)
        if best is None:
            self.wait(task, "no room now, and no running task's end would make room")
            return
        start_ms, region = best
        self.reservation = _Reservation(task=task, region=region, start_ms=start_ms)
        if start_ms <= self.now_ms:
            # Running tasks' estimated ends have passed: when they end is not known, and a time
            # of "now" would move with every pass. Nothing ends before it, so only tasks that
            # leave it room may run there (`_backfill_conflict`).
            when = "once running tasks there end (their estimates have passed)"
            held = self.rooms[region].held_for
            if held is not None:
                when = f"after {held[0]}[{held[1]}], for which room is held there, {when}"
            backfill = f"later tasks may run in {region} only if they leave room for it"
        else:
            when = f"at {_time_text(start_ms)}"
            backfill = (
                f"later tasks may run in {region} only if they end before then or leave room for it"
            )
        self.wait(
            task, f"head of the queue: reserved {region}, expected to fit there {when}; {backfill}"
        )

    def _awaiting_yield(self, task: TaskInfo, rooms: list[_Room]) -> _Room | None:
        """Holds (and returns) a region where lower-priority tasks already asked to yield will
        make room for `task`, so it waits for them instead of preempting more."""
        for room in rooms:
            if room.held_for is not None:
                continue
            # A task that may run only here also counts on tasks moving away (moving aside).
            only_here = self.settings.move_aside and len(rooms) == 1
            leaving = [
                holder
                for _, holder in room.holders
                if holder.preempt_requested_ms is not None
                and (holder.priority < task.priority or (only_here and holder.moving_to))
            ]
            if not leaving:
                continue
            trial = room.trial()
            for holder in leaving:
                trial.release(holder)
            if trial.fits(task):
                room.held_for = task.ref
                moving = sum(1 for holder in leaving if holder.moving_to)
                kind = (
                    "preempted"
                    if not moving
                    else "moving"
                    if moving == len(leaving)
                    else "preempted or moving"
                )
                self.wait(
                    task,
                    f"waiting for {len(leaving)} {kind} task(s) in {room.region.name} to "
                    "checkpoint and stop",
                )
                return room
        return None

    def _preempt_for(self, task: TaskInfo, rooms: list[_Room]) -> _Room | None:
        """Ends lower-priority running tasks in one region to make room for `task`, and holds
        (and returns) that region."""
        # Forced ends of victims that did not yield in time do not use up the budget.
        asked = sum(not item.force for item in self.decisions.preempts)
        budget = self.settings.preemptions_max - asked
        if budget <= 0:
            return None
        best: tuple[float, str, list[TaskInfo]] | None = None
        for room in rooms:
            if room.held_for is not None:
                continue
            victims = self._victims(task, room, budget)
            if victims is None:
                continue
            lost_ms = sum(self._lost_work_ms(victim) for victim in victims)
            if best is None or (lost_ms, room.region.name) < best[:2]:
                best = (lost_ms, room.region.name, victims)
        if best is None:
            return None
        lost_ms, region, victims = best
        room = self.rooms[region]
        for victim in victims:
            self.preempted.add(victim.ref)
            room.holders = [item for item in room.holders if item[1].ref != victim.ref]
            room.release(victim)
            self.decisions.preempts.append(
                Preempt.of(
                    victim,
                    f"preempted for {_named_for(task, victim)} ("
                    + (
                        f"priority {task.priority} over {victim.priority}"
                        if task.tenant == victim.tenant
                        else "a higher priority"
                    )
                    + "): checkpoints, stops and resumes from its checkpoint when room frees",
                )
            )
        room.held_for = task.ref
        self.wait(
            task,
            f"preempting {len(victims)} lower-priority task(s) in {region} "
            f"(losing {_minutes(lost_ms)} of work since their checkpoints); placed when they stop",
        )
        return room

    def _victims(self, task: TaskInfo, room: _Room, budget: int) -> list[TaskInfo] | None:
        if room.lowest_priority() >= task.priority:
            return None
        candidates = [
            holder
            for _, holder in room.holders
            if holder.state == "running"
            and holder.preempt_requested_ms is None
            and holder.priority < task.priority
            and holder.token is not None
            and holder.ref not in self.preempted
            and holder.started_ms is not None
            and self.now_ms - holder.started_ms >= self.settings.preemption_min_run_ms
        ]
        candidates.sort(
            key=lambda holder: (holder.priority, self._lost_work_ms(holder), holder.ref)
        )
        trial = room.trial()
        chosen: list[TaskInfo] = []
        for holder in candidates:
            # Only victims whose room `task` can use: a CPU task does not free GPUs, nor a
            # V100 task an A100.
            probe = trial.trial()
            probe.release(holder)
            if probe.room_for(task) <= trial.room_for(task):
                continue
            if len(chosen) >= budget:
                return None
            trial = probe
            chosen.append(holder)
            if trial.fits(task):
                return chosen
        return None

    def _lost_work_ms(self, task: TaskInfo) -> float:
        """Work a victim loses if ended now: since its last checkpoint, or since its attempt
        started if that checkpoint is older (an earlier attempt's)."""
        moments = [time for time in (task.checkpointed_ms, task.started_ms) if time is not None]
        since = max(moments) if moments else None
        gpus = max(task.gpu_units, 1.0)
        return float(max(self.now_ms - (since or self.now_ms), 0)) * gpus


def _never_fits(task: TaskInfo, rooms: list[_Room]) -> str:
    """Why `task` fits none of `rooms` even empty, in terms of the devices it asks for: only
    GPUs of its model (if it names one) with its memory (if it asks for some) count."""
    if not _asks_gpu(task) or any(room.gpu_tasks_in_slots for room in rooms):
        return "no allowed healthy region has CPU slots"
    model = f"{task.gpu_model} " if task.gpu_model else ""
    if not task.gpus:
        return (
            f"needs {task.gpu_memory_mb} MB on one {model}GPU; no allowed healthy region has "
            "one with that much memory"
        )
    memory = f" with {task.gpu_memory_mb} MB or more each" if task.gpu_memory_mb else ""
    most = max(
        (
            sum(
                1
                for gpu in room.region.gpus
                if (task.gpu_model is None or gpu.model == task.gpu_model)
                and gpu.memory_mb >= task.gpu_memory_mb
            )
            for room in rooms
        ),
        default=0,
    )
    return (
        f"needs {task.gpus} {model}GPU(s){memory} in one region; no allowed healthy region has "
        f"that many (largest: {most})"
    )


def clip_reason(reason: str) -> str:
    """`reason` as the replicated state keeps it: at most `MESSAGE_BYTES_MAX` bytes of UTF-8,
    a longer one cut and ended with "..."."""
    data = reason.encode()
    if len(data) <= MESSAGE_BYTES_MAX:
        return reason
    return data[: MESSAGE_BYTES_MAX - 3].decode(errors="ignore") + "..."


def schedule(cluster: Cluster, settings: SchedulerSettings | None = None) -> Decisions:
    """Placement, take-back and preemption decisions for one pass, with reasons."""
    return _Pass(cluster, settings or SchedulerSettings()).run()
