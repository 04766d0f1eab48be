"""Which devices of one region a task gets: whole GPUs, or a share of one GPU's memory.

A task asking for `gpus > 0` gets that many whole devices that nothing else uses. A task asking
for `gpus == 0` and `gpu_memory_mb > 0` shares a device: it is packed onto the device whose free
memory fits it most tightly (best fit, so large free devices stay whole for whole-device tasks),
and the worker caps its memory pool at that size. A device with any shared task is not handed out
whole. The placement policy and each region's executor keep one ledger each, so both count
devices the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DeviceLedger", "Grant"]


@dataclass(frozen=True)
class Grant:
    """What a task was given: device indexes, and the memory it shares on them (0 when whole)."""

    devices: tuple[int, ...]
    shared_memory_mb: int = 0


@dataclass
class DeviceLedger:
    memory_mb: list[int]
    models: list[str] = field(default_factory=list)
    whole: set[int] = field(default_factory=set)
    shared_mb: dict[int, int] = field(default_factory=dict)

    def _free(self, device: int) -> int:
        return self.memory_mb[device] - self.shared_mb.get(device, 0)

    def _matches(self, device: int, model: str | None) -> bool:
        return model is None or not self.models or self.models[device] == model

    def reserve(self, *, gpus: int, memory_mb: int, model: str | None = None) -> Grant | None:
        """Devices for a task, or None when it does not fit now."""
        if gpus > 0:
            # The first `gpus` untouched devices that match, in index order.
            whole, shared, sizes, models = self.whole, self.shared_mb, self.memory_mb, self.models
            any_model = model is None or not models
            untouched: list[int] = []
            for device in range(len(sizes)):
                if (
                    device not in whole
                    and device not in shared
                    and sizes[device] >= memory_mb
                    and (any_model or models[device] == model)
                ):
                    untouched.append(device)
                    if len(untouched) == gpus:
                        break
            else:
                return None
            chosen = tuple(untouched)
            whole.update(chosen)
            return Grant(devices=chosen)
        if memory_mb <= 0:
            return None
        fitting = [
            device
            for device in range(len(self.memory_mb))
            if device not in self.whole
            and self._free(device) >= memory_mb
            and self._matches(device, model)
        ]
        if not fitting:
            return None
        device = min(fitting, key=lambda item: (self._free(item), item))
        self.shared_mb[device] = self.shared_mb.get(device, 0) + memory_mb
        return Grant(devices=(device,), shared_memory_mb=memory_mb)

    def release(self, grant: Grant) -> None:
        for device in grant.devices:
            if grant.shared_memory_mb:
                left = self.shared_mb.get(device, 0) - grant.shared_memory_mb
                if left > 0:
                    self.shared_mb[device] = left
                else:
                    self.shared_mb.pop(device, None)
            else:
                self.whole.discard(device)

    @property
    def used(self) -> int:
        """Devices in use, whole or shared."""
        return len(self.whole | set(self.shared_mb))
