"""The job the queue workload submits: it works for a while, then reports its completion, with its
attempt's fencing token, to the harness's protected resource.

Before it reports, it commits a checkpoint through the log with its token: the commit succeeds
only while this attempt is the task's live one and its region reaches a quorum. A zombie (its
region paused or cut off, its lease passed to another attempt) blocks there and is then refused,
so it never reports. What remains is the moment between that commit and the completion's own
commit: a fault exactly then makes the task run again and report twice, which is the limit of
any effect outside the log, and what the queue checker's "duplicate" anomaly would show.

Entrypoint `xr_jepsen.workloads.queue_job:run`, arguments `{"key", "resource", "work_s"}`. It
runs in a node's executor worker, inside the node's network namespace, and reaches the harness at
the address on the test bridge. It never calls `time.sleep`: under libfaketime (the clock
nemesis) that call fails with EINVAL, so it waits on an event instead.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

from node.executor.context import JobContext, NonRetryableError

__all__ = ["run"]

POST_TIMEOUT_S = 5.0
WAIT_STEP_S = 0.1


def run(ctx: JobContext) -> dict[str, Any]:
    key, resource = ctx.args.get("key"), ctx.args.get("resource")
    if not isinstance(key, str) or not isinstance(resource, str):
        raise NonRetryableError("the queue job needs string arguments key and resource")
    work_s = float(ctx.args.get("work_s", 0.5))
    waited_s, pause = 0.0, threading.Event()
    while waited_s < work_s:
        if ctx.should_stop():
            return {"stopped": ctx.stop_reason}
        pause.wait(WAIT_STEP_S)
        waited_s += WAIT_STEP_S
    # The log commits only checkpoints newer than the task's last one: a later attempt (whose
    # predecessor committed and then lost its lease) commits the next step.
    restored = ctx.restore()
    step = 1 if restored is None else int(restored["step"]) + 1
    if not ctx.checkpoint(step, {"done": ctx.xp.ones(1)}, {"key": key}) or ctx.should_stop():
        # Not committed: superseded (stop), or no quorum (fail; the task is retried).
        if ctx.should_stop():
            return {"stopped": ctx.stop_reason}
        raise RuntimeError("the checkpoint before reporting was not committed")
    body = {"key": key, "token": ctx.token, "job_id": ctx.job_id, "attempt": ctx.attempt}
    request = urllib.request.Request(
        f"{resource}/complete",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    # A lost answer raises, so the attempt fails and is retried: the resource recorded whatever
    # it decided, and accepts the same token again.
    with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as answer:
        decision = json.load(answer)
    if not decision.get("accepted"):
        # Retried: a zombie's failure is refused by the log anyway, and a live attempt whose
        # token could not be validated (no quorum) tries again.
        raise RuntimeError(f"the resource rejected token {ctx.token}: {decision.get('reason')}")
    return {"accepted": True, "token": ctx.token}
