"""Regions: registration, heartbeats with inventory and round-trip times, and derived health.

Health is derived, never stored: a region is healthy while its last heartbeat is within
`limits.region_heartbeat_timeout_ms` on the lease clock, so a control-plane outage does not make
every region look dead when it ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xrcore.commands import RegionHeartbeat, RegionRegister
from xrcore.errors import CapacityExceeded, NotFound
from xrcore.model import Region

if TYPE_CHECKING:
    from xrcore.state import StateMachine

__all__ = ["Region", "get", "healthy", "heartbeat", "list_", "register"]


def register(machine: StateMachine, command: RegionRegister, index: int) -> dict[str, Any]:
    """Registers a region, or updates its addresses and labels (keeping its inventory)."""
    existing = machine.regions.get(command.name)
    if existing is None and len(machine.regions) >= machine.limits.regions_max:
        raise CapacityExceeded(f"the maximum of {machine.limits.regions_max} regions is reached")
    region = Region(
        name=command.name,
        http_address=command.http_address,
        raft_address=command.raft_address,
        provider=command.provider,
        price_per_gpu_hour=command.price_per_gpu_hour,
        carbon_g_per_kwh=command.carbon_g_per_kwh,
        labels=dict(command.labels),
        cpu_slots=command.cpu_slots,
        registered_at_ms=machine.now_ms if existing is None else existing.registered_at_ms,
    )
    if existing is not None:
        region.gpus = existing.gpus
        region.rtt_ms = existing.rtt_ms
        region.heartbeat_at_ms = existing.heartbeat_at_ms
        region.heartbeat_lease_ms = existing.heartbeat_lease_ms
    machine.regions[command.name] = region
    machine.schedule_revision += 1
    return {"name": command.name, "created": existing is None}


def heartbeat(machine: StateMachine, command: RegionHeartbeat, index: int) -> dict[str, Any]:
    region = machine.regions.get(command.name)
    if region is None:
        raise NotFound(f"region {command.name!r} is not registered")
    if region.gpus != list(command.gpus) or region.heartbeat_lease_ms is None:
        # New inventory (or the first heartbeat): scheduling sees a changed region.
        machine.schedule_revision += 1
    region.gpus = list(command.gpus)
    region.rtt_ms = dict(command.rtt_ms)
    region.heartbeat_at_ms = machine.now_ms
    region.heartbeat_lease_ms = machine.lease_clock_ms
    return {"name": command.name, "healthy": True}


def healthy(machine: StateMachine, region: Region) -> bool:
    if region.heartbeat_lease_ms is None:
        return False
    age_ms = machine.lease_clock_ms - region.heartbeat_lease_ms
    return age_ms <= machine.limits.region_heartbeat_timeout_ms


def _view(machine: StateMachine, region: Region) -> dict[str, Any]:
    return {
        "name": region.name,
        "http_address": region.http_address,
        "raft_address": region.raft_address,
        "provider": region.provider,
        "price_per_gpu_hour": region.price_per_gpu_hour,
        "carbon_g_per_kwh": region.carbon_g_per_kwh,
        "labels": dict(region.labels),
        "cpu_slots": region.cpu_slots,
        "gpus": [
            {"model": gpu.model, "memory_mb": gpu.memory_mb, "free_mb": gpu.free_mb}
            for gpu in region.gpus
        ],
        "rtt_ms": dict(region.rtt_ms),
        "heartbeat_at_ms": region.heartbeat_at_ms,
        "healthy": healthy(machine, region),
    }


def get(machine: StateMachine, name: str) -> dict[str, Any]:
    region = machine.regions.get(name)
    if region is None:
        raise NotFound(f"region {name!r} is not registered")
    return _view(machine, region)


def list_(machine: StateMachine) -> list[dict[str, Any]]:
    return [_view(machine, machine.regions[name]) for name in sorted(machine.regions)]
