"""The dashboard's snapshot on a bare state machine: its size is bounded whatever the tenant
holds (a worst-case state: every list at its limit, every reason, error and name at its longest),
and the node builds one snapshot per tenant and index however many dashboards ask for it."""

from __future__ import annotations

import itertools

import msgspec

from node.api import ui
from xrcore import StateMachine
from xrcore.commands import JobSpec
from xrcore.limits import DEFAULT_LIMITS, KEY_BYTES_MAX, MESSAGE_BYTES_MAX
from xrcore.model import Attempt, Job, Lock, Session, Task, TaskState

# docs/ui.md, "Cost and size": a snapshot's worst case, regions aside.
WORST_CASE_BYTES_MAX = 12_500_000
TENANT = "t"
# Each character a control character: JSON writes each in six bytes (`\u0001`).
_WORST_CHARACTER = "\x01"
_TIME_MS = 1_700_000_000_000


def _text(length: int) -> str:
    return _WORST_CHARACTER * length


def _worst_case_machine() -> StateMachine:
    """More than the snapshot shows of everything, each at the largest the state machine keeps."""
    machine = StateMachine()
    region_names = [
        f"r{number:02d}".ljust(128, "x") for number in range(DEFAULT_LIMITS.regions_max)
    ]
    attempts = [
        Attempt(
            number=number,
            token=1 << 60,
            region=region_names[0],
            executor_id="executor",
            started_at_ms=_TIME_MS,
            lease_ttl_ms=1,
            deadline_ms=1,
            ended_at_ms=_TIME_MS,
            outcome="failed",
            error=_text(MESSAGE_BYTES_MAX),
        )
        for number in range(1, DEFAULT_LIMITS.attempts_total_max + 1)
    ]
    states = list(TaskState)
    for job_number in range(ui.JOBS_SHOWN_MAX + 10):
        tasks = [
            Task(
                index=index,
                # Every state among the tasks, and every region.
                state=states[index % len(states)],
                region=region_names[index % len(region_names)],
                attempts=attempts,
                failures=1 << 60,
                done=1 << 60,
                total=1 << 60,
                reason=_text(MESSAGE_BYTES_MAX),
                error=_text(MESSAGE_BYTES_MAX),
            )
            for index in range(len(region_names))
        ]
        job_id = f"job-{(1 << 60) + job_number}"
        machine.jobs[job_id] = Job(
            job_id=job_id,
            spec=JobSpec(
                name="n" * 128,
                tenant=TENANT,
                entrypoint="m" * 2040 + ":f",
                array_size=len(tasks),
                priority=-1000,
            ),
            submitted_at_ms=_TIME_MS,
            tasks=tasks,
            cancel_reason=_text(MESSAGE_BYTES_MAX),
        )
    session_ids = [f"s{number:04d}".ljust(128, "s") for number in range(1000)]
    lock_names = [
        f"{TENANT}/{number:04d}" + _text(KEY_BYTES_MAX - len(TENANT) - 5) for number in range(1000)
    ]
    for number in range(ui.LOCKS_SHOWN_MAX + 10):
        machine.locks[lock_names[number]] = Lock(
            name=lock_names[number],
            holder=session_ids[number],
            token=1 << 60,
            granted_at_ms=_TIME_MS,
            waiters=session_ids[: DEFAULT_LIMITS.lock_waiters_max],
        )
    for number in range(ui.SESSIONS_SHOWN_MAX + 10):
        machine.sessions[session_ids[number]] = Session(
            session_id=session_ids[number],
            ttl_ms=3_600_000,
            deadline_ms=1 << 60,
            granted_at_ms=_TIME_MS,
            owner=TENANT,
            locks=lock_names[: DEFAULT_LIMITS.locks_per_session_max],
            keys=["k"] * DEFAULT_LIMITS.keys_per_session_max,
        )
    return machine


def _cut(text: str | None, limit: int) -> bool:
    """Whether `text` is a longer one cut after `limit` characters, saying so."""
    return text is not None and text[:limit] == _text(limit) and text[limit:].startswith("… (cut;")


def test_snapshot__of_a_worst_case_state__is_bounded() -> None:
    state = ui.SnapshotCache().shared(_worst_case_machine(), TENANT, now_s=0.0).state

    encoded = msgspec.json.encode({**state, "regions": []})
    assert len(encoded) <= WORST_CASE_BYTES_MAX, len(encoded)
    assert len(state["jobs"]) == ui.JOBS_SHOWN_MAX
    assert state["job_counts"] == {"running": ui.JOBS_SHOWN_MAX + 10}
    for job in state["jobs"]:
        assert job["tasks_shown"] == len(job["tasks"]) == ui.TASKS_SHOWN_MAX
        assert _cut(job["cancel_reason"], ui.TEXT_SHOWN_MAX)
        assert _cut(job["reason"], ui.TEXT_SHOWN_MAX)
        for task in job["tasks"]:
            assert _cut(task["reason"], ui.TEXT_SHOWN_MAX)
            assert _cut(task["error"], ui.TEXT_SHOWN_MAX)
            assert task["attempt_count"] == DEFAULT_LIMITS.attempts_total_max
            # The latest attempts.
            assert [attempt["number"] for attempt in task["attempts"]] == list(
                range(
                    DEFAULT_LIMITS.attempts_total_max - ui.ATTEMPTS_SHOWN_MAX + 1,
                    DEFAULT_LIMITS.attempts_total_max + 1,
                )
            )
            for attempt in task["attempts"]:
                assert _cut(attempt["error"], ui.ATTEMPT_ERROR_SHOWN_MAX)
    assert (len(state["locks"]), state["lock_count"]) == (
        ui.LOCKS_SHOWN_MAX,
        ui.LOCKS_SHOWN_MAX + 10,
    )
    for lock in state["locks"]:
        assert len(lock["name"]) <= ui.NAME_SHOWN_MAX + 40
        assert len(lock["waiters"]) == ui.WAITERS_SHOWN_MAX
        assert lock["waiter_count"] == DEFAULT_LIMITS.lock_waiters_max
    assert (len(state["sessions"]), state["session_count"]) == (
        ui.SESSIONS_SHOWN_MAX,
        ui.SESSIONS_SHOWN_MAX + 10,
    )
    for session in state["sessions"]:
        assert len(session["locks"]) == ui.SESSION_LOCKS_SHOWN_MAX
        assert session["lock_count"] == DEFAULT_LIMITS.locks_per_session_max
        assert all(len(name) <= ui.NAME_SHOWN_MAX + 40 for name in session["locks"])


def _machine_with_jobs(tenants: list[str], jobs_each: int) -> StateMachine:
    machine = StateMachine()
    for number, tenant in enumerate(tenants * jobs_each):
        job_id = f"job-{number + 1}"
        machine.jobs[job_id] = Job(
            job_id=job_id,
            spec=JobSpec(name="j", tenant=tenant, workload="gemm"),
            submitted_at_ms=number,
            tasks=[Task(index=0)],
        )
    machine.index = 100
    return machine


def test_cache__many_answers_for_one_tenant_at_one_index__build_one_snapshot() -> None:
    machine = _machine_with_jobs(["a", "b"], 100)
    cache = ui.SnapshotCache()

    served = [cache.shared(machine, "a", now_s=0.0) for _ in range(50)]
    # Streams that sent an older index take the same one.
    served += [cache.shared(machine, "a", now_s=5.0, newer_than=index) for index in range(50)]

    assert cache.builds == {"a": 1}
    assert all(shared is served[0] for shared in served)
    # Another tenant's is its own.
    other = cache.shared(machine, "b", now_s=0.0)
    assert cache.builds == {"a": 1, "b": 1}
    assert {job["job_id"] for job in other.state["jobs"]}.isdisjoint(
        job["job_id"] for job in served[0].state["jobs"]
    )


def test_cache__at_a_new_index__builds_again_but_streams_keep_to_one_per_interval() -> None:
    machine = _machine_with_jobs(["a"], 10)
    cache = ui.SnapshotCache()
    first = cache.shared(machine, "a", now_s=0.0)
    machine.index += 1

    # A stream that sent less than the kept snapshot takes it within the interval...
    assert cache.shared(machine, "a", now_s=0.1, newer_than=first.index - 1) is first
    # ...not one that sent it already, nor an answer that must be at the machine's index.
    second = cache.shared(machine, "a", now_s=0.1, newer_than=first.index)
    assert second.index == machine.index
    assert cache.shared(machine, "a", now_s=0.1) is second
    machine.index += 1
    # Nor after the interval.
    third = cache.shared(machine, "a", now_s=1.0, newer_than=first.index)
    assert third.index == machine.index
    assert cache.builds == {"a": 3}


def test_cache__counts_jobs_in_every_state_as_the_job_says() -> None:
    machine = StateMachine()
    for number, states in enumerate(
        itertools.chain.from_iterable(
            itertools.product(list(TaskState), repeat=size) for size in (1, 2, 3)
        )
    ):
        job_id = f"job-{number + 1}"
        machine.jobs[job_id] = Job(
            job_id=job_id,
            spec=JobSpec(name="j", tenant="a", workload="gemm"),
            submitted_at_ms=number,
            tasks=[
                Task(index=index, state=state, region="r0") for index, state in enumerate(states)
            ],
        )
    cache = ui.SnapshotCache()

    for _ in range(2):
        # Twice: the second time finished jobs' states are remembered.
        machine.index += 1
        machine.schedule_revision += 1
        counts = cache.shared(machine, "a", now_s=0.0).state["job_counts"]
        expected: dict[str, int] = {}
        for job in machine.jobs.values():
            expected[job.state] = expected.get(job.state, 0) + 1
        assert counts == expected
