"""`xr tenant`: tenants' scheduling settings (fair-share weight, quotas, price and carbon)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from node.cli_common import (
    FiniteFloatRange,
    client_options,
    connect,
    emit,
    non_empty,
    table,
    to_document,
)

__all__ = ["tenant"]

F = TypeVar("F", bound=Callable[..., Any])

# The largest quotas the cluster takes (`xrcore.commands.TenantSet.validate`, which spells them
# as literals; `tests/node/test_cli_tenant.py` holds these to it): with no bound here, a value
# past 2^64 drew a message naming the bound of a 64-bit integer instead of the cluster's.
SCHEDULING_QUOTA_MAX = 1 << 20  # gpus_max, tasks_max
TABLE_QUOTA_MAX = 1 << 30  # keys_max, sessions_max, clients_max, jobs_max, unfinished_tasks_max

# A tenant's shares of the replicated tables, as `xr tenant list` names them.
_TABLE_QUOTAS = {
    "keys_max": "keys",
    "sessions_max": "sessions",
    "clients_max": "clients",
    "jobs_max": "jobs",
    "unfinished_tasks_max": "unfinished tasks",
}


@click.group()
def tenant() -> None:
    """Tenants' settings: fair-share weight, GPU and task quotas, how much price and carbon
    weigh against completion time when the scheduler picks a region, and each tenant's shares
    of the cluster's tables (keys, sessions, client records, jobs, unfinished tasks)."""


@tenant.command("list")
@client_options
def tenant_list() -> int:
    """List tenants whose settings were set (the others have the defaults)."""
    with connect() as client:
        items = client.tenants.list()

    def human() -> None:
        if not items:
            click.echo("no tenant settings (every tenant has the defaults)")
            return
        rows = [
            [
                item.name,
                item.weight,
                item.gpus_max,
                item.tasks_max,
                item.cost_weight,
                item.carbon_weight,
                ", ".join(
                    f"{label} {getattr(item, field)}"
                    for field, label in _TABLE_QUOTAS.items()
                    if getattr(item, field) is not None
                )
                or None,
            ]
            for item in items
        ]
        headers = ["TENANT", "WEIGHT", "GPUS MAX", "TASKS MAX", "COST WEIGHT", "CARBON WEIGHT"]
        headers.append("TABLE QUOTAS")
        click.echo(table(headers, rows))

    emit({"items": to_document(items)}, human)
    return 0


def _quota_option(flag: str, help_text: str) -> Callable[[F], F]:
    return click.option(
        flag,
        type=click.IntRange(min=0, max=TABLE_QUOTA_MAX),
        default=None,
        help=f"{help_text} (default: no quota of its own)",
    )


@tenant.command("set")
@click.argument("name", callback=non_empty)
@click.option(
    "--weight",
    type=FiniteFloatRange(min=0, min_open=True, max=1000),
    default=1.0,
    show_default=True,
    help="Fair-share weight: a tenant with 2 gets twice the share.",
)
@click.option(
    "--gpus-max",
    type=click.IntRange(min=0, max=SCHEDULING_QUOTA_MAX),
    default=None,
    help="Most GPUs the tenant's running tasks may hold (default: no quota).",
)
@click.option(
    "--tasks-max",
    type=click.IntRange(min=0, max=SCHEDULING_QUOTA_MAX),
    default=None,
    help="Most tasks the tenant may run at once (default: no quota).",
)
@click.option(
    "--cost-weight",
    type=FiniteFloatRange(min=0, max=1000),
    default=1.0,
    show_default=True,
    help="How much price counts against completion time.",
)
@click.option(
    "--carbon-weight",
    type=FiniteFloatRange(min=0, max=1000),
    default=1.0,
    show_default=True,
    help="How much carbon counts against completion time.",
)
@_quota_option("--keys-max", "Most keys in the tenant's namespace.")
@_quota_option("--sessions-max", "Most sessions the tenant owns at once.")
@_quota_option(
    "--clients-max", "Most client records of the tenant's writes (idle ones go after an hour)."
)
@_quota_option(
    "--jobs-max",
    "Most of the tenant's jobs kept, finished ones included (at it, a submission evicts the "
    "tenant's own oldest finished jobs).",
)
@_quota_option("--unfinished-tasks-max", "Most of the tenant's tasks not yet finished.")
@client_options
def tenant_set(
    name: str,
    weight: float,
    gpus_max: int | None,
    tasks_max: int | None,
    cost_weight: float,
    carbon_weight: float,
    **quotas: int | None,
) -> int:
    """Set all of a tenant's settings (admins only); options left out take their defaults. The
    *-max options after the weights are the tenant's shares of the cluster's tables, which
    otherwise one tenant can fill for all (docs/authorization.md, "Tenants' shares")."""
    with connect() as client:
        created = client.tenants.set(
            name,
            weight=weight,
            gpus_max=gpus_max,
            tasks_max=tasks_max,
            cost_weight=cost_weight,
            carbon_weight=carbon_weight,
            **quotas,
        )
    emit(
        {"name": name, "created": created},
        lambda: click.echo(f"tenant {name} {'created' if created else 'updated'}"),
    )
    return 0
