"""One run: start the cluster, drive a workload while the nemesis injects faults, heal, quiesce,
do the final operations, stop, check and write the results.

A run directory holds:
    config.json      what was asked for (with the seed and the command to replay it)
    history.jsonl    every operation (streamed while the run goes, so a crash leaves it)
    status.jsonl     each node's role, term and leader, polled every STATUS_INTERVAL_S
    results.json     the verdicts, counts, mechanisms and timings
    report.html      the self-contained report (`report.py`)
    nodes/           every node's log and data directory

Everything the run decides derives from the seed (the fault schedule, each worker's operations);
real processes, the network and the scheduler do not, so a replay runs the same plan, not
necessarily the same interleaving. The results say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from xr_jepsen.db import Cluster
from xr_jepsen.generator import FINAL_PROCESS, Generator
from xr_jepsen.history import HistoryRecorder, Op, read_history
from xr_jepsen.nemesis import (
    Nemesis,
    Window,
    needs_clock,
    needs_partitions,
    refusal,
    schedule,
)
from xr_jepsen.net import clean_leftovers
from xr_jepsen.resource import RESOURCE_PROCESS, FencedResource, ResourceServer
from xr_jepsen.workloads import Completion, Context, Planned, WorkerState, make_workload
from xr_jepsen.workloads.base import Workload, outcome_of
from xrcore.client import AsyncClient
from xrcore.errors import XrError

__all__ = [
    "REPLAY_ENVIRONMENT",
    "REPRODUCIBILITY",
    "RunConfig",
    "RunRefused",
    "faults_injected",
    "no_fault_warning",
    "replay_command",
    "run",
]

STATUS_INTERVAL_S = 0.5
STATUS_TIMEOUT_S = 0.4
PROGRESS_INTERVAL_S = 5.0
# After the workload stops: in-flight operations get this long to end before they are cut off
# (an operation cut off is recorded as never completed, which checkers treat as info).
DRAIN_GRACE_S = 10.0
READY_TIMEOUT_S = 60.0
FINAL_TIMEOUT_S = 90.0
FINAL_RETRY_PAUSE_S = 0.5
REPRODUCIBILITY = (
    "The fault schedule and every worker's planned operations derive from the seed; real "
    "processes, the network and the OS scheduler do not, so a replay runs the same plan, not "
    "necessarily the same interleaving or outcome."
)
# The variables that switch on deliberate bugs (docs/jepsen-faults.md): the nodes inherit them
# from the harness, so the command that replays a run sets them as the run had them.
REPLAY_ENVIRONMENT = ("XR_TEST_RUN", "XR_TEST_FAULTS")


class RunRefused(RuntimeError):
    """The run cannot be made as asked: a partition nemesis without namespaces, or a nemesis
    that could inject no fault (too few nodes, too short a time; `nemesis.refusal`)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    workload: str
    nemesis: str
    nodes: int = 3
    time_s: float = 30.0
    seed: int = 0
    run_dir: Path = Path("jepsen-runs/latest")
    # False: loopback nodes even where namespaces work (tests of the fallback).
    namespaces: bool = True
    # Without namespaces, make partitions as message drops inside the nodes (test-only
    # `XR_TEST_PARTITIONS`); only when asked, and the run says so.
    fault_transport: bool = False
    op_timeout_s: float = 3.0
    # Node settings over the harness's own (`--set name=value` of `xr node run`).
    settings: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        return data


def replay_command(config: RunConfig, *, environment: Mapping[str, str] | None = None) -> str:
    """The shell command that replays the run, with the `REPLAY_ENVIRONMENT` variables set in
    `environment` (default: this process's) in front of it."""
    environment = os.environ if environment is None else environment
    assignments = [
        f"{name}={shlex.quote(environment[name])}"
        for name in REPLAY_ENVIRONMENT
        if name in environment
    ]
    parts = [
        "xr-jepsen", "run",
        "--workload", config.workload,
        "--nemesis", config.nemesis,
        "--nodes", str(config.nodes),
        "--time", f"{config.time_s:g}",
        "--seed", str(config.seed),
    ]  # fmt: skip
    if not config.namespaces:
        parts.append("--no-namespaces")
    if config.fault_transport:
        parts.append("--fault-transport")
    for name, value in sorted(config.settings.items()):
        parts += ["--set", f"{name}={value}"]
    return " ".join([*assignments, shlex.join(parts)])


def faults_injected(nemesis_events: list[Any]) -> int:
    """How many faults a run's nemesis events show started (a start that failed is no fault)."""
    return sum(
        1
        for event in nemesis_events
        if isinstance(event, dict) and event.get("phase") == "start" and "error" not in event
    )


def _node_settings(workload: str, base_dir: Path) -> dict[str, str]:
    settings = {"executor.enabled": "false"}
    if workload == "queue":
        # Short leases and backoffs, so a task whose region fails moves within a run.
        settings = {
            "executor.enabled": "true",
            "executor.lease_ttl_s": "3",
            "executor.poll_interval_s": "0.2",
            "executor.kill_grace_s": "2",
            "executor.retry_backoff_base_s": "0.2",
            "executor.retry_backoff_max_s": "2",
            "executor.contact_lost_limit_s": "30",
            "executor.checkpoint_dir": str(base_dir / "checkpoints"),
            "region.cpu_slots": "2",
        }
    return settings


@dataclass
class _Run:
    config: RunConfig
    workload: Workload
    cluster: Cluster
    windows: list[Window]
    recorder: HistoryRecorder
    clock: Callable[[], int]
    progress: Callable[[str], None]
    generator: Generator
    resource: FencedResource = field(default_factory=FencedResource)
    server: ResourceServer | None = None
    # The client the resource validates job tokens with.
    validator: AsyncClient | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # "SIGTERM" when a signal, not the deadline, ended the workload.
    stopped_by: str | None = None
    statuses: list[dict[str, Any]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    active_fault: str = "none"

    @property
    def context(self) -> Context:
        assert self.server is not None
        return Context(resource_url=self.server.url, access=self.resource.present)

    def client(self, worker: int, *, timeout_s: float | None = None) -> AsyncClient:
        # Each worker starts on its own node and fails over around the ring, except the first
        # `pinned_workers` of a workload that has them: they keep talking to their own node
        # whatever happens, so a node cut off from the others (a deposed leader) keeps being
        # asked, as a client that cannot reach the rest of the cluster would.
        urls = self.cluster.urls
        start = worker % len(urls)
        pinned = worker < getattr(self.workload, "pinned_workers", 0)
        return AsyncClient(
            [urls[start]] if pinned else urls[start:] + urls[:start],
            timeout_s=timeout_s or self.config.op_timeout_s,
            retry_s=timeout_s or self.config.op_timeout_s,
        )

    async def do(
        self,
        client: AsyncClient,
        process: int,
        planned: Planned,
        state: WorkerState,
        *,
        node: str,
    ) -> Completion:
        """One operation: invoke, carry out, complete; every error becomes fail or info."""
        invoke = self.recorder.invoke(process, planned.f, planned.value, key=planned.key, node=node)
        try:
            completion = await self.workload.invoke(client, planned, state, self.context)
        except asyncio.CancelledError:
            self.recorder.complete(invoke, "info", error="cut off at the end of the run")
            raise
        except Exception as error:
            # Whatever it was, the outcome is unknown unless the error says it is definite.
            completion = outcome_of(error)
        value = completion.value if completion.type == "ok" else planned.value
        self.recorder.complete(invoke, completion.type, value, error=completion.error)
        self.counts[completion.type] += 1
        return completion

    async def worker(self, worker: int) -> None:
        process = worker
        node = self.cluster.nodes[worker % len(self.cluster.nodes)].region
        async with self.client(worker) as client:
            while not self.stopping.is_set():
                planned = self.generator.next(worker)
                state = self.generator.state(worker)
                completion = await self.do(client, process, planned, state, node=node)
                self.generator.observe(worker, planned, completion)
                if completion.type == "info":
                    # The operation may still be in flight: this worker is a new process now.
                    process += self.workload.workers
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self.stopping.wait(), timeout=self.generator.pause_s(worker)
                    )

    async def nemesis(self, nemesis: Nemesis, started_s: float) -> None:
        loop = asyncio.get_running_loop()
        for window in self.windows:
            await asyncio.sleep(max(0.0, started_s + window.start_s - loop.time()))
            try:
                event = await asyncio.to_thread(nemesis.start, window.fault)
            except Exception as error:
                # A fault that could not be injected is recorded, and the run goes on.
                event = {"phase": "start", "fault": window.fault.name, "error": str(error)}
                self.progress(f"fault {window.fault.name} failed: {error}")
            self.recorder.nemesis(event)
            self.active_fault = f"{event['fault']} on {','.join(event.get('nodes', []))}"
            await asyncio.sleep(max(0.0, started_s + window.end_s - loop.time()))
            try:
                healed = await asyncio.to_thread(nemesis.heal)
            except Exception as error:
                # The final heal makes sure of everything again.
                healed = {"phase": "heal", "fault": window.fault.name, "error": str(error)}
                self.progress(f"heal of {window.fault.name} failed: {error}")
            if healed is not None:
                self.recorder.nemesis(healed)
            self.active_fault = "none"

    async def poll_status(self) -> None:
        timeout = aiohttp.ClientTimeout(total=STATUS_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                polled_ns = self.clock()
                answers = await asyncio.gather(
                    *(self._status(session, node.url) for node in self.cluster.nodes)
                )
                for node, answer in zip(self.cluster.nodes, answers, strict=True):
                    entry: dict[str, Any] = {"time_ns": polled_ns, "node": node.region}
                    if answer is None:
                        entry["state"] = "down"
                    else:
                        entry.update(
                            state=answer.get("state"),
                            term=answer.get("term"),
                            leader=answer.get("leader_region"),
                            has_quorum=answer.get("has_quorum"),
                        )
                        if answer.get("test_faults"):
                            # Deliberate bugs switched on for a test (raftstore.faults).
                            entry["test_faults"] = answer["test_faults"]
                    self.statuses.append(entry)
                await asyncio.sleep(STATUS_INTERVAL_S)

    @staticmethod
    async def _status(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
        try:
            async with session.get(f"{url}/v1/cluster/status") as answer:
                if answer.status != 200:
                    return None
                document: dict[str, Any] = await answer.json()
                return document
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def report_progress(self, started_s: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            total = sum(self.counts.values())
            self.progress(
                f"[{loop.time() - started_s:6.1f} s] {self.config.workload}/"
                f"{self.config.nemesis}: {total} ops (ok {self.counts['ok']}, "
                f"fail {self.counts['fail']}, info {self.counts['info']}); "
                f"fault: {self.active_fault}"
            )

    async def final(self) -> dict[str, Any]:
        """The final operations after heal and quiesce; returns the liveness verdict."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + FINAL_TIMEOUT_S
        state = self.generator.final_state()
        process = FINAL_PROCESS
        tries = 0
        last: Completion | None = None
        async with self.client(0, timeout_s=10.0) as client:
            while (planned := self.workload.final_plan(state, last)) is not None:
                if loop.time() > deadline_s:
                    return {
                        "ok": False,
                        "message": f"final {planned.f} did not succeed within "
                        f"{FINAL_TIMEOUT_S:g} s after the cluster healed",
                        "tries": tries,
                    }
                tries += 1
                last = await self.do(client, process, planned, state, node="final")
                self.workload.observe(planned, last, state)
                if last.type == "info":
                    process += 1
                if last.type != "ok":
                    await asyncio.sleep(FINAL_RETRY_PAUSE_S)
        return {"ok": True, "message": "every final operation succeeded", "tries": tries}

    def record_completion(self, value: dict[str, Any], accepted: bool, problem: str | None) -> None:
        """A job's completion decided by the protected resource, as one operation."""
        invoke = self.recorder.invoke(RESOURCE_PROCESS, "complete", value, key=value["key"])
        self.recorder.complete(invoke, "ok" if accepted else "fail", value, error=problem)

    async def validate_attempt(self, job_id: str, token: int) -> str | None:
        """Why `token` is not the live attempt of the job's task, or None when it is."""
        assert self.validator is not None
        try:
            job = await self.validator.jobs.get(job_id)
        except XrError as error:
            return f"could not validate: {error.code}"
        if job is None or not job.tasks:
            return "no such job"
        task = job.tasks[0]
        if task.state != "running" or task.token != token:
            return f"stale: the task is {task.state} with token {task.token}"
        return None


def run(config: RunConfig, *, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Carries out one run and returns its results (also written to `results.json`)."""
    return asyncio.run(_run(config, progress))


async def _run(config: RunConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    started_wall = time.time()
    refused = refusal(config.nemesis, size=config.nodes, duration_s=config.time_s)
    if refused is not None:
        raise RunRefused(refused)
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(
        json.dumps({**config.to_json(), "command": replay_command(config)}, indent=2) + "\n"
    )
    cleaned = await asyncio.to_thread(clean_leftovers)
    if cleaned:
        progress(f"removed the networks of {len(cleaned)} crashed runs: {', '.join(cleaned)}")
    workload = make_workload(config.workload)
    cluster, mechanism_note = await asyncio.to_thread(
        Cluster.create,
        run_dir / "nodes",
        size=config.nodes,
        settings={**_node_settings(config.workload, run_dir / "nodes"), **config.settings},
        want_namespaces=config.namespaces,
        clock=needs_clock(config.nemesis),
        fault_transport=config.fault_transport,
    )
    progress(f"cluster of {config.nodes} nodes: {mechanism_note}")
    try:
        if needs_partitions(config.nemesis) and not cluster.partitions_available:
            raise RunRefused(_partitions_refusal(config, mechanism_note, root=os.geteuid() == 0))
        windows = schedule(
            config.nemesis,
            seed=config.seed,
            duration_s=config.time_s,
            size=config.nodes,
            partitions=cluster.partitions_available,
        )
        return await _drive(config, workload, cluster, windows, mechanism_note, progress)
    finally:
        await asyncio.to_thread(cluster.stop)
        progress(f"run finished in {time.time() - started_wall:.1f} s: {run_dir}")


async def _drive(
    config: RunConfig,
    workload: Workload,
    cluster: Cluster,
    windows: list[Window],
    mechanism_note: str,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    run_dir = config.run_dir
    origin_ns = time.monotonic_ns()

    def clock() -> int:
        return time.monotonic_ns() - origin_ns

    recorder = HistoryRecorder(clock=clock, stream_path=run_dir / "history.jsonl")
    state = _Run(
        config=config,
        workload=workload,
        cluster=cluster,
        windows=windows,
        recorder=recorder,
        clock=clock,
        progress=progress,
        generator=Generator(workload, config.seed),
    )
    timings: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    mark_s = loop.time()
    await asyncio.to_thread(cluster.start, timeout_s=READY_TIMEOUT_S)
    timings["start_s"] = loop.time() - mark_s
    state.validator = state.client(0)
    state.server = ResourceServer(
        state.resource,
        host=cluster.host_address,
        record=state.record_completion,
        validate=state.validate_attempt,
    )
    await state.server.start()
    nemesis = Nemesis(cluster)
    background = [asyncio.ensure_future(state.poll_status())]
    _stop_on_signals(loop, state)
    try:
        mark_s = loop.time()
        progress(
            f"workload {config.workload}, nemesis {config.nemesis} ({len(windows)} faults), "
            f"{config.time_s:g} s, seed {config.seed}"
        )
        workers = [asyncio.ensure_future(state.worker(n)) for n in range(workload.workers)]
        background.append(asyncio.ensure_future(state.report_progress(mark_s)))
        nemesis_task = asyncio.ensure_future(state.nemesis(nemesis, mark_s))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.stopping.wait(), timeout=config.time_s)
        state.stopping.set()
        nemesis_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await nemesis_task
        _, pending = await asyncio.wait(workers, timeout=config.op_timeout_s + DRAIN_GRACE_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        timings["workload_s"] = loop.time() - mark_s

        mark_s = loop.time()
        for event in await asyncio.to_thread(nemesis.heal_all):
            recorder.nemesis(event)
        recorder.nemesis({"phase": "heal", "fault": "all", "step": "final heal"})
        progress("healed; waiting for every node to be ready")
        try:
            await asyncio.to_thread(cluster.wait_ready, timeout_s=READY_TIMEOUT_S)
            not_ready = None
        except RuntimeError as error:
            # Not a harness failure: a cluster that does not recover is what liveness is about.
            not_ready = str(error).splitlines()[0]
            progress(f"not every node became ready after the heal: {not_ready}")
        timings["quiesce_s"] = loop.time() - mark_s
        mark_s = loop.time()
        liveness = await state.final()
        if not_ready is not None:
            liveness = {**liveness, "ok": False, "not_ready": not_ready}
        timings["final_s"] = loop.time() - mark_s
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await state.server.stop()
        await state.validator.close()
        recorder.close()
        _write_lines(run_dir / "status.jsonl", state.statuses)
    progress("checking the history")
    mark_s = loop.time()
    ops = read_history(run_dir / "history.jsonl")
    result = workload.check(ops)
    timings["check_s"] = loop.time() - mark_s
    results = _results(config, ops, result.to_json(), liveness, mechanism_note, cluster, timings)
    results["test_faults"] = sorted(
        {name for entry in state.statuses for name in entry.get("test_faults", [])}
    )
    # A matrix stops after a run that SIGTERM shortened rather than going on to the next.
    results["stopped_by"] = state.stopped_by
    warning = no_fault_warning(config.nemesis, results["faults"])
    if warning is not None:
        progress(f"warning: {warning}")
    (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    from xr_jepsen.report import write_report

    write_report(run_dir)
    progress(
        f"verdict: {results['verdict']} (safety {result.valid}, liveness "
        f"{liveness['ok']}); {results['ops']['total']} ops; report {run_dir / 'report.html'}"
    )
    return results


def no_fault_warning(nemesis: str, faults: int) -> str | None:
    """What to say of a run whose nemesis (other than `none`) injected no fault: its verdict is
    reported under the nemesis's name, yet tested nothing of it."""
    if nemesis == "none" or faults > 0:
        return None
    return f"nemesis {nemesis} injected no fault in this run: the verdict says nothing about it"


def _partitions_refusal(config: RunConfig, mechanism_note: str, *, root: bool) -> str:
    """Why a partition nemesis cannot run on a cluster without partitions, and what would make
    it run: namespaces (unless refused with --no-namespaces; as root unless already), or
    partitions made inside the nodes (--fault-transport)."""
    if not config.namespaces:
        remedy = "drop --no-namespaces"
    elif root:
        remedy = "make `ip netns` and nftables work here"
    else:
        remedy = "run it as root where `ip netns` and nftables work"
    return (
        f"nemesis {config.nemesis!r} needs partitions, and {mechanism_note}; {remedy}, or add "
        "--fault-transport (message drops inside the nodes), or pick kill, pause, clock"
    )


def _stop_on_signals(loop: asyncio.AbstractEventLoop, state: _Run) -> None:
    # SIGTERM ends the workload early, as the deadline would: heal, final reads, cleanup.
    def stop() -> None:
        state.stopped_by = "SIGTERM"
        state.stopping.set()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, stop)


def _write_lines(path: Path, entries: list[dict[str, Any]]) -> None:
    with path.open("w") as file:
        for entry in entries:
            file.write(json.dumps(entry) + "\n")


def verdict_of(safety: Any, liveness_ok: bool) -> str:
    if safety is False:
        return "invalid"
    if safety == "unknown":
        return "unknown"
    return "valid" if liveness_ok else "not live"


def _results(
    config: RunConfig,
    ops: list[Op],
    check: dict[str, Any],
    liveness: dict[str, Any],
    mechanism_note: str,
    cluster: Cluster,
    timings: dict[str, float],
) -> dict[str, Any]:
    clients = [op for op in ops if op.process >= 0 and op.type != "invoke"]
    counts = Counter(op.type for op in clients)
    nemesis_events = [op.value for op in ops if op.process < 0]
    faults = faults_injected(nemesis_events)
    return {
        "workload": config.workload,
        "nemesis": config.nemesis,
        "nodes": config.nodes,
        "time_s": config.time_s,
        "seed": config.seed,
        "command": replay_command(config),
        "reproducibility": REPRODUCIBILITY,
        "mechanism": {
            "cluster": cluster.mechanism,
            "partitions": (
                "nftables drops inside per-node network namespaces"
                if cluster.mechanism == "namespaces"
                else "message drops inside the nodes (XR_TEST_PARTITIONS)"
                if cluster.mechanism == "transport"
                else f"unavailable ({mechanism_note})"
            ),
            "clock": "libfaketime, wall clock only (FAKETIME_DONT_FAKE_MONOTONIC)"
            if cluster.clocks_available
            else "not used",
            "note": mechanism_note,
        },
        "ops": {
            "total": len(clients),
            "ok": counts["ok"],
            "fail": counts["fail"],
            "info": counts["info"],
        },
        "nemesis_events": nemesis_events,
        "faults": faults,
        "safety": check["valid"],
        "liveness": liveness,
        "verdict": verdict_of(check["valid"], bool(liveness["ok"])),
        "anomalies": len(check["anomalies"]),
        "check": check,
        "timings_s": {name: round(value, 3) for name, value in timings.items()},
        "files": {
            "history": "history.jsonl",
            "status": "status.jsonl",
            "report": "report.html",
            "nodes": "nodes/",
        },
    }
