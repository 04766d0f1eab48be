"""Every bound of the replicated state machine, named in one place.

Two kinds. Field sizes are part of the wire format: a command that breaks one is malformed
wherever it is built, so they are constants checked on construction. Capacities (how many keys,
sessions, waiters, jobs) shape replicated behaviour and are configurable, so every replica must use
the same values: `Limits` is part of the state machine's configuration and of its snapshots.
Units are last in every name.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "ARRAY_SIZE_MAX",
    "ATTEMPT_TTL_MAX_MS",
    "ATTEMPT_TTL_MIN_MS",
    "DEFAULT_LIMITS",
    "ENVELOPE_BYTES_MAX",
    "GPUS_PER_REGION_MAX",
    "GPUS_PER_TASK_MAX",
    "JOB_ARGS_BYTES_MAX",
    "JOB_ID_BYTES_MAX",
    "JOB_RESULT_BYTES_MAX",
    "KEY_BYTES_MAX",
    "LABELS_MAX",
    "LABEL_VALUE_BYTES_MAX",
    "LIST_ITEMS_MAX",
    "MAX_ATTEMPTS_MAX",
    "MESSAGE_BYTES_MAX",
    "METRICS_PER_UPDATE_MAX",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "RANGE_LIMIT_MAX",
    "SCHEDULE_DECISIONS_MAX",
    "SESSION_TTL_MAX_MS",
    "SESSION_TTL_MIN_MS",
    "URI_BYTES_MAX",
    "VALUE_BYTES_MAX",
    "Limits",
]

# Field sizes (wire format).
ENVELOPE_BYTES_MAX = 256 * 1024
KEY_BYTES_MAX = 1024
VALUE_BYTES_MAX = 64 * 1024
MESSAGE_BYTES_MAX = 4096
URI_BYTES_MAX = 2048
# A job id in an API path or query (ids are made by the state machine, far shorter).
JOB_ID_BYTES_MAX = 64
LABELS_MAX = 32
LABEL_VALUE_BYTES_MAX = 256
LIST_ITEMS_MAX = 64
RANGE_LIMIT_MAX = 1_000
# A page of keys or watch events holds at most this many bytes of keys and values, besides its
# first item: a page of 1,000 values of 64 KiB was an answer of 140 MB (each value is sent as
# text and as base64), and a few hundred such reads at once ran a node out of memory.
PAGE_BYTES_MAX = 1024 * 1024
SESSION_TTL_MIN_MS = 1_000
SESSION_TTL_MAX_MS = 3_600_000
ATTEMPT_TTL_MIN_MS = 1_000
ATTEMPT_TTL_MAX_MS = 3_600_000
ARRAY_SIZE_MAX = 10_000
JOB_ARGS_BYTES_MAX = 64 * 1024
JOB_RESULT_BYTES_MAX = 64 * 1024
MAX_ATTEMPTS_MAX = 100
PRIORITY_MIN = -1_000
PRIORITY_MAX = 1_000
GPUS_PER_TASK_MAX = 64
GPUS_PER_REGION_MAX = 1_024
METRICS_PER_UPDATE_MAX = 32
# Decisions and waiting reasons in one scheduling pass.
SCHEDULE_DECISIONS_MAX = 1_024


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Capacities of the replicated tables, and the bounds of replicated time."""

    # A single command moves the lease clock forward by at most this much, so a gap in commits
    # (no leader, lost quorum, paused leader, skewed clock) never ages a lease by more than this.
    # The leader's tick interval must be well below it.
    lease_step_max_ms: int = 1_000
    # A region whose last heartbeat is older than this (on the lease clock) is unhealthy.
    region_heartbeat_timeout_ms: int = 10_000

    keys_max: int = 100_000
    watch_history_max: int = 10_000
    sessions_max: int = 10_000
    locks_max: int = 100_000
    lock_waiters_max: int = 1_000
    locks_per_session_max: int = 1_000
    keys_per_session_max: int = 1_000
    # Terminal jobs are kept for inspection until the table is full; then the oldest go first.
    jobs_max: int = 10_000
    tasks_active_max: int = 100_000
    # Attempts lost to lease expiry (a dead region) do not count against a job's max_attempts,
    # but a task gets at most this many attempts in all, so a job that kills its region each
    # time cannot cycle forever.
    attempts_total_max: int = 50
    regions_max: int = 64
    clients_max: int = 10_000
    results_per_client_max: int = 32
    client_idle_ms: int = 3_600_000
    tenants_max: int = 1_000
    # Run-time statistics per tenant and entrypoint, least recently updated dropped first.
    durations_max: int = 1_024

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"limit {name} must be a positive integer, got {value!r}")


DEFAULT_LIMITS = Limits()
