"""Inventory: CPU mode without CuPy or with a broken CUDA, GPU mode through stand-ins for CuPy
and NVML, the heartbeat's `Gpu` records; and the array-module seam it shares with the worker."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from node.executor import arrays
from node.executor.arrays import DeviceUnavailable, array_module, device_index
from node.executor.inventory import Inventory, detect, to_gpus
from xrcore.commands import RegionHeartbeat

GIB = 1 << 30


def no_cupy() -> ModuleType:
    raise ImportError("No module named 'cupy'")


def fake_cupy(count: int = 2, *, broken: bool = False) -> ModuleType:
    def device_count() -> int:
        if broken:
            raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver is older than runtime")
        return count

    def properties(index: int) -> dict[str, Any]:
        return {
            "name": b"NVIDIA H100 80GB HBM3",
            "totalGlobalMem": 80 * GIB,
            "major": 9,
            "minor": 0,
        }

    class Device:
        def __init__(self, index: int) -> None:
            self.index = index

        def __enter__(self) -> Device:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    runtime = SimpleNamespace(
        getDeviceCount=device_count,
        getDeviceProperties=properties,
        memGetInfo=lambda: (60 * GIB, 80 * GIB),
        deviceGetPCIBusId=lambda index: f"0000:0{index}:00.0",
    )
    module = ModuleType("cupy")
    module.cuda = SimpleNamespace(runtime=runtime, Device=Device)  # type: ignore[attr-defined]
    return module


def fake_nvml() -> ModuleType:
    module = ModuleType("pynvml")
    handles = {"0000:00:00.0": 0, "0000:01:00.0": 1}
    module.nvmlDeviceGetHandleByPciBusId = handles.__getitem__  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda handle: SimpleNamespace(  # type: ignore[attr-defined]
        free=(70 - 10 * handle) * GIB
    )
    module.nvmlDeviceGetPowerUsage = lambda handle: 312_500  # type: ignore[attr-defined]
    return module


def no_nvml() -> ModuleType:
    raise ImportError("No module named 'pynvml'")


# Inventory.


def test_cpu_mode_on_this_machine_has_the_configured_slots() -> None:
    inventory = detect(4)
    if inventory.mode == "gpu":
        pytest.skip("this machine has a GPU")
    assert inventory == Inventory(mode="cpu", cpu_slots=4, reason=inventory.reason)
    assert inventory.reason
    assert to_gpus(inventory) == ()


def test_cpu_mode_without_cupy_says_why() -> None:
    inventory = detect(2, load_cupy=no_cupy)
    assert inventory == Inventory(mode="cpu", cpu_slots=2, reason="CuPy is not installed")


def test_a_broken_cuda_installation_is_cpu_mode_with_the_reason() -> None:
    inventory = detect(3, load_cupy=lambda: fake_cupy(broken=True), load_nvml=no_nvml)
    assert inventory.mode == "cpu" and inventory.cpu_slots == 3
    assert inventory.reason is not None and "cudaErrorInsufficientDriver" in inventory.reason


def test_no_device_is_cpu_mode() -> None:
    inventory = detect(1, load_cupy=lambda: fake_cupy(count=0), load_nvml=no_nvml)
    assert inventory.mode == "cpu" and inventory.reason == "CUDA reports no device"


def test_gpu_mode_with_nvml_reads_free_memory_and_power() -> None:
    inventory = detect(0, load_cupy=fake_cupy, load_nvml=fake_nvml)
    assert inventory.mode == "gpu" and inventory.reason is None
    assert [gpu.index for gpu in inventory.gpus] == [0, 1]
    first, second = inventory.gpus
    assert first.model == "NVIDIA H100 80GB HBM3"
    assert first.compute_capability == "9.0"
    assert (first.memory_mb, first.free_mb, second.free_mb) == (81920, 71680, 61440)
    assert first.power_draw_w == 312.5


def test_gpu_mode_without_nvml_asks_cuda_for_free_memory() -> None:
    inventory = detect(0, load_cupy=fake_cupy, load_nvml=no_nvml)
    assert [gpu.free_mb for gpu in inventory.gpus] == [61440, 61440]
    assert all(gpu.power_draw_w is None for gpu in inventory.gpus)


def test_to_gpus_builds_valid_heartbeat_records() -> None:
    inventory = detect(0, load_cupy=fake_cupy, load_nvml=fake_nvml)
    heartbeat = RegionHeartbeat(name="us-east", gpus=to_gpus(inventory))
    assert [gpu.model for gpu in heartbeat.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert heartbeat.gpus[0].free_mb == 71680
    assert heartbeat.gpus[0].compute_capability == "9.0"


@pytest.mark.gpu
def test_a_real_gpu_is_found() -> None:
    inventory = detect(0)
    assert inventory.mode == "gpu", inventory.reason
    assert inventory.gpus and all(gpu.memory_mb > 0 for gpu in inventory.gpus)
    assert all(0 < gpu.free_mb <= gpu.memory_mb for gpu in inventory.gpus)
    assert to_gpus(inventory)


# The array-module seam.


def test_cpu_is_numpy_and_a_gpu_without_cupy_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert array_module("cpu") is np
    monkeypatch.setattr(arrays, "load_cupy", no_cupy)
    with pytest.raises(DeviceUnavailable, match=r"cuda:0 needs CuPy, which is not installed"):
        array_module("cuda:0")


@pytest.mark.parametrize("device", ["gpu", "cuda", "cuda:x", "CPU", "cuda:0:1"])
def test_bad_device_names_are_refused(device: str) -> None:
    with pytest.raises(ValueError, match="device must be"):
        device_index(device)


def test_memory_limit_is_a_no_op_on_numpy_and_says_so() -> None:
    assert arrays.set_memory_limit(np, 1 << 30) is False
    assert np.array_equal(arrays.to_numpy([1, 2]), np.array([1, 2]))
    assert not arrays.is_out_of_memory(MemoryError())


@pytest.mark.gpu
def test_memory_limit_caps_cupys_pool() -> None:
    cupy = array_module("cuda:0")
    pool = cupy.get_default_memory_pool()
    try:
        assert arrays.set_memory_limit(cupy, 64 << 20) is True
        with pytest.raises(Exception) as raised:
            cupy.zeros(128 << 20, dtype=cupy.uint8)
        assert arrays.is_out_of_memory(raised.value)
    finally:
        pool.set_limit(size=0)
