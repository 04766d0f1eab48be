"""Jobs: the transition table, attempts and fencing tokens, checkpoints, retries, expiry, limits."""

from __future__ import annotations

import pytest

from xrcore import jobs
from xrcore.commands import (
    JobCancel,
    JobSpec,
    JobSubmit,
    RegionRegister,
    TaskAssign,
    TaskCheckpoint,
    TaskClaim,
    TaskComplete,
    TaskFail,
    TaskHeartbeat,
    TaskUnassign,
    Tick,
)
from xrcore.jobs import TRANSITIONS, Event
from xrcore.limits import Limits
from xrcore.model import TaskState

from .helpers import Driver


def _region(driver: Driver, name: str) -> None:
    driver.ok(RegionRegister(name=name, http_address="http://127.0.0.1:1", raft_address="x:1"))


def _submit(driver: Driver, **spec: object) -> str:
    fields: dict[str, object] = {"name": "train", "workload": "gemm", **spec}
    return str(driver.ok(JobSubmit(spec=JobSpec(**fields)))["job_id"])  # type: ignore[arg-type]


def _start(driver: Driver, job_id: str, region: str = "r1", task_index: int = 0) -> int:
    driver.ok(TaskAssign(job_id=job_id, task_index=task_index, region=region))
    claim = TaskClaim(
        job_id=job_id, task_index=task_index, region=region, executor_id="e", lease_ttl_ms=3_000
    )
    return int(driver.ok(claim)["token"])


@pytest.fixture
def driver() -> Driver:
    driver = Driver()
    _region(driver, "r1")
    _region(driver, "r2")
    return driver


def test_transition_table__terminal_states_have_no_way_out() -> None:
    for state, _ in TRANSITIONS:
        assert not state.terminal


def test_transition_table__every_event_is_used() -> None:
    assert {event for _, event in TRANSITIONS} == set(Event)


def test_submit__array__creates_one_pending_task_per_index(driver: Driver) -> None:
    job_id = _submit(driver, array_size=3)
    view = jobs.get(driver.machine, job_id)
    assert view["state"] == "pending"
    assert [task["index"] for task in view["tasks"]] == [0, 1, 2]
    assert {task["state"] for task in view["tasks"]} == {"pending"}


def test_claim__creates_an_attempt_with_a_new_fencing_token(driver: Driver) -> None:
    job_id = _submit(driver)
    token = _start(driver, job_id)
    assert token == driver.machine.fencing_token
    assert jobs.get(driver.machine, job_id)["state"] == "running"


def test_claim__from_another_region__is_rejected(driver: Driver) -> None:
    job_id = _submit(driver)
    driver.ok(TaskAssign(job_id=job_id, task_index=0, region="r1"))
    claim = TaskClaim(job_id=job_id, task_index=0, region="r2", executor_id="e", lease_ttl_ms=3_000)
    assert driver.error(claim) == "job.invalid_transition"


def test_claim__unassigned_task__is_an_invalid_transition(driver: Driver) -> None:
    job_id = _submit(driver)
    claim = TaskClaim(job_id=job_id, task_index=0, region="r1", executor_id="e", lease_ttl_ms=3_000)
    assert driver.error(claim) == "job.invalid_transition"


def test_assign__denied_or_unknown_region__is_rejected(driver: Driver) -> None:
    job_id = _submit(driver, regions_deny=("r1",))
    assert driver.error(TaskAssign(job_id=job_id, task_index=0, region="r1")) == "request.invalid"
    assert driver.error(TaskAssign(job_id=job_id, task_index=0, region="mars")) == "not_found"
    driver.ok(TaskAssign(job_id=job_id, task_index=0, region="r2"))
    driver.ok(TaskUnassign(job_id=job_id, task_index=0))
    assert jobs.get(driver.machine, job_id)["tasks"][0]["region"] is None


def test_complete__succeeds_once_and_a_second_completion_is_stale(driver: Driver) -> None:
    job_id = _submit(driver)
    token = _start(driver, job_id)
    driver.ok(TaskComplete(job_id=job_id, task_index=0, token=token, result='{"ok": 1}'))
    assert jobs.get(driver.machine, job_id)["state"] == "succeeded"
    second = TaskComplete(job_id=job_id, task_index=0, token=token)
    assert driver.error(second) == "fencing.stale_token"
    assert driver.machine.tasks_active == 0


def test_stale_token__after_lease_expiry__every_update_is_rejected_unchanged(
    driver: Driver,
) -> None:
    job_id = _submit(driver)
    old = _start(driver, job_id)
    for _ in range(4):
        driver.ok(Tick(), advance_ms=1_000)
    assert jobs.get(driver.machine, job_id)["tasks"][0]["state"] == "pending"
    new = _start(driver, job_id, region="r2")
    before = driver.machine.snapshot()
    for update in [
        TaskHeartbeat(job_id=job_id, task_index=0, token=old, done=1, total=2),
        TaskCheckpoint(
            job_id=job_id, task_index=0, token=old, step=1, uri="u", checksum="c", size_bytes=1
        ),
        TaskComplete(job_id=job_id, task_index=0, token=old),
        TaskFail(job_id=job_id, task_index=0, token=old, error="zombie"),
    ]:
        assert driver.error(update) == "fencing.stale_token"
    # Only the index moved: the state is otherwise byte-identical.
    driver.machine.index -= 4
    assert driver.machine.snapshot() == before
    driver.machine.index += 4
    driver.ok(TaskComplete(job_id=job_id, task_index=0, token=new))


def test_lease_expiry__keeps_the_checkpoint_for_the_next_attempt(driver: Driver) -> None:
    job_id = _submit(driver)
    token = _start(driver, job_id)
    driver.ok(
        TaskCheckpoint(
            job_id=job_id,
            task_index=0,
            token=token,
            step=40,
            uri="file:///c",
            checksum="sha256:1",
            size_bytes=9,
        )
    )
    applied = None
    for _ in range(4):
        applied = driver.apply(Tick(), advance_ms=1_000)
        if applied.effects:
            break
    assert applied is not None
    assert [(effect.kind, effect.reason) for effect in applied.effects] == [
        ("attempt.ended", "lease_expired")
    ]
    driver.ok(TaskAssign(job_id=job_id, task_index=0, region="r2"))
    claim = driver.ok(
        TaskClaim(job_id=job_id, task_index=0, region="r2", executor_id="e2", lease_ttl_ms=3_000)
    )
    assert claim["checkpoint"]["step"] == 40
    assert claim["attempt"] == 2


def test_heartbeat__keeps_the_attempt_alive_past_its_ttl(driver: Driver) -> None:
    job_id = _submit(driver)
    token = _start(driver, job_id)
    for done in range(10):
        driver.ok(
            TaskHeartbeat(
                job_id=job_id, task_index=0, token=token, done=done, total=10, metrics={"loss": 0.5}
            ),
            advance_ms=1_000,
        )
    task = jobs.get(driver.machine, job_id)["tasks"][0]
    assert (task["state"], task["done"], task["metrics"]) == ("running", 9, {"loss": 0.5})


def test_checkpoint__not_newer_than_the_committed_one__is_rejected(driver: Driver) -> None:
    job_id = _submit(driver)
    token = _start(driver, job_id)
    commit = TaskCheckpoint(
        job_id=job_id, task_index=0, token=token, step=5, uri="u", checksum="c", size_bytes=1
    )
    driver.ok(commit)
    assert driver.error(commit) == "checkpoint.not_newer"


def test_fail__retries_until_max_attempts_then_fails(driver: Driver) -> None:
    job_id = _submit(driver, max_attempts=2)
    token = _start(driver, job_id)
    assert driver.ok(TaskFail(job_id=job_id, task_index=0, token=token, error="oom"))["retrying"]
    token = _start(driver, job_id)
    answer = driver.ok(TaskFail(job_id=job_id, task_index=0, token=token, error="oom again"))
    assert (answer["state"], answer["retrying"]) == ("failed", False)
    assert jobs.get(driver.machine, job_id)["state"] == "failed"


def test_fail__not_retryable__fails_at_once(driver: Driver) -> None:
    job_id = _submit(driver, max_attempts=5)
    token = _start(driver, job_id)
    failure = TaskFail(job_id=job_id, task_index=0, token=token, error="bad args", retryable=False)
    assert driver.ok(failure)["state"] == "failed"


def test_lost_leases__do_not_count_as_failures_but_are_bounded(driver: Driver) -> None:
    driver = Driver(Limits(attempts_total_max=3))
    _region(driver, "r1")
    job_id = _submit(driver, max_attempts=1)
    for _ in range(3):
        _start(driver, job_id)
        for _ in range(4):
            driver.ok(Tick(), advance_ms=1_000)
    task = jobs.get(driver.machine, job_id)["tasks"][0]
    assert (task["state"], task["failures"], len(task["attempts"])) == ("failed", 0, 3)


def test_cancel__stops_every_unfinished_task_and_fences_the_attempt(driver: Driver) -> None:
    job_id = _submit(driver, array_size=3)
    token = _start(driver, job_id, task_index=1)
    applied = driver.apply(JobCancel(job_id=job_id, reason="user"))
    assert applied.result.unwrap()["cancelled_tasks"] == 3
    assert [effect.kind for effect in applied.effects] == ["attempt.ended"]
    assert jobs.get(driver.machine, job_id)["state"] == "cancelled"
    heartbeat = TaskHeartbeat(job_id=job_id, task_index=1, token=token)
    assert driver.error(heartbeat) == "fencing.stale_token"
    assert driver.error(JobCancel(job_id=job_id)) == "job.invalid_transition"
    assert driver.machine.tasks_active == 0


def test_job_state__derived_from_tasks(driver: Driver) -> None:
    job_id = _submit(driver, array_size=2, max_attempts=1)
    first = _start(driver, job_id, task_index=0)
    assert jobs.get(driver.machine, job_id)["state"] == "running"
    driver.ok(TaskComplete(job_id=job_id, task_index=0, token=first))
    second = _start(driver, job_id, task_index=1)
    driver.ok(TaskFail(job_id=job_id, task_index=1, token=second, error="x"))
    assert jobs.get(driver.machine, job_id)["state"] == "failed"


def test_tasks_active_max__a_too_large_array__is_rejected(driver: Driver) -> None:
    driver = Driver(Limits(tasks_active_max=4))
    _submit(driver, array_size=3)
    assert driver.error(JobSubmit(spec=JobSpec(name="x", workload="w", array_size=2))) == (
        "limit.capacity"
    )


def test_jobs_max__oldest_finished_job_makes_room(driver: Driver) -> None:
    driver = Driver(Limits(jobs_max=2))
    _region(driver, "r1")
    finished = _submit(driver)
    driver.ok(JobCancel(job_id=finished))
    running = _submit(driver)
    newest = _submit(driver)
    assert list(driver.machine.jobs) == [running, newest]
    assert driver.error(JobSubmit(spec=JobSpec(name="x", workload="w"))) == "limit.capacity"


def test_list__filters_and_pages(driver: Driver) -> None:
    ids = [_submit(driver, tenant="a" if n % 2 else "b") for n in range(5)]
    page = jobs.list_(driver.machine, tenant="a", limit=1)
    assert [item["job_id"] for item in page["items"]] == [ids[1]]
    page = jobs.list_(driver.machine, tenant="a", limit=1, after=page["next"])
    assert [item["job_id"] for item in page["items"]] == [ids[3]]
    assert page["next"] is None


def test_unknown_job_and_task__are_not_found(driver: Driver) -> None:
    job_id = _submit(driver)
    assert driver.error(TaskAssign(job_id="job-0", task_index=0, region="r1")) == "not_found"
    assert driver.error(TaskAssign(job_id=job_id, task_index=3, region="r1")) == "not_found"


def test_task_state_values__are_stable_wire_strings() -> None:
    assert [state.value for state in TaskState] == [
        "pending",
        "assigned",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
