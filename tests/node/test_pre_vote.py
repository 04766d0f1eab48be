"""Pre-vote with real processes: a follower paused longer than any election timeout (a stalled
process or machine, here SIGSTOP) does not depose the leader when it wakes.

An event loop runs its overdue timers before it reads its sockets, so the woken follower ticks,
finds its election deadline long past and would campaign at a higher term before it reads the
leader's heartbeats that queued meanwhile; the leader would step down on hearing that term.
With pre-vote (`raft.pre_vote`, on by default) it first asks the others, who still hear from the
leader and say no. The control runs the same pauses with pre-vote off and sees the term rise.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from node.localcluster import LocalCluster, LocalNode

pytestmark = pytest.mark.integration

WAIT_S = 30.0
# Longer than the largest election timeout (raft.raft_max_timeout_s, 1.0 s).
PAUSE_S = 1.5
# After resuming: long enough for an election the pause would cause to finish.
SETTLE_S = 2.0
PAUSES = 3


def _term(node: LocalNode) -> int:
    with urllib.request.urlopen(f"{node.url}/v1/cluster/status", timeout=10.0) as answer:
        return int(json.load(answer)["term"])


def _leader(cluster: LocalCluster) -> LocalNode:
    deadline_s = time.monotonic() + WAIT_S
    while time.monotonic() < deadline_s:
        leader = cluster.leader()
        if leader is not None:
            return leader
        time.sleep(0.05)
    raise AssertionError(f"no leader within {WAIT_S} s")


def _terms_across_pauses(tmp_path: Path, settings: dict[str, str]) -> list[int]:
    """The leader's term before the first pause and after each pause of one follower."""
    cluster = LocalCluster(tmp_path, size=3, settings=settings)
    cluster.start()
    try:
        leader = _leader(cluster)
        terms = [_term(leader)]
        follower = next(node for node in cluster.nodes if node is not leader)
        for _ in range(PAUSES):
            follower.pause()
            time.sleep(PAUSE_S)
            follower.resume()
            time.sleep(SETTLE_S)
            terms.append(_term(_leader(cluster)))
        return terms
    finally:
        cluster.kill()


def test_a_paused_follower_does_not_depose_the_leader(tmp_path: Path) -> None:
    terms = _terms_across_pauses(tmp_path, {})
    assert len(set(terms)) == 1, terms


def test_without_pre_vote_a_paused_follower_deposes_the_leader(tmp_path: Path) -> None:
    """The control: the same pauses with pre-vote off raise the term."""
    terms = _terms_across_pauses(tmp_path, {"raft.pre_vote": "false"})
    assert terms[-1] > terms[0], terms
