"""The executor with fake jobs, on one in-process node (its API, placement and executor) in CPU
mode: success, failure and retry, a non-retryable failure, a crashed worker, cancellation,
the wall-time limit, a worker that ignores SIGTERM, and bounded log capture served by the API."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.config import NodeConfig, load_config
from node.daemon import Node
from node.localcluster import free_ports
from tests.node.executor.conftest import process_running

pytestmark = pytest.mark.integration
WAIT_S = 60.0
JOBS = "tests.node.executor.fake_jobs"


def _config(tmp_path: Path, **settings: str) -> NodeConfig:
    raft_port, http_port = free_ports(2)
    overrides = {
        "region.name": "solo",
        "region.cpu_slots": "4",
        "raft.address": f"127.0.0.1:{raft_port}",
        "http.address": f"127.0.0.1:{http_port}",
        "data_dir": str(tmp_path),
        "executor.lease_ttl_s": "3",
        "executor.poll_interval_s": "0.1",
        "executor.kill_grace_s": "1",
        "executor.retry_backoff_base_s": "0.1",
        "executor.log_bytes_max": "20000",
    }
    overrides.update(settings)
    return load_config(environ={}, overrides=overrides)


def _run(tmp_path: Path, body: Callable[[Any], Awaitable[None]], **settings: str) -> None:
    config = _config(tmp_path, **settings)

    async def main() -> None:
        node = Node(config)
        await node.start()
        try:
            async with aiohttp.ClientSession(f"http://{config.http.address}") as http:
                api = _Api(http)
                await api.until(lambda: api.get("/v1/regions"), lambda r: r["items"])
                await body(api)
        finally:
            await node.stop()

    asyncio.run(main())


class _Api:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http

    async def get(self, path: str) -> Any:
        async with self.http.get(path) as answer:
            return await answer.json()

    async def submit(self, function: str, **spec: Any) -> str:
        body = {"name": function, "entrypoint": f"{JOBS}:{function}", **spec}
        async with self.http.post("/v1/jobs", json=body) as answer:
            document = await answer.json()
            assert answer.status == 201, document
            job_id: str = document["job_id"]
            return job_id

    async def until(self, fetch: Callable[[], Awaitable[Any]], test: Callable[[Any], Any]) -> Any:
        deadline_s = time.monotonic() + WAIT_S
        while time.monotonic() < deadline_s:
            value = await fetch()
            if test(value):
                return value
            await asyncio.sleep(0.05)
        raise AssertionError(f"not within {WAIT_S} s; last: {value}")

    async def finished(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = await self.until(
            lambda: self.get(f"/v1/jobs/{job_id}"),
            lambda job: job["state"] in ("succeeded", "failed", "cancelled"),
        )
        return job

    async def running(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = await self.until(
            lambda: self.get(f"/v1/jobs/{job_id}"),
            lambda job: job["tasks"][0]["state"] == "running" and job["tasks"][0]["done"] > 0,
        )
        return job


def test_a_job_succeeds_and_its_output_is_served_as_logs(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        job_id = await api.submit("succeed")
        job = await api.finished(job_id)
        assert job["state"] == "succeeded"
        assert json.loads(job["tasks"][0]["result"]) == {"answer": 42, "attempt": 1}
        logs = await api.get(f"/v1/jobs/{job_id}/logs")
        assert "hello from task 0 attempt 1" in logs["log"]

    _run(tmp_path, body)


def test_the_directories_a_node_makes_for_its_data__are_its_own_whatever_the_umask(
    tmp_path: Path,
) -> None:
    # The Raft journal and snapshot (every tenant's keys and jobs) and the jobs' logs: the
    # node's alone; the audit log: its group's too. pysyncobj and the audit handler make their
    # files with the umask's mode, so the directory is what keeps others out.
    data_dir = tmp_path / "data"
    previous = os.umask(0o022)
    try:

        async def body(api: _Api) -> None:
            job_id = await api.submit("succeed")
            assert (await api.finished(job_id))["state"] == "succeeded"

        _run(tmp_path, body, data_dir=str(data_dir))
    finally:
        os.umask(previous)
    modes = {
        name: stat.S_IMODE((data_dir / name).stat().st_mode) for name in ("raft", "logs", "audit")
    }
    assert modes == {"raft": 0o700, "logs": 0o700, "audit": 0o750}


def test_a_finished_task_shows_the_progress_it_ended_with(tmp_path: Path) -> None:
    """Progress reaches the cluster with each heartbeat; a task that ended between two showed
    where it was at the last one (a finished job at 1048576/10000000)."""

    async def body(api: _Api) -> None:
        job = await api.finished(await api.submit("count_to", args={"n": 30}))
        assert job["state"] == "succeeded", job
        assert (job["tasks"][0]["done"], job["tasks"][0]["total"]) == (30, 30), job

    _run(tmp_path, body)


def test_a_job_does_not_inherit_the_nodes_xr_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node given its cluster secret (or a client token) in its environment passed it to every
    job, whose log its tenant reads: a tenant's job could print the secret and so pose as a
    member of the cluster."""
    monkeypatch.setenv("XR_RAFT_CLUSTER_SECRET", "cluster-secret-canary")
    monkeypatch.setenv("XR_TOKEN", "operator-token-canary")
    monkeypatch.setenv("TEST_PASSED_ON", "yes")

    async def body(api: _Api) -> None:
        job_id = await api.submit("show_environment")
        job = await api.finished(job_id)
        assert job["state"] == "succeeded"
        names = json.loads(job["tasks"][0]["result"])["names"]
        # The worker's own two, and what is not the node's.
        assert names == ["TEST_PASSED_ON", "XR_CONTROL_FD", "XR_TASK"]
        logs = (await api.get(f"/v1/jobs/{job_id}/logs"))["log"]
        assert "TEST_PASSED_ON=yes" in logs
        assert "canary" not in logs

    _run(tmp_path, body)


def test_a_job_s_checkpoint_interval_and_the_kill_grace_reach_its_worker(tmp_path: Path) -> None:
    """`checkpoint_interval_s` was accepted, checked and stored, and then went nowhere. The
    worker ends itself `executor.kill_grace_s` after its executor is gone."""

    async def body(api: _Api) -> None:
        job_id = await api.submit("show_task_settings", checkpoint_interval_s=600)
        job = await api.finished(job_id)
        assert job["state"] == "succeeded", job
        result = json.loads(job["tasks"][0]["result"])
        assert result == {"checkpoint_interval_s": 600, "kill_grace_s": 1.0}

    _run(tmp_path, body)


def test_a_failing_job_is_retried_up_to_max_attempts(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        recovers = await api.submit("fail_first_attempts", args={"succeed_on": 3}, max_attempts=3)
        gives_up = await api.submit("fail_first_attempts", args={"succeed_on": 9}, max_attempts=2)
        job = await api.finished(recovers)
        assert job["state"] == "succeeded"
        assert [a["outcome"] for a in job["tasks"][0]["attempts"]] == [
            "failed",
            "failed",
            "succeeded",
        ]
        job = await api.finished(gives_up)
        assert job["state"] == "failed"
        assert len(job["tasks"][0]["attempts"]) == 2
        assert "fails on purpose" in job["tasks"][0]["error"]

    _run(tmp_path, body)


def test_a_non_retryable_failure_ends_the_job_at_once(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        job = await api.finished(await api.submit("refuse", max_attempts=5))
        assert job["state"] == "failed"
        assert len(job["tasks"][0]["attempts"]) == 1
        assert "bad input" in job["tasks"][0]["error"]

    _run(tmp_path, body)


def test_a_crashed_worker_is_a_retryable_failure_with_its_output(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        job = await api.finished(await api.submit("crash", max_attempts=2))
        assert job["state"] == "failed"
        task = job["tasks"][0]
        assert len(task["attempts"]) == 2
        assert "code 7" in task["error"] and "about to crash" in task["error"]

    _run(tmp_path, body)


def test_a_worker_killed_by_a_signal_is_said_to_be(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        job = await api.finished(await api.submit("kill_itself", max_attempts=1))
        assert job["state"] == "failed"
        error = job["tasks"][0]["error"]
        assert error.startswith("worker killed by SIGKILL without a result"), error
        assert "about to be killed" in error

    _run(tmp_path, body)


def test_what_a_job_leaves_running_neither_holds_its_task_nor_outlives_it(tmp_path: Path) -> None:
    """A thread the job left running kept its worker alive (the task ran on, holding its slot,
    until the thread ended or the wall time failed it), and a child process it started ran on
    after the task's end."""

    async def body(api: _Api) -> None:
        job = await api.finished(await api.submit("leave_behind"))
        assert job["state"] == "succeeded", job
        child = json.loads(job["tasks"][0]["result"])["child"]
        await api.until(
            lambda: asyncio.to_thread(process_running, child), lambda running: not running
        )

    _run(tmp_path, body)


def test_a_cancelled_job_is_told_it_was_cancelled(tmp_path: Path) -> None:
    """The executor sent SIGTERM with the stop message; the worker's handler often set the
    reason "signal" first (after which a job expects to run again), and the first reason
    wins. It did so nearly always for a job busy in Python: the handler runs in the thread that
    holds the interpreter's lock, while the thread that reads the message waits for it. Several
    times, since it is a race."""

    async def body(api: _Api) -> None:
        for _ in range(6):
            job_id = await api.submit("compute_until_stopped")
            await api.running(job_id)
            async with api.http.post(f"/v1/jobs/{job_id}/cancel", json={}) as answer:
                assert answer.status == 200
            logs = await api.until(
                functools.partial(api.get, f"/v1/jobs/{job_id}/logs"),
                lambda logs: "stopped on request (" in logs["log"],
            )
            assert "stopped on request (cancelled)" in logs["log"], logs["log"]

    _run(tmp_path, body)


def test_cancel_stops_a_running_worker(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        job_id = await api.submit("run_until_stopped")
        await api.running(job_id)
        async with api.http.post(f"/v1/jobs/{job_id}/cancel", json={}) as answer:
            assert answer.status == 200
        job = await api.finished(job_id)
        assert job["state"] == "cancelled"
        assert job["tasks"][0]["attempts"][0]["outcome"] == "cancelled"

    _run(tmp_path, body)


def test_the_wall_time_limit_fails_the_task_without_retry(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        job_id = await api.submit("run_until_stopped", wall_time_limit_s=1, max_attempts=3)
        job = await api.finished(job_id)
        assert job["state"] == "failed"
        assert len(job["tasks"][0]["attempts"]) == 1
        assert "wall time limit" in job["tasks"][0]["error"]

    _run(tmp_path, body)


def test_a_job_that_ignores_sigterm_past_its_wall_time__fails_once_and_is_not_run_again(
    tmp_path: Path,
) -> None:
    """The lease was no longer renewed once the worker was asked to stop; with a kill grace as
    long as a lease (the defaults: 10 s each), it expired first, the task ran again elsewhere
    and its failure was refused as stale: a job that ignored SIGTERM was never stopped by its
    wall time."""

    async def body(api: _Api) -> None:
        job_id = await api.submit("ignore_stop", wall_time_limit_s=1, max_attempts=3)
        job = await api.finished(job_id)
        task = job["tasks"][0]
        assert job["state"] == "failed" and len(task["attempts"]) == 1, job
        assert "wall time limit of 1 s reached" in task["error"], task["error"]

    # A grace twice the lease: the lease must be renewed while the worker is made to stop.
    _run(tmp_path, body, **{"executor.kill_grace_s": "6"})


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        job_id = await api.submit("ignore_stop")
        await api.running(job_id)
        async with api.http.post(f"/v1/jobs/{job_id}/cancel", json={}) as answer:
            assert answer.status == 200
        await api.finished(job_id)
        # The slot comes back: another job runs to the end.
        job = await api.finished(await api.submit("succeed"))
        assert job["state"] == "succeeded"

    _run(tmp_path, body, **{"region.cpu_slots": "1"})


def test_captured_output_is_bounded_and_keeps_the_end(tmp_path: Path) -> None:
    async def body(api: _Api) -> None:
        job_id = await api.submit("noisy", args={"lines": 2000, "burst": 100_000})
        job = await api.finished(job_id)
        assert job["state"] == "succeeded"
        logs = await api.get(f"/v1/jobs/{job_id}/logs?tail_bytes=1000000")
        assert logs["size_bytes"] <= 20000
        assert "earlier output dropped" in logs["log"]
        assert logs["log"].rstrip().endswith("last line")

    _run(tmp_path, body)


def test_the_executor_packs_memory_shares_onto_one_device_and_keeps_slots_for_cpu_tasks(
    tmp_path: Path,
) -> None:
    from typing import cast

    from node.executor.executor import Executor
    from raftstore.store import RaftStore
    from xrcore.commands import JobSpec

    config = _config(tmp_path, **{"region.cpu_slots": "1"})
    executor = Executor(config, cast(RaftStore, None), gpu_memory_mb=[16_000, 16_000])

    def spec(**fields: Any) -> JobSpec:
        return JobSpec(name="t", workload="gemm", **fields)

    shares = [executor._reserve(spec(gpu_memory_mb=6_000)) for _ in range(3)]
    assert [share.devices if share else None for share in shares] == [(0,), (0,), (1,)]
    assert all(share is not None and share.shared_memory_mb == 6_000 for share in shares)
    assert executor._reserve(spec(gpus=1)) is None  # both devices are shared now
    cpu = executor._reserve(spec())
    assert cpu is not None and cpu.devices == ()
    assert executor._reserve(spec()) is None  # the one CPU slot is taken
    for grant in (*shares, cpu):
        assert grant is not None
        executor._release(grant)
    whole = executor._reserve(spec(gpus=2))
    assert whole is not None and whole.devices == (0, 1)


def test_a_long_failure_keeps_what_failed_and_the_end_of_its_traceback() -> None:
    """The executor kept the last 1,024 characters of a failure: a long traceback lost its
    first line, the error it was of."""
    from node.executor.executor import fit_message
    from xrcore.limits import MESSAGE_BYTES_MAX

    assert fit_message("short\nstory") == "short\nstory"
    frames = "".join(f'  File "job.py", line {n}, in step\n    é = 1\n' for n in range(400))
    text = "ValueError: the input is bad\nTraceback (most recent call last):\n" + frames + "END"
    fitted = fit_message(text)
    assert len(fitted.encode()) <= MESSAGE_BYTES_MAX
    assert fitted.startswith("ValueError: the input is bad\n[...]\n") and fitted.endswith("END")
