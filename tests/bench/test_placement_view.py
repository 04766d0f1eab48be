"""bench/placement_view.py: a pass over a huge queue with and without the bound, in one run."""

from __future__ import annotations

import json

from tests.bench._script import run_script


def test_times_both_passes_and_both_place_the_other_tenants_task_alike() -> None:
    ran = run_script("placement_view.py", "--jobs", "2", "--array", "500", "--pairs", "2")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.strip().splitlines()
    assert lines[0] == "| pass over 1,001 pending tasks | ms of CPU (median) |"
    figures = json.loads(lines[-1])
    assert figures["same_decision_for_the_other_tenant"] is True
    assert figures["bounded_ms"] > 0 and figures["unbounded_ms"] > 0 and figures["ratio"] > 0


def test_bad_sizes_are_a_usage_error() -> None:
    ran = run_script("placement_view.py", "--array", "0")
    assert ran.returncode == 2 and "--array 1 to 10000" in ran.stderr
