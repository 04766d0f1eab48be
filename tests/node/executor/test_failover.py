"""Executors in three CPU-mode regions on loopback: jobs run where they are placed, move when their
region dies, resume from their last committed checkpoint, and a zombie attempt is fenced.

Leases are short (2 s) so the tests are quick; nothing asserts on how long anything took, only
on what the log says happened.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from node.localcluster import LocalCluster, LocalNode
from xrcore.client import Client
from xrcore.client._models import Job, Task

pytestmark = pytest.mark.integration

WAIT_S = 90.0
LEASE_TTL_S = 2


def _settings(root: Path) -> dict[str, str]:
    return {
        "executor.lease_ttl_s": str(LEASE_TTL_S),
        "executor.contact_lost_limit_s": "60",
        "executor.poll_interval_s": "0.2",
        "executor.kill_grace_s": "3",
        "executor.checkpoint_dir": str(root / "checkpoints"),
        "executor.retry_backoff_base_s": "0.2",
        "region.cpu_slots": "2",
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = Path(tmp_path_factory.mktemp("executors"))
    local = LocalCluster(root, size=3, settings=_settings(root))
    try:
        local.start()
        yield local
    finally:
        local.kill()


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    for node in cluster.nodes:
        if node.paused:
            node.resume()
        if not node.running:
            node.start()
    cluster.wait_ready(timeout_s=WAIT_S)
    with Client(cluster.urls, timeout_s=20) as made:
        _until(
            lambda: sum(region.healthy for region in made.regions.list()) == len(cluster.nodes),
            "every region is registered and healthy",
        )
        yield made


def _until(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> object:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _job(client: Client, job_id: str) -> Job:
    job = client.jobs.get(job_id)
    assert job is not None
    return job


def _running(client: Client, job_id: str) -> Task:
    """The job's task once it runs and has reported progress (fails fast if it finished)."""

    def check() -> Task | None:
        job = _job(client, job_id)
        assert job.state not in ("succeeded", "failed", "cancelled"), f"finished early: {job}"
        task = job.tasks[0]
        return task if task.state == "running" and task.done > 0 else None

    found: Task = _until(check, "the task runs and reports progress")  # type: ignore[assignment]
    return found


def _finished(client: Client, job_id: str) -> Job:
    return _until(  # type: ignore[return-value]
        lambda: (job := _job(client, job_id)).state in ("succeeded", "failed", "cancelled") and job,
        f"job {job_id} finished",
    )


def _node(cluster: LocalCluster, region: str) -> LocalNode:
    return cluster.node(region)


def _mlp(client: Client, name: str, **overrides: object) -> str:
    args: dict[str, object] = {"steps": 400, "checkpoint_every": 25, "hidden": 32, "batch": 64}
    args["seed"] = 7
    args.update(overrides)
    return client.jobs.submit(name, workload="mlp_train", args=args, max_attempts=5)


def test_an_array_job_spreads_across_regions_and_completes(client: Client) -> None:
    job_id = client.jobs.submit(
        "spread", workload="montecarlo", args={"samples": 20_000}, array_size=3
    )
    job = _finished(client, job_id)
    assert job.state == "succeeded", job
    assert {task.region for task in job.tasks} == {"r0", "r1", "r2"}
    for task in job.tasks:
        assert task.result is not None and "pi" in json.loads(task.result)


def test_a_job_whose_region_is_killed_resumes_elsewhere_with_identical_weights(
    cluster: LocalCluster, client: Client
) -> None:
    reference = _finished(client, _mlp(client, "reference"))
    assert reference.state == "succeeded", reference
    job_id = _mlp(client, "failover")
    # Wait for a committed checkpoint, then kill the region running the task.
    running = _until(
        lambda: (
            (task := _job(client, job_id).tasks[0]).checkpoint is not None
            and task.state == "running"
            and task
        ),
        "a checkpoint is committed while the task runs",
    )
    victim = _node(cluster, running.region)  # type: ignore[attr-defined]
    victim.kill()
    job = _finished(client, job_id)
    victim.start()
    assert job.state == "succeeded", job
    task = job.tasks[0]
    assert len(task.attempts) >= 2
    assert task.attempts[0].outcome == "lease_expired"
    resumed = task.attempts[-1]
    assert resumed.region != victim.region
    assert resumed.restored_step is not None and resumed.restored_step > 0
    assert task.result is not None and reference.tasks[0].result is not None
    weights = json.loads(task.result)["weights_sha256"]
    assert weights == json.loads(reference.tasks[0].result)["weights_sha256"]


def test_a_paused_region_s_attempt_is_fenced_and_the_new_attempt_s_result_stands(
    cluster: LocalCluster, client: Client
) -> None:
    job_id = _mlp(client, "zombie", steps=6000)
    running = _running(client, job_id)
    assert running.region is not None
    paused = _node(cluster, running.region)
    paused.pause()
    try:
        _until(
            lambda: len(_job(client, job_id).tasks[0].attempts) >= 2,
            "a second attempt starts after the lease expires",
        )
    finally:
        paused.resume()
    job = _finished(client, job_id)
    assert job.state == "succeeded", job
    task = job.tasks[0]
    assert task.attempts[0].outcome == "lease_expired"
    assert task.attempts[-1].region != paused.region
    # Exactly one attempt succeeded: the old one's late updates were refused.
    assert [attempt.outcome for attempt in task.attempts].count("succeeded") == 1


def test_cancelling_a_running_job_stops_its_worker(client: Client) -> None:
    job_id = _mlp(client, "cancelled", steps=100_000)
    _running(client, job_id)
    client.jobs.cancel(job_id, reason="test")
    job = _finished(client, job_id)
    assert job.state == "cancelled"
    assert job.tasks[0].attempts[-1].outcome == "cancelled"


def test_a_control_plane_outage_longer_than_the_ttl_neither_kills_nor_duplicates_jobs(
    cluster: LocalCluster, client: Client
) -> None:
    job_id = _mlp(client, "outage", steps=6000)
    running = _running(client, job_id)
    others = [node for node in cluster.nodes if node.region != running.region]
    for node in others:
        node.pause()
    time.sleep(LEASE_TTL_S * 3)  # the outage: no quorum anywhere, longer than the lease TTL
    for node in others:
        node.resume()
    job = _finished(client, job_id)
    assert job.state == "succeeded", job
    assert len(job.tasks[0].attempts) == 1, job.tasks[0].attempts
