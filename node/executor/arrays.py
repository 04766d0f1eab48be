"""The array-module seam: CuPy on a GPU, NumPy otherwise, behind one `xp`.

Workloads and user jobs are written once against `xp` (the NumPy API, which CuPy mirrors). This is
the only module that imports CuPy, and only when a GPU device is asked for or the inventory looks
for one: a node without CuPy (every CPU-mode node, and this project's CI) never pays for it, and
its absence is normal rather than an error.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "CPU_DEVICE",
    "DeviceUnavailable",
    "array_module",
    "device_index",
    "is_out_of_memory",
    "load_cupy",
    "set_memory_limit",
    "synchronize",
    "to_numpy",
]

CPU_DEVICE = "cpu"
# "cuda:N" names device N as this process sees it, that is after CUDA_VISIBLE_DEVICES renumbered
# the devices the executor pinned it to (so usually "cuda:0").
_CUDA_DEVICE = re.compile(r"cuda:(\d{1,4})")


class DeviceUnavailable(RuntimeError):
    """A GPU device was asked for, but CuPy or the device cannot be used in this process."""


def device_index(device: str) -> int | None:
    """The CUDA device number in `device` ("cuda:N"), or None for "cpu"."""
    if device == CPU_DEVICE:
        return None
    match = _CUDA_DEVICE.fullmatch(device)
    if match is None:
        raise ValueError(f"device must be 'cpu' or 'cuda:N', got {device!r}")
    return int(match.group(1))


def load_cupy() -> ModuleType:
    """Imports CuPy. Raises ImportError when it is not installed, and whatever a broken CUDA
    installation raises otherwise; callers that must not fail catch `Exception`."""
    return importlib.import_module("cupy")


def array_module(device: str) -> ModuleType:
    """NumPy for "cpu"; CuPy, with device N made current, for "cuda:N"."""
    index = device_index(device)
    if index is None:
        return np
    try:
        cupy = load_cupy()
        cupy.cuda.Device(index).use()
    except ImportError as error:
        raise DeviceUnavailable(
            f"device {device} needs CuPy, which is not installed: {error}"
        ) from error
    except Exception as error:
        raise DeviceUnavailable(f"device {device} cannot be used: {error}") from error
    return cupy


def _is_cupy(xp: ModuleType) -> bool:
    return xp.__name__.split(".")[0] == "cupy"


def to_numpy(array: Any) -> np.ndarray[Any, Any]:
    """A NumPy array with the same contents: copied from the device for CuPy arrays."""
    if type(array).__module__.split(".")[0] == "cupy":
        host: np.ndarray[Any, Any] = array.get()
        return host
    return np.asarray(array)


def synchronize(xp: ModuleType) -> None:
    """Waits for the device's queued work, so that wall-clock timings measure the work itself.
    NumPy runs synchronously, so there it does nothing."""
    if _is_cupy(xp):
        xp.cuda.get_current_stream().synchronize()


def set_memory_limit(xp: ModuleType, limit_bytes: int) -> bool:
    """Caps CuPy's memory pool on the current device, so tasks sharing a GPU stay within their
    share: an allocation beyond it raises CuPy's OutOfMemoryError (see `is_out_of_memory`).
    Returns False, having done nothing, on NumPy: host memory is not limited per task."""
    if limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
    if not _is_cupy(xp):
        return False
    xp.get_default_memory_pool().set_limit(size=limit_bytes)
    return True


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is CuPy's out-of-memory error (raised past a pool limit, or by the device);
    recognised by name so that NumPy-only processes never import CuPy to check."""
    kind = type(error)
    return kind.__name__ == "OutOfMemoryError" and kind.__module__.split(".")[0] == "cupy"
