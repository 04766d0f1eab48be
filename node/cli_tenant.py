"""`xr tenant`: tenants' scheduling settings (fair-share weight, quotas, price and carbon)."""

from __future__ import annotations

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


@click.group()
def tenant() -> None:
    """Tenants' scheduling settings: fair-share weight, GPU and task quotas, and how much price
    and carbon weigh against completion time when the scheduler picks a region."""


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
            ]
            for item in items
        ]
        headers = ["TENANT", "WEIGHT", "GPUS MAX", "TASKS MAX", "COST WEIGHT", "CARBON WEIGHT"]
        click.echo(table(headers, rows))

    emit({"items": to_document(items)}, human)
    return 0


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
    type=click.IntRange(min=0),
    default=None,
    help="Most GPUs the tenant's running tasks may hold (default: no quota).",
)
@click.option(
    "--tasks-max",
    type=click.IntRange(min=0),
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
@client_options
def tenant_set(
    name: str,
    weight: float,
    gpus_max: int | None,
    tasks_max: int | None,
    cost_weight: float,
    carbon_weight: float,
) -> int:
    """Set all of a tenant's scheduling settings (admins only); options left out take their
    defaults."""
    with connect() as client:
        created = client.tenants.set(
            name,
            weight=weight,
            gpus_max=gpus_max,
            tasks_max=tasks_max,
            cost_weight=cost_weight,
            carbon_weight=carbon_weight,
        )
    emit(
        {"name": name, "created": created},
        lambda: click.echo(f"tenant {name} {'created' if created else 'updated'}"),
    )
    return 0
