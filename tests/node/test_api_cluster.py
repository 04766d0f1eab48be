"""Regions, the cluster, health and metrics through the app factory, on a single-member cluster."""

from __future__ import annotations

import pickle
from pathlib import Path

import msgspec
import pytest

from node.api.cluster import VERSION
from raftstore.replica import encode_group
from tests.client.fake_node import FakeNodes, Reply
from tests.node.conftest import ApiNode, eventually
from xrcore.codec import ENVELOPE_VERSION
from xrcore.commands import RegionRegister, TaskAssign, TaskClaim

pytestmark = pytest.mark.integration


def test_regions__list_and_get_the_registered_region(api: ApiNode) -> None:
    region = api.register_region()
    listed = api.request("GET", "/v1/regions")
    assert listed.status == 200
    assert region in [item["name"] for item in listed.document["items"]]

    shown = api.request("GET", f"/v1/regions/{region}")
    assert shown.status == 200
    assert shown.document["raft_address"] == api.config.raft.self_address
    assert api.request("GET", "/v1/regions/no-such-region").status == 404


def test_cluster_status__shows_this_node_leading_its_region(api: ApiNode) -> None:
    region = api.register_region()
    status = api.request("GET", "/v1/cluster/status")
    assert status.status == 200
    assert status.document["state"] == "leader"
    assert status.document["leader"] == api.config.raft.self_address
    assert status.document["leader_region"] == region
    assert status.document["has_quorum"] is True


def test_cluster_members__list_this_node_for_an_operator(api: ApiNode) -> None:
    members = api.request("GET", "/v1/cluster/members", token="operator")
    assert members.status == 200
    [member] = members.document["items"]
    assert (member["self"], member["leader"], member["region"]) == (True, True, "r0")


def test_transfer_leader__to_the_leaders_own_region__changes_nothing(api: ApiNode) -> None:
    region = api.register_region()
    answer = api.request(
        "POST", "/v1/cluster/transfer-leader", token="admin", json={"region": region}
    )
    assert answer.status == 200
    assert answer.document == {"leader_region": region, "transferred": False}

    unknown = api.request(
        "POST", "/v1/cluster/transfer-leader", token="admin", json={"region": "nowhere"}
    )
    assert (unknown.status, unknown.error_code) == (404, "not_found")


def test_healthz_and_readyz__answer_200_on_a_node_with_a_leader(api: ApiNode) -> None:
    health = api.request("GET", "/healthz", token=None)
    assert (health.status, health.document["status"]) == (200, "ok")
    ready = api.request("GET", "/readyz", token=None)
    assert (ready.status, ready.document["ready"], ready.document["reason"]) == (200, True, None)


def test_metrics__expose_raft_and_request_series_as_prometheus_text(api: ApiNode) -> None:
    api.ok("PUT", "/v1/kv/metrics-key", json={"value": "x"})
    metrics = api.request("GET", "/metrics", token=None)
    assert metrics.status == 200
    assert metrics.headers["Content-Type"].startswith("text/plain")
    text = metrics.body.decode()
    assert 'xr_raft_term{region="r0"}' in text
    assert 'xr_http_requests_total{method="PUT",route="/v1/kv/{key}",status="200"}' in text
    assert "xr_kv_revision" in text
    # This node writes its journal without syncing (durability "write"): no syncs to count.
    assert 'xr_raft_journal_syncs_total{region="r0"} 0.0' in text
    assert 'xr_raft_journal_slow_syncs_total{region="r0"} 0.0' in text


def test_forwarded_request__whose_answer_is_too_long__is_503_without_reading_it_all(
    tmp_path: Path,
) -> None:
    """Logs live on their region; a node forwards there and reads the answer up to a bound, so a
    broken (or impostor) node at a region's address cannot fill this node's memory."""
    fakes = FakeNodes()
    node = ApiNode(tmp_path)
    try:
        endless = fakes.add({"*": [Reply(stream_bytes=256 << 20)]})
        node.propose(
            RegionRegister(
                name="far",
                http_address=endless.url.removeprefix("http://"),
                raft_address="127.0.0.1:1",
            )
        )
        job_id = node.ok("POST", "/v1/jobs", json={"name": "far-job", "workload": "sleep"})[
            "job_id"
        ]
        node.propose(TaskAssign(job_id=job_id, task_index=0, region="far"))
        node.propose(
            TaskClaim(
                job_id=job_id,
                task_index=0,
                region="far",
                executor_id="far-executor",
                lease_ttl_ms=600_000,
            )
        )
        answer = node.request("GET", f"/v1/jobs/{job_id}/logs")
        assert (answer.status, answer.error_code) == (503, "cluster.unavailable"), answer.body
        assert "answer_bytes_max" in answer.document["error"]["message"]
        assert endless.streamed < 64 << 20, endless.streamed
    finally:
        node.close()
        fakes.close()


def test_a_node_stopped_at_an_entry_of_a_newer_release__refuses_requests_and_says_why(
    tmp_path: Path,
) -> None:
    """`tests/raftstore/test_newer_entries.py` has the cluster; here what its API says: reads and
    writes refused with 503 (clients try the next node), not ready, status and metrics name it."""
    node = ApiNode(tmp_path)
    try:
        assert node.request("PUT", "/v1/kv/k", json={"value": "v"}).status == 200
        status = node.request("GET", "/v1/cluster/status").document
        assert (status["version"], status["envelope_version"]) == (VERSION, ENVELOPE_VERSION)
        assert status["apply_halted"] is None
        newer = msgspec.msgpack.encode({"v": ENVELOPE_VERSION + 1, "now_ms": 1, "command": {}})
        group = b"\x00" + pickle.dumps((0, (encode_group([newer]),)), protocol=5)
        node.store.replica._applyCommand(group, None)
        node.run(eventually(lambda: node.store.replica.halted is not None))

        for method, path, body in [("PUT", "/v1/kv/k", {"value": "w"}), ("GET", "/v1/kv/k", None)]:
            answer = node.request(method, path, json=body)
            assert (answer.status, answer.error_code) == (503, "cluster.unavailable")
            assert "must be upgraded" in answer.document["error"]["message"]
        ready = node.request("GET", "/readyz", token=None)
        assert ready.status == 503
        assert "newer release" in ready.document["reason"]
        status = node.request("GET", "/v1/cluster/status").document
        assert "envelope version" in status["apply_halted"]
        metrics = node.request("GET", "/metrics", token=None).body.decode()
        assert 'xr_raft_apply_halted{region="r0"} 1.0' in metrics
    finally:
        node.close()
