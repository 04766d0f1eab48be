"""What accelerators this node has, for its region's heartbeats and the executor's device pool.

GPUs are found through CuPy (count, model, total memory, compute capability) and NVML where
`pynvml` is importable (free memory and power draw, without creating a CUDA context in the node
process). Without CuPy or a device the node runs in CPU mode with its configured number of slots.
`detect` never raises: a broken CUDA installation is CPU mode too, with the reason in `reason`, so a
node always starts and says why it sees no GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import msgspec

from node.executor.arrays import load_cupy
from xrcore.commands import Gpu

__all__ = ["GpuInfo", "Inventory", "detect", "to_gpus"]

_MIB = 1 << 20
# More devices than any one machine has; a driver that reports more is broken.
_DEVICES_MAX = 1_024


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    model: str
    memory_mb: int
    free_mb: int
    # "major.minor", as NVIDIA writes it: "8.0" for an A100, "9.0" for an H100.
    compute_capability: str
    # None where NVML is not available.
    power_draw_w: float | None = None


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    mode: Literal["gpu", "cpu"]
    gpus: tuple[GpuInfo, ...] = ()
    cpu_slots: int = 0
    # Why the node is in CPU mode (no CuPy, no device, a broken driver); None in GPU mode.
    reason: str | None = None


def _load_nvml() -> ModuleType:
    nvml = importlib.import_module("pynvml")
    nvml.nvmlInit()
    return nvml


def detect(
    cpu_slots: int,
    *,
    load_cupy: Callable[[], ModuleType] = load_cupy,
    load_nvml: Callable[[], ModuleType] = _load_nvml,
) -> Inventory:
    """The node's accelerators, or CPU mode with `cpu_slots` slots. The loaders are parameters so
    that tests can hand in stand-ins for CuPy and NVML."""
    try:
        cupy = load_cupy()
    except ImportError:
        return Inventory(mode="cpu", cpu_slots=cpu_slots, reason="CuPy is not installed")
    except Exception as error:
        return _cpu(cpu_slots, "CuPy cannot be imported", error)
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as error:
        return _cpu(cpu_slots, "CUDA reports no usable device", error)
    if count <= 0:
        return Inventory(mode="cpu", cpu_slots=cpu_slots, reason="CUDA reports no device")
    nvml = _try_nvml(load_nvml)
    try:
        gpus = tuple(_describe(cupy, nvml, index) for index in range(min(count, _DEVICES_MAX)))
    except Exception as error:
        return _cpu(cpu_slots, "a CUDA device cannot be described", error)
    return Inventory(mode="gpu", gpus=gpus, cpu_slots=cpu_slots)


def _cpu(cpu_slots: int, what: str, error: BaseException) -> Inventory:
    reason = f"{what}: {type(error).__name__}: {error}"
    return Inventory(mode="cpu", cpu_slots=cpu_slots, reason=reason[:500])


def _try_nvml(load_nvml: Callable[[], ModuleType]) -> ModuleType | None:
    try:
        return load_nvml()
    except Exception:
        # NVML is optional: without it free memory comes from CUDA and power draw is unknown.
        return None


def _describe(cupy: ModuleType, nvml: ModuleType | None, index: int) -> GpuInfo:
    runtime = cupy.cuda.runtime
    properties: dict[str, Any] = runtime.getDeviceProperties(index)
    name = properties["name"]
    model = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    total_bytes = int(properties["totalGlobalMem"])
    free_bytes, power_draw_w = _nvml_readings(cupy, nvml, index)
    if free_bytes is None:
        # Asking CUDA creates a context on the device (a few hundred MB held by the node), which
        # is why NVML is asked first.
        with cupy.cuda.Device(index):
            free_bytes = int(runtime.memGetInfo()[0])
    memory_mb = total_bytes // _MIB
    return GpuInfo(
        index=index,
        model=model.strip(),
        memory_mb=memory_mb,
        free_mb=min(free_bytes // _MIB, memory_mb),
        compute_capability=f"{int(properties['major'])}.{int(properties['minor'])}",
        power_draw_w=power_draw_w,
    )


def _nvml_readings(
    cupy: ModuleType, nvml: ModuleType | None, index: int
) -> tuple[int | None, float | None]:
    """(free bytes, power draw in watts) from NVML, each None when unknown. NVML numbers devices
    differently from CUDA (which honours CUDA_VISIBLE_DEVICES), so the device is found by its PCI
    bus id."""
    if nvml is None:
        return None, None
    try:
        bus_id = cupy.cuda.runtime.deviceGetPCIBusId(index)
        handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    except Exception:
        return None, None
    free_bytes: int | None
    power_draw_w: float | None
    try:
        free_bytes = int(nvml.nvmlDeviceGetMemoryInfo(handle).free)
    except Exception:
        free_bytes = None
    try:
        power_draw_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # NVML reports milliwatts
    except Exception:
        power_draw_w = None
    return free_bytes, power_draw_w


def to_gpus(inventory: Inventory) -> tuple[Gpu, ...]:
    """The devices as the region heartbeat command carries them (power draw is not carried)."""
    return tuple(
        Gpu(
            model=gpu.model,
            memory_mb=gpu.memory_mb,
            free_mb=gpu.free_mb,
            compute_capability=gpu.compute_capability,
        )
        for gpu in inventory.gpus
    )
