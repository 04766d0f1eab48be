"""`node.localcluster`: a node runs the packages of the checkout it is given."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from node.localcluster import LocalCluster, LocalNode

ROOT = Path(__file__).resolve().parents[2]


def test_a_node_runs_its_code_roots_packages_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A benchmark runs another revision's nodes from this checkout (`bench/raft_messages.py
    --against`). With plain `python -m` the working directory came first on the module path, so
    those nodes ran this checkout's `node` package, not the revision's."""
    other = tmp_path / "other-checkout"
    (other / "node").mkdir(parents=True)
    (other / "node" / "__init__.py").write_text("")
    (other / "node" / "cli.py").write_text("print('running', __file__)\n")
    node = LocalNode(
        region="r0",
        raft_port=1,
        http_port=2,
        data_dir=tmp_path / "data",
        log_path=tmp_path / "node.log",
        peers=[],
        code_root=other,
    )
    # From this checkout, whose own `node` package must not be the one that runs.
    monkeypatch.chdir(ROOT)
    node.start()
    assert node.process is not None
    try:
        node.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        node.process.kill()
        node.process.wait()
    assert f"running {other / 'node' / 'cli.py'}" in node.log_path.read_text()


def test_regions_share_one_checkpoint_directory_unless_told_otherwise(tmp_path: Path) -> None:
    """Each node's default is under its own data directory, so a task that failed over could
    not read its checkpoint and started over (while `xr up` and the demo said it resumed)."""
    shared = LocalCluster(tmp_path / "a", size=3)
    assert {node.settings["executor.checkpoint_dir"] for node in shared.nodes} == {
        str(tmp_path / "a" / "checkpoints")
    }
    given = LocalCluster(tmp_path / "b", size=2, settings={"executor.checkpoint_dir": "/mnt/x"})
    assert {node.settings["executor.checkpoint_dir"] for node in given.nodes} == {"/mnt/x"}
    in_file = LocalCluster(
        tmp_path / "c", size=2, config_text='[executor]\ncheckpoint_dir = "/mnt/y"\n'
    )
    assert all("executor.checkpoint_dir" not in node.settings for node in in_file.nodes)
