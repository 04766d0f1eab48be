"""The scheduling policy against a brute-force reference on small instances.

An instance: 3 regions (0 to 4 identical GPUs each, of 16, 40 or 80 GB; speed, price, carbon and
round-trip times drawn), up to 6 pending tasks (1 to 4 GPUs, priority 0 or 1, a memory floor, an
allow list, input data homed in one region, an estimate from 10 minutes to 10 hours) and up to 2
running tasks of priority 9 that hold devices (never preempted, nor moved up: off here). The
reference enumerates every assignment of each pending task to one of the 3 regions or to none (at
most 4^6 = 4,096) and keeps the feasible ones: devices, GPU memory, health and allow lists.

The documented objective, lexicographic:
1. place as many tasks as possible, priority class by class (highest first);
2. then minimize the sum over placed tasks of the policy's score without its best-fit and
   preference terms: moving the input (`transfer_ms`) plus the run time at the region's speed,
   plus price and carbon converted to time at `ms_per_dollar` and `ms_per_kg_carbon`.

Each placed task's score is divided by its best score in any region it fits now (as if no other
pending task were placed), so that which tasks the policy places (its fairness order decides) does
not count against it, only how well each is placed and how many.

Measured over instances 0 to 4,999 (`instance(seed)`):
- every decision is feasible;
- the policy places as many tasks per priority class as the reference in 91.96% of instances
  (never more, since the reference is the maximum). It falls short in two ways, both by design:
  EASY backfill holds back a task that would delay the head's reservation, and the greedy pass
  does not look ahead, so a task can take the only region where a later one fits
  (`test_the_reference_finds_the_known_optimum_of_a_small_case`);
- where it places as many, its objective is within 1% of the reference's in 93.6% of those
  instances, within 5% in 95.4%, within 10% in 96.7%, and at worst 3.88x (instance 4,190: a
  long low-priority task may not use the free device of a 3x-faster region reserved for the
  head, and takes a slow, dear region now instead of waiting).
The tests check feasibility on every instance they draw, the worst ratio as the stated tolerance
(`OBJECTIVE_RATIO_MAX`) on instances from the measured range, and the rates on a fixed sample.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from xrcore.scheduler import (
    Cluster,
    Decisions,
    GpuInfo,
    RegionInfo,
    SchedulerSettings,
    TaskInfo,
    TenantInfo,
    schedule,
    transfer_ms,
)

HOUR_MS = 3_600_000
NAMES = ("a", "b", "c")
# Where the policy places as many tasks as the reference, its objective is at most this many
# times the reference's: the worst measured over instances 0 to 4,999 (see the docstring).
OBJECTIVE_RATIO_MAX = 3.88
MEASURED_SEEDS = 5_000
# The reference places pending tasks only: the running tasks stay where they are, so the
# policy's moving up (of running tasks to faster regions) is off.
SETTINGS = SchedulerSettings(move_ups_max=0)


@dataclass(frozen=True)
class Instance:
    cluster: Cluster

    @property
    def pending(self) -> list[TaskInfo]:
        return [task for task in self.cluster.tasks if task.state == "pending"]

    @property
    def regions(self) -> dict[str, RegionInfo]:
        return {region.name: region for region in self.cluster.regions}


def instance(seed: int) -> Instance:
    rng = random.Random(seed)
    rtt = {pair: rng.uniform(10.0, 250.0) for pair in itertools.combinations(NAMES, 2)}
    regions = tuple(
        RegionInfo(
            name=name,
            healthy=rng.random() > 0.1,
            gpus=tuple(
                GpuInfo(model="gpu", memory_mb=memory)
                for memory in [rng.choice((16_384, 40_960, 81_920))] * rng.randint(0, 4)
            ),
            price_per_gpu_hour=rng.choice((0.0, 1.0, 2.5, 5.0)),
            carbon_g_per_kwh=rng.choice((30.0, 300.0, 800.0)),
            speed=rng.choice((1.0, 1.5, 2.0, 3.0)),
            rtt_ms={other: value for (this, other), value in rtt.items() if this == name},
        )
        for name in NAMES
    )
    tasks: list[TaskInfo] = []
    free = {region.name: len(region.gpus) if region.healthy else 0 for region in regions}
    for number in range(rng.randint(0, 2)):
        where = rng.choice(NAMES)
        gpus = rng.randint(1, 2)
        if free[where] < gpus:
            continue
        free[where] -= gpus
        tasks.append(
            TaskInfo(
                job_id=f"run{number}",
                task_index=0,
                tenant="ops",
                priority=9,
                state="running",
                region=where,
                gpus=gpus,
                started_ms=HOUR_MS - rng.randrange(0, HOUR_MS),
                token=number + 1,
                estimate_ms=rng.randrange(10, 600) * 60_000,
            )
        )
    for number in range(rng.randint(1, 6)):
        tasks.append(
            TaskInfo(
                job_id=f"job{number}",
                task_index=0,
                tenant=rng.choice(("x", "y")),
                priority=rng.choice((0, 0, 1)),
                gpus=rng.choice((1, 1, 2, 4)),
                gpu_memory_mb=rng.choice((0, 0, 30_000)),
                regions_allow=rng.choice(((), (), (rng.choice(NAMES),))),
                input_size_mb=rng.choice((0, 10_000, 100_000)),
                input_region=rng.choice(NAMES),
                submitted_ms=number,
                estimate_ms=rng.randrange(10, 600) * 60_000,
            )
        )
    tenants = {
        "x": TenantInfo(name="x"),
        "y": TenantInfo(name="y", cost_weight=rng.choice((0.0, 1.0, 3.0))),
    }
    return Instance(Cluster(now_ms=HOUR_MS, regions=regions, tasks=tuple(tasks), tenants=tenants))


def option_ms(item: Instance, task: TaskInfo, region: RegionInfo) -> float:
    """The policy's score for `task` in `region`, without its best-fit and preference terms."""
    regions = item.regions
    tenant = item.cluster.tenants.get(task.tenant) or TenantInfo(name=task.tenant)
    moving_ms = transfer_ms(task.input_size_mb, task.input_region, region.name, regions, SETTINGS)
    run_ms = task.estimate_ms / region.speed
    device_hours = task.gpus * run_ms / HOUR_MS
    money_ms = tenant.cost_weight * region.price_per_gpu_hour * SETTINGS.ms_per_dollar
    carbon_ms = (
        tenant.carbon_weight
        * region.carbon_g_per_kwh
        * SETTINGS.gpu_power_kw
        / 1000
        * SETTINGS.ms_per_kg_carbon
    )
    return moving_ms + run_ms + device_hours * (money_ms + carbon_ms)


def fits(task: TaskInfo, region: RegionInfo) -> bool:
    return (
        region.healthy
        and task.allows(region.name)
        and all(gpu.memory_mb >= task.gpu_memory_mb for gpu in region.gpus)
    )


def free_gpus(item: Instance) -> dict[str, int]:
    free = {region.name: len(region.gpus) for region in item.cluster.regions}
    for task in item.cluster.tasks:
        if task.state != "pending" and task.region is not None:
            free[task.region] -= task.gpus
    return free


def feasible(item: Instance, placement: dict[str, str]) -> bool:
    """Whether placing job_id -> region fits every region's devices, memory, health and lists."""
    regions = item.regions
    left = free_gpus(item)
    for task in item.pending:
        where = placement.get(task.job_id)
        if where is None:
            continue
        if not fits(task, regions[where]):
            return False
        left[where] -= task.gpus
    return all(value >= 0 for value in left.values())


def objective(item: Instance, placement: dict[str, str]) -> tuple[tuple[int, ...], float]:
    """(tasks placed per priority class, highest first; the sum of their scores)."""
    regions = item.regions
    classes = sorted({task.priority for task in item.pending}, reverse=True)
    counts = tuple(
        sum(1 for task in item.pending if task.priority == priority and task.job_id in placement)
        for priority in classes
    )
    total = sum(
        option_ms(item, task, regions[placement[task.job_id]]) / ideal_ms(item, task)
        for task in item.pending
        if task.job_id in placement
    )
    return counts, total


def ideal_ms(item: Instance, task: TaskInfo) -> float:
    """The task's best score in any region it fits now, as if no other pending task were
    placed."""
    free = free_gpus(item)
    return min(
        option_ms(item, task, region)
        for region in item.cluster.regions
        if fits(task, region) and free[region.name] >= task.gpus
    )


def reference(item: Instance) -> tuple[tuple[int, ...], float]:
    """The best objective over every assignment of the pending tasks to a region or none."""
    pending = item.pending
    best: tuple[tuple[int, ...], float] | None = None
    for choice in itertools.product((None, *NAMES), repeat=len(pending)):
        placement = {
            task.job_id: where for task, where in zip(pending, choice, strict=True) if where
        }
        if not feasible(item, placement):
            continue
        counts, total = objective(item, placement)
        if best is None or (counts, -total) > (best[0], -best[1]):
            best = (counts, total)
    assert best is not None  # placing nothing is always feasible
    return best


def policy(item: Instance) -> tuple[Decisions, dict[str, str]]:
    decisions = schedule(item.cluster, SETTINGS)
    return decisions, {assign.job_id: assign.region for assign in decisions.assigns}


def compare(seed: int) -> tuple[bool, bool, float]:
    """(feasible, places as many per class as the reference, objective ratio where it does)."""
    item = instance(seed)
    decisions, placement = policy(item)
    assert not decisions.preempts  # running tasks outrank every pending one
    ok = feasible(item, placement)
    counts, total = objective(item, placement)
    best_counts, best_total = reference(item)
    assert counts <= best_counts, "the reference's count is the maximum"
    same = counts == best_counts
    ratio = total / best_total if same and best_total else 1.0
    return ok, same, ratio


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_the_policys_decisions_are_always_feasible(seed: int) -> None:
    ok, _, _ = compare(seed)
    assert ok, f"infeasible decisions for instance({seed})"


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=MEASURED_SEEDS - 1))
def test_the_policy_is_within_the_stated_tolerance_of_the_reference(seed: int) -> None:
    _, same, ratio = compare(seed)
    if same:
        assert ratio <= OBJECTIVE_RATIO_MAX + 1e-9, f"instance({seed}): {ratio:.2f}x the reference"


def test_measured_rates_over_a_fixed_sample() -> None:
    """Over the first 300 instances: how often the policy places as many as the reference, and
    how close its objective is when it does (the docstring gives the figures over 5,000)."""
    results = [compare(seed) for seed in range(300)]
    assert all(ok for ok, _, _ in results)
    same = [ratio for _, equal, ratio in results if equal]
    assert len(same) >= 0.88 * len(results)
    within = [ratio for ratio in same if ratio <= 1.05]
    assert len(within) >= 0.93 * len(same)
    assert max(same) <= OBJECTIVE_RATIO_MAX


def test_the_reference_finds_the_known_optimum_of_a_small_case() -> None:
    # One 2-GPU region and one 1-GPU region; tasks of 2 and 1 GPU: both placed, each in the
    # region that fits it, although the 1-GPU task alone would prefer the faster 2-GPU region.
    regions = (
        RegionInfo(name="a", gpus=(GpuInfo(model="g", memory_mb=1),) * 2, speed=2.0),
        RegionInfo(name="b", gpus=(GpuInfo(model="g", memory_mb=1),), speed=1.0),
        RegionInfo(name="c", healthy=False),
    )
    tasks = (
        TaskInfo(job_id="one", task_index=0, gpus=1, submitted_ms=0, estimate_ms=HOUR_MS),
        TaskInfo(job_id="two", task_index=0, gpus=2, submitted_ms=1, estimate_ms=HOUR_MS),
    )
    item = Instance(Cluster(now_ms=0, regions=regions, tasks=tasks))
    counts, total = reference(item)
    assert counts == (2,)
    # `two` in a at its best (1.0); `one` in b at twice its best (a, at speed 2).
    assert total == 3.0
    # The greedy policy puts `one` in the faster region first, and `two` then fits nowhere:
    # the look-ahead case the docstring allows for.
    _, placement = policy(item)
    assert placement == {"one": "a"}
