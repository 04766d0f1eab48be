"""`xr demo` (the main job so far) runs to the end and shows the replicas agreeing."""

from __future__ import annotations

import pytest

from node.cli import main
from node.demo import run


def test_demo__runs_and_replicas_agree() -> None:
    lines: list[str] = []
    assert run(lines.append) == 0
    text = "\n".join(lines)
    assert "fencing.stale_token" in text
    assert "resumes from step 4" in text
    assert text.endswith("replicas agree.")


def test_cli__demo_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    assert "replicas agree" in capsys.readouterr().out


def test_cli__no_command_prints_help_and_exits_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out
