"""Regions: registration, heartbeats with inventory and RTTs, health on the lease clock."""

from __future__ import annotations

import pytest

from xrcore import errors, regions
from xrcore.commands import Gpu, RegionHeartbeat, RegionRegister, Tick
from xrcore.limits import Limits

from .helpers import Driver


def _register(driver: Driver, name: str = "eu-west", price: float = 2.0) -> None:
    driver.ok(
        RegionRegister(
            name=name,
            http_address="http://127.0.0.1:8000",
            raft_address="127.0.0.1:9000",
            provider="acme",
            price_per_gpu_hour=price,
            carbon_g_per_kwh=100.0,
            labels={"tier": "gold"},
        )
    )


def test_heartbeat__records_inventory_and_rtts_and_makes_the_region_healthy() -> None:
    driver = Driver()
    _register(driver)
    assert regions.get(driver.machine, "eu-west")["healthy"] is False
    gpus = (Gpu(model="A100", memory_mb=81_920, free_mb=40_000),)
    driver.ok(RegionHeartbeat(name="eu-west", gpus=gpus, rtt_ms={"us-east": 80.5}))
    view = regions.get(driver.machine, "eu-west")
    assert view["healthy"] is True
    assert view["gpus"] == [{"model": "A100", "memory_mb": 81_920, "free_mb": 40_000}]
    assert view["rtt_ms"] == {"us-east": 80.5}
    assert view["labels"] == {"tier": "gold"}


def test_health__lost_after_the_timeout_of_working_cluster_time() -> None:
    driver = Driver(Limits(region_heartbeat_timeout_ms=3_000))
    _register(driver)
    driver.ok(RegionHeartbeat(name="eu-west"))
    # A long commit gap counts as one step only: still healthy.
    driver.ok(Tick(), advance_ms=600_000)
    assert regions.get(driver.machine, "eu-west")["healthy"] is True
    for _ in range(3):
        driver.ok(Tick(), advance_ms=1_000)
    assert regions.get(driver.machine, "eu-west")["healthy"] is False


def test_register_again__updates_labels_and_keeps_inventory() -> None:
    driver = Driver()
    _register(driver)
    driver.ok(RegionHeartbeat(name="eu-west", gpus=(Gpu(model="L4", memory_mb=1, free_mb=1),)))
    answer = driver.ok(
        RegionRegister(
            name="eu-west",
            http_address="http://127.0.0.1:8001",
            raft_address="127.0.0.1:9001",
            price_per_gpu_hour=1.5,
        )
    )
    assert answer["created"] is False
    view = regions.get(driver.machine, "eu-west")
    assert (view["price_per_gpu_hour"], len(view["gpus"])) == (1.5, 1)


def test_heartbeat__from_an_unregistered_region__is_not_found() -> None:
    assert Driver().error(RegionHeartbeat(name="ghost")) == "not_found"


def test_regions_max__is_enforced_and_list_is_sorted() -> None:
    driver = Driver(Limits(regions_max=2))
    _register(driver, "b")
    _register(driver, "a")
    assert driver.error(RegionRegister(name="c", http_address="h", raft_address="r")) == (
        "limit.capacity"
    )
    assert [view["name"] for view in regions.list_(driver.machine)] == ["a", "b"]


def test_get__unknown_region__is_not_found() -> None:
    with pytest.raises(errors.NotFound):
        regions.get(Driver().machine, "nowhere")
