"""The policy's accounting and its words, from a QA pass against a live cluster (session 31).

Accounting: a task for which room is made counts toward its tenant's quota and share as a placed
task does; a task is charged for what it holds where it runs (a CPU slot in CPU mode); a region
without GPUs takes no GPU task while the cluster has GPUs. Words: every waiting task gets its
reason however long the queues with unchanged reasons are; "never fits" names the model and the
memory asked; an assignment says what decided against the next best; a reservation's time does not
move with the clock.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.xrcore.helpers import Driver
from tests.xrcore.test_scheduler import NOW_MS, placed, region, run, running, task
from xrcore.commands import JobSpec, JobSubmit, RegionHeartbeat, RegionRegister
from xrcore.placement import place
from xrcore.scheduler import RegionInfo, SchedulerSettings, TaskInfo, TenantInfo

MINUTE_MS = 60_000


# A tenant's quota while its tasks make room.


def _full_cluster(**quota: int) -> tuple[list[RegionInfo], list[TaskInfo], dict[str, TenantInfo]]:
    """Five GPUs in three regions, all held by tenant a; tenant c submits an urgent array of 3."""
    regions = [region("r1", 2), region("r2", 2), region("r3", 1)]
    holders = [("r1", 2), ("r2", 2), ("r3", 1)]
    tasks = [
        running(f"a{where}-{n}", where, tenant="a", token=10 * len(where) + n, started_ms=0)
        for where, count in holders
        for n in range(count)
    ]
    tasks += [task("c", n, tenant="c", priority=100) for n in range(3)]
    return regions, tasks, {"c": TenantInfo(name="c", **quota)}


@pytest.mark.parametrize("quota", [{"tasks_max": 1}, {"gpus_max": 1}])
def test_quota__a_task_that_preempts_counts_so_its_siblings_preempt_no_one(
    quota: dict[str, int],
) -> None:
    """Three victims lost their work for one task tenant c's quota would let run."""
    regions, tasks, tenants = _full_cluster(**quota)
    decisions = run(regions, tasks, tenants)
    assert len(decisions.preempts) == 1
    assert "preempting 1 lower-priority task(s)" in decisions.waiting[("c", 0)]
    for index in (1, 2):
        assert "quota" in decisions.waiting[("c", index)]


def test_quota__room_held_for_a_preemptor_in_a_later_pass_counts_too() -> None:
    regions, tasks, tenants = _full_cluster(tasks_max=1)
    # The pass before asked ar1-0 to yield for c[0]; it has not stopped yet.
    tasks[0] = replace(tasks[0], preempt_requested_ms=NOW_MS - 10_000)
    decisions = run(regions, tasks, tenants)
    assert decisions.preempts == []
    assert "waiting for 1 preempted task(s) in r1" in decisions.waiting[("c", 0)]
    assert decisions.waiting[("c", 1)] == (
        "tenant 'c' has 1 task running, assigned or with room held, and its quota is 1"
    )


def test_quota__no_task_moves_aside_for_a_tenant_that_reached_its_quota_since() -> None:
    # p may run only in eu, which m holds; m could move to us. p's tenant reaches its quota of
    # one task when q, its next task, is placed in us: moving m would make room p cannot take.
    regions = [region("eu", 1), region("us", 2)]
    tasks = [
        running("m", "eu", tenant="other", started_ms=0, estimate_ms=100 * 60 * MINUTE_MS),
        task("p", tenant="x", regions_allow=("eu",), submitted_ms=0),
        task("q", tenant="x", submitted_ms=1),
    ]
    quota = {"x": TenantInfo(name="x", tasks_max=1)}
    decisions = run(regions, tasks, quota)
    assert placed(decisions) == {"q[0]": "us"}
    assert decisions.preempts == []
    # Without the quota m moves aside for p.
    moved = run(regions, tasks)
    assert [item.moving_to for item in moved.preempts] == ["us"]


# CPU mode.


def test_cpu_mode__a_region_without_gpus_takes_no_gpu_task_while_the_cluster_has_gpus() -> None:
    regions = [
        region("cpu-only", slots=2),
        region("gpu", 8, memory_mb=40_960, price=2.0, slots=2),
        region("h100", 1, model="H100", price=4.0),
    ]
    tasks = [
        task("four", gpus=4, gpu_model="A100"),
        task("one", gpus=1, gpu_model="H100", submitted_ms=1),
        task("share", gpus=0, gpu_memory_mb=1_000, submitted_ms=2),
        task("cpu", gpus=0, submitted_ms=3),
    ]
    assert placed(run(regions, tasks)) == {
        "four[0]": "gpu",
        "one[0]": "h100",
        "share[0]": "gpu",
        "cpu[0]": "cpu-only",
    }
    # A GPU task allowed only there waits, and says why.
    decisions = run(regions, [task("pinned", regions_allow=("cpu-only",))])
    assert placed(decisions) == {}
    assert decisions.waiting[("pinned", 0)] == (
        "needs 1 GPU(s) in one region; no allowed healthy region has that many (largest: 0)"
    )
    # Nor while the GPU regions are down: the task waits for GPUs rather than running on a CPU
    # (a node whose CUDA failed) for good.
    down = [region("cpu-only", slots=2), region("gpu", 8, healthy=False)]
    assert placed(run(down, [task("one")])) == {}


def test_cpu_mode__a_cluster_without_gpus_runs_gpu_tasks_in_slots() -> None:
    decisions = run(
        [region("a", slots=2), region("b", slots=1)],
        [task("four", gpus=4), task("share", gpus=0, gpu_memory_mb=1_000, submitted_ms=1)],
    )
    assert set(placed(decisions)) == {"four[0]", "share[0]"}


def test_cpu_mode__a_gpu_task_is_charged_the_slot_it_holds() -> None:
    """One "GPU" in a cluster without any was a 100% dominant share: team-b's first GPU task
    kept it from every later turn (team-a 5 slots, team-b 1)."""
    tasks = [task(f"a{n}", tenant="a", gpus=0, submitted_ms=n) for n in range(6)]
    tasks += [task(f"b{n}", tenant="b", gpus=1, submitted_ms=n) for n in range(6)]
    decisions = run([region("cpu", slots=6)], tasks)
    tenants = [name[0] for name in placed(decisions)]
    assert (tenants.count("a"), tenants.count("b")) == (3, 3)
    # Nor is a GPU quota charged for GPUs it never holds.
    quota = {"b": TenantInfo(name="b", gpus_max=1)}
    decisions = run([region("cpu", slots=6)], tasks[6:9], quota)
    assert len(decisions.assigns) == 3


# Reasons.


def test_reasons__unchanged_reasons_do_not_use_up_the_budget() -> None:
    never = "its regions_allow (mars) leaves no region of the cluster (regions: a)"
    tasks = [task("mars", n, regions_allow=("mars",), priority=5, reason=never) for n in range(5)]
    tasks.append(task("denied", regions_deny=("a",)))
    settings = SchedulerSettings(reasons_max=2)
    waiting = run([region("a", 1)], tasks, settings=settings).waiting
    assert waiting == {("denied", 0): "its regions_deny names every region of the cluster"}


def test_reasons__every_waiting_task_gets_its_reason_behind_another_tenants_long_queue() -> None:
    """team-b's job showed no reason at all behind team-c's 900 tasks that can never run: each
    pass gave the same first 768 of them the budget, and dropped their unchanged reasons."""
    driver = Driver()
    driver.ok(RegionRegister(name="a", http_address="h:1", raft_address="a:1", cpu_slots=2))
    driver.ok(RegionHeartbeat(name="a", gpus=()))
    spec = JobSpec(
        name="j", workload="gemm", tenant="c", priority=5, regions_allow=("mars",), array_size=900
    )
    driver.ok(JobSubmit(spec=spec))
    denied = driver.ok(
        JobSubmit(spec=JobSpec(name="d", workload="gemm", tenant="b", regions_deny=("a",)))
    )["job_id"]
    for _ in range(3):
        decisions = place(driver.machine)
        if decisions is not None:
            driver.ok(decisions)
    assert place(driver.machine) is None
    reasons = [t.reason for job in driver.machine.jobs.values() for t in job.tasks]
    assert all(reasons) and len(reasons) == 901
    assert driver.machine.jobs[denied].tasks[0].reason == (
        "its regions_deny names every region of the cluster"
    )


def test_reasons__never_fits_counts_only_gpus_of_the_model_and_memory_asked() -> None:
    regions = [
        region("a", 8, memory_mb=40_960),
        region("b", 4, model="V100", memory_mb=16_384),
    ]
    tasks = [
        task("big", gpus=2, gpu_memory_mb=80_000),
        task("h100", gpus=1, gpu_model="H100"),
        task("share", gpus=0, gpu_memory_mb=1_000, gpu_model="H100"),
        task("v100s", gpus=6, gpu_model="V100"),
        task("many", gpus=10, gpu_memory_mb=20_000),
    ]
    waiting = run(regions, tasks).waiting
    rest = "no allowed healthy region has that many"
    assert waiting[("big", 0)] == (
        f"needs 2 GPU(s) with 80000 MB or more each in one region; {rest} (largest: 0)"
    )
    assert waiting[("h100", 0)] == f"needs 1 H100 GPU(s) in one region; {rest} (largest: 0)"
    assert waiting[("share", 0)] == (
        "needs 1000 MB on one H100 GPU; no allowed healthy region has one with that much memory"
    )
    assert waiting[("v100s", 0)] == f"needs 6 V100 GPU(s) in one region; {rest} (largest: 4)"
    assert waiting[("many", 0)] == (
        f"needs 10 GPU(s) with 20000 MB or more each in one region; {rest} (largest: 8)"
    )


def test_reasons__an_assignment_says_what_decided_against_the_next_best() -> None:
    """us finishes sooner, but more of its slots are in use: the reason used to show only the
    finish times, which made the choice look wrong."""
    regions = [region("eu", slots=4), region("us", slots=2, speed=3.0)]
    tasks = [running("busy", "us", gpus=0), task("j", gpus=0, estimate_ms=18_000)]
    [assign] = run(regions, tasks).assigns
    assert assign.region == "eu"
    assert assign.reason.endswith(
        "; next best us (est. finish in 0.1 min (run 0.1 min at speed 3, data 0.0 s), $0.00, "
        "0.00 kg CO2; scores +10.5 s: slots in use +22.5 s, finish -12.0 s)"
    )


def test_reasons__small_prices_and_carbon_are_not_rounded_to_zero() -> None:
    regions = [
        region("ap", 4, carbon=100.0, price=0.1),
        region("us", 4, carbon=800.0, price=0.1, speed=2.0),
    ]
    tenants = {"t": TenantInfo(name="t", carbon_weight=1000.0)}
    [assign] = run(regions, [task("j", tenant="t", estimate_ms=MINUTE_MS)], tenants).assigns
    assert assign.region == "ap"
    # 0.7 kW for a minute: 1.2 g in ap at 100 g/kWh, 4.7 g in us for its half minute at 800.
    assert "$0.0017, 1.2 g CO2" in assign.reason
    assert "$0.00083, 4.7 g CO2" in assign.reason
    # At carbon weight 1000 the grams decide: 3.5 g more in us is worth 35 min.
    assert assign.reason.endswith(
        "scores +34.5 min: price and carbon (weights 1 and 1000) +35.0 min, finish -30.0 s)"
    )


def test_reasons__a_reservation_whose_holders_passed_their_estimates_names_no_time() -> None:
    regions = [region("a", 4)]
    overdue = running("r", "a", gpus=3, started_ms=0, estimate_ms=60 * MINUTE_MS)
    decisions = run(regions, [overdue, task("head", gpus=4)])
    assert decisions.waiting[("head", 0)] == (
        "head of the queue: reserved a, expected to fit there once running tasks there end "
        "(their estimates have passed); later tasks may run in a only if they leave room for it"
    )
    on_time = running("r", "a", gpus=3, started_ms=NOW_MS, estimate_ms=60 * MINUTE_MS)
    reason = run(regions, [on_time, task("head", gpus=4)]).waiting[("head", 0)]
    assert reason.startswith("head of the queue: reserved a, expected to fit there at ")
    assert reason.endswith(
        "; later tasks may run in a only if they end before then or leave room for it"
    )


def test_reasons__a_better_region_left_for_the_head_is_named_as_such() -> None:
    # a (speed 2) is the better region for "long", but "long" would hold a GPU there past the
    # time the head of the queue is expected to get all four.
    regions = [region("a", 4, speed=2.0), region("b", 2)]
    tasks = [
        running("r", "a", gpus=3, started_ms=NOW_MS, estimate_ms=120 * MINUTE_MS),
        task("head", gpus=4, submitted_ms=0),
        task("long", submitted_ms=1, estimate_ms=240 * MINUTE_MS),
    ]
    [assign] = run(regions, tasks).assigns
    assert assign.region == "b"
    assert "; a scores better (est. finish in 120.0 min" in assign.reason
    assert assign.reason.endswith("but would delay head[0], which holds a reservation there")


def test_reasons__a_reservation_behind_a_preemptor_names_it() -> None:
    regions = [region("a", 2)]
    tasks = [
        running("low1", "a", token=1, started_ms=0, estimate_ms=60 * MINUTE_MS),
        running("low2", "a", token=2, started_ms=0, estimate_ms=60 * MINUTE_MS),
        task("high", priority=1),
        task("head", gpus=2, submitted_ms=1),
    ]
    decisions = run(regions, tasks)
    assert len(decisions.preempts) == 1
    assert decisions.waiting[("head", 0)].startswith(
        "head of the queue: reserved a, expected to fit there after high[0], for which room is "
        "held there, once running tasks there end (their estimates have passed); "
    )


def test_reasons__name_no_other_tenants_job() -> None:
    """A victim's reason named its preemptor's job and priority, which reached the victim's
    tenant through `xr job show` and the dashboard (found by the dashboard QA pass, session 31);
    within one tenant the job is named."""
    regions = [region("a", 1)]
    for preemptor_tenant, expected in [
        ("team-a", "preempted for a task of another tenant (a higher priority)"),
        ("team-b", "preempted for urgent[0] (priority 777 over 0)"),
    ]:
        tasks = [
            running("victim", "a", token=11, tenant="team-b"),
            task("urgent", priority=777, tenant=preemptor_tenant),
        ]
        (preempt,) = run(regions, tasks).preempts
        assert preempt.reason.startswith(expected), preempt.reason
        if preemptor_tenant != "team-b":
            assert "urgent" not in preempt.reason and "777" not in preempt.reason
