"""The scheduling policy, one test per rule of `xrcore.scheduler`'s docstring, then one scenario
per feature (preemption, backfill, gang, fairness, data locality, failure of a region) run in the
simulator of `bench/scheduler_sim.py`.

Rules: rooms (health, running tasks hold their devices, CPU slots, shared GPU memory), order
(priority, weighted dominant share, submission order, quotas), choice (fit, allow and deny, gang,
finish time, data, price and carbon, preference, a lost lease, array siblings), reservation and
backfill, preemption, and a reason for every decision.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import xrcore.scheduler as scheduler_module
from bench.scheduler import fifo_first_fit, scale_cluster
from bench.scheduler_sim import SimSettings, simulate
from bench.scheduler_trace import HOUR_MS, MINUTE_MS, Outage, Trace, TraceJob
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

NOW_MS = 10 * HOUR_MS


def region(
    name: str,
    gpus: int = 0,
    *,
    model: str = "A100",
    memory_mb: int = 81_920,
    slots: int = 0,
    speed: float = 1.0,
    price: float = 0.0,
    carbon: float = 0.0,
    rtt_ms: dict[str, float] | None = None,
    healthy: bool = True,
) -> RegionInfo:
    return RegionInfo(
        name=name,
        healthy=healthy,
        gpus=tuple(GpuInfo(model=model, memory_mb=memory_mb) for _ in range(gpus)),
        cpu_slots=slots,
        price_per_gpu_hour=price,
        carbon_g_per_kwh=carbon,
        speed=speed,
        rtt_ms=rtt_ms or {},
    )


def task(job_id: str, index: int = 0, **fields: Any) -> TaskInfo:
    fields.setdefault("gpus", 1)
    fields.setdefault("estimate_ms", HOUR_MS)
    return TaskInfo(job_id=job_id, task_index=index, **fields)


def running(job_id: str, where: str, *, started_ms: int = 0, **fields: Any) -> TaskInfo:
    fields.setdefault("token", 1)
    return task(job_id, state="running", region=where, started_ms=started_ms, **fields)


def run(
    regions: list[RegionInfo],
    tasks: list[TaskInfo],
    tenants: dict[str, TenantInfo] | None = None,
    settings: SchedulerSettings | None = None,
) -> Decisions:
    cluster = Cluster(
        now_ms=NOW_MS, regions=tuple(regions), tasks=tuple(tasks), tenants=tenants or {}
    )
    return schedule(cluster, settings)


def placed(decisions: Decisions) -> dict[str, str]:
    """job_id[index] -> region."""
    return {f"{item.job_id}[{item.task_index}]": item.region for item in decisions.assigns}


def order(decisions: Decisions) -> list[str]:
    return [item.job_id for item in decisions.assigns]


# Rooms.


def test_rooms__an_unhealthy_region_gets_nothing() -> None:
    decisions = run([region("a", 4, healthy=False), region("b", 4)], [task("j")])
    assert placed(decisions) == {"j[0]": "b"}


def test_rooms__running_and_assigned_tasks_hold_their_devices() -> None:
    decisions = run(
        [region("a", 2)],
        [
            running("r", "a"),
            task("s", state="assigned", region="a"),
            task("j"),
        ],
    )
    assert placed(decisions) == {}
    assert "j" in {ref[0] for ref in decisions.waiting}


def test_rooms__a_region_without_gpus_runs_tasks_in_cpu_slots() -> None:
    decisions = run([region("cpu", slots=2)], [task("a", gpus=0), task("b", gpus=0), task("c")])
    # Without GPUs every task takes a slot, the GPU task included; the third waits for a slot.
    assert len(decisions.assigns) == 2


def test_rooms__shared_gpu_memory_packs_tasks_onto_one_device() -> None:
    tasks = [task(f"s{n}", gpus=0, gpu_memory_mb=20_000) for n in range(4)]
    decisions = run([region("a", 1, memory_mb=81_920)], tasks)
    assert len(decisions.assigns) == 4
    decisions = run(
        [region("a", 1, memory_mb=81_920)], [*tasks, task("s4", gpus=0, gpu_memory_mb=5_000)]
    )
    assert len(decisions.assigns) == 4  # 80 GB of one device: four shares of 20 GB, no fifth


def test_rooms__an_assigned_task_in_a_dead_region_is_taken_back() -> None:
    decisions = run(
        [region("a", 2, healthy=False), region("b", 2)],
        [task("j", state="assigned", region="a")],
    )
    assert [(item.job_id, item.task_index) for item in decisions.unassigns] == [("j", 0)]
    assert "unhealthy" in decisions.unassigns[0].reason


# Order.


def test_order__higher_priority_first() -> None:
    decisions = run(
        [region("a", 1)], [task("low", submitted_ms=0), task("high", priority=5, submitted_ms=9)]
    )
    assert order(decisions) == ["high"]


def test_order__tenants_take_turns_by_weighted_dominant_share() -> None:
    # Tenant x already holds 2 of 4 GPUs; y holds none: y goes first, then they alternate.
    tasks = [
        running("held", "a", tenant="x", gpus=2),
        task("x1", tenant="x", submitted_ms=0),
        task("y1", tenant="y", submitted_ms=5),
        task("x2", tenant="x", submitted_ms=1),
        task("y2", tenant="y", submitted_ms=6),
    ]
    decisions = run([region("a", 4), region("b", 4)], tasks)
    assert order(decisions)[:3] == ["y1", "y2", "x1"]


def test_order__weights_scale_the_share() -> None:
    # x holds 2 GPUs at weight 4 (share 0.5/4), y holds 1 at weight 1 (0.25): x goes first.
    tasks = [
        running("hx", "a", tenant="x", gpus=2),
        running("hy", "a", tenant="y", gpus=1, token=2),
        task("x1", tenant="x", submitted_ms=5),
        task("y1", tenant="y", submitted_ms=0),
    ]
    tenants = {"x": TenantInfo(name="x", weight=4.0), "y": TenantInfo(name="y")}
    decisions = run([region("a", 4)], tasks, tenants)
    assert order(decisions) == ["x1"]


def test_order__a_tenants_tasks_go_in_submission_order() -> None:
    tasks = [task("late", submitted_ms=20), task("early", submitted_ms=10)]
    assert order(run([region("a", 1)], tasks)) == ["early"]


def test_order__a_tenant_at_its_gpu_quota_waits_and_says_so() -> None:
    tasks = [
        running("held", "a", tenant="x", gpus=3),
        task("x1", tenant="x"),
        task("y1", tenant="y"),
    ]
    tenants = {"x": TenantInfo(name="x", gpus_max=3)}
    decisions = run([region("a", 8)], tasks, tenants)
    assert order(decisions) == ["y1"]
    assert "quota of 3 GPUs" in decisions.waiting[("x1", 0)]


def test_order__a_tenant_at_its_task_quota_waits() -> None:
    tasks = [task("x1", tenant="x"), task("x2", tenant="x", submitted_ms=1)]
    decisions = run([region("a", 8)], tasks, {"x": TenantInfo(name="x", tasks_max=1)})
    assert order(decisions) == ["x1"]
    assert "its quota" in decisions.waiting[("x2", 0)]


def test_order__ineligible_tasks_wait_with_their_reason() -> None:
    decisions = run([region("a", 1)], [task("j", eligible=False, waiting="backing off")])
    assert decisions.waiting == {("j", 0): "backing off"}


# Choice.


def test_choice__gpu_count_model_and_memory_must_fit() -> None:
    regions = [
        region("small", 2, model="V100", memory_mb=16_384),
        region("big", 8, model="A100", memory_mb=81_920),
    ]
    decisions = run(
        regions,
        [
            task("four", gpus=4),
            task("model", gpus=1, gpu_model="A100"),
            task("memory", gpus=1, gpu_memory_mb=40_000),
        ],
    )
    assert set(placed(decisions).values()) == {"big"}


def test_choice__allow_and_deny_lists() -> None:
    regions = [region("a", 4), region("b", 4), region("c", 4)]
    decisions = run(
        regions,
        [task("allow", regions_allow=("c",)), task("deny", regions_deny=("a", "b"))],
    )
    assert placed(decisions) == {"allow[0]": "c", "deny[0]": "c"}


def test_choice__gang__all_gpus_of_a_task_in_one_region() -> None:
    # 4 + 4 free GPUs in two regions do not make room for one 8-GPU task.
    decisions = run([region("a", 4), region("b", 4)], [task("gang", gpus=8)])
    assert placed(decisions) == {}
    assert "largest: 4" in decisions.waiting[("gang", 0)]


def test_choice__the_faster_region_for_the_same_price() -> None:
    decisions = run([region("slow", 4, speed=1.0), region("fast", 4, speed=2.0)], [task("j")])
    assert placed(decisions) == {"j[0]": "fast"}


def test_choice__data_locality__the_input_stays_where_it_lives() -> None:
    rtt = {"far": 250.0}
    regions = [region("home", 4, rtt_ms=rtt), region("far", 4, speed=1.05, rtt_ms={"home": 250.0})]
    # 200 GB over a 250 ms path takes about an hour: more than 5% of a 1-hour run.
    decisions = run(regions, [task("j", input_size_mb=200_000, input_region="home")])
    assert placed(decisions) == {"j[0]": "home"}
    # Without the data the slightly faster region wins.
    assert placed(run(regions, [task("j")])) == {"j[0]": "far"}


def test_choice__a_checkpoint_counts_like_input_data() -> None:
    regions = [region("a", 4, rtt_ms={"b": 200.0}), region("b", 4, speed=1.05)]
    decisions = run(regions, [task("j", checkpoint_size_mb=200_000, checkpoint_region="a")])
    assert placed(decisions) == {"j[0]": "a"}


def test_choice__price_and_carbon_break_near_ties_at_the_tenants_weights() -> None:
    regions = [region("dear", 4, price=8.0), region("cheap", 4, price=1.0)]
    assert placed(run(regions, [task("j")])) == {"j[0]": "cheap"}
    regions = [region("dirty", 4, carbon=800.0), region("clean", 4, carbon=20.0)]
    assert placed(run(regions, [task("j")])) == {"j[0]": "clean"}
    # A tenant that ignores carbon takes the (alphabetically first) equal region.
    tenants = {"t": TenantInfo(name="t", carbon_weight=0.0)}
    assert placed(run(regions, [task("j", tenant="t")], tenants)) == {"j[0]": "clean"}
    regions = [region("a-dirty", 4, carbon=800.0), region("b-clean", 4, carbon=20.0)]
    assert placed(run(regions, [task("j", tenant="t")], tenants)) == {"j[0]": "a-dirty"}


def test_choice__a_jobs_own_price_and_carbon_weights_override_its_tenants() -> None:
    # An hour's work: 30 min in fast at $20 per GPU-hour ($10, worth 100 min at 600 s per
    # dollar), or 60 min in cheap at $1 (10 min): the tenant's weight of 1 picks cheap.
    regions = [region("fast", 4, speed=2.0, price=20.0), region("cheap", 4, price=1.0)]
    assert placed(run(regions, [task("j")])) == {"j[0]": "cheap"}
    # A job that does not care about price takes the faster region, whatever its tenant says.
    decisions = run(regions, [task("j", cost_weight=0.0)])
    assert placed(decisions) == {"j[0]": "fast"}
    # The reason names the job's own weight, which a tenant's listing would not show.
    assert decisions.assigns[0].reason.endswith(" (the job's price weight 0)")
    assert "weight" not in run(regions, [task("j")]).assigns[0].reason
    # A tenant that does not care, with a job that does: cheap.
    tenants = {"t": TenantInfo(name="t", cost_weight=0.0)}
    assert placed(run(regions, [task("j", tenant="t")], tenants)) == {"j[0]": "fast"}
    assert placed(run(regions, [task("j", tenant="t", cost_weight=1.0)], tenants)) == {
        "j[0]": "cheap"
    }
    # Carbon the same way, for a tenant that weighs it 20 times: 0.49 kg per GPU-hour in
    # dirty (700 g/kWh at 0.7 kW) for 30 min is worth 49 min, 0.014 kg in clean 3 min.
    green = {"g": TenantInfo(name="g", carbon_weight=20.0)}
    regions = [region("fast", 4, speed=2.0, carbon=700.0), region("clean", 4, carbon=20.0)]
    assert placed(run(regions, [task("j", tenant="g")], green)) == {"j[0]": "clean"}
    assert placed(run(regions, [task("j", tenant="g", carbon_weight=0.0)], green)) == {
        "j[0]": "fast"
    }
    # A weight the job leaves unset is its tenant's: price still counts here.
    dear = [
        replace(item, price_per_gpu_hour=20.0) if item.name == "fast" else item for item in regions
    ]
    assert placed(run(dear, [task("j", tenant="g", carbon_weight=0.0)], green)) == {"j[0]": "clean"}


def test_move_up__at_no_higher_price_at_the_jobs_own_weights() -> None:
    regions, tasks = _move_up_case(10 * HOUR_MS)
    # b at $20 more per GPU-hour for the 4.5 hours there: worth 15 hours, more than it saves.
    regions[1] = replace(regions[1], price_per_gpu_hour=20.0)
    assert run(regions, tasks).preempts == []
    [move] = run(regions, [replace(tasks[0], cost_weight=0.0)]).preempts
    assert move.moving_to == "b"


def test_choice__a_preferred_region_wins_over_any_other_that_fits() -> None:
    regions = [region("fast", 4, speed=4.0), region("slow", 4, speed=1.0, price=9.0)]
    decisions = run(regions, [task("j", regions_prefer=("slow",))])
    assert placed(decisions) == {"j[0]": "slow"}


def test_choice__a_lost_lease_avoids_its_region_while_another_fits() -> None:
    regions = [region("best", 4, speed=2.0), region("other", 4)]
    assert placed(run(regions, [task("j", avoid_region="best")])) == {"j[0]": "other"}
    # The only region that fits is used all the same.
    assert placed(run([region("best", 4)], [task("j", avoid_region="best")])) == {"j[0]": "best"}


def test_choice__array_siblings_fill_the_fastest_region_first() -> None:
    regions = [region("fast", 2, speed=2.0), region("slow", 4, speed=1.0)]
    decisions = run(regions, [task("arr", index) for index in range(4)])
    assert sorted(placed(decisions).items()) == [
        ("arr[0]", "fast"),
        ("arr[1]", "fast"),
        ("arr[2]", "slow"),
        ("arr[3]", "slow"),
    ]


def test_choice__best_fit_keeps_a_whole_region_free_for_a_large_task() -> None:
    # Same speed and price: the 1-GPU task goes where it leaves fewer devices idle.
    regions = [region("a", 8), region("b", 8)]
    tasks = [running("r", "b", gpus=6), task("small")]
    assert placed(run(regions, tasks)) == {"small[0]": "b"}


def test_choice__every_assignment_says_why_and_names_the_runner_up() -> None:
    decisions = run([region("a", 4, speed=2.0), region("b", 4)], [task("j")])
    reason = decisions.assigns[0].reason
    assert reason.startswith("a: est. finish in 30.0 min")
    assert "next best b" in reason


# Reservation and backfill.


def _full_region_with_head() -> tuple[list[RegionInfo], list[TaskInfo]]:
    # 4 GPUs: 3 held until +1 h (estimates from started_ms), 1 free; the head needs 4.
    regions = [region("a", 4)]
    tasks = [
        running("r", "a", gpus=3, started_ms=NOW_MS, estimate_ms=HOUR_MS),
        task("head", gpus=4, submitted_ms=0),
    ]
    return regions, tasks


def test_reservation__the_head_reserves_where_it_fits_soonest() -> None:
    regions, tasks = _full_region_with_head()
    decisions = run(regions, tasks)
    assert "reserved a" in decisions.waiting[("head", 0)]


def test_backfill__a_short_task_runs_before_the_reservation() -> None:
    regions, tasks = _full_region_with_head()
    decisions = run(regions, [*tasks, task("short", submitted_ms=1, estimate_ms=30 * MINUTE_MS)])
    assert placed(decisions) == {"short[0]": "a"}


def test_backfill__a_long_task_that_would_delay_the_head_waits() -> None:
    regions, tasks = _full_region_with_head()
    decisions = run(regions, [*tasks, task("long", submitted_ms=1, estimate_ms=2 * HOUR_MS)])
    assert placed(decisions) == {}
    assert "would delay head[0]" in decisions.waiting[("long", 0)]


def test_backfill__a_long_task_that_leaves_the_heads_devices_free_runs() -> None:
    regions = [region("a", 8)]
    tasks = [
        running("r", "a", gpus=6, started_ms=NOW_MS, estimate_ms=HOUR_MS),
        task("head", gpus=6, submitted_ms=0),
        task("long", submitted_ms=1, estimate_ms=10 * HOUR_MS),
    ]
    # When r ends, 8 - 1 (long) = 7 >= 6: the head is not delayed.
    assert placed(run(regions, tasks)) == {"long[0]": "a"}


# Preemption.


def _preemption_case(**fields: Any) -> tuple[list[RegionInfo], list[TaskInfo]]:
    regions = [region("a", 2)]
    tasks = [
        running("low1", "a", token=11, started_ms=0, checkpointed_ms=NOW_MS - 10 * MINUTE_MS),
        running("low2", "a", token=12, started_ms=0, checkpointed_ms=NOW_MS - 50 * MINUTE_MS),
        task("high", priority=1, **fields),
    ]
    return regions, tasks


def test_preemption__the_task_losing_least_work_makes_way() -> None:
    regions, tasks = _preemption_case()
    decisions = run(regions, tasks)
    assert [(item.job_id, item.token) for item in decisions.preempts] == [("low1", 11)]
    assert "preempting 1 lower-priority task(s) in a" in decisions.waiting[("high", 0)]


def test_preemption__never_equal_or_higher_priority() -> None:
    regions, tasks = _preemption_case()
    tasks[-1] = replace(tasks[-1], priority=0)
    assert run(regions, tasks).preempts == []


def test_preemption__only_after_the_minimum_run_time() -> None:
    regions = [region("a", 1)]
    tasks = [running("fresh", "a", started_ms=NOW_MS - 60_000), task("high", priority=1)]
    assert run(regions, tasks).preempts == []


def test_preemption__at_most_preemptions_max_per_pass() -> None:
    regions = [region("a", 8)]
    tasks = [running(f"low{n}", "a", token=n + 1) for n in range(8)]
    tasks.append(task("big", gpus=8, priority=1))
    assert run(regions, tasks).preempts == []  # needs 8 victims, the budget is 4
    settings = SchedulerSettings(preemptions_max=8)
    assert len(run(regions, tasks, settings=settings).preempts) == 8


def test_preemption__the_freed_devices_are_held_for_the_preemptor() -> None:
    regions, tasks = _preemption_case()
    # A lower-priority task later in the pass must not take what the preemption freed.
    decisions = run(regions, [*tasks, task("other", submitted_ms=99)])
    assert placed(decisions) == {}


def test_preemption__only_tasks_whose_release_helps_are_preempted() -> None:
    regions = [region("a", 1, slots=1)]
    tasks = [
        # A CPU-slot task that checkpointed a minute ago sorts first (least lost work).
        running("cpu", "a", gpus=0, token=1, checkpointed_ms=NOW_MS - MINUTE_MS),
        running("gpu", "a", gpus=1, token=2, checkpointed_ms=NOW_MS - 20 * MINUTE_MS),
        task("high", gpus=1, priority=1),
    ]
    assert [item.job_id for item in run(regions, tasks).preempts] == ["gpu"]


def test_preemption__lost_work_counts_from_this_attempts_start() -> None:
    regions = [region("a", 2)]
    tasks = [
        # Restarted an hour ago from a checkpoint written 9 hours ago: loses 1 hour.
        running("restarted", "a", token=1, started_ms=NOW_MS - HOUR_MS, checkpointed_ms=HOUR_MS),
        # Running for 10 hours, checkpointed 2 hours ago: loses 2 hours.
        running("steady", "a", token=2, started_ms=0, checkpointed_ms=NOW_MS - 2 * HOUR_MS),
        task("high", priority=1),
    ]
    assert [item.job_id for item in run(regions, tasks).preempts] == ["restarted"]


def test_preemption__in_a_mixed_region_the_victim_frees_the_right_model() -> None:
    mixed = RegionInfo(
        name="a",
        gpus=(GpuInfo(model="A100", memory_mb=81_920),) * 2
        + (GpuInfo(model="V100", memory_mb=32_768),) * 2,
    )
    tasks = [
        running(
            "a100-low", "a", gpus=2, gpu_model="A100", token=1, checkpointed_ms=NOW_MS - HOUR_MS
        ),
        running(
            "v100-low", "a", gpus=2, gpu_model="V100", token=2, checkpointed_ms=NOW_MS - MINUTE_MS
        ),
        task("high", gpus=2, gpu_model="A100", priority=1),
    ]
    assert [item.job_id for item in run([mixed], tasks).preempts] == ["a100-low"]


# Moving up.


def _move_up_case(
    estimate_ms: int, *, fast_speed: float = 2.0
) -> tuple[list[RegionInfo], list[TaskInfo]]:
    """`long` has run an hour in slow region a; fast region b has a free GPU."""
    regions = [region("a", 1), region("b", 1, speed=fast_speed)]
    tasks = [running("long", "a", token=7, started_ms=NOW_MS - HOUR_MS, estimate_ms=estimate_ms)]
    return regions, tasks


def test_move_up__a_long_task_moves_to_a_faster_region_with_free_room() -> None:
    regions, tasks = _move_up_case(10 * HOUR_MS)
    decisions = run(regions, tasks)
    # 9 hours left in a, 4.5 in b: asked to yield (not ended), with the room in b named.
    [move] = decisions.preempts
    assert (move.job_id, move.token, move.region, move.moving_to) == ("long", 7, "a", "b")
    assert not move.force
    assert "moving to faster region b" in move.reason
    assert run(regions, tasks, settings=SchedulerSettings(move_ups_max=0)).preempts == []


def test_move_up__only_when_the_saving_passes_both_thresholds() -> None:
    moves = [
        run(*_move_up_case(estimate_ms, fast_speed=speed)).preempts
        for estimate_ms, speed in (
            (10 * HOUR_MS, 2.0),  # saves 4.5 h of 9 (50%): moves
            (2 * HOUR_MS, 2.0),  # saves 30 min of 1 h: under `move_up_saving_min_ms`
            (10 * HOUR_MS, 1.2),  # saves 1.5 h of 9 (17%): under `move_up_saving_fraction`
        )
    ]
    assert [len(item) for item in moves] == [1, 0, 0]


def test_move_up__only_after_the_minimum_run_time_and_never_to_a_slower_region() -> None:
    regions, tasks = _move_up_case(10 * HOUR_MS)
    assert len(run(regions, tasks).preempts) == 1
    fresh = [replace(tasks[0], started_ms=NOW_MS - 5 * MINUTE_MS)]
    assert run(regions, fresh).preempts == []
    # From the fast region, a free GPU in the slow one is no move.
    assert run(regions, [replace(tasks[0], region="b")]).preempts == []


def test_move_up__pending_tasks_come_first() -> None:
    regions, tasks = _move_up_case(10 * HOUR_MS)
    # A pending task takes b's one GPU in the pass: nothing is left to move into.
    decisions = run(regions, [*tasks, task("waiting")])
    assert placed(decisions) == {"waiting[0]": "b"} and decisions.preempts == []
    # With two, long moves into the one the pending task left.
    regions[1] = region("b", 2, speed=2.0)
    decisions = run(regions, [*tasks, task("waiting")])
    assert placed(decisions) == {"waiting[0]": "b"}
    assert [item.moving_to for item in decisions.preempts] == ["b"]


def test_move_up__the_room_is_held_until_the_mover_is_placed_there() -> None:
    regions, tasks = _move_up_case(10 * HOUR_MS)
    [move] = run(regions, tasks).preempts
    assert move.moving_to == "b"
    # The next pass, while `long` checkpoints: a new task, even of higher priority, does not
    # take b.
    yielding = replace(tasks[0], preempt_requested_ms=NOW_MS, moving_to="b")
    newcomer = task("newcomer", priority=1, submitted_ms=NOW_MS)
    decisions = run(regions, [yielding, newcomer])
    assert placed(decisions) == {} and decisions.preempts == []
    # It yielded: it is placed in b before the newcomer, which now fits a.
    moved = replace(
        yielding,
        state="pending",
        region=None,
        token=None,
        started_ms=None,
        preempt_requested_ms=None,
        checkpoint_region="a",
        checkpoint_size_mb=2_000,
    )
    decisions = run(regions, [newcomer, moved])
    assert placed(decisions) == {"long[0]": "b", "newcomer[0]": "a"}
    assert "moved (up or aside)" in decisions.assigns[0].reason
    # Without the hold, the newcomer (first in order) would have taken b.
    unheld = replace(moved, moving_to=None)
    assert placed(run(regions, [newcomer, unheld]))["newcomer[0]"] == "b"


def test_move_up__at_most_move_ups_max_tasks_moving_at_once() -> None:
    regions = [region("a", 8), region("b", 8, speed=2.0)]
    tasks = [
        running(f"long{n}", "a", token=n + 1, started_ms=NOW_MS - HOUR_MS, estimate_ms=10 * HOUR_MS)
        for n in range(6)
    ]
    assert len(run(regions, tasks).preempts) == 4
    # Two already moving: two more.
    tasks[0] = replace(tasks[0], preempt_requested_ms=NOW_MS, moving_to="b")
    tasks[1] = replace(tasks[1], preempt_requested_ms=NOW_MS, moving_to="b")
    decisions = run(regions, tasks)
    assert len(decisions.preempts) == 2
    assert {item.job_id for item in decisions.preempts}.isdisjoint({"long0", "long1"})


def test_move_up__tasks_of_one_speed_and_size_tie_and_only_the_movers_are_weighed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 alike tasks in slow a, with different rests (rounded to whole milliseconds when
    weighed, which used to make their keys differ by a few parts in 10^8), and room in fast b:
    the first four in task order move, and only they are weighed (the pass stays cheap with
    many running tasks)."""
    regions = [region("a", 200), region("b", 8, speed=2.0)]
    tasks = [
        running(
            f"t{n:03d}",
            "a",
            token=n + 1,
            started_ms=NOW_MS - HOUR_MS - n * 7_777,
            estimate_ms=10 * HOUR_MS + n * 3_333,
        )
        for n in range(200)
    ]
    weighed: list[str] = []
    weigh = scheduler_module._Pass._move

    def counted(self: Any, task: TaskInfo, *rest: Any) -> Any:
        weighed.append(task.job_id)
        return weigh(self, task, *rest)

    monkeypatch.setattr(scheduler_module._Pass, "_move", counted)
    moves = run(regions, tasks).preempts
    assert [item.job_id for item in moves] == ["t000", "t001", "t002", "t003"]
    assert weighed == ["t000", "t001", "t002", "t003"]


def test_move_up__the_most_time_saved_per_device_hour_first() -> None:
    """Fast region b has 4 free GPUs and one move may start. A 4-GPU task saves more hours
    (20 h left in a, 10 in b) than a 1-GPU one (12 h left, 6 in b), but for 40 device-hours of b:
    0.25 h saved per device-hour, against 1 h for the 1-GPU task."""
    regions = [region("a", 5), region("b", 4, speed=2.0)]
    tasks = [
        running(
            "wide", "a", gpus=4, token=1, started_ms=NOW_MS - HOUR_MS, estimate_ms=21 * HOUR_MS
        ),
        running("narrow", "a", token=2, started_ms=NOW_MS - HOUR_MS, estimate_ms=13 * HOUR_MS),
    ]
    one = SchedulerSettings(move_ups_max=1)
    assert [item.job_id for item in run(regions, tasks, settings=one).preempts] == ["narrow"]
    # With room and budget for both, both move.
    roomy = [region("a", 5), region("b", 5, speed=2.0)]
    both = run(roomy, tasks, settings=SchedulerSettings(move_ups_max=2)).preempts
    assert sorted(item.job_id for item in both) == ["narrow", "wide"]


# Moving aside.


def _aside_case(
    *, speed: float = 1.0, started_ms: int = NOW_MS - HOUR_MS, **flexible: Any
) -> tuple[list[RegionInfo], list[TaskInfo]]:
    """Region eu is full with a task that may run elsewhere; us, as fast unless `speed` says
    otherwise, has a free GPU; a task that may run only in eu waits."""
    regions = [region("eu", 1), region("us", 1, speed=speed)]
    flexible.setdefault("estimate_ms", 10 * HOUR_MS)
    tasks = [
        running("flexible", "eu", token=3, started_ms=started_ms, **flexible),
        task("resident", regions_allow=("eu",), submitted_ms=NOW_MS - MINUTE_MS),
    ]
    return regions, tasks


def test_move_aside__a_task_that_may_run_elsewhere_makes_way_for_one_that_may_not() -> None:
    regions, tasks = _aside_case()
    decisions = run(regions, tasks)
    [move] = decisions.preempts
    assert (move.job_id, move.token, move.region, move.moving_to) == ("flexible", 3, "eu", "us")
    assert not move.force
    assert move.reason.startswith("moving aside to us") and "resident[0]" in move.reason
    assert "moving out of eu" in decisions.waiting[("resident", 0)]
    assert placed(decisions) == {}
    # Off, or no budget for moves: it waits.
    for settings in (SchedulerSettings(move_aside=False), SchedulerSettings(move_ups_max=0)):
        assert run(regions, tasks, settings=settings).preempts == []


def test_move_aside__never_to_a_faster_region_nor_a_task_that_may_not_move() -> None:
    # 20 minutes left in eu: 25 in us at speed 0.8 loses 5 (within the limit, less than the
    # resident's wait of 20), so it moves; at speed 1.2 it would gain, but a faster region's
    # room is for moving up, and this saving is too small for that.
    ending = dict(started_ms=NOW_MS - 40 * MINUTE_MS, estimate_ms=HOUR_MS)
    assert [move.moving_to for move in run(*_aside_case(speed=0.8, **ending)).preempts] == ["us"]
    assert run(*_aside_case(speed=1.2, **ending)).preempts == []
    # At speed 0.5 it would lose 20 minutes, over the limit.
    assert run(*_aside_case(speed=0.5, **ending)).preempts == []
    # A task that may run only in eu itself stays.
    assert run(*_aside_case(regions_allow=("eu",))).preempts == []
    # Nor one that has not run `move_up_min_run_ms` in its attempt.
    assert run(*_aside_case(started_ms=NOW_MS - 5 * MINUTE_MS)).preempts == []


def test_move_aside__only_when_moving_costs_the_mover_little() -> None:
    # Its 200 GB checkpoint takes about 21 minutes to us (one TCP window per 100 ms round trip).
    regions, tasks = _aside_case(checkpoint_size_mb=200_000)
    assert run(regions, tasks).preempts == []
    loose = SchedulerSettings(move_aside_loss_max_ms=30 * MINUTE_MS)
    [move] = run(regions, tasks, settings=loose).preempts
    assert move.moving_to == "us"
    # A lower price there does not buy the time back: eu at $1 per GPU-hour for the 9 hours
    # left is worth 90 minutes, us is free, and still it does not move.
    regions[0] = replace(regions[0], price_per_gpu_hour=1.0)
    assert run(regions, tasks).preempts == []
    # Nor when the other region costs more than the limit at its tenant's weights: us at $10
    # more per GPU-hour, for the 9 hours left, is 15 hours at 600 s per dollar.
    regions, tasks = _aside_case()
    regions[1] = replace(regions[1], price_per_gpu_hour=10.0)
    assert run(regions, tasks).preempts == []


def test_move_aside__only_when_the_waiting_task_would_wait_longer_than_the_mover_loses() -> None:
    # A 50 GB checkpoint: about 5 minutes to move. The task in eu ends in 3 minutes anyway.
    ending = dict(checkpoint_size_mb=50_000, estimate_ms=HOUR_MS)
    regions, tasks = _aside_case(started_ms=NOW_MS - 57 * MINUTE_MS, **ending)
    assert run(regions, tasks).preempts == []
    # Ending in 30 minutes, it moves.
    regions, tasks = _aside_case(started_ms=NOW_MS - 30 * MINUTE_MS, **ending)
    assert [move.moving_to for move in run(regions, tasks).preempts] == ["us"]


def test_move_aside__comes_before_moving_up_and_shares_its_budget() -> None:
    regions, tasks = _aside_case()
    # A long task in ap could move up to fast, which is faster than eu, so no mover aside goes
    # there.
    regions += [region("ap", 1), region("fast", 1, speed=2.0)]
    slow = running("slow", "ap", token=4, started_ms=NOW_MS - HOUR_MS, estimate_ms=10 * HOUR_MS)
    moves = {item.job_id: item.moving_to for item in run(regions, [*tasks, slow]).preempts}
    assert moves == {"flexible": "us", "slow": "fast"}
    one = SchedulerSettings(move_ups_max=1)
    moves = {
        item.job_id: item.moving_to for item in run(regions, [*tasks, slow], settings=one).preempts
    }
    assert moves == {"flexible": "us"}


def test_move_aside__the_region_is_held_until_the_movers_have_left() -> None:
    regions, tasks = _aside_case()
    regions[0] = region("eu", 2)
    flexible, resident = tasks
    resident = replace(resident, gpus=2)
    [move] = run(regions, [flexible, resident]).preempts
    assert move.moving_to == "us"
    # The next pass, while it checkpoints: a later task that fits eu's free GPU (us is held for
    # the mover) waits, and so does the resident, for the mover.
    yielding = replace(flexible, preempt_requested_ms=NOW_MS, moving_to="us")
    later = task("later", submitted_ms=NOW_MS)
    decisions = run(regions, [yielding, resident, later])
    assert placed(decisions) == {} and decisions.preempts == []
    assert "moving task(s) in eu" in decisions.waiting[("resident", 0)]
    # Without moving aside, the later task takes eu's free GPU.
    off = SchedulerSettings(move_aside=False)
    assert placed(run(regions, [yielding, resident, later], settings=off)) == {"later[0]": "eu"}
    # It yielded: it goes to us, and the resident to eu.
    moved = replace(
        yielding,
        state="pending",
        region=None,
        token=None,
        started_ms=None,
        preempt_requested_ms=None,
        checkpoint_region="eu",
    )
    decisions = run(regions, [moved, resident, later])
    assert placed(decisions) == {"flexible[0]": "us", "resident[0]": "eu"}


# Scoring.


def _full_sort(
    schedule_pass: Any, item: TaskInfo, fitting: list[Any], tenant: TenantInfo
) -> list[str]:
    """The regions of `fitting`, every one scored, sorted by (score, region name)."""
    every = sorted(
        (
            scheduler_module._score(
                item, room, schedule_pass.regions, tenant, schedule_pass.settings
            )
            for room in fitting
        ),
        key=lambda option: (option.score, option.room.region.name),
    )
    return [option.room.region.name for option in every]


def _pass_over(cluster: Cluster) -> tuple[Any, list[Any], list[TaskInfo]]:
    """A pass over `cluster` with the default settings, its rooms and the pending tasks."""
    schedule_pass = scheduler_module._Pass(cluster, SchedulerSettings())
    pending = [item for item in cluster.tasks if item.state == "pending"]
    return schedule_pass, list(schedule_pass.rooms.values()), pending


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_options_come_in_the_order_of_a_full_sort(seed: int) -> None:
    """`_Pass._options` scores a room only once its lower bound could come first; the order
    must be that of scoring every room and sorting by (score, region name), preferred regions
    and regions holding the task's data included."""
    cluster = scale_cluster(seed, tasks=300, regions=20)
    names = [region.name for region in cluster.regions]
    tasks = [
        replace(item, regions_prefer=(names[number % 20],)) if number % 3 == 0 else item
        for number, item in enumerate(cluster.tasks)
    ]
    schedule_pass, rooms, pending = _pass_over(replace(cluster, tasks=tuple(tasks)))
    for item in pending:
        fitting = [room for room in rooms if room.fits(item)]
        tenant = schedule_pass.share.tenant(item.tenant)
        lazy = list(schedule_pass._options(item, fitting, tenant))
        assert [option.room.region.name for option in lazy] == _full_sort(
            schedule_pass, item, fitting, tenant
        )


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_lazy_options_come_in_the_order_of_a_full_sort_and_find_every_fitting_room(
    seed: int,
) -> None:
    """`_Pass._lazy_options` checks and scores rooms in the order of their bound per
    millisecond of estimate, cached per pass; what it yields must be what scoring every room
    that fits and sorting by (score, region name) gives, for tasks of several shapes, allow
    and deny lists and price and carbon weights, and once exhausted it must have found every
    room that fits."""
    cluster = scale_cluster(seed, tasks=300, regions=20)
    names = [region.name for region in cluster.regions]
    tasks = []
    for number, item in enumerate(cluster.tasks):
        if number % 4 == 1:
            item = replace(item, regions_deny=(names[number % 20], names[(number * 7) % 20]))
        if number % 5 == 2:
            item = replace(item, cost_weight=float(number % 3), carbon_weight=3.0)
        if number % 7 == 3:
            item = replace(item, estimate_ms=number * 977)
        tasks.append(item)
    schedule_pass, rooms, pending = _pass_over(replace(cluster, tasks=tuple(tasks)))
    for item in pending:
        allowed = [room for room in rooms if item.allows(room.region.name)]
        fitting = [room for room in allowed if room.fits(item)]
        tenant = schedule_pass.prefs(item)
        found: list[Any] = []
        lazy = list(schedule_pass._lazy_options(item, allowed, tenant, found))
        assert [option.room.region.name for option in lazy] == _full_sort(
            schedule_pass, item, fitting, tenant
        )
        assert sorted(room.region.name for room in found) == sorted(
            room.region.name for room in fitting
        )


# Reasons.


def test_every_waiting_task_has_a_reason() -> None:
    regions = [region("a", 2), region("b", 1, healthy=False)]
    tasks = [
        task("fits"),
        task("fits2", submitted_ms=1),
        task("no-room", submitted_ms=2),
        task("never", gpus=16, submitted_ms=3),
        task("nowhere", regions_allow=("b",), submitted_ms=4),
    ]
    decisions = run(regions, tasks)
    assert set(placed(decisions)) == {"fits[0]", "fits2[0]"}
    assert set(decisions.waiting) == {("no-room", 0), ("never", 0), ("nowhere", 0)}
    assert "no healthy region that the job allows" in decisions.waiting[("nowhere", 0)]
    assert all(decisions.waiting.values())


def test_a_task_whose_region_lists_leave_no_region_of_the_cluster__says_so() -> None:
    """It was told "no healthy region that the job allows", as for a region that is down, so a
    job that can never run (a misspelt region) looked like one waiting for a repair."""
    regions = [region("a", 2), region("b", 1, healthy=False)]
    tasks = [
        task("mars", regions_allow=("mars",)),
        task("denied", regions_deny=("a", "b"), submitted_ms=1),
        task("down", regions_allow=("b", "mars"), submitted_ms=2),
    ]
    waiting = run(regions, tasks).waiting
    assert waiting[("mars", 0)] == (
        "its regions_allow (mars) leaves no region of the cluster (regions: a, b)"
    )
    assert waiting[("denied", 0)] == "its regions_deny names every region of the cluster"
    assert waiting[("down", 0)] == "no healthy region that the job allows"


def test_the_pass_is_deterministic_and_bounded_by_decisions_max() -> None:
    regions = [region(f"r{n}", 8, speed=1 + n / 10) for n in range(5)]
    tasks = [task(f"j{n:03d}", submitted_ms=n) for n in range(60)]
    settings = SchedulerSettings(decisions_max=10)
    first = run(regions, tasks, settings=settings)
    assert len(first.assigns) == 10
    assert first == run(regions, tasks, settings=settings)


def test_transfer_time_grows_with_size_and_round_trip() -> None:
    regions = {"a": region("a", rtt_ms={"b": 10.0, "c": 250.0}), "b": region("b"), "c": region("c")}
    settings = SchedulerSettings()
    near = transfer_ms(10_000, "a", "b", regions, settings)
    far = transfer_ms(10_000, "a", "c", regions, settings)
    assert 0 < near < far
    assert transfer_ms(10_000, "a", "a", regions, settings) == 0.0
    # One TCP window per round trip: 16 MiB per 250 ms is 512 Mbit/s, so 10 GB take ~164 s.
    assert 160_000 < far < 170_000


# Scenarios in the simulator: one per feature, a few jobs each.


def _job(job_id: str, **fields: object) -> TraceJob:
    values: dict[str, object] = {
        "job_id": job_id,
        "tenant": "t",
        "entrypoint": job_id,
        "submitted_ms": 0,
        "priority": 0,
        "gpus": 1,
        "gpu_memory_mb": 0,
        "regions_allow": (),
        "input_size_mb": 0,
        "input_region": "a",
        "checkpoint_size_mb": 0,
        "work_ms": (HOUR_MS,),
    }
    values.update(fields)
    return TraceJob(**values)  # type: ignore[arg-type]


def _trace(
    regions: list[RegionInfo],
    jobs: list[TraceJob],
    *,
    outages: tuple[Outage, ...] = (),
    tenants: dict[str, TenantInfo] | None = None,
) -> Trace:
    return Trace(
        seed=0,
        regions=tuple(regions),
        tenants=tenants or {},
        jobs=tuple(jobs),
        outages=outages,
        hours=24.0,
        load=1.0,
    )


def _simulate(trace: Trace) -> dict[str, int]:
    result = simulate(trace, schedule, name="xr", settings=SimSettings())
    assert result.violations == []
    assert result.unfinished == []
    return result.completion_ms


def _displacement_trace() -> Trace:
    return _trace(
        [region("a", 1)],
        [
            _job("batch", work_ms=(10 * HOUR_MS,)),
            _job("prod", priority=1, submitted_ms=3 * HOUR_MS + 10 * MINUTE_MS),
        ],
    )


def test_scenario__preemption__production_work_displaces_a_batch_job_that_yields() -> None:
    result = simulate(_displacement_trace(), schedule, name="xr")
    assert result.preemptions == 1 and result.violations == []
    # batch is asked to yield, checkpoints and stops 30 s later (the simulator's `yield_ms`),
    # losing nothing; prod starts then, and batch resumes after it.
    assert result.completion_ms["prod"] == HOUR_MS + 30_000
    assert result.completion_ms["batch"] == 11 * HOUR_MS
    assert result.lost_work_gpu_ms == 0


def test_scenario__preemption__a_victim_that_does_not_yield_is_ended_after_the_grace() -> None:
    trace = _displacement_trace()
    result = simulate(trace, schedule, name="xr", settings=SimSettings(yield_ms=None))
    grace_ms = SchedulerSettings().preemption_grace_ms
    # Ended at once after the grace: the 10 minutes since its last checkpoint (every 30 minutes)
    # plus the grace are lost.
    assert result.lost_work_gpu_ms == 10 * MINUTE_MS + grace_ms
    assert HOUR_MS + grace_ms <= result.completion_ms["prod"] <= HOUR_MS + grace_ms + MINUTE_MS
    assert result.completion_ms["batch"] >= 11 * HOUR_MS + 10 * MINUTE_MS + grace_ms


def test_scenario__backfill__short_jobs_run_in_the_gap_before_a_large_one() -> None:
    jobs = [
        _job("first", gpus=2, work_ms=(2 * HOUR_MS,)),
        # A first run of the short kind teaches its estimate (10 min + 2 x 5 min deviation).
        _job("probe", entrypoint="small", work_ms=(10 * MINUTE_MS,)),
        _job("wide", gpus=4, submitted_ms=15 * MINUTE_MS),
        *[
            _job(
                f"small{n}",
                entrypoint="small",
                submitted_ms=16 * MINUTE_MS + n,
                work_ms=(10 * MINUTE_MS,),
            )
            for n in range(3)
        ],
    ]
    trace = _trace([region("a", 4)], jobs)
    completion = _simulate(trace)
    # `wide` reserves the region for when `first` is expected to end (the default estimate of
    # an hour); the small jobs finish before that, so they run in the gap.
    assert all(completion[f"small{n}"] <= 30 * MINUTE_MS for n in range(3))
    assert completion["wide"] == 3 * HOUR_MS - 15 * MINUTE_MS
    # FIFO first-fit holds them behind `wide` (head-of-line blocking).
    fifo = simulate(trace, fifo_first_fit, name="fifo").completion_ms
    assert all(fifo[f"small{n}"] > 2 * HOUR_MS for n in range(3))


def test_scenario__gang__a_wide_job_waits_for_one_region_with_all_its_gpus() -> None:
    trace = _trace(
        [region("a", 4), region("b", 8)],
        [
            _job("holder", gpus=4, work_ms=(HOUR_MS,)),
            _job("wide", gpus=8, submitted_ms=1, work_ms=(HOUR_MS,)),
            _job("wide2", gpus=8, submitted_ms=2, work_ms=(HOUR_MS,)),
        ],
    )
    result = simulate(trace, schedule, name="xr")
    assert result.violations == [] and result.unfinished == []
    # holder takes a (best fit), wide takes b at once; wide2 waits for b, never split.
    assert result.last_region == {"holder": "a", "wide": "b", "wide2": "b"}
    assert result.completion_ms["wide"] == HOUR_MS
    assert result.completion_ms["wide2"] == pytest.approx(2 * HOUR_MS, abs=1_000)


def test_scenario__fairness__a_light_tenant_is_not_stuck_behind_a_heavy_one() -> None:
    heavy = [_job(f"h{n}", tenant="heavy", submitted_ms=n) for n in range(12)]
    light = [_job(f"l{n}", tenant="light", submitted_ms=100 + n) for n in range(2)]
    trace = _trace([region("a", 2)], heavy + light)
    completion = _simulate(trace)
    # At each completion the tenants take turns by share: light runs in the second and third
    # hours; FIFO first-fit runs it after all six hours of heavy work.
    assert max(completion["l0"], completion["l1"]) <= 3 * HOUR_MS
    fifo = simulate(trace, fifo_first_fit, name="fifo").completion_ms
    assert min(fifo["l0"], fifo["l1"]) >= 6 * HOUR_MS


def test_scenario__data_locality__jobs_run_where_their_data_lives() -> None:
    rtt = {"a": 250.0, "b": 250.0}
    regions = [
        region("a", 2, rtt_ms={"b": 250.0, "c": 250.0}),
        region("b", 2, rtt_ms={"c": 250.0}),
        region("c", 2, rtt_ms=rtt),
    ]
    jobs = [
        _job(f"{home}{n}", input_region=home, input_size_mb=100_000, submitted_ms=n)
        for home in ("a", "b", "c")
        for n in range(2)
    ]
    result = simulate(_trace(regions, jobs), schedule, name="xr")
    assert result.last_region == {job.job_id: job.input_region for job in jobs}
    assert all(value == HOUR_MS for value in result.completion_ms.values())


def test_scenario__failure_of_a_region__its_tasks_resume_elsewhere_from_checkpoints() -> None:
    trace = _trace(
        [region("a", 2, speed=2.0), region("b", 2)],
        [_job(f"j{n}", work_ms=(4 * HOUR_MS,), checkpoint_size_mb=1_000) for n in range(2)],
        outages=(Outage(region="a", start_ms=HOUR_MS + 10 * MINUTE_MS, end_ms=10 * HOUR_MS),),
    )
    result = simulate(trace, schedule, name="xr")
    assert result.violations == [] and result.unfinished == []
    # In a at speed 2 until it fails: 1 h of checkpoints (2 h of work) kept, 10 min lost; the
    # other 2 h of work run in b at speed 1, after moving the checkpoint.
    assert set(result.last_region.values()) == {"b"}
    for completion_ms in result.completion_ms.values():
        assert 3 * HOUR_MS + 10 * MINUTE_MS <= completion_ms <= 3 * HOUR_MS + 12 * MINUTE_MS
    assert result.lost_work_gpu_ms == pytest.approx(2 * 2 * 10 * MINUTE_MS)


def test_scenario__move_aside__a_job_that_may_run_only_in_one_region_gets_room_there() -> None:
    trace = _trace(
        [region("eu", 1), region("us", 1)],
        [
            _job("flexible", work_ms=(20 * HOUR_MS,)),  # eu (first by name)
            _job("short", submitted_ms=1, work_ms=(HOUR_MS,)),  # us, done after an hour
            # Data residency: eu only. Waits until us frees and flexible moves there.
            _job("resident", submitted_ms=10 * MINUTE_MS, regions_allow=("eu",)),
        ],
    )
    # Estimates of 20 hours (no run has completed yet to teach them).
    settings = SimSettings(policy=SchedulerSettings(default_estimate_ms=20 * HOUR_MS))
    result = simulate(trace, schedule, name="xr", settings=settings)
    assert result.violations == [] and result.unfinished == []
    assert result.moves == 1 and result.lost_work_gpu_ms == 0
    assert result.last_region == {"flexible": "us", "short": "us", "resident": "eu"}
    # flexible yields 30 s after short ends; resident runs its hour in eu then.
    assert result.completion_ms["resident"] == pytest.approx(
        2 * HOUR_MS + 30_000 - 10 * MINUTE_MS, abs=MINUTE_MS
    )
    # Moving cost flexible nothing but the yield (no data to move, same speed).
    assert result.completion_ms["flexible"] == pytest.approx(20 * HOUR_MS + 30_000, abs=MINUTE_MS)
    # Without moving aside, resident waits for flexible's 20 hours.
    off = SchedulerSettings(default_estimate_ms=20 * HOUR_MS, move_aside=False)
    stayed = simulate(trace, schedule, name="xr", settings=SimSettings(policy=off))
    assert stayed.moves == 0 and stayed.completion_ms["resident"] >= 20 * HOUR_MS


def test_scenario__move_up__a_long_job_moves_to_the_faster_region_when_it_frees() -> None:
    trace = _trace(
        [region("a", 1), region("b", 1, speed=2.0)],
        [
            _job("short", work_ms=(HOUR_MS,)),  # b, done after 30 min
            _job("long", submitted_ms=1, work_ms=(20 * HOUR_MS,)),  # a: b is taken
            # Arrives while long checkpoints to move: must not take the room held for it.
            _job("newcomer", submitted_ms=30 * MINUTE_MS + 10_000, work_ms=(HOUR_MS,)),
        ],
    )
    # Estimates of 20 hours (no run has completed yet to teach them).
    settings = SimSettings(policy=SchedulerSettings(default_estimate_ms=20 * HOUR_MS))
    result = simulate(trace, schedule, name="xr", settings=settings)
    assert result.violations == [] and result.unfinished == []
    assert result.moves == 1 and result.lost_work_gpu_ms == 0
    # long runs 30 min in a, yields 30 s later, and does the other 19.5 h of work in b.
    assert result.last_region == {"short": "b", "long": "b", "newcomer": "a"}
    assert result.completion_ms["long"] == pytest.approx(
        30 * MINUTE_MS + 30_000 + 9.75 * HOUR_MS, abs=MINUTE_MS
    )
    # Staying in a: 20 hours.
    still = SimSettings(policy=SchedulerSettings(default_estimate_ms=20 * HOUR_MS, move_ups_max=0))
    stayed = simulate(trace, schedule, name="xr", settings=still)
    assert stayed.last_region["long"] == "a" and stayed.completion_ms["long"] >= 20 * HOUR_MS
