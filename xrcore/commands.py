"""Every command the replicated state machine accepts.

A command is a frozen, keyword-only struct with a stable string tag (`type` on the wire). It checks
its own field types and bounds when it is built, so the state machine only ever sees well-formed
commands; what depends on the state (does the session exist, is the token current) is checked when
it is applied. Tags are part of the wire format: never rename one.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from xrcore import limits
from xrcore._validate import WireStruct, check_bytes, check_name, check_range, check_text
from xrcore.errors import InvalidArgument

__all__ = [
    "COMMAND_TYPES",
    "Command",
    "Gpu",
    "JobCancel",
    "JobSpec",
    "JobSubmit",
    "KvDelete",
    "KvPut",
    "LockAcquire",
    "LockLeave",
    "LockRelease",
    "LockValidate",
    "Placement",
    "Preemption",
    "RegionHeartbeat",
    "RegionRegister",
    "SchedulePass",
    "SessionGrant",
    "SessionKeepAlive",
    "SessionRevoke",
    "TaskAssign",
    "TaskCheckpoint",
    "TaskClaim",
    "TaskComplete",
    "TaskFail",
    "TaskHeartbeat",
    "TaskUnassign",
    "TaskYield",
    "TenantSet",
    "Tick",
    "Waiting",
]

ENTRYPOINT_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class Command(WireStruct, frozen=True, tag_field="type"):
    """Base of all commands; `type` on the wire is the subclass's tag."""

    # Commands that only read or only move time are not stored in the exactly-once table.
    records_result: ClassVar[bool] = True


def _check_key(field: str, key: str) -> None:
    check_bytes(field, key, limits.KEY_BYTES_MAX)


def _check_expected_revision(value: int | None) -> None:
    if value is not None and value < 0:
        raise InvalidArgument(f"expected_mod_revision must be >= 0, got {value}")


def _check_json_object(field: str, text: str, maximum: int) -> None:
    check_bytes(field, text, maximum)
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise InvalidArgument(f"{field} is not valid JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise InvalidArgument(f"{field} must be a JSON object")


def _check_names(field: str, values: tuple[str, ...]) -> None:
    if len(values) > limits.LIST_ITEMS_MAX:
        raise InvalidArgument(f"{field} has {len(values)} items, more than {limits.LIST_ITEMS_MAX}")
    for value in values:
        check_name(field, value)
    if len(set(values)) != len(values):
        raise InvalidArgument(f"{field} has duplicates")


def _check_labels(field: str, labels: dict[str, str]) -> None:
    if len(labels) > limits.LABELS_MAX:
        raise InvalidArgument(f"{field} has {len(labels)} labels, more than {limits.LABELS_MAX}")
    for key, value in labels.items():
        check_name(f"{field} key", key)
        check_text(f"{field}[{key!r}]", value, limits.LABEL_VALUE_BYTES_MAX)


def _check_task(job_id: str, task_index: int) -> None:
    check_name("job_id", job_id)
    check_range("task_index", task_index, 0, limits.ARRAY_SIZE_MAX - 1)


def _check_token(token: int) -> None:
    if token <= 0:
        raise InvalidArgument(f"token must be positive, got {token}")


class Tick(Command, frozen=True, tag="tick"):
    """Moves replicated time forward; the leader proposes one at a steady interval."""

    records_result = False


# KV.


class KvPut(Command, frozen=True, tag="kv.put"):
    """Writes a key. `expected_mod_revision` makes it a compare-and-set (0: the key must not
    exist). A key written with `session_id` is deleted when that session ends."""

    key: str
    value: bytes
    expected_mod_revision: int | None = None
    session_id: str | None = None

    def validate(self) -> None:
        _check_key("key", self.key)
        check_bytes("value", self.value, limits.VALUE_BYTES_MAX, empty=True)
        _check_expected_revision(self.expected_mod_revision)
        if self.session_id is not None:
            check_name("session_id", self.session_id)


class KvDelete(Command, frozen=True, tag="kv.delete"):
    key: str
    expected_mod_revision: int | None = None

    def validate(self) -> None:
        _check_key("key", self.key)
        _check_expected_revision(self.expected_mod_revision)


# Sessions.


class SessionGrant(Command, frozen=True, tag="session.grant"):
    ttl_ms: int
    owner: str = ""

    def validate(self) -> None:
        check_range("ttl_ms", self.ttl_ms, limits.SESSION_TTL_MIN_MS, limits.SESSION_TTL_MAX_MS)
        check_text("owner", self.owner, limits.LABEL_VALUE_BYTES_MAX)


class SessionKeepAlive(Command, frozen=True, tag="session.keepalive"):
    session_id: str

    def validate(self) -> None:
        check_name("session_id", self.session_id)


class SessionRevoke(Command, frozen=True, tag="session.revoke"):
    session_id: str

    def validate(self) -> None:
        check_name("session_id", self.session_id)


# Locks.


class LockAcquire(Command, frozen=True, tag="lock.acquire"):
    """Takes a lock for a session. If it is held: with `wait`, joins the FIFO queue; without,
    reports that it was not granted."""

    name: str
    session_id: str
    wait: bool = False

    def validate(self) -> None:
        _check_key("name", self.name)
        check_name("session_id", self.session_id)


class LockRelease(Command, frozen=True, tag="lock.release"):
    """Releases a held lock (handing it to the next waiter) or leaves its wait queue."""

    name: str
    session_id: str

    def validate(self) -> None:
        _check_key("name", self.name)
        check_name("session_id", self.session_id)


class LockLeave(Command, frozen=True, tag="lock.leave"):
    """Leaves a lock's wait queue; a session that holds the lock keeps it. What a node proposes
    when a waiting acquire ends without an answer to its client: the client may be waiting for
    the same session on another node, which may already have told it the lock is granted."""

    name: str
    session_id: str

    def validate(self) -> None:
        _check_key("name", self.name)
        check_name("session_id", self.session_id)


class LockValidate(Command, frozen=True, tag="lock.validate"):
    """Asks, through the log, whether `token` is the current grant of a lock."""

    records_result = False
    name: str
    token: int

    def validate(self) -> None:
        _check_key("name", self.name)
        _check_token(self.token)


# Regions.


class Gpu(WireStruct, frozen=True):
    model: str
    memory_mb: int
    free_mb: int
    compute_capability: str = ""

    def validate(self) -> None:
        check_text("model", self.model, limits.LABEL_VALUE_BYTES_MAX)
        check_text("compute_capability", self.compute_capability, 16)
        check_range("memory_mb", self.memory_mb, 0, 1 << 30)
        check_range("free_mb", self.free_mb, 0, self.memory_mb)


class RegionRegister(Command, frozen=True, tag="region.register"):
    name: str
    http_address: str
    raft_address: str
    provider: str = ""
    price_per_gpu_hour: float = 0.0
    carbon_g_per_kwh: float = 0.0
    labels: dict[str, str] = {}
    cpu_slots: int = 0

    def validate(self) -> None:
        check_name("name", self.name)
        check_bytes("http_address", self.http_address, limits.URI_BYTES_MAX)
        check_bytes("raft_address", self.raft_address, limits.URI_BYTES_MAX)
        check_text("provider", self.provider, limits.LABEL_VALUE_BYTES_MAX)
        check_range("price_per_gpu_hour", self.price_per_gpu_hour, 0.0, 1e6)
        check_range("carbon_g_per_kwh", self.carbon_g_per_kwh, 0.0, 1e6)
        check_range("cpu_slots", self.cpu_slots, 0, limits.GPUS_PER_REGION_MAX)
        _check_labels("labels", self.labels)


class RegionHeartbeat(Command, frozen=True, tag="region.heartbeat"):
    """A region's inventory and its measured round-trip times to other regions."""

    name: str
    gpus: tuple[Gpu, ...] = ()
    rtt_ms: dict[str, float] = {}

    def validate(self) -> None:
        check_name("name", self.name)
        if len(self.gpus) > limits.GPUS_PER_REGION_MAX:
            raise InvalidArgument(f"gpus has more than {limits.GPUS_PER_REGION_MAX} devices")
        if len(self.rtt_ms) > limits.LIST_ITEMS_MAX:
            raise InvalidArgument(f"rtt_ms has more than {limits.LIST_ITEMS_MAX} regions")
        for region, rtt in self.rtt_ms.items():
            check_name("rtt_ms region", region)
            check_range(f"rtt_ms[{region!r}]", rtt, 0.0, 3_600_000.0)


# Jobs.


class JobSpec(WireStruct, frozen=True, omit_defaults=True):
    """What a user asks to run. Exactly one of `entrypoint` (`package.module:function`) and
    `workload` (a built-in workload name) is set; `args` is a JSON object.

    Fields left at their defaults are not encoded, so a node of an earlier version (which
    refuses fields it does not know) reads every spec that leaves the newer fields unset: the
    price and carbon weights (docs/operations.md, "Upgrades")."""

    name: str
    tenant: str = "default"
    entrypoint: str | None = None
    workload: str | None = None
    args: str = "{}"
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
    # How much this job cares about price and carbon when the scheduler weighs regions, as
    # `TenantSet`'s weights (0: not at all); None: its tenant's.
    cost_weight: float | None = None
    carbon_weight: float | None = None

    def validate(self) -> None:
        check_name("name", self.name)
        check_name("tenant", self.tenant)
        if (self.entrypoint is None) == (self.workload is None):
            raise InvalidArgument("exactly one of entrypoint and workload must be set")
        if self.entrypoint is not None:
            check_bytes("entrypoint", self.entrypoint, limits.URI_BYTES_MAX)
            if ENTRYPOINT_PATTERN.fullmatch(self.entrypoint) is None:
                raise InvalidArgument(
                    f"entrypoint {self.entrypoint!r} must look like package.module:function"
                )
        if self.workload is not None:
            check_name("workload", self.workload)
        _check_json_object("args", self.args, limits.JOB_ARGS_BYTES_MAX)
        check_range("gpus", self.gpus, 0, limits.GPUS_PER_TASK_MAX)
        check_range("gpu_memory_mb", self.gpu_memory_mb, 0, 1 << 30)
        if self.gpu_model is not None:
            check_text("gpu_model", self.gpu_model, limits.LABEL_VALUE_BYTES_MAX)
        check_range("array_size", self.array_size, 1, limits.ARRAY_SIZE_MAX)
        check_range("priority", self.priority, limits.PRIORITY_MIN, limits.PRIORITY_MAX)
        _check_names("regions_allow", self.regions_allow)
        _check_names("regions_deny", self.regions_deny)
        _check_names("regions_prefer", self.regions_prefer)
        both = set(self.regions_allow) & set(self.regions_deny)
        if both:
            raise InvalidArgument(f"regions both allowed and denied: {sorted(both)}")
        check_range("input_size_mb", self.input_size_mb, 0, 1 << 40)
        if self.input_region is not None:
            check_name("input_region", self.input_region)
        check_range("max_attempts", self.max_attempts, 1, limits.MAX_ATTEMPTS_MAX)
        check_range("checkpoint_interval_s", self.checkpoint_interval_s, 0, 86_400 * 7)
        check_range("wall_time_limit_s", self.wall_time_limit_s, 0, 86_400 * 365)
        _check_weight("cost_weight", self.cost_weight)
        _check_weight("carbon_weight", self.carbon_weight)

    def allows(self, region: str) -> bool:
        if region in self.regions_deny:
            return False
        return not self.regions_allow or region in self.regions_allow


class JobSubmit(Command, frozen=True, tag="job.submit"):
    spec: JobSpec


class JobCancel(Command, frozen=True, tag="job.cancel"):
    job_id: str
    reason: str = ""

    def validate(self) -> None:
        check_name("job_id", self.job_id)
        check_text("reason", self.reason, limits.MESSAGE_BYTES_MAX)


class TaskAssign(Command, frozen=True, tag="task.assign"):
    """Places a pending task in a region; the region's executor then claims it."""

    job_id: str
    task_index: int
    region: str

    def validate(self) -> None:
        _check_task(self.job_id, self.task_index)
        check_name("region", self.region)


class TaskUnassign(Command, frozen=True, tag="task.unassign"):
    job_id: str
    task_index: int

    def validate(self) -> None:
        _check_task(self.job_id, self.task_index)


class Placement(WireStruct, frozen=True):
    """One task to place in a region, and why there."""

    job_id: str
    task_index: int
    region: str
    reason: str = ""

    def validate(self) -> None:
        _check_task(self.job_id, self.task_index)
        check_name("region", self.region)
        check_text("reason", self.reason, limits.MESSAGE_BYTES_MAX)


class Preemption(WireStruct, frozen=True, omit_defaults=True):
    """A running attempt that must make way for a higher-priority task. First it is asked to
    yield (its executor checkpoints and stops it, then sends `TaskYield`); with `force`, after
    the grace period, it is ended at once. Either way the task is requeued without counting a
    failure and resumes from its last committed checkpoint. `moving_to`: the task yields to move,
    up to that faster region or aside (for a task that may run only where it runs), and the
    scheduler holds room for it there until it is placed there (`Task.moving_to`). Fields at
    their defaults are not encoded: a node from before `moving_to` reads preemptions without
    it."""

    job_id: str
    task_index: int
    token: int
    reason: str = ""
    force: bool = False
    moving_to: str | None = None

    def validate(self) -> None:
        _check_task(self.job_id, self.task_index)
        _check_token(self.token)
        check_text("reason", self.reason, limits.MESSAGE_BYTES_MAX)
        if self.moving_to is not None:
            check_name("moving_to", self.moving_to)


class Waiting(WireStruct, frozen=True):
    """Why a task is not placed (or taken back), in words."""

    job_id: str
    task_index: int
    reason: str

    def validate(self) -> None:
        _check_task(self.job_id, self.task_index)
        check_text("reason", self.reason, limits.MESSAGE_BYTES_MAX)


class SchedulePass(Command, frozen=True, tag="schedule.pass"):
    """The decisions of one scheduling pass, applied together or not at all. `revision` is the
    scheduling revision of the state they were computed from: if anything that scheduling reads
    changed since (another leader's pass, a task that ended), the pass is refused as stale and
    recomputed, so a leader change never duplicates or loses a placement."""

    revision: int
    assigns: tuple[Placement, ...] = ()
    unassigns: tuple[Waiting, ...] = ()
    preempts: tuple[Preemption, ...] = ()
    waiting: tuple[Waiting, ...] = ()

    def validate(self) -> None:
        check_range("revision", self.revision, 0, 1 << 62)
        total = len(self.assigns) + len(self.unassigns) + len(self.preempts) + len(self.waiting)
        check_range("decisions", total, 0, limits.SCHEDULE_DECISIONS_MAX)


def _check_weight(field: str, value: float | None) -> None:
    """A price or carbon weight: from 0 to 1000 (a NaN is neither)."""
    if value is not None and not 0 <= value <= 1_000:
        raise InvalidArgument(f"{field} must be between 0 and 1000, got {value!r}")


# A tenant's shares of the replicated tables (`TenantSet`, `xrcore.tenants`).
TABLE_QUOTAS = ("keys_max", "sessions_max", "clients_max", "jobs_max", "unfinished_tasks_max")


class TenantSet(Command, frozen=True, tag="tenant.set", omit_defaults=True):
    """A tenant's fair-share weight, quotas, how much it cares about price and carbon, and its
    shares of the replicated tables (`xrcore.tenants`). Written without the fields left at their
    defaults: a node of an earlier version cannot read an entry that sets a table quota."""

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

    def validate(self) -> None:
        check_name("name", self.name)
        for field, value in (
            ("weight", self.weight),
            ("cost_weight", self.cost_weight),
            ("carbon_weight", self.carbon_weight),
        ):
            _check_weight(field, value)
        if self.weight <= 0:
            raise InvalidArgument(f"weight must be positive, got {self.weight!r}")
        if self.gpus_max is not None:
            check_range("gpus_max", self.gpus_max, 0, 1 << 20)
        if self.tasks_max is not None:
            check_range("tasks_max", self.tasks_max, 0, 1 << 20)
        for field in TABLE_QUOTAS:
            value = getattr(self, field)
            if value is not None:
                check_range(field, value, 0, 1 << 30)


class TaskClaim(Command, frozen=True, tag="task.claim"):
    """An executor starts an assigned task: creates an attempt with a fencing token and a lease."""

    job_id: str
    task_index: int
    region: str
    executor_id: str
    lease_ttl_ms: int

    def validate(self) -> None:
        _check_task(self.job_id, self.task_index)
        check_name("region", self.region)
        check_name("executor_id", self.executor_id)
        check_range(
            "lease_ttl_ms", self.lease_ttl_ms, limits.ATTEMPT_TTL_MIN_MS, limits.ATTEMPT_TTL_MAX_MS
        )


class _TaskUpdate(Command, frozen=True):
    """An update from the executor running an attempt; `token` fences out stale attempts."""

    job_id: str
    task_index: int
    token: int

    def validate(self) -> None:
        _check_task(self.job_id, self.task_index)
        _check_token(self.token)


class TaskYield(_TaskUpdate, frozen=True, tag="task.yield"):
    """An attempt asked to make way (preempted) has checkpointed and stopped: requeue its task."""


class TaskHeartbeat(_TaskUpdate, frozen=True, tag="task.heartbeat"):
    """Renews the attempt's lease and reports progress."""

    done: int = 0
    total: int = 0
    metrics: dict[str, float] = {}

    def validate(self) -> None:
        super().validate()
        check_range("done", self.done, 0, 1 << 62)
        check_range("total", self.total, 0, 1 << 62)
        if len(self.metrics) > limits.METRICS_PER_UPDATE_MAX:
            raise InvalidArgument(f"more than {limits.METRICS_PER_UPDATE_MAX} metrics")
        for key in self.metrics:
            check_name("metric name", key)


class TaskCheckpoint(_TaskUpdate, frozen=True, tag="task.checkpoint"):
    """Commits a checkpoint the executor has already written to `uri`."""

    step: int
    uri: str
    checksum: str
    size_bytes: int

    def validate(self) -> None:
        super().validate()
        check_range("step", self.step, 0, 1 << 62)
        check_bytes("uri", self.uri, limits.URI_BYTES_MAX)
        check_bytes("checksum", self.checksum, 256)
        check_range("size_bytes", self.size_bytes, 0, 1 << 62)


class TaskComplete(_TaskUpdate, frozen=True, tag="task.complete"):
    result: str = "{}"

    def validate(self) -> None:
        super().validate()
        _check_json_object("result", self.result, limits.JOB_RESULT_BYTES_MAX)


class TaskFail(_TaskUpdate, frozen=True, tag="task.fail"):
    error: str
    retryable: bool = True

    def validate(self) -> None:
        super().validate()
        check_text("error", self.error, limits.MESSAGE_BYTES_MAX)


COMMAND_TYPES: tuple[type[Command], ...] = (
    Tick,
    KvPut,
    KvDelete,
    SessionGrant,
    SessionKeepAlive,
    SessionRevoke,
    LockAcquire,
    LockRelease,
    LockLeave,
    LockValidate,
    RegionRegister,
    RegionHeartbeat,
    JobSubmit,
    JobCancel,
    TaskAssign,
    TaskUnassign,
    TaskClaim,
    TaskHeartbeat,
    TaskCheckpoint,
    TaskComplete,
    TaskFail,
    SchedulePass,
    TenantSet,
    TaskYield,
)


def tag_of(command_type: type[Command]) -> str:
    tag: Any = command_type.__struct_config__.tag
    assert isinstance(tag, str)
    return tag
