"""`bench/raftstore.py`: explicit options win over `--quick`, the p50 ratio is in the table, the
warm-up says it is one, and SIGTERM or Ctrl-C resumes (SIGCONT) and stops every member, the
paused ones included, where before they stayed stopped (state T) for good."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench import raftstore as bench_raftstore
from bench._load import with_descendants
from tests.bench._script import ROOT, ctrl_c_as_at_a_terminal


def test_quick__explicit_options_win() -> None:
    quick = bench_raftstore.parse_arguments(["--quick"])
    assert (quick.rounds, quick.duration_s, quick.failover_trials) == (1, 1.5, 3)
    mixed = bench_raftstore.parse_arguments(["--quick", "--rounds", "2", "--duration-s", "4"])
    assert (mixed.rounds, mixed.duration_s, mixed.failover_trials) == (2, 4.0, 3)
    plain = bench_raftstore.parse_arguments([])
    assert (plain.rounds, plain.duration_s, plain.failover_trials) == (3, 2.5, 5)


def _answer(rate: float, p50_ms: float) -> dict[str, Any]:
    return {"commits_per_s": rate, "latency_p50_ms": p50_ms, "latency_p99_ms": 2 * p50_ms}


def test_table__shows_the_p50_ratio_beside_the_throughput_ratio() -> None:
    results = {
        "raw": {1: [_answer(1000, 1.0)], 64: [_answer(8000, 8.0)]},
        "raftstore": {1: [_answer(800, 1.25)], 64: [_answer(4000, 16.0)]},
    }
    lines = bench_raftstore._table(results, (1, 64))
    assert "p50 raftstore/raw" in lines[0]
    assert lines[2].endswith("| 0.80x | 1.25x |")
    assert lines[3].endswith("| 0.50x | 2.00x |")


class _FakeCluster:
    def __init__(self) -> None:
        self.name = "fake"

    async def load(self, request: dict[str, Any], duration_s: float) -> dict[str, Any]:
        return {**_answer(100.0, 1.0), "errors": 0}

    def signal(self, signal_number: int) -> None:
        pass


def test_warmup_lines_are_labelled_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    fake: Any = _FakeCluster()
    systems: dict[str, tuple[Any, dict[str, Any]]] = {"raw": (fake, {}), "raftstore": (fake, {})}
    asyncio.run(
        bench_raftstore._measure(
            systems, concurrencies=(64,), rounds=1, duration_s=1.0, pause_other=False, warmup=True
        )
    )
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2
    assert all(line.startswith("warm-up ") and "round" not in line for line in printed)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.mark.parametrize(
    "signal_number", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_a_stopped_run_resumes_and_stops_every_member(signal_number: int) -> None:
    process = subprocess.Popen(
        [
            sys.executable, str(ROOT / "bench" / "raftstore.py"), "--rounds", "1",
            "--duration-s", "20", "--concurrencies", "1", "--failover-trials", "1",
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        # After the first measured point, the other cluster is measured for 20 s while this
        # one is paused.
        line = ""
        while not line.startswith("round 1/1"):
            line = process.stdout.readline()
            assert line, process.stderr.read() if process.stderr else ""
        members = [pid for pid in with_descendants([process.pid]) if pid != process.pid]
        deadline_s = time.monotonic() + 30
        while "T" not in {_state(pid) for pid in members} and time.monotonic() < deadline_s:
            time.sleep(0.05)
            members = [pid for pid in with_descendants([process.pid]) if pid != process.pid]
        assert "T" in {_state(pid) for pid in members}, "no member was paused"
        process.send_signal(signal_number)
        _, errors = process.communicate(timeout=60)
    finally:
        # A failed assertion must not leave members behind either: they outlive a killed parent.
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                for pid in with_descendants([process.pid]):
                    os.kill(pid, signal.SIGKILL)
                process.wait()
    assert process.returncode == 128 + signal_number
    assert "Traceback" not in errors
    assert all(_state(pid) in (None, "Z") for pid in members)
