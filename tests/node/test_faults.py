"""The test-only fault modes (`raftstore.faults`): each one changes behaviour as it says, and none
can be switched on outside a test run.

Each behaviour test sets up the situation where the fault matters and runs it twice, without and
with the fault: the first run shows what xr guarantees, the second that the fault breaks exactly
that. Nodes here are in-process `RaftStore`s on loopback with the API served by aiohttp's test
server; the start-up checks run `xr node run` as a real process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from node.api.app import create_app
from node.localcluster import LocalCluster, free_ports
from raftstore.clock import RealClock
from raftstore.config import RaftConfig
from raftstore.faults import (
    FAULTS_VARIABLE,
    NO_FAULTS,
    TEST_RUN_VARIABLE,
    UNBOUNDED_LEASE_STEP_MS,
    Fault,
    Faults,
    FaultsRefused,
    acknowledge_before_commit,
)
from raftstore.store import RaftStore
from tests.node.conftest import auth_headers, eventually, node_config
from xrcore import kv
from xrcore.commands import KvPut, SessionGrant
from xrcore.errors import Timeout
from xrcore.limits import DEFAULT_LIMITS

T = TypeVar("T")
# The bound on a proposal or read that must not commit, so a test waits no longer than this.
SHORT_TIMEOUT_S = 0.5


# Set-up.


def _configs(data_dir: Path, count: int, **overrides: Any) -> list[RaftConfig]:
    addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
    return [
        RaftConfig(
            self_address=address,
            peers=tuple(other for other in addresses if other != address),
            data_dir=data_dir / f"member-{position}",
            **overrides,
        )
        for position, address in enumerate(addresses)
    ]


@contextlib.asynccontextmanager
async def _stores(
    configs: list[RaftConfig], faults: Faults, *, clock: RealClock | None = None
) -> AsyncIterator[list[RaftStore]]:
    stores = [RaftStore(config, faults=faults, clock=clock) for config in configs]
    for store in stores:
        await store.start()
    try:
        yield stores
    finally:
        for store in stores:
            await store.stop()


@contextlib.asynccontextmanager
async def _api(store: RaftStore, data_dir: Path) -> AsyncIterator[TestClient[Any, Any]]:
    """The HTTP API over `store`, with the test tokens of tests/node/conftest.py."""
    config = node_config(data_dir / "api", store.config.self_address)
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(config, store=store)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def _call(
    client: TestClient[Any, Any],
    method: str,
    path: str,
    *,
    json: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    sent = {**auth_headers("alpha"), **(headers or {})}
    async with client.request(method, path, json=json, headers=sent) as answer:
        return answer.status, msgspec.json.decode(await answer.read())


def _both(body: Callable[[Faults], Coroutine[Any, Any, T]], fault: Fault) -> tuple[T, T]:
    """Runs `body` without faults, then with `fault`: (without, with)."""
    return asyncio.run(body(NO_FAULTS)), asyncio.run(body(Faults.of(fault)))


def _leader_alone(data_dir: Path, faults: Faults) -> contextlib.AbstractAsyncContextManager[Any]:
    """A one-member cluster, which elects itself."""
    return _stores(_configs(data_dir, 1), faults)


# Switching faults on.


def test_no_variable__no_faults() -> None:
    assert Faults.from_environment({}).names() == []
    assert Faults.from_environment({FAULTS_VARIABLE: " "}).names() == []


def test_faults_outside_a_test_run__are_refused_with_both_variables_named() -> None:
    for marker in ({}, {TEST_RUN_VARIABLE: "0"}, {TEST_RUN_VARIABLE: "yes"}):
        with pytest.raises(FaultsRefused) as refused:
            Faults.from_environment({FAULTS_VARIABLE: "ack-before-commit", **marker})
        assert FAULTS_VARIABLE in str(refused.value) and TEST_RUN_VARIABLE in str(refused.value)


def test_an_unknown_fault__is_refused_with_the_known_ones_listed() -> None:
    with pytest.raises(FaultsRefused) as refused:
        Faults.from_environment(
            {FAULTS_VARIABLE: "ack-before-commit,eat-data", TEST_RUN_VARIABLE: "1"}
        )
    assert "eat-data" in str(refused.value)
    assert all(fault.value in str(refused.value) for fault in Fault)


def test_every_fault__can_be_named_in_a_test_run() -> None:
    text = ", ".join(fault.value for fault in Fault)
    faults = Faults.from_environment({FAULTS_VARIABLE: text, TEST_RUN_VARIABLE: "1"})
    assert faults.names() == sorted(fault.value for fault in Fault)
    assert all(faults.active(fault) for fault in Fault)


def test_warn__logs_a_warning_naming_each_fault(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="raftstore.faults")
    Faults.of(Fault.LEADER_LOCAL_READS, Fault.UNFENCED_LOCKS).warn()
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2
    assert all("TEST FAULT ACTIVE" in message for message in warnings)
    assert any("leader-local-reads" in message for message in warnings)
    assert any("unfenced-locks" in message for message in warnings)


@pytest.mark.integration
def test_a_node_with_faults_outside_a_test_run__refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULTS_VARIABLE, "stale-follower-reads")
    monkeypatch.delenv(TEST_RUN_VARIABLE, raising=False)
    node = LocalCluster(tmp_path, size=1).nodes[0]
    node.start()
    assert node.process is not None
    assert node.process.wait(30) == 2
    assert TEST_RUN_VARIABLE in node.log_tail()


@pytest.mark.integration
def test_a_node_with_faults_in_a_test_run__warns_and_reports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import urllib.request

    monkeypatch.setenv(FAULTS_VARIABLE, "unfenced-locks,ack-before-commit")
    monkeypatch.setenv(TEST_RUN_VARIABLE, "1")
    cluster = LocalCluster(tmp_path, size=1)
    try:
        cluster.start()
        node = cluster.nodes[0]
        with urllib.request.urlopen(f"{node.url}/v1/cluster/status", timeout=10) as answer:
            status = json.load(answer)
        assert status["test_faults"] == ["ack-before-commit", "unfenced-locks"]
        log_text = node.log_tail(20_000)
        assert "TEST FAULT ACTIVE: ack-before-commit" in log_text
        assert "TEST FAULT ACTIVE: unfenced-locks" in log_text
    finally:
        cluster.kill()


def test_cluster_status__lists_no_faults_normally(tmp_path: Path) -> None:
    async def body() -> Any:
        async with _leader_alone(tmp_path, NO_FAULTS) as (store,), _api(store, tmp_path) as api:
            await eventually(lambda: store.is_leader)
            return await _call(api, "GET", "/v1/cluster/status")

    status, document = asyncio.run(body())
    assert status == 200 and document["test_faults"] == []


# What each fault breaks.


def test_stale_follower_reads__a_follower_without_a_leader_answers_default_reads(
    tmp_path: Path,
) -> None:
    # A lone member of a three-member cluster never has a leader: a default read must wait for a
    # barrier that cannot commit. Under the fault it answers from local state, claiming not stale.
    async def body(faults: Faults) -> Any:
        (config, *_) = _configs(tmp_path / str(faults.names()), 3)
        async with _stores([config], faults) as (store,):
            try:
                read = await store.read(lambda m: m.index, timeout_s=SHORT_TIMEOUT_S)
            except Timeout:
                return "timeout"
            return read.stale

    assert _both(body, Fault.STALE_FOLLOWER_READS) == ("timeout", False)


def test_stale_follower_reads__leaves_reads_on_the_leader_alone(tmp_path: Path) -> None:
    faults = Faults.of(Fault.STALE_FOLLOWER_READS)
    assert faults.reads_locally(is_leader=False) and not faults.reads_locally(is_leader=True)


def test_leader_local_reads__a_leader_cut_off_from_its_followers_answers_default_reads(
    tmp_path: Path,
) -> None:
    # The leader keeps believing it leads for leader_fallback_timeout_s after its followers stop;
    # meanwhile a majority elsewhere may be taking writes it does not see.
    async def body(faults: Faults) -> Any:
        configs = _configs(tmp_path / str(faults.names()), 3, leader_fallback_timeout_s=10.0)
        async with _stores(configs, faults) as stores:
            leader = await eventually(lambda: next((s for s in stores if s.is_leader), None))
            await leader.propose(KvPut(key="k", value=b"old"))
            for store in [store for store in stores if store is not leader]:
                await store.stop()
                stores.remove(store)
            assert leader.is_leader
            try:
                read = await leader.read(
                    lambda m: kv.get(m, "k")["value"], timeout_s=SHORT_TIMEOUT_S
                )
            except Timeout:
                return "timeout"
            return read.value, read.stale

    assert _both(body, Fault.LEADER_LOCAL_READS) == ("timeout", (b"old", False))


def test_leader_local_reads__leaves_reads_on_followers_alone() -> None:
    faults = Faults.of(Fault.LEADER_LOCAL_READS)
    assert faults.reads_locally(is_leader=True) and not faults.reads_locally(is_leader=False)


def test_ack_before_commit__a_write_that_cannot_commit_is_answered_ok(tmp_path: Path) -> None:
    # A lone member of three has no quorum: without the fault the write times out (indefinite);
    # with it the caller is told the write is done, though nothing committed.
    async def body(faults: Faults) -> Any:
        (config, *_) = _configs(tmp_path / str(faults.names()), 3, propose_timeout_s=0.5)
        async with _stores([config], faults) as (store,), _api(store, tmp_path) as api:
            status, document = await _call(api, "PUT", "/v1/kv/acked", json={"value": "v"})
            committed = store.replica.read(lambda m: m.revision)
            return status, document.get("revision"), committed

    without, with_fault = _both(body, Fault.ACK_BEFORE_COMMIT)
    assert without == (504, None, 0)
    assert with_fault == (200, 1, 0)


def test_ack_before_commit__two_compare_and_sets_of_one_revision_both_succeed(
    tmp_path: Path,
) -> None:
    # Both are answered from the state before either commits; the log applies only the first.
    async def body() -> tuple[list[bool], bytes]:
        async with _leader_alone(tmp_path, Faults.of(Fault.ACK_BEFORE_COMMIT)) as (store,):
            await eventually(lambda: store.is_leader)
            created = await store.propose(KvPut(key="k", value=b"0"))
            revision = created.result.unwrap()["revision"]
            answers = [
                await acknowledge_before_commit(
                    store,
                    KvPut(key="k", value=value, expected_mod_revision=revision),
                    client_id=None,
                    seq=None,
                )
                for value in (b"a", b"b")
            ]
            read = await eventually(
                lambda: store.replica.read(
                    lambda m: m.revision > revision and kv.get(m, "k")["value"]
                )
            )
            await asyncio.sleep(0.2)
            assert store.replica.read(lambda m: m.revision) == revision + 1
            return [answer.result.ok for answer in answers], read

    oks, value = asyncio.run(body())
    assert oks == [True, True]
    assert value == b"a"


def test_retries_without_dedup__a_retried_write_applies_twice(tmp_path: Path) -> None:
    async def body(faults: Faults) -> Any:
        async with _leader_alone(tmp_path / str(faults.names()), faults) as (store,):
            await eventually(lambda: store.is_leader)
            first = await store.propose(KvPut(key="k", value=b"v"), client_id="c", seq=1)
            retry = await store.propose(KvPut(key="k", value=b"v"), client_id="c", seq=1)
            assert first.result.ok
            return retry.duplicate, store.replica.read(lambda m: m.revision)

    assert _both(body, Fault.RETRIES_WITHOUT_DEDUP) == ((True, 1), (False, 2))


def test_retries_without_dedup__a_retried_job_submission_makes_two_jobs(tmp_path: Path) -> None:
    async def body(faults: Faults) -> Any:
        data_dir = tmp_path / str(faults.names())
        async with _leader_alone(data_dir, faults) as (store,), _api(store, data_dir) as api:
            await eventually(lambda: store.is_leader)
            headers = {"Xr-Client-Id": "submitter", "Xr-Seq": "1"}
            job = {"name": "retried", "workload": "w"}
            answers = [
                await _call(api, "POST", "/v1/jobs", json=job, headers=headers) for _ in range(2)
            ]
            return [document["job_id"] for _, document in answers]

    without, with_fault = _both(body, Fault.RETRIES_WITHOUT_DEDUP)
    assert without[0] == without[1]
    assert with_fault[0] != with_fault[1]


def test_unfenced_locks__the_next_holder_gets_the_first_holders_token(tmp_path: Path) -> None:
    async def body(faults: Faults) -> Any:
        data_dir = tmp_path / str(faults.names())
        async with _leader_alone(data_dir, faults) as (store,), _api(store, data_dir) as api:
            await eventually(lambda: store.is_leader)
            tokens = []
            for _ in range(2):
                _, session = await _call(api, "POST", "/v1/sessions", json={"ttl_ms": 60_000})
                session_id = session["session_id"]
                _, grant = await _call(
                    api, "POST", "/v1/locks/fenced/acquire", json={"session_id": session_id}
                )
                tokens.append(grant["token"])
                await _call(
                    api, "POST", "/v1/locks/fenced/release", json={"session_id": session_id}
                )
            _, session = await _call(api, "POST", "/v1/sessions", json={"ttl_ms": 60_000})
            await _call(
                api, "POST", "/v1/locks/fenced/acquire", json={"session_id": session["session_id"]}
            )
            _, check = await _call(
                api, "POST", "/v1/locks/fenced/validate", json={"token": tokens[0]}
            )
            return tokens[1] > tokens[0], check["valid"]

    assert _both(body, Fault.UNFENCED_LOCKS) == ((True, False), (False, True))


def test_unfenced_locks__a_waiter_granted_on_release_gets_the_first_token(tmp_path: Path) -> None:
    async def body(faults: Faults) -> Any:
        data_dir = tmp_path / str(faults.names())
        async with _leader_alone(data_dir, faults) as (store,), _api(store, data_dir) as api:
            await eventually(lambda: store.is_leader)
            sessions = []
            for _ in range(2):
                _, session = await _call(api, "POST", "/v1/sessions", json={"ttl_ms": 60_000})
                sessions.append(session["session_id"])
            _, first = await _call(
                api, "POST", "/v1/locks/queued/acquire", json={"session_id": sessions[0]}
            )
            waiting = asyncio.ensure_future(
                _call(
                    api,
                    "POST",
                    "/v1/locks/queued/acquire",
                    json={"session_id": sessions[1], "wait_s": 4.0},
                )
            )
            await eventually(
                lambda: store.replica.read(lambda m: any(lock.waiters for lock in m.locks.values()))
            )
            await _call(api, "POST", "/v1/locks/queued/release", json={"session_id": sessions[0]})
            _, second = await waiting
            return second["granted"], second["token"] == first["token"]

    assert _both(body, Fault.UNFENCED_LOCKS) == ((True, False), (True, True))


class _JumpingClock(RealClock):
    """A wall clock that can jump ahead: a new leader whose clock runs fast, or one resumed after
    a pause."""

    def __init__(self) -> None:
        self.ahead_ms = 0

    def now_ms(self) -> int:
        return super().now_ms() + self.ahead_ms


def test_local_clock_leases__a_jump_of_the_leaders_clock_expires_sessions(
    tmp_path: Path,
) -> None:
    # With the bound on each step, a clock jumping 60 s ahead ages leases by at most one step;
    # without it, a session with a 30 s TTL expires at the next tick.
    async def body(faults: Faults) -> Any:
        clock = _JumpingClock()
        configs = _configs(tmp_path / str(faults.names()), 1)
        async with _stores(configs, faults, clock=clock) as (store,):
            await eventually(lambda: store.is_leader)
            granted = await store.propose(SessionGrant(ttl_ms=30_000))
            session_id = granted.result.unwrap()["session_id"]
            clock.ahead_ms = 60_000
            for _ in range(3):
                await store.propose(KvPut(key="tick", value=b""))
            return store.replica.read(lambda m: session_id in m.sessions)

    assert _both(body, Fault.LOCAL_CLOCK_LEASES) == (True, False)


def test_local_clock_leases__lifts_the_bound_on_the_lease_clocks_step() -> None:
    limits = Faults.of(Fault.LOCAL_CLOCK_LEASES).limits(DEFAULT_LIMITS)
    assert limits.lease_step_max_ms == UNBOUNDED_LEASE_STEP_MS
    assert msgspec.structs.replace(limits, lease_step_max_ms=1_000) == DEFAULT_LIMITS
    assert NO_FAULTS.limits(DEFAULT_LIMITS) is DEFAULT_LIMITS
