"""`bench/run_all.py`: each benchmark in a session of its own, stopped with SIGTERM and then
SIGKILL when out of time, everything below it included; its output streamed as it comes; the
whole run within its budget; the summary's figures picked by word and not cut short."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from bench import run_all
from bench._signals import running
from bench.run_all import Benchmark, Outcome, run_one, run_within
from tests.bench._script import ROOT


def _gone(pid: int) -> bool:
    return not running(pid)


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not _gone(pid) and time.monotonic() < deadline_s:
        time.sleep(0.05)
    return _gone(pid)


def _benchmark(script: Path, timeout_s: float, *arguments: str) -> Benchmark:
    return Benchmark(script.stem, (str(script), *arguments), timeout_s, "-")


def test_run_one__out_of_time__the_benchmark_gets_sigterm_then_what_it_left_is_killed(
    tmp_path: Path,
) -> None:
    # A benchmark that starts a node-like child in a session of its own (out of reach of its
    # process group), then hangs; on SIGTERM it writes a mark and exits without stopping it.
    mark = tmp_path / "terminated"
    script = tmp_path / "hangs.py"
    script.write_text(
        textwrap.dedent(
            """
            import pathlib, signal, subprocess, sys, time
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
            )
            def on_term(number, frame):
                pathlib.Path(sys.argv[1]).write_text("yes")
                sys.exit(143)
            signal.signal(signal.SIGTERM, on_term)
            print("child", child.pid, flush=True)
            time.sleep(120)
            """
        )
    )
    lines: list[str] = []
    outcome = run_one(_benchmark(script, 2.0, str(mark)), grace_s=5.0, echo=lines.append)
    assert outcome.status == "timed out"
    assert mark.read_text() == "yes"
    child = int(next(line for line in lines if line.startswith("child")).split()[1])
    assert _wait_gone(child)
    assert any("killed 1 process(es) it left" in line for line in lines)


def test_run_one__a_benchmark_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\ntime.sleep(120)\n"
    )
    started_s = time.monotonic()
    outcome = run_one(_benchmark(script, 1.0), grace_s=1.0, echo=lambda line: None)
    assert outcome.status == "timed out"
    assert time.monotonic() - started_s < 30


def test_run_one__output_is_streamed_while_the_benchmark_runs(tmp_path: Path) -> None:
    # The benchmark waits for a file that only the echo of its first line makes: with the
    # output held back until the end, it would run out of time.
    flag = tmp_path / "seen"
    script = tmp_path / "talks.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, pathlib, sys, time
            print("first line", flush=True)
            flag = pathlib.Path(sys.argv[1])
            deadline = time.monotonic() + 30
            while not flag.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            print(json.dumps({"bench": "talks", "seen": flag.exists(), "ratio": 1.5}))
            """
        )
    )

    def echo(line: str) -> None:
        if line == "first line\n":
            flag.write_text("")

    outcome = run_one(_benchmark(script, 60.0, str(flag)), echo=echo)
    assert outcome.status == "ok"
    assert outcome.document == {"bench": "talks", "seen": True, "ratio": 1.5}
    assert "first line" in outcome.tail


def test_run_within__limits_are_cut_to_the_budget_and_nothing_starts_past_it() -> None:
    now_s = [0.0]
    given: list[float] = []

    def fake(benchmark: Benchmark, *, grace_s: float) -> Outcome:
        given.append(benchmark.timeout_s)
        now_s[0] += 1.2
        return Outcome(benchmark, "ok", 1.2, None, "")

    benchmarks = [Benchmark(f"b{number}", (), 100.0, "-") for number in range(3)]
    outcomes = run_within(benchmarks, 3.0, run=fake, clock=lambda: now_s[0])
    assert given == [3.0, 3.0 - 1.2]
    assert [outcome.status for outcome in outcomes[:2]] == ["ok", "ok"]
    assert outcomes[2].status == "not run (the budget of 0.05 minutes was spent)"


def test_every_benchmark_script_is_run() -> None:
    not_benchmarks = {"run_all", "scheduler_sim", "scheduler_trace"}
    scripts = {
        path.stem
        for path in (ROOT / "bench").glob("*.py")
        if not path.stem.startswith("_") and path.stem not in not_benchmarks
    }
    assert scripts == {benchmark.name for benchmark in run_all.BENCHMARKS}
    assert all((ROOT / benchmark.argv[0]).exists() for benchmark in run_all.BENCHMARKS)


def test_figures__words_not_substrings_and_none_cut_off() -> None:
    raftstore: dict[str, Any] = {
        "bench": "raftstore",
        "ratio": 0.8,
        "p50_ratio_at_1": 1.1,
        "duration_s": 1.5,
        "operations": 10,
        "operations_per_s": 5.0,
    }
    assert dict(run_all._figures(raftstore)) == {"ratio": 0.8, "p50_ratio_at_1": 1.1}
    durability = {
        "cells": [
            {f"ratio_{number}": number / 10 for number in range(6)} | {"target_met": True}
            for _ in range(3)
        ]
    }
    outcome = Outcome(Benchmark("durability", (), 1, "-"), "ok", 1.0, durability, "")
    assert run_all._shown(outcome).count("<br>") == 3 * 7 - 1


def test_summary__a_missing_figure_says_why() -> None:
    sync_cost = {"bench": "sync_cost", "note": "io_uring not measured: liburing missing"}
    outcome = Outcome(Benchmark("sync_cost", (), 1, "-"), "ok", 1.0, sync_cost, "")
    text = run_all.summary([outcome], 1.0)
    assert "io_uring not measured: liburing missing" in text
    assert "Ratios are xr's figure over the reference system's" not in text
    assert "`p50 etcd/xr`: above 1, xr is faster" in text


def test_run_all__sigterm_stops_the_running_benchmark_and_what_it_started(
    tmp_path: Path,
) -> None:
    import subprocess

    script = tmp_path / "slow.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " start_new_session=True)\n"
        "print('child', child.pid, flush=True)\ntime.sleep(120)\n"
    )
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(ROOT)!r})
            from bench import run_all
            run_all.BENCHMARKS = (run_all.Benchmark("slow", ({str(script)!r},), 100, "-"),)
            run_all.STOP_GRACE_S = 2.0
            sys.exit(run_all.main(["--out", {str(tmp_path / "summary.md")!r}]))
            """
        )
    )
    process = subprocess.Popen(
        [sys.executable, str(driver)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line = ""
    while "child" not in line:
        line = process.stdout.readline()
        assert line
    child = int(line.split()[-1])
    benchmark_pid = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1])
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 143
    assert "Traceback" not in errors
    assert _wait_gone(child) and _wait_gone(benchmark_pid)
    if not _gone(child):
        os.kill(child, signal.SIGKILL)
