"""`xr demo --quick` tells its whole story with real processes: every job completes, the killed
region's training job fails over and resumes from a checkpoint, and nothing is left running."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from node.cli import main
from node.demo import DemoOptions, _Demo, run

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


class _Region:
    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


class _Cluster:
    def __init__(self) -> None:
        self.region = _Region()

    def node(self, name: str) -> _Region:
        return self.region

    def leader(self) -> None:
        return None


def _training(done: int, checkpoint_step: int | None) -> SimpleNamespace:
    checkpoint = None if checkpoint_step is None else SimpleNamespace(step=checkpoint_step)
    task = SimpleNamespace(
        state="running", total=16_000, done=done, checkpoint=checkpoint, region="us-east"
    )
    return SimpleNamespace(job_id="job-1", tasks=[task])


@pytest.mark.parametrize(
    ("done", "checkpoint_step", "killed"),
    [
        # The last progress report lags far behind the committed checkpoint (reports are
        # throttled; a fast machine ran past half-way between two): half-way all the same.
        (1_601, 9_600, True),
        (8_000, 1_600, True),
        (7_999, 6_400, False),
        (9_000, None, False),
    ],
)
def test_kill__half_way_is_judged_by_the_newer_of_progress_and_checkpoint(
    done: int, checkpoint_step: int | None, killed: bool
) -> None:
    demo = _Demo(DemoOptions(quick=True), Console(file=io.StringIO()))
    cluster = _Cluster()
    demo._maybe_kill(cluster, _training(done, checkpoint_step), lambda text: None)  # type: ignore[arg-type]
    assert cluster.region.killed is killed
    if killed:
        assert demo.report.killed_region == "us-east"
        assert demo.report.killed_at_step == max(done, checkpoint_step or 0)
