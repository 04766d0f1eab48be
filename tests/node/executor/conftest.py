"""Fixtures the executor's tests share."""

from __future__ import annotations

import shutil
import site
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.executor.executor import worker_environment
from node.executor.job_user import lookup

SYSTEM_PYTHON = "/usr/bin/python3.11"


@pytest.fixture()
def sandboxes() -> Iterator[Path]:
    """A directory of root's alone, as the executor makes for its workers' sandboxes
    (`Executor.prepare`, `executor.private_tmp`)."""
    path = Path(tempfile.mkdtemp(prefix="xr-test-sandboxes-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def nobodys_python(monkeypatch: pytest.MonkeyPatch) -> str:
    """An interpreter `nobody` can run xr's worker with: this machine's venv interpreter lives
    under /root (mode 0700), so the system's python3.11 with the venv's packages on its path;
    the test is skipped, saying why, where this machine has none that works."""
    packages = ":".join(site.getsitepackages())
    monkeypatch.setenv("PYTHONPATH", packages)
    environment = worker_environment(lookup("nobody"))
    try:
        done = subprocess.run(
            [SYSTEM_PYTHON, "-c", "import node.executor.worker"],
            env=environment,
            capture_output=True,
            timeout=60,
            **lookup("nobody").spawn_options(),
        )
    except OSError as error:
        pytest.skip(f"no interpreter nobody can run here ({SYSTEM_PYTHON}: {error.strerror})")
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        pytest.skip(f"nobody cannot import xr's worker with {SYSTEM_PYTHON} here: {last}")
    return SYSTEM_PYTHON


def process_running(pid: int) -> bool:
    """Whether process `pid` is there and not a zombie (killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
