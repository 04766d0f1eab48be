"""bench/_load.py: the closed-loop load generator's CPU measurement (bench/api.py and
bench/durability.py report the members' CPU time per operation next to their throughput)."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from aiohttp import web

from bench._load import Worker, process_cpu_s, run_cell


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


@pytest.mark.integration
def test_run_cell__reports_cpu_per_operation_only_when_asked() -> None:
    async def main() -> tuple[Any, Any]:
        async def hello(request: web.Request) -> web.Response:
            _spin(0.0005)  # The "member" (this process) spends CPU on every request.
            return web.json_response({})

        app = web.Application()
        app.router.add_get("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            urls = [f"http://127.0.0.1:{port}"]
            cell = functools.partial(
                run_cell,
                _Get(),
                urls,
                concurrency=2,
                warmup_s=0.1,
                duration_s=0.5,
                request_timeout_s=5.0,
                error_code=_error_code,
            )
            measured = await cell(cpu_pids=[os.getpid()])
            plain = await cell()
        finally:
            await runner.cleanup()
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
