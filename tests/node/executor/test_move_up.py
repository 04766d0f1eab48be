"""Moving up end to end, in two CPU-mode regions on loopback (docs/scheduler.md, step 6).

r1's devices are twice as fast as r0's (`speed` label) and each region has one slot. A long job
fills r1, a second one starts in r0; when the first is cancelled, r1 is free and the leader's pass
asks the second to yield for r1 (`Preemption.moving_to`). It checkpoints, stops, is placed in r1
and resumes there from that checkpoint. The thresholds are lowered so that a job estimated at an
hour (no run of its entrypoint has completed) moves at once; nothing asserts on time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from node.localcluster import LocalCluster
from tests.node.executor.test_failover import _finished, _job, _running, _until
from xrcore.client import Client

pytestmark = pytest.mark.integration

WAIT_S = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = Path(tmp_path_factory.mktemp("move-up"))
    local = LocalCluster(
        root,
        size=2,
        settings={
            "executor.lease_ttl_s": "5",
            "executor.poll_interval_s": "0.2",
            "executor.checkpoint_dir": str(root / "checkpoints"),
            "region.cpu_slots": "1",
            "scheduler.move_up_min_run_s": "0",
            "scheduler.move_up_saving_min_s": "1",
            "scheduler.move_up_saving_fraction": "0.1",
        },
        region_settings={"r1": {"region.labels": "speed=2"}},
    )
    try:
        local.start()
        yield local
    finally:
        local.kill()


def _long(client: Client, name: str) -> str:
    args = {"steps": 6000, "checkpoint_every": 25, "hidden": 32, "batch": 64, "seed": 7}
    return client.jobs.submit(name, workload="mlp_train", args=args, max_attempts=5)


def test_a_running_job_moves_up_to_a_faster_region_and_resumes_there(
    cluster: LocalCluster,
) -> None:
    with Client(cluster.urls, timeout_s=20) as client:
        _until(
            lambda: sum(region.healthy for region in client.regions.list()) == 2,
            "both regions are registered and healthy",
        )
        first = _long(client, "first")
        assert _running(client, first).region == "r1"  # the faster region, while both are free
        second = _long(client, "second")
        assert _running(client, second).region == "r0"  # r1's one slot is taken
        client.jobs.cancel(first)

        def moved() -> bool:
            task = _job(client, second).tasks[0]
            return task.state == "running" and task.region == "r1" and task.done > 0

        _until(moved, "the second job runs in r1")
        client.jobs.cancel(second)
        job = _finished(client, second)
    task = job.tasks[0]
    first_attempt, *_, last_attempt = task.attempts
    assert (first_attempt.region, first_attempt.outcome) == ("r0", "preempted")
    assert last_attempt.region == "r1"
    # It resumed from the checkpoint it wrote as it yielded, and no failure was counted.
    assert last_attempt.restored_step is not None and last_attempt.restored_step > 0
    assert task.failures == 0
