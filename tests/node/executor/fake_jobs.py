"""Small user jobs for the executor's tests, run by real workers.

Entrypoints: `tests.node.executor.fake_jobs:NAME`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from node.executor.context import JobContext, NonRetryableError


def succeed(ctx: JobContext) -> dict[str, Any]:
    print(f"hello from task {ctx.task_index} attempt {ctx.attempt}", flush=True)
    ctx.progress(1, 1, answer=42.0)
    return {"answer": 42, "attempt": ctx.attempt}


def fail_first_attempts(ctx: JobContext) -> dict[str, Any]:
    """Fails (retryably) until attempt `succeed_on`."""
    if ctx.attempt < int(ctx.args.get("succeed_on", 2)):
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")
    return {"attempt": ctx.attempt}


def refuse(ctx: JobContext) -> dict[str, Any]:
    raise NonRetryableError("bad input: this job cannot succeed")


def crash(ctx: JobContext) -> dict[str, Any]:
    print("about to crash", file=sys.stderr, flush=True)
    os._exit(7)


def run_until_stopped(ctx: JobContext) -> dict[str, Any]:
    step = 0
    while not ctx.should_stop():
        step += 1
        ctx.progress(step, 0)
        time.sleep(0.05)
    return {"stopped_after": step}


def ignore_stop(ctx: JobContext) -> dict[str, Any]:
    """Keeps running whatever it is told, so only SIGKILL ends it."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        ctx.progress(1, 0)
        time.sleep(0.05)


def noisy(ctx: JobContext) -> dict[str, Any]:
    line = "x" * 99
    # One burst larger than the log bound, read by the executor as large chunks.
    print("y" * int(ctx.args.get("burst", 0)), flush=True)
    for number in range(int(ctx.args.get("lines", 1000))):
        print(f"{number:06d} {line}", flush=number % 100 == 0)
    print("last line", flush=True)
    return {"lines": int(ctx.args.get("lines", 1000))}
