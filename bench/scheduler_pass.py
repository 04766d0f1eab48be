"""The scheduling pass of this tree against the pass of an earlier revision, in the same run.

This machine's speed moves by up to 2x within the hour, so an absolute pass time says little
about a change. This script loads `xrcore/scheduler.py` as it was at `--against` (from git) next
to the working tree's, and times both on the same clusters in one process, alternating pass by
pass: the full pass over `bench/scheduler.py`'s scale cluster (10,000 pending tasks, 50
regions) and the pass over that cluster's running tasks alone, every one weighed for moving up.
It prints each side's median CPU time and the median of the per-pair ratios (this tree over the
revision): below 1 is faster. The earlier module imports the rest of `xrcore` (the device
ledger, the model) from the working tree, so only changes to the policy module are compared.

Run: `python bench/scheduler_pass.py --against 661bf34 [--pairs 21] [--seed 1]`. The last line
is one JSON object.
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
import tempfile  # noqa: E402
import time  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import xrcore.scheduler as current  # noqa: E402
from bench._arguments import integer_between  # noqa: E402
from bench._revision import module_at  # noqa: E402
from bench.scheduler import moving_cluster, scale_cluster  # noqa: E402


def scheduler_at(revision: str, folder: Path) -> ModuleType:
    """`xrcore/scheduler.py` as it was at `revision`, loaded as a module of its own."""
    return module_at(revision, "xrcore/scheduler.py", folder, program="scheduler_pass")


def alternate(modules: dict[str, ModuleType], cluster: Any, pairs: int) -> dict[str, list[float]]:
    """CPU milliseconds of `pairs` full passes per module, alternating, after one warm-up
    pass each."""
    times: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(pairs + 1):
        for name, module in modules.items():
            settings = module.SchedulerSettings(decisions_max=1_000_000, reasons_max=1_000_000)
            started = time.process_time()
            module.schedule(cluster, settings)
            times[name].append((time.process_time() - started) * 1000)
    return {name: values[1:] for name, values in times.items()}


def summary(times: dict[str, list[float]]) -> dict[str, float]:
    ratios = [new / old for new, old in zip(times["this tree"], times["revision"], strict=True)]
    return {
        "revision_ms": statistics.median(times["revision"]),
        "this_tree_ms": statistics.median(times["this tree"]),
        "ratio": statistics.median(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, metavar="REV", help="a git revision")
    parser.add_argument("--pairs", type=integer_between(1, 1_000), default=21, metavar="N")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tasks", type=integer_between(1, 100_000), default=10_000, metavar="N")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        earlier = scheduler_at(arguments.against, Path(folder))
        modules = {"revision": earlier, "this tree": current}
        cluster = scale_cluster(arguments.seed, tasks=arguments.tasks)
        results = {}
        for label, view in (("full pass", cluster), ("moving up", moving_cluster(cluster))):
            print(f"timing the {label}: {arguments.pairs} pairs", file=sys.stderr, flush=True)
            results[label] = summary(alternate(modules, view, arguments.pairs))
    print(
        f"| pass ({arguments.tasks:,} pending tasks, 50 regions) | {arguments.against} ms | "
        "this tree ms | this tree / revision |"
    )
    print("| --- | ---: | ---: | ---: |")
    for label, figures in results.items():
        print(
            f"| {label} | {figures['revision_ms']:.1f} | {figures['this_tree_ms']:.1f} | "
            f"{figures['ratio']:.2f}x |"
        )
    print(json.dumps({"against": arguments.against, "seed": arguments.seed, **results}))


if __name__ == "__main__":
    main()
