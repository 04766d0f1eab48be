"""`xr demo --quick` tells its whole story with real processes: every job completes, the killed
region's training job fails over and resumes from a checkpoint, and nothing is left running."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from node.cli import main
from node.demo import DemoOptions, run

pytestmark = pytest.mark.integration


def test_demo__quick_run_tells_the_failover_story_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    output = io.StringIO()
    report = run(
        DemoOptions(quick=True, base_dir=tmp_path, timeout_s=300),
        console=Console(file=output, width=160),
    )
    text = output.getvalue()
    assert report.story_told, (report, text)
    assert report.killed_region is not None
    assert report.failover_region != report.killed_region
    assert report.resumed_from_step is not None and report.resumed_from_step > 0
    assert len(report.jobs) == 4 and set(report.jobs.values()) == {"succeeded"}
    assert report.left_running == []
    assert "failed over" in text and "summary" in text


def test_cli__no_command_prints_help_and_exits_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_cli__demo_refuses_a_timeout_too_short_to_mean_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--timeout", "1"]) == 2
    assert "--timeout" in capsys.readouterr().err
