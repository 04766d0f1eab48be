"""The GPU check: inventory, then `gemm` and `fft` run through the executor against the same
kernels called directly, and dispatch latency. Made for a machine with a GPU (finishes within
5 minutes); without one it runs the NumPy path and says so.

For each workload it first calls the workload function directly in this process (the reference)
with enough repeats for about `--seconds` seconds, then submits the same work as a job to a
one-region cluster on loopback. The overhead compares the kernel loop's own timing (the
workload reports it) in the worker with the direct call; the target is under 5 % for runs of
10 s. The end-to-end overhead (submit to done against the direct call, so it includes dispatch,
process start and the commits) is printed beside it. Dispatch latency is the time from
submitting a job to its first progress report, median of `--dispatch-trials`.

    python bench/gpu_check.py [--seconds 10] [--dispatch-trials 5]

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

from bench._signals import kill_cluster, run_main, shielded  # noqa: E402
from node.executor.checkpoints import FileCheckpointStore  # noqa: E402
from node.executor.context import JobContext  # noqa: E402
from node.executor.inventory import detect  # noqa: E402
from node.executor.protocol import Message, TaskDescription  # noqa: E402
from node.executor.workloads import WORKLOADS  # noqa: E402
from node.localcluster import LocalCluster  # noqa: E402
from xrcore.client import Client  # noqa: E402

TIMEOUT_S = 240.0
POLL_S = 0.005


class _Discard:
    """Stands in for the executor when a workload is called directly."""

    def send(self, message: Message) -> None:
        pass


def _direct(
    workload: str, args: dict[str, Any], device: str, root: Path
) -> tuple[float, dict[str, Any]]:
    task = TaskDescription(
        job_id="direct", task_index=0, attempt=1, token=1, workload=workload, args=args,
        checkpoint_dir=str(root), device=device,
    )  # fmt: skip
    context = JobContext(task, sender=_Discard(), store=FileCheckpointStore(root))
    started_s = time.perf_counter()
    result = WORKLOADS[workload](context)
    return time.perf_counter() - started_s, result


def _calibrate(workload: str, n: int, device: str, root: Path, seconds: float) -> int:
    """Repeats that take about `seconds` when called directly."""
    _, result = _direct(workload, {"n": n, "repeats": 3}, device, root)
    probe_s = float(result["seconds"]) / 3
    return max(3, int(seconds / max(probe_s, 1e-6)))


def _poll(client: Client, job_id: str, test: Any, what: str, *, every_s: float = POLL_S) -> Any:
    deadline_s = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline_s:
        job = client.jobs.get(job_id)
        if job is not None and test(job):
            return job
        time.sleep(every_s)
    raise RuntimeError(f"not within {TIMEOUT_S} s: {what}")


def _through_executor(
    client: Client, workload: str, args: dict[str, Any], gpus: int
) -> tuple[float, float, dict[str, Any]]:
    """(dispatch s, end-to-end s, result): submit to first progress report, submit to done."""
    submitted_s = time.monotonic()
    job_id = client.jobs.submit(f"check-{workload}", workload=workload, args=args, gpus=gpus)
    _poll(
        client,
        job_id,
        lambda job: job.tasks[0].done > 0 or job.state in ("succeeded", "failed", "cancelled"),
        "the first progress report",
    )
    dispatch_s = time.monotonic() - submitted_s
    # Rarely while the kernel runs: each poll is a read through the log, which would take CPU
    # from the kernel on a machine without a GPU.
    job = _poll(
        client,
        job_id,
        lambda job: job.state in ("succeeded", "failed", "cancelled"),
        "done",
        every_s=0.1,
    )
    finished_s = time.monotonic()
    if job.state != "succeeded":
        raise RuntimeError(f"{workload} through the executor ended {job.state}: {job.tasks[0]}")
    result: dict[str, Any] = json.loads(job.tasks[0].result or "{}")
    return dispatch_s, finished_s - submitted_s, result


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    inventory = detect(cpu_slots=1)
    gpu = bool(inventory.gpus)
    device = "cuda:0" if gpu else "cpu"
    print(f"inventory: {inventory}")
    print(
        "device: "
        + ("GPU, CuPy path" if gpu else "no GPU here: the NumPy path runs instead (CPU mode)")
    )
    with tempfile.TemporaryDirectory(prefix="xr-gpu-check-") as directory:
        return _run(arguments, Path(directory), gpu=gpu, device=device)


def _run(arguments: argparse.Namespace, root: Path, *, gpu: bool, device: str) -> dict[str, Any]:
    sizes = {"gemm": arguments.gemm_n, "fft": arguments.fft_n}
    report: dict[str, Any] = {"bench": "gpu_check", "device": device, "workloads": {}}
    cluster = LocalCluster(
        root / "cluster",
        size=1,
        settings={"executor.poll_interval_s": "0.05", "region.cpu_slots": "1"},
    )
    try:
        cluster.start(timeout_s=60)
        with Client(cluster.urls, timeout_s=20) as client:
            for workload, n in sizes.items():
                repeats = _calibrate(workload, n, device, root, arguments.seconds)
                args = {"n": n, "repeats": repeats}
                direct_s, direct_result = _direct(workload, args, device, root)
                _, end_to_end_s, result = _through_executor(client, workload, args, int(gpu))
                # The kernels' own timing, the same loop in both: what the worker costs them.
                kernel_direct_s = float(direct_result["seconds"])
                kernel_executor_s = float(result["seconds"])
                overhead = kernel_executor_s / kernel_direct_s - 1
                end_to_end = end_to_end_s / direct_s - 1
                verdict = "met" if overhead < 0.05 else "not met"
                rate = "tflops" if workload == "gemm" else "gflops"
                print(
                    f"{workload}: n={n} repeats={repeats}: kernel {kernel_direct_s:.2f} s direct, "
                    f"{kernel_executor_s:.2f} s through the executor: overhead "
                    f"{overhead * 100:+.1f} % (target under 5 %: {verdict}); end to end "
                    f"(submit to done vs the direct call) {end_to_end * 100:+.1f} %; "
                    f"{rate} {direct_result.get(rate, 0):.3g} direct, {result.get(rate, 0):.3g} "
                    "through the executor",
                    flush=True,
                )
                report["workloads"][workload] = {
                    "n": n,
                    "repeats": repeats,
                    "kernel_direct_s": round(kernel_direct_s, 3),
                    "kernel_executor_s": round(kernel_executor_s, 3),
                    "overhead": round(overhead, 4),
                    "end_to_end_overhead": round(end_to_end, 4),
                    "met": overhead < 0.05,
                }
            dispatch = [
                _through_executor(client, "montecarlo", {"samples": 1000}, 0)[0]
                for _ in range(arguments.dispatch_trials)
            ]
    finally:
        with shielded():
            kill_cluster(cluster)
    report["dispatch_median_s"] = round(statistics.median(dispatch), 3)
    report["dispatch_max_s"] = round(max(dispatch), 3)
    print(
        f"dispatch latency (submit to first progress report, {len(dispatch)} trials): median "
        f"{statistics.median(dispatch) * 1000:.0f} ms, max {max(dispatch) * 1000:.0f} ms"
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each kernel run")
    parser.add_argument("--gemm-n", type=int, default=4096)
    parser.add_argument("--fft-n", type=int, default=4096)
    parser.add_argument("--dispatch-trials", type=int, default=5)
    arguments = parser.parse_args(argv)
    if not 0 < arguments.seconds < math.inf or arguments.dispatch_trials < 1:
        parser.error("--seconds must be positive and finite and --dispatch-trials at least 1")
    if arguments.gemm_n < 1 or arguments.fft_n < 1:
        parser.error("--gemm-n and --fft-n must be at least 1")
    return run_main(lambda: _main(arguments))


def _main(arguments: argparse.Namespace) -> int:
    print(json.dumps(run(arguments)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
