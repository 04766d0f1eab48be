"""xr's scheduling policy against FIFO first-fit and random placement, on one simulated trace.

For the same trace and seed (`bench/scheduler_trace.py`: Philly-like job sizes and run times,
diurnal arrivals, 14 tenants, 5 heterogeneous regions with outages), the simulator
(`bench/scheduler_sim.py`) runs each policy to completion and this script prints, per policy:
average and p95 job completion time (JCT, submission to the last task's end), GPU utilization
(GPU time held by tasks over GPU time of healthy regions, both over the arrival window `--hours`:
after it the cluster drains and utilization says little), cost, carbon,
Jain's fairness index across tenants (over each tenant's mean slowdown: JCT over the job's run
time on a speed-1.0 device, inverted so that equal service gives 1), preemptions and the work
they and failures lost. Then the ratios to FIFO first-fit, the issue's targets (met or not met),
and the time of one scheduling pass over 10,000 pending tasks and 50 regions. A PNG of the
completion-time distributions goes to `--plot`.

Baselines, with the same `Decisions` type as the policy:
- FIFO first-fit: strict submission order; each task to the first region (by name) where it
  fits now; stop at the first that fits nowhere (head-of-line blocking, no backfill).
- Random: each pending task in submission order to a uniformly random region where it fits now
  (seeded); skipped when none.

Run: `python bench/scheduler.py [--seed S] [--jobs N] [--hours H] [--quick] [--plot PATH]`.
The last line is one JSON object. The cluster is sized for the trace's work over `--hours` at
`--load`, so a very short window or a very low load asks for millions of GPUs: beyond
`TRACE_GPUS_MAX` the script says so and stops instead of simulating for hours.

`--seeds 1-13` (a range, or a list such as `1,4,7`) runs xr and FIFO first-fit on the trace of
each seed instead, and prints one row per seed (xr's figures as ratios to FIFO first-fit's), the
mean and worst ratio over the seeds and on how many seeds each target is met: one seed's trace
is one draw of heavy-tailed run times, and a policy change that helps one seed often costs
another, so compare policies over many (about 10 s per seed here). The last line is one JSON
object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on the path, and `bench/raftstore.py` there
# would shadow the `raftstore` package; the repository root takes its place.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from dataclasses import replace  # noqa: E402

from bench._arguments import check_output_path  # noqa: E402
from bench._signals import run_main  # noqa: E402
from bench.scheduler_sim import (  # noqa: E402
    Policy,
    Result,
    SimSettings,
    jain_index,
    percentile,
    simulate,
)
from bench.scheduler_trace import (  # noqa: E402
    GPU_MIX,
    HOUR_MS,
    Trace,
    TraceTooLarge,
    generate,
    size_mix,
)
from xrcore.devices import DeviceLedger  # noqa: E402
from xrcore.scheduler import (  # noqa: E402
    Assign,
    Cluster,
    Decisions,
    GpuInfo,
    RegionInfo,
    SchedulerSettings,
    TaskInfo,
    TenantInfo,
    schedule,
)

TARGET_MEAN_RATIO = 0.6
TARGET_P95_RATIO = 0.7
TARGET_PASS_MS = 100.0
DEFAULT_PLOT = _BENCH_DIRECTORY / "results" / "scheduler.png"
# The plot's format is its file's ending (matplotlib would add ".png" to a name without one).
PLOT_ENDINGS = (".png", ".svg", ".pdf")
# The largest trace cluster simulated (the default trace's has 272 GPUs, --quick's 456).
TRACE_GPUS_MAX = 10_000


# Baselines.


def _ledgers(cluster: Cluster) -> dict[str, DeviceLedger]:
    """Each healthy region's devices, less what its assigned and running tasks hold."""
    ledgers = {
        region.name: DeviceLedger(
            memory_mb=[gpu.memory_mb for gpu in region.gpus],
            models=[gpu.model for gpu in region.gpus],
        )
        for region in sorted(cluster.regions, key=lambda item: item.name)
        if region.healthy
    }
    for task in cluster.tasks:
        if task.state != "pending" and task.region in ledgers:
            ledgers[task.region].reserve(
                gpus=task.gpus, memory_mb=task.gpu_memory_mb, model=task.gpu_model
            )
    return ledgers


def _in_order(cluster: Cluster) -> list[TaskInfo]:
    pending = [task for task in cluster.tasks if task.state == "pending" and task.eligible]
    return sorted(pending, key=lambda task: (task.submitted_ms, task.job_id, task.task_index))


def _fits(ledger: DeviceLedger, task: TaskInfo) -> bool:
    grant = ledger.reserve(gpus=task.gpus, memory_mb=task.gpu_memory_mb, model=task.gpu_model)
    return grant is not None


def fifo_first_fit(cluster: Cluster, settings: SchedulerSettings) -> Decisions:
    """Strict submission order, first region by name that fits; stops at the first task that
    fits nowhere."""
    ledgers = _ledgers(cluster)
    decisions = Decisions()
    for task in _in_order(cluster):
        region = next(
            (name for name, ledger in ledgers.items() if task.allows(name) and _fits(ledger, task)),
            None,
        )
        if region is None:
            break
        decisions.assigns.append(
            Assign(job_id=task.job_id, task_index=task.task_index, region=region, reason="fifo")
        )
        if len(decisions.assigns) >= settings.decisions_max:
            break
    return decisions


def random_placement(seed: int) -> Policy:
    """Each pending task in submission order to a uniformly random region where it fits now
    (seeded); skipped when none."""
    rng = random.Random(seed)

    def policy(cluster: Cluster, settings: SchedulerSettings) -> Decisions:
        ledgers = _ledgers(cluster)
        decisions = Decisions()
        for task in _in_order(cluster):
            grants = {}
            for name, ledger in ledgers.items():
                free = len(ledger.memory_mb) - len(ledger.whole) - len(ledger.shared_mb)
                if free < task.gpus or not task.allows(name):
                    continue
                grant = ledger.reserve(
                    gpus=task.gpus, memory_mb=task.gpu_memory_mb, model=task.gpu_model
                )
                if grant is not None:
                    grants[name] = grant
            if not grants:
                continue
            chosen = rng.choice(sorted(grants))
            # Each fitting region reserved a trial grant; only the chosen one keeps it.
            for name, grant in grants.items():
                if name != chosen:
                    ledgers[name].release(grant)
            decisions.assigns.append(
                Assign(
                    job_id=task.job_id, task_index=task.task_index, region=chosen, reason="random"
                )
            )
            if len(decisions.assigns) >= settings.decisions_max:
                break
        return decisions

    return policy


def xr_policy(cluster: Cluster, settings: SchedulerSettings) -> Decisions:
    return schedule(cluster, settings)


# Metrics.


def _hours(value_ms: float) -> float:
    return value_ms / HOUR_MS


def summary(result: Result) -> dict[str, float]:
    """The figures of one run, in the units printed."""
    completions = [float(value) for value in result.completion_ms.values()]
    slowdowns: dict[str, list[float]] = {}
    for job_id, completion_ms in result.completion_ms.items():
        slowdown = completion_ms / max(result.ideal_ms[job_id], 1)
        slowdowns.setdefault(result.tenant_of[job_id], []).append(slowdown)
    service = [1 / statistics.fmean(values) for _, values in sorted(slowdowns.items())]
    return {
        "jobs": float(len(completions)),
        "unfinished": float(len(result.unfinished)),
        "mean_jct_h": _hours(statistics.fmean(completions)) if completions else 0.0,
        "p50_jct_h": _hours(percentile(completions, 0.50)),
        "p95_jct_h": _hours(percentile(completions, 0.95)),
        "utilization": result.utilization,
        "cost_dollars": result.cost_dollars,
        "carbon_kg": result.carbon_kg,
        "jain": jain_index(service),
        "preemptions": float(result.preemptions),
        "moves": float(result.moves),
        "lost_gpu_h": _hours(result.lost_work_gpu_ms),
        "makespan_h": _hours(result.makespan_ms),
        "passes": float(result.passes),
        "policy_s": result.policy_seconds,
        "violations": float(len(result.violations)),
    }


# The pass at scale.


def scale_cluster(seed: int, *, tasks: int = 10_000, regions: int = 50) -> Cluster:
    """`tasks` pending tasks of Philly-like shapes and 14 tenants over `regions` regions of 8 to
    64 GPUs, each region half full of running tasks."""
    rng = random.Random(seed)
    models = (("V100", 32_768, 1.0), ("A100", 81_920, 2.0), ("H100", 81_920, 3.5))
    region_infos = []
    running: list[TaskInfo] = []
    for number in range(regions):
        model, memory_mb, speed = rng.choice(models)
        count = 8 * rng.randint(1, 8)
        name = f"r{number:02d}"
        region_infos.append(
            RegionInfo(
                name=name,
                gpus=tuple(GpuInfo(model=model, memory_mb=memory_mb) for _ in range(count)),
                price_per_gpu_hour=rng.uniform(1.0, 7.0),
                carbon_g_per_kwh=rng.uniform(30.0, 700.0),
                speed=speed,
                rtt_ms={f"r{other:02d}": rng.uniform(10.0, 250.0) for other in range(number)},
            )
        )
        for index in range(count // 2):
            running.append(
                TaskInfo(
                    job_id=f"run-{name}",
                    task_index=index,
                    tenant=f"vc{rng.randrange(14):02d}",
                    state="running",
                    region=name,
                    gpus=1,
                    started_ms=rng.randrange(0, 3_600_000),
                    checkpointed_ms=None,
                    token=index + 1,
                    estimate_ms=rng.randrange(600_000, 36_000_000),
                )
            )
    sizes = (1, 1, 1, 1, 1, 1, 1, 2, 2, 4, 4, 4, 8)
    pending = [
        TaskInfo(
            job_id=f"job-{number:05d}",
            task_index=0,
            tenant=f"vc{rng.randrange(14):02d}",
            priority=1 if rng.random() < 0.1 else 0,
            gpus=rng.choice(sizes),
            gpu_memory_mb=40_000 if rng.random() < 0.2 else 0,
            input_size_mb=rng.randrange(1_000, 100_000),
            input_region=f"r{rng.randrange(regions):02d}",
            submitted_ms=number,
            estimate_ms=rng.randrange(600_000, 36_000_000),
        )
        for number in range(tasks)
    ]
    return Cluster(
        now_ms=3_600_000,
        regions=tuple(region_infos),
        tasks=tuple(running + pending),
        tenants={f"vc{number:02d}": TenantInfo(name=f"vc{number:02d}") for number in range(14)},
    )


def moving_cluster(cluster: Cluster) -> Cluster:
    """`cluster`'s running tasks only, each estimated at 20 hours: every faster region has room,
    and every running task is weighed for moving up."""
    running = tuple(
        replace(task, estimate_ms=20 * HOUR_MS) for task in cluster.tasks if task.state == "running"
    )
    return replace(cluster, tasks=running)


def time_pass(
    cluster: Cluster, settings: SchedulerSettings, *, rounds: int
) -> tuple[list[float], list[float]]:
    """Milliseconds of this process's CPU time, and of wall-clock time, of `rounds` passes. CPU
    time is the headline: other load on the machine does not distort it."""
    cpu_ms, wall_ms = [], []
    for _ in range(rounds):
        wall_started, cpu_started = time.perf_counter(), time.process_time()
        schedule(cluster, settings)
        cpu_ms.append((time.process_time() - cpu_started) * 1000)
        wall_ms.append((time.perf_counter() - wall_started) * 1000)
    return cpu_ms, wall_ms


# Output.


def plot(results: dict[str, Result], path: Path, trace: Trace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (cdf_axes, box_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, result in results.items():
        hours = sorted(_hours(value) for value in result.completion_ms.values())
        if not hours:
            continue
        fractions = [(rank + 1) / len(hours) for rank in range(len(hours))]
        cdf_axes.step(hours, fractions, where="post", label=name)
    cdf_axes.set_xscale("log")
    cdf_axes.set_xlabel("job completion time (hours, log scale)")
    cdf_axes.set_ylabel("fraction of jobs")
    cdf_axes.set_title("Completion-time CDF")
    cdf_axes.grid(True, which="both", alpha=0.3)
    cdf_axes.legend()
    names = list(results)
    box_axes.boxplot(
        [[_hours(value) for value in results[name].completion_ms.values()] for name in names],
        showmeans=True,
        whis=(5, 95),
    )
    box_axes.set_xticks(range(1, len(names) + 1), names)
    box_axes.set_yscale("log")
    box_axes.set_ylabel("hours (log scale); whiskers p5-p95, triangle = mean")
    box_axes.set_title("Completion-time distribution")
    figure.suptitle(
        f"{len(trace.jobs)} jobs over {trace.hours:g} h, seed {trace.seed}, load {trace.load:g}, "
        f"{sum(len(region.gpus) for region in trace.regions)} GPUs in {len(trace.regions)} regions"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _work_gpu_h_per_job(trace: Trace) -> float:
    """The trace's work per job, in GPU-hours at speed 1."""
    return sum(job.gpus * sum(job.work_ms) for job in trace.jobs) / len(trace.jobs) / HOUR_MS


def _describe_mix(trace: Trace) -> str:
    """The trace's jobs by GPUs per task against the cited mix, and its work per job."""
    mix = size_mix(trace)
    sizes = "/".join(str(gpus) for gpus, _ in GPU_MIX)
    shares = " / ".join(f"{mix[gpus]:.0%}" for gpus, _ in GPU_MIX)
    cited = " / ".join(f"{share:.0%}" for _, share in GPU_MIX)
    return (
        f"jobs of {sizes} GPUs {shares} (the cited mix: {cited}), "
        f"{_work_gpu_h_per_job(trace):.1f} GPU-h of work a job at speed 1"
    )


def _table(rows: Iterable[tuple[str, dict[str, float]]]) -> str:
    columns = (
        ("mean JCT h", "mean_jct_h", "{:.2f}"),
        ("p50 JCT h", "p50_jct_h", "{:.2f}"),
        ("p95 JCT h", "p95_jct_h", "{:.2f}"),
        ("GPU util", "utilization", "{:.1%}"),
        ("cost $", "cost_dollars", "{:,.0f}"),
        ("carbon kg", "carbon_kg", "{:,.0f}"),
        ("Jain", "jain", "{:.3f}"),
        ("preempt", "preemptions", "{:.0f}"),
        ("moves", "moves", "{:.0f}"),
        ("lost GPU-h", "lost_gpu_h", "{:.1f}"),
        ("unfinished", "unfinished", "{:.0f}"),
        ("policy s", "policy_s", "{:.2f}"),
    )
    lines = [
        "| policy | " + " | ".join(title for title, _, _ in columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    for name, figures in rows:
        cells = [form.format(figures[key]) for _, key, form in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# Across seeds.

SEED_RATIOS = ("mean_jct_h", "p95_jct_h", "cost_dollars", "carbon_kg")


def parse_seeds(text: str) -> list[int]:
    """`1-13` or `1,4,7` (or both: `1-3,9`), in the order given, each once."""
    seeds: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected seeds such as 1-13 or 1,4,7"
            ) from None
        if high < low or high - low >= 1000:
            raise argparse.ArgumentTypeError(f"{part!r}: a range runs upward, at most 1000 seeds")
        seeds.extend(seed for seed in range(low, high + 1) if seed not in seeds)
    return seeds


def across_seeds(
    seeds: Iterable[int], *, jobs: int, hours: float, load: float
) -> list[dict[str, float]]:
    """For each seed, xr's figures as ratios to FIFO first-fit's on that seed's trace, with
    xr's Jain index and any violations of either policy."""
    rows = []
    settings = SimSettings(check_invariants=False)
    for seed in seeds:
        started = time.perf_counter()
        trace = generate(seed, jobs=jobs, hours=hours, load=load, gpus_max=TRACE_GPUS_MAX)
        runs = {
            name: simulate(trace, policy, name=name, settings=settings)
            for name, policy in (("xr", xr_policy), ("fifo-first-fit", fifo_first_fit))
        }
        xr, fifo = (summary(runs[name]) for name in ("xr", "fifo-first-fit"))
        row: dict[str, float] = {"seed": seed}
        row.update({key: xr[key] / fifo[key] if fifo[key] else math.nan for key in SEED_RATIOS})
        row["jain"] = xr["jain"]
        row["unfinished"] = xr["unfinished"] + fifo["unfinished"]
        row["violations"] = sum(float(len(result.violations)) for result in runs.values())
        # How far this seed's trace strays from the cited job-size mix, and how much work it has.
        row["multi_gpu_share"] = 1 - size_mix(trace)[1]
        row["work_gpu_h_per_job"] = _work_gpu_h_per_job(trace)
        rows.append(row)
        print(
            f"seed {seed}: mean JCT {row['mean_jct_h']:.3f}x, p95 {row['p95_jct_h']:.3f}x; "
            f"{_describe_mix(trace)} ({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
    return rows


def _seed_targets(row: dict[str, float]) -> dict[str, bool]:
    return {
        "mean_jct_h": row["mean_jct_h"] <= TARGET_MEAN_RATIO,
        "p95_jct_h": row["p95_jct_h"] <= TARGET_P95_RATIO,
        "cost_dollars": row["cost_dollars"] <= 1,
        "carbon_kg": row["carbon_kg"] <= 1,
    }


def _seeds_report(rows: list[dict[str, float]]) -> tuple[str, dict[str, dict[str, float]]]:
    """The per-seed table, and per ratio its mean, worst and the seeds meeting its target."""
    lines = [
        "| seed | mean JCT | p95 JCT | cost | carbon | xr's Jain | unfinished | violations "
        "| multi-GPU jobs | GPU-h a job |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        ratios = " | ".join(f"{row[key]:.3f}x" for key in SEED_RATIOS)
        lines.append(
            f"| {row['seed']:.0f} | {ratios} | {row['jain']:.3f} | {row['unfinished']:.0f} | "
            f"{row['violations']:.0f} | {row['multi_gpu_share']:.0%} | "
            f"{row['work_gpu_h_per_job']:.1f} |"
        )
    overall = {
        key: {
            "mean": statistics.fmean(row[key] for row in rows),
            "worst": max(row[key] for row in rows),
            "met": float(sum(_seed_targets(row)[key] for row in rows)),
        }
        for key in SEED_RATIOS
    }
    for label, field in (("mean", "mean"), ("worst", "worst")):
        ratios = " | ".join(f"{overall[key][field]:.3f}x" for key in SEED_RATIOS)
        lines.append(f"| {label} | {ratios} | | | | | |")
    met = " | ".join(f"{overall[key]['met']:.0f} of {len(rows)}" for key in SEED_RATIOS)
    lines.append(f"| target met | {met} | | | | | |")
    return "\n".join(lines), overall


def _main_seeds(seeds: list[int], *, jobs: int, hours: float, load: float) -> None:
    print(
        f"{len(seeds)} seed(s), {jobs} jobs over {hours:g} h each, load {load:g}: xr against "
        f"FIFO first-fit on each seed's trace (ratios: xr / FIFO first-fit; targets: mean JCT "
        f"<= {TARGET_MEAN_RATIO}x, p95 <= {TARGET_P95_RATIO}x, cost and carbon <= 1x)",
        flush=True,
    )
    rows = across_seeds(seeds, jobs=jobs, hours=hours, load=load)
    table, overall = _seeds_report(rows)
    print()
    print(table)
    print(json.dumps({"seeds": rows, "overall": overall, "jobs": jobs, "hours": hours}))


def _verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


def main() -> None:
    sys.exit(run_main(_main))


def _main() -> int:
    try:
        return _run()
    except TraceTooLarge as error:
        print(f"scheduler: {error}", file=sys.stderr)
        return 2


def _run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=None,
        help="run xr and FIFO first-fit over many seeds' traces (1-13, or 1,4,7) and summarize",
    )
    parser.add_argument("--jobs", type=int, default=None, help="jobs in the trace (default 1000)")
    parser.add_argument(
        "--hours", type=float, default=None, help="arrival window in hours (default 168)"
    )
    parser.add_argument("--load", type=float, default=0.9, help="offered load of the cluster")
    parser.add_argument("--quick", action="store_true", help="a small trace, for a smoke test")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--pass-rounds", type=int, default=None)
    arguments = parser.parse_args()
    if any(value is not None and value < 1 for value in (arguments.jobs, arguments.pass_rounds)):
        parser.error("--jobs and --pass-rounds must be at least 1")
    # Written so that NaN, which compares false with anything, is refused too.
    if not (arguments.hours is None or 0 < arguments.hours < math.inf) or not (
        0 < arguments.load < math.inf
    ):
        parser.error("--hours and --load must be positive and finite")
    if not arguments.no_plot and arguments.seeds is None:
        check_output_path(parser, "--plot", arguments.plot, make_parents=True)
        if arguments.plot.suffix.lower() not in PLOT_ENDINGS:
            parser.error(f"--plot {arguments.plot}: must end in {', '.join(PLOT_ENDINGS)}")
    jobs = arguments.jobs or (80 if arguments.quick else 1000)
    hours = arguments.hours or (12.0 if arguments.quick else 168.0)
    rounds = arguments.pass_rounds or (3 if arguments.quick else 10)
    if arguments.seeds is not None:
        _main_seeds(arguments.seeds, jobs=jobs, hours=hours, load=arguments.load)
        return 0

    trace = generate(
        arguments.seed, jobs=jobs, hours=hours, load=arguments.load, gpus_max=TRACE_GPUS_MAX
    )
    gpus = {region.name: len(region.gpus) for region in trace.regions}
    tasks = sum(len(job.work_ms) for job in trace.jobs)
    print(
        f"trace: seed {trace.seed}, {len(trace.jobs)} jobs ({tasks} tasks) over {hours:g} h, "
        f"load {trace.load:g}, GPUs {gpus}, {len(trace.outages)} region outages; "
        f"{_describe_mix(trace)}",
        flush=True,
    )
    settings = SimSettings(check_invariants=False)
    policies: dict[str, Policy] = {
        "xr": xr_policy,
        "fifo-first-fit": fifo_first_fit,
        "random": random_placement(arguments.seed),
    }
    results: dict[str, Result] = {}
    figures: dict[str, dict[str, float]] = {}
    for name, policy in policies.items():
        started = time.perf_counter()
        results[name] = simulate(trace, policy, name=name, settings=settings)
        figures[name] = summary(results[name])
        print(
            f"{name}: simulated in {time.perf_counter() - started:.1f} s, "
            f"{figures[name]['passes']:.0f} passes",
            flush=True,
        )
    print()
    print(_table(figures.items()))

    fifo, xr = figures["fifo-first-fit"], figures["xr"]
    ratios = {
        key: (xr[key] / fifo[key] if fifo[key] else float("nan"))
        for key in ("mean_jct_h", "p95_jct_h", "cost_dollars", "carbon_kg", "utilization")
    }
    print()
    print(
        "xr / fifo-first-fit: " + ", ".join(f"{key} {value:.2f}x" for key, value in ratios.items())
    )
    random_figures = figures["random"]
    print(
        "xr / random: "
        + ", ".join(
            f"{key} {xr[key] / random_figures[key]:.2f}x"
            for key in ("mean_jct_h", "p95_jct_h", "cost_dollars", "carbon_kg")
            if random_figures[key]
        )
    )

    cluster = scale_cluster(arguments.seed)
    time_pass(cluster, SchedulerSettings(), rounds=1)  # Warm-up: imports, allocator, caches.
    capped_cpu_ms, capped_wall_ms = time_pass(cluster, SchedulerSettings(), rounds=rounds)
    # The full pass: every one of the 10,000 tasks placed or given a reason.
    full = SchedulerSettings(decisions_max=1_000_000, reasons_max=1_000_000)
    full_cpu_ms, full_wall_ms = time_pass(cluster, full, rounds=rounds)
    pass_ms = statistics.median(full_cpu_ms)
    moving = moving_cluster(cluster)
    moving_cpu_ms, _ = time_pass(moving, full, rounds=rounds)
    print()
    print(
        f"pass over 10,000 pending tasks x 50 regions, median of {rounds} (CPU ms, wall ms): "
        f"full {pass_ms:.1f}, {statistics.median(full_wall_ms):.1f}; with the default "
        f"decisions_max of 256 {statistics.median(capped_cpu_ms):.1f}, "
        f"{statistics.median(capped_wall_ms):.1f}; its {len(moving.tasks)} running tasks alone, "
        f"all weighed for moving up {statistics.median(moving_cpu_ms):.1f} CPU ms"
    )

    targets = [
        (
            f"average JCT <= {TARGET_MEAN_RATIO}x FIFO first-fit's ({ratios['mean_jct_h']:.3f}x)",
            ratios["mean_jct_h"] <= TARGET_MEAN_RATIO,
        ),
        (
            f"p95 JCT <= {TARGET_P95_RATIO}x FIFO first-fit's ({ratios['p95_jct_h']:.3f}x)",
            ratios["p95_jct_h"] <= TARGET_P95_RATIO,
        ),
        (f"cost <= FIFO first-fit's ({ratios['cost_dollars']:.3f}x)", ratios["cost_dollars"] <= 1),
        (f"carbon <= FIFO first-fit's ({ratios['carbon_kg']:.3f}x)", ratios["carbon_kg"] <= 1),
        (
            f"full pass over 10,000 tasks x 50 regions < {TARGET_PASS_MS:g} ms of CPU "
            f"({pass_ms:.1f} ms)",
            pass_ms < TARGET_PASS_MS,
        ),
        (
            "no capacity, quota or placement violations",
            all(not result.violations for result in results.values()),
        ),
    ]
    print()
    for text, met in targets:
        print(f"target: {text}: {_verdict(met)}")
    plotted = True
    if not arguments.no_plot:
        try:
            plot(results, arguments.plot, trace)
            print(f"plot: {arguments.plot}")
        except OSError as error:
            print(f"scheduler: cannot write {arguments.plot}: {error.strerror}", file=sys.stderr)
            plotted = False
    print(
        json.dumps(
            {
                "seed": trace.seed,
                "jobs": len(trace.jobs),
                "hours": hours,
                "figures": figures,
                "ratios_vs_fifo": ratios,
                "pass_ms": pass_ms,
                "move_up_pass_ms": statistics.median(moving_cpu_ms),
                "targets": {text: met for text, met in targets},
            },
            sort_keys=True,
        )
    )
    return 0 if plotted else 1


if __name__ == "__main__":
    main()
