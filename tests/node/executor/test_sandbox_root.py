"""The directory of workers' private /tmp (`node.executor.sandbox_root`): one a killed node left
is removed by the next node to start; one a running node holds, or another program's, is not.
What an attempt's directories hold is counted as `du` counts it (`used_bytes`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from node.config import ConfigError
from node.executor.executor import Executor
from node.executor.sandbox_root import HELD, SandboxRoot, remove_stale, used_bytes
from tests.node.executor.test_executor import _config

ROOT = Path(__file__).resolve().parents[3]

# A node in miniature: makes its sandbox root in a directory, an attempt's files in it, says
# where, and waits to be killed.
NODE = """
import sys, time
from pathlib import Path
from node.executor.sandbox_root import SandboxRoot
root = SandboxRoot("xr-eu-jobs-", Path(sys.argv[1]))
(root.path / "attempt-7" / "tmp").mkdir(parents=True)
(root.path / "attempt-7" / "tmp" / "weights.npy").write_bytes(b"secret")
print(root.path, flush=True)
time.sleep(600)
"""


def _start_node(where: Path) -> tuple[subprocess.Popen[str], Path]:
    node = subprocess.Popen(
        [sys.executable, "-c", NODE, str(where)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert node.stdout is not None
    return node, Path(node.stdout.readline().strip())


def _kill(node: subprocess.Popen[str]) -> None:
    node.send_signal(signal.SIGKILL)
    node.wait(timeout=30)


def test_a_killed_nodes_root_is_removed_by_the_next__a_running_nodes_is_not(
    tmp_path: Path,
) -> None:
    killed, killed_root = _start_node(tmp_path)
    running, running_root = _start_node(tmp_path)
    try:
        _kill(killed)
        assert (killed_root / "attempt-7" / "tmp" / "weights.npy").exists()
        # Not a sandbox root: no `held` (another program's, or one being made).
        other = tmp_path / "xr-demo-1234"
        other.mkdir()
        # Not named as one.
        unnamed = tmp_path / "jobs"
        unnamed.mkdir()
        (unnamed / HELD).touch()

        mine = SandboxRoot("xr-us-jobs-", tmp_path)
        try:
            assert not killed_root.exists()
            assert (running_root / "attempt-7" / "tmp" / "weights.npy").exists()
            assert other.is_dir() and (unnamed / HELD).exists()
            assert remove_stale(tmp_path) == []
        finally:
            mine.close()
        assert not mine.path.exists()
        mine.close()
    finally:
        _kill(running)
    assert remove_stale(tmp_path) == [running_root]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["jobs", "xr-demo-1234"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another uid")
def test_a_root_of_another_uid_or_a_link_is_left_alone(tmp_path: Path) -> None:
    """Only this uid's directories: a user who makes `/tmp/xr-...` with an unheld `held` (or
    a link named so to a directory of root's) does not have it removed by root."""
    planted = tmp_path / "xr-eu-jobs-planted"
    planted.mkdir()
    (planted / HELD).touch()
    os.chown(planted, 65534, 65534)
    target = tmp_path / "precious"
    target.mkdir()
    (target / HELD).touch()
    (tmp_path / "xr-eu-jobs-link").symlink_to(target)
    assert remove_stale(tmp_path) == []
    assert (planted / HELD).exists() and (target / HELD).exists()


def test_a_prefix_not_starting_xr_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="starts with 'xr-'"):
        SandboxRoot("jobs-", tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="workers as another user need a node run as root")
def test_a_starting_node_removes_a_killed_nodes_root__and_its_own_when_it_does_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor's `prepare` makes its root through `SandboxRoot`: here its job user cannot
    run the interpreter, so the node does not start, and leaves nothing either."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed, killed_root = _start_node(tmp_path)
    _kill(killed)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    (locked / "python").symlink_to(sys.executable)
    config = _config(
        tmp_path / "node",
        **{"executor.job_user": "nobody", "executor.python": str(locked / "python")},
    )
    with pytest.raises(ConfigError, match=r"executor\.job_user: 'nobody' cannot run"):
        asyncio.run(Executor(config, store=None).prepare())  # type: ignore[arg-type]
    assert not killed_root.exists()
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("xr-")]


def _blocks(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_used_bytes_counts_blocks_under_every_directory_each_file_once_and_no_link_target(
    tmp_path: Path,
) -> None:
    tmp, var_tmp, outside = (tmp_path / name for name in ("tmp", "var-tmp", "outside"))
    for directory in (tmp / "a" / "b", var_tmp, outside):
        directory.mkdir(parents=True)
    (tmp / "a" / "b" / "deep").write_bytes(b"x" * 100_000)
    (var_tmp / "flat").write_bytes(b"y" * 50_000)
    # A sparse file takes the blocks it has, not its length.
    with open(tmp / "sparse", "wb") as sparse:
        sparse.truncate(1 << 30)
    # Another name of a file counts nothing more; a link to a file outside counts itself only.
    os.link(var_tmp / "flat", tmp / "flat-again")
    (outside / "big").write_bytes(b"z" * 1_000_000)
    (tmp / "to-outside").symlink_to(outside / "big")
    (tmp / "to-outside-dir").symlink_to(outside)
    expected = sum(
        _blocks(path)
        for path in (tmp / "a", tmp / "a" / "b", tmp / "a" / "b" / "deep", var_tmp / "flat")
    ) + sum(os.lstat(tmp / name).st_blocks * 512 for name in ("sparse", "to-outside"))
    expected += os.lstat(tmp / "to-outside-dir").st_blocks * 512
    assert used_bytes([tmp, var_tmp], stop_above=1 << 40) == expected
    assert expected < 1_000_000 + 100_000
    # Missing directories count nothing.
    assert used_bytes([tmp_path / "gone"], stop_above=0) == 0


def test_used_bytes_stops_at_the_first_count_above_the_bound(tmp_path: Path) -> None:
    for index in range(50):
        (tmp_path / f"file-{index}").write_bytes(b"x" * 10_000)
    everything = used_bytes([tmp_path], stop_above=1 << 40)
    one = _blocks(tmp_path / "file-0")
    early = used_bytes([tmp_path], stop_above=3 * one)
    assert 3 * one < early < everything
