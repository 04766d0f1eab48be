"""A benchmark stopped by SIGTERM or Ctrl-C stops what it started and says so in one line
(`bench/_signals.py`): before, SIGTERM skipped every `finally`, so clusters in sessions of their
own ran on, and Ctrl-C printed a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench._signals import INTERRUPTED, TERMINATED, running
from tests.bench._script import ROOT, ctrl_c_as_at_a_terminal

# A stand-in benchmark: starts a child in a session of its own (as LocalCluster starts nodes),
# prints its id, and stops it in a `finally`, the way the scripts of bench/ do.
_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from bench._signals import run_main

    def body() -> int:
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
        )
        try:
            print(child.pid, flush=True)
            time.sleep(120)
        finally:
            child.kill()
            child.wait()
        return 0

    sys.exit(run_main(body))
    """
)


def _gone(pid: int) -> bool:
    return not running(pid)


@pytest.mark.parametrize(
    ("signal_number", "status", "line"),
    [(signal.SIGTERM, 143, TERMINATED), (signal.SIGINT, 130, INTERRUPTED)],
)
def test_a_stopped_benchmark_stops_its_child_and_says_so_in_one_line(
    tmp_path: Path, signal_number: int, status: int, line: str
) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    assert process.stdout is not None
    child = int(process.stdout.readline())
    process.send_signal(signal_number)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == status
    assert errors.strip() == line
    deadline_s = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline_s:
        time.sleep(0.05)
    assert _gone(child)
    if not _gone(child):
        os.kill(child, signal.SIGKILL)
