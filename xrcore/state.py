"""The deterministic replicated state machine.

Rules every replica relies on:
- `apply` is a pure function of the state and the log entry: no clock, no randomness, no I/O, no
  iteration over sets. The same entries give byte-identical snapshots on every replica.
- Time comes from the log. Each entry carries the proposer's `now_ms`; replicated wall time is the
  maximum seen, so it never goes back. The lease clock, which every expiry is measured on, moves
  forward by the same amount but at most `limits.lease_step_max_ms` per entry, so a gap in commits
  (no leader, lost quorum, paused leader, a skewed clock) never counts against a lease.
- Expiry happens only here, in log order, when the lease clock passes a deadline: every replica
  expires the same sessions and attempts at the same index.
- Fencing tokens (lock grants, job attempts) come from one replicated sequence, so they strictly
  increase per resource even when one entry grants the same lock twice.
- A handler checks everything before it mutates anything, so a command that fails changes nothing.
- Every write with `(client_id, seq)` is applied at most once; a retry gets the stored result.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from xrcore import codec, commands, jobs, kv, locks, regions, sessions, tenants
from xrcore.errors import CapacityExceeded, InvalidArgument, RequestTooOld, XrError
from xrcore.limits import DEFAULT_LIMITS, Limits
from xrcore.model import (
    ClientRecord,
    DurationStats,
    Effect,
    ErrorInfo,
    KvEvent,
    Result,
    Snapshot,
)

__all__ = ["Applied", "StateMachine"]

Handler = Callable[[Any, Any, int], dict[str, Any]]

HANDLERS: dict[type[commands.Command], Handler] = {
    commands.Tick: lambda machine, command, index: {"now_ms": machine.now_ms},
    commands.KvPut: kv.put,
    commands.KvDelete: kv.delete,
    commands.SessionGrant: sessions.grant,
    commands.SessionKeepAlive: sessions.keepalive,
    commands.SessionRevoke: sessions.revoke,
    commands.LockAcquire: locks.acquire,
    commands.LockRelease: locks.release,
    commands.LockLeave: locks.leave,
    commands.LockValidate: locks.validate,
    commands.RegionRegister: regions.register,
    commands.RegionHeartbeat: regions.heartbeat,
    commands.JobSubmit: jobs.submit,
    commands.JobCancel: jobs.cancel,
    commands.TaskAssign: jobs.assign,
    commands.TaskUnassign: jobs.unassign,
    commands.TaskClaim: jobs.claim,
    commands.TaskHeartbeat: jobs.heartbeat,
    commands.TaskCheckpoint: jobs.checkpoint,
    commands.TaskComplete: jobs.complete,
    commands.TaskFail: jobs.fail,
    commands.SchedulePass: jobs.schedule_pass,
    commands.TaskYield: jobs.yield_,
    commands.TenantSet: tenants.set_,
}
assert set(HANDLERS) == set(commands.COMMAND_TYPES), "every command type needs one handler"


class Applied(msgspec.Struct, frozen=True, kw_only=True):
    """What applying one log entry did."""

    index: int
    result: Result
    effects: tuple[Effect, ...] = ()
    # True when the entry repeated an already-applied (client_id, seq): nothing was applied again.
    duplicate: bool = False


class StateMachine:
    """The replicated state. Replicas build it empty, or from a snapshot, and apply log entries."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.index = 0
        self.now_ms = 0
        self.lease_clock_ms = 0
        # The last fencing token issued (lock grants and job attempts share one sequence).
        self.fencing_token = 0
        # KV.
        self.revision = 0
        self.keys: dict[str, kv.KeyRecord] = {}
        self.sorted_keys: list[str] = []
        self.history: deque[KvEvent] = deque(maxlen=limits.watch_history_max)
        # Sessions and locks.
        self.sessions: dict[str, sessions.Session] = {}
        self.locks: dict[str, locks.Lock] = {}
        # Jobs and regions.
        self.jobs: dict[str, jobs.Job] = {}
        self.tasks_active = 0
        self.regions: dict[str, regions.Region] = {}
        # Scheduling: tenants' settings, learned run times, and the revision that every change
        # scheduling reads bumps (a pass computed from an older revision is refused).
        self.tenants: dict[str, tenants.Tenant] = {}
        self.durations: dict[str, DurationStats] = {}
        self.schedule_revision = 0
        # Exactly-once table, least recently used first.
        self.clients: dict[str, ClientRecord] = {}
        # Derived indexes (not in snapshots): deadlines to expire, lazily pruned.
        self.session_deadlines: list[tuple[int, str]] = []
        self.attempt_deadlines: list[tuple[int, str, int, int]] = []
        self.effects: list[Effect] = []

    # Applying entries.

    def apply(self, entry: bytes | codec.Envelope, index: int) -> Applied:
        """Applies the log entry at `index`. Malformed entries are rejected with a typed error in
        the result, the same way on every replica; the index still advances."""
        if index <= self.index:
            raise AssertionError(f"entry {index} applied after entry {self.index}")
        self.index = index
        self.effects = []
        try:
            envelope = entry if isinstance(entry, codec.Envelope) else codec.decode(entry)
        except XrError as error:
            return Applied(index=index, result=_failure(error))
        self._advance_time(envelope.now_ms)
        self._expire(index)
        command = envelope.command
        client_id, seq = envelope.client_id, envelope.seq
        # Commands that only read or move time have nothing to deduplicate.
        record = None
        if client_id is not None and seq is not None and command.records_result:
            try:
                record = self._client(client_id)
                stored = self._stored_result(record, seq, _type_of(command))
            except XrError as error:
                return Applied(index=index, result=_failure(error), effects=self._take_effects())
            if stored is not None:
                return Applied(
                    index=index, result=stored, effects=self._take_effects(), duplicate=True
                )
        try:
            result = Result(value=HANDLERS[type(command)](self, command, index))
        except XrError as error:
            result = _failure(error)
        if record is not None and seq is not None:
            self._store_result(record, seq, _type_of(command), result)
        return Applied(index=index, result=result, effects=self._take_effects())

    def _take_effects(self) -> tuple[Effect, ...]:
        effects, self.effects = tuple(self.effects), []
        return effects

    def _advance_time(self, proposed_ms: int) -> None:
        if proposed_ms > self.now_ms:
            step_ms = min(proposed_ms - self.now_ms, self.limits.lease_step_max_ms)
            self.lease_clock_ms += step_ms
            self.now_ms = proposed_ms

    def _expire(self, index: int) -> None:
        # A dict as an ordered set: a renewal to the same deadline leaves two equal heap entries.
        due_sessions: dict[str, None] = {}
        heap = self.session_deadlines
        while heap and heap[0][0] <= self.lease_clock_ms:
            deadline_ms, session_id = heapq.heappop(heap)
            session = self.sessions.get(session_id)
            if session is not None and session.deadline_ms == deadline_ms:
                due_sessions[session_id] = None
        if due_sessions:
            sessions.end_sessions(self, list(due_sessions), index, reason="expired")
        attempts = self.attempt_deadlines
        while attempts and attempts[0][0] <= self.lease_clock_ms:
            deadline_ms, job_id, task_index, token = heapq.heappop(attempts)
            jobs.expire_attempt(self, job_id, task_index, token, deadline_ms)

    def issue_token(self) -> int:
        """A fencing token greater than every token issued before. One entry may grant the same
        lock twice (an expiry hands it on, then the command releases it again), so tokens are a
        sequence of their own rather than the entry's index."""
        self.fencing_token += 1
        return self.fencing_token

    # Deadlines, pruned of stale entries when they grow past twice the live ones.

    def watch_session(self, deadline_ms: int, session_id: str) -> None:
        heapq.heappush(self.session_deadlines, (deadline_ms, session_id))
        if len(self.session_deadlines) > 2 * len(self.sessions) + 64:
            self.session_deadlines = [(s.deadline_ms, s.session_id) for s in self.sessions.values()]
            heapq.heapify(self.session_deadlines)

    def watch_attempt(self, deadline_ms: int, job_id: str, task_index: int, token: int) -> None:
        heapq.heappush(self.attempt_deadlines, (deadline_ms, job_id, task_index, token))
        if len(self.attempt_deadlines) > 2 * self.tasks_active + 64:
            self.attempt_deadlines = jobs.live_deadlines(self)
            heapq.heapify(self.attempt_deadlines)

    # Exactly-once table.

    def _client(self, client_id: str) -> ClientRecord:
        record = self.clients.pop(client_id, None)
        if record is None:
            self._forget_idle_clients()
            if len(self.clients) >= self.limits.clients_max:
                raise CapacityExceeded(
                    f"the table of clients is full ({self.limits.clients_max}); "
                    "retry later or reuse a client id"
                )
            tenants.check_clients(self, client_id)
            record = ClientRecord(last_seen_ms=self.lease_clock_ms)
        record.last_seen_ms = self.lease_clock_ms
        self.clients[client_id] = record  # most recently used last
        return record

    def _forget_idle_clients(self) -> None:
        horizon_ms = self.lease_clock_ms - self.limits.client_idle_ms
        while self.clients:
            client_id, oldest = next(iter(self.clients.items()))
            if oldest.last_seen_ms > horizon_ms:
                break
            del self.clients[client_id]

    def _stored_result(self, record: ClientRecord, seq: int, command_type: str) -> Result | None:
        stored = record.results.get(seq)
        if stored is not None:
            stored_type = record.command_types.get(seq, command_type)
            if stored_type != command_type:
                # A retry repeats its command; another command under a used seq is a client's
                # bug, and the stored result (of another shape) is not its answer.
                raise InvalidArgument(
                    f"seq {seq} of this client was used for a {stored_type} command, not "
                    f"{command_type}; a new request needs a new seq"
                )
            return stored
        if len(record.results) >= self.limits.results_per_client_max:
            oldest_seq = min(record.results)
            if seq < oldest_seq:
                raise RequestTooOld(
                    f"seq {seq} is older than the {len(record.results)} results kept for this "
                    "client; it may or may not have been applied"
                )
        return None

    def _store_result(
        self, record: ClientRecord, seq: int, command_type: str, result: Result
    ) -> None:
        record.results[seq] = result
        record.command_types[seq] = command_type
        while len(record.results) > self.limits.results_per_client_max:
            oldest_seq = min(record.results)
            del record.results[oldest_seq]
            record.command_types.pop(oldest_seq, None)

    # KV index upkeep shared by kv and sessions.

    def add_sorted_key(self, key: str) -> None:
        insort(self.sorted_keys, key)

    def remove_sorted_key(self, key: str) -> None:
        position = bisect_left(self.sorted_keys, key)
        assert self.sorted_keys[position] == key
        del self.sorted_keys[position]

    # Snapshots.

    def snapshot(self) -> bytes:
        return codec.encode_snapshot(
            Snapshot(
                format=codec.SNAPSHOT_FORMAT,
                limits=self.limits,
                index=self.index,
                now_ms=self.now_ms,
                lease_clock_ms=self.lease_clock_ms,
                fencing_token=self.fencing_token,
                revision=self.revision,
                keys=self.keys,
                history=list(self.history),
                sessions=self.sessions,
                locks=self.locks,
                jobs=self.jobs,
                tasks_active=self.tasks_active,
                regions=self.regions,
                clients=self.clients,
                tenants=self.tenants,
                durations=self.durations,
                schedule_revision=self.schedule_revision,
            )
        )

    @classmethod
    def restore(cls, data: bytes) -> StateMachine:
        snapshot = codec.decode_snapshot(data)
        machine = cls(snapshot.limits)
        machine.index = snapshot.index
        machine.now_ms = snapshot.now_ms
        machine.lease_clock_ms = snapshot.lease_clock_ms
        machine.fencing_token = snapshot.fencing_token
        machine.revision = snapshot.revision
        machine.keys = snapshot.keys
        machine.sorted_keys = sorted(snapshot.keys)
        machine.history.extend(snapshot.history)
        machine.sessions = snapshot.sessions
        machine.locks = snapshot.locks
        machine.jobs = snapshot.jobs
        machine.tasks_active = snapshot.tasks_active
        machine.regions = snapshot.regions
        machine.clients = snapshot.clients
        machine.tenants = snapshot.tenants
        machine.durations = snapshot.durations
        machine.schedule_revision = snapshot.schedule_revision
        machine.session_deadlines = [
            (s.deadline_ms, s.session_id) for s in snapshot.sessions.values()
        ]
        heapq.heapify(machine.session_deadlines)
        machine.attempt_deadlines = jobs.live_deadlines(machine)
        heapq.heapify(machine.attempt_deadlines)
        return machine


def _type_of(command: commands.Command) -> str:
    """The command's type tag on the wire ("kv.put")."""
    tag = type(command).__struct_config__.tag
    assert isinstance(tag, str), f"{type(command).__name__} has no string tag"
    return tag


def _failure(error: XrError) -> Result:
    return Result(error=ErrorInfo(code=error.code, message=error.message))
