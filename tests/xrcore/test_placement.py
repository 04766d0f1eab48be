"""The policy in the replicated state: feasible, healthy, allowed, spread by load, by priority,
with retry backoff, taking back tasks stranded on a region that died before claiming them, and
applied as one pass that a changed state refuses."""

from __future__ import annotations

from tests.xrcore.helpers import Driver
from xrcore.commands import (
    Gpu,
    JobCancel,
    JobSpec,
    JobSubmit,
    Preemption,
    RegionHeartbeat,
    RegionRegister,
    SchedulePass,
    TaskClaim,
    TaskComplete,
    TaskFail,
    TaskHeartbeat,
    TaskYield,
    Tick,
)
from xrcore.errors import NotFound, StaleSchedule
from xrcore.placement import PlacementSettings, cluster_view, place
from xrcore.scheduler import SchedulerSettings


def _region(
    driver: Driver, name: str, *, slots: int = 2, gpus: int = 0, model: str = "A100"
) -> None:
    driver.ok(
        RegionRegister(name=name, http_address="h:1", raft_address=f"{name}:1", cpu_slots=slots)
    )
    driver.ok(
        RegionHeartbeat(
            name=name,
            gpus=tuple(Gpu(model=model, memory_mb=80_000, free_mb=80_000) for _ in range(gpus)),
        )
    )


def _submit(driver: Driver, name: str, **spec: object) -> str:
    job_id: str = driver.ok(JobSubmit(spec=JobSpec(name=name, workload="gemm", **spec)))["job_id"]  # type: ignore[arg-type]
    return job_id


def _apply_all(driver: Driver) -> list[tuple[str, int, str]]:
    decisions = place(driver.machine)
    if decisions is None:
        return []
    driver.ok(decisions)
    return [(item.job_id, item.task_index, item.region) for item in decisions.assigns]


def _assigned(decisions: SchedulePass | None) -> list[tuple[str, int, str]]:
    assert decisions is not None
    return [(item.job_id, item.task_index, item.region) for item in decisions.assigns]


def test_tasks_spread_to_the_least_loaded_healthy_regions() -> None:
    driver = Driver()
    for name in ("a", "b", "c"):
        _region(driver, name, slots=2)
    job_id = _submit(driver, "array", array_size=6)
    placed = _apply_all(driver)
    regions = [region for _, _, region in placed]
    assert sorted(regions) == ["a", "a", "b", "b", "c", "c"]
    assert regions[:3] == ["a", "b", "c"]
    assert all(job == job_id for job, _, _ in placed)
    # Every slot is taken: nothing more fits until a task ends.
    waits = _submit(driver, "waits")
    # Nothing to place; the pass only records why the new task waits.
    decisions = place(driver.machine)
    assert decisions is not None and not decisions.assigns
    assert [item.job_id for item in decisions.waiting] == [waits]
    # The first task that fits nowhere reserves the region where a slot frees first.
    assert decisions.waiting[0].reason.startswith("head of the queue: reserved a")
    driver.ok(decisions)
    assert driver.machine.jobs[waits].tasks[0].reason == decisions.waiting[0].reason
    # The reason is recorded: the next pass writes nothing.
    assert place(driver.machine) is None


def test_allow_deny_and_prefer_are_honoured() -> None:
    driver = Driver()
    for name in ("a", "b", "c"):
        _region(driver, name)
    _submit(driver, "denied", regions_deny=("a", "b"))
    _submit(driver, "allowed", regions_allow=("b",))
    _submit(driver, "prefers", regions_prefer=("c",))
    placed = {job: region for job, _, region in _apply_all(driver)}
    assert list(placed.values()) == ["c", "b", "c"]


def test_gpu_tasks_need_whole_free_devices_of_the_model_asked() -> None:
    driver = Driver()
    _region(driver, "small", slots=0, gpus=1, model="T4")
    _region(driver, "big", slots=0, gpus=2, model="A100")
    _submit(driver, "two-a100", gpus=2, gpu_model="A100")
    _submit(driver, "one-t4", gpus=1, gpu_model="T4")
    _submit(driver, "no-room", gpus=1, gpu_model="A100")
    placed = [(region) for _, _, region in _apply_all(driver)]
    assert placed == ["big", "small"]


def test_higher_priority_jobs_are_placed_first() -> None:
    driver = Driver()
    _region(driver, "a", slots=1)
    _submit(driver, "low", priority=0)
    high = _submit(driver, "high", priority=10)
    assert [job for job, _, _ in _apply_all(driver)] == [high]


def test_a_failed_task_waits_out_its_backoff_before_it_is_placed_again() -> None:
    driver = Driver()
    _region(driver, "a", slots=1)
    job_id = _submit(driver, "flaky", max_attempts=5)
    _apply_all(driver)
    token = driver.ok(
        TaskClaim(job_id=job_id, task_index=0, region="a", executor_id="e", lease_ttl_ms=10_000)
    )["token"]
    driver.ok(TaskFail(job_id=job_id, task_index=0, token=token, error="boom"))
    settings = PlacementSettings(retry_backoff_base_ms=2_000)
    waiting = place(driver.machine, settings)
    assert waiting is not None and not waiting.assigns
    driver.ok(waiting)
    assert driver.machine.jobs[job_id].tasks[0].reason.startswith("backing off after 1 failure")
    driver.ok(Tick(), advance_ms=1_000)
    assert place(driver.machine, settings) is None
    driver.ok(Tick(), advance_ms=1_000)
    assert _assigned(place(driver.machine, settings)) == [(job_id, 0, "a")]


def test_a_task_assigned_to_a_region_that_died_before_claiming_it_is_taken_back() -> None:
    driver = Driver()
    _region(driver, "a")
    _region(driver, "b")
    job_id = _submit(driver, "stranded", regions_prefer=("a",))
    assert _apply_all(driver) == [(job_id, 0, "a")]
    # Only b keeps sending heartbeats while the lease clock moves past a's timeout.
    for _ in range(12):
        driver.ok(Tick(), advance_ms=1_000)
        driver.ok(RegionHeartbeat(name="b"))
    decisions = place(driver.machine)
    assert decisions is not None
    assert [(item.job_id, item.task_index) for item in decisions.unassigns] == [(job_id, 0)]
    driver.ok(decisions)
    assert _apply_all(driver) == [(job_id, 0, "b")]


def test_one_pass_makes_at_most_decisions_max_decisions() -> None:
    driver = Driver()
    _region(driver, "a", slots=100)
    _submit(driver, "many", array_size=50)
    decisions = place(driver.machine, PlacementSettings(decisions_max=7))
    assert decisions is not None and len(decisions.assigns) == 7


def test_a_task_whose_lease_expired_goes_to_another_region_while_one_fits() -> None:
    driver = Driver()
    _region(driver, "a")
    _region(driver, "b")
    job_id = _submit(driver, "moved", regions_prefer=("a",))
    assert _apply_all(driver) == [(job_id, 0, "a")]
    driver.ok(
        TaskClaim(job_id=job_id, task_index=0, region="a", executor_id="e", lease_ttl_ms=2_000)
    )
    # Region a still looks healthy (its heartbeat is recent) when the attempt's lease runs out.
    for _ in range(3):
        driver.ok(Tick(), advance_ms=1_000)
    assert driver.machine.jobs[job_id].tasks[0].attempts[0].outcome == "lease_expired"
    assert _apply_all(driver) == [(job_id, 0, "b")]


def test_tasks_asking_for_gpu_memory_share_one_device() -> None:
    driver = Driver()
    _region(driver, "gpu", slots=0, gpus=2)
    for name in ("share-1", "share-2", "share-3"):
        _submit(driver, name, gpu_memory_mb=30_000)
    whole = _submit(driver, "whole", gpus=1)
    # Two shares fit one 80 GB device; the third takes the other; then nothing is whole.
    placed = _apply_all(driver)
    assert [region for _, _, region in placed] == ["gpu", "gpu", "gpu"]
    assert whole not in [job for job, _, _ in placed]


def test_a_pass_computed_before_a_change_is_refused_as_stale() -> None:
    driver = Driver()
    _region(driver, "a")
    first = _submit(driver, "first")
    decisions = place(driver.machine)
    assert decisions is not None
    # Another pass (say, by a leader that has since lost office) lands first.
    driver.ok(JobCancel(job_id=first))
    assert driver.error(decisions) == StaleSchedule.code
    assert driver.machine.jobs[first].tasks[0].state.value == "cancelled"
    # Recomputed from the new state, nothing is left to place.
    assert place(driver.machine) is None


def test_the_same_pass_applied_twice_places_each_task_once() -> None:
    driver = Driver()
    _region(driver, "a")
    _region(driver, "b")
    job_id = _submit(driver, "array", array_size=2)
    decisions = place(driver.machine)
    assert decisions is not None
    driver.ok(decisions)
    # A retried proposal of the same pass (new leader, same decisions) is stale, not repeated.
    assert driver.error(decisions) == StaleSchedule.code
    assert [task.state.value for task in driver.machine.jobs[job_id].tasks] == [
        "assigned",
        "assigned",
    ]


def test_times_in_reasons_are_written_as_utc_like_datetime_would() -> None:
    from datetime import UTC, datetime

    from xrcore._clocktext import utc_text

    for time_ms in (0, 951_782_400_000, 1_700_000_000_123, 4_102_444_799_000, 86_399_999):
        expected = datetime.fromtimestamp(time_ms / 1000, tz=UTC)
        assert utc_text(time_ms, seconds=True) == expected.strftime("%Y-%m-%d %H:%M:%S UTC")


def _running(driver: Driver, job_id: str, region: str) -> int:
    token: int = driver.ok(
        TaskClaim(job_id=job_id, task_index=0, region=region, executor_id="e", lease_ttl_ms=600_000)
    )["token"]
    return token


def _preemptive(**overrides: int) -> PlacementSettings:
    return PlacementSettings(
        policy=SchedulerSettings(
            preemption_min_run_ms=overrides.get("min_run_ms", 0),
            preemption_grace_ms=overrides.get("grace_ms", 60_000),
        )
    )


def test_a_preempted_task_is_asked_to_yield_then_requeued_without_a_failure() -> None:
    driver = Driver()
    _region(driver, "a", slots=1)
    low = _submit(driver, "low", priority=0)
    _apply_all(driver)
    token = _running(driver, low, "a")
    high = _submit(driver, "high", priority=5)
    settings = _preemptive()

    asked = place(driver.machine, settings)
    assert asked is not None
    assert [(item.job_id, item.token, item.force) for item in asked.preempts] == [
        (low, token, False)
    ]
    driver.ok(asked)
    # Asked, not ended: the attempt keeps its token until it has checkpointed and yielded.
    assert driver.machine.jobs[low].tasks[0].state.value == "running"
    assert driver.ok(TaskHeartbeat(job_id=low, task_index=0, token=token))["preempt"] is True
    # The high task waits for it rather than preempting anything else.
    waiting = place(driver.machine, settings)
    assert waiting is not None and not waiting.preempts and not waiting.assigns
    driver.ok(waiting)
    assert "waiting for 1 preempted task(s) in a" in driver.machine.jobs[high].tasks[0].reason

    driver.ok(TaskYield(job_id=low, task_index=0, token=token))
    task = driver.machine.jobs[low].tasks[0]
    assert (task.state.value, task.failures, task.attempts[-1].outcome) == (
        "pending",
        0,
        "preempted",
    )
    assert _apply_all(driver) == [(high, 0, "a")]


def test_a_task_that_does_not_yield_within_the_grace_is_ended_at_once() -> None:
    driver = Driver()
    _region(driver, "a", slots=1)
    low = _submit(driver, "low", priority=0)
    _apply_all(driver)
    token = _running(driver, low, "a")
    _submit(driver, "high", priority=5)
    settings = _preemptive(grace_ms=10_000)
    driver.ok(place(driver.machine, settings))  # type: ignore[arg-type]
    for _ in range(10):
        driver.ok(Tick(), advance_ms=1_000)
        driver.ok(RegionHeartbeat(name="a"))
    forced = place(driver.machine, settings)
    assert forced is not None
    assert [(item.job_id, item.force) for item in forced.preempts] == [(low, True)]
    driver.ok(forced)
    assert driver.machine.jobs[low].tasks[0].attempts[-1].outcome == "preempted"
    # Its token is dead: a late yield or checkpoint from the old attempt is refused.
    assert driver.error(TaskYield(job_id=low, task_index=0, token=token)) == "fencing.stale_token"


def test_only_a_preempted_attempt_may_yield() -> None:
    driver = Driver()
    _region(driver, "a", slots=1)
    job_id = _submit(driver, "job")
    _apply_all(driver)
    token = _running(driver, job_id, "a")
    assert driver.error(TaskYield(job_id=job_id, task_index=0, token=token)) == (
        "job.invalid_transition"
    )


def test_run_times_are_learned_per_tenant_and_entrypoint_and_feed_the_estimate() -> None:
    driver = Driver()
    _region(driver, "a", slots=1)
    for run_s in (100, 200):
        job_id = _submit(driver, "timed")
        _apply_all(driver)
        token = _running(driver, job_id, "a")
        driver.ok(Tick(), advance_ms=run_s * 1_000)
        driver.ok(RegionHeartbeat(name="a"))
        driver.ok(TaskComplete(job_id=job_id, task_index=0, token=token, result="{}"))
    stats = driver.machine.durations["default/gemm"]
    # First run: mean 100 s, deviation 50 s; second: mean += (200 - 100) / 4.
    assert (stats.count, stats.mean_ms) == (2, 125_000)
    pending = _submit(driver, "next")
    view = cluster_view(driver.machine, PlacementSettings())
    estimate = next(task.estimate_ms for task in view.tasks if task.job_id == pending)
    assert estimate == stats.mean_ms + 2 * stats.deviation_ms


def _dear_and_cheap_cpu_regions() -> Driver:
    """Two CPU regions of 2 slots, equal speed: a-dear ($4, 600 g/kWh), b-cheap ($1, 50 g)."""
    driver = Driver()
    for name, price, carbon in (("a-dear", 4.0, 600.0), ("b-cheap", 1.0, 50.0)):
        driver.ok(
            RegionRegister(
                name=name,
                http_address="h:1",
                raft_address=f"{name}:1",
                cpu_slots=2,
                price_per_gpu_hour=price,
                carbon_g_per_kwh=carbon,
            )
        )
        driver.ok(RegionHeartbeat(name=name))
    return driver


def test_regions_without_gpus_are_chosen_by_price_and_carbon_too() -> None:
    """In CPU mode a task's slot is billed as one device, so the cheaper, cleaner region wins
    where speed and load are equal, though its name sorts last."""
    driver = _dear_and_cheap_cpu_regions()
    job_id = _submit(driver, "cpu-task")
    assert _apply_all(driver) == [(job_id, 0, "b-cheap")]


def test_a_jobs_own_price_and_carbon_weights_reach_the_policy() -> None:
    """A job that weighs neither price nor carbon sees two regions of equal speed and load as
    equal, and takes the first by name; its spec's weights are in the policy's view."""
    driver = _dear_and_cheap_cpu_regions()
    careless = _submit(driver, "careless", cost_weight=0.0, carbon_weight=0.0)
    default = _submit(driver, "default")
    view = {task.job_id: task for task in cluster_view(driver.machine, PlacementSettings()).tasks}
    assert (view[careless].cost_weight, view[careless].carbon_weight) == (0.0, 0.0)
    assert (view[default].cost_weight, view[default].carbon_weight) == (None, None)
    assert _apply_all(driver) == [(careless, 0, "a-dear"), (default, 0, "b-cheap")]


def _slow_task_beside_a_free_fast_region(driver: Driver) -> tuple[str, int]:
    """Region a (speed 1, one slot) runs a long task; region b (speed 2, one slot) is free.
    Returns the task's job and token."""
    _region(driver, "a", slots=1)
    driver.ok(
        RegionRegister(
            name="b", http_address="h:1", raft_address="b:1", cpu_slots=1, labels={"speed": "2"}
        )
    )
    driver.ok(RegionHeartbeat(name="b"))
    first = _submit(driver, "first")
    second = _submit(driver, "second")
    assert sorted(region for _, _, region in _apply_all(driver)) == ["a", "b"]
    where = {job_id: driver.machine.jobs[job_id].tasks[0].region for job_id in (first, second)}
    slow = first if where[first] == "a" else second
    fast = second if slow == first else first
    token = _running(driver, slow, "a")
    _running(driver, fast, "b")
    driver.ok(JobCancel(job_id=fast))  # b is free again; no run time is learned
    for _ in range(15):
        driver.ok(Tick(), advance_ms=60_000)
        driver.ok(RegionHeartbeat(name="a"))
        driver.ok(RegionHeartbeat(name="b"))
        driver.ok(TaskHeartbeat(job_id=slow, task_index=0, token=token))
    return slow, token


def test_a_running_task_moves_up_with_its_room_held_in_the_replicated_state() -> None:
    driver = Driver()
    slow, token = _slow_task_beside_a_free_fast_region(driver)
    settings = PlacementSettings(policy=SchedulerSettings(default_estimate_ms=20 * 3_600_000))
    decisions = place(driver.machine, settings)
    assert decisions is not None
    assert [(item.job_id, item.moving_to, item.force) for item in decisions.preempts] == [
        (slow, "b", False)
    ]
    driver.ok(decisions)
    task = driver.machine.jobs[slow].tasks[0]
    assert task.moving_to == "b"
    assert "moving to faster region b" in task.reason
    # While it yields, b's one slot is held: a newcomer waits rather than take it.
    newcomer = _submit(driver, "newcomer")
    waiting = place(driver.machine, settings)
    assert waiting is None or _assigned(waiting) == []
    driver.ok(TaskYield(job_id=slow, task_index=0, token=token))
    assert driver.machine.jobs[slow].tasks[0].moving_to == "b"
    # Once it has yielded, the next pass puts it in b before anyone else, and the move is over.
    assigned = place(driver.machine, settings)
    assert assigned is not None and _assigned(assigned)[0] == (slow, 0, "b")
    driver.ok(assigned)
    assert driver.machine.jobs[slow].tasks[0].moving_to is None
    assert driver.machine.jobs[newcomer].tasks[0].region != "b"


def test_a_pass_that_moves_a_task_to_an_unknown_region_is_refused() -> None:
    driver = Driver()
    slow, token = _slow_task_beside_a_free_fast_region(driver)
    refused = SchedulePass(
        revision=driver.machine.schedule_revision,
        preempts=(Preemption(job_id=slow, task_index=0, token=token, moving_to="nowhere"),),
    )
    assert driver.error(refused) == NotFound.code
    assert driver.machine.jobs[slow].tasks[0].moving_to is None


def test_a_pass_looks_at_a_bounded_number_of_pending_tasks_shared_between_tenants() -> None:
    # One tenant's huge queue made each pass take over a second on the leader's Raft thread
    # (elections every few seconds); a pass now looks at `pending_max` pending tasks, shared
    # between the (priority, tenant) queues, and at every task that holds room.
    driver = Driver()
    _region(driver, "a", slots=1)
    held = _submit(driver, "held", tenant="bob")
    _apply_all(driver)
    _running(driver, held, "a")
    for _ in range(3):
        _submit(driver, "nowhere", tenant="bob", regions_allow=("nowhere",), array_size=40)
    urgent = _submit(driver, "urgent", tenant="bob", priority=5)
    alice = [_submit(driver, f"alice-{n}", tenant="alice") for n in range(3)]
    settings = PlacementSettings(pending_max=10)
    view = cluster_view(driver.machine, settings)
    pending = [task for task in view.tasks if task.state == "pending"]
    assert len(pending) == 10
    # Each short queue whole, the rest to bob's long one; the running task besides.
    assert {task.job_id for task in pending} >= {urgent, *alice}
    assert sum(task.tenant == "bob" and task.priority == 0 for task in pending) == 6
    assert [task.job_id for task in view.tasks if task.state == "running"] == [held]
    # Submission order, as the full view has it.
    full = cluster_view(driver.machine, PlacementSettings())
    assert len(full.tasks) == 1 + 120 + 1 + 3
    order = {(task.job_id, task.task_index): n for n, task in enumerate(full.tasks)}
    positions = [order[task.job_id, task.task_index] for task in view.tasks]
    assert positions == sorted(positions)
    # Alice's tasks get their turn however long bob's queue is (a reason, as the region is full).
    decisions = place(driver.machine, settings)
    assert decisions is not None
    assert {item.job_id for item in decisions.waiting} >= set(alice)


def test_a_bound_that_every_queue_fits_in_changes_nothing() -> None:
    driver = Driver()
    for name in ("a", "b"):
        _region(driver, name, slots=2)
    for n in range(6):
        _submit(driver, f"j{n}", tenant=("alice", "bob")[n % 2], array_size=2)
    assert cluster_view(driver.machine, PlacementSettings(pending_max=12)) == cluster_view(
        driver.machine, PlacementSettings()
    )
    assert place(driver.machine, PlacementSettings(pending_max=12)) == place(driver.machine)
