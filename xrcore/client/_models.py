"""The values the client returns: small frozen structs with typed fields, built from the API's
JSON answers.

Field names and units are the API's (`ttl_ms`, `granted_at_ms`), so a value read here means the
same as in the API's description. Unknown fields in an answer are ignored, so a newer server
does not break an older client. KV values are bytes; `KeyValue.text` decodes them as UTF-8.

Every answer is read through `convert` or `field`, never by indexing: an answer without a field
the client reads, or with a value of another type, raises the same indefinite `XrError` ("the
server's answer is not ..."), never a KeyError or TypeError.
"""

from __future__ import annotations

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
    "delete_result",
    "field",
    "key_page",
    "key_value",
    "watch_event",
    "watch_page",
]

T = TypeVar("T")


def convert(document: Any, kind: type[T]) -> T:
    """An answer as the struct `kind`; an answer of the wrong shape is an (indefinite) `XrError`,
    since the request itself may have taken effect."""
    try:
        return msgspec.convert(document, kind)
    except msgspec.ValidationError as error:
        raise XrError(f"the server's answer is not a {kind.__name__}: {error}") from None


def field(document: Any, name: str, kind: type[T]) -> T:
    """The field `name` of an answer, as `kind`; `convert`'s `XrError` when the answer has no
    such field or its value is of another type."""
    if not isinstance(document, dict) or name not in document:
        raise XrError(f"the server's answer has no field {name!r}")
    try:
        return msgspec.convert(document[name], kind)
    except msgspec.ValidationError as error:
        raise XrError(
            f"the server's answer's field {name!r} is not a {kind.__name__}: {error}"
        ) from None


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


class _KeyValueAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """A key as the API answers it: the value in base64 (its `value` field is text, which not
    every value is)."""

    key: str
    value_base64: bytes | None = None
    create_revision: int
    mod_revision: int
    version: int
    session_id: str | None = None

    def value(self) -> KeyValue:
        return KeyValue(
            key=self.key,
            value=self.value_base64 or b"",
            create_revision=self.create_revision,
            mod_revision=self.mod_revision,
            version=self.version,
            session_id=self.session_id,
        )


def key_value(document: Any) -> KeyValue:
    """The answer of a key's read."""
    return convert(document, _KeyValueAnswer).value()


class PutResult(msgspec.Struct, frozen=True, kw_only=True):
    # The store's revision after the put: the key's new mod revision.
    revision: int
    # The key's mod revision before the put; 0 when the key did not exist.
    previous_mod_revision: int
    version: int


class DeleteResult(msgspec.Struct, frozen=True, kw_only=True):
    deleted: bool
    revision: int


class _DeleteAnswer(msgspec.Struct, frozen=True, kw_only=True):
    # How many keys were deleted, 0 or 1 (a bool from other versions).
    deleted: bool | int
    revision: int


def delete_result(document: Any) -> DeleteResult:
    """The answer of a delete."""
    answer = convert(document, _DeleteAnswer)
    return DeleteResult(deleted=bool(answer.deleted), revision=answer.revision)


class KeyPage(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[KeyValue, ...]
    # The key to pass as `after` for the next page; None on the last page.
    next: str | None
    # The store's revision the page was read at: watch from `revision + 1` to see later changes.
    revision: int


class _KeyPageAnswer(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[_KeyValueAnswer, ...]
    next: str | None
    revision: int


def key_page(document: Any) -> KeyPage:
    """The answer of a range read."""
    answer = convert(document, _KeyPageAnswer)
    return KeyPage(
        items=tuple(item.value() for item in answer.items),
        next=answer.next,
        revision=answer.revision,
    )


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


class _WatchEventAnswer(msgspec.Struct, frozen=True, kw_only=True):
    revision: int
    kind: Literal["put", "delete"]
    key: str
    # None for a delete.
    value_base64: bytes | None = None
    create_revision: int
    version: int

    def value(self) -> WatchEvent:
        return WatchEvent(
            revision=self.revision,
            kind=self.kind,
            key=self.key,
            value=self.value_base64,
            create_revision=self.create_revision,
            version=self.version,
        )


def watch_event(document: Any) -> WatchEvent:
    """One event of a watch's answer."""
    return convert(document, _WatchEventAnswer).value()


class _WatchAnswer(msgspec.Struct, frozen=True, kw_only=True):
    events: tuple[_WatchEventAnswer, ...]
    # Where the next poll starts.
    next_revision: int


def watch_page(document: Any) -> tuple[tuple[WatchEvent, ...], int]:
    """The answer of one poll of a watch: its events, oldest first, and where the next poll
    starts."""
    answer = convert(document, _WatchAnswer)
    return tuple(event.value() for event in answer.events), answer.next_revision


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
    """A tenant's settings: scheduling, and its shares of the replicated tables (None: none)."""

    name: str
    weight: float = 1.0
    gpus_max: int | None = None
    tasks_max: int | None = None
    cost_weight: float = 1.0
    carbon_weight: float = 1.0
    keys_max: int | None = None
    sessions_max: int | None = None
    clients_max: int | None = None
    jobs_max: int | None = None
    unfinished_tasks_max: int | None = None


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
    # The release the node runs and the newest log entries it can apply (None from a node of a
    # release before 0.32.0), and why it stopped applying the log (an entry of a newer release).
    version: str | None = None
    envelope_version: int | None = None
    apply_halted: str | None = None


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
