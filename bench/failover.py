"""Job failover: kill -9 the region running a job and time how long until the job runs again
elsewhere and until it completes.

Three CPU-mode regions on loopback (`LocalCluster`) with a shared checkpoint directory. Each
trial submits an `mlp_train` job, waits until it has committed a checkpoint, kills the region
running it, then measures (from the kill) the time until a new attempt runs in another region and
the time until the job succeeds; the killed region is restarted between trials. The target is
running again within the lease TTL + 2 s at the median. Run as

    python bench/failover.py [--trials 5] [--lease-ttl-s 5]

The last line printed is one JSON object, like the other benchmarks. Ctrl-C or SIGTERM stops
the cluster; its temporary directory is removed however the run ends.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._signals import kill_cluster, run_main, shielded
from node.localcluster import LocalCluster
from xrcore.client import Client

TRIAL_TIMEOUT_S = 180.0


def _until(condition: Callable[[], Any], what: str) -> Any:
    deadline_s = time.monotonic() + TRIAL_TIMEOUT_S
    while time.monotonic() < deadline_s:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError(f"not within {TRIAL_TIMEOUT_S} s: {what}")


def _trial(cluster: LocalCluster, client: Client, number: int, steps: int) -> dict[str, float]:
    job_id = client.jobs.submit(
        f"failover-{number}",
        workload="mlp_train",
        args={"steps": steps, "checkpoint_every": 50, "hidden": 64, "batch": 64, "seed": number},
        max_attempts=5,
    )

    def running_with_checkpoint() -> Any:
        job = client.jobs.get(job_id)
        task = None if job is None else job.tasks[0]
        return task if task is not None and task.state == "running" and task.checkpoint else None

    task = _until(running_with_checkpoint, "the job runs and commits a checkpoint")
    victim = cluster.node(task.region)
    victim.kill()
    killed_s = time.monotonic()

    def moved() -> Any:
        job = client.jobs.get(job_id)
        task = None if job is None else job.tasks[0]
        return (
            task is not None and len(task.attempts) >= 2 and task.state in ("running", "succeeded")
        )

    _until(moved, "a new attempt runs elsewhere")
    running_again_s = time.monotonic() - killed_s

    def finished() -> Any:
        job = client.jobs.get(job_id)
        return (
            job if job is not None and job.state in ("succeeded", "failed", "cancelled") else None
        )

    job = _until(finished, "the job finishes")
    completed_s = time.monotonic() - killed_s
    victim.start()
    cluster.wait_ready(timeout_s=60)
    final = job.tasks[0]
    print(
        f"trial {number}: killed {victim.region}; running again in {running_again_s:.2f} s "
        f"on {final.attempts[-1].region} from step {final.attempts[-1].restored_step}; "
        f"completed in {completed_s:.2f} s ({job.state})",
        flush=True,
    )
    if job.state != "succeeded":
        raise RuntimeError(f"trial {number}: the job ended {job.state}: {final.error}")
    return {"running_again_s": running_again_s, "completed_s": completed_s}


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="xr-bench-failover-") as directory:
        return _run(arguments, Path(directory))


def _run(arguments: argparse.Namespace, root: Path) -> dict[str, Any]:
    settings = {
        "executor.lease_ttl_s": str(arguments.lease_ttl_s),
        "executor.poll_interval_s": "0.2",
        "executor.checkpoint_dir": str(root / "checkpoints"),
        "executor.kill_grace_s": "3",
    }
    cluster = LocalCluster(root, size=3, settings=settings)
    print(f"3 CPU-mode regions, lease TTL {arguments.lease_ttl_s} s, {arguments.trials} trials")
    results = []
    try:
        cluster.start(timeout_s=60)
        with Client(cluster.urls, timeout_s=20) as client:
            for number in range(1, arguments.trials + 1):
                results.append(_trial(cluster, client, number, arguments.steps))
    finally:
        with shielded():
            kill_cluster(cluster)
    again = [result["running_again_s"] for result in results]
    done = [result["completed_s"] for result in results]
    target_s = arguments.lease_ttl_s + 2.0
    median_s = statistics.median(again)
    print(
        f"running again elsewhere: median {median_s:.2f} s, max {max(again):.2f} s; "
        f"target: median within TTL + 2 s = {target_s:.1f} s -> "
        f"{'met' if median_s <= target_s else 'not met'}"
    )
    print(
        f"completed after the kill: median {statistics.median(done):.2f} s, max {max(done):.2f} s"
    )
    return {
        "bench": "failover",
        "lease_ttl_s": arguments.lease_ttl_s,
        "trials": len(results),
        "running_again_median_s": round(median_s, 3),
        "running_again_max_s": round(max(again), 3),
        "completed_median_s": round(statistics.median(done), 3),
        "target_s": target_s,
        "met": median_s <= target_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--lease-ttl-s", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=2000, help="mlp_train steps per job")
    arguments = parser.parse_args(argv)
    if arguments.trials < 1 or not 1 <= arguments.lease_ttl_s < math.inf or arguments.steps < 1:
        parser.error("--trials, --steps and --lease-ttl-s (finite) must be at least 1")
    return run_main(lambda: _main(arguments))


def _main(arguments: argparse.Namespace) -> int:
    print(json.dumps(run(arguments)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
