"""bench/sandbox.py: a sandboxed start against a plain one, util-linux's and a worker's import,
in one run (as root, as CI runs)."""

from __future__ import annotations

import json

from tests.bench._script import run_script


def test_times_every_way_and_prints_the_sandbox_over_each() -> None:
    ran = run_script("sandbox.py", "--starts", "4", "--rounds", "2")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.strip().splitlines()
    assert lines[0].startswith("round 1/2: plain ") and lines[1].startswith("round 2/2: ")
    rows = [line for line in lines if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == [
        "plain",
        "xr sandbox",
        "util-linux",
        "xr sandbox + network",
        "util-linux + network",
        "worker import",
    ]
    figures = json.loads(lines[-1])
    assert figures["benchmark"] == "sandbox" and figures["starts"] == 4
    assert all(value > 0 for value in figures["median_ms"].values())
    assert set(figures["ratio"]) == {
        "plain",
        "util-linux",
        "worker import",
        "network / util-linux",
        "network / none",
    }


def test_bad_arguments_are_refused_without_a_traceback() -> None:
    ran = run_script("sandbox.py", "--starts", "0")
    assert ran.returncode == 2 and "must be at least 1" in ran.stderr
    assert "Traceback" not in ran.stderr
