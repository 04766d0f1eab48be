"""Property tests of the replicated state machine against a deliberately simple reference model.

What they prove, for random programs of KV, session, lock, job and retry commands driven through
encoded log entries with a simulated proposer clock that pauses, jumps and goes backwards:
- Every result, error code and effect is the one a plain reference model predicts: the model keeps
  dicts and lists, scans them instead of keeping heaps, and moves its lease clock by
  min(delta, lease_step_max_ms) only when the proposed time passes the maximum seen.
- Locks have one holder, are granted in FIFO order with fencing tokens that strictly increase per
  lock name over the whole run, and are never held or awaited by a session that has ended.
- A task has at most one live attempt, completes at most once and never changes after success;
  an update with a stale token is rejected and changes nothing.
- Replicated time and the lease clock never go back; a failed command that moves no time changes
  nothing; a retried (client_id, seq) whose result is still kept is never applied twice.
- Determinism: the same encoded log gives byte-identical results and snapshots on fresh replicas,
  also on a replica that restores itself from its own snapshot at random points.

The stateful tests share the model, the checks and the invariants and differ in their rules:
sessions and locks; sessions and keys; jobs; and everything in one log. Run with
--hypothesis-show-statistics to see which outcomes and effects the rules reach.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, TypeVar

import msgspec
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from xrcore import Applied, Effect, Envelope, Result, StateMachine, TaskState, codec, encode, errors
from xrcore.commands import (
    Command,
    JobCancel,
    JobSpec,
    JobSubmit,
    KvDelete,
    KvPut,
    LockAcquire,
    LockLeave,
    LockRelease,
    LockValidate,
    RegionRegister,
    SessionGrant,
    SessionKeepAlive,
    SessionRevoke,
    TaskAssign,
    TaskCheckpoint,
    TaskClaim,
    TaskComplete,
    TaskFail,
    TaskHeartbeat,
    TaskUnassign,
    Tick,
)
from xrcore.limits import Limits
from xrcore.model import Snapshot

from .helpers import START_MS, Driver

# Small capacities, so that a run of a few dozen commands fills every table and queue.
LIMITS = Limits(
    lease_step_max_ms=1_000,
    sessions_max=5,
    locks_max=2,
    lock_waiters_max=2,
    locks_per_session_max=2,
    keys_max=4,
    keys_per_session_max=2,
    watch_history_max=8,
    jobs_max=3,
    tasks_active_max=4,
    attempts_total_max=3,
    regions_max=2,
    clients_max=2,
    results_per_client_max=3,
    client_idle_ms=5_000,
)

KEYS = ("a", "b", "c", "d", "e")
LOCK_NAMES = ("L1", "L2", "L3")
REGION_NAMES = ("r1", "r2", "r3")
CLIENT_IDS = ("c1", "c2", "c3")
SESSION_TTLS_MS = (1_000, 3_000, 10_000)
ATTEMPT_TTLS_MS = (1_000, 3_000)
# A session and a job id that no entry ever creates (ids come from log indexes, which start at 1).
UNKNOWN_SESSION_ID = "s0"
UNKNOWN_JOB_ID = "job-0"

# Most entries move no time, so commands meet each other at one lease clock reading; the others
# step below, at and above lease_step_max_ms, jump far ahead, or come from a proposer whose clock
# is behind the replicated time.
advances_ms = st.one_of(
    st.just(0),
    st.sampled_from((1, 400, 999, 1_000, 1_001, 2_500, 60_000, -700, -5_000)),
)
client_ids = st.none() | st.sampled_from(CLIENT_IDS)
values = st.sampled_from((b"", b"x", b"yy"))
expectations = st.sampled_from(("none", "absent", "current", "wrong"))

# The kinds of update an executor sends about an attempt, built from a token.
UPDATE_KINDS = ("heartbeat", "checkpoint", "complete", "fail")
TASK_ACTIONS = ("assign", "unassign", "claim", "cancel", *UPDATE_KINDS)
# The states a task goes through on its way to success, in order.
STATE_ORDER = (TaskState.PENDING, TaskState.ASSIGNED, TaskState.RUNNING, TaskState.SUCCEEDED)


def build_update(
    kind: str, job_id: str, task_index: int, token: int, *, step: int = 1, retryable: bool = True
) -> Command:
    if kind == "heartbeat":
        return TaskHeartbeat(job_id=job_id, task_index=task_index, token=token, done=step)
    if kind == "checkpoint":
        return TaskCheckpoint(
            job_id=job_id,
            task_index=task_index,
            token=token,
            step=step,
            uri=f"mem://{job_id}/{task_index}/{step}",
            checksum="sum",
            size_bytes=1,
        )
    if kind == "complete":
        return TaskComplete(job_id=job_id, task_index=task_index, token=token)
    return TaskFail(
        job_id=job_id, task_index=task_index, token=token, error="boom", retryable=retryable
    )


def build_task_command(
    action: str, job_id: str, task_index: int, token: int, *, step: int = 1
) -> Command:
    """Any command about one task: an update with `token`, or a step of its placement."""
    if action == "assign":
        return TaskAssign(job_id=job_id, task_index=task_index, region="r1")
    if action == "unassign":
        return TaskUnassign(job_id=job_id, task_index=task_index)
    if action == "claim":
        return TaskClaim(
            job_id=job_id,
            task_index=task_index,
            region="r1",
            executor_id="executor",
            lease_ttl_ms=ATTEMPT_TTLS_MS[0],
        )
    if action == "cancel":
        return JobCancel(job_id=job_id)
    return build_update(action, job_id, task_index, token, step=step)


# What the model predicts for the token of a new grant; no real token is negative.
NEW_TOKEN = -1


def command_tag(command: Command) -> str:
    tag: Any = type(command).__struct_config__.tag
    return str(tag)


def grant_of(command: Command) -> tuple[str, ...]:
    """What a command that may create a grant is about, to tell its grant from others."""
    if isinstance(command, LockAcquire):
        return ("lock", command.name, command.session_id)
    if isinstance(command, TaskClaim):
        return ("task", command.job_id, str(command.task_index))
    return (command_tag(command),)


def effect_order(effect: Effect) -> tuple[Any, ...]:
    return msgspec.structs.astuple(effect)


def state_without_index(machine: StateMachine) -> bytes:
    """The snapshot with the log index and the exactly-once table blanked out: what a command that
    changes nothing must leave as it was (every entry advances the index, and a retry moves its
    client to the most recently used end of the table)."""
    snapshot: Snapshot = codec.decode_snapshot(machine.snapshot())
    snapshot.index = 0
    snapshot.clients = {}
    return codec.encode_snapshot(snapshot)


def machine_view(machine: StateMachine) -> dict[str, Any]:
    """The parts of the machine's state that the model predicts, in the model's terms."""
    return {
        "clocks_ms": (machine.now_ms, machine.lease_clock_ms),
        "revision": machine.revision,
        "keys": {
            key: (
                record.value,
                record.create_revision,
                record.mod_revision,
                record.version,
                record.session_id,
            )
            for key, record in machine.keys.items()
        },
        "sessions": {
            session_id: (
                session.ttl_ms,
                session.deadline_ms,
                sorted(session.locks),
                sorted(session.keys),
            )
            for session_id, session in machine.sessions.items()
        },
        "locks": {
            name: (lock.holder, lock.token, lock.waiters) for name, lock in machine.locks.items()
        },
        "jobs": [
            (
                job_id,
                [
                    (
                        task.state,
                        task.region,
                        task.failures,
                        [attempt.token for attempt in task.attempts],
                        None if task.checkpoint is None else task.checkpoint.step,
                    )
                    for task in job.tasks
                ],
            )
            for job_id, job in machine.jobs.items()
        ],
        "tasks_active": machine.tasks_active,
        "clients": [
            (client_id, record.last_seen_ms, sorted(record.results))
            for client_id, record in machine.clients.items()
        ],
    }


# The reference model.


class Rejected(Exception):
    """The model's prediction that a command fails with the error `code`."""

    def __init__(self, error: type[errors.XrError]) -> None:
        super().__init__(error.code)
        self.code = error.code


@dataclass
class ModelKey:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    session_id: str | None


@dataclass
class ModelSession:
    ttl_ms: int
    deadline_ms: int


@dataclass
class ModelLock:
    holder: str
    token: int
    # The FIFO queue: the first waiter is the next holder.
    waiters: list[str] = field(default_factory=list)


@dataclass
class ModelTask:
    state: TaskState = TaskState.PENDING
    region: str | None = None
    # One token per attempt, oldest first; the last is live while the task is running.
    tokens: list[int] = field(default_factory=list)
    lease_ttl_ms: int = 0
    deadline_ms: int = 0
    failures: int = 0
    checkpoint_step: int | None = None


@dataclass
class ModelJob:
    max_attempts: int
    regions_deny: tuple[str, ...]
    tasks: list[ModelTask]

    def finished(self) -> bool:
        return all(task.state.terminal for task in self.tasks)


@dataclass
class ModelClient:
    last_seen_ms: int
    # Kept results by seq; the test stores the machine's own result, which a retry must repeat.
    results: dict[int, Result] = field(default_factory=dict)


@dataclass
class Prediction:
    """What the model expects one entry to do."""

    effects: list[Effect]
    error_code: str | None = None
    # Fields the result's value must contain, with these values.
    value: dict[str, Any] = field(default_factory=dict)
    duplicate: bool = False
    stored: Result | None = None
    # Whether the machine keeps this entry's result for its (client_id, seq).
    records: bool = False


class Model:
    """The replicated state, kept the plainest way: no heaps and no indexes, nothing kept that
    can be derived by scanning, and expiry by scanning every deadline."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.now_ms = 0
        self.lease_clock_ms = 0
        self.revision = 0
        # The highest fencing token the machine has issued so far (see `issue_token`).
        self.highest_token = 0
        self.keys: dict[str, ModelKey] = {}
        self.sessions: dict[str, ModelSession] = {}
        self.locks: dict[str, ModelLock] = {}
        self.regions: list[str] = []
        self.jobs: dict[str, ModelJob] = {}
        # Least recently used first, as in the machine.
        self.clients: dict[str, ModelClient] = {}
        self.effects: list[Effect] = []

    def issue_token(self) -> int:
        """A placeholder for the token of a new grant. The model does not predict its number:
        when one entry grants several locks, the order in which the machine numbers them is
        its own business. The test checks that each is new, then adopts the machine's numbers
        (see `MachineTest.check_new_tokens` and `adopt_tokens`)."""
        return NEW_TOKEN

    def adopt_tokens(self, machine: StateMachine) -> None:
        """Takes the numbers the machine gave the grants of the entry just applied."""
        for name, lock in self.locks.items():
            if lock.token == NEW_TOKEN:
                assert name in machine.locks, name
                lock.token = machine.locks[name].token
        for job_id, job in self.jobs.items():
            for task_index, task in enumerate(job.tasks):
                if task.tokens and task.tokens[-1] == NEW_TOKEN:
                    task.tokens[-1] = machine.jobs[job_id].tasks[task_index].attempts[-1].token

    # Derived views.

    def session_keys(self, session_id: str) -> list[str]:
        return sorted(key for key, record in self.keys.items() if record.session_id == session_id)

    def session_locks(self, session_id: str) -> list[str]:
        return sorted(
            name
            for name, lock in self.locks.items()
            if lock.holder == session_id or session_id in lock.waiters
        )

    def tasks_active(self) -> int:
        return sum(not task.state.terminal for job in self.jobs.values() for task in job.tasks)

    def view(self) -> dict[str, Any]:
        """The model's state in the form of `machine_view`."""
        return {
            "clocks_ms": (self.now_ms, self.lease_clock_ms),
            "revision": self.revision,
            "keys": {
                key: (
                    record.value,
                    record.create_revision,
                    record.mod_revision,
                    record.version,
                    record.session_id,
                )
                for key, record in self.keys.items()
            },
            "sessions": {
                session_id: (
                    session.ttl_ms,
                    session.deadline_ms,
                    self.session_locks(session_id),
                    self.session_keys(session_id),
                )
                for session_id, session in self.sessions.items()
            },
            "locks": {
                name: (lock.holder, lock.token, lock.waiters) for name, lock in self.locks.items()
            },
            "jobs": [
                (
                    job_id,
                    [
                        (task.state, task.region, task.failures, task.tokens, task.checkpoint_step)
                        for task in job.tasks
                    ],
                )
                for job_id, job in self.jobs.items()
            ],
            "tasks_active": self.tasks_active(),
            "clients": [
                (client_id, record.last_seen_ms, sorted(record.results))
                for client_id, record in self.clients.items()
            ],
        }

    # Applying one entry.

    def apply(
        self,
        command: Command,
        *,
        proposed_ms: int,
        index: int,
        client_id: str | None,
        seq: int | None,
    ) -> Prediction:
        self.effects = []
        prediction = Prediction(effects=self.effects)
        if proposed_ms > self.now_ms:
            self.lease_clock_ms += min(proposed_ms - self.now_ms, self.limits.lease_step_max_ms)
            self.now_ms = proposed_ms
        self.expire(index)
        if client_id is not None and seq is not None and command.records_result:
            try:
                stored = self.check_client(client_id, seq)
            except Rejected as rejection:
                prediction.error_code = rejection.code
                return prediction
            if stored is not None:
                prediction.duplicate = True
                prediction.stored = stored
                return prediction
            prediction.records = True
        try:
            prediction.value = MODEL_HANDLERS[type(command)](self, command, index)
        except Rejected as rejection:
            prediction.error_code = rejection.code
        return prediction

    def expire(self, index: int) -> None:
        due = [
            session_id
            for session_id, session in self.sessions.items()
            if session.deadline_ms <= self.lease_clock_ms
        ]
        if due:
            self.end_sessions(due, index, reason="expired")
        for job_id, job in self.jobs.items():
            for task_index, task in enumerate(job.tasks):
                if task.state is TaskState.RUNNING and task.deadline_ms <= self.lease_clock_ms:
                    self.end_attempt(job_id, task_index, task, "lease_expired")
                    exhausted = len(task.tokens) >= self.limits.attempts_total_max
                    self.move(task, TaskState.FAILED if exhausted else TaskState.PENDING)

    def end_sessions(self, session_ids: list[str], index: int, *, reason: str) -> None:
        ending = {session_id: self.sessions.pop(session_id) for session_id in session_ids}
        # Every ending session leaves every queue before any lock is handed on.
        for lock in self.locks.values():
            lock.waiters = [waiter for waiter in lock.waiters if waiter not in ending]
        for name in [name for name, lock in self.locks.items() if lock.holder in ending]:
            self.hand_on(name, index)
        for key in [key for key, record in self.keys.items() if record.session_id in ending]:
            del self.keys[key]
            self.revision += 1
        for session_id in ending:
            self.effects.append(Effect(kind="session.ended", session_id=session_id, reason=reason))

    def hand_on(self, name: str, index: int) -> None:
        lock = self.locks[name]
        if not lock.waiters:
            del self.locks[name]
            return
        lock.holder = lock.waiters.pop(0)
        lock.token = self.issue_token()
        self.effects.append(
            Effect(kind="lock.granted", name=name, session_id=lock.holder, token=lock.token)
        )

    def check_client(self, client_id: str, seq: int) -> Result | None:
        record = self.clients.pop(client_id, None)
        if record is None:
            horizon_ms = self.lease_clock_ms - self.limits.client_idle_ms
            for idle_id in [
                other for other, kept in self.clients.items() if kept.last_seen_ms <= horizon_ms
            ]:
                del self.clients[idle_id]
            if len(self.clients) >= self.limits.clients_max:
                raise Rejected(errors.CapacityExceeded)
            record = ModelClient(last_seen_ms=self.lease_clock_ms)
        record.last_seen_ms = self.lease_clock_ms
        self.clients[client_id] = record
        if seq in record.results:
            return record.results[seq]
        full = len(record.results) >= self.limits.results_per_client_max
        if full and seq < min(record.results):
            raise Rejected(errors.RequestTooOld)
        return None

    def store_result(self, client_id: str, seq: int, result: Result) -> None:
        results = self.clients[client_id].results
        results[seq] = result
        while len(results) > self.limits.results_per_client_max:
            del results[min(results)]

    # KV.

    def compare(self, key: str, expected_mod_revision: int | None) -> None:
        record = self.keys.get(key)
        actual = 0 if record is None else record.mod_revision
        if expected_mod_revision is not None and actual != expected_mod_revision:
            raise Rejected(errors.CompareFailed)

    def put(self, command: KvPut, index: int) -> dict[str, Any]:
        record = self.keys.get(command.key)
        self.compare(command.key, command.expected_mod_revision)
        session_id = command.session_id
        if session_id is not None:
            if session_id not in self.sessions:
                raise Rejected(errors.NotFound)
            attached = record is not None and record.session_id == session_id
            full = len(self.session_keys(session_id)) >= self.limits.keys_per_session_max
            if not attached and full:
                raise Rejected(errors.CapacityExceeded)
        if record is None and len(self.keys) >= self.limits.keys_max:
            raise Rejected(errors.CapacityExceeded)
        self.revision += 1
        previous = 0 if record is None else record.mod_revision
        if record is None:
            record = ModelKey(command.value, self.revision, self.revision, 0, session_id)
            self.keys[command.key] = record
        record.value = command.value
        record.mod_revision = self.revision
        record.version += 1
        record.session_id = session_id
        return {
            "revision": self.revision,
            "previous_mod_revision": previous,
            "version": record.version,
        }

    def delete(self, command: KvDelete, index: int) -> dict[str, Any]:
        self.compare(command.key, command.expected_mod_revision)
        if command.key not in self.keys:
            return {"deleted": 0, "revision": self.revision}
        del self.keys[command.key]
        self.revision += 1
        return {"deleted": 1, "revision": self.revision}

    # Sessions.

    def grant(self, command: SessionGrant, index: int) -> dict[str, Any]:
        if len(self.sessions) >= self.limits.sessions_max:
            raise Rejected(errors.CapacityExceeded)
        session_id = f"s{index}"
        deadline_ms = self.lease_clock_ms + command.ttl_ms
        self.sessions[session_id] = ModelSession(ttl_ms=command.ttl_ms, deadline_ms=deadline_ms)
        return {"session_id": session_id, "remaining_ms": command.ttl_ms}

    def live_session(self, session_id: str) -> ModelSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise Rejected(errors.NotFound)
        return session

    def keepalive(self, command: SessionKeepAlive, index: int) -> dict[str, Any]:
        session = self.live_session(command.session_id)
        session.deadline_ms = self.lease_clock_ms + session.ttl_ms
        return {"session_id": command.session_id, "remaining_ms": session.ttl_ms}

    def revoke(self, command: SessionRevoke, index: int) -> dict[str, Any]:
        self.live_session(command.session_id)
        self.end_sessions([command.session_id], index, reason="revoked")
        return {"session_id": command.session_id, "revoked": True}

    # Locks.

    def acquire(self, command: LockAcquire, index: int) -> dict[str, Any]:
        session_id = command.session_id
        self.live_session(session_id)
        session_full = len(self.session_locks(session_id)) >= self.limits.locks_per_session_max
        lock = self.locks.get(command.name)
        if lock is None:
            if session_full or len(self.locks) >= self.limits.locks_max:
                raise Rejected(errors.CapacityExceeded)
            token = self.issue_token()
            self.locks[command.name] = ModelLock(holder=session_id, token=token)
            return {"granted": True, "token": token, "holder": session_id}
        if lock.holder == session_id:
            return {"granted": True, "token": lock.token, "holder": session_id}
        if session_id in lock.waiters:
            return {
                "granted": False,
                "queued": True,
                "position": lock.waiters.index(session_id) + 1,
            }
        if not command.wait:
            return {"granted": False, "queued": False, "holder": lock.holder}
        if session_full or len(lock.waiters) >= self.limits.lock_waiters_max:
            raise Rejected(errors.CapacityExceeded)
        lock.waiters.append(session_id)
        return {"granted": False, "queued": True, "position": len(lock.waiters)}

    def release(self, command: LockRelease, index: int) -> dict[str, Any]:
        lock = self.locks.get(command.name)
        if lock is None or command.session_id not in self.sessions:
            raise Rejected(errors.LockNotHeld)
        if lock.holder == command.session_id:
            self.hand_on(command.name, index)
            return {"released": True}
        if command.session_id in lock.waiters:
            lock.waiters.remove(command.session_id)
            return {"released": False, "left_queue": True}
        raise Rejected(errors.LockNotHeld)

    def leave(self, command: LockLeave, index: int) -> dict[str, Any]:
        lock = self.locks.get(command.name)
        if (
            lock is not None
            and command.session_id in self.sessions
            and command.session_id in lock.waiters
        ):
            lock.waiters.remove(command.session_id)
            return {"left_queue": True}
        if lock is not None and lock.holder == command.session_id:
            return {"left_queue": False, "granted": True, "token": lock.token}
        return {"left_queue": False, "granted": False}

    def validate(self, command: LockValidate, index: int) -> dict[str, Any]:
        lock = self.locks.get(command.name)
        current = None if lock is None else lock.token
        return {"valid": current == command.token, "current_token": current}

    # Regions.

    def register(self, command: RegionRegister, index: int) -> dict[str, Any]:
        created = command.name not in self.regions
        if created and len(self.regions) >= self.limits.regions_max:
            raise Rejected(errors.CapacityExceeded)
        if created:
            self.regions.append(command.name)
        return {"created": created}

    # Jobs.

    def move(self, task: ModelTask, state: TaskState) -> None:
        task.state = state
        if state in (TaskState.PENDING, TaskState.CANCELLED):
            task.region = None

    def end_attempt(self, job_id: str, task_index: int, task: ModelTask, outcome: str) -> None:
        self.effects.append(
            Effect(
                kind="attempt.ended",
                job_id=job_id,
                task_index=task_index,
                token=task.tokens[-1],
                reason=outcome,
            )
        )

    def task(self, job_id: str, task_index: int) -> tuple[ModelJob, ModelTask]:
        job = self.jobs.get(job_id)
        if job is None or task_index >= len(job.tasks):
            raise Rejected(errors.NotFound)
        return job, job.tasks[task_index]

    def live(self, job_id: str, task_index: int, token: int) -> tuple[ModelJob, ModelTask]:
        job, task = self.task(job_id, task_index)
        if task.state is not TaskState.RUNNING or task.tokens[-1] != token:
            raise Rejected(errors.StaleToken)
        return job, task

    def submit(self, command: JobSubmit, index: int) -> dict[str, Any]:
        spec = command.spec
        if self.tasks_active() + spec.array_size > self.limits.tasks_active_max:
            raise Rejected(errors.CapacityExceeded)
        if len(self.jobs) >= self.limits.jobs_max:
            finished = [job_id for job_id, job in self.jobs.items() if job.finished()]
            if not finished:
                raise Rejected(errors.CapacityExceeded)
            del self.jobs[finished[0]]
        job_id = f"job-{index}"
        self.jobs[job_id] = ModelJob(
            max_attempts=spec.max_attempts,
            regions_deny=spec.regions_deny,
            tasks=[ModelTask() for _ in range(spec.array_size)],
        )
        return {"job_id": job_id, "tasks": spec.array_size}

    def cancel(self, command: JobCancel, index: int) -> dict[str, Any]:
        job = self.jobs.get(command.job_id)
        if job is None:
            raise Rejected(errors.NotFound)
        if job.finished():
            raise Rejected(errors.InvalidTransition)
        cancelled = 0
        for task_index, task in enumerate(job.tasks):
            if task.state.terminal:
                continue
            if task.state is TaskState.RUNNING:
                self.end_attempt(command.job_id, task_index, task, "cancelled")
            self.move(task, TaskState.CANCELLED)
            cancelled += 1
        return {"cancelled_tasks": cancelled}

    def assign(self, command: TaskAssign, index: int) -> dict[str, Any]:
        job, task = self.task(command.job_id, command.task_index)
        if command.region not in self.regions:
            raise Rejected(errors.NotFound)
        if command.region in job.regions_deny:
            raise Rejected(errors.InvalidArgument)
        if task.state is not TaskState.PENDING:
            raise Rejected(errors.InvalidTransition)
        self.move(task, TaskState.ASSIGNED)
        task.region = command.region
        return {"region": command.region}

    def unassign(self, command: TaskUnassign, index: int) -> dict[str, Any]:
        _, task = self.task(command.job_id, command.task_index)
        if task.state is not TaskState.ASSIGNED:
            raise Rejected(errors.InvalidTransition)
        self.move(task, TaskState.PENDING)
        return {"task_index": command.task_index}

    def claim(self, command: TaskClaim, index: int) -> dict[str, Any]:
        _, task = self.task(command.job_id, command.task_index)
        if task.state is not TaskState.ASSIGNED or task.region != command.region:
            raise Rejected(errors.InvalidTransition)
        token = self.issue_token()
        task.tokens.append(token)
        task.lease_ttl_ms = command.lease_ttl_ms
        task.deadline_ms = self.lease_clock_ms + command.lease_ttl_ms
        self.move(task, TaskState.RUNNING)
        return {"token": token, "attempt": len(task.tokens)}

    def heartbeat(self, command: TaskHeartbeat, index: int) -> dict[str, Any]:
        _, task = self.live(command.job_id, command.task_index, command.token)
        task.deadline_ms = self.lease_clock_ms + task.lease_ttl_ms
        return {"token": command.token}

    def checkpoint(self, command: TaskCheckpoint, index: int) -> dict[str, Any]:
        _, task = self.live(command.job_id, command.task_index, command.token)
        if task.checkpoint_step is not None and command.step <= task.checkpoint_step:
            raise Rejected(errors.CheckpointNotNewer)
        task.checkpoint_step = command.step
        return {"step": command.step}

    def complete(self, command: TaskComplete, index: int) -> dict[str, Any]:
        _, task = self.live(command.job_id, command.task_index, command.token)
        self.end_attempt(command.job_id, command.task_index, task, "succeeded")
        self.move(task, TaskState.SUCCEEDED)
        return {"state": "succeeded"}

    def fail(self, command: TaskFail, index: int) -> dict[str, Any]:
        job, task = self.live(command.job_id, command.task_index, command.token)
        task.failures += 1
        retry = (
            command.retryable
            and task.failures < job.max_attempts
            and len(task.tokens) < self.limits.attempts_total_max
        )
        self.end_attempt(command.job_id, command.task_index, task, "failed")
        self.move(task, TaskState.PENDING if retry else TaskState.FAILED)
        return {"state": task.state.value, "retrying": retry}

    def tick(self, command: Tick, index: int) -> dict[str, Any]:
        return {"now_ms": self.now_ms}


ModelHandler = Callable[[Model, Any, int], dict[str, Any]]

MODEL_HANDLERS: dict[type[Command], ModelHandler] = {
    Tick: Model.tick,
    KvPut: Model.put,
    KvDelete: Model.delete,
    SessionGrant: Model.grant,
    SessionKeepAlive: Model.keepalive,
    SessionRevoke: Model.revoke,
    LockAcquire: Model.acquire,
    LockRelease: Model.release,
    LockLeave: Model.leave,
    LockValidate: Model.validate,
    RegionRegister: Model.register,
    JobSubmit: Model.submit,
    JobCancel: Model.cancel,
    TaskAssign: Model.assign,
    TaskUnassign: Model.unassign,
    TaskClaim: Model.claim,
    TaskHeartbeat: Model.heartbeat,
    TaskCheckpoint: Model.checkpoint,
    TaskComplete: Model.complete,
    TaskFail: Model.fail,
}


def register_region(name: str) -> RegionRegister:
    return RegionRegister(name=name, http_address=f"http://{name}", raft_address=f"{name}:7000")


def job_spec(*, array_size: int, max_attempts: int, deny_r2: bool) -> JobSpec:
    return JobSpec(
        name="job",
        workload="sleep",
        array_size=array_size,
        max_attempts=max_attempts,
        regions_deny=("r2",) if deny_r2 else (),
    )


# The stateful tests.

T = TypeVar("T")


def prefer(data: st.DataObject, preferred: Sequence[T], anything: Sequence[T]) -> T:
    """Most often one of `preferred` (which may be empty), otherwise one of `anything`; shrinks
    towards `preferred`."""
    if preferred and data.draw(st.integers(0, 3), label="3 picks from anything") < 3:
        return data.draw(st.sampled_from(preferred))
    return data.draw(st.sampled_from(anything))


@dataclass(frozen=True)
class Request:
    """A command sent with a request id, kept so that a rule can send it again."""

    command: Command
    client_id: str
    seq: int


class MachineTest(RuleBasedStateMachine):
    """Drives one StateMachine and the model with the same entries, compares every result, and
    checks the invariants. Rules live in the subclasses below, so that each test combines the
    rules of a few concepts and meets their interesting interleavings often.

    Hypothesis leaves a random subset of the rules out of each run (swarm testing), so a chain
    such as submit, assign, claim, complete rarely happens by chance; `move_a_task_on` and
    `contend_for_a_lock` take the usual next step themselves, and other rules draw what they
    refer to mostly from what is alive (see `prefer`)."""

    def __init__(self) -> None:
        super().__init__()
        self.driver = Driver(LIMITS)
        self.model = Model(LIMITS)
        # Applies the same encoded entries and is never restored from a snapshot, unlike the
        # driver's machine (see `restore_from_snapshot`): the two must stay byte-identical.
        self.replica = StateMachine(LIMITS)
        self.session_ids: list[str] = [UNKNOWN_SESSION_ID]
        self.job_ids: list[str] = [UNKNOWN_JOB_ID]
        self.next_seq = dict.fromkeys(CLIENT_IDS, 1)
        self.requests: list[Request] = []
        # Every grant observed, per lock name, in log order.
        self.grants: dict[str, list[tuple[int, str]]] = {}
        # Successful TaskComplete results per task, and each succeeded task as first seen.
        self.completions: dict[tuple[str, int], int] = {}
        self.succeeded: dict[tuple[str, int], bytes] = {}
        self.now_ms_seen = 0
        self.lease_clock_ms_seen = 0

    # Sending entries.

    def send(
        self,
        command: Command,
        *,
        advance_ms: int = 0,
        client_id: str | None = None,
        seq: int | None = None,
    ) -> Applied:
        """Applies one entry to the machine and the model and checks that the machine did what
        the model predicted. A new request from a client gets the client's next seq."""
        if client_id is not None and seq is None:
            seq = self.next_seq[client_id]
            self.next_seq[client_id] += 1
            self.requests.append(Request(command=command, client_id=client_id, seq=seq))
        machine = self.driver.machine
        proposed_ms = self.driver.now_ms + advance_ms
        # Without time moving nothing expires, so a rejected command, a read and a retry must
        # leave the state exactly as it was.
        before = None if proposed_ms > machine.now_ms else state_without_index(machine)
        queues_before = {name: list(lock.waiters) for name, lock in machine.locks.items()}
        prediction = self.model.apply(
            command,
            proposed_ms=proposed_ms,
            index=self.driver.index + 1,
            client_id=client_id,
            seq=seq,
        )
        applied = self.driver.apply(command, advance_ms=advance_ms, client_id=client_id, seq=seq)
        replica_applied = self.replica.apply(self.driver.log[-1], self.driver.index)
        assert msgspec.msgpack.encode(replica_applied) == msgspec.msgpack.encode(applied)
        new_tokens = self.check_prediction(command, applied, prediction)
        self.model.highest_token = max([self.model.highest_token, *new_tokens])
        self.model.adopt_tokens(self.driver.machine)
        if prediction.records and client_id is not None and seq is not None:
            self.model.store_result(client_id, seq, applied.result)
        self.observe(command, applied, queues_before)
        read_only = isinstance(command, LockValidate | Tick)
        unchanged = applied.duplicate or read_only or applied.result.error is not None
        if before is not None and unchanged:
            assert state_without_index(self.driver.machine) == before, command
        return applied

    def check_prediction(
        self, command: Command, applied: Applied, prediction: Prediction
    ) -> list[int]:
        """Checks that the machine did what the model predicted; returns the tokens of the new
        grants of this entry."""
        result = applied.result
        code = None if result.error is None else result.error.code
        # Events show, with --hypothesis-show-statistics, which outcomes the rules reach.
        event(
            f"{command_tag(command)}: {code or 'ok'}{' (duplicate)' if applied.duplicate else ''}"
        )
        for effect in applied.effects:
            event(f"effect {effect.kind} {effect.reason}")
        assert applied.duplicate == prediction.duplicate, (applied, prediction)
        new_tokens: dict[int, tuple[str, ...]] = {}
        effects = []
        for effect in applied.effects:
            if effect.kind == "lock.granted":
                grant = ("lock", effect.name, effect.session_id)
                self.check_new_token(new_tokens, effect.token, grant)
                effect = msgspec.structs.replace(effect, token=NEW_TOKEN)
            effects.append(effect)
        actual_effects = sorted(effects, key=effect_order)
        assert actual_effects == sorted(prediction.effects, key=effect_order), (applied, prediction)
        if prediction.duplicate:
            assert result == prediction.stored, (applied, prediction)
            return list(new_tokens)
        assert code == prediction.error_code, (applied, prediction)
        if result.value is None:
            return list(new_tokens)
        actual = {name: result.value.get(name) for name in prediction.value}
        for name, expected in prediction.value.items():
            if expected != NEW_TOKEN:
                continue
            actual[name] = NEW_TOKEN
            if name == "token":
                self.check_new_token(new_tokens, result.value[name], grant_of(command))
            else:
                # Another view of a grant of this entry, such as a lock's current token.
                assert result.value[name] in new_tokens, (name, applied, new_tokens)
        assert actual == prediction.value, (applied, prediction)
        return list(new_tokens)

    def check_new_token(
        self, new_tokens: dict[int, tuple[str, ...]], token: int, grant: tuple[str, ...]
    ) -> None:
        """A grant's token is greater than every token issued before this entry, and no other
        grant of this entry has it (one grant may be reported twice: in an effect and in the
        result of its holder asking again)."""
        assert token > self.model.highest_token, (token, grant, self.model.highest_token)
        assert new_tokens.setdefault(token, grant) == grant, (token, grant, new_tokens)

    def observe(
        self, command: Command, applied: Applied, queues_before: dict[str, list[str]]
    ) -> None:
        sessions = self.driver.machine.sessions
        queues = {name: list(waiters) for name, waiters in queues_before.items()}
        for effect in applied.effects:
            if effect.kind != "lock.granted":
                continue
            self.record_grant(effect.name, effect.token, effect.session_id)
            # FIFO: a lock handed on goes to a waiter from before this entry (nobody joins a
            # queue and is handed the lock in one entry), and every waiter it passes over ended
            # in this entry. The new holder may itself end later in the same entry.
            queue = queues[effect.name]
            assert effect.session_id in queue, (effect, queues_before)
            passed_over = queue[: queue.index(effect.session_id)]
            assert not any(waiter in sessions for waiter in passed_over), (effect, queues_before)
            del queue[: len(passed_over) + 1]
        # A retry repeats an old result, whose grant may since have passed to someone else.
        value = applied.result.value
        if applied.duplicate or value is None:
            return
        if isinstance(command, LockAcquire) and value["granted"]:
            self.record_grant(command.name, value["token"], command.session_id)
        if isinstance(command, TaskComplete):
            task = (command.job_id, command.task_index)
            self.completions[task] = self.completions.get(task, 0) + 1

    def record_grant(self, name: str, token: int, session_id: str) -> None:
        grants = self.grants.setdefault(name, [])
        # The holder asking again is told its own grant: that is not a new grant.
        if not grants or grants[-1] != (token, session_id):
            grants.append((token, session_id))

    # What commands refer to.

    def draw_session(self, data: st.DataObject) -> str:
        """Most often a live session; otherwise one that ended, or one that never existed."""
        return prefer(data, list(self.model.sessions), self.session_ids)

    def draw_task(self, data: st.DataObject, *states: TaskState) -> tuple[str, int]:
        """Most often a task in one of `states`; otherwise any task of any job ever submitted,
        an index past the end of its job, or a job that never existed."""
        preferred = [
            (job_id, task_index)
            for job_id, job in self.model.jobs.items()
            for task_index, task in enumerate(job.tasks)
            if task.state in states
        ]
        anything = [(job_id, task_index) for job_id in self.job_ids for task_index in range(3)]
        return prefer(data, preferred, anything)

    def ticks_until_due(self, deadline_ms: int) -> int:
        """Sends ticks until the lease clock is one entry short of `deadline_ms`; returns the
        advance that makes the next entry reach it exactly, so that something expires in the
        same entry as a command about it."""
        step_ms = LIMITS.lease_step_max_ms
        # A lease is at most SESSION_TTLS_MS[-1] long: this sends at most ten ticks.
        while deadline_ms - self.model.lease_clock_ms > step_ms:
            self.send(Tick(), advance_ms=self.model.now_ms - self.driver.now_ms + step_ms)
        return self.model.now_ms - self.driver.now_ms + deadline_ms - self.model.lease_clock_ms

    def token_for(self, job_id: str, task_index: int) -> int:
        """The live token when there is one, else the newest token the task had, else 1."""
        job = self.model.jobs.get(job_id)
        if job is None or task_index >= len(job.tasks) or not job.tasks[task_index].tokens:
            return 1
        return job.tasks[task_index].tokens[-1]

    # Rules every test has.

    @initialize()
    def register_first_region(self) -> None:
        self.send(register_region("r1"))

    @rule(advance_ms=advances_ms)
    def tick(self, advance_ms: int) -> None:
        self.send(Tick(), advance_ms=advance_ms)

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data(), advance_ms=advances_ms)
    def retry_request(self, data: st.DataObject, advance_ms: int) -> None:
        # Recent requests most often: the results of older ones are forgotten by design.
        request = prefer(data, self.requests[-3:], self.requests)
        kept = self.model.clients.get(request.client_id)
        was_kept = kept is not None and request.seq in kept.results
        applied = self.send(
            request.command,
            advance_ms=advance_ms,
            client_id=request.client_id,
            seq=request.seq,
        )
        # A result still kept for this (client_id, seq) is answered again, never applied again.
        if was_kept:
            assert applied.duplicate, request

    @rule()
    def restore_from_snapshot(self) -> None:
        snapshot = self.driver.machine.snapshot()
        self.driver.machine = StateMachine.restore(snapshot)
        assert self.driver.machine.snapshot() == snapshot

    # Invariants.

    @invariant()
    def machine_agrees_with_model(self) -> None:
        machine = self.driver.machine
        assert machine.sorted_keys == sorted(machine.keys)
        assert machine_view(machine) == self.model.view()

    @invariant()
    def replica_is_byte_identical(self) -> None:
        assert self.replica.snapshot() == self.driver.machine.snapshot()

    @invariant()
    def time_never_goes_back(self) -> None:
        machine = self.driver.machine
        assert machine.now_ms >= self.now_ms_seen
        assert machine.lease_clock_ms >= self.lease_clock_ms_seen
        self.now_ms_seen, self.lease_clock_ms_seen = machine.now_ms, machine.lease_clock_ms

    @invariant()
    def each_lock_has_one_holder_and_a_queue_of_distinct_waiters(self) -> None:
        machine = self.driver.machine
        for name, lock in machine.locks.items():
            assert lock.holder not in lock.waiters
            assert len(set(lock.waiters)) == len(lock.waiters)
            holders = [
                session_id
                for session_id, session in machine.sessions.items()
                if name in session.locks and session_id not in lock.waiters
            ]
            assert holders == [lock.holder], name

    @invariant()
    def locks_belong_to_live_sessions(self) -> None:
        machine = self.driver.machine
        for lock in machine.locks.values():
            for session_id in (lock.holder, *lock.waiters):
                session = machine.sessions.get(session_id)
                assert session is not None, (lock, session_id)
                assert session.deadline_ms > machine.lease_clock_ms, (lock, session)
                assert lock.name in session.locks

    @invariant()
    def lock_tokens_strictly_increase(self) -> None:
        # Two grants with one token would let a fenced resource accept both holders' writes.
        for name, grants in self.grants.items():
            assert all(older < newer for (older, _), (newer, _) in pairwise(grants)), (name, grants)
        for name, lock in self.driver.machine.locks.items():
            # Every grant the machine made was seen in a result or an effect.
            assert self.grants[name][-1] == (lock.token, lock.holder), name

    @invariant()
    def each_task_has_at_most_one_live_attempt(self) -> None:
        for job in self.driver.machine.jobs.values():
            for task in job.tasks:
                live = [attempt for attempt in task.attempts if attempt.outcome is None]
                assert len(live) == (1 if task.state is TaskState.RUNNING else 0), task
                if live:
                    assert live[0] is task.attempts[-1]

    @invariant()
    def tasks_complete_at_most_once_and_never_change_after(self) -> None:
        assert all(count <= 1 for count in self.completions.values()), self.completions
        jobs = self.driver.machine.jobs
        for job_id, job in jobs.items():
            for task in job.tasks:
                if task.state is TaskState.SUCCEEDED:
                    self.succeeded.setdefault((job_id, task.index), msgspec.msgpack.encode(task))
        for (job_id, task_index), view in self.succeeded.items():
            # A finished job may be evicted to make room; until then its tasks stay as they were.
            if job_id in jobs:
                assert msgspec.msgpack.encode(jobs[job_id].tasks[task_index]) == view, job_id


class SessionRules(MachineTest):
    @rule(ttl_ms=st.sampled_from(SESSION_TTLS_MS), advance_ms=advances_ms, client_id=client_ids)
    def grant_session(self, ttl_ms: int, advance_ms: int, client_id: str | None) -> None:
        applied = self.send(SessionGrant(ttl_ms=ttl_ms), advance_ms=advance_ms, client_id=client_id)
        if applied.result.value is not None and not applied.duplicate:
            self.session_ids.append(applied.result.value["session_id"])

    @rule(data=st.data(), advance_ms=advances_ms, client_id=client_ids)
    def keep_alive(self, data: st.DataObject, advance_ms: int, client_id: str | None) -> None:
        command = SessionKeepAlive(session_id=self.draw_session(data))
        self.send(command, advance_ms=advance_ms, client_id=client_id)

    @rule(data=st.data(), advance_ms=advances_ms)
    def revoke(self, data: st.DataObject, advance_ms: int) -> None:
        self.send(SessionRevoke(session_id=self.draw_session(data)), advance_ms=advance_ms)


class KeyRules(MachineTest):
    @rule(
        data=st.data(),
        key=st.sampled_from(KEYS),
        value=values,
        under_session=st.booleans(),
        expectation=expectations,
        advance_ms=advances_ms,
        client_id=client_ids,
    )
    def put(
        self,
        data: st.DataObject,
        key: str,
        value: bytes,
        under_session: bool,
        expectation: str,
        advance_ms: int,
        client_id: str | None,
    ) -> None:
        command = KvPut(
            key=key,
            value=value,
            expected_mod_revision=self.expected_mod_revision(key, expectation),
            session_id=self.draw_session(data) if under_session else None,
        )
        self.send(command, advance_ms=advance_ms, client_id=client_id)

    @rule(key=st.sampled_from(KEYS), expectation=expectations, advance_ms=advances_ms)
    def delete(self, key: str, expectation: str, advance_ms: int) -> None:
        expected_mod_revision = self.expected_mod_revision(key, expectation)
        command = KvDelete(key=key, expected_mod_revision=expected_mod_revision)
        self.send(command, advance_ms=advance_ms)

    def expected_mod_revision(self, key: str, expectation: str) -> int | None:
        record = self.model.keys.get(key)
        current = 0 if record is None else record.mod_revision
        # No key ever has a mod revision above the store's revision.
        choices = {"none": None, "absent": 0, "current": current, "wrong": self.model.revision + 1}
        return choices[expectation]


class LockRules(MachineTest):
    def draw_lock_name(self, data: st.DataObject) -> str:
        """Most often a lock that is held, so that sessions contend for it."""
        return prefer(data, list(self.model.locks), LOCK_NAMES)

    @initialize(holder_ttl_ms=st.sampled_from(SESSION_TTLS_MS))
    def start_with_a_contended_lock(self, holder_ttl_ms: int) -> None:
        """Every run starts with a lock that one session holds and two others await, since
        Hypothesis leaves a random subset of rules out of each run (see `MachineTest`)."""
        session_ids = []
        for ttl_ms in (holder_ttl_ms, SESSION_TTLS_MS[-1], SESSION_TTLS_MS[-1]):
            session_id = self.send(SessionGrant(ttl_ms=ttl_ms)).result.unwrap()["session_id"]
            self.session_ids.append(session_id)
            session_ids.append(session_id)
        for session_id in session_ids:
            self.send(LockAcquire(name=LOCK_NAMES[0], session_id=session_id, wait=True))

    @rule(data=st.data(), wait=st.booleans(), advance_ms=advances_ms, client_id=client_ids)
    def acquire(
        self, data: st.DataObject, wait: bool, advance_ms: int, client_id: str | None
    ) -> None:
        name = self.draw_lock_name(data)
        command = LockAcquire(name=name, session_id=self.draw_session(data), wait=wait)
        self.send(command, advance_ms=advance_ms, client_id=client_id)

    @rule(data=st.data(), advance_ms=advances_ms)
    def release(self, data: st.DataObject, advance_ms: int) -> None:
        # Most often the holder lets go, so that the queue moves, or the first waiter, which
        # holds the lock instead when the holder's lease runs out in the same entry.
        name = self.draw_lock_name(data)
        lock = self.model.locks.get(name)
        nearest = [] if lock is None else [lock.holder, *lock.waiters[:1]]
        session_id = prefer(data, nearest, self.session_ids)
        self.send(LockRelease(name=name, session_id=session_id), advance_ms=advance_ms)

    @rule(name=st.sampled_from(LOCK_NAMES), newest=st.booleans(), advance_ms=advances_ms)
    def validate(self, name: str, newest: bool, advance_ms: int) -> None:
        tokens = [token for token, _ in self.grants.get(name, [])] or [1]
        token = tokens[-1] if newest else tokens[0]
        self.send(LockValidate(name=name, token=token), advance_ms=advance_ms)

    @rule(data=st.data(), advance_ms=advances_ms)
    def contend_for_a_lock(self, data: st.DataObject, advance_ms: int) -> None:
        """The usual next steps of lock traffic, so that queues fill up and grants are handed on
        even in runs that leave some of the other rules out: the holder of a lock that others
        await lets go, or the live sessions queue for the lock, or, when every live session
        already holds or awaits it, a new session is granted."""
        name = self.draw_lock_name(data)
        lock = self.model.locks.get(name)
        if lock is not None and lock.waiters and data.draw(st.booleans(), label="let go"):
            self.send(LockRelease(name=name, session_id=lock.holder), advance_ms=advance_ms)
            return
        involved = [] if lock is None else [lock.holder, *lock.waiters]
        free = [session_id for session_id in self.model.sessions if session_id not in involved]
        if not free:
            ttl_ms = data.draw(st.sampled_from(SESSION_TTLS_MS))
            applied = self.send(SessionGrant(ttl_ms=ttl_ms), advance_ms=advance_ms)
            if applied.result.value is not None:
                self.session_ids.append(applied.result.value["session_id"])
            return
        # Every free session asks, up to one more than the queue holds, so that queues fill up.
        for session_id in free[: LIMITS.lock_waiters_max + 2]:
            self.send(
                LockAcquire(name=name, session_id=session_id, wait=True), advance_ms=advance_ms
            )
            advance_ms = 0

    @precondition(lambda self: any(lock.waiters for lock in self.model.locks.values()))
    @rule(data=st.data(), action=st.sampled_from(("release", "revoke", "acquire")))
    def first_waiter_acts_as_the_holder_expires(self, data: st.DataObject, action: str) -> None:
        """In one entry the holder's lease runs out, which hands the lock to the first waiter,
        and then the command of that waiter is applied."""
        name = data.draw(
            st.sampled_from([name for name, lock in self.model.locks.items() if lock.waiters])
        )
        holder = self.model.locks[name].holder
        advance_ms = self.ticks_until_due(self.model.sessions[holder].deadline_ms)
        # The ticks expire nothing of the holder's, but may expire waiters.
        lock = self.model.locks[name]
        waiter = lock.waiters[0] if lock.waiters else holder
        command: Command = LockAcquire(name=name, session_id=waiter)
        if action == "release":
            command = LockRelease(name=name, session_id=waiter)
        if action == "revoke":
            command = SessionRevoke(session_id=waiter)
        self.send(command, advance_ms=advance_ms)


class JobRules(MachineTest):
    @initialize(lease_ttl_ms=st.sampled_from(ATTEMPT_TTLS_MS))
    def start_with_a_running_task(self, lease_ttl_ms: int) -> None:
        """Every run starts with a job of two tasks, the first of them running, since Hypothesis
        leaves a random subset of rules out of each run (see `MachineTest`)."""
        spec = job_spec(array_size=2, max_attempts=2, deny_r2=False)
        job_id = self.send(JobSubmit(spec=spec)).result.unwrap()["job_id"]
        self.job_ids.append(job_id)
        # The region is registered by another initialize rule, in an order Hypothesis picks.
        self.send(register_region("r1"))
        self.send(TaskAssign(job_id=job_id, task_index=0, region="r1")).result.unwrap()
        claim = TaskClaim(
            job_id=job_id,
            task_index=0,
            region="r1",
            executor_id="executor",
            lease_ttl_ms=lease_ttl_ms,
        )
        self.send(claim).result.unwrap()

    @rule(name=st.sampled_from(REGION_NAMES), advance_ms=advances_ms)
    def register(self, name: str, advance_ms: int) -> None:
        self.send(register_region(name), advance_ms=advance_ms)

    @rule(
        array_size=st.integers(1, 2),
        max_attempts=st.integers(1, 3),
        deny_r2=st.booleans(),
        advance_ms=advances_ms,
        client_id=client_ids,
    )
    def submit(
        self,
        array_size: int,
        max_attempts: int,
        deny_r2: bool,
        advance_ms: int,
        client_id: str | None,
    ) -> None:
        spec = job_spec(array_size=array_size, max_attempts=max_attempts, deny_r2=deny_r2)
        applied = self.send(JobSubmit(spec=spec), advance_ms=advance_ms, client_id=client_id)
        if applied.result.value is not None and not applied.duplicate:
            self.job_ids.append(applied.result.value["job_id"])

    @rule(data=st.data(), advance_ms=advances_ms)
    def cancel(self, data: st.DataObject, advance_ms: int) -> None:
        job_id, _ = self.draw_task(data, TaskState.PENDING, TaskState.RUNNING)
        self.send(JobCancel(job_id=job_id), advance_ms=advance_ms)

    @rule(data=st.data(), advance_ms=advances_ms, client_id=client_ids)
    def assign(self, data: st.DataObject, advance_ms: int, client_id: str | None) -> None:
        job_id, task_index = self.draw_task(data, TaskState.PENDING)
        region = prefer(data, self.model.regions, REGION_NAMES)
        command = TaskAssign(job_id=job_id, task_index=task_index, region=region)
        self.send(command, advance_ms=advance_ms, client_id=client_id)

    @rule(data=st.data(), advance_ms=advances_ms)
    def unassign(self, data: st.DataObject, advance_ms: int) -> None:
        job_id, task_index = self.draw_task(data, TaskState.ASSIGNED)
        self.send(TaskUnassign(job_id=job_id, task_index=task_index), advance_ms=advance_ms)

    @rule(
        data=st.data(),
        lease_ttl_ms=st.sampled_from(ATTEMPT_TTLS_MS),
        advance_ms=advances_ms,
        client_id=client_ids,
    )
    def claim(
        self, data: st.DataObject, lease_ttl_ms: int, advance_ms: int, client_id: str | None
    ) -> None:
        job_id, task_index = self.draw_task(data, TaskState.ASSIGNED)
        job = self.model.jobs.get(job_id)
        task = None if job is None or task_index >= len(job.tasks) else job.tasks[task_index]
        # Most often the region the task is assigned to; otherwise one it is not.
        assigned = [] if task is None or task.region is None else [task.region]
        command = TaskClaim(
            job_id=job_id,
            task_index=task_index,
            region=prefer(data, assigned, REGION_NAMES),
            executor_id="executor",
            lease_ttl_ms=lease_ttl_ms,
        )
        self.send(command, advance_ms=advance_ms, client_id=client_id)

    @rule(
        data=st.data(),
        kind=st.sampled_from(UPDATE_KINDS),
        step=st.integers(1, 3),
        retryable=st.booleans(),
        advance_ms=advances_ms,
        client_id=client_ids,
    )
    def update_running_task(
        self,
        data: st.DataObject,
        kind: str,
        step: int,
        retryable: bool,
        advance_ms: int,
        client_id: str | None,
    ) -> None:
        job_id, task_index = self.draw_task(data, TaskState.RUNNING)
        token = self.token_for(job_id, task_index)
        command = build_update(kind, job_id, task_index, token, step=step, retryable=retryable)
        self.send(command, advance_ms=advance_ms, client_id=client_id)

    @rule(data=st.data(), advance_ms=advances_ms)
    def move_a_task_on(self, data: st.DataObject, advance_ms: int) -> None:
        """The usual next step of a task's life, so that tasks run, succeed and fail even in
        runs that leave some of the other rules out: submit when no task is active, else assign
        a pending task, claim an assigned one, or update a running one."""
        active = [
            (job_id, task_index, task)
            for job_id, job in self.model.jobs.items()
            for task_index, task in enumerate(job.tasks)
            if not task.state.terminal
        ]
        if not active:
            spec = job_spec(array_size=2, max_attempts=2, deny_r2=False)
            applied = self.send(JobSubmit(spec=spec), advance_ms=advance_ms)
            if applied.result.value is not None:
                self.job_ids.append(applied.result.value["job_id"])
            return
        # Most often the task furthest along, so that some tasks reach the end of their life.
        furthest = max(STATE_ORDER.index(task.state) for _, _, task in active)
        job_id, task_index, task = prefer(
            data, [item for item in active if STATE_ORDER.index(item[2].state) == furthest], active
        )
        command: Command
        if task.state is TaskState.PENDING:
            command = TaskAssign(job_id=job_id, task_index=task_index, region="r1")
        elif task.state is TaskState.ASSIGNED:
            command = TaskClaim(
                job_id=job_id,
                task_index=task_index,
                region=task.region or "r1",
                executor_id="executor",
                lease_ttl_ms=ATTEMPT_TTLS_MS[-1],
            )
        else:
            kind = data.draw(st.sampled_from(UPDATE_KINDS))
            step = (task.checkpoint_step or 0) + 1
            command = build_update(kind, job_id, task_index, task.tokens[-1], step=step)
        self.send(command, advance_ms=advance_ms)

    @precondition(
        lambda self: any(
            task.state.terminal for job in self.model.jobs.values() for task in job.tasks
        )
    )
    @rule(data=st.data(), advance_ms=advances_ms)
    def poke_a_finished_task(self, data: st.DataObject, advance_ms: int) -> None:
        """Every command about a task that has finished is rejected (cancelling its job may
        still cancel the job's other tasks)."""
        finished = [
            (job_id, task_index, task)
            for job_id, job in self.model.jobs.items()
            for task_index, task in enumerate(job.tasks)
            if task.state.terminal
        ]
        # Most often one that succeeded: nothing may ever change it again.
        succeeded = [item for item in finished if item[2].state is TaskState.SUCCEEDED]
        job_id, task_index, task = prefer(data, succeeded, finished)
        token = task.tokens[-1] if task.tokens else 1
        for action in TASK_ACTIONS:
            command = build_task_command(action, job_id, task_index, token)
            self.send(command, advance_ms=advance_ms)
            advance_ms = 0

    @precondition(
        lambda self: any(
            task.state is TaskState.RUNNING
            for job in self.model.jobs.values()
            for task in job.tasks
        )
    )
    @rule(data=st.data(), kind=st.sampled_from(UPDATE_KINDS))
    def update_as_the_lease_runs_out(self, data: st.DataObject, kind: str) -> None:
        """An update that arrives in the entry where its attempt's lease runs out is too late:
        the attempt is expired first."""
        running = [
            (job_id, task_index, task)
            for job_id, job in self.model.jobs.items()
            for task_index, task in enumerate(job.tasks)
            if task.state is TaskState.RUNNING
        ]
        job_id, task_index, task = data.draw(st.sampled_from(running))
        advance_ms = self.ticks_until_due(task.deadline_ms)
        update = build_update(kind, job_id, task_index, task.tokens[-1])
        applied = self.send(update, advance_ms=advance_ms)
        assert applied.result.error is not None
        assert applied.result.error.code == errors.StaleToken.code

    @precondition(lambda self: any(job.tasks for job in self.model.jobs.values()))
    @rule(data=st.data(), kind=st.sampled_from(UPDATE_KINDS), advance_ms=advances_ms)
    def update_with_stale_token(self, data: st.DataObject, kind: str, advance_ms: int) -> None:
        # The tick lets time move and leases expire first; the update itself then moves no time,
        # so the state before and after it must be identical.
        self.send(Tick(), advance_ms=advance_ms)
        tasks = [
            (job_id, task_index, task)
            for job_id, job in self.model.jobs.items()
            for task_index, task in enumerate(job.tasks)
        ]
        job_id, task_index, task = data.draw(st.sampled_from(tasks))
        live = task.tokens[-1] if task.state is TaskState.RUNNING else None
        stale = [token for token in task.tokens if token != live]
        # A token newer than the live one was never issued to this task.
        stale.append(1 if live is None else live + 1)
        token = data.draw(st.sampled_from(stale))
        before = state_without_index(self.driver.machine)
        applied = self.send(build_update(kind, job_id, task_index, token))
        assert applied.result.error is not None
        assert applied.result.error.code == errors.StaleToken.code
        assert state_without_index(self.driver.machine) == before


class SessionsAndLocks(SessionRules, LockRules):
    """Locks held and awaited by sessions that are renewed, revoked and expired."""


class SessionsAndKeys(SessionRules, KeyRules):
    """Keys, some written under sessions that are renewed, revoked and expired."""


class Jobs(JobRules):
    """Tasks placed, claimed, updated, failed, cancelled and expired."""


class Everything(SessionRules, LockRules, KeyRules, JobRules):
    """All of them in one log, sharing the exactly-once table and the lease clock."""


STATEFUL_SETTINGS = settings(stateful_step_count=50)
for machine_test in (SessionsAndLocks, SessionsAndKeys, Jobs, Everything):
    machine_test.TestCase.settings = STATEFUL_SETTINGS
TestSessionsAndLocks = SessionsAndLocks.TestCase
TestSessionsAndKeys = SessionsAndKeys.TestCase
TestJobs = Jobs.TestCase
TestEverything = Everything.TestCase


# Determinism.

LOG_LENGTH_MAX = 40


@dataclass(frozen=True)
class LogEntry:
    command: Command
    advance_ms: int
    client_id: str | None = None
    seq: int | None = None


def one_of_current(options: Callable[[], list[T]], unknown: T) -> st.SearchStrategy[T]:
    """One of `options()` as they are when drawn (the state changes while a log is built), most
    often the newest, or sometimes `unknown`, something that does not exist."""

    def choose(position: int) -> T:
        current = options()
        if position == 7 or not current:
            return unknown
        return current[-1 - position % len(current)]

    return st.integers(0, 7).map(choose)


def commands_about(shadow: StateMachine) -> st.SearchStrategy[Command]:
    """Commands that refer, most of the time, to what exists in `shadow`, a replica that applies
    the log while it is built. It only steers the choice of ids and tokens."""

    def tasks() -> list[tuple[str, int, int, TaskState]]:
        # Each task with its live token, or the token of its last attempt.
        return [
            (job_id, task.index, task.attempts[-1].token if task.attempts else 1, task.state)
            for job_id, job in shadow.jobs.items()
            for task in job.tasks
        ]

    def task_command(
        task: tuple[str, int, int, TaskState], other_action: str | None, step: int
    ) -> Command:
        job_id, task_index, token, state = task
        # Most often the step that moves the task on, so that tasks run and finish.
        moving_on = {TaskState.PENDING: "assign", TaskState.ASSIGNED: "claim"}
        action = other_action or moving_on.get(state, UPDATE_KINDS[-1 - step % len(UPDATE_KINDS)])
        return build_task_command(action, job_id, task_index, token, step=step)

    session_ids = one_of_current(lambda: list(shadow.sessions), UNKNOWN_SESSION_ID)
    job_ids = one_of_current(lambda: list(shadow.jobs), UNKNOWN_JOB_ID)
    lock_tokens = one_of_current(lambda: [lock.token for lock in shadow.locks.values()], 1)
    task_references = one_of_current(tasks, (UNKNOWN_JOB_ID, 0, 1, TaskState.PENDING))
    revisions = st.none() | st.integers(0, 12)
    lock_names = st.sampled_from(LOCK_NAMES)
    other_actions = st.sampled_from((None, None, None, *TASK_ACTIONS))
    tasks_moving_on = st.builds(task_command, task_references, other_actions, st.integers(1, 6))
    # Hypothesis draws the first choices most often: the kinds with the longest lives go first.
    return st.one_of(
        tasks_moving_on,
        st.builds(
            job_spec,
            array_size=st.integers(1, 2),
            max_attempts=st.integers(1, 3),
            deny_r2=st.booleans(),
        ).map(lambda spec: JobSubmit(spec=spec)),
        st.builds(LockAcquire, name=lock_names, session_id=session_ids, wait=st.booleans()),
        st.builds(SessionGrant, ttl_ms=st.sampled_from(SESSION_TTLS_MS)),
        st.builds(LockRelease, name=lock_names, session_id=session_ids),
        st.builds(LockLeave, name=lock_names, session_id=session_ids),
        st.builds(
            KvPut,
            key=st.sampled_from(KEYS),
            value=values,
            expected_mod_revision=revisions,
            session_id=st.none() | session_ids,
        ),
        st.builds(KvDelete, key=st.sampled_from(KEYS), expected_mod_revision=revisions),
        st.builds(SessionKeepAlive, session_id=session_ids),
        st.builds(SessionRevoke, session_id=session_ids),
        st.builds(LockValidate, name=lock_names, token=lock_tokens),
        st.builds(JobCancel, job_id=job_ids),
        st.builds(register_region, st.sampled_from(REGION_NAMES)),
        st.builds(Tick),
    )


@st.composite
def command_logs(draw: st.DrawFn) -> list[LogEntry]:
    """Random logs of commands about what exists when they are proposed; some entries repeat an
    earlier request's (client_id, seq), as a client's retry would."""
    shadow = StateMachine(LIMITS)
    commands = commands_about(shadow)
    entries: list[LogEntry] = []
    next_seq = dict.fromkeys(CLIENT_IDS, 1)
    length = draw(st.integers(1, LOG_LENGTH_MAX))
    while len(entries) < length:
        advance_ms = draw(advances_ms)
        requests = [entry for entry in entries if entry.client_id is not None]
        if len(entries) < 2:
            entry = LogEntry(register_region(("r1", "r2")[len(entries)]), advance_ms=0)
        elif requests and draw(st.integers(0, 9)) == 9:
            retried = draw(st.sampled_from(requests))
            entry = LogEntry(retried.command, advance_ms, retried.client_id, retried.seq)
        else:
            command = draw(commands)
            client_id = draw(client_ids)
            seq = None
            if client_id is not None:
                seq = next_seq[client_id]
                next_seq[client_id] += 1
            entry = LogEntry(command, advance_ms, client_id, seq)
        entries.append(entry)
        shadow.apply(encode_log(entries)[-1], len(entries))
    return entries


def encode_log(entries: list[LogEntry]) -> list[bytes]:
    now_ms = START_MS
    log = []
    for entry in entries:
        now_ms += entry.advance_ms
        envelope = Envelope(
            command=entry.command, now_ms=now_ms, client_id=entry.client_id, seq=entry.seq
        )
        log.append(encode(envelope))
    return log


@given(entries=command_logs(), restore_after=st.sets(st.integers(1, LOG_LENGTH_MAX)))
def test_determinism__same_log__byte_identical_results_and_snapshots_also_through_restore(
    entries: list[LogEntry], restore_after: set[int]
) -> None:
    log = encode_log(entries)
    first, second, restoring = (StateMachine(LIMITS) for _ in range(3))
    for index, entry in enumerate(log, start=1):
        results = [
            msgspec.msgpack.encode(machine.apply(entry, index))
            for machine in (first, second, restoring)
        ]
        assert results[0] == results[1] == results[2], index
        if index in restore_after:
            restoring = StateMachine.restore(restoring.snapshot())
    assert first.snapshot() == second.snapshot() == restoring.snapshot()
