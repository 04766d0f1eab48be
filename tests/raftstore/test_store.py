"""RaftStore with real pysyncobj TCP transport, three members in one process on loopback.

These cover the asyncio bridge: proposals from any member, group commit, linearizable and stale
reads, overload and deadlines, leader ticks, restart from the data directory, snapshots and
one-at-a-time membership changes. Partitions and crashes are covered deterministically by the
simulator in tests/sim; real processes and kill -9 by tests/raftstore/test_processes.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from raftstore.clock import RealClock
from raftstore.config import RaftConfig
from raftstore.replica import Replica
from raftstore.store import RaftStore
from xrcore import StateMachine, errors, kv
from xrcore.commands import KvPut

pytestmark = pytest.mark.integration

T = TypeVar("T")
WAIT_S = 20.0


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for item in sockets:
            item.bind(("127.0.0.1", 0))
        return [item.getsockname()[1] for item in sockets]
    finally:
        for item in sockets:
            item.close()


def _configs(data_dir: Path, count: int = 3, **overrides: object) -> list[RaftConfig]:
    addresses = [f"127.0.0.1:{port}" for port in _free_ports(count)]
    return [
        RaftConfig(
            self_address=address,
            peers=tuple(other for other in addresses if other != address),
            data_dir=data_dir / f"member-{position}",
            **overrides,  # type: ignore[arg-type]
        )
        for position, address in enumerate(addresses)
    ]


async def _eventually(check: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def _started(configs: list[RaftConfig]) -> list[RaftStore]:
    stores = [RaftStore(config) for config in configs]
    for store in stores:
        await store.start()
    return stores


async def _leader(stores: list[RaftStore]) -> RaftStore:
    return await _eventually(lambda: next((s for s in stores if s.is_leader), None))


def _run(
    body: Callable[[list[RaftStore]], Awaitable[None]],
    configs: list[RaftConfig],
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> None:
    async def main() -> None:
        stores = await _started(configs)
        try:
            await _leader(stores)
            await body(stores)
        finally:
            for store in stores:
                await store.stop()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


def test_write_on_a_follower__is_forwarded_and_read_linearizably_elsewhere(
    tmp_path: Path,
) -> None:
    async def body(stores: list[RaftStore]) -> None:
        follower = next(store for store in stores if not store.is_leader)
        applied = await follower.propose(KvPut(key="a", value=b"1"), client_id="c", seq=1)
        assert applied.result.unwrap()["revision"] == 1
        for store in stores:
            read = await store.read(lambda machine: kv.get(machine, "a")["value"])
            assert (read.value, read.stale) == (b"1", False)

    _run(body, _configs(tmp_path))


def test_retried_write__applies_once(tmp_path: Path) -> None:
    async def body(stores: list[RaftStore]) -> None:
        first = await stores[0].propose(KvPut(key="a", value=b"1"), client_id="c", seq=7)
        again = await stores[1].propose(KvPut(key="a", value=b"1"), client_id="c", seq=7)
        assert again.duplicate and again.result == first.result
        read = await stores[2].read(lambda machine: machine.revision)
        assert read.value == 1

    _run(body, _configs(tmp_path))


def test_concurrent_writes__are_grouped_into_fewer_log_entries(tmp_path: Path) -> None:
    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        before = leader.status()["commit_index"]
        count = 400
        results = await asyncio.gather(
            *(leader.propose(KvPut(key=f"k{n}", value=b"v")) for n in range(count))
        )
        assert all(applied.result.ok for applied in results)
        entries = leader.status()["commit_index"] - before
        assert entries < count

    _run(body, _configs(tmp_path))


def test_stale_read__answers_without_quorum_and_says_so(tmp_path: Path) -> None:
    # A lone member of a three-member cluster never has a quorum.
    (config, *_) = _configs(tmp_path)

    async def main() -> None:
        (store,) = await _started([config])
        try:
            stale = await store.read(lambda machine: machine.index, consistency="stale")
            assert stale.stale is True
            with pytest.raises(errors.Timeout) as raised:
                await store.read(lambda machine: machine.index, timeout_s=0.5)
            assert raised.value.definite is False
            with pytest.raises(errors.Timeout):
                await store.propose(KvPut(key="a", value=b""), timeout_s=0.5)
        finally:
            await store.stop()

    asyncio.run(main())


def test_proposals_in_flight_beyond_the_maximum__are_overloaded(tmp_path: Path) -> None:
    (config, *_) = _configs(tmp_path, proposals_in_flight_max=2)

    async def main() -> None:
        (store,) = await _started([config])
        try:
            waiting = [
                asyncio.create_task(store.propose(KvPut(key="a", value=b""), timeout_s=1.0))
                for _ in range(2)
            ]
            await asyncio.sleep(0)
            with pytest.raises(errors.Overloaded) as raised:
                await store.propose(KvPut(key="a", value=b""))
            assert raised.value.definite is True
            for task in waiting:
                with pytest.raises(errors.Timeout):
                    await task
        finally:
            await store.stop()

    asyncio.run(main())


def test_leader_ticks__move_the_lease_clock_while_the_cluster_commits(tmp_path: Path) -> None:
    async def body(stores: list[RaftStore]) -> None:
        start = (await stores[0].read(lambda machine: machine.lease_clock_ms)).value
        await asyncio.sleep(1.5)
        later = (await stores[0].read(lambda machine: machine.lease_clock_ms)).value
        assert later > start

    _run(body, _configs(tmp_path, lease_tick_interval_s=0.1))


def test_restart_from_data_directories__keeps_every_write(tmp_path: Path) -> None:
    configs = _configs(tmp_path)

    async def write(stores: list[RaftStore]) -> None:
        for n in range(20):
            await stores[n % 3].propose(KvPut(key=f"k{n}", value=bytes([n])))

    async def check(stores: list[RaftStore]) -> None:
        for store in stores:
            read = await store.read(lambda machine: sorted(machine.keys))
            assert read.value == sorted(f"k{n}" for n in range(20))

    _run(write, configs)
    _run(check, configs)


def test_snapshot_then_restart__state_is_the_same(tmp_path: Path) -> None:
    configs = _configs(tmp_path)
    seen: dict[str, bytes] = {}

    async def write_and_compact(stores: list[RaftStore]) -> None:
        for n in range(10):
            await stores[0].propose(KvPut(key=f"k{n}", value=b"x"))
        for store in stores:
            store.replica.forceLogCompaction()
        await _eventually(lambda: all(config.snapshot_file.exists() for config in configs))
        await stores[0].read(lambda machine: None)
        seen["keys"] = b"".join(key.encode() for key in sorted(stores[0].replica.machine.keys))

    async def check(stores: list[RaftStore]) -> None:
        for store in stores:
            keys = (await store.read(lambda machine: sorted(machine.keys))).value
            assert b"".join(key.encode() for key in keys) == seen["keys"]

    _run(write_and_compact, configs)
    _run(check, configs)


def test_second_membership_change__refused_until_the_first_commits(tmp_path: Path) -> None:
    configs = _configs(tmp_path)
    spare_a, spare_b = (f"127.0.0.1:{port}" for port in _free_ports(2))

    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        first = asyncio.create_task(leader.add_member(spare_a))
        await asyncio.sleep(0)
        with pytest.raises(errors.MembershipChangeInProgress):
            await leader.add_member(spare_b)
        first.cancel()

    _run(body, configs)


def test_groups_never_answered__release_their_slots_at_the_deadline(tmp_path: Path) -> None:
    # Without a quorum pysyncobj never calls back; a forwarded command lost on a broken
    # connection is the same. Each group must give its slot back when its deadline passes, or a
    # few losses would stall the member for good.
    (config, *_) = _configs(tmp_path, propose_timeout_s=0.3)

    async def main() -> None:
        (store,) = await _started([config])
        try:
            for _ in range(6):
                with pytest.raises(errors.Timeout):
                    await store.propose(KvPut(key="a", value=b""), timeout_s=5.0)
            assert store.status()["groups_in_flight"] == 0
        finally:
            await store.stop()

    asyncio.run(main())


class _SkewedClock(RealClock):
    def now_ms(self) -> int:
        return super().now_ms() + 3_600_000


def test_follower_with_a_clock_an_hour_ahead__does_not_move_replicated_time(
    tmp_path: Path,
) -> None:
    async def body(stores: list[RaftStore]) -> None:
        follower = next(store for store in stores if not store.is_leader)
        follower.clock = _SkewedClock()
        # Replicated time starts at 0 and is set by the leader's first tick: read `before` once
        # that has been applied here, or a tick landing in between looks like a jump (a flake
        # seen in CI: 0 -> the leader's wall clock).
        await _eventually(lambda: follower.replica.read(lambda machine: machine.now_ms) > 0)
        before = (await follower.read(lambda machine: machine.now_ms)).value
        await follower.propose(KvPut(key="a", value=b""))
        after = (await follower.read(lambda machine: machine.now_ms)).value
        assert after - before < 600_000

    _run(body, _configs(tmp_path))


def test_status__the_leader_reports_each_followers_match_index_and_last_contact(
    tmp_path: Path,
) -> None:
    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        await leader.propose(KvPut(key="a", value=b""))

        def matched() -> dict[str, Any] | None:
            status = leader.status()
            members = status["members"]
            return status if all(m["match_index"] is not None for m in members) else None

        status = await _eventually(matched)
        assert status["state"] == "leader" and status["has_quorum"]
        for member in status["members"]:
            assert member["connected"] and member["last_contact_s"] is not None
            assert member["match_index"] >= 1

    _run(body, _configs(tmp_path))


def test_status__a_former_leader_reports_no_match_index(tmp_path: Path) -> None:
    # pysyncobj keeps the figures of its time as leader: a follower showed them as current.
    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        await leader.propose(KvPut(key="a", value=b""))
        await _eventually(
            lambda: all(m["match_index"] is not None for m in leader.status()["members"])
        )
        target = next(store for store in stores if store is not leader)
        await leader.transfer_leadership(target.config.self_address)
        await _eventually(lambda: target.is_leader and not leader.is_leader)
        assert [m["match_index"] for m in leader.status()["members"]] == [None, None]

    _run(body, _configs(tmp_path))


def test_transfer_leadership__the_named_member_becomes_leader(tmp_path: Path) -> None:
    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        target = next(store for store in stores if store is not leader)
        await leader.propose(KvPut(key="a", value=b""))
        await leader.transfer_leadership(target.config.self_address)
        await _eventually(lambda: target.is_leader)
        with pytest.raises(errors.InvalidArgument):
            await target.transfer_leadership("127.0.0.1:1")

    _run(body, _configs(tmp_path))


def test_transfer_leadership__is_sent_again_when_the_target_did_not_take_over(
    tmp_path: Path,
) -> None:
    """pysyncobj's transfer only sends Raft's TimeoutNow; a target that misses it (here: drops
    the first) does not campaign, and the leader sends it again after an election timeout."""

    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        target = next(store for store in stores if store is not leader)
        transport: Any = getattr(target.replica, "_SyncObj__transport")  # noqa: B009
        receive = transport._onMessageReceivedCallback
        dropped: list[Any] = []

        def drop_the_first_timeout_now(node: Any, message: Any) -> None:
            if isinstance(message, dict) and message.get("type") == "timeout_now" and not dropped:
                dropped.append(message)
                return
            receive(node, message)

        transport._onMessageReceivedCallback = drop_the_first_timeout_now
        await leader.transfer_leadership(target.config.self_address)
        assert len(dropped) == 1
        await _eventually(lambda: target.is_leader)
        assert not leader.is_leader

    _run(body, _configs(tmp_path))


def _listening_hosts(port: int) -> set[str]:
    """The local addresses listening on `port` (TCP, IPv4), from /proc/net/tcp."""
    hosts = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            hosts.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return hosts


def test_the_raft_port_listens_on_its_own_address_only(tmp_path: Path) -> None:
    """pysyncobj listens on every interface unless told; a loopback node must not be reachable
    from the network, where without a cluster secret anyone could send it commands."""
    configs = _configs(tmp_path, count=1)

    async def body(stores: list[RaftStore]) -> None:
        port = int(configs[0].self_address.rsplit(":", 1)[1])
        assert _listening_hosts(port) == {"127.0.0.1"}

    _run(body, configs)


def _revision(machine: StateMachine) -> int:
    return int(machine.revision)


class _SentToFollowers:
    """Records, on a member, each append_entries message it sends: the tick it was sent in, the
    recipient, whether it carried entries, and the commit index it announced."""

    def __init__(self, store: RaftStore) -> None:
        self.tick = 0
        self.messages: list[tuple[int, str, bool, int]] = []
        self.applied_in_tick: dict[int, int] = {}
        replica: Any = store.replica
        transport: Any = replica._SyncObj__transport
        send = transport.send
        on_tick = replica._onTick
        on_applied = replica.on_applied

        def sending(node: Any, message: Any) -> bool:
            if isinstance(message, dict) and message.get("type") == "append_entries":
                self.messages.append(
                    (self.tick, str(node), bool(message.get("entries")), message["commit_index"])
                )
            return bool(send(node, message))

        def ticking(time_to_wait: float = 0.0) -> None:
            self.tick += 1
            on_tick(time_to_wait)

        def applied(results: Any) -> None:
            # pysyncobj counts the entry as applied only after the method returns.
            self.applied_in_tick[replica.raftLastApplied + 1] = self.tick
            if on_applied is not None:
                on_applied(results)

        transport.send = sending
        replica._onTick = ticking
        replica.on_applied = applied

    def commit_only(self) -> int:
        return sum(1 for _, _, entries, _ in self.messages if not entries)


def test_sequential_writes__the_leader_sends_no_message_per_commit_only_to_announce_it(
    tmp_path: Path,
) -> None:
    """pysyncobj's leader (batching off) sends every follower a message after each commit just to
    carry the commit index; the next write's entries carry it instead. Without holding the notice
    back, 200 sequential writes cost at least 400 such messages (one per write per follower)."""
    writes = 200

    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        sent = _SentToFollowers(leader)
        for seq in range(1, writes + 1):
            await leader.propose(KvPut(key="k", value=b"v"), client_id="c", seq=seq)
        # Heartbeats (every 0.1 s) and the odd notice that fell due carry no entries; far fewer
        # than one per write per follower.
        assert sent.commit_only() < writes, sent.commit_only()
        revision = leader.replica.read(_revision)

        def everyone_applied() -> bool:
            return all(store.replica.read(_revision) == revision for store in stores)

        await _eventually(everyone_applied)

    _run(body, _configs(tmp_path))


def test_write_forwarded_by_a_follower__its_commit_is_announced_in_the_tick_that_applies_it(
    tmp_path: Path,
) -> None:
    """A follower that forwarded a command waits until it applies it, so the leader announces
    that commit at once instead of holding the notice back (here for up to 0.3 s)."""

    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        follower = next(store for store in stores if store is not leader)
        sent = _SentToFollowers(leader)
        for seq in range(1, 6):
            applied = await follower.propose(KvPut(key="k", value=b"v"), client_id="c", seq=seq)
            assert applied.result.error is None
        follower_address = follower.config.self_address
        # Every entry the leader applied meanwhile is a forwarded write (no lease ticks here).
        assert len(sent.applied_in_tick) == 5
        for index, tick in sent.applied_in_tick.items():
            assert any(
                sent_tick == tick and node == follower_address and commit_index >= index
                for sent_tick, node, _, commit_index in sent.messages
            ), (index, tick, sent.messages)

    _run(
        body,
        _configs(
            tmp_path,
            append_entries_period_s=0.3,
            raft_min_timeout_s=1.0,
            raft_max_timeout_s=1.5,
            leader_fallback_timeout_s=5.0,
            commit_notice_delay_s=0.3,
            lease_tick_interval_s=30.0,
        ),
    )


def test_under_uvloop__an_idle_cluster_keeps_its_leader_and_ticks_raise_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The node runs the store on uvloop, whose timer for a moment already past is a plain handle
    (it once broke the tick timer while a commit notice was due). Sequential writes, then idle
    for three election timeouts: pysyncobj's heartbeats must keep the leader in office."""

    async def body(stores: list[RaftStore]) -> None:
        leader = await _leader(stores)
        for seq in range(1, 301):
            await leader.propose(KvPut(key="k", value=b"v"), client_id="c", seq=seq)
        term = leader.replica.raftCurrentTerm
        await asyncio.sleep(3 * 1.0)
        assert leader.is_leader and leader.replica.raftCurrentTerm == term
        await stores[0].propose(KvPut(key="k", value=b"w"), client_id="c", seq=301)

    caplog.set_level(logging.ERROR)
    # uvloop rounds a timer's delay to whole milliseconds: a notice due in under 0.5 ms is the
    # case that got a plain handle.
    configs = _configs(tmp_path, commit_notice_delay_s=0.0003)
    _run(body, configs, loop_factory=uvloop.new_event_loop)
    assert [record.getMessage() for record in caplog.records] == []


def test_a_group_answered_by_another_entry__is_of_unknown_outcome_and_applied_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """pysyncobj answers a proposal with whatever entry holds its index and term: a stranger
    posing as a leader of the same term can put another there, and one no member can apply
    answers None (`raftstore.entries`). The store raised on it inside pysyncobj's apply loop,
    which then applied the entry again on the next tick, and the write waited for its deadline."""
    (config,) = _configs(tmp_path, count=1)

    def logs_another_entry(replica: Replica, group: bytes, callback: Any) -> None:
        replica._applyCommand(b"\x00another entry", callback)

    async def body(stores: list[RaftStore]) -> None:
        monkeypatch.setattr(Replica, "propose_group", logs_another_entry)
        with pytest.raises(errors.UnknownOutcome):
            await stores[0].propose(KvPut(key="a", value=b""), timeout_s=5.0)
        monkeypatch.undo()
        await stores[0].propose(KvPut(key="b", value=b""))

    with caplog.at_level(logging.ERROR, logger="raftstore.replica"):
        _run(body, [config])
    assert caplog.text.count("skipped") == 1


def test_a_completion_that_raises__leaves_its_entry_applied_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """pysyncobj calls a proposal's completion inside its apply loop, before it counts the entry
    applied: one that raised made it apply the entry again on the next tick."""
    (config,) = _configs(tmp_path, count=1, propose_timeout_s=1.0)
    settle = RaftStore._settle

    def raises_once(store: RaftStore, group: Any, results: Any, reason: int) -> None:
        monkeypatch.setattr(RaftStore, "_settle", settle)
        raise RuntimeError("a completion that fails")

    async def body(stores: list[RaftStore]) -> None:
        (store,) = stores
        monkeypatch.setattr(RaftStore, "_settle", raises_once)
        with pytest.raises(errors.Timeout):
            await store.propose(KvPut(key="b", value=b""))
        await store.propose(KvPut(key="c", value=b""))
        # Applied twice, "b" was at version 2 and the KV revision at 3.
        versions = store.replica.read(
            lambda machine: (machine.revision, {k: r.version for k, r in machine.keys.items()})
        )
        assert versions == (2, {"b": 1, "c": 1})

    with caplog.at_level(logging.ERROR, logger="raftstore.replica"):
        _run(body, [config])
    assert "a proposal's completion raised" in caplog.text


def test_a_read_that_times_out__says_it_changed_nothing_and_that_no_leader_is_known(
    tmp_path: Path,
) -> None:
    """A node cut off from the others answered a GET after its timeout with "the command may or
    may not be applied" (the client QA pass of session 32): a read changes nothing, and the
    cause is worth saying."""
    ports = []
    for _ in range(3):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    address, *absent = [f"127.0.0.1:{port}" for port in ports]

    async def scenario() -> None:
        store = RaftStore(
            RaftConfig(self_address=address, peers=tuple(absent), data_dir=tmp_path / "raft")
        )
        await store.start()
        try:
            with pytest.raises(errors.Timeout) as read:
                await store.read(lambda machine: machine.index, timeout_s=0.3)
            with pytest.raises(errors.Timeout) as write:
                await store.propose(KvPut(key="k", value=b"v"), timeout_s=0.3)
        finally:
            await store.stop()
        assert read.value.message == (
            "the read was not answered within 0.3 s (this node knows no leader); it changed nothing"
        )
        assert "(this node knows no leader); the command may or may not be applied" in (
            write.value.message
        )

    asyncio.run(scenario())
