"""The jobs resource through the app factory: submit, list with a state filter and pages, get
(also waiting for the job to finish), cancel, and the timeline of a job's attempts.

No scheduler or executor runs here; where a test needs a task to run, it applies the executor's
commands (assign, claim, complete) to the store directly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.node.conftest import Answer, ApiNode, eventually
from xrcore.commands import TaskAssign, TaskClaim, TaskComplete

pytestmark = pytest.mark.integration


def _submit(api: ApiNode, name: str, **fields: Any) -> str:
    submitted = api.request("POST", "/v1/jobs", json={"name": name, "workload": "sleep", **fields})
    assert submitted.status == 201, submitted.body
    job_id: str = submitted.document["job_id"]
    return job_id


def _all_pages(api: ApiNode, query: str) -> tuple[list[str], int]:
    """Every job id the list shows, following `next`; and the largest page seen."""
    seen: list[str] = []
    largest = 0
    after = None
    for _ in range(1_000):
        page = api.ok("GET", f"/v1/jobs?{query}" + ("" if after is None else f"&after={after}"))
        seen.extend(item["job_id"] for item in page["items"])
        largest = max(largest, len(page["items"]))
        after = page["next"]
        if after is None:
            return seen, largest
    raise AssertionError("the pages did not end")


def test_submit_then_get__shows_the_pending_job_and_its_tasks(api: ApiNode) -> None:
    job_id = _submit(api, "jobs-basic", array_size=2, args={"seconds": 1}, priority=5)
    job = api.request("GET", f"/v1/jobs/{job_id}")
    assert job.status == 200
    assert (job.document["name"], job.document["tenant"]) == ("jobs-basic", "alpha")
    assert (job.document["state"], job.document["priority"]) == ("pending", 5)
    assert [task["state"] for task in job.document["tasks"]] == ["pending", "pending"]


def test_get__shows_the_spec_as_submitted_with_its_defaults(api: ApiNode) -> None:
    job_id = _submit(
        api, "jobs-spec", cost_weight=0, carbon_weight=2.5, args={"seconds": 1}, gpus=0
    )
    spec = api.ok("GET", f"/v1/jobs/{job_id}")["spec"]
    assert (spec["cost_weight"], spec["carbon_weight"]) == (0.0, 2.5)
    assert (spec["name"], spec["tenant"], spec["workload"]) == ("jobs-spec", "alpha", "sleep")
    assert spec["args"] == {"seconds": 1} and spec["regions_allow"] == []
    assert (spec["max_attempts"], spec["entrypoint"]) == (3, None)
    unset = api.ok("GET", f"/v1/jobs/{_submit(api, 'jobs-no-weights')}")["spec"]
    assert (unset["cost_weight"], unset["carbon_weight"], unset["args"]) == (None, None, {})
    # The list shows summaries only.
    listed = api.ok("GET", "/v1/jobs?limit=1")["items"][0]
    assert "spec" not in listed


def test_list__filters_by_state_and_pages_in_submission_order(api: ApiNode) -> None:
    kept = [_submit(api, f"jobs-list-{position}") for position in range(3)]
    cancelled = _submit(api, "jobs-list-cancelled")
    api.ok("POST", f"/v1/jobs/{cancelled}/cancel", json={"reason": "not needed"})

    pending, largest = _all_pages(api, "state=pending&limit=2")
    assert largest <= 2
    assert [job_id for job_id in pending if job_id in kept] == kept
    assert cancelled not in pending
    assert cancelled in _all_pages(api, "state=cancelled&limit=2")[0]


def test_cancel__ends_every_task_and_a_second_cancel_is_409(api: ApiNode) -> None:
    job_id = _submit(api, "jobs-cancel", array_size=3)
    cancelled = api.request("POST", f"/v1/jobs/{job_id}/cancel", json={"reason": "by test"})
    assert (cancelled.status, cancelled.document["cancelled_tasks"]) == (200, 3)
    job = api.ok("GET", f"/v1/jobs/{job_id}")
    assert (job["state"], job["cancel_reason"]) == ("cancelled", "by test")

    again = api.request("POST", f"/v1/jobs/{job_id}/cancel")
    assert (again.status, again.error_code) == (409, "job.invalid_transition")


def test_events__show_submission_then_each_attempt_start_and_end(api: ApiNode) -> None:
    region = api.register_region()
    job_id = _submit(api, "jobs-events")
    api.propose(TaskAssign(job_id=job_id, task_index=0, region=region))
    claim = TaskClaim(
        job_id=job_id, task_index=0, region=region, executor_id="executor-1", lease_ttl_ms=600_000
    )
    token = api.propose(claim)["token"]
    api.propose(TaskComplete(job_id=job_id, task_index=0, token=token))

    timeline = api.request("GET", f"/v1/jobs/{job_id}/events")
    assert timeline.status == 200
    assert timeline.document["state"] == "succeeded"
    events = timeline.document["events"]
    assert [event["kind"] for event in events] == ["submitted", "attempt.started", "attempt.ended"]
    assert (events[1]["region"], events[1]["token"]) == (region, token)
    assert events[2]["outcome"] == "succeeded"
    # A finished job answers a waiting get at once, without taking a waiting place.
    assert api.ok("GET", f"/v1/jobs/{job_id}?wait_s=5")["state"] == "succeeded"


def test_get_with_wait_s__answers_when_the_job_finishes(api: ApiNode) -> None:
    job_id = _submit(api, "jobs-wait-finish")

    async def body() -> Answer:
        waiting = asyncio.ensure_future(api.call("GET", f"/v1/jobs/{job_id}?wait_s=5"))
        await eventually(lambda: api.services.waiting == 1)
        await api.call("POST", f"/v1/jobs/{job_id}/cancel")
        return await waiting

    answer = api.run(body())
    assert (answer.status, answer.document["state"]) == (200, "cancelled")


def test_get_with_wait_s__on_an_unfinished_job__answers_it_unfinished_after_the_wait(
    api: ApiNode,
) -> None:
    job_id = _submit(api, "jobs-wait-timeout")

    async def body() -> Answer:
        waiting = asyncio.ensure_future(api.call("GET", f"/v1/jobs/{job_id}?wait_s=1"))
        await eventually(lambda: api.services.waiting == 1)
        return await waiting

    answer = api.run(body())
    assert (answer.status, answer.document["state"]) == (200, "pending")
    assert api.services.waiting == 0


def test_get__of_a_missing_job__is_404(api: ApiNode) -> None:
    missing = api.request("GET", "/v1/jobs/job-999999999")
    assert (missing.status, missing.error_code) == (404, "not_found")


def test_submit__with_an_invalid_spec__is_400_naming_the_problem(api: ApiNode) -> None:
    both = api.request(
        "POST", "/v1/jobs", json={"name": "jobs-bad", "workload": "w", "entrypoint": "a.b:c"}
    )
    assert (both.status, both.error_code) == (400, "request.invalid")
    assert "exactly one of entrypoint and workload" in both.document["error"]["message"]

    wrong_type = api.request(
        "POST", "/v1/jobs", json={"name": "jobs-bad", "workload": "w", "gpus": "2"}
    )
    assert wrong_type.status == 400
    assert "gpus" in wrong_type.document["error"]["message"]

    for weights in ({"cost_weight": -1}, {"carbon_weight": 1001}, {"cost_weight": "low"}):
        bad_weight = api.request(
            "POST", "/v1/jobs", json={"name": "jobs-bad", "workload": "w", **weights}
        )
        assert (bad_weight.status, bad_weight.error_code) == (400, "request.invalid")
        assert next(iter(weights)) in bad_weight.document["error"]["message"]
