"""Runs every benchmark in `bench/` within a time budget and writes a markdown summary.

`make bench` runs this. Each benchmark runs as its own process with its own time limit, in a
size that fits the budget (20 minutes in all on a 2-core machine), prints its usual report, and
ends with one JSON line; the summary (`bench/results/summary.md` by default) gathers from those
lines the figures that compare xr with its reference system (every `ratio` field), each
benchmark's verdicts against its targets, its wall time and its exit status. A benchmark that
fails or runs out of time is reported as such; the others still run.

Usage: `python bench/run_all.py [--only NAME,...] [--out PATH]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._arguments import check_output_path, write_output

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "summary.md"


@dataclass(frozen=True)
class Benchmark:
    name: str
    argv: tuple[str, ...]
    timeout_s: float
    reference: str


BENCHMARKS = (
    Benchmark(
        "core_apply",
        ("bench/core_apply.py", "--rounds", "3"),
        120,
        "the target of 50,000 commands/s (no other system applies xr's commands)",
    ),
    Benchmark(
        "raftstore",
        ("bench/raftstore.py", "--quick"),
        240,
        "raw pysyncobj 0.3.17 (batching off, callbacks), same machine, same run",
    ),
    Benchmark(
        "api",
        ("bench/api.py", "--duration", "3", "--rounds", "2"),
        480,
        "etcd 3.4, 3 members on loopback, same load generator, interleaved in the same run",
    ),
    Benchmark(
        "durability",
        ("bench/durability.py", "--duration", "2", "--rounds", "2"),
        240,
        "etcd 3.4 with fsync (its default), 3 members on loopback, interleaved in the same run",
    ),
    Benchmark(
        "raft_messages",
        (
            "bench/raft_messages.py",
            "--against",
            "HEAD",
            "--concurrency",
            "16,64",
            "--duration",
            "2",
            "--rounds",
            "2",
        ),
        180,
        "the same clusters and load at HEAD, alternating in the same run (on a committed tree the"
        " two sides run the same code: the figure is the run's noise)",
    ),
    Benchmark(
        "audit_log",
        ("bench/audit_log.py", "--rounds", "3"),
        120,
        "the same audit line through the standard logging path, alternating in the same run",
    ),
    Benchmark(
        "http_server",
        ("bench/http_server.py", "--rounds", "2"),
        120,
        "a bare asyncio protocol answering the same puts, alternating in the same run",
    ),
    Benchmark(
        "pickling",
        ("bench/pickling.py", "--puts", "5000", "--rounds", "3"),
        60,
        "pysyncobj 0.3.17's own pickling (protocol 2, pickle.loads), alternating in the same run",
    ),
    Benchmark(
        "sync_cost",
        ("bench/sync_cost.py",),
        120,
        "os.fdatasync in line, alternating in the same run (io_uring only with liburing installed)",
    ),
    Benchmark(
        "sandbox",
        ("bench/sandbox.py", "--starts", "30", "--rounds", "3"),
        120,
        "the same namespace and mounts made by util-linux's unshare, mount and setpriv, and a"
        " plain start as the user, alternating in the same run (root only)",
    ),
    Benchmark(
        "failover",
        ("bench/failover.py", "--trials", "3"),
        240,
        "the lease TTL + 2 s target (etcd 3.4 leader failover: 1.17 s, raftstore's own figure)",
    ),
    Benchmark(
        "gpu_check",
        ("bench/gpu_check.py", "--seconds", "2", "--gemm-n", "512", "--fft-n", "512"),
        180,
        "the same kernels called directly, without xr (CPU here: NumPy)",
    ),
    Benchmark(
        "scheduler",
        ("bench/scheduler.py",),
        240,
        "FIFO first-fit and random placement on the same trace and seed",
    ),
    Benchmark(
        "placement_view",
        ("bench/placement_view.py", "--pairs", "3"),
        180,
        "the same pass without the bound on the pending tasks it looks at (the pass before it),"
        " alternating in the same run",
    ),
    Benchmark(
        "checker",
        ("bench/checker.py", "--sizes", "1000", "10000", "--rounds", "2"),
        180,
        "Porcupine (Go): 1,712 operations in ~0.1 s (published figure, not run here)",
    ),
)


@dataclass
class Outcome:
    benchmark: Benchmark
    status: str  # "ok", "failed (exit N)", "timed out"
    wall_s: float
    document: dict[str, Any] | None
    tail: str


def _last_json(output: str) -> dict[str, Any] | None:
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                document = json.loads(line)
            except ValueError:
                continue
            if isinstance(document, dict):
                return document
    return None


def run_one(benchmark: Benchmark) -> Outcome:
    started_s = time.monotonic()
    print(f"== {benchmark.name}: {' '.join(benchmark.argv)} (limit {benchmark.timeout_s:.0f} s)")
    try:
        completed = subprocess.run(
            [sys.executable, *benchmark.argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=benchmark.timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        partial = error.stdout or ""
        output = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        return Outcome(benchmark, "timed out", time.monotonic() - started_s, None, output[-2000:])
    output = completed.stdout + completed.stderr
    print(completed.stdout[-3000:], end="")
    status = "ok" if completed.returncode == 0 else f"failed (exit {completed.returncode})"
    return Outcome(
        benchmark,
        status,
        time.monotonic() - started_s,
        _last_json(completed.stdout),
        output[-2000:],
    )


def _figures(document: dict[str, Any] | None, prefix: str = "") -> list[tuple[str, Any]]:
    """Every ratio, verdict and target figure in a benchmark's JSON, flattened."""
    if document is None:
        return []
    found: list[tuple[str, Any]] = []
    for key, value in document.items():
        name = f"{prefix}{key}"
        wanted = any(word in key for word in ("ratio", "verdict", "met", "target", "_x"))
        if (
            isinstance(value, dict)
            and wanted
            and all(not isinstance(item, dict | list) for item in value.values())
        ):
            # A table of ratios or targets: every entry is a figure.
            found.extend((f"{name}.{inner}", item) for inner, item in value.items())
        elif isinstance(value, dict):
            found.extend(_figures(value, f"{name}."))
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for position, item in enumerate(value):
                found.extend(_figures(item, f"{name}[{position}]."))
        elif wanted:
            found.append((name, value))
    return found


def summary(outcomes: Sequence[Outcome], total_s: float) -> str:
    lines = [
        "# Benchmark summary",
        "",
        f"Written by `make bench` (`bench/run_all.py`) on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {total_s / 60:.1f} minutes in "
        "all. Ratios are xr's figure over the reference system's "
        "measured in the same run (or the stated target); the machine is shared and noisy, so "
        "read them as ratios, not absolute times.",
        "",
        "| benchmark | status | wall s | reference | key figures |",
        "|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        figures = _figures(outcome.document)
        shown = "<br>".join(f"`{name}` = {value}" for name, value in figures[:12]) or "-"
        lines.append(
            f"| {outcome.benchmark.name} | {outcome.status} | {outcome.wall_s:.0f} | "
            f"{outcome.benchmark.reference} | {shown} |"
        )
    lines += ["", "## Output of each benchmark (last lines)", ""]
    for outcome in outcomes:
        lines += [f"### {outcome.benchmark.name}", "", "```", outcome.tail.rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    arguments = parser.parse_args(argv)
    chosen = {name for name in arguments.only.split(",") if name}
    unknown = chosen - {benchmark.name for benchmark in BENCHMARKS}
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    check_output_path(parser, "--out", arguments.out, make_parents=True)
    started_s = time.monotonic()
    outcomes = [run_one(item) for item in BENCHMARKS if not chosen or item.name in chosen]
    text = summary(outcomes, time.monotonic() - started_s)
    try:
        arguments.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"run_all: cannot make {arguments.out.parent}: {error.strerror}", file=sys.stderr)
    if not write_output(arguments.out, text + "\n", program="run_all"):
        # The figures are not lost: the summary goes to stdout instead.
        print(text)
        return 1
    print(f"summary written to {arguments.out}")
    return 0 if all(outcome.status == "ok" for outcome in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
