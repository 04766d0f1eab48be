"""A seeded job trace for the scheduling simulator, modelled on published GPU-cluster statistics.

Everything derives from one seed. The numbers, and where they come from:

- **GPU count per job** (gang: all of a job's GPUs in one region): 1 GPU 70%, 2 GPUs 10%,
  4 GPUs 15%, 8 GPUs 5%. This is the job-size mix that Gavel (Narayanan et al., "Heterogeneity-
  Aware Cluster Scheduling Policies for Deep Learning Workloads", OSDI 2020; `scheduler/utils.py`,
  `_generate_scale_factor`, "Sample the scale factor from the Philly distribution") derived from
  the Microsoft Philly trace of Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters
  for DNN Training Workloads" (USENIX ATC 2019), whose Figure 2 groups jobs by the same sizes
  (1, 2-4, 5-8, >8 GPUs); the largest Philly jobs (>8 GPUs, about 1%) are left out, as Gavel does.
- **Run time** (on a reference, speed-1.0 device): heavy-tailed, 10^x minutes with x uniform in
  [1.5, 3] with probability 0.8 (about 32 minutes to 17 hours) and in [3, 4] with probability 0.2
  (17 hours to 7 days): Gavel's `_generate_duration`, again fitted to Philly, where run times span
  minutes to weeks (Jeon et al., Figure 2). The mean is about 17 hours, the median about 4.
- **Tenants**: 14, as Philly's 14 virtual clusters (Jeon et al., section 2); how many jobs each
  submits follows a Zipf law with exponent 1 (our assumption: the paper reports that virtual
  clusters differ widely in size without a distribution). Each tenant's fair-share weight is its
  expected share of the work, as Philly's virtual clusters get quotas by size.
- **Recurring work**: each tenant runs 2 to 6 entrypoints (model and data set); a job's size,
  data set and typical run time are its entrypoint's, and its true run time is the entrypoint's
  times a log-normal factor (sigma 0.5). Jobs of one tenant and entrypoint repeat, which is what
  the policy's learned estimates (per tenant and entrypoint) rely on; Hu et al., "Characterization
  and Prediction of Deep Learning Workloads in Large-Scale GPU Datacenters" (SC 2021), report
  that most jobs recur, and build their run-time predictor on that.
- **Arrivals**: a Poisson process whose rate follows the day: `1 + 0.5 sin(...)`, peaking at
  14:00 and three times the trough at 02:00. Both Philly and the SenseTime clusters (Hu et al.,
  SC 2021) show more submissions by day than by night; the amplitude is our assumption.
- **Sweeps**: 10% of 1-GPU jobs are arrays of 2 to 8 tasks (hyperparameter searches; our
  assumption, Philly's trace records each search's jobs separately).
- **Priorities**: 10% of jobs are production work at priority 1, the rest 0 (our assumption;
  Philly has no priorities but preempts for its fair share).
- **Memory**: 20% of entrypoints need at least 40 GB per GPU (large models), which rules out
  the regions with 16 and 32 GB devices.
- **Data**: each entrypoint's data set is log-normal around 20 GB (sigma 1.2, at most 500 GB),
  homed in its tenant's home region (70%) or another. Checkpoints are log-normal around 2 GB
  (sigma 1, at most 50 GB). One tenant may run only in the EU (data residency).
- **Regions**: 5, with different GPU models (V100 16 GB and 32 GB, A100 40 GB and 80 GB, H100),
  speeds relative to a V100 (A100 2x, H100 3.5x: rounded from MLPerf Training results), on-demand
  prices per GPU-hour rounded from public cloud list prices, carbon intensity from annual grid
  averages (Sweden about 40 g/kWh, India about 700), and round-trip times from 10 ms (two regions
  in one metro area) to 250 ms (US west to India). Capacity (in reference GPUs) is sized so that
  the trace's work (GPUs times run time at speed 1.0, summed over its jobs) is `load` times what
  the cluster can do over the arrival window (default 0.9); each region's share of it is fixed,
  rounded to whole 8-GPU machines. Jobs arriving late run past the window, so the cluster drains
  after it.
- **Outages**: each region fails as a Poisson process (once per 4 days on average) for a
  log-normal time around 1 hour (sigma 0.7): our assumption, far more often than real cloud
  regions fail, so that every run exercises failover.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass

if __name__ == "__main__":
    # Run as a script, a module does nothing or fails on an import: say whose it is.
    print(
        f"{__file__} is a module of bench/scheduler.py, not a script: run "
        "python bench/scheduler.py",
        file=sys.stderr,
    )
    raise SystemExit(2)

from xrcore.scheduler import GpuInfo, RegionInfo, TenantInfo

__all__ = [
    "DAY_MS",
    "HOUR_MS",
    "MINUTE_MS",
    "Outage",
    "Trace",
    "TraceJob",
    "TraceTooLarge",
    "generate",
    "regions",
    "regions_gpus",
    "size_mix",
]

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

# (GPUs per job, probability): Gavel's Philly job-size mix.
GPU_MIX = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
# (probability, lowest and highest log10 of minutes): Gavel's Philly run-time mix.
DURATION_MIX = ((0.8, 1.5, 3.0), (0.2, 3.0, 4.0))
DURATION_SIGMA = 0.5
TENANTS = 14
ENTRYPOINTS_MIN, ENTRYPOINTS_MAX = 2, 6
DIURNAL_AMPLITUDE = 0.5
DIURNAL_PEAK_HOUR = 14
SWEEP_FRACTION = 0.10
SWEEP_TASKS_MIN, SWEEP_TASKS_MAX = 2, 8
PRIORITY_FRACTION = 0.10
LARGE_MEMORY_FRACTION = 0.20
LARGE_MEMORY_MB = 40_000
DATA_MEDIAN_MB = 20_000
DATA_SIGMA = 1.2
DATA_MAX_MB = 500_000
HOME_DATA_FRACTION = 0.7
CHECKPOINT_MEDIAN_MB = 2_000
CHECKPOINT_SIGMA = 1.0
CHECKPOINT_MAX_MB = 50_000
OUTAGE_INTERVAL_MS = 4 * DAY_MS
OUTAGE_MEDIAN_MS = HOUR_MS
OUTAGE_SIGMA = 0.7
MACHINE_GPUS = 8
DEFAULT_LOAD = 0.9


@dataclass(frozen=True, kw_only=True)
class _RegionTemplate:
    name: str
    model: str
    memory_mb: int
    speed: float
    price_per_gpu_hour: float
    carbon_g_per_kwh: float
    # This region's share of the cluster's reference capacity (GPUs times speed).
    share: float


_REGIONS = (
    _RegionTemplate(
        name="ap-south",
        model="V100-16GB",
        memory_mb=16_384,
        speed=1.0,
        price_per_gpu_hour=2.50,
        carbon_g_per_kwh=700.0,
        share=0.10,
    ),
    _RegionTemplate(
        name="eu-north",
        model="A100-40GB",
        memory_mb=40_960,
        speed=2.0,
        price_per_gpu_hour=4.40,
        carbon_g_per_kwh=40.0,
        share=0.20,
    ),
    _RegionTemplate(
        name="us-east",
        model="A100-80GB",
        memory_mb=81_920,
        speed=2.0,
        price_per_gpu_hour=4.10,
        carbon_g_per_kwh=380.0,
        share=0.30,
    ),
    _RegionTemplate(
        name="us-east-2",
        model="V100-32GB",
        memory_mb=32_768,
        speed=1.0,
        price_per_gpu_hour=3.06,
        carbon_g_per_kwh=410.0,
        share=0.15,
    ),
    _RegionTemplate(
        name="us-west",
        model="H100-80GB",
        memory_mb=81_920,
        speed=3.5,
        price_per_gpu_hour=6.88,
        carbon_g_per_kwh=240.0,
        share=0.25,
    ),
)

# Round-trip times in milliseconds, each pair once.
_RTT_MS = {
    ("us-east", "us-east-2"): 10.0,
    ("us-east", "us-west"): 65.0,
    ("us-east-2", "us-west"): 70.0,
    ("us-east", "eu-north"): 95.0,
    ("us-east-2", "eu-north"): 100.0,
    ("eu-north", "us-west"): 160.0,
    ("ap-south", "eu-north"): 140.0,
    ("ap-south", "us-east"): 210.0,
    ("ap-south", "us-east-2"): 215.0,
    ("ap-south", "us-west"): 250.0,
}
EU_REGIONS = ("eu-north",)


@dataclass(frozen=True, kw_only=True)
class TraceJob:
    job_id: str
    tenant: str
    entrypoint: str
    submitted_ms: int
    priority: int
    gpus: int
    gpu_memory_mb: int
    regions_allow: tuple[str, ...]
    input_size_mb: int
    input_region: str
    checkpoint_size_mb: int
    # True run time of each task on a speed-1.0 device (the policy never sees these).
    work_ms: tuple[int, ...]

    @property
    def duration_key(self) -> str:
        """The class whose completed runs teach the estimate, as `xrcore.jobs.duration_key`."""
        return f"{self.tenant}/{self.entrypoint}"


@dataclass(frozen=True, kw_only=True)
class Outage:
    region: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True, kw_only=True)
class Trace:
    seed: int
    regions: tuple[RegionInfo, ...]
    tenants: Mapping[str, TenantInfo]
    jobs: tuple[TraceJob, ...]
    outages: tuple[Outage, ...]
    hours: float
    load: float


@dataclass(frozen=True)
class _Entrypoint:
    name: str
    gpus: int
    gpu_memory_mb: int
    typical_ms: float
    input_size_mb: int
    input_region: str
    checkpoint_size_mb: int


def _machines(capacity_reference_gpus: float, template: _RegionTemplate) -> int:
    count = capacity_reference_gpus * template.share / template.speed
    return max(1, round(count / MACHINE_GPUS))


def regions_gpus(capacity_reference_gpus: float) -> int:
    """How many GPUs `regions(capacity_reference_gpus)` has in all, without making them."""
    return sum(_machines(capacity_reference_gpus, template) * MACHINE_GPUS for template in _REGIONS)


def regions(capacity_reference_gpus: float) -> tuple[RegionInfo, ...]:
    """The 5 regions, with `capacity_reference_gpus` (GPUs times speed) shared out."""
    out = []
    for template in _REGIONS:
        machines = _machines(capacity_reference_gpus, template)
        rtt_ms = {
            other: rtt
            for (first, second), rtt in _RTT_MS.items()
            for this, other in ((first, second), (second, first))
            if this == template.name
        }
        out.append(
            RegionInfo(
                name=template.name,
                gpus=tuple(
                    GpuInfo(model=template.model, memory_mb=template.memory_mb)
                    for _ in range(machines * MACHINE_GPUS)
                ),
                price_per_gpu_hour=template.price_per_gpu_hour,
                carbon_g_per_kwh=template.carbon_g_per_kwh,
                speed=template.speed,
                rtt_ms=rtt_ms,
            )
        )
    return tuple(out)


def _pick(rng: random.Random, mix: tuple[tuple[int, float], ...]) -> int:
    draw, total = rng.random(), 0.0
    for value, probability in mix:
        total += probability
        if draw < total:
            return value
    return mix[-1][0]


def _typical_ms(rng: random.Random) -> float:
    draw, total = rng.random(), 0.0
    for probability, low, high in DURATION_MIX:
        total += probability
        if draw < total:
            return float(10 ** rng.uniform(low, high) * MINUTE_MS)
    _, low, high = DURATION_MIX[-1]
    return float(10 ** rng.uniform(low, high) * MINUTE_MS)


def _lognormal_mb(rng: random.Random, median_mb: float, sigma: float, most_mb: int) -> int:
    return max(1, min(most_mb, round(median_mb * math.exp(rng.gauss(0.0, sigma)))))


def _arrivals_ms(rng: random.Random, count: int, hours: float) -> list[int]:
    """`count` arrival times in [0, hours), Poisson with a diurnal rate (by thinning)."""
    window_ms = hours * HOUR_MS
    times: list[int] = []
    # Draw candidates at the peak rate and keep each with probability rate/peak; repeat until
    # enough, then keep the first `count` in time order (a conditional Poisson sample).
    while len(times) < count:
        candidate = rng.uniform(0.0, window_ms)
        phase = 2 * math.pi * (candidate / HOUR_MS - DIURNAL_PEAK_HOUR + 6) / 24
        rate = 1 + DIURNAL_AMPLITUDE * math.sin(phase)
        if rng.random() * (1 + DIURNAL_AMPLITUDE) < rate:
            times.append(int(candidate))
    return sorted(times)


def _outages(rng: random.Random, names: list[str], horizon_ms: float) -> list[Outage]:
    outages = []
    for name in names:
        now_ms = 0.0
        while True:
            now_ms += rng.expovariate(1 / OUTAGE_INTERVAL_MS)
            if now_ms >= horizon_ms:
                break
            length_ms = OUTAGE_MEDIAN_MS * math.exp(rng.gauss(0.0, OUTAGE_SIGMA))
            outages.append(
                Outage(region=name, start_ms=int(now_ms), end_ms=int(now_ms + length_ms))
            )
            now_ms += length_ms
    return sorted(outages, key=lambda outage: (outage.start_ms, outage.region))


class TraceTooLarge(ValueError):
    """The trace asked for would need a cluster larger than the caller allows."""


def generate(
    seed: int,
    *,
    jobs: int = 600,
    hours: float = 48.0,
    load: float = DEFAULT_LOAD,
    outages: bool = True,
    gpus_max: int | None = None,
) -> Trace:
    """A trace of `jobs` jobs arriving over `hours`, on a cluster sized for `load`; with
    `gpus_max`, `TraceTooLarge` if that cluster would have more GPUs (a short window or a low
    load sizes it for the same work in less time: millions of GPUs, which no simulation
    finishes)."""
    assert jobs > 0 and hours > 0 and load > 0
    rng = random.Random(seed)
    names = [template.name for template in _REGIONS]
    home_weights = [template.share for template in _REGIONS]

    tenant_names = [f"vc{number:02d}" for number in range(TENANTS)]
    zipf = [1 / (rank + 1) for rank in range(TENANTS)]
    zipf_total = sum(zipf)
    tenants = {
        name: TenantInfo(name=name, weight=round(TENANTS * share / zipf_total, 3))
        for name, share in zip(tenant_names, zipf, strict=True)
    }
    homes = {name: rng.choices(names, weights=home_weights)[0] for name in tenant_names}
    # One mid-sized tenant keeps its data in the EU.
    resident = tenant_names[3]
    homes[resident] = EU_REGIONS[0]

    entrypoints: dict[str, list[_Entrypoint]] = {}
    for tenant in tenant_names:
        kinds = []
        for number in range(rng.randint(ENTRYPOINTS_MIN, ENTRYPOINTS_MAX)):
            home = homes[tenant]
            if tenant != resident and rng.random() >= HOME_DATA_FRACTION:
                home = rng.choice(names)
            kinds.append(
                _Entrypoint(
                    name=f"train{number}",
                    gpus=_pick(rng, GPU_MIX),
                    gpu_memory_mb=LARGE_MEMORY_MB if rng.random() < LARGE_MEMORY_FRACTION else 0,
                    typical_ms=_typical_ms(rng),
                    input_size_mb=_lognormal_mb(rng, DATA_MEDIAN_MB, DATA_SIGMA, DATA_MAX_MB),
                    input_region=home,
                    checkpoint_size_mb=_lognormal_mb(
                        rng, CHECKPOINT_MEDIAN_MB, CHECKPOINT_SIGMA, CHECKPOINT_MAX_MB
                    ),
                )
            )
        entrypoints[tenant] = kinds

    trace_jobs = []
    for number, submitted_ms in enumerate(_arrivals_ms(rng, jobs, hours)):
        tenant = rng.choices(tenant_names, weights=zipf)[0]
        kind = rng.choice(entrypoints[tenant])
        tasks = 1
        if kind.gpus == 1 and rng.random() < SWEEP_FRACTION:
            tasks = rng.randint(SWEEP_TASKS_MIN, SWEEP_TASKS_MAX)
        work_ms = tuple(
            max(MINUTE_MS, int(kind.typical_ms * math.exp(rng.gauss(0.0, DURATION_SIGMA))))
            for _ in range(tasks)
        )
        trace_jobs.append(
            TraceJob(
                job_id=f"j{number:05d}",
                tenant=tenant,
                entrypoint=kind.name,
                submitted_ms=submitted_ms,
                priority=1 if rng.random() < PRIORITY_FRACTION else 0,
                gpus=kind.gpus,
                gpu_memory_mb=kind.gpu_memory_mb,
                regions_allow=EU_REGIONS if tenant == resident else (),
                input_size_mb=kind.input_size_mb,
                input_region=kind.input_region,
                checkpoint_size_mb=kind.checkpoint_size_mb,
                work_ms=work_ms,
            )
        )
    # Sized from this trace's own work, not the expectation: run times are heavy-tailed and
    # shared by each entrypoint's jobs, so one trace's work is often twice the expected.
    work_gpu_ms = sum(job.gpus * sum(job.work_ms) for job in trace_jobs)
    capacity_reference_gpus = work_gpu_ms / (load * hours * HOUR_MS)
    if gpus_max is not None and not (
        math.isfinite(capacity_reference_gpus)
        and (gpus := regions_gpus(capacity_reference_gpus)) <= gpus_max
    ):
        gpus_text = f"{gpus:,}" if math.isfinite(capacity_reference_gpus) else "infinitely many"
        raise TraceTooLarge(
            f"{jobs:,} jobs over {hours:g} h at load {load:g} size the cluster at {gpus_text} "
            f"GPUs, more than the {gpus_max:,} a simulation here finishes in reasonable time: give "
            "more hours, more load or fewer jobs"
        )
    region_infos = regions(capacity_reference_gpus)
    # Outages over the arrival window and the week after it, when the long jobs still run.
    outage_list = _outages(rng, names, hours * HOUR_MS + 7 * DAY_MS) if outages else []
    return Trace(
        seed=seed,
        regions=region_infos,
        tenants=tenants,
        jobs=tuple(trace_jobs),
        outages=tuple(outage_list),
        hours=hours,
        load=load,
    )


def size_mix(trace: Trace) -> dict[int, float]:
    """The share of the trace's jobs by GPUs per task, for each size of `GPU_MIX`. A job's size
    is its entrypoint's and a tenant has only a few entrypoints, so one trace's mix can stray far
    from `GPU_MIX`, which it matches only on average over seeds (docs/scheduler.md)."""
    counts = dict.fromkeys((gpus for gpus, _ in GPU_MIX), 0)
    for job in trace.jobs:
        counts[job.gpus] += 1
    return {gpus: count / len(trace.jobs) for gpus, count in counts.items()}
