"""Authentication, roles and tenant isolation through the client, against a real three-region
cluster with bearer tokens configured: each tenant sees only its own keys, sessions, locks, jobs
and watch events, on every node; a role that may not do something is refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.config import hash_token
from node.localcluster import LocalCluster
from xrcore.client import Client
from xrcore.errors import Forbidden, NotFound, Unauthenticated

pytestmark = pytest.mark.integration

TOKENS = {
    "alice": ("alice-secret", "tenant", "team-a"),
    "bob": ("bob-secret", "tenant", "team-b"),
    "ops": ("ops-secret", "operator", "team-a"),
    "root": ("root-secret", "admin", "platform"),
}


def _config() -> str:
    blocks = [
        f'[[auth.tokens]]\nname = "{name}"\nsha256 = "{hash_token(token)}"\n'
        f'role = "{role}"\ntenant = "{tenant}"\n'
        for name, (token, role, tenant) in TOKENS.items()
    ]
    return "\n".join(blocks)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(Path(tmp_path_factory.mktemp("tenants")), size=3, config_text=_config())
    try:
        local.start()
        yield local
    finally:
        local.kill()


@pytest.fixture(scope="module")
def clients(cluster: LocalCluster) -> Iterator[dict[str, Client]]:
    # Each tenant talks to a different first node, so isolation holds across nodes.
    made = {
        name: Client(
            cluster.urls[position % 3 :] + cluster.urls[: position % 3], token=token, timeout_s=20
        )
        for position, (name, (token, _, _)) in enumerate(TOKENS.items())
    }
    try:
        yield made
    finally:
        for client in made.values():
            client.close()


def test_a_request_without_a_valid_token_is_refused(cluster: LocalCluster) -> None:
    with Client(cluster.urls, timeout_s=10) as anonymous, pytest.raises(Unauthenticated):
        anonymous.kv.get("anything")
    with Client(cluster.urls, token="wrong", timeout_s=10) as stranger:
        with pytest.raises(Unauthenticated) as raised:
            stranger.kv.put("anything", "x")
        assert raised.value.definite


def test_keys_of_one_tenant_are_invisible_to_another(clients: dict[str, Client]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    alice.kv.put("isolation/key", "alice's")
    assert bob.kv.get("isolation/key") is None
    assert [item.key for item in bob.kv.list("isolation/")] == []
    bob.kv.put("isolation/key", "bob's")
    stored = alice.kv.get("isolation/key")
    assert stored is not None and stored.value == b"alice's"
    assert [item.key for item in alice.kv.list("isolation/")] == ["isolation/key"]
    alice.kv.put("isolation/only-alice", "kept")
    assert not bob.kv.delete("isolation/only-alice").deleted
    assert alice.kv.get("isolation/only-alice") is not None


def test_sessions_and_locks_of_one_tenant_cannot_be_used_by_another(
    clients: dict[str, Client],
) -> None:
    alice, bob = clients["alice"], clients["bob"]
    session = alice.sessions.grant(30)
    alice.locks.acquire("isolation-lock", session.session_id)
    assert bob.sessions.get(session.session_id) is None
    for attempt in (
        lambda: bob.sessions.keepalive(session.session_id),
        lambda: bob.sessions.revoke(session.session_id),
        lambda: bob.locks.acquire("isolation-lock", session.session_id),
        lambda: bob.locks.release("isolation-lock", session.session_id),
    ):
        with pytest.raises(NotFound):
            attempt()
    # Bob's lock of the same name is another lock.
    assert bob.locks.get("isolation-lock") is None
    bob_session = bob.sessions.grant(30)
    granted = bob.locks.acquire("isolation-lock", bob_session.session_id)
    assert granted.granted
    held = alice.locks.get("isolation-lock")
    assert held is not None and held.holder == session.session_id


def test_jobs_of_one_tenant_are_invisible_to_another(clients: dict[str, Client]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    job_id = alice.jobs.submit("isolation-job", workload="gemm")
    assert bob.jobs.get(job_id) is None
    with pytest.raises(NotFound):
        bob.jobs.cancel(job_id)
    assert job_id not in [item.job_id for item in bob.jobs.list().items]
    found = alice.jobs.get(job_id)
    assert found is not None and found.tenant == "team-a"


def test_a_watch_sees_only_its_own_tenant_s_changes(clients: dict[str, Client]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    start = alice.kv.put("watched/a", "1").revision
    bob_mark = bob.kv.put("watched/b", "2").revision
    events = bob.kv.watch("", from_revision=start)
    try:
        first = next(iter(events))
    finally:
        events.close()
    assert (first.key, first.revision) == ("watched/b", bob_mark)


def test_roles_limit_cluster_administration(clients: dict[str, Client]) -> None:
    alice, ops, root = clients["alice"], clients["ops"], clients["root"]
    assert alice.cluster.status().leader is not None
    with pytest.raises(Forbidden):
        alice.cluster.members()
    with pytest.raises(Forbidden):
        alice.cluster.transfer_leader("r0")
    assert len(ops.cluster.members()) == 3
    with pytest.raises(Forbidden):
        ops.cluster.transfer_leader("r0")
    root.cluster.transfer_leader("r1")
    # Every node learns the new leader from its first message; poll, bounded.
    deadline_s = time.monotonic() + 30
    while root.cluster.status().leader_region != "r1":
        assert time.monotonic() < deadline_s, "r1 did not become the leader"
        time.sleep(0.05)
