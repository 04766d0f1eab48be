"""What a call says, and when it says it, when no node serves it (found by a QA pass with killed
and paused nodes): `jobs.wait` ends within its timeout and says that no node answered, and a
call that gives up names the most telling problem its tries met, not only the last one.

Against scripted fake nodes (`tests/client/fake_node.py`), so every answer is reached on purpose.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.client.fake_node import FakeNodes, Reply, refused_url
from xrcore.client import Client
from xrcore.errors import ClusterUnavailable, Timeout

pytestmark = pytest.mark.integration

_NO_LEADER = Reply(
    status=503,
    document={
        "error": {
            "code": "cluster.unavailable",
            "message": "no leader is known; retry when the cluster has elected one",
            "definite": True,
        }
    },
)
# What `jobs.wait` may take past its timeout: the answer of its last poll (`WAIT_ANSWER_S`),
# and a little for a loaded machine.
_WAIT_MARGIN_S = 1.5


def _pending_job() -> dict[str, Any]:
    return {
        "job_id": "job-1",
        "name": "j",
        "tenant": "default",
        "state": "pending",
        "priority": 0,
        "submitted_at_ms": 1,
        "array_size": 1,
        "tasks": [{"index": 0, "state": "pending", "attempts": []}],
    }


@pytest.mark.parametrize(
    ("node", "seen"),
    [
        ("killed", "could not be looked at: no node answered"),
        ("paused", "could not be looked at: no node answered"),
        (
            "paused after answering",
            "had not finished when a node last answered, and no node answered after that",
        ),
    ],
)
def test_jobs_wait__no_node_answers__says_so_within_its_timeout(
    fakes: FakeNodes, node: str, seen: str
) -> None:
    """With its only endpoint killed, `jobs.wait(timeout_s=2)` raised "Timeout: job ... did not
    finish within 2 s" after 4 s; against a paused node, timeout_s=3 took 7 s."""
    if node == "killed":
        url = refused_url()
    else:
        replies = [Reply(delay_s=30.0)]
        if node == "paused after answering":
            replies.insert(0, Reply(document=_pending_job()))
        url = fakes.add({"GET /v1/jobs/job-1": replies}).url
    with Client(url, timeout_s=10) as client:
        started_s = time.monotonic()
        with pytest.raises(ClusterUnavailable) as raised:
            client.jobs.wait("job-1", timeout_s=2)
        elapsed_s = time.monotonic() - started_s
    assert elapsed_s < 2 + _WAIT_MARGIN_S, elapsed_s
    message = raised.value.message
    assert message.startswith(
        f"job 'job-1' {seen} within the wait of 2 s, so whether it has finished is not known; "
        "GET /v1/jobs/job-1: no node could serve it"
    ), message


def test_jobs_wait__a_node_that_answers__still_times_out_as_not_finished(
    fakes: FakeNodes,
) -> None:
    node = fakes.add({"GET /v1/jobs/job-1": [Reply(document=_pending_job())]})
    with Client(node.url, timeout_s=10) as client, pytest.raises(Timeout) as raised:
        client.jobs.wait("job-1", timeout_s=0.5)
    assert raised.value.message == "job 'job-1' did not finish within 0.5 s"


def test_give_up__a_nodes_answer_is_not_hidden_behind_a_refused_connection_tried_after_it(
    fakes: FakeNodes,
) -> None:
    """With n1 alive but without a quorum, errors read "(last: <n3>: Cannot connect ...)": n1's
    answer that it knows no leader did not appear, nor did the hint at the quorum. Here n1
    answers so once and then not at all, so the refused endpoint is the last one to say
    anything."""
    answering = fakes.add({"GET /v1/kv/k": [_NO_LEADER, Reply(delay_s=30.0)]})
    refused = refused_url()
    with (
        Client([answering.url, refused], timeout_s=1) as client,
        pytest.raises(ClusterUnavailable) as raised,
    ):
        client.kv.get("k")
    assert raised.value.message == (
        "GET /v1/kv/k: no node could serve it within 1 s (last: "
        f"{answering.url}: cluster.unavailable: no leader is known; retry when the cluster has "
        f"elected one; {refused}: cannot connect (Connection refused)); the cluster may have no "
        "quorum (see `xr cluster status`)"
    )
