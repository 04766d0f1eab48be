"""How a benchmark stops early: Ctrl-C and SIGTERM both stop everything it started, quietly.

A benchmark starts clusters (often in sessions of their own, which a terminal's Ctrl-C does not
reach) and temporary directories, and only its own `finally` blocks and `with` statements stop
and remove them. Python runs those on Ctrl-C (KeyboardInterrupt) but not on SIGTERM, which is what
`bench/run_all.py` sends a benchmark that runs out of time, and what `kill` sends by default:
`sigterm_as_exit` makes SIGTERM raise `Terminated`, a SystemExit, so the same cleanup runs.
`run_main` runs a script's main that way and turns either signal into one line on stderr and the
shell's exit status for it (130, 143) instead of a traceback. `shielded` ignores both while a
cleanup runs, so a second Ctrl-C cannot cut it short and leave members behind. `kill_cluster`
kills a `LocalCluster`'s nodes and every process below them: a job's worker outlives its node
for a moment and would write into the directory being removed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if __name__ == "__main__":
    print(
        f"{__file__} is a module of the scripts in bench/, not a script: run one of those",
        file=sys.stderr,
    )
    raise SystemExit(2)

from bench._load import with_descendants

if TYPE_CHECKING:
    from node.localcluster import LocalCluster

__all__ = [
    "INTERRUPTED",
    "TERMINATED",
    "Terminated",
    "kill_cluster",
    "run_main",
    "running",
    "shielded",
    "sigterm_as_exit",
]

INTERRUPTED = "interrupted; every process this benchmark started is stopped"
TERMINATED = "terminated (SIGTERM); every process this benchmark started is stopped"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long `kill_cluster` waits for the processes below the nodes to be gone.
GONE_TIMEOUT_S = 10.0


class Terminated(SystemExit):
    """Raised by SIGTERM inside `sigterm_as_exit`; its code is the shell's status for it."""


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises `Terminated`, so `finally` blocks and `with` statements run as they do for
    Ctrl-C."""

    def handler(signal_number: int, frame: FrameType | None) -> None:
        raise Terminated(128 + signal_number)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """SIGINT and SIGTERM are ignored inside, for a cleanup that must run to its end."""
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in _STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def run_main(body: Callable[[], int]) -> int:
    """`body()` with SIGTERM as `Terminated`; on Ctrl-C or SIGTERM, once `body`'s cleanup has
    run, one line on stderr and 130 or 143 (128 plus the signal's number) instead of a
    traceback."""
    try:
        with sigterm_as_exit():
            return body()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 128 + signal.SIGINT
    except Terminated as error:
        print(TERMINATED, file=sys.stderr)
        return int(error.code or 128 + signal.SIGTERM)


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_cluster(cluster: LocalCluster) -> None:
    """kill -9 every node of `cluster` and every process below them, and waits (at most
    `GONE_TIMEOUT_S`) until those are gone."""
    nodes = [node.process.pid for node in cluster.nodes if node.running and node.process]
    below = [pid for pid in with_descendants(nodes) if pid not in nodes]
    cluster.kill()
    for pid in below:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline_s = time.monotonic() + GONE_TIMEOUT_S
    while any(running(pid) for pid in below) and time.monotonic() < deadline_s:
        time.sleep(0.02)
