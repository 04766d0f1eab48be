"""Small user jobs for the executor's tests, run by real workers.

Entrypoints: `tests.node.executor.fake_jobs:NAME`.
"""

from __future__ import annotations

import os
import socket
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


def compute_until_stopped(ctx: JobContext) -> dict[str, Any]:
    """Computes in Python, holding the interpreter's lock (as a job busy in pure Python does),
    until it is asked to stop."""
    ctx.progress(1, 0)
    steps = 0
    while not ctx.should_stop():
        steps += 1
    return {"steps": steps}


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


def count_steps(ctx: JobContext) -> dict[str, Any]:
    """Counts to `steps`, one step per 50 ms, resuming from its checkpoint; when asked to stop
    for a reason after which the task runs again, it checkpoints where it is first."""
    steps = int(ctx.args.get("steps", 100))
    restored = ctx.restore()
    start = 0 if restored is None else int(restored["step"])
    for step in range(start, steps):
        if ctx.should_stop():
            if ctx.stop_reason in ("preempted", "lease_lost", "shutdown", "signal"):
                ctx.checkpoint(step, {"step": ctx.xp.asarray([step])})
            return {"stopped_at": step, "reason": ctx.stop_reason}
        ctx.progress(step + 1, steps)
        time.sleep(0.05)
    return {"counted": steps, "resumed_from": start, "attempt": ctx.attempt}


def show_environment(ctx: JobContext) -> dict[str, Any]:
    """Prints what a careless job might: its environment (names starting with XR_ or TEST_)."""
    for name in sorted(os.environ):
        if name.startswith(("XR_", "TEST_")):
            print(f"{name}={os.environ[name][:40]}", flush=True)
    return {"names": sorted(name for name in os.environ if name.startswith(("XR_", "TEST_")))}


def who_am_i(ctx: JobContext) -> dict[str, Any]:
    """Who the worker runs as, whether it can read the file `ctx.args["secret"]`, and whether it
    can checkpoint."""
    try:
        with open(ctx.args["secret"]) as secret:
            secret.read()
        read = "read"
    except PermissionError:
        read = "refused"
    committed = ctx.checkpoint(1, {"weights": ctx.xp.zeros(4)})
    with open("/proc/self/status") as status:
        effective = next(line for line in status if line.startswith("CapEff:")).split()[1]
    return {
        "capabilities": effective,
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": sorted(os.getgroups()),
        "home": os.environ.get("HOME"),
        "secret": read,
        "checkpointed": committed,
    }


def hold_checkpoint(ctx: JobContext) -> dict[str, Any]:
    """Commits a checkpoint, writes a file at each path of `ctx.args["leave"]` (the process's
    umask deciding its mode, as for any file a job makes), then runs until stopped."""
    committed = ctx.checkpoint(1, {"weights": ctx.xp.arange(4)})
    for path in ctx.args.get("leave", []):
        with open(path, "w") as left:
            left.write("alpha's")
    while not ctx.should_stop():
        ctx.progress(1, 0, committed=float(committed))
        time.sleep(0.05)
    return {"committed": committed}


def probe_other_tenant(ctx: JobContext) -> dict[str, Any]:
    """What this job can do to another tenant's: list its checkpoint area `ctx.args["area"]`,
    write a file there, signal the other workers running on the node (signal 0, which only
    asks whether it may), and read each file of `ctx.args["peek"]` ("read", "refused" or
    "missing", under "peeked"); and the size of its /dev/shm ("shm_bytes")."""
    area = ctx.args["area"]
    seen: dict[str, Any] = {"peeked": {}}
    for path in ctx.args.get("peek", []):
        try:
            with open(path) as peeked:
                seen["peeked"][path] = "read" if peeked.read() == "alpha's" else "other"
        except PermissionError:
            seen["peeked"][path] = "refused"
        except FileNotFoundError:
            seen["peeked"][path] = "missing"
    try:
        seen["listed"] = sorted(os.listdir(area))
    except PermissionError:
        seen["listed"] = "refused"
    try:
        with open(os.path.join(area, "planted"), "w") as planted:
            planted.write("not yours")
        seen["wrote"] = "wrote"
    except PermissionError:
        seen["wrote"] = "refused"
    signalled = refused = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if b"node.executor.worker" not in cmdline.read():
                    continue
            os.kill(int(entry), 0)
            signalled += 1
        except PermissionError:
            refused += 1
        except OSError:
            continue
    shm = os.statvfs("/dev/shm")
    seen.update(
        signalled=signalled,
        refused=refused,
        uid=os.getuid(),
        shm_bytes=shm.f_blocks * shm.f_frsize,
    )
    return seen


def probe_network(ctx: JobContext) -> dict[str, Any]:
    """What network this job has: its interfaces, whether it can connect to a server of its own
    on 127.0.0.1, and what connecting to each port of `ctx.args["ports"]` on 127.0.0.1 gives
    ("reached" or the error's name)."""
    with open("/proc/net/dev") as devices:
        interfaces = sorted(line.split(":")[0].strip() for line in devices.readlines()[2:])
    with socket.create_server(("127.0.0.1", 0)) as server:
        socket.create_connection(server.getsockname(), timeout=5).close()
    reached = {}
    for port in ctx.args["ports"]:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            reached[str(port)] = "reached"
        except OSError as error:
            reached[str(port)] = type(error).__name__
    return {"interfaces": interfaces, "reached": reached}


def read_input(ctx: JobContext) -> dict[str, Any]:
    """Reads the file `ctx.args["path"]` (a job's input, named by its path)."""
    with open(ctx.args["path"]) as given:
        return {"read": given.read()}


def fill_tmp(ctx: JobContext) -> dict[str, Any]:
    """Writes `ctx.args["files"]` (path: number of bytes), then runs until stopped or for
    `ctx.args["hold_s"]`."""
    for path, size in ctx.args["files"].items():
        with open(path, "wb") as sink:
            sink.write(b"x" * size)
    deadline_s = time.monotonic() + float(ctx.args["hold_s"])
    while not ctx.should_stop() and time.monotonic() < deadline_s:
        ctx.progress(1, 0)
        time.sleep(0.05)
    return {"held_for_s": ctx.args["hold_s"]}


def count_to(ctx: JobContext) -> dict[str, Any]:
    """Reports progress `ctx.args["n"]` times in quick succession, then ends."""
    n = int(ctx.args["n"])
    for done in range(1, n + 1):
        ctx.progress(done, n)
        time.sleep(0.01)
    return {"counted": n}


def leave_behind(ctx: JobContext) -> dict[str, Any]:
    """Starts a child process and a thread (not a daemon) that outlast the test, and returns
    the child's pid while both run."""
    import subprocess
    import threading

    child = subprocess.Popen(["sleep", "600"])
    threading.Thread(target=time.sleep, args=(600,)).start()
    return {"child": child.pid}


def kill_itself(ctx: JobContext) -> dict[str, Any]:
    import signal

    print("about to be killed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def show_task_settings(ctx: JobContext) -> dict[str, Any]:
    """What of its job's spec and its node's settings the worker was given."""
    return {
        "checkpoint_interval_s": ctx.checkpoint_interval_s,
        "kill_grace_s": ctx.task.kill_grace_s,
    }
