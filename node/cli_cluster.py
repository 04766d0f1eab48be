"""`xr cluster` and `xr region`: the Raft members, the leader, and the registered regions."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click

from node.cli_common import (
    CommandFailed,
    client_options,
    connect,
    emit,
    exit_code_for,
    format_time_ms,
    key_values,
    non_empty,
    open_client,
    options,
    resolve_settings,
    table,
    to_document,
)

__all__ = ["cluster", "region"]


@click.group()
def cluster() -> None:
    """The Raft members, the leader and leadership transfer."""


@cluster.command("status")
@client_options
def cluster_status() -> int:
    """Ask every endpoint for its view: its role, the leader, term and log indexes.

    An endpoint that does not answer is shown with its error; the command fails only when none
    answers.
    """
    from xrcore.errors import XrError

    settings = resolve_settings(options(), os.environ)

    def ask(endpoint: str) -> dict[str, Any]:
        client = open_client(settings, endpoints=[endpoint])
        try:
            return {"endpoint": endpoint, **to_document(client.cluster.status())}
        except XrError as error:
            return {"endpoint": endpoint, "error": error.to_dict()}
        finally:
            client.close()

    # All at once, so endpoints that do not answer cost one timeout together, not one each.
    with ThreadPoolExecutor(max_workers=len(settings.endpoints)) as pool:
        rows = list(pool.map(ask, settings.endpoints))

    def human() -> None:
        click.echo(
            table(
                [
                    *["ENDPOINT", "REGION", "STATE", "LEADER", "TERM", "COMMIT", "APPLIED"],
                    *["QUORUM", "VERSION"],
                ],
                [
                    [
                        row["endpoint"],
                        row["region"],
                        row["state"],
                        row["leader_region"] or row["leader"],
                        row["term"],
                        row["commit_index"],
                        row["applied_index"],
                        row["has_quorum"],
                        # A node of a release before 0.32.0 does not say.
                        row["version"] or "before 0.32.0",
                    ]
                    if "error" not in row
                    else [row["endpoint"], f"error: {row['error']['code']}"] + [None] * 7
                    for row in rows
                ],
            )
        )
        for row in rows:
            if "error" in row:
                click.echo(f"{row['endpoint']}: {row['error']['message']}", err=True)
            elif row["apply_halted"] is not None:
                click.echo(f"{row['endpoint']}: stopped applying: {row['apply_halted']}", err=True)
        if len({row["version"] for row in rows if "error" not in row}) > 1:
            click.echo("the nodes run different releases (an upgrade under way?)", err=True)

    emit({"endpoints": rows}, human)
    answered = [row for row in rows if "error" not in row]
    if not answered:
        errors = [row["error"] for row in rows]
        raise CommandFailed(
            errors[0]["code"],
            f"no endpoint answered ({', '.join(settings.endpoints)})",
            exit_code=exit_code_for(definite=all(error["definite"] for error in errors)),
        )
    return 0


@cluster.command("members")
@client_options
def cluster_members() -> int:
    """List the Raft members as the answering node sees them."""
    with connect() as client:
        members = client.cluster.members()

    def human() -> None:
        rows = [
            [
                member.region,
                member.raft_address,
                member.http_address,
                "leader" if member.leader else "follower",
                member.connected,
                member.match_index,
                None if member.last_contact_s is None else f"{member.last_contact_s:.2f}",
            ]
            for member in members
        ]
        headers = ["REGION", "RAFT ADDRESS", "API ADDRESS", "ROLE", "CONNECTED", "MATCH INDEX"]
        click.echo(table([*headers, "LAST CONTACT S"], rows))

    emit({"items": to_document(members)}, human)
    return 0


@cluster.command("transfer-leader")
@click.argument("region_name", metavar="REGION", callback=non_empty)
@client_options
def cluster_transfer_leader(region_name: str) -> int:
    """Hand the leadership to REGION's node (admin only)."""
    with connect() as client:
        transferred = client.cluster.transfer_leader(region_name)
    document = {"leader_region": region_name, "transferred": transferred}
    human = (
        f"{region_name} is now the leader"
        if transferred
        else f"{region_name} was already the leader"
    )
    emit(document, human)
    return 0


@click.group()
def region() -> None:
    """The regions registered with the cluster."""


@region.command("ls")
@client_options
def region_ls() -> int:
    """List the regions with their health, addresses and capacity."""
    with connect() as client:
        regions = client.regions.list()

    def human() -> None:
        if not regions:
            click.echo("no regions registered")
            return
        rows = [
            [
                item.name,
                item.healthy,
                item.http_address,
                item.raft_address,
                item.provider or None,
                len(item.gpus),
                item.cpu_slots,
                format_time_ms(item.heartbeat_at_ms),
            ]
            for item in regions
        ]
        headers = ["REGION", "HEALTHY", "API ADDRESS", "RAFT ADDRESS", "PROVIDER", "GPUS"]
        click.echo(table([*headers, "CPU SLOTS", "LAST HEARTBEAT"], rows))

    emit({"items": to_document(regions)}, human)
    return 0


@region.command("show")
@click.argument("name", callback=non_empty)
@client_options
def region_show(name: str) -> int:
    """Show one region: addresses, labels, prices, GPUs and round-trip times."""
    with connect() as client:
        item = client.regions.get(name)
    if item is None:
        raise CommandFailed("not_found", f"region {name!r} is not registered")

    def human() -> None:
        click.echo(
            key_values(
                [
                    ("region", item.name),
                    ("healthy", item.healthy),
                    ("api address", item.http_address),
                    ("raft address", item.raft_address),
                    ("provider", item.provider or None),
                    ("price per GPU hour", item.price_per_gpu_hour),
                    ("carbon g per kWh", item.carbon_g_per_kwh),
                    ("labels", dict(item.labels)),
                    ("cpu slots", item.cpu_slots),
                    ("last heartbeat", format_time_ms(item.heartbeat_at_ms)),
                    (
                        "round trips ms",
                        {peer: f"{rtt_ms:.1f}" for peer, rtt_ms in item.rtt_ms.items()},
                    ),
                ]
            )
        )
        if item.gpus:
            click.echo("")
            click.echo(
                table(
                    ["GPU", "MODEL", "MEMORY MB", "FREE MB"],
                    [
                        [position, gpu.model, gpu.memory_mb, gpu.free_mb]
                        for position, gpu in enumerate(item.gpus)
                    ],
                )
            )

    emit(item, human)
    return 0
