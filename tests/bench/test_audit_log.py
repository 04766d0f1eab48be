"""bench/audit_log.py: xr's audit line against the standard logging path and an earlier revision,
in one run."""

from __future__ import annotations

import json
import subprocess

from tests.bench._script import run_script


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return run_script("audit_log.py", *arguments)


def test_times_every_side_and_prints_this_tree_over_each_reference() -> None:
    ran = _run("--lines", "300", "--rounds", "2", "--against", "HEAD")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.strip().splitlines()
    assert lines[0].startswith("round 1/2: this tree ")
    rows = [line for line in lines if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == [
        "xr `AuditLog`, this tree",
        "standard `logging` path",
        "xr `AuditLog` at HEAD",
    ]
    figures = json.loads(lines[-1])
    assert figures["benchmark"] == "audit_log" and figures["lines"] == 300
    assert set(figures["us_per_line"]) == {"this tree", "logging", "HEAD"}
    assert all(value > 0 for value in figures["us_per_line"].values())
    assert set(figures["ratio"]) == {"logging", "HEAD"}


def test_bad_arguments_and_an_unknown_revision_are_refused_without_a_traceback() -> None:
    ran = _run("--lines", "0")
    assert ran.returncode == 2 and "must be at least 1" in ran.stderr
    ran = _run("--lines", "10", "--rounds", "1", "--against", "no-such-revision-x")
    assert ran.returncode == 1
    assert "audit_log: cannot read revision 'no-such-revision-x'" in ran.stderr
    assert "Traceback" not in ran.stderr
