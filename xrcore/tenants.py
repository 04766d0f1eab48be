"""Tenants' settings: fair-share weight, scheduling quotas, weights for price and carbon, and
shares of the replicated tables.

A tenant that was never set has the defaults (weight 1, no quotas, price and carbon weighted 1),
so setting tenants is optional. Setting one replaces all of its settings.

The table capacities of `xrcore.limits.Limits` are the cluster's: without a share of its own, one
tenant can fill a table for all (every session, every client record, every job slot, evicting
other tenants' finished jobs). A tenant's table quotas (`TABLE_QUOTAS`) bound what it holds:
keys in its namespace, sessions it owns, client records of its writes, its jobs in the table
(finished ones included: at its quota a submission evicts the tenant's own oldest finished job,
never another tenant's) and its tasks not yet finished. What a tenant holds is counted when it
asks for more and only if it has a quota (keys by bisecting the sorted keys, the rest by a scan
of the table), so nothing is kept besides the tables themselves and a quota costs nothing to
tenants without one.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from xrcore.commands import TABLE_QUOTAS, TenantSet
from xrcore.errors import CapacityExceeded
from xrcore.model import Tenant

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = [
    "Tenant",
    "check_clients",
    "check_keys",
    "check_sessions",
    "jobs_to_evict",
    "list_",
    "set_",
]


def set_(machine: StateMachine, command: TenantSet, index: int) -> dict[str, Any]:
    if command.name not in machine.tenants and len(machine.tenants) >= machine.limits.tenants_max:
        raise CapacityExceeded(f"the maximum of {machine.limits.tenants_max} tenants is reached")
    created = command.name not in machine.tenants
    machine.tenants[command.name] = Tenant(
        name=command.name,
        weight=command.weight,
        gpus_max=command.gpus_max,
        tasks_max=command.tasks_max,
        cost_weight=command.cost_weight,
        carbon_weight=command.carbon_weight,
        **{field: getattr(command, field) for field in TABLE_QUOTAS},
    )
    machine.schedule_revision += 1
    return {"name": command.name, "created": created}


def _view(tenant: Tenant) -> dict[str, Any]:
    return {
        "name": tenant.name,
        "weight": tenant.weight,
        "gpus_max": tenant.gpus_max,
        "tasks_max": tenant.tasks_max,
        "cost_weight": tenant.cost_weight,
        "carbon_weight": tenant.carbon_weight,
        **{field: getattr(tenant, field) for field in TABLE_QUOTAS},
    }


def list_(machine: StateMachine) -> dict[str, Any]:
    return {"items": [_view(machine.tenants[name]) for name in sorted(machine.tenants)]}


# Table quotas.


def _quota(machine: StateMachine, tenant: str, field: str) -> int | None:
    record = machine.tenants.get(tenant)
    return None if record is None else getattr(record, field)


def _refuse(tenant: str, held: int, quota: int, what: str, option: str) -> CapacityExceeded:
    return CapacityExceeded(
        f"tenant {tenant!r} holds {held} {what}, and its quota is {quota} (xr tenant set "
        f"{tenant} --{option})"
    )


def check_keys(machine: StateMachine, key: str) -> None:
    """Before a new key: its tenant's (the part before the first '/') `keys_max`."""
    tenant, separator, _ = key.partition("/")
    quota = _quota(machine, tenant, "keys_max") if separator else None
    if quota is None:
        return
    keys = machine.sorted_keys
    # Every key of the namespace lies between "tenant/" and "tenant0" ('0' follows '/').
    held = bisect_left(keys, f"{tenant}0") - bisect_left(keys, f"{tenant}/")
    if held >= quota:
        raise _refuse(tenant, held, quota, "keys", "keys-max")


def check_sessions(machine: StateMachine, owner: str) -> None:
    """Before a new session: its owner's `sessions_max`."""
    quota = _quota(machine, owner, "sessions_max")
    if quota is None:
        return
    held = sum(1 for session in machine.sessions.values() if session.owner == owner)
    if held >= quota:
        raise _refuse(owner, held, quota, "sessions", "sessions-max")


def check_clients(machine: StateMachine, client_id: str) -> None:
    """Before a new client record: the `clients_max` of the tenant whose writes it records
    (the node prefixes a client id with its caller's tenant)."""
    tenant, separator, _ = client_id.partition("/")
    quota = _quota(machine, tenant, "clients_max") if separator else None
    if quota is None:
        return
    prefix = f"{tenant}/"
    held = sum(1 for held_id in machine.clients if held_id.startswith(prefix))
    if held >= quota:
        raise CapacityExceeded(
            f"tenant {tenant!r} holds {held} client records, and its quota is {quota} (xr tenant "
            f"set {tenant} --clients-max); reuse a client id, or retry once idle ones are "
            "forgotten"
        )


def jobs_to_evict(machine: StateMachine, tenant: str, tasks: int) -> list[str]:
    """Before a tenant's new job of `tasks` tasks: refuses it past the tenant's
    `unfinished_tasks_max`, and at or over its `jobs_max` returns the tenant's oldest finished
    jobs, to be evicted so that it holds one fewer than its quota (refused when it has too few
    finished jobs: a quota lowered below what a tenant holds is reached again, not kept
    exceeded)."""
    record = machine.tenants.get(tenant)
    if record is None or (record.jobs_max is None and record.unfinished_tasks_max is None):
        return []
    held_jobs = 0
    unfinished_tasks = 0
    finished: list[str] = []
    for job_id, job in machine.jobs.items():
        if job.spec.tenant != tenant:
            continue
        held_jobs += 1
        unfinished = sum(1 for task in job.tasks if not task.state.terminal)
        unfinished_tasks += unfinished
        if unfinished == 0:
            finished.append(job_id)
    quota = record.unfinished_tasks_max
    if quota is not None and unfinished_tasks + tasks > quota:
        raise CapacityExceeded(
            f"tenant {tenant!r} has {unfinished_tasks} unfinished tasks; {tasks} more would pass "
            f"its quota of {quota} (xr tenant set {tenant} --unfinished-tasks-max)"
        )
    if record.jobs_max is None or held_jobs < record.jobs_max:
        return []
    excess = held_jobs - record.jobs_max + 1
    if len(finished) < excess:
        raise _refuse(
            tenant, held_jobs, record.jobs_max, f"jobs ({len(finished)} finished)", "jobs-max"
        )
    return finished[:excess]
