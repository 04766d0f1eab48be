"""Journal syncs off the event loop (`raft.background_sync`): the same promises as in line.

The ordering checks of test_durability.py, on real stores (three members over loopback TCP): the
sync runs later on the loop, through an in-process runner that calls an observing sync after a
delay, so what the file holds when it is synced is what a power loss would keep. Then:
- a follower's success answer for entries up to index i leaves only after a sync holding i;
- an entry is applied (so acknowledged) only once a majority of members synced it.
The leader's own sync is made slow, so a follower's answer comes first: without the leader's
wait for its own sync before it counts itself (the control), the checks find commits that only
one member had on disk.

A member alone, its own majority, syncs before it applies. The helper process itself is checked
apart: it syncs the descriptor it is sent (a pipe, which cannot be synced, comes back as EINVAL),
reports its death, and exits when closed or when its node is killed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftstore.background_sync import HelperProcessSync, OnSynced
from raftstore.replica import DurableJournal, Outbox, Replica
from raftstore.store import RaftStore
from tests.raftstore.test_durability import DiskObserver, _configs, wait_for_leader
from xrcore.commands import KvPut

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class DelayedSync:
    """A `SyncRunner` on the loop: `start` syncs (with `file_sync`) `delay_s` later."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_synced: OnSynced,
        file_sync: Callable[[int], None],
        delay_s: float,
    ) -> None:
        self._loop = loop
        self._on_synced = on_synced
        self._file_sync = file_sync
        self._delay_s = delay_s
        self._timer: asyncio.TimerHandle | None = None
        self._descriptor = -1

    def start(self, descriptor: int) -> None:
        assert self._timer is None, "one sync at a time"
        # As the helper's copy, the descriptor outlives a compaction that closes the journal's.
        self._descriptor = os.dup(descriptor)
        self._timer = self._loop.call_later(self._delay_s, self._end)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            os.close(self._descriptor)

    def _end(self) -> None:
        self._timer = None
        try:
            self._file_sync(self._descriptor)
        finally:
            os.close(self._descriptor)
        self._on_synced(None, self._delay_s)


async def _observed_writes(
    tmp_path: Path, observer: DiskObserver, *, writers: int, rounds: int
) -> tuple[int, int]:
    """Three stores syncing off the loop, member 0 leading; their syncs take 20, 1 and 50 ms,
    so the fast follower's answer reaches the leader before its own sync ends (and the other
    follower's). `writers` puts at once, `rounds` times. Returns the puts acknowledged and how
    many ticks the leader held a commit back for its own sync."""
    configs = [
        # Every sync off the loop, however fast the disk.
        dataclasses.replace(config, lease_tick_interval_s=0.05, background_sync_min_ms=0)
        for config in _configs(tmp_path, "fsync")
    ]
    journals = [config.journal_file for config in configs]

    def runner(delay_s: float) -> Any:
        def make(loop: asyncio.AbstractEventLoop, on_synced: OnSynced) -> DelayedSync:
            return DelayedSync(loop, on_synced, observer.sync, delay_s)

        return make

    stores = [
        RaftStore(config, sync_runner=runner(delay_s))
        for config, delay_s in zip(configs, (0.02, 0.001, 0.05), strict=True)
    ]
    for store, journal in zip(stores, journals, strict=True):
        outbox = store.replica.outbox
        assert outbox is not None
        send = outbox._send

        def observed_send(
            node: Any, message: Any, journal: Path = journal, send: Any = send
        ) -> Any:
            observer.on_send(journal, message)
            return send(node, message)

        outbox._send = observed_send
        replica = store.replica
        original = replica.on_applied

        def on_applied(
            results: Any, replica: Any = replica, journal: Path = journal, original: Any = original
        ) -> None:
            observer.on_apply(journal, replica.raftLastApplied + 1, journals)
            if original is not None:
                original(results)

        replica.on_applied = on_applied
    for store in stores:
        await store.start()
    acknowledged = 0
    try:
        leader = stores[await wait_for_leader(stores)]
        if leader is not stores[0]:
            await leader.transfer_leadership(configs[0].self_address)
        assert stores[0].is_leader
        for round_number in range(rounds):
            results = await asyncio.gather(
                *(
                    stores[0].propose(
                        KvPut(key=f"k{round_number}-{writer}", value=b"v"),
                        client_id=f"writer-{writer}",
                        seq=round_number + 1,
                    )
                    for writer in range(writers)
                ),
                return_exceptions=True,
            )
            acknowledged += sum(1 for result in results if not isinstance(result, BaseException))
    finally:
        for store in stores:
            await store.stop()
    return acknowledged, stores[0].replica.commits_held_for_own_sync


def test_off_the_loop__no_acknowledgement_precedes_the_sync_of_its_entry(tmp_path: Path) -> None:
    observer = DiskObserver(applying_member_must_hold=False)
    acknowledged, held = asyncio.run(_observed_writes(tmp_path, observer, writers=4, rounds=25))
    assert acknowledged == 100
    assert held > 0, "the leader never held a commit back for its own sync: the test shows nothing"
    assert observer.acknowledgements >= 100
    assert observer.violations == []


def test_off_the_loop__without_the_leaders_cap_on_commits_the_checks_find_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: a leader that counts itself at once commits what only one member synced."""
    monkeypatch.setattr(Replica, "_commit_cap", lambda replica, outbox: None)
    observer = DiskObserver(applying_member_must_hold=False)
    asyncio.run(_observed_writes(tmp_path, observer, writers=4, rounds=25))
    assert any("with 1/3 synced" in violation for violation in observer.violations), (
        observer.violations[:5]
    )


# The helper process.


class _Reports:
    def __init__(self) -> None:
        self.seen: list[OSError | None] = []
        self.took_s: list[float] = []

    def __call__(self, error: OSError | None, took_s: float) -> None:
        self.seen.append(error)
        self.took_s.append(took_s)


async def _with_helper(use: Callable[[HelperProcessSync, _Reports], Any]) -> Any:
    reports = _Reports()
    helper = HelperProcessSync(asyncio.get_running_loop(), reports)
    try:
        return await use(helper, reports)
    finally:
        helper.close()


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, "timed out"
        await asyncio.sleep(0.005)


# In line while the disk is fast, off the loop while it is slow (`raft.background_sync_min_ms`).


class _RecordingRunner:
    """A `SyncRunner` that only records what it is asked; the test ends each sync itself."""

    def __init__(self) -> None:
        self.started = 0
        self.running = False

    def start(self, descriptor: int) -> None:
        assert not self.running, "one sync at a time"
        self.started += 1
        self.running = True

    def close(self) -> None:
        self.running = False


class _SlowDisk:
    """The journal's clock, and its in-line sync, which takes `sync_s` of that clock."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.sync_s = 0.0002
        self.in_line = 0

    def clock(self) -> float:
        return self.now_s

    def sync(self, descriptor: int) -> None:
        self.in_line += 1
        self.now_s += self.sync_s


def _adaptive_outbox(tmp_path: Path, in_line_below_s: float) -> tuple[Any, ...]:
    disk = _SlowDisk()
    journal = DurableJournal(tmp_path / "raft.journal", file_sync=disk.sync, clock=disk.clock)
    sent: list[Any] = []
    outbox = Outbox(journal, lambda node, message: sent.append(message))
    runner = _RecordingRunner()
    outbox.run_syncs_with(runner)
    outbox.in_line_below_s = in_line_below_s
    return disk, journal, outbox, runner, sent


def _answer_after_a_write(journal: DurableJournal, outbox: Outbox, index: int) -> None:
    """A follower's turn: it appends an entry and answers, which must wait for the sync."""
    journal.add(b"\x01", index, 1)
    outbox.send("leader", {"type": "next_node_idx", "index": index})
    outbox.flush()


def test_adaptive__syncs_in_line_while_the_disk_is_fast_and_off_the_loop_while_it_is_slow(
    tmp_path: Path,
) -> None:
    disk, journal, outbox, runner, sent = _adaptive_outbox(tmp_path, in_line_below_s=0.001)
    # A fast disk (0.2 ms a sync): in line, each answer out once its sync ended.
    for index in range(1, 11):
        _answer_after_a_write(journal, outbox, index)
    assert (disk.in_line, runner.started, len(sent)) == (10, 0, 10)
    assert journal.recent_sync_s < 0.001
    # One stall of 0.1 s, in line: the average jumps over 1 ms, so the next sync runs off the
    # loop, and the answer waits for it.
    disk.sync_s = 0.1
    _answer_after_a_write(journal, outbox, 11)
    assert journal.recent_sync_s >= 0.001
    _answer_after_a_write(journal, outbox, 12)
    assert (disk.in_line, runner.started, len(sent)) == (11, 1, 11)
    # While that sync runs, another write does not sync in line either.
    _answer_after_a_write(journal, outbox, 13)
    assert (disk.in_line, runner.started, len(sent)) == (11, 1, 11)
    disk.sync_s = 0.0002
    # Syncs off the loop that report 0.2 ms bring the average down; each end releases what it
    # covers and starts the next off the loop until the average is under 1 ms, then in line.
    off_loop_ends = 0
    index = 14
    while runner.running:
        runner.running = False
        outbox.on_synced(None, 0.0002)
        off_loop_ends += 1
        _answer_after_a_write(journal, outbox, index)
        index += 1
        assert off_loop_ends < 50, "never back in line"
    assert journal.recent_sync_s < 0.001
    assert journal.syncs_off_loop == off_loop_ends
    # Back in line: every answer out, none waits.
    _answer_after_a_write(journal, outbox, index)
    assert len(sent) == index
    assert runner.started == off_loop_ends
    # Off the loop for about 15 syncs after a 0.1 s stall (RECENT_SYNC_WEIGHT 0.2).
    assert 10 <= off_loop_ends <= 20, off_loop_ends


def test_adaptive__at_zero_every_sync_runs_off_the_loop(tmp_path: Path) -> None:
    disk, journal, outbox, runner, sent = _adaptive_outbox(tmp_path, in_line_below_s=0.0)
    for index in range(1, 6):
        _answer_after_a_write(journal, outbox, index)
        assert runner.running and len(sent) == index - 1
        runner.running = False
        outbox.on_synced(None, 0.0002)
        assert len(sent) == index
    assert (disk.in_line, runner.started, journal.syncs_off_loop) == (0, 5, 5)


def test_helper__reports_how_long_the_sync_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk's time, measured in the helper: here a sync made 50 ms slower, as
    bench/raft_messages.py's --disk-latency makes it."""
    from raftstore import background_sync

    synced = "os.fdatasync(descriptor)"
    assert synced in background_sync._HELPER
    monkeypatch.setattr(
        background_sync,
        "_HELPER",
        background_sync._HELPER.replace(synced, f"{synced}; time.sleep(0.05)"),
    )

    async def use(helper: HelperProcessSync, reports: _Reports) -> tuple[OSError | None, float]:
        with (tmp_path / "file").open("wb") as file:
            file.write(b"data")
            helper.start(file.fileno())
            await _until(lambda: len(reports.seen) == 1)
        return reports.seen[0], reports.took_s[0]

    error, took_s = asyncio.run(_with_helper(use))
    assert error is None
    assert took_s >= 0.05


def test_helper__syncs_the_descriptor_it_is_sent(tmp_path: Path) -> None:
    async def use(helper: HelperProcessSync, reports: _Reports) -> None:
        with (tmp_path / "file").open("wb") as file:
            file.write(b"data")
            helper.start(file.fileno())
            await _until(lambda: len(reports.seen) == 1)
            assert reports.seen == [None]
            helper.start(file.fileno())
            await _until(lambda: len(reports.seen) == 2)
            assert reports.seen == [None, None]
        # A pipe cannot be synced: the helper ran fdatasync on what it was sent, and says why.
        read_end, write_end = os.pipe()
        try:
            helper.start(read_end)
            await _until(lambda: len(reports.seen) == 3)
        finally:
            os.close(read_end)
            os.close(write_end)
        error = reports.seen[-1]
        assert isinstance(error, OSError) and error.errno == errno.EINVAL

    asyncio.run(_with_helper(use))


def test_helper__refuses_a_second_sync_while_one_is_in_progress(tmp_path: Path) -> None:
    async def use(helper: HelperProcessSync, reports: _Reports) -> None:
        with (tmp_path / "file").open("wb") as file:
            helper.start(file.fileno())
            with pytest.raises(RuntimeError, match="already in progress"):
                helper.start(file.fileno())
            await _until(lambda: len(reports.seen) == 1)
        assert reports.seen == [None]

    asyncio.run(_with_helper(use))


def test_helper__its_death_is_reported_and_ends_it(tmp_path: Path) -> None:
    async def use(helper: HelperProcessSync, reports: _Reports) -> None:
        os.kill(helper.pid, signal.SIGKILL)
        with (tmp_path / "file").open("wb") as file:
            helper.start(file.fileno())
            await _until(lambda: len(reports.seen) == 1)
        assert isinstance(reports.seen[0], OSError)
        with pytest.raises(RuntimeError, match="closed"):
            helper.start(0)

    asyncio.run(_with_helper(use))


def test_helper__exits_when_its_node_closes_it() -> None:
    async def use() -> int:
        helper = HelperProcessSync(asyncio.get_running_loop(), _Reports())
        pid = helper.pid
        helper.close()
        return pid

    pid = asyncio.run(use())
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped by close: it exited


def test_store__a_failed_helper_falls_back_to_syncs_in_line(tmp_path: Path) -> None:
    """The helper dies under a running cluster: writes go on, synced on the loop."""
    in_line = [0]

    def counting(descriptor: int) -> None:
        in_line[0] += 1
        os.fdatasync(descriptor)

    async def run() -> None:
        configs = [
            dataclasses.replace(config, background_sync_min_ms=0)
            for config in _configs(tmp_path, "fsync")
        ]
        stores = [RaftStore(config, file_sync=counting) for config in configs]
        for store in stores:
            await store.start()
        try:
            await wait_for_leader(stores)
            for store in stores:
                runner = store.replica.outbox._runner  # type: ignore[union-attr]
                assert isinstance(runner, HelperProcessSync)
                os.kill(runner.pid, signal.SIGKILL)
            leader = next(store for store in stores if store.is_leader)
            for number in range(20):
                await leader.propose(
                    KvPut(key=f"k{number}", value=b"v"), client_id="c", seq=number + 1
                )
            await _until(lambda: all(not s.replica.outbox.in_background for s in stores))  # type: ignore[union-attr]
        finally:
            for store in stores:
                await store.stop()

    asyncio.run(run())
    assert in_line[0] > 0


def test_store__a_helper_that_cannot_start_leaves_syncs_in_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def cannot_start(loop: asyncio.AbstractEventLoop, on_synced: OnSynced) -> HelperProcessSync:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    async def run() -> tuple[bool, int]:
        (config,) = [dataclasses.replace(c, peers=()) for c in _configs(tmp_path, "fsync")[:1]]
        store = RaftStore(config, sync_runner=cannot_start)
        await store.start()
        try:
            await _until(lambda: store.is_leader)
            await store.propose(KvPut(key="k", value=b"v"), client_id="c", seq=1)
            status = store.status()
            return status["journal_syncs_off_loop"], status["journal_syncs"]
        finally:
            await store.stop()

    off_loop, syncs = asyncio.run(run())
    assert (off_loop, syncs > 0) == (False, True)
    assert "cannot sync the journal off the event loop" in caplog.text


def test_off_the_loop__a_member_alone_syncs_before_it_applies(tmp_path: Path) -> None:
    """A member alone is its own majority: it may apply only what its own disk holds, so it
    syncs in line before it commits, whatever runs off the loop (here a 50 ms sync)."""
    observer = DiskObserver()
    (config,) = [
        dataclasses.replace(c, peers=(), background_sync_min_ms=0)
        for c in _configs(tmp_path, "fsync")[:1]
    ]
    journal = config.journal_file

    def runner(loop: asyncio.AbstractEventLoop, on_synced: OnSynced) -> DelayedSync:
        return DelayedSync(loop, on_synced, observer.sync, 0.05)

    async def run() -> None:
        # Its syncs in line go through the observing sync too.
        store = RaftStore(config, sync_runner=runner, file_sync=observer.sync)
        original = store.replica.on_applied

        def on_applied(results: Any) -> None:
            observer.on_apply(journal, store.replica.raftLastApplied + 1, [journal])
            if original is not None:
                original(results)

        store.replica.on_applied = on_applied
        await store.start()
        try:
            await _until(lambda: store.is_leader)
            assert store.status()["journal_syncs_off_loop"]
            for number in range(10):
                await store.propose(
                    KvPut(key=f"k{number}", value=b"v"), client_id="c", seq=number + 1
                )
        finally:
            await store.stop()

    asyncio.run(run())
    assert observer.acknowledgements >= 10
    assert observer.violations == []


def test_helper__exits_when_its_node_is_killed(tmp_path: Path) -> None:
    """kill -9 of the node closes its end of the socket: the helper sees the end and exits, so
    crashed nodes leave no helpers behind."""
    node = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import asyncio, time\n"
            "from raftstore.background_sync import HelperProcessSync\n"
            "async def main():\n"
            "    helper = HelperProcessSync(asyncio.get_running_loop(), print)\n"
            "    print(helper.pid, flush=True)\n"
            "    time.sleep(60)\n"
            "asyncio.run(main())\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert node.stdout is not None
        helper_pid = int(node.stdout.readline())
        assert _alive(helper_pid)
        node.kill()
        node.wait()
        deadline_s = time.monotonic() + 10.0
        while _alive(helper_pid):
            assert time.monotonic() < deadline_s, "the helper outlived its node"
            time.sleep(0.01)
    finally:
        node.kill()
        node.wait()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (an exited process not yet reaped by its new parent does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
