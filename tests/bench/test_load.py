"""bench/_load.py: the closed-loop load generator's CPU measurement (bench/api.py and
bench/durability.py report the members' CPU time per operation next to their throughput)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from bench._load import CellResult, Worker, process_cpu_s, run_cell, with_descendants


def _spin(seconds: float) -> None:
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


def test_process_cpu_s__counts_this_process_and_sums_several() -> None:
    before = process_cpu_s([os.getpid()])
    _spin(0.3)
    after = process_cpu_s([os.getpid()])
    assert before is not None and after is not None
    assert after - before > 0
    # Two processes: this one and a child that only sleeps; the sum is at least this one's.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        both = process_cpu_s([os.getpid(), child.pid])
        assert both is not None and both >= after
    finally:
        child.kill()
        child.wait()


def _starts(code: str) -> str:
    """Python code that starts a process running `code`, then sleeps."""
    return (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {code!r}])\n"
        "time.sleep(30)\n"
    )


def test_with_descendants__finds_a_childs_child_whose_cpu_then_counts() -> None:
    # A parent that sleeps, whose child starts a grandchild that spins for 0.3 s of CPU and then
    # sleeps: through the parent alone almost nothing is counted, with its descendants the spin.
    spin = (
        "import time\n"
        "until = time.process_time() + 0.3\n"
        "while time.process_time() < until: pass\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", _starts(_starts(spin))])
    try:
        deadline_s = time.monotonic() + 20.0
        while True:
            tree = with_descendants([parent.pid])
            together = process_cpu_s(tree) if len(tree) == 3 else None
            if together is not None and together >= 0.3:
                break
            assert time.monotonic() < deadline_s, f"the grandchild never spun: {tree}"
            time.sleep(0.01)
        assert parent.pid in tree
        alone = process_cpu_s([parent.pid])
        assert alone is not None and alone < 0.3
    finally:
        for pid in with_descendants([parent.pid]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        parent.wait()


def test_process_cpu_s__none_for_a_process_that_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_cpu_s([os.getpid(), child.pid]) is None


class _Get:
    async def prepare(self, worker: Worker) -> None:
        pass

    async def run(self, worker: Worker) -> None:
        await worker.request("GET", "/")

    async def finish(self, worker: Worker) -> None:
        pass


def _error_code(status: int, document: Any) -> str:
    return str(status)


def _small_cell(url: str) -> Callable[..., Awaitable[CellResult]]:
    """`run_cell` of 2 workers doing GET / on `url` for half a second; give the rest."""
    return functools.partial(
        run_cell,
        _Get(),
        [url],
        concurrency=2,
        warmup_s=0.1,
        duration_s=0.5,
        request_timeout_s=5.0,
        error_code=_error_code,
    )


@contextlib.asynccontextmanager
async def _served(path: str, handler: Any) -> AsyncIterator[str]:
    """An aiohttp server on loopback answering GET `path` with `handler`; yields its URL."""
    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.integration
def test_run_cell__reports_cpu_per_operation_only_when_asked() -> None:
    async def main() -> tuple[Any, Any]:
        async def hello(request: web.Request) -> web.Response:
            _spin(0.0005)  # The "member" (this process) spends CPU on every request.
            return web.json_response({})

        async with _served("/", hello) as url:
            cell = _small_cell(url)
            measured = await cell(cpu_pids=[os.getpid()])
            plain = await cell()
        return measured, plain

    measured, plain = asyncio.run(main())
    assert measured.operations > 0 and measured.failed == 0
    # The server and the load generator are one process here, so each counts the other's CPU
    # too: both are at least the 500 us each request spends in the handler.
    assert measured.members_cpu_us_per_op is not None and measured.members_cpu_us_per_op >= 400
    assert measured.driver_cpu_us_per_op is not None and measured.driver_cpu_us_per_op >= 400
    document = measured.as_dict()
    assert document["members_cpu_us_per_op"] == measured.members_cpu_us_per_op
    assert plain.members_cpu_us_per_op is None and plain.driver_cpu_us_per_op is None


@pytest.mark.integration
def test_run_cell__counts_syncs_in_the_window_per_operation_only_when_asked() -> None:
    served = [0]

    async def main() -> tuple[Any, Any, Any]:
        async def hello(request: web.Request) -> web.Response:
            served[0] += 1
            return web.json_response({})

        async def one_sync_per_request() -> float | None:
            return float(served[0])

        reads = [0]

        async def unreadable_at_the_end() -> float | None:
            reads[0] += 1
            return 0.0 if reads[0] == 1 else None

        async with _served("/", hello) as url:
            cell = _small_cell(url)
            counted = await cell(sync_count=one_sync_per_request)
            unreadable = await cell(sync_count=unreadable_at_the_end)
            plain = await cell()
        return counted, unreadable, plain

    counted, unreadable, plain = asyncio.run(main())
    # The server "syncs" once per request; only requests in flight at the window's edges
    # (at most the 2 workers' at each) can be counted on one side and not the other.
    assert counted.operations > 20 and counted.syncs_per_op is not None
    assert abs(counted.syncs_per_op * counted.operations - counted.operations) <= 4
    assert counted.as_dict()["syncs_per_op"] == counted.syncs_per_op
    assert unreadable.operations > 0 and unreadable.syncs_per_op is None
    assert plain.syncs_per_op is None


@pytest.mark.integration
def test_metric_sum__adds_a_sample_over_members_and_is_none_when_one_lacks_it() -> None:
    from bench.api import ETCD_SYNCS_SAMPLE, XR_SYNCS_SAMPLE, metric_sum

    pages = {
        "/a/metrics": (
            "# TYPE xr_raft_journal_syncs counter\n"
            'xr_raft_journal_syncs_total{region="r0"} 5.0\n'
            "# TYPE etcd_disk_wal_fsync_duration_seconds histogram\n"
            'etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"} 9\n'
            "etcd_disk_wal_fsync_duration_seconds_sum 0.25\n"
            "etcd_disk_wal_fsync_duration_seconds_count 9\n"
        ),
        "/b/metrics": (
            '# TYPE xr_raft_journal_syncs counter\nxr_raft_journal_syncs_total{region="r1"} 7\n'
        ),
    }

    async def main() -> list[float | None]:
        async def page(request: web.Request) -> web.Response:
            if request.path == "/broken/metrics":
                return web.Response(status=500)
            return web.Response(text=pages[request.path])

        async with _served("/{member}/metrics", page) as base:
            with socket_closed() as gone:
                return [
                    await metric_sum([f"{base}/a", f"{base}/b"], XR_SYNCS_SAMPLE),
                    await metric_sum([f"{base}/a"], ETCD_SYNCS_SAMPLE),
                    await metric_sum([f"{base}/a", f"{base}/b"], ETCD_SYNCS_SAMPLE),
                    await metric_sum([f"{base}/a", f"{base}/broken"], XR_SYNCS_SAMPLE),
                    await metric_sum([f"{base}/a", gone], XR_SYNCS_SAMPLE),
                ]

    assert asyncio.run(main()) == [12.0, 9.0, None, None, None]


@contextlib.contextmanager
def socket_closed() -> Iterator[str]:
    """The URL of a loopback port nothing listens on while the block runs."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{probe.getsockname()[1]}"
