"""The values the client returns: small frozen structs with typed fields, built from the API's
JSON answers.

Field names and units are the API's (`ttl_ms`, `granted_at_ms`), so a value read here means the
same as in the API's description. Unknown fields in an answer are ignored, so a newer server
does not break an older client. KV values are bytes; `KeyValue.text` decodes them as UTF-8.
"""

from __future__ import annotations

import base64
from typing import Any, Literal, TypeVar

import msgspec

from xrcore.errors import XrError

__all__ = [
    "Attempt",
    "Checkpoint",
    "ClusterStatus",
    "DeleteResult",
    "Health",
    "Job",
    "JobEvent",
    "JobPage",
    "JobSummary",
    "KeyPage",
    "KeyValue",
    "LockAcquisition",
    "LockInfo",
    "Member",
    "PutResult",
    "Region",
    "RegionGpu",
    "SessionInfo",
    "SubmittedSpec",
    "Task",
    "Tenant",
    "TokenValidation",
    "WatchEvent",
    "convert",
    "key_value",
    "watch_event",
]

T = TypeVar("T")


def convert(document: Any, kind: type[T]) -> T:
    """An answer as the struct `kind`; an answer of the wrong shape is an (indefinite) `XrError`,
    since the request itself may have taken effect."""
    try:
        return msgspec.convert(document, kind)
    except msgspec.ValidationError as error:
        raise XrError(f"the server's answer is not a {kind.__name__}: {error}") from None


def _bytes(document: dict[str, Any]) -> bytes | None:
    encoded = document.get("value_base64")
    if encoded is None:
        return None
    return base64.b64decode(encoded)


# KV.


class KeyValue(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    # Puts since the key was created: a retried put that the server applied once counts once.
    version: int
    # The session the key lives under (deleted when it ends), or None.
    session_id: str | None = None

    @property
    def text(self) -> str:
        return self.value.decode()


def key_value(document: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=document["key"],
        value=_bytes(document) or b"",
        create_revision=document["create_revision"],
        mod_revision=document["mod_revision"],
        version=document["version"],
        session_id=document.get("session_id"),
    )


class PutResult(msgspec.Struct, frozen=True, kw_only=True):
    # The store's revision after the put: the key's new mod revision.
    revision: int
    # The key's mod revision before the put; 0 when the key did not exist.
    previous_mod_revision: int
    version: int


class DeleteResult(msgspec.Struct, frozen=True, kw_only=True):
    deleted: bool
    revision: int


class KeyPage(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[KeyValue, ...]
    # The key to pass as `after` for the next page; None on the last page.
    next: str | None
    # The store's revision the page was read at: watch from `revision + 1` to see later changes.
    revision: int


class WatchEvent(msgspec.Struct, frozen=True, kw_only=True):
    revision: int
    kind: Literal["put", "delete"]
    key: str
    # None for a delete.
    value: bytes | None
    create_revision: int
    # The key's version after a put; 0 for a delete.
    version: int

    @property
    def text(self) -> str | None:
        return None if self.value is None else self.value.decode()


def watch_event(document: dict[str, Any]) -> WatchEvent:
    return WatchEvent(
        revision=document["revision"],
        kind=document["kind"],
        key=document["key"],
        value=_bytes(document),
        create_revision=document["create_revision"],
        version=document["version"],
    )


# Sessions and locks.


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    ttl_ms: int
    # Until the session expires unless kept alive, on the cluster's lease clock.
    remaining_ms: int
    granted_at_ms: int
    # Locks the session holds or waits for, and keys written under it.
    locks: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    tenant: str = ""


class LockAcquisition(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    granted: bool
    # The fencing token of the grant: pass it to every resource the lock protects.
    token: int | None = None
    # The session holding the lock (the caller's when granted).
    holder: str | None = None
    # Not granted but waiting in the lock's queue (only for an acquire that did not wait).
    queued: bool = False
    position: int | None = None
    # A waiting acquire whose wait ended without the grant.
    timed_out: bool = False


class LockInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    holder: str
    token: int
    granted_at_ms: int
    # Sessions waiting, first in line first.
    waiters: tuple[str, ...] = ()


class TokenValidation(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    valid: bool
    # The lock's current token, or None when nobody holds it.
    current_token: int | None = None


# Jobs.


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    step: int
    uri: str
    checksum: str
    size_bytes: int
    token: int
    committed_at_ms: int


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    number: int
    token: int
    region: str
    executor_id: str
    started_at_ms: int
    ended_at_ms: int | None = None
    outcome: str | None = None
    restored_step: int | None = None
    error: str | None = None


class Task(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    state: str
    region: str | None = None
    # The live attempt's fencing token while the task runs.
    token: int | None = None
    failures: int = 0
    done: int = 0
    total: int = 0
    metrics: dict[str, float] = {}
    checkpoint: Checkpoint | None = None
    result: str | None = None
    error: str | None = None
    # Why the task is in its region, or why it still waits (from the scheduler).
    reason: str = ""
    attempts: tuple[Attempt, ...] = ()


class JobSummary(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    name: str
    tenant: str
    # pending, running, succeeded, failed or cancelled (derived from the tasks' states).
    state: str
    priority: int
    submitted_at_ms: int
    array_size: int
    cancel_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")


class SubmittedSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The spec a job was submitted with (`client.jobs.submit`'s fields), defaults included."""

    name: str
    tenant: str
    entrypoint: str | None = None
    workload: str | None = None
    args: dict[str, Any] = {}
    gpus: int = 0
    gpu_memory_mb: int = 0
    gpu_model: str | None = None
    array_size: int = 1
    priority: int = 0
    regions_allow: tuple[str, ...] = ()
    regions_deny: tuple[str, ...] = ()
    regions_prefer: tuple[str, ...] = ()
    input_size_mb: int = 0
    input_region: str | None = None
    max_attempts: int = 3
    checkpoint_interval_s: int = 0
    wall_time_limit_s: int = 0
    # How much price and carbon count when placing it; None: its tenant's weights.
    cost_weight: float | None = None
    carbon_weight: float | None = None


class Job(JobSummary, frozen=True, kw_only=True):
    # None from a node of a version that did not show it.
    spec: SubmittedSpec | None = None
    tasks: tuple[Task, ...] = ()


class JobPage(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[JobSummary, ...]
    # The job id to pass as `after` for the next page; None on the last page.
    next: str | None


class JobEvent(msgspec.Struct, frozen=True, kw_only=True):
    at_ms: int
    # submitted, attempt.started or attempt.ended.
    kind: str
    task_index: int | None = None
    attempt: int | None = None
    region: str | None = None
    token: int | None = None
    restored_step: int | None = None
    outcome: str | None = None
    error: str | None = None


class JobLogs(msgspec.Struct, frozen=True, kw_only=True):
    """The end of one task attempt's captured stdout and stderr."""

    job_id: str
    task_index: int
    attempt: int
    region: str
    log: str
    # True when the log holds more than was answered (`tail_bytes`).
    truncated: bool
    size_bytes: int


# Regions and the cluster.


class RegionGpu(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    memory_mb: int
    free_mb: int


class Tenant(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's scheduling settings."""

    name: str
    weight: float = 1.0
    gpus_max: int | None = None
    tasks_max: int | None = None
    cost_weight: float = 1.0
    carbon_weight: float = 1.0


class Region(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    http_address: str
    raft_address: str
    provider: str = ""
    price_per_gpu_hour: float = 0.0
    carbon_g_per_kwh: float = 0.0
    labels: dict[str, str] = {}
    cpu_slots: int = 0
    gpus: tuple[RegionGpu, ...] = ()
    rtt_ms: dict[str, float] = {}
    heartbeat_at_ms: int | None = None
    healthy: bool = False


class ClusterStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One node's view of the cluster."""

    region: str
    raft_address: str
    # leader, follower or candidate.
    state: str
    leader: str | None
    leader_region: str | None
    has_quorum: bool
    term: int
    commit_index: int
    applied_index: int
    machine_index: int
    proposals_in_flight: int


class Member(msgspec.Struct, frozen=True, kw_only=True):
    raft_address: str
    region: str | None
    http_address: str | None
    # True for the node that answered.
    is_self: bool = msgspec.field(name="self")
    leader: bool
    connected: bool
    match_index: int | None = None
    last_contact_s: float | None = None


class Health(msgspec.Struct, frozen=True, kw_only=True):
    """`/readyz` of one node: ready when it knows a leader with a quorum and a read commits."""

    ready: bool
    region: str
    leader: str | None = None
    term: int = 0
    reason: str | None = None
