"""A job queue: jobs submitted through the client, run by the nodes' executors, each reporting
its completion with its attempt's fencing token to a protected resource in the harness.

`enqueue` submits a job named by a unique key (entrypoint `queue_job:run`); `ok` once the
cluster stored it. The resource records a `complete` for every completion it receives (`ok` when
it accepts the token). After the cluster heals, `read-final` waits for every job to finish and
reads each job's state and the token of the attempt that completed it, with the ids of every job
of that name. The checker verifies that no acknowledged job is lost, each finished job was
completed, no stale attempt's completion was accepted after a newer one's, and no key was served
by two jobs (an enqueue applied twice).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from xr_jepsen.checkers import CheckResult, QueueChecker
from xr_jepsen.history import Op
from xr_jepsen.workloads.base import Completion, Context, Planned, WorkerState, outcome_of
from xrcore.client import AsyncClient, Job
from xrcore.errors import Timeout, XrError

__all__ = ["QueueWorkload"]

ENTRYPOINT = "xr_jepsen.workloads.queue_job:run"
# Enough attempts to outlive the faults of a run; each failed one waits a short backoff.
ATTEMPTS_MAX = 20
# How long read-final waits for the queue to drain before it reads what it finds.
DRAIN_S = 45.0
PAGE_LIMIT = 500


@dataclass
class QueueWorkload:
    name: str = "queue"
    workers: int = 2
    # Jobs are enqueued slowly: each attempt starts a worker process.
    pause_s_mean: float = 1.0
    # Seconds a job works before it reports its completion.
    work_s: float = 0.5

    def plan(self, state: WorkerState) -> Planned:
        return Planned(f="enqueue", value=f"j{state.unique()}")

    async def invoke(
        self, client: AsyncClient, planned: Planned, state: WorkerState, context: Context
    ) -> Completion:
        if planned.f == "read-final":
            return await self._read_final(client)
        try:
            await client.jobs.submit(
                planned.value,
                entrypoint=ENTRYPOINT,
                args={
                    "key": planned.value,
                    "resource": context.resource_url,
                    "work_s": self.work_s,
                },
                max_attempts=ATTEMPTS_MAX,
            )
        except XrError as error:
            return outcome_of(error)
        return Completion(type="ok", value=planned.value)

    async def _read_final(self, client: AsyncClient) -> Completion:
        loop = asyncio.get_running_loop()
        drained_by_s = loop.time() + DRAIN_S
        try:
            summaries = await _all_jobs(client)
            for summary in summaries:
                left_s = drained_by_s - loop.time()
                if not summary.finished and left_s > 0:
                    # The queue drains while we wait for the first unfinished job; a job still
                    # unfinished at the deadline is read as it is, for the checker to judge.
                    with contextlib.suppress(Timeout):
                        await client.jobs.wait(summary.job_id, timeout_s=left_s)
            states: dict[str, Any] = {}
            for summary in summaries:
                job = await client.jobs.get(summary.job_id)
                if job is not None:
                    _add_job(states, job)
        except XrError as error:
            return outcome_of(error, read=True)
        return Completion(type="ok", value=states)

    def observe(self, planned: Planned, completion: Completion, state: WorkerState) -> None:
        pass

    def final_plan(self, state: WorkerState, last: Completion | None) -> Planned | None:
        if last is not None and last.type == "ok":
            return None
        return Planned(f="read-final", value=None)

    def check(self, ops: list[Op]) -> CheckResult:
        return QueueChecker().check(ops)


async def _all_jobs(client: AsyncClient) -> list[Any]:
    jobs: list[Any] = []
    after: str | None = None
    while True:
        page = await client.jobs.list(limit=PAGE_LIMIT, after=after)
        jobs.extend(page.items)
        if page.next is None:
            return jobs
        after = page.next


def _add_job(states: dict[str, Any], job: Job) -> None:
    """Adds `job` to the final read's entry for its name: `{"state", "token", "job_ids"}`. Every
    job of a name is kept in `job_ids` (two jobs of one name are an enqueue applied twice, which
    the checker flags); state and token are the first succeeded one's, else the first one's."""
    entry = {"state": job.state, "token": _completing_token(job)}
    known = states.get(job.name)
    if known is None:
        states[job.name] = {**entry, "job_ids": [job.job_id]}
        return
    known["job_ids"].append(job.job_id)
    if known["state"] != "succeeded" and job.state == "succeeded":
        known.update(entry)


def _completing_token(job: Job) -> int | None:
    """The token of the attempt that completed the job's task, or None."""
    for task in job.tasks:
        for attempt in task.attempts:
            if attempt.outcome == "succeeded":
                return attempt.token
    return None
