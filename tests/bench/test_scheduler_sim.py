"""The scheduling simulator and its trace: every job finishes (no starvation), no placement ever
exceeds a region's devices, quotas hold, the same seed gives the same run, and the trace follows
the statistics it cites. Small traces keep it fast.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import statistics
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.scheduler import fifo_first_fit, random_placement, summary
from bench.scheduler_sim import Result, SimSettings, _Stats, jain_index, percentile, simulate
from bench.scheduler_trace import (
    GPU_MIX,
    HOUR_MS,
    MINUTE_MS,
    Trace,
    generate,
    regions,
    size_mix,
)
from xrcore.scheduler import (
    Assign,
    Cluster,
    Decisions,
    SchedulerSettings,
    TenantInfo,
    estimate_ms,
    schedule,
)


def _small(seed: int, *, jobs: int = 30, hours: float = 6.0) -> Trace:
    return generate(seed, jobs=jobs, hours=hours)


def _outcome(result: Result) -> tuple[object, ...]:
    """Everything a run decides, without its wall-clock timing."""
    return (
        result.completion_ms,
        result.last_region,
        result.first_start_ms,
        result.busy_gpu_ms,
        result.cost_dollars,
        result.carbon_kg,
        result.preemptions,
        result.lost_work_gpu_ms,
        result.passes,
    )


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_every_job_finishes_and_no_placement_exceeds_a_region(seed: int) -> None:
    trace = _small(seed)
    result = simulate(trace, schedule, name="xr", settings=SimSettings())
    assert result.violations == [], f"seed {seed}"
    assert result.unfinished == [], f"seed {seed}: starved"
    assert set(result.completion_ms) == {job.job_id for job in trace.jobs}
    # A job never completes sooner than its longest task at the fastest region's speed.
    fastest = max(region.speed for region in trace.regions)
    for job in trace.jobs:
        assert result.completion_ms[job.job_id] >= max(job.work_ms) / fastest - 1


@pytest.mark.parametrize("name", ["fifo-first-fit", "random"])
def test_the_baselines_also_finish_everything_within_capacity(name: str) -> None:
    policy = fifo_first_fit if name == "fifo-first-fit" else random_placement(3)
    result = simulate(_small(3), policy, name=name)
    assert result.violations == [] and result.unfinished == []


def test_quotas_hold_at_every_pass_and_every_job_still_finishes() -> None:
    trace = _small(5, jobs=40)
    tenants = {
        name: replace(tenant, gpus_max=8, tasks_max=3) for name, tenant in trace.tenants.items()
    }
    result = simulate(replace(trace, tenants=tenants), schedule, name="xr")
    assert result.violations == []
    assert result.unfinished == []


def test_a_quota_the_policy_ignores_is_reported() -> None:
    # FIFO first-fit knows nothing of quotas: the simulator's check catches it.
    trace = _small(5, jobs=40)
    tenants = {name: replace(tenant, tasks_max=1) for name, tenant in trace.tenants.items()}
    result = simulate(replace(trace, tenants=tenants), fifo_first_fit, name="fifo")
    assert any("over its quota" in violation for violation in result.violations)


def test_an_over_capacity_assignment_is_refused_and_reported() -> None:
    def everything_to_one_region(cluster: Cluster, settings: SchedulerSettings) -> Decisions:
        target = min(region.name for region in cluster.regions)
        return Decisions(
            assigns=[
                Assign(job_id=task.job_id, task_index=task.task_index, region=target, reason="")
                for task in cluster.tasks
                if task.state == "pending" and task.allows(target)
            ]
        )

    result = simulate(
        _small(2, jobs=60, hours=1), everything_to_one_region, settings=SimSettings(passes_max=50)
    )
    assert any("over capacity" in violation for violation in result.violations)


def test_the_same_seed_gives_the_same_run() -> None:
    first = simulate(_small(7), schedule, name="xr")
    second = simulate(_small(7), schedule, name="xr")
    assert _outcome(first) == _outcome(second)
    third = simulate(_small(7), random_placement(1), name="random")
    assert _outcome(third) == _outcome(simulate(_small(7), random_placement(1), name="random"))
    assert _small(7) == _small(7)
    assert _small(7) != _small(8)


def test_estimates_are_learned_as_the_replicated_state_learns_them() -> None:
    stats = _Stats()
    stats.add(60_000)
    assert (stats.count, stats.mean_ms, stats.deviation_ms) == (1, 60_000, 30_000)
    stats.add(100_000)
    # mean += (100000 - 60000) // 4; deviation += (|100000 - 70000| - 30000) // 4
    assert (stats.mean_ms, stats.deviation_ms) == (70_000, 30_000)
    assert estimate_ms(stats.count, stats.mean_ms, stats.deviation_ms, default_ms=1) == 130_000


def test_a_region_failure_requeues_its_tasks_and_loses_work_since_the_checkpoint() -> None:
    trace = _small(11, jobs=40, hours=12)
    assert trace.outages, "this seed has outages"
    # Without moves up: with them, this seed's work is done before its first outage (50 h).
    settings = SimSettings(policy=SchedulerSettings(move_ups_max=0))
    result = simulate(trace, schedule, name="xr", settings=settings)
    assert result.unfinished == [] and result.violations == []
    assert result.lost_work_gpu_ms > 0
    # Without outages nothing is lost but to preemption.
    calm = simulate(replace(trace, outages=()), schedule, name="xr", settings=settings)
    if calm.preemptions == 0:
        assert calm.lost_work_gpu_ms == 0


def test_the_policy_is_called_at_least_every_simulated_minute_while_tasks_wait() -> None:
    # One 8-GPU machine per region: 40 jobs in 2 hours queue.
    trace = replace(_small(13, jobs=40, hours=2), regions=regions(8.0))
    # (time of the call, tasks still pending after its decisions)
    calls: list[tuple[int, int]] = []

    def recording(cluster: Cluster, settings: SchedulerSettings) -> Decisions:
        decisions = schedule(cluster, settings)
        pending = sum(1 for task in cluster.tasks if task.state == "pending")
        calls.append((cluster.now_ms, pending - len(decisions.assigns) + len(decisions.preempts)))
        return decisions

    simulate(trace, recording, name="xr")
    waited = [
        later_ms - earlier_ms
        for (earlier_ms, left), (later_ms, _) in itertools.pairwise(calls)
        if left > 0
    ]
    assert waited, "this trace makes tasks wait"
    assert max(waited) <= MINUTE_MS


def test_the_trace_follows_its_cited_statistics() -> None:
    trace = generate(0, jobs=4_000, hours=24 * 14, outages=False)
    sizes = Counter(job.gpus for job in trace.jobs)
    total = len(trace.jobs)
    # Philly's mix per Gavel: 70% 1 GPU, 10% 2, 15% 4, 5% 8 (per entrypoint, so loosely).
    assert 0.55 <= sizes[1] / total <= 0.85
    assert sizes[8] / total <= 0.15
    works = [work for job in trace.jobs for work in job.work_ms]
    median_h = statistics.median(works) / HOUR_MS
    assert 1.0 <= median_h <= 12.0  # the mix's median is about 4 hours
    assert max(works) >= 3 * 24 * HOUR_MS  # a tail of multi-day jobs
    assert min(works) >= MINUTE_MS
    # Diurnal arrivals: more jobs by day (08:00-20:00) than by night.
    day = sum(1 for job in trace.jobs if 8 <= (job.submitted_ms // HOUR_MS) % 24 < 20)
    assert day / total >= 0.6
    assert len({job.tenant for job in trace.jobs}) == 14
    rtts = [rtt for region in trace.regions for rtt in region.rtt_ms.values()]
    assert min(rtts) == 10.0 and max(rtts) == 250.0
    assert len({region.gpus[0].model for region in trace.regions}) == 5


def test_the_cluster_is_sized_for_the_offered_load() -> None:
    trace = generate(4, jobs=200, hours=48, load=0.9)
    capacity_ms = sum(len(region.gpus) * region.speed for region in trace.regions) * 48 * HOUR_MS
    work_ms = sum(job.gpus * sum(job.work_ms) for job in trace.jobs)
    # Rounding to 8-GPU machines moves it a little.
    assert 0.75 <= work_ms / capacity_ms <= 1.05


def test_metrics() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(value) for value in range(1, 101)], 0.95) == 95.0
    figures = summary(simulate(_small(1, jobs=10), schedule, name="xr"))
    assert figures["jobs"] == 10 and 0 < figures["jain"] <= 1
    tenant = TenantInfo(name="t")
    assert tenant.weight == 1.0


def test_the_benchmark_runs_quick_and_ends_with_one_json_line(tmp_path: Path) -> None:
    arguments = ["--quick", "--pass-rounds", "1"]
    plot = tmp_path / "scheduler.png"
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    arguments += ["--plot", str(plot)] if has_matplotlib else ["--no-plot"]
    script = Path(__file__).resolve().parents[2] / "bench" / "scheduler.py"
    done = subprocess.run(
        [sys.executable, str(script), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(last["figures"]) == {"xr", "fifo-first-fit", "random"}
    assert last["figures"]["xr"]["unfinished"] == 0
    assert "target: average JCT" in done.stdout
    assert plot.exists() == has_matplotlib


def test_the_benchmark_over_many_seeds_summarizes_each_and_all(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "bench" / "scheduler.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--seeds", "2-3,7"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert [row["seed"] for row in last["seeds"]] == [2, 3, 7]
    for row in last["seeds"]:
        trace = generate(int(row["seed"]), jobs=80, hours=12.0)
        xr = summary(simulate(trace, schedule, name="xr", settings=SimSettings()))
        fifo = summary(simulate(trace, fifo_first_fit, name="fifo", settings=SimSettings()))
        assert row["mean_jct_h"] == pytest.approx(xr["mean_jct_h"] / fifo["mean_jct_h"])
        assert row["unfinished"] == 0 and row["violations"] == 0
        single = sum(job.gpus == 1 for job in trace.jobs) / len(trace.jobs)
        assert row["multi_gpu_share"] == pytest.approx(1 - single)
    overall = last["overall"]["p95_jct_h"]
    p95 = [row["p95_jct_h"] for row in last["seeds"]]
    assert overall["worst"] == max(p95)
    assert overall["met"] == sum(value <= 0.7 for value in p95)
    assert "| target met |" in done.stdout


def test_size_mix__counts_each_trace_s_jobs_and_matches_the_cited_mix_only_across_seeds() -> None:
    """One trace's job sizes follow its few entrypoints per tenant; over many seeds they follow
    `GPU_MIX`. The benchmark prints each seed's mix so a reader can tell a hard trace."""
    traces = [generate(seed, jobs=300, hours=24.0) for seed in range(1, 31)]
    for trace in traces[:3]:
        mix = size_mix(trace)
        assert set(mix) == {gpus for gpus, _ in GPU_MIX}
        for gpus, share in mix.items():
            assert share == sum(job.gpus == gpus for job in trace.jobs) / len(trace.jobs)
    mixes = [size_mix(trace) for trace in traces]
    for gpus, cited in GPU_MIX:
        shares = [mix[gpus] for mix in mixes]
        assert abs(statistics.fmean(shares) - cited) < 0.05
    # ...while single traces stray far from it.
    assert max(abs(mix[1] - 0.70) for mix in mixes) > 0.1


@pytest.mark.parametrize("text", ["x", "3-1", "1-", "0-5000"])
def test_the_benchmark_refuses_seeds_it_cannot_read(text: str) -> None:
    script = Path(__file__).resolve().parents[2] / "bench" / "scheduler.py"
    done = subprocess.run(
        [sys.executable, str(script), "--seeds", text], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--seeds" in done.stderr and "Traceback" not in done.stderr
