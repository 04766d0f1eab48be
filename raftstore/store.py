"""`RaftStore`: the replicated state machine as seen from asyncio.

Rules:
- pysyncobj runs on the event loop's thread (`autoTick=False`): the loop waits on its sockets
  (`raftstore.loop_poller.LoopPoller`), and the store ticks it after socket events, after
  proposing, and at least every `tick_wait_s`. Completions run on the loop, so no write crosses
  between threads.
- Group commit: proposals that arrive while earlier groups are in flight are packed into one log
  entry, so a lone write goes out at once (pysyncobj's batching is off) and a busy node writes few,
  large entries. At most `groups_in_flight_max` groups are in flight.
- Every proposal has a deadline and the number in flight is bounded (`Overloaded` beyond it).
- Errors say whether the command may have been applied: pysyncobj's LEADER_CHANGED,
  UNKNOWN_OUTCOME and DISCARDED, and timeouts, are indefinite; the rest are definite.
- A default read waits for a barrier committed through the log after the read began, then reads
  local state; reads that arrive together share one barrier (they ride in the next group). A
  `stale` read reads local state at once and says so.
- While it leads with a quorum, the replica proposes a tick every `lease_tick_interval_s`, so the
  lease clock follows real time while the cluster commits and stands still while it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import msgspec
from pysyncobj import FAIL_REASON
from pysyncobj.transport import Transport

from raftstore.background_sync import HelperProcessSync, SyncRunnerFactory
from raftstore.clock import Clock, RealClock
from raftstore.config import RaftConfig
from raftstore.faults import NO_FAULTS, Fault, Faults
from raftstore.loop_poller import LoopPoller
from raftstore.replica import FileSync, Replica, encode_group
from raftstore.testnet import Drops
from xrcore import Applied, Envelope, StateMachine, encode
from xrcore.commands import Command, Tick
from xrcore.errors import (
    ClusterUnavailable,
    InvalidArgument,
    LeaderChanged,
    MembershipChangeInProgress,
    Overloaded,
    Timeout,
    UnknownOutcome,
    XrError,
)
from xrcore.limits import DEFAULT_LIMITS, Limits

__all__ = ["RaftStore", "ReadResult"]

log = logging.getLogger(__name__)
T = TypeVar("T")

GROUPS_IN_FLIGHT_MAX = 4
# A reason of our own, beside pysyncobj's FAIL_REASON values: the group's deadline passed.
_GROUP_TIMED_OUT = -1


class ReadResult(msgspec.Struct, frozen=True, kw_only=True):
    value: Any
    # The xrcore index the read saw, and whether it may be stale (read without a barrier).
    index: int
    stale: bool


def _error_for(reason: int) -> XrError:
    if reason == FAIL_REASON.QUEUE_FULL:
        return Overloaded("the Raft command queue is full; retry later")
    if reason in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
        return ClusterUnavailable("no leader is reachable; nothing was proposed")
    if reason == FAIL_REASON.REQUEST_DENIED:
        return ClusterUnavailable("the leader refused the request; nothing was applied")
    if reason in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.DISCARDED):
        return LeaderChanged("the leader changed before the command was known to commit")
    return UnknownOutcome(f"the outcome is unknown (pysyncobj reason {reason})")


def _time_out(
    future: asyncio.Future[Applied | None], deadline_s: float, read: bool, replica: Replica
) -> None:
    if future.done():
        return
    # Said at the deadline: what the node knew then (a read or a write waits for a leader).
    cause = "" if replica._getLeader() is not None else " (this node knows no leader)"
    if read:
        message = f"the read was not answered within {deadline_s} s{cause}; it changed nothing"
    else:
        message = f"no answer within {deadline_s} s{cause}; the command may or may not be applied"
    future.set_exception(Timeout(message))


class _Pending:
    """A proposal or a read waiting for its group to commit."""

    __slots__ = ("entry", "future")

    def __init__(self, entry: bytes | None, future: asyncio.Future[Applied | None]) -> None:
        self.entry = entry
        self.future = future


class _Group:
    """Proposals sent as one log entry. It is settled once: by pysyncobj's callback, or by its
    deadline when pysyncobj never calls back (a forwarded command lost on a broken connection),
    so a lost group cannot hold its slot forever."""

    __slots__ = ("members", "settled", "timer")

    def __init__(self, members: list[_Pending]) -> None:
        self.members = members
        self.settled = False
        self.timer: asyncio.TimerHandle | None = None


class RaftStore:
    def __init__(
        self,
        config: RaftConfig,
        *,
        clock: Clock | None = None,
        limits: Limits = DEFAULT_LIMITS,
        transport: Transport | None = None,
        faults: Faults = NO_FAULTS,
        drops: Drops | None = None,
        file_sync: FileSync | None = None,
        sync_runner: SyncRunnerFactory | None = None,
    ) -> None:
        """`file_sync` syncs the journal in line in "fsync" durability (tests count its calls);
        `sync_runner` makes what syncs it off the loop with `raft.background_sync` (by default
        `HelperProcessSync`; tests observe or delay syncs with their own)."""
        self.config = config
        self.clock = clock or RealClock()
        # Test-only deliberate bugs (`raftstore.faults`); none outside a test run.
        self.faults = faults
        limits = faults.limits(limits)
        self._loop: asyncio.AbstractEventLoop | None = None
        # Wakes coroutines waiting for the local state to change (lock waits, watches), only
        # while someone waits. Set before the replica, which replays its journal through
        # `_on_applied`.
        self._applied_event = asyncio.Event()
        self._applied_waiters = 0
        self._poller = LoopPoller()
        self._sync_runner = sync_runner or HelperProcessSync
        self.replica = Replica(
            config,
            limits=limits,
            transport=transport,
            on_applied=self._on_applied,
            file_sync=file_sync,
            poller=self._poller,
        )
        # Test-only message drops (`raftstore.testnet`): jepsen-lite's partitions on loopback.
        self.drops = drops
        if drops is not None:
            drops.install(self.replica)
        self._pending: list[_Pending] = []
        self._in_flight_commands = 0
        self._groups: set[_Group] = set()
        # Where the leader's stamps continue from: (replicated now_ms, monotonic s, term).
        self._time_base: tuple[int, float, int] | None = None
        self._flush_scheduled = False
        self._running = False
        self._tick_scheduled = False
        self._tick_timer: asyncio.TimerHandle | None = None
        self._tick_due = 0.0
        self._ticker: asyncio.Task[None] | None = None
        self._membership_change: str | None = None

    # Life cycle.

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._running = True
        # A tick right after each socket event, rather than one per turn of the loop
        # (`_tick_soon`): measured better at 1 write in flight (p50 0.50 against 0.57 ms) and at
        # 1,000 (27,000 against 19,000 commits/s) in bench/raftstore.py.
        self._poller.attach(self._loop, self._tick)
        if self.config.background_sync:
            self.replica.sync_off_the_loop(
                self._sync_runner,
                self._loop,
                tick_soon=self._tick_soon,
                in_line_below_s=self.config.background_sync_min_ms / 1000,
            )
        self._tick()
        self._ticker = asyncio.create_task(self._lease_ticks())

    async def stop(self) -> None:
        self._running = False
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._tick_timer is not None:
            self._tick_timer.cancel()
        self.replica.sync_off_the_loop(None)
        self.replica.destroy()
        self._poller.detach()
        for group in list(self._groups):
            self._settle(group, None, FAIL_REASON.UNKNOWN_OUTCOME)
        for pending in self._pending:
            if not pending.future.done():
                pending.future.set_exception(ClusterUnavailable("the store is stopping"))
        self._pending.clear()

    # Ticks: pysyncobj's timers (heartbeats, elections, held-back commit notices) need a tick at
    # least every `tick_wait_s`; messages, proposals and a lone member's commits need one soon.

    def _tick_soon(self) -> None:
        if not self._tick_scheduled and self._running and self._loop is not None:
            self._tick_scheduled = True
            self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self._tick_scheduled = False
        loop = self._loop
        if not self._running or loop is None:
            return
        try:
            self.replica.doTick(0.0)
        except Exception:  # pragma: no cover - a bug in pysyncobj or xr; keep the node up
            log.exception("raft tick failed")
        if not self.config.peers and self._groups:
            # A member alone commits an entry on the tick after it appends it, and no peer's
            # answer comes to prompt that tick.
            self._tick_soon()
        # uvloop's timer handles do not tell when they are due: the store remembers.
        due = loop.time() + self.replica.tick_wait_s(self.config.tick_wait_s)
        if self._tick_timer is None or self._tick_due > due:
            if self._tick_timer is not None:
                self._tick_timer.cancel()
            self._tick_timer = loop.call_at(due, self._tick_on_timer)
            self._tick_due = due

    def _tick_on_timer(self) -> None:
        self._tick_timer = None
        self._tick()

    async def _lease_ticks(self) -> None:
        interval_s = self.config.lease_tick_interval_s
        while self._running:
            await asyncio.sleep(interval_s)
            if self.is_leader and self.replica.halted is not None:
                await self._hand_over_leadership()
            elif self.is_leader and self.replica.hasQuorum:
                with contextlib.suppress(XrError):
                    await self.propose(Tick(), timeout_s=interval_s * 4)

    # Proposals.

    async def propose(
        self,
        command: Command,
        *,
        client_id: str | None = None,
        seq: int | None = None,
        timeout_s: float | None = None,
    ) -> Applied:
        """Replicates a command and returns what applying it did (its result may hold a typed
        error from the state machine). Raises `XrError` when replication itself failed."""
        if self.faults.active(Fault.RETRIES_WITHOUT_DEDUP):
            client_id = seq = None
        entry = encode(
            Envelope(command=command, now_ms=self._stamp_ms(), client_id=client_id, seq=seq)
        )
        applied = await self._submit(entry, timeout_s)
        assert applied is not None
        return applied

    def _stamp_ms(self) -> int:
        """The time to stamp on a proposal. Only the leader moves replicated time: a follower
        stamps the replicated time it has applied, so a follower's skewed clock changes nothing.
        The leader stamps its wall clock, but never less than the replicated time it found on
        taking office plus the time elapsed since on its monotonic clock, so a leader whose wall
        clock is behind its predecessor's still moves the lease clock at the real rate."""
        replicated_ms = self.replica.read(lambda machine: machine.now_ms)
        if not self.is_leader:
            return replicated_ms
        term = self.replica.raftCurrentTerm
        monotonic_s = self.clock.monotonic_s()
        if self._time_base is None or self._time_base[2] != term:
            self._time_base = (replicated_ms, monotonic_s, term)
        base_ms, base_s, _ = self._time_base
        return max(self.clock.now_ms(), base_ms + int((monotonic_s - base_s) * 1000))

    async def _submit(self, entry: bytes | None, timeout_s: float | None) -> Applied | None:
        if self._loop is None or not self._running:
            raise ClusterUnavailable("the store is not running")
        self._check_applying()
        if self._in_flight_commands >= self.config.proposals_in_flight_max:
            raise Overloaded(
                f"{self._in_flight_commands} proposals are in flight, the maximum; retry later"
            )
        future: asyncio.Future[Applied | None] = self._loop.create_future()
        self._pending.append(_Pending(entry, future))
        self._in_flight_commands += 1
        if self._groups:
            # Busy: let what arrives in this turn of the loop join the same group.
            self._schedule_flush()
        else:
            # Idle: a lone proposal goes out at once, without waiting for the next turn.
            self._flush()
        deadline_s = self.config.propose_timeout_s if timeout_s is None else timeout_s
        # A timer rather than `asyncio.wait_for`, which costs a task per proposal. A timed-out
        # future holds its error; its group skips it when it settles.
        timer = self._loop.call_later(
            deadline_s, _time_out, future, deadline_s, entry is None, self.replica
        )
        try:
            return await future
        finally:
            timer.cancel()
            self._in_flight_commands -= 1

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        loop = self._loop
        assert loop is not None
        while self._pending and len(self._groups) < GROUPS_IN_FLIGHT_MAX:
            group = _Group(self._take_group())
            self._groups.add(group)
            group.timer = loop.call_later(
                self.config.propose_timeout_s, self._settle, group, None, _GROUP_TIMED_OUT
            )
            entries = [pending.entry for pending in group.members if pending.entry is not None]
            self.replica.propose_group(encode_group(entries), self._completion_callback(group))
        # The tick appends what was proposed and sends it.
        self._tick_soon()

    def _take_group(self) -> list[_Pending]:
        limit_count = self.config.group_commands_max
        limit_bytes = self.config.group_bytes_max
        size = 0
        taken = 0
        for pending in self._pending:
            entry_size = 0 if pending.entry is None else len(pending.entry)
            if taken and (taken >= limit_count or size + entry_size > limit_bytes):
                break
            size += entry_size
            taken += 1
        group, self._pending = self._pending[:taken], self._pending[taken:]
        return group

    def _completion_callback(self, group: _Group) -> Callable[[Any, int], None]:
        def on_commit(results: Any, reason: int) -> None:
            # Runs inside a tick, on the loop's thread.
            self._settle(group, results, reason)

        return on_commit

    def _settle(self, group: _Group, results: Any, reason: int) -> None:
        if group.settled:
            return
        group.settled = True
        self._groups.discard(group)
        if group.timer is not None:
            group.timer.cancel()
        commands = sum(1 for pending in group.members if pending.entry is not None)
        # Another entry than this group's at its index and term (an entry skipped as one no
        # member can apply answers None) is not its answer. Only a stranger posing as a leader
        # of the same term can put one there; raising here, inside pysyncobj's apply loop,
        # would have made it apply the entry again.
        if reason == FAIL_REASON.SUCCESS and (
            not isinstance(results, list) or len(results) != commands
        ):
            reason = FAIL_REASON.UNKNOWN_OUTCOME
        if reason == FAIL_REASON.SUCCESS:
            applied = iter(results)
            for pending in group.members:
                value = None if pending.entry is None else next(applied)
                if not pending.future.done():
                    pending.future.set_result(value)
        else:
            error = (
                Timeout("the log entry was not answered in time; it may or may not be applied")
                if reason == _GROUP_TIMED_OUT
                else _error_for(reason)
            )
            for pending in group.members:
                if not pending.future.done():
                    pending.future.set_exception(
                        Timeout("the read was not answered in time; it changed nothing")
                        if pending.entry is None and reason == _GROUP_TIMED_OUT
                        else error
                    )
        if self._pending:
            self._schedule_flush()

    # Waiting for change.

    def _on_applied(self, results: list[Applied]) -> None:
        # Runs inside a tick (or while the replica replays its journal), after a group applied.
        if self._applied_waiters and self._loop is not None:
            self._loop.call_soon(self._wake_applied)

    def _wake_applied(self) -> None:
        event, self._applied_event = self._applied_event, asyncio.Event()
        event.set()

    async def wait_applied(self, after_index: int, *, timeout_s: float) -> int:
        """Waits until this replica has applied past xrcore index `after_index`, or `timeout_s`
        has passed; returns the index it has applied. Local: it says nothing about other
        replicas, but whatever it applied is committed."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        self._applied_waiters += 1
        try:
            while True:
                # Take the event before reading the index: an apply after the read wakes it.
                event = self._applied_event
                index = self.replica.read(lambda machine: machine.index)
                remaining_s = deadline_s - loop.time()
                if index > after_index or remaining_s <= 0:
                    return index
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining_s)
        finally:
            self._applied_waiters -= 1

    # Reads.

    async def read(
        self,
        query: Callable[[StateMachine], T],
        *,
        consistency: Literal["linearizable", "stale"] = "linearizable",
        timeout_s: float | None = None,
    ) -> ReadResult:
        if consistency not in ("linearizable", "stale"):
            raise InvalidArgument(f"consistency must be linearizable or stale, not {consistency!r}")
        self._check_applying()
        if consistency == "linearizable" and not self.faults.reads_locally(
            is_leader=self.is_leader
        ):
            await self._submit(None, timeout_s)
        value, index = self.replica.read(lambda machine: (query(machine), machine.index))
        return ReadResult(value=value, index=index, stale=consistency == "stale")

    def _check_applying(self) -> None:
        """Refuses a request while this replica has stopped applying the log at an entry of a
        newer release (`Replica.halted`): its state stays where it stopped, so it could answer
        neither a write nor a read. Another node can (clients try the next endpoint on
        ClusterUnavailable)."""
        if self.replica.halted is not None:
            raise ClusterUnavailable(f"this node must be upgraded: {self.replica.halted}")

    # Status and administration.

    @property
    def is_leader(self) -> bool:
        return bool(self.replica._isLeader())

    def status(self) -> dict[str, Any]:
        raw = self.replica.getStatus()
        leader = raw["leader"]
        contact_s = self.replica.last_contact_s()
        journal = self.replica.journal
        outbox = self.replica.outbox
        members = []
        leading = raw["state"] == 2
        for peer in self.config.peers:
            members.append(
                {
                    "address": peer,
                    "connected": raw.get(f"partner_node_status_server_{peer}", 0) == 2,
                    # Known on the leader only: how far each follower's log matches, and how
                    # long ago it last answered. pysyncobj keeps a former leader's figures,
                    # which a follower would show as if current.
                    "match_index": raw.get(f"match_idx_server_{peer}") if leading else None,
                    "last_contact_s": contact_s.get(peer),
                }
            )
        return {
            "self": self.config.self_address,
            "state": {0: "follower", 1: "candidate", 2: "leader"}.get(raw["state"], "unknown"),
            "leader": None if leader is None else str(leader),
            "has_quorum": bool(raw["has_quorum"]),
            "term": raw["raft_term"],
            "commit_index": raw["commit_idx"],
            "applied_index": raw["last_applied"],
            "log_length": raw["log_len"],
            "machine_index": self.replica.read(lambda machine: machine.index),
            "groups_in_flight": len(self._groups),
            "proposals_in_flight": self._in_flight_commands,
            "members": members,
            "durability": self.config.durability,
            # Journal syncs since start ("fsync" mode; None in "write" mode, which never syncs),
            # the seconds they took in all, the longest, and how many took over 0.1 s.
            "journal_syncs": None if journal is None else journal.syncs,
            "journal_sync_s_total": None if journal is None else journal.sync_s_total,
            "journal_sync_s_max": None if journal is None else journal.sync_s_max,
            "journal_slow_syncs": None if journal is None else journal.slow_syncs,
            # Of those syncs, how many ran off the event loop, and the moving average of the
            # disk's sync time by which each next sync runs in line or off the loop.
            "journal_syncs_run_off_loop": None if journal is None else journal.syncs_off_loop,
            "journal_recent_sync_s": None if journal is None else journal.recent_sync_s,
            # Whether syncs run off the event loop (raft.background_sync), and in how many ticks
            # the leader held a commit back until its own disk had the entries.
            "journal_syncs_off_loop": outbox is not None and outbox.in_background,
            "commits_held_for_own_sync": self.replica.commits_held_for_own_sync,
            # Incoming Raft connections this member closed, by reason (raftstore.frames): a
            # peer with another cluster secret, or not among this member's peers, shows here.
            "connections_refused": self.replica.connections_refused(),
            # Committed entries this member could not decode and skipped: most likely a newer
            # member's, written against a release note (it may now differ from them).
            "entries_undecodable": self.replica.undecodable_entries,
            # Why this member stopped applying the log (an entry of a newer release), or None.
            "apply_halted": self.replica.halted,
        }

    async def transfer_leadership(self, address: str, *, timeout_s: float = 5.0) -> None:
        """Makes the member at `address` the leader, and returns once this member has heard it
        lead; ClusterUnavailable if that has not happened within `timeout_s`.

        pysyncobj's transfer (Raft's TimeoutNow) only sends the request, and only once the
        target's log has caught up with the leader's. The target can still fail to take over:
        it ignores the request while it has lost track of the leader (a pre-vote round after a
        late heartbeat), and its campaign fails if the leader appended an entry (a lease tick)
        after the check, in which case an election follows that the old leader may win. So while
        this member is, or is again, the leader and the target has not taken over within an
        election timeout, the request is sent again."""
        if address not in self.config.peers:
            raise InvalidArgument(f"{address!r} is not a member of this cluster")
        if not self.is_leader:
            raise ClusterUnavailable("only the leader can transfer leadership")
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        sent_s: float | None = None
        while True:
            leader = self.replica._getLeader()
            if leader is not None and str(leader) == address:
                return
            now_s = loop.time()
            if now_s > deadline_s:
                raise ClusterUnavailable(f"{address} did not take over within {timeout_s} s")
            resend = sent_s is None or now_s - sent_s > self.config.raft_max_timeout_s
            if self.is_leader and resend:
                try:
                    await self._admin(
                        lambda callback: self.replica.transferLeadership(address, callback)
                    )
                    sent_s = loop.time()
                except ClusterUnavailable:
                    # Refused while the target's log is behind the leader's; the leader keeps
                    # appending ticks, so the target catches up between two of them.
                    pass
            await asyncio.sleep(0.02)

    async def _hand_over_leadership(self) -> None:
        """Hands the leadership to a member that applies the log. This one stopped at an entry
        of a newer release (`Replica.halted`) and proposes nothing: led by it, the cluster would
        move neither its time (leases) nor its schedule. A member that stopped too does
        not take over (`Replica._SyncObj__connectedToAnyone`), so with none that applies the log
        this member stays the leader of a cluster that can do nothing until it is upgraded."""
        for member in self.status()["members"]:
            if not (self.is_leader and member["connected"]):
                continue
            try:
                await self.transfer_leadership(
                    member["address"], timeout_s=2 * self.config.raft_max_timeout_s
                )
            except XrError:
                continue
            log.warning("leadership handed to %s: %s", member["address"], self.replica.halted)
            return

    async def add_member(self, address: str) -> None:
        """Adds a member. One change at a time: pysyncobj accepts back-to-back changes, which can
        leave two disjoint majorities, so a second change is refused until the first commits."""
        await self._change_membership("add", address)

    async def remove_member(self, address: str) -> None:
        await self._change_membership("remove", address)

    async def _change_membership(self, action: str, address: str) -> None:
        if self._membership_change is not None:
            raise MembershipChangeInProgress(
                f"{self._membership_change} has not committed yet; retry when it has"
            )
        if not self.is_leader:
            raise ClusterUnavailable("membership changes are made on the leader")
        self._membership_change = f"{action} {address}"
        try:
            if action == "add":
                await self._admin(lambda done: self.replica.addNodeToCluster(address, done))
            else:
                await self._admin(lambda done: self.replica.removeNodeFromCluster(address, done))
        finally:
            self._membership_change = None

    async def _admin(self, call: Callable[[Callable[[Any, int], None]], Any]) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def done(result: Any, reason: int) -> None:
            def settle() -> None:
                if future.done():
                    return
                if reason == FAIL_REASON.SUCCESS:
                    future.set_result(None)
                else:
                    future.set_exception(_error_for(reason))

            loop.call_soon(settle)

        call(done)
        self._tick_soon()
        try:
            await asyncio.wait_for(future, self.config.propose_timeout_s)
        except TimeoutError:
            raise Timeout("no answer to the administrative request") from None
