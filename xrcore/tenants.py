"""Tenants' scheduling settings: fair-share weight, quotas, and weights for price and carbon.

A tenant that was never set has the defaults (weight 1, no quotas, price and carbon weighted 1),
so setting tenants is optional. Setting one replaces all of its settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xrcore.commands import TenantSet
from xrcore.errors import CapacityExceeded
from xrcore.model import Tenant

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = ["Tenant", "list_", "set_"]


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
    }


def list_(machine: StateMachine) -> dict[str, Any]:
    return {"items": [_view(machine.tenants[name]) for name in sorted(machine.tenants)]}
