"""`raft.durability = "fsync"`: nothing is acknowledged before it is on disk, and syncs are shared.

The checks observe from outside the code under test: the sync function is replaced by one that
reads the journal file at the moment it is synced (what it then holds is what a power loss would
keep), and every message is observed where it leaves the replica for the network. Then:
- a follower's success answer for entries up to index i leaves only after its journal was synced
  holding i;
- a vote leaves only after the voter's term is on disk;
- an entry is applied (so acknowledged to its proposer) only when a majority has synced it,
  the applying member included (a member alone too).
The same checks find violations in "write" mode, which never syncs: they can fail.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pytest

import raftstore.replica as replica_module
from raftstore import sim
from raftstore.config import RaftConfig
from raftstore.files import write_file_durably
from raftstore.replica import repair_journal, seed_data_dir
from raftstore.sim import SimCluster
from raftstore.store import RaftStore
from xrcore import StateMachine, kv
from xrcore.commands import KvPut

SEED = 7


def _last_index_in(path: Path) -> int:
    """The raft index of the last whole record of a pysyncobj journal file (0 if none)."""
    data = path.read_bytes()
    end = struct.unpack_from("<I", data, 36)[0]
    offset, last = 40, 0
    while offset < end:
        size = struct.unpack_from("<I", data, offset)[0]
        last = struct.unpack_from("<Q", data, offset + 4)[0]
        offset += size + 8
    return int(last)


def _meta_on_disk(journal_path: Path) -> dict[str, Any]:
    meta_path = Path(f"{journal_path}.meta")
    if not meta_path.exists():
        return {}
    meta: dict[str, Any] = pysyncobj_pickle.loads(meta_path.read_bytes())
    return meta


def _term_on_disk(journal_path: Path) -> int:
    return int(_meta_on_disk(journal_path).get("currentTerm", 0))


@dataclass
class DiskObserver:
    """What each member's journal held at its last sync, and the violations seen."""

    durable_index: dict[str, int] = field(default_factory=dict)
    syncs: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    acknowledgements: int = 0
    # In line, a member applies only what it synced. Off the loop a follower may apply a committed
    # entry before its own sync ends: Raft needs the entry on a majority's disks, not on its own.
    applying_member_must_hold: bool = True

    def sync(self, descriptor: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{descriptor}"))
        os.fdatasync(descriptor)
        self.durable_index[str(path)] = _last_index_in(path)
        self.syncs[str(path)] = self.syncs.get(str(path), 0) + 1

    def on_send(self, journal: Path, message: Any) -> None:
        durable = self.durable_index.get(str(journal), 0)
        if not isinstance(message, dict):
            return
        if message.get("type") == "next_node_idx" and message.get("success"):
            claimed = int(message["next_node_idx"]) - 1
            if claimed > durable:
                self.violations.append(f"{journal}: acknowledged {claimed}, synced {durable}")
        if message.get("type") == "response_vote" and _term_on_disk(journal) < message["term"]:
            self.violations.append(f"{journal}: voted in term {message['term']} before storing it")

    def on_apply(self, journal: Path, index: int, journals: list[Path]) -> None:
        self.acknowledgements += 1
        if self.applying_member_must_hold and self.durable_index.get(str(journal), 0) < index:
            self.violations.append(f"{journal}: applied {index} before syncing it")
        holding = sum(1 for other in journals if self.durable_index.get(str(other), 0) >= index)
        if holding <= len(journals) // 2:
            self.violations.append(f"applied {index} with {holding}/{len(journals)} synced")


@pytest.fixture
def observer(monkeypatch: pytest.MonkeyPatch) -> Iterator[DiskObserver]:
    seen = DiskObserver()
    monkeypatch.setattr(replica_module, "journal_file_sync", seen.sync)
    original_send = sim.SimTransport.send

    def send(transport: sim.SimTransport, node: Any, message: Any) -> bool:
        seen.on_send(journals[transport.address], message)
        return original_send(transport, node, message)

    journals: dict[str, Path] = {}
    monkeypatch.setattr(sim.SimTransport, "send", send)
    seen.journals = journals  # type: ignore[attr-defined]
    yield seen


def _observed_cluster(
    observer: DiskObserver, tmp_path: Path, *, nodes: int, durability: str
) -> SimCluster:
    cluster = SimCluster(
        nodes,
        seed=SEED,
        data_dir=tmp_path,
        lease_ticks=False,
        raft_options={"durability": durability},
    )
    journals = [node.config.journal_file for node in cluster.nodes]
    for node in cluster.nodes:
        observer.journals[node.address] = node.config.journal_file  # type: ignore[attr-defined]
        replica = node.replica
        assert replica is not None
        original = replica.on_applied

        def on_applied(
            results: Any, replica: Any = replica, node: Any = node, original: Any = original
        ) -> None:
            # pysyncobj counts the entry as applied only after the method returns.
            observer.on_apply(node.config.journal_file, replica.raftLastApplied + 1, journals)
            if original is not None:
                original(results)

        replica.on_applied = on_applied
    return cluster


def _write_load(cluster: SimCluster, writes: int) -> int:
    """Commits `writes` puts through the leader, several proposed at once; returns how many."""
    assert cluster.run_until(lambda: cluster.leader() is not None, timeout_s=10.0)
    done = 0
    for batch in range(writes // 8):
        leader = cluster.leader()
        assert leader is not None
        proposals = [
            cluster.propose(
                leader,
                KvPut(key=f"k{batch}-{position}", value=b"v"),
                client_id="writer",
                seq=batch * 8 + position + 1,
            )
            for position in range(8)
        ]

        def all_done(pending: list[sim.Proposal] = proposals) -> bool:
            return all(proposal.done for proposal in pending)

        assert cluster.run_until(all_done, timeout_s=10.0), [p.status for p in proposals]
        done += sum(1 for proposal in proposals if proposal.status == "ok")
    # Followers may learn of the last commits only from the next heartbeat (the leader holds
    # back commit notices that no follower waits on): let every member apply everything.
    cluster.run_for(0.5)
    return done


def test_fsync__no_acknowledgement_precedes_the_sync_of_its_entry(
    observer: DiskObserver, tmp_path: Path
) -> None:
    with _observed_cluster(observer, tmp_path, nodes=3, durability="fsync") as cluster:
        committed = _write_load(cluster, 80)
    assert committed == 80
    assert observer.acknowledgements >= 3 * 80
    assert observer.violations == []


def test_fsync__a_member_alone_syncs_before_it_applies(
    observer: DiskObserver, tmp_path: Path
) -> None:
    with _observed_cluster(observer, tmp_path, nodes=1, durability="fsync") as cluster:
        committed = _write_load(cluster, 40)
    assert committed == 40
    assert observer.violations == []


def test_write_mode__the_same_checks_find_acknowledgements_before_any_sync(
    observer: DiskObserver, tmp_path: Path
) -> None:
    """The control: "write" never syncs, so the checks above must see violations."""
    with _observed_cluster(observer, tmp_path, nodes=3, durability="write") as cluster:
        _write_load(cluster, 16)
    assert observer.syncs == {}
    assert any("acknowledged" in violation for violation in observer.violations)
    assert any("before syncing" in violation for violation in observer.violations)


def test_fsync__entries_appended_together_share_one_sync(
    observer: DiskObserver, tmp_path: Path
) -> None:
    with _observed_cluster(observer, tmp_path, nodes=3, durability="fsync") as cluster:
        committed = _write_load(cluster, 80)
        leader = cluster.leader()
        assert leader is not None
        leader_journal = str(cluster.nodes[leader].config.journal_file)
    assert committed == 80
    # Eight entries are appended in one tick of the leader: far fewer syncs than entries.
    assert observer.syncs[leader_journal] < committed / 2, observer.syncs


# A real store, three members over loopback TCP, many writers at once.


def _configs(data_dir: Path, durability: str) -> list[RaftConfig]:
    from node.localcluster import free_ports

    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    return [
        RaftConfig(
            self_address=address,
            peers=tuple(other for other in addresses if other != address),
            data_dir=data_dir / f"member-{position}",
            durability=durability,  # type: ignore[arg-type]
        )
        for position, address in enumerate(addresses)
    ]


async def wait_for_leader(stores: list[RaftStore], *, timeout_s: float = 20.0) -> int:
    """The position of the store that leads with a quorum, once one does."""
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + timeout_s
    while not any(store.is_leader and store.replica.hasQuorum for store in stores):
        assert loop.time() < deadline_s, "no leader"
        await asyncio.sleep(0.02)
    return next(n for n, store in enumerate(stores) if store.is_leader)


@pytest.mark.integration
@pytest.mark.parametrize("background", [False, True], ids=["in-line", "helper-process"])
def test_fsync_store__concurrent_writes_share_syncs(tmp_path: Path, background: bool) -> None:
    used, in_line = asyncio.run(_concurrent_writes(tmp_path, writes=400, background=background))
    # Lease ticks may add a few syncs of their own; the writes themselves shared theirs.
    assert 0 < used < 400 / 4, used
    # Off the loop, the helper process syncs: the file sync in line runs only where the leader
    # waits for its own sync before counting itself toward a commit, or for a compaction.
    if background:
        assert in_line < used, (in_line, used)
    else:
        assert in_line == used


async def _concurrent_writes(tmp_path: Path, *, writes: int, background: bool) -> tuple[int, int]:
    """Proposes `writes` puts at once on the leader; returns the syncs the leader made, and how
    many of them ran in line."""
    in_line = [0, 0, 0]

    def counting(position: int) -> Any:
        def sync(descriptor: int) -> None:
            in_line[position] += 1
            os.fdatasync(descriptor)

        return sync

    configs = [
        # Off the loop: every sync, however fast the disk.
        dataclasses.replace(config, background_sync=background, background_sync_min_ms=0)
        for config in _configs(tmp_path, "fsync")
    ]
    stores = [RaftStore(config, file_sync=counting(n)) for n, config in enumerate(configs)]
    for store in stores:
        await store.start()
    try:
        leader = await wait_for_leader(stores)
        journal = stores[leader].replica.journal
        assert journal is not None
        before, before_in_line = journal.syncs, in_line[leader]

        async def put(number: int) -> None:
            await stores[leader].propose(
                KvPut(key=f"k{number}", value=b"v"), client_id="c", seq=number + 1
            )

        await asyncio.gather(*(put(number) for number in range(writes)))
        used, used_in_line = journal.syncs - before, in_line[leader] - before_in_line
        value = await stores[leader].read(lambda machine: kv.get(machine, f"k{writes - 1}"))
        assert value.value is not None
        status = stores[leader].status()
        assert status["journal_syncs"] is not None
        # Every sync is timed, and the longest is among them.
        assert 0 < status["journal_sync_s_max"] <= status["journal_sync_s_total"]
        assert status["journal_slow_syncs"] is not None
    finally:
        for store in stores:
            await store.stop()
    return used, used_in_line


# Files.


def test_write_file_durably__replaces_atomically_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"old")
    write_file_durably(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]


def _journal_with(tmp_path: Path, entries: int) -> Path:
    path = tmp_path / "raft.journal"
    journal = replica_module._journal_module.FileJournal(str(path))
    for index in range(1, entries + 1):
        journal.add(b"\x01", index, 1)
    journal._destroy()
    return path


def test_repair_journal__cuts_a_torn_tail_and_keeps_whole_records(tmp_path: Path) -> None:
    path = _journal_with(tmp_path, 5)
    data = bytearray(path.read_bytes())
    end = struct.unpack_from("<I", data, 36)[0]
    # The header says two more records were written; their pages never reached the disk.
    struct.pack_into("<I", data, 36, end + 50)
    path.write_bytes(bytes(data))
    assert repair_journal(path) == 50
    assert _last_index_in(path) == 5
    assert repair_journal(path) == 0


def test_repair_journal__leaves_an_intact_journal_alone(tmp_path: Path) -> None:
    path = _journal_with(tmp_path, 3)
    before = path.read_bytes()
    assert repair_journal(path) == 0
    assert path.read_bytes() == before


def test_seed_data_dir__refuses_a_directory_that_holds_a_journal(tmp_path: Path) -> None:
    config = RaftConfig(self_address="127.0.0.1:7001", peers=(), data_dir=tmp_path)
    _journal_with(tmp_path, 1)
    with pytest.raises(Exception, match="new data directory"):
        seed_data_dir(config, StateMachine().snapshot())


# A power loss: every file goes back to what its last sync put on disk.


def _final_name(temporary: Path) -> Path | None:
    """The name a temporary file is renamed to: `.<name>.<random>.tmp`
    (`raftstore.files.write_file_durably`), `<name>.tmp` (pysyncobj's term and vote file) or
    `<name>.compact` (journal compaction)."""
    name = temporary.name
    if name.startswith(".") and name.endswith(".tmp"):
        return temporary.with_name(name[1 : -len(".tmp")].rsplit(".", 1)[0])
    if name.endswith(".tmp"):
        return temporary.with_name(name[: -len(".tmp")])
    if name.endswith(".compact"):
        return temporary.with_name(name[: -len(".compact")])
    return None


@dataclass
class PowerLossDisk:
    """What a power loss would keep of each file: its content at its last (fd)sync, moved to
    its final name by a rename only once the directory was synced after it."""

    kept: dict[str, bytes] = field(default_factory=dict)

    def record(self, descriptor: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{descriptor}"))
        if path.is_dir():
            for name in list(self.kept):
                temporary = Path(name)
                if temporary.parent != path or temporary.exists():
                    continue
                final = _final_name(temporary)
                if final is not None:
                    self.kept[str(final)] = self.kept.pop(name)
        else:
            self.kept[str(path)] = path.read_bytes()

    def lose_power(self, paths: list[Path]) -> None:
        for path in paths:
            if str(path) in self.kept:
                path.write_bytes(self.kept[str(path)])
            else:
                path.unlink(missing_ok=True)


@dataclass
class Promises:
    """What a member said to the others: the highest term, its votes, the entries it
    acknowledged (index -> term)."""

    term: int = 0
    votes: dict[int, str] = field(default_factory=dict)
    acknowledged: dict[int, int] = field(default_factory=dict)


def _log_of(replica: Any) -> dict[int, int]:
    journal = replica._SyncObj__raftLog
    return {
        int(journal[position][1]): int(journal[position][2]) for position in range(len(journal))
    }


def _power_loss_restart_keeps_promises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, durability: str
) -> tuple[Promises, dict[int, int], int, Any]:
    disk = PowerLossDisk()
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(descriptor: int) -> None:
        real_fsync(descriptor)
        disk.record(descriptor)

    def fdatasync(descriptor: int) -> None:
        real_fdatasync(descriptor)
        disk.record(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(replica_module, "journal_file_sync", fdatasync)
    promises = Promises()
    watched: dict[str, Any] = {}
    original_send = sim.SimTransport.send

    def send(transport: sim.SimTransport, node: Any, message: Any) -> bool:
        replica = watched.get(transport.address)
        if replica is not None and isinstance(message, dict):
            promises.term = max(promises.term, int(message.get("term", 0)))
            if message.get("type") == "response_vote":
                promises.votes[int(message["term"])] = str(node.id)
            if message.get("type") == "request_vote":  # a candidate votes for itself
                promises.votes[int(message["term"])] = str(replica.selfNode.id)
            if message.get("type") == "next_node_idx" and message.get("success"):
                log = _log_of(replica)
                for index in range(1, int(message["next_node_idx"])):
                    if index in log:
                        promises.acknowledged[index] = log[index]
        return original_send(transport, node, message)

    monkeypatch.setattr(sim.SimTransport, "send", send)
    cluster = SimCluster(
        3, seed=SEED, data_dir=tmp_path, lease_ticks=False, raft_options={"durability": durability}
    )
    with cluster:
        assert _write_load(cluster, 16) == 16
        leader = cluster.leader()
        assert leader is not None
        follower = next(n for n in range(3) if n != leader)
        node = cluster.nodes[follower]
        assert node.replica is not None
        watched[node.address] = node.replica
        assert _write_load(cluster, 16) == 16
        # An election while watched, so the member promises a new term and gives a vote (or
        # becomes the leader): the leader dies, the two others elect, then it comes back.
        cluster.crash(leader)
        assert _write_load(cluster, 16) == 16
        cluster.restart(leader)
        assert _write_load(cluster, 8) == 8
        watched.clear()
        assert promises.term > 1, "the watched member promised no new term"
        assert promises.votes, "the watched member gave no vote"
        cluster.crash(follower)
        journal = node.config.journal_file
        disk.lose_power([journal, Path(f"{journal}.meta")])
        # Term and vote as the power loss left them on disk: once restarted, the member may
        # take a newer term from the leader before it could be read.
        meta = _meta_on_disk(journal)
        term = int(meta.get("currentTerm", 0))
        voted = meta.get("votedForNodeId")
        cluster.restart(follower)
        restarted = node.replica
        assert restarted is not None
        log = _log_of(restarted)
        # The member goes on: it catches up and a new write commits.
        assert _write_load(cluster, 8) == 8
    return promises, log, term, None if voted is None else str(voted)


def test_fsync__after_a_power_loss_a_member_keeps_its_term_vote_and_acknowledged_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    promises, log, term, voted = _power_loss_restart_keeps_promises(monkeypatch, tmp_path, "fsync")
    assert promises.acknowledged, "the follower acknowledged nothing"
    assert term >= promises.term
    # The vote given in the latest term it voted in is on disk, unless a later term replaced it.
    latest = max(promises.votes)
    assert term > latest or voted == promises.votes[latest], (term, voted, promises.votes)
    missing = {i: t for i, t in promises.acknowledged.items() if log.get(i) != t}
    assert missing == {}


def test_write_mode__a_power_loss_loses_what_a_member_acknowledged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The control: "write" never syncs, so the same power loss forgets the promises."""
    promises, log, term, _ = _power_loss_restart_keeps_promises(monkeypatch, tmp_path, "write")
    assert promises.acknowledged
    assert term < promises.term or any(log.get(i) != t for i, t in promises.acknowledged.items())


# Slow syncs: counted, timed and logged (a fake clock; the sync itself does nothing).


class _FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _journal_with_sync_times(
    tmp_path: Path, clock: _FakeClock, took_s: list[float]
) -> replica_module.DurableJournal:
    """A journal whose file sync takes each of `took_s` in turn on `clock`."""
    durations = iter(took_s)

    def file_sync(descriptor: int) -> None:
        clock.now_s += next(durations)

    return replica_module.DurableJournal(tmp_path / "journal", file_sync=file_sync, clock=clock)


def test_durable_journal__times_syncs_and_warns_of_slow_ones_at_most_every_10_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _FakeClock()
    journal = _journal_with_sync_times(tmp_path, clock, [0.002, 0.25, 0.3, 0.05, 0.4])
    caplog.set_level("WARNING", logger="raftstore.replica")

    def append_and_sync(index: int) -> None:
        journal.add(b"entry", index, 1)
        journal.sync()

    journal.sync()  # The journal starts dirty: 2 ms.
    assert (journal.syncs, journal.slow_syncs) == (1, 0)
    append_and_sync(1)  # 250 ms: slow, and warned of.
    append_and_sync(2)  # 300 ms: slow, within 10 s of the warning, so counted only.
    append_and_sync(3)  # 50 ms: not slow.
    assert (journal.syncs, journal.slow_syncs) == (4, 2)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "journal sync took 0.250 s (1 sync(s) over 0.1 s" in warnings[0]
    clock.now_s += 10.0
    append_and_sync(4)  # 400 ms, 10 s later: warned of, with the one not reported before.
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2 and "journal sync took 0.400 s (2 sync(s) over 0.1 s" in warnings[1]
    assert journal.slow_syncs == 3
    assert journal.sync_s_max == pytest.approx(0.4)
    assert journal.sync_s_total == pytest.approx(0.002 + 0.25 + 0.3 + 0.05 + 0.4)
    journal.sync()  # Nothing changed since: no sync, nothing timed.
    assert journal.syncs == 5
    journal._destroy()


def test_durable_journal__a_slow_sync_off_the_loop_is_warned_of_as_such(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _FakeClock()
    journal = _journal_with_sync_times(tmp_path, clock, [])
    caplog.set_level("WARNING", logger="raftstore.replica")
    journal.add(b"entry", 1, 1)
    journal.begin_sync()
    clock.now_s += 0.3  # the helper's sync takes 300 ms
    journal.end_sync(synced=True)
    assert (journal.syncs, journal.slow_syncs, journal.synced_index) == (1, 1, 1)
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "journal sync took 0.300 s" in warning and "heartbeats did not" in warning
    journal._destroy()


def test_durable_journal__a_truncation_lowers_what_counts_as_synced(tmp_path: Path) -> None:
    """Entries removed after a sync are replaced by others at the same indexes: neither that
    sync nor one in progress covers the new ones, so the synced index falls to the cut."""
    journal = _journal_with_sync_times(tmp_path, _FakeClock(), [0.0])
    for index in range(1, 6):
        journal.add(b"entry", index, 1)
    journal.sync()
    assert journal.synced_index == 5
    journal.add(b"entry", 6, 1)
    journal.begin_sync()  # covers 1-6
    journal.deleteEntriesFrom(3)  # positions 3 on: indexes 4, 5 and 6
    assert journal.synced_index == 3
    journal.add(b"other", 4, 2)
    journal.end_sync(synced=True)
    # The sync in progress covered index 4 as it was before the cut, not the new entry 4.
    assert (journal.synced_index, journal.dirty) == (3, True)
    journal._destroy()
