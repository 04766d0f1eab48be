"""The node's metrics as a fresh node exposes them, before anything has happened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from node.config import load_config
from node.metrics import NodeMetrics
from raftstore.store import RaftStore


@pytest.fixture
def metrics(tmp_path: Path) -> Iterator[NodeMetrics]:
    config = load_config(
        environ={},
        overrides={
            "region.name": "eu-west",
            "raft.address": "127.0.0.1:1",
            "data_dir": str(tmp_path),
        },
    )
    store = RaftStore(config.raft)
    try:
        yield NodeMetrics(store, config.region.name)
    finally:
        store.replica.destroy()


def test_leader_changes__has_a_zero_sample_before_the_first_change(metrics: NodeMetrics) -> None:
    """The counter had no sample until the node's first leader change: dashboards showed no
    series, and `increase()` missed that first change (it needs a sample before it)."""
    text = generate_latest(metrics.registry).decode()
    assert 'xr_raft_leader_changes_total{region="eu-west"} 0.0' in text.splitlines()
    metrics.leader_changes.labels("eu-west").inc()
    text = generate_latest(metrics.registry).decode()
    assert 'xr_raft_leader_changes_total{region="eu-west"} 1.0' in text.splitlines()
