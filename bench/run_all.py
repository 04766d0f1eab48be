"""Runs every benchmark in `BENCHMARKS` within a time budget and writes a markdown summary.

`make bench` runs this. Each benchmark runs as its own process, in a process group and session of
its own, with its own time limit, in a size that fits the budget (`--budget-min`, 20 minutes by
default; a benchmark's limit is cut to what is left of it, and one that would start with nothing
left is not run). Its output is streamed as it comes, each line indented, and it ends with one
JSON line; the summary (`bench/results/summary.md` by default) gathers from those lines the
figures that compare xr with its reference system (every ratio), each benchmark's verdicts against
its targets, its wall time and its exit status. A benchmark that fails or runs out of time is
reported as such; the others still run.

A benchmark out of time gets SIGTERM (its whole process group), which the scripts turn into
stopping every cluster they started and removing their directories (`bench/_signals.py`); after
`STOP_GRACE_S` its group gets SIGKILL, and so does every process that was below it when its time
ran out (xr's nodes run in sessions of their own, out of reach of the group). Ctrl-C or SIGTERM to
this script stops the running benchmark the same way, then this script.

Every benchmark script of `bench/` is in `BENCHMARKS` (a test checks it), some in a short form:
`api.py` (in full: `make bench-api`, about 10 minutes), `overload.py` (10 s instead of 60) and
`scheduler_pass.py` (against `HEAD`). The limits add up to more than the budget: on a slow
machine the last benchmarks are reported as not run rather than the run taking longer.

Usage: `python bench/run_all.py [--only NAME,...] [--out PATH] [--budget-min 20]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._arguments import check_output_path, write_output
from bench._load import with_descendants
from bench._signals import run_main, shielded

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
        "scheduler_pass",
        ("bench/scheduler_pass.py", "--against", "HEAD", "--pairs", "5"),
        120,
        "the same passes at HEAD, alternating in the same process (on a committed tree the two"
        " sides run the same code: the figure is the run's noise)",
    ),
    Benchmark(
        "overload",
        ("bench/overload.py", "--duration", "10", "--capacity", "3"),
        150,
        "its own closed-loop capacity, measured first in the same run (offered twice that)",
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


# After SIGTERM, how long a benchmark has to stop what it started before SIGKILL.
STOP_GRACE_S = 30.0
DEFAULT_BUDGET_MIN = 20.0
# Less time than this left in the budget: the next benchmark is not started.
BUDGET_LEFT_MIN_S = 1.0
# A benchmark's output kept for the summary (its last lines), and how long to wait for its output
# to end once it has exited (a process it left may hold the pipe open).
TAIL_CHARACTERS = 2000
OUTPUT_CLOSE_WAIT_S = 5.0
OUTPUT_INDENT = "    "


@dataclass
class Outcome:
    benchmark: Benchmark
    status: str  # "ok", "failed (exit N)", "timed out", "not run (...)", "interrupted"
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


def _start_time(pid: int) -> str | None:
    """The process's start time (in clock ticks since boot, from /proc), which tells it apart
    from a later process given the same id; None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _below(pid: int) -> dict[int, str]:
    """Every process below `pid` (not `pid` itself), with its start time."""
    found = {}
    for child in with_descendants([pid]):
        started = _start_time(child)
        if child != pid and started is not None:
            found[child] = started
    return found


def _kill_group(pid: int, signal_number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal_number)


def stop(process: subprocess.Popen[str], *, grace_s: float = STOP_GRACE_S) -> list[int]:
    """Stops a benchmark started by `run_one` and everything it started: SIGTERM to its process
    group, `grace_s` to end, then SIGKILL to the group and to every process that was below it
    when this began and is still there. Returns the ids of those killed that way."""
    below = _below(process.pid)
    _kill_group(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace_s)
    _kill_group(process.pid, signal.SIGKILL)
    killed = []
    for pid, started in below.items():
        if _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace_s)
    return killed


def _stream(pipe: IO[str], lines: list[str], echo: Callable[[str], None]) -> None:
    for line in pipe:
        lines.append(line)
        echo(line)


def _echo(line: str) -> None:
    print(f"{OUTPUT_INDENT}{line}", end="" if line.endswith("\n") else "\n", flush=True)


def run_one(
    benchmark: Benchmark,
    *,
    grace_s: float = STOP_GRACE_S,
    echo: Callable[[str], None] = _echo,
) -> Outcome:
    """Runs one benchmark in a session of its own, its output (stdout and stderr together)
    echoed line by line as it comes; stops it (`stop`) when its time is up, and on Ctrl-C or
    SIGTERM to this process, which then goes on."""
    started_s = time.monotonic()
    print(
        f"== {benchmark.name}: {' '.join(benchmark.argv)} (limit {benchmark.timeout_s:.0f} s)",
        flush=True,
    )
    process = subprocess.Popen(
        [sys.executable, *benchmark.argv],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        # Its own session and so its own process group, which `stop` signals as a whole; a
        # Ctrl-C in the terminal reaches this process only, which then stops it.
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=_stream, args=(process.stdout, lines, echo), daemon=True)
    reader.start()
    status: str | None = None
    try:
        process.wait(benchmark.timeout_s)
    except subprocess.TimeoutExpired:
        status = "timed out"
    except BaseException:
        # Ctrl-C or SIGTERM to run_all: stop the benchmark, then go on stopping.
        with shielded():
            stop(process, grace_s=grace_s)
        raise
    if status is not None:
        echo(f"{benchmark.name}: out of time after {benchmark.timeout_s:.0f} s; stopping it\n")
        killed = stop(process, grace_s=grace_s)
        if killed:
            echo(f"{benchmark.name}: killed {len(killed)} process(es) it left: {killed}\n")
    reader.join(OUTPUT_CLOSE_WAIT_S)
    if status is None:
        code = process.returncode
        status = "ok" if code == 0 else f"failed (exit {code})"
    output = "".join(lines)
    return Outcome(
        benchmark,
        status,
        time.monotonic() - started_s,
        _last_json(output) if status != "timed out" else None,
        output[-TAIL_CHARACTERS:],
    )


def run_within(
    benchmarks: Sequence[Benchmark],
    budget_s: float,
    *,
    grace_s: float = STOP_GRACE_S,
    run: Callable[..., Outcome] = run_one,
    clock: Callable[[], float] = time.monotonic,
) -> list[Outcome]:
    """Runs `benchmarks` in turn, each within its own limit and what is left of `budget_s`; one
    that would start with less than `BUDGET_LEFT_MIN_S` left is reported as not run."""
    deadline_s = clock() + budget_s
    outcomes = []
    for benchmark in benchmarks:
        left_s = deadline_s - clock()
        if left_s < BUDGET_LEFT_MIN_S:
            outcomes.append(
                Outcome(
                    benchmark,
                    f"not run (the budget of {budget_s / 60:g} minutes was spent)",
                    0.0,
                    None,
                    "",
                )
            )
            continue
        if left_s < benchmark.timeout_s:
            benchmark = replace(benchmark, timeout_s=left_s)
        outcomes.append(run(benchmark, grace_s=grace_s))
    return outcomes


# A figure's key names one of these words ("ops_ratio_xr_etcd", "target_met", "verdict"), or
# ends in "_x", or is a note (why a figure is missing). Words, not substrings: "duration_s" and
# "operations" hold "ratio" but are no ratio.
FIGURE_WORDS = frozenset({"ratio", "ratios", "verdict", "met", "target", "targets"})
FIGURES_SHOWN_MAX = 40


def _is_figure(key: str) -> bool:
    words = key.lower().replace(" ", "_").split("_")
    return key == "note" or key.endswith("_x") or any(word in FIGURE_WORDS for word in words)


def _figures(document: dict[str, Any] | None, prefix: str = "") -> list[tuple[str, Any]]:
    """Every ratio, verdict, target figure and note in a benchmark's JSON, flattened."""
    if document is None:
        return []
    found: list[tuple[str, Any]] = []
    for key, value in document.items():
        name = f"{prefix}{key}"
        wanted = _is_figure(key)
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


def _shown(outcome: Outcome) -> str:
    figures = _figures(outcome.document)
    if not figures:
        if outcome.document is None:
            return "- (no JSON line)" if outcome.status == "ok" else "-"
        return "- (no ratio or target in its JSON)"
    shown = [f"`{name}` = {value}" for name, value in figures[:FIGURES_SHOWN_MAX]]
    if len(figures) > FIGURES_SHOWN_MAX:
        shown.append(f"... {len(figures) - FIGURES_SHOWN_MAX} more in its JSON line below")
    return "<br>".join(shown)


def summary(outcomes: Sequence[Outcome], total_s: float) -> str:
    lines = [
        "# Benchmark summary",
        "",
        f"Written by `make bench` (`bench/run_all.py`) on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {total_s / 60:.1f} minutes in "
        "all. Each ratio is measured against the reference system in the same run (or the "
        "stated target), in the direction its name gives: most are xr's figure over the "
        "reference's (`ops_ratio_xr_etcd`, `ratio_fsync_vs_etcd`: above 1, xr does more); "
        "latency ratios named the other way round are the reference's over xr's (api's "
        "`p50 etcd/xr`: above 1, xr is faster). The machine is shared and noisy, so read them as "
        "ratios, not absolute times.",
        "",
        "| benchmark | status | wall s | reference | key figures |",
        "|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        lines.append(
            f"| {outcome.benchmark.name} | {outcome.status} | {outcome.wall_s:.0f} | "
            f"{outcome.benchmark.reference} | {_shown(outcome)} |"
        )
    lines += ["", "## Output of each benchmark (last lines)", ""]
    for outcome in outcomes:
        lines += [f"### {outcome.benchmark.name}", "", "```", outcome.tail.rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--budget-min",
        type=float,
        default=DEFAULT_BUDGET_MIN,
        help=f"minutes for all the benchmarks together ({DEFAULT_BUDGET_MIN:g})",
    )
    arguments = parser.parse_args(argv)
    chosen = {name for name in arguments.only.split(",") if name}
    unknown = chosen - {benchmark.name for benchmark in BENCHMARKS}
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    if not 0 < arguments.budget_min < math.inf:
        parser.error("--budget-min must be positive and finite")
    check_output_path(parser, "--out", arguments.out, make_parents=True)
    return run_main(lambda: _main(arguments, chosen))


def _main(arguments: argparse.Namespace, chosen: set[str]) -> int:
    started_s = time.monotonic()
    outcomes = run_within(
        [item for item in BENCHMARKS if not chosen or item.name in chosen],
        arguments.budget_min * 60,
    )
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
