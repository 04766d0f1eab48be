"""`bench/failover.py` and `bench/gpu_check.py` stopped by Ctrl-C or SIGTERM stop their nodes
and remove their temporary directory, where before SIGTERM left the nodes running and every run,
even a finished one, left its directory behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bench._load import with_descendants
from tests.bench._script import ROOT, ctrl_c_as_at_a_terminal


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


@pytest.mark.parametrize(
    ("script", "prefix", "arguments", "signal_number"),
    [
        ("failover.py", "xr-bench-failover-", ["--trials", "1"], signal.SIGINT),
        ("gpu_check.py", "xr-gpu-check-", ["--seconds", "30"], signal.SIGTERM),
    ],
)
def test_a_stopped_run_stops_its_nodes_and_removes_its_directory(
    script: str, prefix: str, arguments: list[str], signal_number: int
) -> None:
    temporary = Path(tempfile.gettempdir())
    before = set(temporary.glob(f"{prefix}*"))
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / script), *arguments],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )  # fmt: skip
    nodes: list[int] = []
    try:
        # Once the nodes run (a process below the script that is an `xr node`), stop it.
        deadline_s = time.monotonic() + 60
        while not nodes and time.monotonic() < deadline_s and process.poll() is None:
            time.sleep(0.1)
            nodes = [
                pid
                for pid in with_descendants([process.pid])
                if pid != process.pid and "node" in _command_line(pid)
            ]
        assert nodes, "the nodes did not start"
        created = set(temporary.glob(f"{prefix}*")) - before
        assert created
        time.sleep(1)
        below = [pid for pid in with_descendants([process.pid]) if pid != process.pid]
        process.send_signal(signal_number)
        _, errors = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal_number, errors
    assert "Traceback" not in errors
    assert not any(path.exists() for path in created)
    assert all(_state(pid) in (None, "Z") for pid in below)
