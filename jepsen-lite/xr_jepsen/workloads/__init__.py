"""The workloads jepsen-lite runs against xr, by name: `register`, `locks`, `queue`, `set`."""

from __future__ import annotations

from xr_jepsen.workloads.base import (
    Completion,
    Context,
    Planned,
    WorkerState,
    Workload,
    error_text,
    outcome_of,
)
from xr_jepsen.workloads.locks import LockWorkload
from xr_jepsen.workloads.queue import QueueWorkload
from xr_jepsen.workloads.register import RegisterWorkload
from xr_jepsen.workloads.sets import SetWorkload

__all__ = [
    "WORKLOADS",
    "Completion",
    "Context",
    "LockWorkload",
    "Planned",
    "QueueWorkload",
    "RegisterWorkload",
    "SetWorkload",
    "WorkerState",
    "Workload",
    "error_text",
    "make_workload",
    "outcome_of",
]

WORKLOADS = ("register", "locks", "queue", "set")


def make_workload(name: str) -> Workload:
    """A fresh workload of that name with its default settings."""
    made: dict[str, Workload] = {
        "register": RegisterWorkload(),
        "locks": LockWorkload(),
        "queue": QueueWorkload(),
        "set": SetWorkload(),
    }
    if name not in made:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return made[name]
