"""The records the replicated state is made of, and the results and effects of applying commands.

Records are plain mutable structs owned by the state machine; only `xrcore` mutates them. Their
field order is their snapshot format. Collections that must iterate the same way on every replica
are dicts or lists, never sets (set order depends on the process's hash seed).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec

from xrcore.commands import Gpu, JobSpec
from xrcore.errors import XrError, error_from_code
from xrcore.limits import Limits

__all__ = [
    "Attempt",
    "Checkpoint",
    "ClientRecord",
    "DurationStats",
    "Effect",
    "ErrorInfo",
    "Job",
    "KeyRecord",
    "KvEvent",
    "Lock",
    "Region",
    "Result",
    "Session",
    "Snapshot",
    "Task",
    "TaskState",
    "Tenant",
]


class TaskState(StrEnum):
    PENDING = "pending"
    ASSIGNED = "assigned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)


class KeyRecord(msgspec.Struct, kw_only=True):
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    session_id: str | None = None


class KvEvent(msgspec.Struct, kw_only=True):
    revision: int
    kind: str  # "put" or "delete"
    key: str
    value: bytes | None
    create_revision: int
    version: int


class Session(msgspec.Struct, kw_only=True):
    session_id: str
    ttl_ms: int
    # On the lease clock: the session expires when the lease clock reaches it.
    deadline_ms: int
    granted_at_ms: int
    owner: str = ""
    locks: list[str] = []
    keys: list[str] = []


class Lock(msgspec.Struct, kw_only=True):
    name: str
    holder: str  # a session id
    token: int
    granted_at_ms: int
    waiters: list[str] = []


class Checkpoint(msgspec.Struct, kw_only=True):
    step: int
    uri: str
    checksum: str
    size_bytes: int
    token: int
    committed_at_ms: int


class Attempt(msgspec.Struct, kw_only=True):
    number: int
    token: int
    region: str
    executor_id: str
    started_at_ms: int
    lease_ttl_ms: int
    deadline_ms: int  # lease clock
    restored_step: int | None = None
    ended_at_ms: int | None = None
    outcome: str | None = None
    error: str | None = None
    # When the scheduler asked this attempt to make way for a higher-priority task.
    preempt_requested_ms: int | None = None


class Task(msgspec.Struct, kw_only=True):
    index: int
    state: TaskState = TaskState.PENDING
    region: str | None = None
    attempts: list[Attempt] = []
    failures: int = 0
    done: int = 0
    total: int = 0
    metrics: dict[str, float] = {}
    checkpoint: Checkpoint | None = None
    result: str | None = None
    error: str | None = None
    updated_at_ms: int = 0
    # Why the task is where it is, or why it still waits (set by scheduling passes).
    reason: str = ""
    # The region the task was asked to yield for, to move up to a faster one or aside
    # (`Preemption.moving_to`); the scheduler holds room there for it until it is assigned again.
    moving_to: str | None = None

    def live_attempt(self) -> Attempt | None:
        if self.state is TaskState.RUNNING:
            return self.attempts[-1]
        return None


class Job(msgspec.Struct, kw_only=True):
    job_id: str
    spec: JobSpec
    submitted_at_ms: int
    tasks: list[Task]
    cancel_reason: str | None = None

    @property
    def state(self) -> str:
        """The job's state, derived from its tasks' states."""
        states = [task.state for task in self.tasks]
        if all(state is TaskState.SUCCEEDED for state in states):
            return "succeeded"
        if all(state.terminal for state in states):
            return "failed" if TaskState.FAILED in states else "cancelled"
        if TaskState.RUNNING in states:
            return "running"
        return "pending"


class Region(msgspec.Struct, kw_only=True):
    name: str
    http_address: str
    raft_address: str
    provider: str
    price_per_gpu_hour: float
    carbon_g_per_kwh: float
    labels: dict[str, str]
    cpu_slots: int
    registered_at_ms: int
    gpus: list[Gpu] = []
    rtt_ms: dict[str, float] = {}
    heartbeat_at_ms: int | None = None  # wall time, for display
    heartbeat_lease_ms: int | None = None  # lease clock, for health


class Tenant(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Settings of one tenant: fair-share weight, scheduling quotas, price and carbon weights,
    and its shares of the replicated tables (None: no quota of its own). Written without the
    fields left at their defaults, so a node of an earlier version reads a record that sets no
    table quota."""

    name: str
    weight: float = 1.0
    gpus_max: int | None = None
    tasks_max: int | None = None
    cost_weight: float = 1.0
    carbon_weight: float = 1.0
    # Keys in its namespace, sessions it owns, client records of its writes, its jobs in the
    # table (finished ones included), and its tasks not yet finished.
    keys_max: int | None = None
    sessions_max: int | None = None
    clients_max: int | None = None
    jobs_max: int | None = None
    unfinished_tasks_max: int | None = None


class DurationStats(msgspec.Struct, kw_only=True):
    """Run times of completed tasks of one tenant and entrypoint, normalized to a speed-1.0
    device: an integer moving average and mean deviation (weight 1/4), so every replica computes
    the same estimate."""

    count: int
    mean_ms: int
    deviation_ms: int


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str

    def to_error(self) -> XrError:
        return error_from_code(self.code, self.message)


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """What one command did: a value, or the typed error that rejected it (and changed nothing)."""

    value: dict[str, Any] | None = None
    error: ErrorInfo | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> dict[str, Any]:
        """The value, or raises the typed error."""
        if self.error is not None:
            raise self.error.to_error()
        assert self.value is not None
        return self.value


class ClientRecord(msgspec.Struct, kw_only=True):
    """The results of a client's most recent writes, by sequence number, oldest first."""

    last_seen_ms: int  # lease clock
    results: dict[int, Result] = {}
    # The command type each stored result answered ("kv.put"), so that a seq reused for another
    # kind of command is refused instead of answered with a result of the wrong shape. Records
    # from snapshots written before it have none, and are not checked.
    command_types: dict[int, str] = {}


class Effect(msgspec.Struct, frozen=True, kw_only=True):
    """Something the shell may act on (wake a lock waiter, stop a task); never replicated."""

    kind: str  # "lock.granted", "session.ended", "attempt.ended"
    name: str = ""
    session_id: str = ""
    token: int = 0
    job_id: str = ""
    task_index: int = 0
    reason: str = ""


class Snapshot(msgspec.Struct, kw_only=True):
    """The whole replicated state; its encoding is the snapshot format."""

    format: int
    limits: Limits
    index: int
    now_ms: int
    lease_clock_ms: int
    fencing_token: int
    revision: int
    keys: dict[str, KeyRecord]
    history: list[KvEvent]
    sessions: dict[str, Session]
    locks: dict[str, Lock]
    jobs: dict[str, Job]
    tasks_active: int
    regions: dict[str, Region]
    clients: dict[str, ClientRecord]
    tenants: dict[str, Tenant] = {}
    durations: dict[str, DurationStats] = {}
    schedule_revision: int = 0
