"""A scheduling pass of the running cluster over a huge queue, with and without the bound on the
pending tasks it looks at, in the same run.

The leader computes a pass (`xrcore.placement.place`: the view of the replicated state, then the
policy) on the thread that runs Raft, so a pass that takes longer than an election timeout
(0.4-1 s) costs the cluster its leader. One tenant's ten arrays of 10,000 tasks that can run
nowhere made each pass take over a second; `scheduler.pass_pending_max` (10,000 by default)
bounds the pending tasks a pass looks at. This script builds that state (3 regions, `--jobs`
arrays of `--array` tasks allowed only in a region that does not exist, after one small job
of another tenant), then times `place` with the bound and without it (the pass before the bound),
alternating pass by pass in one process, and prints each side's median CPU time and the median
of the per-pair ratios (bounded over unbounded): below 1 is faster. It also checks that both
give the other tenant's task the same decision.

Run: `python bench/placement_view.py [--jobs 10] [--array 9999] [--pairs 5]`. The last line is
one JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# As in bench/scheduler.py: the repository root comes first on the path, not this folder.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from xrcore import Envelope, StateMachine, encode  # noqa: E402
from xrcore.commands import (  # noqa: E402
    Command,
    JobSpec,
    JobSubmit,
    RegionHeartbeat,
    RegionRegister,
)
from xrcore.limits import ARRAY_SIZE_MAX  # noqa: E402
from xrcore.placement import PlacementSettings, place  # noqa: E402

_START_MS = 1_700_000_000_000
_UNBOUNDED = 1 << 40


class _Log:
    """Applies commands to a state machine as log entries, one index each."""

    def __init__(self) -> None:
        self.machine = StateMachine()
        self.index = 0

    def apply(self, command: Command) -> None:
        self.index += 1
        entry = encode(Envelope(command=command, now_ms=_START_MS, client_id=None, seq=None))
        result = self.machine.apply(entry, self.index).result
        if result.error is not None:
            raise SystemExit(f"placement_view: {type(command).__name__} refused: {result.error}")


def huge_queue(jobs: int, array: int) -> StateMachine:
    log = _Log()
    for name in ("r0", "r1", "r2"):
        log.apply(
            RegionRegister(name=name, http_address="h:1", raft_address=f"{name}:1", cpu_slots=4)
        )
        log.apply(RegionHeartbeat(name=name))
    # First, as 100,000 tasks (ten full arrays) are all the cluster takes.
    log.apply(JobSubmit(spec=JobSpec(name="small", workload="gemm", tenant="alice")))
    for number in range(jobs):
        spec = JobSpec(
            name=f"flood-{number}",
            workload="gemm",
            tenant="bob",
            array_size=array,
            regions_allow=("nowhere",),
        )
        log.apply(JobSubmit(spec=spec))
    return log.machine


def _alice_decision(machine: StateMachine, settings: PlacementSettings) -> tuple[str, str]:
    decisions = place(machine, settings)
    assert decisions is not None
    for item in decisions.assigns:
        if machine.jobs[item.job_id].spec.tenant == "alice":
            return ("assigned", item.region)
    return ("waiting", "")


def alternate(machine: StateMachine, pairs: int) -> dict[str, list[float]]:
    sides = {"bounded": PlacementSettings(), "unbounded": PlacementSettings(pending_max=_UNBOUNDED)}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(pairs + 1):
        for name, settings in sides.items():
            started = time.process_time()
            place(machine, settings)
            times[name].append((time.process_time() - started) * 1000)
    return {name: values[1:] for name, values in times.items()}


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="placement_view.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10, help="arrays that can run nowhere")
    parser.add_argument("--array", type=int, default=9_999, help="tasks per array")
    parser.add_argument("--pairs", type=int, default=5, help="alternating pairs of passes")
    options = parser.parse_args(arguments)
    if not 1 <= options.array <= ARRAY_SIZE_MAX or options.jobs < 1 or options.pairs < 1:
        parser.error(f"--jobs and --pairs must be positive, --array 1 to {ARRAY_SIZE_MAX}")
    machine = huge_queue(options.jobs, options.array)
    same = _alice_decision(machine, PlacementSettings()) == _alice_decision(
        machine, PlacementSettings(pending_max=_UNBOUNDED)
    )
    times = alternate(machine, options.pairs)
    ratios = [new / old for new, old in zip(times["bounded"], times["unbounded"], strict=True)]
    figures = {
        "pending_tasks": options.jobs * options.array + 1,
        "bounded_ms": round(statistics.median(times["bounded"]), 1),
        "unbounded_ms": round(statistics.median(times["unbounded"]), 1),
        "ratio": round(statistics.median(ratios), 3),
        "same_decision_for_the_other_tenant": same,
    }
    print(f"| pass over {figures['pending_tasks']:,} pending tasks | ms of CPU (median) |")
    print("| --- | ---: |")
    print(f"| bounded (pass_pending_max 10,000) | {figures['bounded_ms']} |")
    print(f"| unbounded (before the bound) | {figures['unbounded_ms']} |")
    print(f"| ratio, median of {options.pairs} pairs | {figures['ratio']}x |")
    print(json.dumps(figures))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
