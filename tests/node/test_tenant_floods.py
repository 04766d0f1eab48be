"""What one tenant's flood must not do to the cluster (the tenant QA pass of session 30).

Ten submissions of 10,000-task arrays that can run nowhere made every scheduling pass take over
a second on the leader's Raft thread, and the cluster elected a new leader every second or two
while they waited. A pass now looks at a bounded number of pending tasks
(`scheduler.pass_pending_max`, `xrcore.placement._in_view`): the term stays where it was.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.localcluster import LocalCluster
from xrcore.client import Client

pytestmark = pytest.mark.integration

WATCH_S = 20.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path, size=3)
    for node in local.nodes:
        node.start()
    try:
        local.wait_ready(timeout_s=60.0)
        yield local
    finally:
        local.kill()


@pytest.mark.slow
def test_a_hundred_thousand_queued_tasks__the_leader_keeps_its_term(
    cluster: LocalCluster,
) -> None:
    with Client([node.url for node in cluster.nodes], timeout_s=30.0) as client:
        for number in range(10):
            client.jobs.submit(
                f"flood-{number}", workload="gemm", array_size=10_000, regions_allow=["nowhere"]
            )
        term = client.cluster.status().term
        terms = [term]
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            terms.append(client.cluster.status().term)
            time.sleep(0.5)
    # One election could come from anything on a loaded machine; without the bound there were
    # about ten in this time.
    assert terms[-1] - term <= 1, terms
