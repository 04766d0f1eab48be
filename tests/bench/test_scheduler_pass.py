"""bench/scheduler_pass.py: this tree's scheduling pass against a git revision's, in one run."""

from __future__ import annotations

import json
import subprocess

from tests.bench._script import run_script


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return run_script("scheduler_pass.py", *arguments)


def test_times_both_passes_against_a_revision_and_prints_the_ratios() -> None:
    ran = _run("--against", "HEAD", "--pairs", "2", "--tasks", "300")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.strip().splitlines()
    assert lines[0].startswith("| pass (300 pending tasks, 50 regions) | HEAD ms |")
    assert [line.split("|")[1].strip() for line in lines[2:4]] == ["full pass", "moving up"]
    figures = json.loads(lines[-1])
    assert figures["against"] == "HEAD"
    for label in ("full pass", "moving up"):
        assert set(figures[label]) == {"revision_ms", "this_tree_ms", "ratio"}
        assert all(value > 0 for value in figures[label].values())


def test_an_unknown_revision_is_refused_without_a_traceback() -> None:
    ran = _run("--against", "no-such-revision-x")
    assert ran.returncode == 1
    assert "cannot read revision 'no-such-revision-x'" in ran.stderr
    assert "Traceback" not in ran.stderr
