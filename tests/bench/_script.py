"""Runs a benchmark script of bench/ as a user would, for the tests of its output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(
    name: str, *arguments: str, environment: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python bench/NAME ARGUMENTS...` from the repository root, its output captured; with
    `environment`, those variables set as well."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / name), *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=None if environment is None else {**os.environ, **environment},
    )


def ctrl_c_as_at_a_terminal() -> None:
    """For `preexec_fn`: Ctrl-C (SIGINT) back to its default in the script, which Python then
    turns into KeyboardInterrupt. A suite started in the background by a shell (`make test &`)
    inherits SIGINT ignored, and the script would never see the signal the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
