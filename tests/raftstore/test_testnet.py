"""Test-only message drops (`raftstore.testnet`): refused outside a test run, and the node's
`PUT /v1/test/drops` exists only on a node started with them."""

from __future__ import annotations

import pytest

from raftstore.faults import FaultsRefused
from raftstore.testnet import PARTITIONS_VARIABLE, Drops


def test_drops_are_off_unless_asked_for() -> None:
    assert Drops.from_environment({}) is None


def test_drops_are_refused_outside_a_test_run() -> None:
    with pytest.raises(FaultsRefused, match="only in a test run"):
        Drops.from_environment({PARTITIONS_VARIABLE: "1"})
    with pytest.raises(FaultsRefused, match="must be 1"):
        Drops.from_environment({PARTITIONS_VARIABLE: "yes", "XR_TEST_RUN": "1"})


def test_drops_in_a_test_run_keep_the_peers_they_are_given() -> None:
    drops = Drops.from_environment({PARTITIONS_VARIABLE: "1", "XR_TEST_RUN": "1"})
    assert drops is not None
    drops.set(["127.0.0.1:2", "127.0.0.1:1"])
    assert drops.peers == ["127.0.0.1:1", "127.0.0.1:2"]
