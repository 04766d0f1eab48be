"""The OpenAPI 3.1 document served at /v1/openapi.json: what a client may send and will get back.

The document is built from three tables, so adding a route means adding a row:

- `SCHEMAS`: the objects bodies and answers carry, as JSON Schema 2020-12 (what OpenAPI 3.1
  uses). Request bodies say `additionalProperties: false` because their handlers refuse unknown
  fields; answers leave it open, so a client keeps working when a field is added.
- `PARAMETERS`: path, query and header parameters with their types and bounds, taken from the
  same constants the handlers and the core check against.
- `OPERATIONS`: one row per route: its parameters, body, answer and the errors it can answer
  besides those every authenticated operation can (`_COMMON_ERRORS`).

Bounds that come from the node's configuration (the longest `wait_s`, in its descriptions; the
body size) are filled in from the configuration of the node that serves the document. Tests
check that the document is valid OpenAPI 3.1, that its operations are exactly the
application's routes, and that real answers match their schemas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from node.api.app import CLIENT_ID_HEADER, INDEX_HEADER, REQUEST_ID_HEADER, SEQ_HEADER, services
from node.api.jobs import JOB_STATES
from node.api.wire import MSGPACK, respond
from xrcore import kv, limits
from xrcore._validate import NAME_BYTES_MAX, NAME_PATTERN
from xrcore.codec import SEQ_MAX
from xrcore.commands import ENTRYPOINT_PATTERN, TABLE_QUOTAS, JobSpec
from xrcore.model import TaskState

__all__ = ["OPERATIONS", "Operation", "document", "parameter_table", "routes"]

routes = web.RouteTableDef()


# Schemas.


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(
    properties: dict[str, Any],
    *,
    required: tuple[str, ...] | None = None,
    closed: bool = False,
    description: str | None = None,
) -> dict[str, Any]:
    """An object schema; `required` defaults to every property, `closed` refuses others."""
    schema: dict[str, Any] = {
        "type": "object",
        "required": list(properties if required is None else required),
        "properties": properties,
    }
    if closed:
        schema["additionalProperties"] = False
    if description is not None:
        schema["description"] = description
    return schema


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


def _list(items: dict[str, Any], **bounds: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **bounds}


INTEGER = {"type": "integer"}
NUMBER = {"type": "number"}
TEXT = {"type": "string"}
BOOLEAN = {"type": "boolean"}
REVISION = {"type": "integer", "minimum": 0}
TIME_MS = {"type": "integer", "description": "Milliseconds since the Unix epoch (UTC)."}
STALE = {
    "type": "boolean",
    "description": "True when the read was made with consistency=stale (no read barrier).",
}
NAME = {
    "type": "string",
    "pattern": f"^{NAME_PATTERN.pattern}$",
    "maxLength": NAME_BYTES_MAX,
}
VALUE_TEXT = {
    "type": ["string", "null"],
    "description": "The value as UTF-8 text; null when the bytes are not valid UTF-8.",
}
VALUE_BASE64 = {
    "type": "string",
    "contentEncoding": "base64",
    "description": "The value's bytes, base64.",
}


def _job_spec_fields() -> dict[str, dict[str, Any]]:
    """The fields of `xrcore.commands.JobSpec` but the tenant (the caller's), with the bounds
    `JobSpec.validate` checks and the defaults the struct declares."""
    names = _list(NAME, maxItems=limits.LIST_ITEMS_MAX, uniqueItems=True)
    fields: dict[str, dict[str, Any]] = {
        "name": NAME,
        "entrypoint": _nullable(
            {
                "type": "string",
                "pattern": f"^{ENTRYPOINT_PATTERN.pattern}$",
                "maxLength": limits.URI_BYTES_MAX,
                "description": "package.module:function; exactly one of entrypoint and workload.",
            }
        ),
        "workload": _nullable({**NAME, "description": "A built-in workload's name."}),
        "args": {
            "type": ["object", "string"],
            "description": "The job's arguments: an object, or an object as JSON text "
            f"(at most {limits.JOB_ARGS_BYTES_MAX} bytes as JSON).",
        },
        "gpus": {"type": "integer", "minimum": 0, "maximum": limits.GPUS_PER_TASK_MAX},
        "gpu_memory_mb": {"type": "integer", "minimum": 0, "maximum": 1 << 30},
        "gpu_model": _nullable({"type": "string", "maxLength": limits.LABEL_VALUE_BYTES_MAX}),
        "array_size": {"type": "integer", "minimum": 1, "maximum": limits.ARRAY_SIZE_MAX},
        "priority": {
            "type": "integer",
            "minimum": limits.PRIORITY_MIN,
            "maximum": limits.PRIORITY_MAX,
        },
        "regions_allow": names,
        "regions_deny": names,
        "regions_prefer": names,
        "input_size_mb": {"type": "integer", "minimum": 0, "maximum": 1 << 40},
        "input_region": _nullable(NAME),
        "max_attempts": {"type": "integer", "minimum": 1, "maximum": limits.MAX_ATTEMPTS_MAX},
        "checkpoint_interval_s": {"type": "integer", "minimum": 0, "maximum": 86_400 * 7},
        "wall_time_limit_s": {"type": "integer", "minimum": 0, "maximum": 86_400 * 365},
        "cost_weight": _nullable(
            {
                **NUMBER,
                "minimum": 0,
                "maximum": 1000,
                "description": "How much price counts in placement; null: the tenant's.",
            }
        ),
        "carbon_weight": _nullable(
            {
                **NUMBER,
                "minimum": 0,
                "maximum": 1000,
                "description": "How much carbon counts in placement; null: the tenant's.",
            }
        ),
    }
    for item in msgspec.structs.fields(JobSpec):
        if item.name in fields and item.default is not msgspec.NODEFAULT:
            default = item.default
            fields[item.name] = {
                **fields[item.name],
                "default": list(default) if isinstance(default, tuple) else default,
            }
    return fields


def _job_spec() -> dict[str, Any]:
    return _object(
        _job_spec_fields(),
        required=("name",),
        closed=True,
        description="A job to run; it belongs to the caller's tenant. Exactly one of "
        "entrypoint and workload is set.",
    )


def _submitted_spec() -> dict[str, Any]:
    fields = _job_spec_fields()
    fields["args"] = {"type": "object", "description": "The job's arguments."}
    return _object(
        {**fields, "tenant": NAME},
        description="The job's spec as it was submitted: every field, the defaults included.",
    )


_KEY_VALUE = {
    "key": {"type": "string", "description": "The key, in the caller's namespace."},
    "value": VALUE_TEXT,
    "value_base64": VALUE_BASE64,
    "create_revision": REVISION,
    "mod_revision": REVISION,
    "version": {"type": "integer", "minimum": 1, "description": "Puts since the key's creation."},
    "session_id": {"type": ["string", "null"]},
}
_ATTEMPT = {
    "number": INTEGER,
    "token": {"type": "integer", "description": "The attempt's fencing token."},
    "region": TEXT,
    "executor_id": TEXT,
    "started_at_ms": TIME_MS,
    "ended_at_ms": _nullable(TIME_MS),
    "outcome": {"type": ["string", "null"]},
    "restored_step": {"type": ["integer", "null"]},
    "error": {"type": ["string", "null"]},
}
_JOB_SUMMARY = {
    "job_id": TEXT,
    "name": TEXT,
    "tenant": TEXT,
    "state": {"type": "string", "enum": list(JOB_STATES)},
    "priority": INTEGER,
    "submitted_at_ms": TIME_MS,
    "array_size": INTEGER,
    "cancel_reason": {"type": ["string", "null"]},
}
_TENANT_SETTINGS: dict[str, Any] = {
    "weight": {**NUMBER, "exclusiveMinimum": 0, "maximum": 1000, "description": "Fair share."},
    "gpus_max": {"type": ["integer", "null"], "minimum": 0, "maximum": 1 << 20},
    "tasks_max": {"type": ["integer", "null"], "minimum": 0, "maximum": 1 << 20},
    "cost_weight": {**NUMBER, "minimum": 0, "maximum": 1000},
    "carbon_weight": {**NUMBER, "minimum": 0, "maximum": 1000},
    **{
        name: {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": 1 << 30,
            "description": "The tenant's share of a replicated table (xrcore.tenants); null: none.",
        }
        for name in TABLE_QUOTAS
    },
}

_REGION = {
    "name": TEXT,
    "http_address": TEXT,
    "raft_address": TEXT,
    "provider": TEXT,
    "price_per_gpu_hour": NUMBER,
    "carbon_g_per_kwh": NUMBER,
    "labels": {"type": "object", "additionalProperties": TEXT},
    "cpu_slots": INTEGER,
    "gpus": _list(_object({"model": TEXT, "memory_mb": INTEGER, "free_mb": INTEGER})),
    "rtt_ms": {"type": "object", "additionalProperties": NUMBER},
    "heartbeat_at_ms": _nullable(TIME_MS),
    "healthy": {
        "type": "boolean",
        "description": "The region's last heartbeat is recent on the replicated lease clock.",
    },
}


def _ui_state() -> dict[str, Any]:
    """The dashboard's snapshot (`node.api.ui.snapshot`): cluster-wide facts and the caller's
    tenant's newest objects."""
    count = {"type": "integer", "minimum": 0}
    load = _object({"assigned": count, "running": count})
    region = {key: value for key, value in _REGION.items() if key != "raft_address"}
    task = _object(
        {
            "index": INTEGER,
            "state": {"type": "string", "enum": [state.value for state in TaskState]},
            "region": {"type": ["string", "null"]},
            "failures": INTEGER,
            "done": INTEGER,
            "total": INTEGER,
            "reason": {
                "type": "string",
                "description": "Why the task is where it is, or waits (at most 256 characters, "
                "and a note saying how long it was if it was cut).",
            },
            "error": {"type": ["string", "null"], "description": "As reason, cut alike."},
            "attempt_count": {**count, "description": "The task's attempts, all of them."},
            "attempts": {
                "description": "The task's latest 8 attempts, oldest first; each error cut after "
                "128 characters.",
                **_list(
                    _object(
                        {
                            name: _ATTEMPT[name]
                            for name in (
                                "number",
                                "region",
                                "token",
                                "started_at_ms",
                                "ended_at_ms",
                                "outcome",
                                "error",
                            )
                        }
                    )
                ),
            },
        }
    )
    summary = {key: value for key, value in _JOB_SUMMARY.items() if key != "tenant"}
    job = _object(
        {
            **summary,
            "workload": {"type": ["string", "null"]},
            "entrypoint": {"type": ["string", "null"]},
            "task_states": {"type": "object", "additionalProperties": count},
            "done": INTEGER,
            "total": INTEGER,
            "regions": _list(TEXT),
            "cancel_reason": {
                "type": ["string", "null"],
                "description": "Cut after 256 characters, saying so.",
            },
            "reason": {
                "type": "string",
                "description": "The first unfinished task's reason (cut after 256 characters).",
            },
            "tasks_shown": {**count, "description": "How many tasks `tasks` holds: at most 16."},
            "tasks": {**_list(_ref("UiTask")), "description": "The job's first tasks."},
        }
    )
    return {
        "UiTask": task,
        "UiJob": job,
        "UiState": _object(
            {
                "principal": _object({"name": TEXT, "role": TEXT, "tenant": TEXT}),
                "node": _object(
                    {
                        "region": TEXT,
                        "state": {
                            "type": "string",
                            "enum": ["follower", "candidate", "leader", "unknown"],
                        },
                        "leader": {"type": ["string", "null"]},
                        "leader_region": {"type": ["string", "null"]},
                        "has_quorum": BOOLEAN,
                        "term": INTEGER,
                        "commit_index": INTEGER,
                        "applied_index": INTEGER,
                        "members": {
                            **_list(
                                _object(
                                    {
                                        "region": {"type": ["string", "null"]},
                                        "connected": BOOLEAN,
                                        "match_index": {"type": ["integer", "null"]},
                                    }
                                )
                            ),
                            "description": "The Raft group's members; only for a caller who "
                            "may read them (`GET /v1/cluster/members`: operator, admin).",
                        },
                    },
                    required=(
                        "region",
                        "state",
                        "leader",
                        "leader_region",
                        "has_quorum",
                        "term",
                        "commit_index",
                        "applied_index",
                    ),
                ),
                "index": INTEGER,
                "now_ms": TIME_MS,
                "revision": REVISION,
                "regions": _list(_object({**region, "load": load})),
                "jobs": {
                    **_list(_ref("UiJob")),
                    "description": "The tenant's newest jobs, newest first (at most 50; at "
                    "most 16 tasks each).",
                },
                "job_counts": {"type": "object", "additionalProperties": count},
                "locks": _list(
                    _object(
                        {
                            "name": TEXT,
                            "holder": TEXT,
                            "token": INTEGER,
                            "granted_at_ms": TIME_MS,
                            "waiter_count": count,
                            "waiters": {
                                **_list(TEXT),
                                "description": "The first 20 waiting sessions, in queue order.",
                            },
                        }
                    ),
                    description="The tenant's locks (at most 100; each name cut after 128 "
                    "characters, saying so).",
                ),
                "lock_count": count,
                "sessions": _list(
                    _object(
                        {
                            "session_id": TEXT,
                            "ttl_ms": INTEGER,
                            "remaining_ms": INTEGER,
                            "granted_at_ms": TIME_MS,
                            "lock_count": count,
                            "locks": {
                                **_list(TEXT),
                                "description": "The names of the session's first 20 locks.",
                            },
                            "keys": count,
                        }
                    ),
                    description="The tenant's sessions (at most 100).",
                ),
                "session_count": count,
                "key_count": count,
                "stale": STALE,
            }
        ),
    }


def _waited(wait_max_s: float) -> str:
    """What every `wait_s` description adds: this node's longest wait (`node.api.app.wait_s`)."""
    return (
        f" At most {wait_max_s:g} s are waited (this node's http.wait_max_s): a longer wait is "
        "served as that, and the answer says the wait ended; ask again to wait on."
    )


def _schemas(*, wait_max_s: float) -> dict[str, Any]:
    wait = {"type": "number", "minimum": 0}
    return {
        "Error": _object(
            {
                "error": _object(
                    {
                        "code": {
                            "type": "string",
                            "description": "Stable; clients match on it, never on the message.",
                            "examples": ["kv.compare_failed", "lock.not_held", "not_found"],
                        },
                        "message": TEXT,
                        "definite": {
                            "type": "boolean",
                            "description": "True when the operation certainly did not take "
                            "effect; false when it may have (retry with the same Xr-Client-Id "
                            "and Xr-Seq).",
                        },
                    }
                )
            }
        ),
        # KV.
        "KeyValue": _object(
            {**_KEY_VALUE, "revision": REVISION, "stale": STALE},
            required=tuple(_KEY_VALUE),
            description="A key and its value; a single read adds the store's revision and `stale`.",
        ),
        "KeyPage": _object(
            {
                "revision": REVISION,
                "items": _list(_ref("KeyValue")),
                "next": {
                    "type": ["string", "null"],
                    "description": "Pass as `after` for the next page; null on the last.",
                },
                "stale": STALE,
            }
        ),
        "KvPut": _object(
            {
                "value": {
                    "type": "string",
                    "description": "The value as text (bytes in a msgpack body).",
                },
                "value_base64": VALUE_BASE64,
                "expected_mod_revision": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "Compare-and-set: the key's current mod revision (0: the key "
                    "must not exist); 409 kv.compare_failed otherwise.",
                },
                "session_id": {
                    "type": ["string", "null"],
                    "description": "The key is deleted when this session ends.",
                },
            },
            required=(),
            closed=True,
        )
        # Exactly one of value and value_base64.
        | {"oneOf": [{"required": ["value"]}, {"required": ["value_base64"]}]},
        "KvPutResult": _object(
            {"revision": REVISION, "previous_mod_revision": REVISION, "version": INTEGER}
        ),
        "KvDeleteResult": _object(
            {"deleted": {"type": "integer", "enum": [0, 1]}, "revision": REVISION}
        ),
        # Sessions.
        "SessionGrant": _object(
            {
                "ttl_ms": {
                    "type": "integer",
                    "minimum": limits.SESSION_TTL_MIN_MS,
                    "maximum": limits.SESSION_TTL_MAX_MS,
                }
            },
            closed=True,
        ),
        "Session": _object(
            {
                "session_id": TEXT,
                "ttl_ms": INTEGER,
                "remaining_ms": INTEGER,
                "granted_at_ms": TIME_MS,
                "tenant": TEXT,
                "locks": _list(TEXT),
                "keys": _list(TEXT),
                "stale": STALE,
            },
            required=("session_id", "ttl_ms", "remaining_ms", "tenant", "locks", "keys"),
        ),
        "SessionRevoked": _object({"session_id": TEXT, "revoked": BOOLEAN}),
        # Locks.
        "LockAcquire": _object(
            {
                "session_id": TEXT,
                "wait_s": {
                    **wait,
                    "default": 0,
                    "description": "Wait up to this long in FIFO order when the lock is held."
                    + _waited(wait_max_s),
                },
            },
            required=("session_id",),
            closed=True,
        ),
        "LockRelease": _object({"session_id": TEXT}, closed=True),
        "LockValidate": _object({"token": {"type": "integer", "minimum": 1}}, closed=True),
        "LockGrant": _object(
            {
                "name": TEXT,
                "granted": BOOLEAN,
                "token": {"type": "integer", "description": "The fencing token of the grant."},
                "holder": {"type": "string", "description": "The holding session."},
                "queued": BOOLEAN,
                "position": {"type": "integer", "minimum": 1},
                "timed_out": BOOLEAN,
            },
            required=("name", "granted"),
        ),
        "LockReleased": _object(
            {"name": TEXT, "released": BOOLEAN, "left_queue": BOOLEAN},
            required=("name", "released"),
        ),
        "Lock": _object(
            {
                "name": TEXT,
                "holder": TEXT,
                "token": INTEGER,
                "granted_at_ms": TIME_MS,
                "waiters": _list(TEXT, description="Waiting sessions, first in line first."),
                "stale": STALE,
            }
        ),
        "LockValidity": _object(
            {
                "name": TEXT,
                "valid": BOOLEAN,
                "current_token": {"type": ["integer", "null"]},
                "stale": STALE,
            }
        ),
        # Jobs.
        "JobSpec": _job_spec(),
        "SubmittedSpec": _submitted_spec(),
        "JobSubmitted": _object({"job_id": TEXT, "tasks": INTEGER}),
        "JobSummary": _object(_JOB_SUMMARY),
        "JobPage": _object(
            {
                "items": _list(_ref("JobSummary")),
                "next": {
                    "type": ["string", "null"],
                    "description": "Pass as `after` for the next page; null on the last.",
                },
                "stale": STALE,
            }
        ),
        "Checkpoint": _object(
            {
                "step": INTEGER,
                "uri": TEXT,
                "checksum": TEXT,
                "size_bytes": INTEGER,
                "token": INTEGER,
                "committed_at_ms": TIME_MS,
            }
        ),
        "Attempt": _object(_ATTEMPT),
        "Task": _object(
            {
                "index": INTEGER,
                "state": {"type": "string", "enum": [state.value for state in TaskState]},
                "region": {"type": ["string", "null"]},
                "token": {"type": ["integer", "null"]},
                "failures": INTEGER,
                "done": INTEGER,
                "total": INTEGER,
                "metrics": {"type": "object", "additionalProperties": NUMBER},
                "checkpoint": {"oneOf": [_ref("Checkpoint"), {"type": "null"}]},
                "result": {"type": ["string", "null"]},
                "error": {"type": ["string", "null"]},
                "reason": {
                    **TEXT,
                    "description": "Why the task is in its region, or why it still waits.",
                },
                "moving_to": {
                    "type": ["string", "null"],
                    "description": "The region the scheduler is moving the task to, up to a "
                    "faster one or aside for a task that may run only where it runs (asked to "
                    "yield, room held there), until it is placed again.",
                },
                "attempts": _list(_ref("Attempt")),
            }
        ),
        "Job": _object(
            {
                **_JOB_SUMMARY,
                "spec": _ref("SubmittedSpec"),
                "tasks": _list(_ref("Task")),
                "stale": STALE,
            },
            required=(*_JOB_SUMMARY, "spec", "tasks"),
        ),
        "JobCancel": _object(
            {"reason": {"type": "string", "maxLength": limits.MESSAGE_BYTES_MAX}},
            required=(),
            closed=True,
        ),
        "JobCancelled": _object({"job_id": TEXT, "cancelled_tasks": INTEGER}),
        "JobEvent": _object(
            {
                "at_ms": TIME_MS,
                "kind": {
                    "type": "string",
                    "enum": ["submitted", "attempt.started", "attempt.ended"],
                },
                "task_index": {"type": ["integer", "null"]},
                **{
                    name: _ATTEMPT[name]
                    for name in ("region", "token", "restored_step", "outcome", "error")
                },
                "attempt": INTEGER,
            },
            required=("at_ms", "kind", "task_index"),
        ),
        "JobEvents": _object(
            {
                "job_id": TEXT,
                "state": {"type": "string", "enum": list(JOB_STATES)},
                "events": _list(_ref("JobEvent")),
                "stale": STALE,
            }
        ),
        "JobLogs": _object(
            {
                "job_id": TEXT,
                "task_index": INTEGER,
                "attempt": INTEGER,
                "region": TEXT,
                "log": {"type": "string", "description": "The end of the attempt's output."},
                "truncated": BOOLEAN,
                "size_bytes": INTEGER,
            }
        ),
        # Regions and the cluster.
        "Region": _object({**_REGION, "stale": STALE}, required=tuple(_REGION)),
        "RegionList": _object({"items": _list(_ref("Region")), "stale": STALE}),
        "Tenant": _object({"name": NAME, **_TENANT_SETTINGS}, required=("name", *_TENANT_SETTINGS)),
        "TenantList": _object({"items": _list(_ref("Tenant")), "stale": STALE}),
        "TenantSet": _object(_TENANT_SETTINGS, required=(), closed=True),
        "TenantSetResult": _object({"name": NAME, "created": BOOLEAN}),
        "ClusterStatus": _object(
            {
                "region": TEXT,
                "raft_address": TEXT,
                "state": {"type": "string", "enum": ["follower", "candidate", "leader", "unknown"]},
                "leader": {
                    "type": ["string", "null"],
                    "description": (
                        "The leader's Raft address; null while this node hears none (an "
                        "election, or this node cut off from the leader)."
                    ),
                },
                "leader_region": {"type": ["string", "null"]},
                "has_quorum": BOOLEAN,
                "term": INTEGER,
                "commit_index": INTEGER,
                "applied_index": INTEGER,
                "machine_index": INTEGER,
                "proposals_in_flight": INTEGER,
                "test_faults": {
                    **_list(TEXT),
                    "description": "Deliberate bugs switched on for a test run "
                    "(XR_TEST_FAULTS, see docs/jepsen-faults.md); empty otherwise.",
                },
                "version": {**TEXT, "description": "The release this node runs."},
                "envelope_version": {
                    **INTEGER,
                    "description": "The newest version of log entries this node can apply.",
                },
                "apply_halted": {
                    "type": ["string", "null"],
                    "description": (
                        "Why this node stopped applying the log (an entry written by a newer "
                        "release; it refuses requests until it is upgraded), or null."
                    ),
                },
            }
        ),
        "Member": _object(
            {
                "raft_address": TEXT,
                "region": {"type": ["string", "null"]},
                "http_address": {"type": ["string", "null"]},
                "self": BOOLEAN,
                "leader": BOOLEAN,
                "connected": BOOLEAN,
                "match_index": {"type": ["integer", "null"]},
                "last_contact_s": {"type": ["number", "null"]},
            }
        ),
        "Members": _object(
            {
                "items": _list(_ref("Member")),
                "term": INTEGER,
                "leader": {"type": ["string", "null"]},
            }
        ),
        "TransferLeader": _object({"region": TEXT}, closed=True),
        "TransferLeaderResult": _object({"leader_region": TEXT, "transferred": BOOLEAN}),
        # Backups (node.api.snapshot).
        "Snapshot": _object(
            {
                "machine_index": INTEGER,
                "raft_index": INTEGER,
                "raft_term": INTEGER,
                "taken_at_ms": TIME_MS,
                "state_bytes": INTEGER,
                "sha256": TEXT,
                "file": {"type": "string", "contentEncoding": "base64"},
            }
        ),
        "StateHash": _object(
            {"region": TEXT, "machine_index": INTEGER, "sha256": TEXT, "durability": TEXT}
        ),
        # The web dashboard (node.api.ui).
        **_ui_state(),
        # Watch.
        "WatchEvent": _object(
            {
                "revision": REVISION,
                "kind": {"type": "string", "enum": ["put", "delete"]},
                "key": TEXT,
                "value": VALUE_TEXT,
                "value_base64": {**VALUE_BASE64, "type": ["string", "null"]},
                "create_revision": REVISION,
                "version": {"type": "integer", "description": "0 for a delete."},
            }
        ),
        "WatchEvents": _object(
            {
                "events": _list(_ref("WatchEvent")),
                "next_revision": {
                    "type": "integer",
                    "description": "Pass as from_revision to continue after these events.",
                },
                "revision": REVISION,
            }
        ),
        # Health.
        "Health": _object({"status": {"type": "string", "enum": ["ok"]}, "region": TEXT}),
        "Ready": _object(
            {
                "ready": BOOLEAN,
                "region": TEXT,
                "leader": {"type": ["string", "null"]},
                "term": INTEGER,
                "reason": {"type": ["string", "null"]},
            }
        ),
    }


# Parameters.


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def _path(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


def _header(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "schema": schema, "description": description}


def _parameters(*, wait_max_s: float) -> dict[str, Any]:
    page_limit = {
        "type": "integer",
        "minimum": 1,
        "maximum": limits.RANGE_LIMIT_MAX,
        "default": 100,
    }
    wait = {"type": "number", "minimum": 0, "default": 0}
    return {
        "key": _path(
            "key",
            {"type": "string", "minLength": 1},
            "A key in the caller's namespace; it may contain '/'. With the tenant prefix it must "
            f"fit {limits.KEY_BYTES_MAX} bytes.",
        ),
        "session_id": _path("session_id", TEXT, "A session's id."),
        "lock_name": _path(
            "name",
            {"type": "string", "minLength": 1},
            f"A lock's name; with the tenant prefix it must fit {NAME_BYTES_MAX} bytes.",
        ),
        "job_id": _path("job_id", {"type": "string", "maxLength": 64}, "A job's id."),
        "region_name": _path("name", NAME, "A region's name."),
        "tenant_name": _path("name", NAME, "A tenant's name."),
        "consistency": _query(
            "consistency",
            {"type": "string", "enum": ["linearizable", "stale"], "default": "linearizable"},
            "linearizable waits for a read barrier committed through the log; stale reads this "
            "node's state at once and answers `stale: true`.",
        ),
        "limit": _query(
            "limit",
            page_limit,
            "The most items to answer. A page of keys or watch events also stops before its keys "
            f"and values pass {limits.PAGE_BYTES_MAX} bytes (it holds at least one item): "
            "follow `next` or `next_revision`, not the count, to read on.",
        ),
        "prefix": _query(
            "prefix",
            {"type": "string", "maxLength": 1024, "default": ""},
            "Only keys that start with this (at most 1024 bytes).",
        ),
        "key_after": _query("after", TEXT, "Start after this key: the previous page's `next`."),
        "task_index": _query(
            "task_index", {"type": "integer", "minimum": 0, "default": 0}, "The task's index."
        ),
        "attempt": _query(
            "attempt",
            {"type": "integer", "minimum": 1},
            "The attempt's number; the latest when left out.",
        ),
        "tail_bytes": _query(
            "tail_bytes",
            {"type": "integer", "minimum": 1, "maximum": 1 << 20, "default": 65536},
            "Answer at most this many bytes from the end of the log.",
        ),
        "job_after": _query(
            "after",
            {"type": "string", "maxLength": 64},
            "Start after this job: the previous page's `next`.",
        ),
        "job_state": _query(
            "state", {"type": "string", "enum": list(JOB_STATES)}, "Only jobs in this state."
        ),
        "expected_mod_revision": _query(
            "expected_mod_revision",
            {"type": "integer", "minimum": 0},
            "Compare-and-delete: the key's current mod revision; 409 kv.compare_failed otherwise.",
        ),
        "job_wait_s": _query(
            "wait_s",
            wait,
            "Wait up to this long for the job to finish before answering." + _waited(wait_max_s),
        ),
        "watch_wait_s": _query(
            "wait_s",
            wait,
            "Wait up to this long for a change when there is none yet." + _waited(wait_max_s),
        ),
        "from_revision": _query(
            "from_revision",
            {"type": "integer", "minimum": 1, "maximum": kv.REVISION_MAX},
            "The first revision to watch (a read's revision + 1, or the previous answer's "
            "`next_revision`). Required unless Last-Event-ID is sent.",
        ),
        "last_event_id": _header(
            "Last-Event-ID",
            {"type": "string", "pattern": "^[0-9]+$"},
            "Resume after this revision (an EventSource sends it when it reconnects); it takes "
            "the place of from_revision.",
        ),
        "client_id": _header(
            CLIENT_ID_HEADER,
            NAME,
            f"With {SEQ_HEADER}: the write's idempotency key. A retry with the same pair answers "
            "the stored result instead of applying twice.",
        ),
        "seq": _header(
            SEQ_HEADER,
            {"type": "integer", "minimum": 1, "maximum": SEQ_MAX},
            f"The write's sequence number among the client's writes; sent with {CLIENT_ID_HEADER}.",
        ),
    }


# Answers.

_ERRORS: dict[int, str] = {
    400: "The request is malformed or a value is out of bounds (request.invalid).",
    401: "No valid bearer token (auth.unauthenticated).",
    403: "The caller's role may not do this (auth.forbidden).",
    404: "No such object, or another tenant's: both answer the same (not_found).",
    408: "The request's body did not arrive within http.request_timeout_s "
    "(request.body_timeout); nothing was done.",
    409: "A conflict: a failed compare, a lock not held, a job that cannot move so, or a retry "
    "older than the results kept for its client (request.too_old, definite false).",
    410: "The revision is older than the retained change history (kv.compacted).",
    413: "The body is larger than http.body_bytes_max, or a field is over its size limit "
    "(limit.payload_too_large).",
    429: "Too many requests being handled, bodies being received, waits, streams or proposals "
    "on this node; retry after Retry-After (limit.capacity, cluster.overloaded).",
    503: "No leader or quorum is reachable, or the leader changed (cluster.unavailable, "
    "cluster.leader_changed, cluster.unknown_outcome); retry after Retry-After.",
    504: "No answer in time; a write may or may not have been applied (cluster.timeout, "
    "definite false).",
}
# What any operation that authenticates and goes through the replicated store may answer.
_COMMON_ERRORS = (400, 401, 429, 503, 504)
_WRITE_ERRORS = (408, 409, 413)
_HEADERS = {
    REQUEST_ID_HEADER: {
        "description": "The request's id: the caller's, or a new one. The node's log has it.",
        "schema": TEXT,
    },
    INDEX_HEADER: {
        "description": "The log position the read or write saw.",
        "schema": INTEGER,
    },
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": INTEGER},
}


def _content(schema: dict[str, Any]) -> dict[str, Any]:
    """The same document as JSON (the default) or msgpack."""
    return {"application/json": {"schema": schema}, MSGPACK: {"schema": schema}}


def _header_refs(*names: str) -> dict[str, Any]:
    return {name: {"$ref": f"#/components/headers/{name}"} for name in names}


def _error_responses() -> dict[str, Any]:
    responses = {}
    for status, description in _ERRORS.items():
        headers = (
            (REQUEST_ID_HEADER, "Retry-After") if status in (429, 503) else (REQUEST_ID_HEADER,)
        )
        responses[f"Error{status}"] = {
            "description": description,
            "headers": _header_refs(*headers),
            "content": _content(_ref("Error")),
        }
    return responses


# Operations.


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One route as the document describes it."""

    method: str
    path: str
    operation_id: str
    summary: str
    tag: str
    answer: str | None
    status: int = 200
    parameters: tuple[str, ...] = ()
    body: str | None = None
    body_required: bool = True
    # Errors beyond `_COMMON_ERRORS` (or the only ones, for an open operation).
    errors: tuple[int, ...] = ()
    # Takes the idempotency headers and may answer 409 request.too_old and 413.
    write: bool = False
    # Needs no token (`security: []`).
    open: bool = False
    description: str | None = None


_OPEN_HEALTH = (
    "Open to callers without a token while auth.open_health is true (the default); with it "
    "false, any valid token is needed."
)
_SSE = (
    "With `Accept: text/event-stream` the answer is a stream of Server-Sent Events instead: one "
    "event per change, `id:` its revision, `event:` put or delete, `data:` a WatchEvent as JSON; "
    "comment lines keep the connection alive. An EventSource resumes with Last-Event-ID. A "
    "watcher that falls behind the retained history gets an `error` event whose data is the "
    "error object (kv.compacted), and the stream ends. `limit` and `wait_s` apply to the long "
    "poll only."
)

OPERATIONS: tuple[Operation, ...] = (
    # Health and the API's description.
    Operation(
        method="get",
        path="/healthz",
        operation_id="healthz",
        summary="Liveness: 200 while the process serves requests",
        tag="health",
        answer="Health",
        open=True,
        errors=(401,),
        description=_OPEN_HEALTH,
    ),
    Operation(
        method="get",
        path="/readyz",
        operation_id="readyz",
        summary="Readiness: 200 when a leader with a quorum is known and a read barrier commits "
        "within a second; 503 with the reason otherwise",
        tag="health",
        answer="Ready",
        open=True,
        errors=(401,),
        description=_OPEN_HEALTH + " A node that is not ready answers 503 with a Ready "
        "document (`ready: false` and the reason), not an Error.",
    ),
    Operation(
        method="get",
        path="/metrics",
        operation_id="metrics",
        summary="Prometheus metrics (text exposition format)",
        tag="health",
        answer=None,
        open=True,
        errors=(401,),
        description=_OPEN_HEALTH,
    ),
    Operation(
        method="get",
        path="/v1/openapi.json",
        operation_id="openapi",
        summary="This document",
        tag="meta",
        answer=None,
        open=True,
    ),
    # KV.
    Operation(
        method="get",
        path="/v1/kv",
        operation_id="kvRange",
        summary="List keys under a prefix in key order, paged",
        tag="kv",
        answer="KeyPage",
        parameters=("prefix", "key_after", "limit", "consistency"),
        errors=(413,),
    ),
    Operation(
        method="get",
        path="/v1/kv/{key}",
        operation_id="kvGet",
        summary="Read a key",
        tag="kv",
        answer="KeyValue",
        parameters=("key", "consistency"),
        errors=(404,),
    ),
    Operation(
        method="put",
        path="/v1/kv/{key}",
        operation_id="kvPut",
        summary="Write a key, optionally compare-and-set or under a session",
        tag="kv",
        answer="KvPutResult",
        parameters=("key",),
        body="KvPut",
        write=True,
        errors=(404,),
    ),
    Operation(
        method="delete",
        path="/v1/kv/{key}",
        operation_id="kvDelete",
        summary="Delete a key, optionally compare-and-delete",
        tag="kv",
        answer="KvDeleteResult",
        parameters=("key", "expected_mod_revision"),
        write=True,
    ),
    # Sessions.
    Operation(
        method="post",
        path="/v1/sessions",
        operation_id="sessionGrant",
        summary="Grant a session (a lease with a TTL) owned by the caller's tenant",
        tag="sessions",
        answer="Session",
        status=201,
        body="SessionGrant",
        write=True,
    ),
    Operation(
        method="get",
        path="/v1/sessions/{session_id}",
        operation_id="sessionGet",
        summary="Read a session",
        tag="sessions",
        answer="Session",
        parameters=("session_id", "consistency"),
        errors=(404,),
    ),
    Operation(
        method="post",
        path="/v1/sessions/{session_id}/keepalive",
        operation_id="sessionKeepAlive",
        summary="Renew a session's TTL",
        tag="sessions",
        answer="Session",
        parameters=("session_id",),
        write=True,
        errors=(404,),
    ),
    Operation(
        method="delete",
        path="/v1/sessions/{session_id}",
        operation_id="sessionRevoke",
        summary="Revoke a session, releasing its locks and deleting its keys",
        tag="sessions",
        answer="SessionRevoked",
        parameters=("session_id",),
        write=True,
        errors=(404,),
    ),
    # Locks.
    Operation(
        method="post",
        path="/v1/locks/{name}/acquire",
        operation_id="lockAcquire",
        summary="Acquire a lock for a session, optionally waiting in FIFO order",
        tag="locks",
        answer="LockGrant",
        parameters=("lock_name",),
        body="LockAcquire",
        write=True,
        errors=(404,),
        description="Without wait_s a held lock answers `granted: false`. With wait_s the "
        "session joins the lock's queue and the answer comes when the lock is granted, or "
        "after wait_s with `granted: false, timed_out: true` and the session out of the queue "
        "(also when the client goes away first). Leaving the queue never gives back a grant "
        "the session got meanwhile (through another node): a grant that races the end of the "
        "wait is answered as a grant.",
    ),
    Operation(
        method="post",
        path="/v1/locks/{name}/release",
        operation_id="lockRelease",
        summary="Release a lock (handing it to the first waiter) or leave its queue",
        tag="locks",
        answer="LockReleased",
        parameters=("lock_name",),
        body="LockRelease",
        write=True,
        errors=(404,),
    ),
    Operation(
        method="get",
        path="/v1/locks/{name}",
        operation_id="lockGet",
        summary="Inspect a lock: holder, fencing token, waiters",
        tag="locks",
        answer="Lock",
        parameters=("lock_name", "consistency"),
        errors=(404,),
    ),
    Operation(
        method="post",
        path="/v1/locks/{name}/validate",
        operation_id="lockValidate",
        summary="Check whether a fencing token is the lock's current grant",
        tag="locks",
        answer="LockValidity",
        parameters=("lock_name", "consistency"),
        body="LockValidate",
        errors=(413,),
    ),
    # Jobs.
    Operation(
        method="post",
        path="/v1/jobs",
        operation_id="jobSubmit",
        summary="Submit a job",
        tag="jobs",
        answer="JobSubmitted",
        status=201,
        body="JobSpec",
        write=True,
    ),
    Operation(
        method="get",
        path="/v1/jobs",
        operation_id="jobList",
        summary="List the tenant's jobs in submission order, filtered and paged",
        tag="jobs",
        answer="JobPage",
        parameters=("job_state", "job_after", "limit", "consistency"),
        errors=(413,),
    ),
    Operation(
        method="get",
        path="/v1/jobs/{job_id}",
        operation_id="jobGet",
        summary="Read a job, optionally waiting for it to finish",
        tag="jobs",
        answer="Job",
        parameters=("job_id", "job_wait_s", "consistency"),
        errors=(404,),
        description="With wait_s the answer comes when every task has finished, or after "
        "wait_s with the job as it then is.",
    ),
    Operation(
        method="post",
        path="/v1/jobs/{job_id}/cancel",
        operation_id="jobCancel",
        summary="Cancel a job's unfinished tasks",
        tag="jobs",
        answer="JobCancelled",
        parameters=("job_id",),
        body="JobCancel",
        body_required=False,
        write=True,
        errors=(404,),
    ),
    Operation(
        method="get",
        path="/v1/jobs/{job_id}/events",
        operation_id="jobEvents",
        summary="A job's timeline: submission, then each attempt's start and end",
        tag="jobs",
        answer="JobEvents",
        parameters=("job_id", "consistency"),
        errors=(404,),
    ),
    Operation(
        method="get",
        path="/v1/jobs/{job_id}/logs",
        operation_id="jobLogs",
        summary="The end of a task attempt's captured stdout and stderr (from its region)",
        tag="jobs",
        answer="JobLogs",
        parameters=("job_id", "task_index", "attempt", "tail_bytes"),
        errors=(404, 503),
    ),
    # Tenants.
    Operation(
        method="get",
        path="/v1/tenants",
        operation_id="tenantList",
        summary="Tenants' scheduling settings: fair-share weight, quotas, price and carbon weights",
        tag="tenants",
        answer="TenantList",
        parameters=("consistency",),
    ),
    Operation(
        method="put",
        path="/v1/tenants/{name}",
        operation_id="tenantSet",
        summary="Set a tenant's scheduling settings (admins); unset fields take their defaults",
        tag="tenants",
        answer="TenantSetResult",
        parameters=("tenant_name",),
        body="TenantSet",
        write=True,
        errors=(403,),
    ),
    # Regions and the cluster.
    Operation(
        method="get",
        path="/v1/regions",
        operation_id="regionList",
        summary="List regions",
        tag="regions",
        answer="RegionList",
        parameters=("consistency",),
    ),
    Operation(
        method="get",
        path="/v1/regions/{name}",
        operation_id="regionGet",
        summary="Read a region",
        tag="regions",
        answer="Region",
        parameters=("region_name", "consistency"),
        errors=(404,),
    ),
    Operation(
        method="get",
        path="/v1/cluster/status",
        operation_id="clusterStatus",
        summary="This node's view of the Raft group",
        tag="cluster",
        answer="ClusterStatus",
    ),
    Operation(
        method="get",
        path="/v1/cluster/members",
        operation_id="clusterMembers",
        summary="Members, their regions and replication progress (operators and admins)",
        tag="cluster",
        answer="Members",
        errors=(403,),
    ),
    Operation(
        method="post",
        path="/v1/cluster/transfer-leader",
        operation_id="clusterTransferLeader",
        summary="Move leadership to a region's member (admins)",
        tag="cluster",
        answer="TransferLeaderResult",
        body="TransferLeader",
        errors=(403, 404, 413),
        description="Any node takes it: a follower forwards it to the leader.",
    ),
    Operation(
        method="get",
        path="/v1/snapshot",
        operation_id="snapshotSave",
        summary="A consistent backup of the replicated state (admins)",
        tag="cluster",
        answer="Snapshot",
        errors=(403,),
        description="Answered after a linearizable read barrier; `file` is the backup file that "
        "`xr snapshot restore` seeds a new cluster from (docs/durability.md).",
    ),
    Operation(
        method="get",
        path="/v1/snapshot/hash",
        operation_id="snapshotHash",
        summary="This node's applied state: index and SHA-256 (admins)",
        tag="cluster",
        answer="StateHash",
        errors=(403,),
        description="Local, without a barrier: members at the same index have the same hash.",
    ),
    # Watch.
    Operation(
        method="get",
        path="/v1/watch",
        operation_id="watch",
        summary="KV changes under a prefix from a revision on: a long poll, or Server-Sent Events",
        tag="watch",
        answer="WatchEvents",
        parameters=(
            "prefix",
            "from_revision",
            "last_event_id",
            "limit",
            "watch_wait_s",
            "consistency",
        ),
        errors=(410, 413),
        description=_SSE,
    ),
    # The web dashboard's data (its page and files at /ui are not part of the API).
    Operation(
        method="get",
        path="/v1/ui/state",
        operation_id="uiState",
        summary="What the web dashboard shows: cluster status, regions, and the tenant's newest "
        "jobs, locks and sessions",
        tag="ui",
        answer="UiState",
        parameters=("consistency",),
    ),
    Operation(
        method="get",
        path="/v1/ui/events",
        operation_id="uiEvents",
        summary="The dashboard's snapshot as Server-Sent Events, again after each change",
        tag="ui",
        answer=None,
        description="A stream of `event: state` events whose data is a UiState (read from this "
        "node's replica, `stale: true`), one at once and another whenever the replica applies "
        "new entries, at most four a second; comment lines keep the connection alive. It "
        "counts against http.streams_max.",
    ),
)


def _success(operation: Operation) -> dict[str, Any]:
    if operation.path == "/metrics":
        content: dict[str, Any] = {"text/plain": {"schema": TEXT}}
    elif operation.answer is None:
        content = {"application/json": {"schema": {"type": "object"}}}
    else:
        content = _content(_ref(operation.answer))
    if operation.path == "/v1/watch":
        content["text/event-stream"] = {"schema": TEXT}
    if operation.path == "/v1/ui/events":
        content = {"text/event-stream": {"schema": TEXT}}
    headers = (REQUEST_ID_HEADER,) if operation.open else (REQUEST_ID_HEADER, INDEX_HEADER)
    return {"description": "OK", "headers": _header_refs(*headers), "content": content}


def _operation(operation: Operation) -> dict[str, Any]:
    parameters = list(operation.parameters)
    if operation.write:
        parameters += ["client_id", "seq"]
    errors = set(operation.errors)
    if not operation.open:
        errors |= set(_COMMON_ERRORS)
    if operation.write:
        errors |= set(_WRITE_ERRORS)
    responses: dict[str, Any] = {str(operation.status): _success(operation)}
    if operation.path == "/readyz":
        responses["503"] = {"description": "Not ready", "content": _content(_ref("Ready"))}
        errors.discard(503)
    for status in sorted(errors):
        responses[str(status)] = {"$ref": f"#/components/responses/Error{status}"}
    described: dict[str, Any] = {
        "operationId": operation.operation_id,
        "summary": operation.summary,
        "tags": [operation.tag],
        "responses": responses,
    }
    if operation.description is not None:
        described["description"] = operation.description
    if parameters:
        described["parameters"] = [
            {"$ref": f"#/components/parameters/{name}"} for name in parameters
        ]
    if operation.body is not None:
        described["requestBody"] = {
            "required": operation.body_required,
            "content": _content(_ref(operation.body)),
        }
    if operation.open:
        described["security"] = []
    return described


_TAGS = ("kv", "sessions", "locks", "jobs", "watch", "regions", "cluster", "health", "meta", "ui")


def parameter_table() -> dict[str, Any]:
    """Every parameter by its key in `Operation.parameters`: name, place ("query", "path",
    "header") and schema (bounds from the configuration at their defaults)."""
    return _parameters(wait_max_s=60.0)


def document(*, wait_max_s: float = 60.0, body_bytes_max: int = 1 << 20) -> dict[str, Any]:
    """The document, with the bounds of the node's configuration filled in."""
    paths: dict[str, dict[str, Any]] = {}
    for operation in OPERATIONS:
        paths.setdefault(operation.path, {})[operation.method] = _operation(operation)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "xr region node API",
            "version": "1",
            "description": "Every region node serves the whole API; writes and linearizable "
            "reads go through the replicated log. Bodies are JSON, or msgpack with "
            "`Content-Type`/`Accept: application/msgpack`; a body may be at most "
            f"{body_bytes_max} bytes, sent uncompressed (no `Content-Encoding`), and must "
            "arrive within http.request_timeout_s. Keys, lock names, sessions and jobs live in "
            "the caller's "
            "tenant namespace; another tenant's object answers 404. Every error is "
            '`{"error": {"code", "message", "definite"}}`.',
        },
        "tags": [{"name": name} for name in _TAGS],
        "paths": paths,
        "components": {
            "schemas": _schemas(wait_max_s=wait_max_s),
            "parameters": _parameters(wait_max_s=wait_max_s),
            "responses": _error_responses(),
            "headers": _HEADERS,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token from the node's auth.tokens; its role and tenant "
                    "decide what the caller may do. With no tokens configured, authentication "
                    "is off.",
                }
            },
        },
        "security": [{"bearer": []}],
    }


@routes.get("/v1/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    http = services(request).config.http
    return respond(
        request, document(wait_max_s=http.wait_max_s, body_bytes_max=http.body_bytes_max)
    )
