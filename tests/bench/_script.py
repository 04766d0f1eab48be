"""Runs a benchmark script of bench/ as a user would, for the tests of its output."""

from __future__ import annotations

import os
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
