"""The main job that exists so far: a scripted multi-region scenario against the replicated core.

Three regions register, a training job runs in one of them and checkpoints, the region goes silent,
its attempt's lease runs out, the job moves to a healthy region and resumes from its last committed
checkpoint, and the zombie's late update is fenced off by its stale token. Every step is applied as
an encoded log entry, and at the end three replicas fed the same log (one through a snapshot) are
shown to hold byte-identical state. Time is simulated, so the run is the same every time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from xrcore import StateMachine, XrError, encode, jobs
from xrcore import commands as c
from xrcore.codec import Envelope

__all__ = ["run"]

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, simulated


class _Cluster:
    """The log and three replicas applying it; replica 2 joins late from a snapshot."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.log: list[bytes] = []
        self.replicas = [StateMachine(), StateMachine()]
        self.now_ms = START_MS

    def propose(self, command: c.Command, *, advance_ms: int = 100) -> dict[str, Any]:
        self.now_ms += advance_ms
        entry = encode(
            Envelope(command=command, now_ms=self.now_ms, client_id="demo", seq=len(self.log) + 1)
        )
        self.log.append(entry)
        index = len(self.log)
        results = [replica.apply(entry, index) for replica in self.replicas]
        applied = results[0]
        for effect in applied.effects:
            self.say(f"      effect: {effect.kind} {_describe_effect(effect)}")
        return applied.result.unwrap()

    def idle(self, seconds: int) -> None:
        """The leader ticks every 250 ms while nothing else happens."""
        for _ in range(seconds * 4):
            self.propose(c.Tick(), advance_ms=250)

    @property
    def machine(self) -> StateMachine:
        return self.replicas[0]


def _describe_effect(effect: Any) -> str:
    if effect.kind == "attempt.ended":
        return f"{effect.job_id}[{effect.task_index}] token {effect.token}: {effect.reason}"
    if effect.kind == "lock.granted":
        return f"{effect.name} -> {effect.session_id} token {effect.token}"
    return f"{effect.session_id} ({effect.reason})"


def run(say: Callable[[str], None] = print) -> int:
    cluster = _Cluster(say)
    propose = cluster.propose
    say("xr demo: a scripted multi-region scenario against the replicated core (simulated time)\n")

    say("1. Three regions join, each with its own GPUs, price and carbon intensity.")
    regions = {
        "eu-west": ("A100", 4, 2.10, 120.0),
        "us-east": ("H100", 8, 3.90, 380.0),
        "ap-south": ("L4", 2, 0.80, 650.0),
    }
    for port, (name, (model, count, price, carbon)) in enumerate(regions.items()):
        propose(
            c.RegionRegister(
                name=name,
                http_address=f"http://127.0.0.1:{8100 + port}",
                raft_address=f"127.0.0.1:{9100 + port}",
                provider="demo",
                price_per_gpu_hour=price,
                carbon_g_per_kwh=carbon,
            )
        )
        gpus = tuple(c.Gpu(model=model, memory_mb=81_920, free_mb=81_920) for _ in range(count))
        propose(c.RegionHeartbeat(name=name, gpus=gpus))
        say(f"   {name:9} {count} x {model}, ${price:.2f}/GPU-hour, {carbon:.0f} gCO2/kWh")

    say("\n2. Two trainers race for a fenced lock; the loser queues.")
    alice = propose(c.SessionGrant(ttl_ms=5_000, owner="alice"))["session_id"]
    bob = propose(c.SessionGrant(ttl_ms=60_000, owner="bob"))["session_id"]
    grant = propose(c.LockAcquire(name="dataset/imagenet", session_id=alice))
    say(f"   alice holds dataset/imagenet with token {grant['token']}")
    queued = propose(c.LockAcquire(name="dataset/imagenet", session_id=bob, wait=True))
    say(f"   bob is queued at position {queued['position']}")
    say("   alice stops renewing her 5 s session...")
    for _ in range(8):
        propose(c.SessionKeepAlive(session_id=bob), advance_ms=1_000)
    lock = cluster.machine.locks["dataset/imagenet"]
    say(f"   bob now holds it with token {lock.token} > {grant['token']}: alice is fenced off")

    say("\n3. A training job is submitted and placed in us-east.")
    spec = c.JobSpec(
        name="mlp-train",
        tenant="research",
        workload="mlp_train",
        gpus=2,
        args='{"epochs": 10}',
        checkpoint_interval_s=60,
        max_attempts=3,
    )
    job_id = propose(c.JobSubmit(spec=spec))["job_id"]
    propose(c.TaskAssign(job_id=job_id, task_index=0, region="us-east"))
    claim = propose(
        c.TaskClaim(
            job_id=job_id,
            task_index=0,
            region="us-east",
            executor_id="us-east/executor",
            lease_ttl_ms=3_000,
        )
    )
    zombie_token = claim["token"]
    say(f"   {job_id} attempt {claim['attempt']} runs in us-east with token {zombie_token}")
    for step in range(1, 5):
        propose(
            c.TaskHeartbeat(
                job_id=job_id,
                task_index=0,
                token=zombie_token,
                done=step,
                total=10,
                metrics={"loss": round(1.0 / step, 3)},
            ),
            advance_ms=500,
        )
        if step % 2 == 0:
            propose(
                c.TaskCheckpoint(
                    job_id=job_id,
                    task_index=0,
                    token=zombie_token,
                    step=step,
                    uri=f"file:///ckpt/{job_id}/{step}",
                    checksum=f"sha256:{step}",
                    size_bytes=1 << 20,
                )
            )
            say(f"   epoch {step}/10 checkpoint committed")

    say("\n4. us-east is cut off: no heartbeats reach the cluster; its attempt lease runs out.")
    cluster.idle(4)
    task = cluster.machine.jobs[job_id].tasks[0]
    say(
        f"   task is {task.state.value}, last committed checkpoint: step {task.checkpoint.step}"
        if task.checkpoint
        else "   task has no checkpoint"
    )

    say("\n5. The job moves to eu-west and resumes from its checkpoint.")
    propose(c.TaskAssign(job_id=job_id, task_index=0, region="eu-west"))
    claim = propose(
        c.TaskClaim(
            job_id=job_id,
            task_index=0,
            region="eu-west",
            executor_id="eu-west/executor",
            lease_ttl_ms=3_000,
        )
    )
    token = claim["token"]
    say(
        f"   attempt {claim['attempt']} in eu-west, token {token}, resumes from step "
        f"{claim['checkpoint']['step']}"
    )

    say("\n6. The zombie in us-east wakes up and tries to commit: rejected.")
    try:
        propose(
            c.TaskCheckpoint(
                job_id=job_id,
                task_index=0,
                token=zombie_token,
                step=9,
                uri="file:///ckpt/zombie",
                checksum="sha256:bad",
                size_bytes=1,
            )
        )
    except XrError as error:
        say(f"   {error.code}: {error.message}")

    for step in range(5, 11):
        propose(
            c.TaskHeartbeat(job_id=job_id, task_index=0, token=token, done=step, total=10),
            advance_ms=500,
        )
    propose(c.TaskComplete(job_id=job_id, task_index=0, token=token, result='{"loss": 0.05}'))
    view = jobs.get(cluster.machine, job_id)
    say(f"   {job_id} {view['state']} after {len(view['tasks'][0]['attempts'])} attempts:")
    for attempt in view["tasks"][0]["attempts"]:
        say(
            f"     attempt {attempt['number']}: {attempt['region']:8} token {attempt['token']:3} "
            f"{attempt['outcome']}, restored from step {attempt['restored_step']}"
        )

    say("\n7. Replicas agree byte for byte, also one restored from a snapshot mid-log.")
    late = StateMachine.restore(_replay(cluster.log[: len(cluster.log) // 2]).snapshot())
    for index in range(len(cluster.log) // 2 + 1, len(cluster.log) + 1):
        late.apply(cluster.log[index - 1], index)
    digests = [
        hashlib.sha256(replica.snapshot()).hexdigest()[:16] for replica in [*cluster.replicas, late]
    ]
    for name, digest in zip(["replica 1", "replica 2", "from snapshot"], digests, strict=True):
        say(f"   {name:14} state sha256 {digest}")
    agree = len(set(digests)) == 1
    say(f"\n{len(cluster.log)} log entries applied; replicas {'agree' if agree else 'DIVERGE'}.")
    return 0 if agree else 1


def _replay(log: list[bytes]) -> StateMachine:
    machine = StateMachine()
    for index, entry in enumerate(log, start=1):
        machine.apply(entry, index)
    return machine
