"""`xr demo`: the whole promise on one machine, with real processes.

It starts three regions (real `xr node run` processes on loopback, through `LocalCluster`) with
different prices, carbon intensity, device speeds and simulated round-trip times, submits a mix
of work (a `gemm` benchmark, an `fft` array spread across regions, two `mlp_train` jobs from two
tenants with different priorities), shows live progress per job, kills (-9) the region running
the high-priority training job half-way, shows that job failing over and resuming from its last
committed checkpoint, and ends with a summary of where everything ran.

Device speeds, prices, carbon and round-trip times are labels the scheduler reads; on a machine
without a GPU every region runs its tasks on the CPU (NumPy), and the demo says so. With a GPU the
jobs ask for a share of one and run on it through CuPy.

Nothing is left running at the end unless `--keep`, which keeps the cluster up in the foreground
until Ctrl-C. `run` returns a `DemoReport` so tests can assert the story (the failover happened,
every job completed, nothing is left running).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from node.config import hash_token
from node.localcluster import SECRET_FILE, LocalCluster, prepare_directory, secret_file

__all__ = ["DemoError", "DemoOptions", "DemoReport", "run"]


@dataclass(frozen=True)
class _RegionPlan:
    name: str
    provider: str
    price_per_gpu_hour: float
    carbon_g_per_kwh: float
    gpu_model: str
    speed: float


REGIONS = (
    _RegionPlan("us-east", "aws", 2.9, 380.0, "H100", 2.0),
    _RegionPlan("eu-west", "gcp", 2.4, 120.0, "A100", 1.0),
    _RegionPlan("ap-south", "edge", 1.1, 650.0, "L4", 0.6),
)
# Simulated round-trip times between the regions, in ms (loopback is ~0.1 ms).
RTT_MS = {
    ("us-east", "eu-west"): 75.0,
    ("us-east", "ap-south"): 210.0,
    ("eu-west", "ap-south"): 120.0,
}


class DemoError(Exception):
    """The demo could not tell its story (a region did not start, a job did not finish)."""


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    quick: bool = False
    keep: bool = False
    # Where the regions' data and logs go; a temporary directory (removed) when None.
    base_dir: Path | None = None
    timeout_s: float = 600.0


@dataclass(kw_only=True)
class DemoReport:
    gpu: bool = False
    killed_region: str | None = None
    killed_at_step: int | None = None
    failover_region: str | None = None
    # The step the failed-over training job's worker resumed from (its result's `resumed_from`).
    resumed_from_step: int | None = None
    jobs: dict[str, str] = field(default_factory=dict)  # job id -> final state
    left_running: list[str] = field(default_factory=list)

    @property
    def story_told(self) -> bool:
        return (
            self.failover_region is not None
            and bool(self.resumed_from_step)
            and bool(self.jobs)
            and all(state == "succeeded" for state in self.jobs.values())
            and not self.left_running
        )


def _rtt(region: str) -> str:
    pairs = []
    for (one, other), rtt_ms in RTT_MS.items():
        if region in (one, other):
            pairs.append(f"{other if region == one else one}={rtt_ms:g}")
    return ",".join(pairs)


def _region_settings() -> dict[str, dict[str, str]]:
    return {
        plan.name: {
            "region.provider": plan.provider,
            "region.price_per_gpu_hour": str(plan.price_per_gpu_hour),
            "region.carbon_g_per_kwh": str(plan.carbon_g_per_kwh),
            "region.labels": f"gpu_model={plan.gpu_model},speed={plan.speed:g}",
            "region.rtt_ms": _rtt(plan.name),
            "region.cpu_slots": "2",
        }
        for plan in REGIONS
    }


def _cluster_settings(quick: bool) -> dict[str, str]:
    return {
        # Short leases so the failover shows within seconds (production default: 10 s).
        "executor.lease_ttl_s": "3" if quick else "5",
        "executor.poll_interval_s": "0.2",
        "executor.kill_grace_s": "2",
        "executor.retry_backoff_base_s": "0.5",
        "scheduler.preemption_min_run_s": "600",
        "log.level": "info",
    }


@dataclass(frozen=True)
class _JobPlan:
    label: str
    tenant: str
    priority: int
    workload: str
    args: dict[str, Any]
    array_size: int = 1


def _jobs(quick: bool) -> list[_JobPlan]:
    # Sized for a few seconds each on an idle laptop CPU (quick) or a few tens of seconds.
    steps = 16_000 if quick else 60_000
    return [
        _JobPlan(
            "train-research",
            "research",
            10,
            "mlp_train",
            {"steps": steps, "hidden": 64, "batch": 128, "checkpoint_every": steps // 10},
        ),
        _JobPlan(
            "train-product",
            "product",
            0,
            "mlp_train",
            {"steps": steps // 2, "hidden": 64, "batch": 128, "checkpoint_every": steps // 20},
        ),
        _JobPlan("gemm-bench", "platform", 5, "gemm", {"n": 512, "repeats": 20}),
        _JobPlan(
            "fft-sweep",
            "science",
            1,
            "fft",
            {"n": 512, "repeats": 20 if quick else 100},
            array_size=3 if quick else 6,
        ),
    ]


ADMIN = "platform"


class _Demo:
    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.report = DemoReport()
        self.job_ids: dict[str, str] = {}  # label -> job id
        self.owners: dict[str, Any] = {}  # label -> the client of the tenant owning the job
        self.started_s = time.monotonic()
        # Authentication is on, as in production: one token per tenant and one admin token,
        # made for this run and never written anywhere but the nodes' config (as hashes).
        tenants = {plan.tenant for plan in _jobs(options.quick)}
        self.tokens = {name: secrets.token_urlsafe(24) for name in sorted(tenants | {ADMIN})}

    def _config_text(self) -> str:
        return "\n".join(
            f'[[auth.tokens]]\nname = "{name}"\nsha256 = "{hash_token(token)}"\n'
            f'role = "{"admin" if name == ADMIN else "tenant"}"\ntenant = "{name}"\n'
            for name, token in self.tokens.items()
        )

    def say(self, text: str) -> None:
        elapsed_s = time.monotonic() - self.started_s
        self.console.print(f"[dim]{elapsed_s:6.1f}s[/dim]  {text}")

    def run(self, base_dir: Path) -> DemoReport:
        quick = self.options.quick
        # Raft is authenticated, as in production (docs/security.md).
        secret = secret_file(base_dir / SECRET_FILE)
        cluster = LocalCluster(
            base_dir,
            region_names=[plan.name for plan in REGIONS],
            settings={**_cluster_settings(quick), "raft.cluster_secret_file": str(secret)},
            region_settings=_region_settings(),
            config_text=self._config_text(),
            stop_with_parent=True,
        )
        kept = "" if self.options.base_dir is not None else ", removed at the end; --dir keeps them"
        self.say(
            f"starting {len(REGIONS)} regions as real processes (data and logs: {base_dir}{kept})"
        )
        try:
            cluster.start(timeout_s=90.0)
            self._story(cluster)
            if self.options.keep:
                self._keep(cluster)
            else:
                self.say(
                    "stopping the cluster (`xr demo --keep` keeps it up for the dashboard and "
                    "the CLI, and prints each tenant's token)"
                )
        finally:
            cluster.stop()
            self.report.left_running = [node.region for node in cluster.nodes if node.running]
            if self.report.left_running:
                cluster.kill()
        return self.report

    def _story(self, cluster: LocalCluster) -> None:
        from xrcore.client import Client

        clients = {
            name: Client(cluster.urls, token=token, timeout_s=10.0)
            for name, token in self.tokens.items()
        }
        with contextlib.ExitStack() as stack:
            for tenant_client in clients.values():
                stack.enter_context(contextlib.closing(tenant_client))
            client = clients[ADMIN]
            regions = self._wait_for_regions(client)
            self.report.gpu = any(region.gpus for region in regions)
            self._describe(regions)
            # The research team paid for twice the fair share of the product team.
            client.tenants.set("research", weight=2.0)
            for plan in _jobs(self.options.quick):
                spec: dict[str, Any] = {}
                if self.report.gpu:
                    spec["gpu_memory_mb"] = 2_048
                job_id = clients[plan.tenant].jobs.submit(
                    plan.label,
                    workload=plan.workload,
                    args=plan.args,
                    priority=plan.priority,
                    array_size=plan.array_size,
                    **spec,
                )
                self.job_ids[plan.label] = job_id
                self.owners[plan.label] = clients[plan.tenant]
                self.say(
                    f"submitted [bold]{plan.label}[/bold] ({plan.workload}, tenant "
                    f"{plan.tenant}, priority {plan.priority}"
                    + (f", {plan.array_size} tasks" if plan.array_size > 1 else "")
                    + f") as {job_id}"
                )
            self._follow(cluster)
            self._summary()

    def _get(self, label: str) -> Any:
        return self.owners[label].jobs.get(self.job_ids[label])

    def _wait_for_regions(self, client: Any) -> Any:
        deadline_s = time.monotonic() + 60.0
        while time.monotonic() < deadline_s:
            regions = client.regions.list()
            if len(regions) == len(REGIONS) and all(region.healthy for region in regions):
                leader = client.cluster.status().leader
                self.say(f"all regions registered and healthy; Raft leader at {leader}")
                return regions
            time.sleep(0.2)
        raise DemoError("the regions did not all register within 60 s")

    def _describe(self, regions: Any) -> None:
        table = Table(title="regions", title_justify="left")
        for column in ("region", "provider", "devices", "speed", "$/GPU-h", "gCO2/kWh", "RTTs ms"):
            table.add_column(column)
        for region in regions:
            devices = (
                f"{len(region.gpus)} x {region.gpus[0].model}"
                if region.gpus
                else f"CPU ({region.labels.get('gpu_model', '?')} simulated)"
            )
            table.add_row(
                region.name,
                region.provider,
                devices,
                region.labels.get("speed", "1"),
                f"{region.price_per_gpu_hour:g}",
                f"{region.carbon_g_per_kwh:g}",
                ", ".join(f"{peer} {rtt:g}" for peer, rtt in sorted(region.rtt_ms.items())),
            )
        self.console.print(table)
        if self.report.gpu:
            self.say("GPU found: jobs ask for a 2 GB share of one and run on it with CuPy")
        else:
            self.say(
                "no GPU on this machine: every region runs its tasks on the CPU (NumPy); "
                "device speeds, prices and carbon are labels the scheduler reads"
            )

    def _follow(self, cluster: LocalCluster) -> None:
        """Live progress per job; kills the training job's region half-way; waits for all."""
        target = self.job_ids["train-research"]
        deadline_s = time.monotonic() + self.options.timeout_s
        with Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(bar_width=32),
            TextColumn("{task.percentage:>5.1f}%"),
            TextColumn("{task.fields[where]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        ) as progress:
            bars: dict[str, TaskID] = {
                label: progress.add_task(label, total=1.0, where="pending")
                for label in self.job_ids
            }
            while True:
                if time.monotonic() > deadline_s:
                    raise DemoError(f"jobs did not finish within {self.options.timeout_s:.0f} s")
                jobs = {label: self._get(label) for label in self.job_ids}
                for label, job in jobs.items():
                    if job is not None:
                        progress.update(bars[label], completed=_fraction(job), where=_where(job))
                training = jobs["train-research"]
                if training is not None:
                    if self.report.killed_region is None:
                        self._maybe_kill(cluster, training, self.say)
                    elif self.report.failover_region is None:
                        self._maybe_resumed(training, self.say)
                if all(job is not None and job.finished for job in jobs.values()):
                    break
                time.sleep(0.25)
            self.report.jobs = {
                self.job_ids[label]: job.state for label, job in jobs.items() if job is not None
            }
        if self.report.failover_region is None:
            raise DemoError(f"{target} finished without the failover the demo shows")
        self._check_resumed(jobs["train-research"])

    def _check_resumed(self, training: Any) -> None:
        """The step the training job's worker itself says it resumed from (its result), which
        is what the demo reports: the log's `restored_step` is the checkpoint the attempt was
        given, and a worker that could not read it (a checkpoint directory the regions do not
        share) starts over and says so only in its log."""
        if training is None or training.state != "succeeded" or not training.tasks[0].result:
            return
        actual = json.loads(training.tasks[0].result).get("resumed_from")
        if actual != self.report.resumed_from_step:
            self.say(
                f"[bold red]{training.job_id}'s worker resumed from step {actual}, not from the "
                f"checkpoint it was given (step {self.report.resumed_from_step})[/bold red]"
            )
        self.report.resumed_from_step = actual

    def _maybe_kill(
        self, cluster: LocalCluster, training: Any, echo: Callable[[str], None]
    ) -> None:
        task = training.tasks[0]
        if task.state != "running" or task.total == 0 or task.checkpoint is None:
            return
        # Progress reports are throttled (about one a second) while each checkpoint is seen as it
        # commits: on a fast machine the last report can lag the checkpoint by half the run, so
        # half-way is judged by the newer of the two.
        step = max(task.done, task.checkpoint.step)
        if step < task.total // 2 or task.region is None:
            return
        node = cluster.node(task.region)
        leader = cluster.leader()
        node.kill()
        self.report.killed_region = task.region
        self.report.killed_at_step = step
        role = " (the Raft leader)" if leader is not None and leader.region == node.region else ""
        echo(
            f"[bold red]killed region {task.region}{role} with SIGKILL[/bold red] while "
            f"{training.job_id} was at step {self.report.killed_at_step}/{task.total}; its last "
            "committed "
            f"checkpoint is step {task.checkpoint.step}"
        )

    def _maybe_resumed(self, training: Any, echo: Callable[[str], None]) -> None:
        task = training.tasks[0]
        attempts = task.attempts
        if len(attempts) < 2 or task.state != "running":
            return
        latest = attempts[-1]
        lost = attempts[-2]
        self.report.failover_region = latest.region
        self.report.resumed_from_step = latest.restored_step
        echo(
            f"[bold green]{training.job_id} failed over[/bold green]: attempt {lost.number} in "
            f"{lost.region} ended ({lost.outcome}); attempt {latest.number} runs in "
            f"{latest.region} from checkpoint step {latest.restored_step} "
            f"(fencing token {lost.token} -> {latest.token})"
        )

    def _summary(self) -> None:
        table = Table(title="summary", title_justify="left")
        for column in ("job", "id", "tenant", "prio", "state", "ran in", "attempts", "time s"):
            table.add_column(column)
        table.add_column("failovers")
        table.add_column("resumed from")
        for label, job_id in self.job_ids.items():
            job = self._get(label)
            attempts = [attempt for task in job.tasks for attempt in task.attempts]
            starts = [attempt.started_at_ms for attempt in attempts]
            ends = [attempt.ended_at_ms or attempt.started_at_ms for attempt in attempts]
            where = sorted({attempt.region for attempt in attempts})
            failovers = sum(attempt.outcome == "lease_expired" for attempt in attempts)
            resumed = sorted(
                {attempt.restored_step for attempt in attempts if attempt.restored_step}
            )
            table.add_row(
                label,
                job_id,
                job.tenant,
                str(job.priority),
                job.state,
                ", ".join(where),
                str(len(attempts)),
                f"{(max(ends) - job.submitted_at_ms) / 1000:.1f}" if starts else "-",
                str(failovers),
                ", ".join(f"step {step}" for step in resumed) or "-",
            )
        self.console.print(table)
        reason = self._get("fft-sweep").tasks[0].reason
        if reason:
            self.say(f"why fft-sweep[0] went where it did: {reason}")

    def _keep(self, cluster: LocalCluster) -> None:
        if self.report.killed_region is not None:
            node = cluster.node(self.report.killed_region)
            node.start()
            cluster.wait_ready(nodes=[node], timeout_s=60.0)
            self.say(f"restarted region {node.region} from its data directory")
        self.say("cluster kept running; Ctrl-C stops it")
        for node in cluster.nodes:
            self.console.print(f"  {node.region:<9} {node.url}  dashboard {node.url}/ui")
        # Each tenant sees its own jobs only, the admin too (its tenant is its own): the
        # failed-over job is research's.
        self.console.print("  tokens (made for this run; each tenant sees its own jobs and keys):")
        for name, token in self.tokens.items():
            role = "admin" if name == ADMIN else "tenant"
            self.console.print(f"    {name:<9} {role:<6} {token}")
        self.console.print(f"  export XR_ENDPOINTS={','.join(cluster.urls)}")
        self.console.print(f"  export XR_TOKEN={self.tokens['research']}   # research's jobs")
        stop = False

        def interrupted(signum: int, frame: object) -> None:
            nonlocal stop
            stop = True

        previous = signal.signal(signal.SIGINT, interrupted)
        try:
            while not stop:
                time.sleep(0.2)
        finally:
            signal.signal(signal.SIGINT, previous)


def _fraction(job: Any) -> float:
    if job.state == "succeeded":
        return 1.0
    parts = [task.done / task.total if task.total else 0.0 for task in job.tasks]
    return sum(parts) / len(parts) if parts else 0.0


def _where(job: Any) -> str:
    regions = sorted({task.region for task in job.tasks if task.region})
    if job.finished:
        return str(job.state)
    return ", ".join(regions) if regions else "pending"


def run(options: DemoOptions | None = None, *, console: Console | None = None) -> DemoReport:
    """Runs the demo; raises `DemoError` when its story cannot be told."""
    options = options or DemoOptions()
    if console is None:
        console = Console()
        if not console.is_terminal:
            # Logs and CI: wide enough for the tables, no live redraws.
            console = Console(width=140)
    demo = _Demo(options, console)
    if options.base_dir is not None:
        try:
            prepare_directory(options.base_dir)
        except OSError as error:
            reason = error.strerror or error
            raise DemoError(f"--dir {options.base_dir} cannot be used: {reason}") from None
        return demo.run(options.base_dir)
    base_dir = Path(tempfile.mkdtemp(prefix="xr-demo-"))
    try:
        return demo.run(base_dir)
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
