"""What every workload shares: the planned operation, the completion, how an error becomes
`fail` or `info`, and the `Workload` interface the runner drives.

A workload has three parts, each small:
- `plan`: the next operation of one worker, drawn from that worker's seeded random source and
  what it has seen so far (pure: no I/O);
- `invoke`: carries one planned operation out through `xrcore.client` and says how it ended;
- `final_plan`: the operations after the cluster has healed and quiesced (liveness after safety).

`fail` only for definite errors (`XrError.definite`), `info` for everything else: "when in doubt,
indefinite is always safe". A read is the one exception: it changes nothing, so a read that
errored certainly did not take effect, and is recorded as `fail` with the error's code.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from xr_jepsen.checkers import CheckResult
from xr_jepsen.history import Op
from xrcore.client import AsyncClient
from xrcore.errors import XrError

__all__ = [
    "Completion",
    "Context",
    "Planned",
    "WorkerState",
    "Workload",
    "error_text",
    "outcome_of",
]

CompletionType = Literal["ok", "fail", "info"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Planned:
    f: str
    value: Any
    key: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Completion:
    type: CompletionType
    value: Any = None
    error: str | None = None


@dataclass
class WorkerState:
    """One worker's private memory: its random source, a counter for unique values and what it
    has learned (values seen per key, the lock it holds)."""

    worker: int
    rng: random.Random
    counter: int = 0
    seen: dict[str, Any] = field(default_factory=dict)

    def unique(self) -> int:
        """A value no other worker draws: the worker number in the high digits."""
        self.counter += 1
        return self.worker * 1_000_000 + self.counter


@dataclass(frozen=True, kw_only=True)
class Context:
    """What the runner gives workloads: the protected resource, as the nodes reach it over HTTP
    (`resource_url`) and as the harness's own workers reach it (`access`)."""

    resource_url: str
    # Lock workers present tokens here: (lock, token) -> accepted.
    access: Callable[[str, int], bool]


def error_text(error: BaseException) -> str:
    if isinstance(error, XrError):
        return f"{error.code}: {error.message}"[:300]
    return f"{type(error).__name__}: {error}"[:300]


def outcome_of(error: BaseException, *, read: bool = False) -> Completion:
    """The completion an error means: definite errors (and any error of a read) fail, the rest
    are info."""
    definite = isinstance(error, XrError) and error.definite
    return Completion(type="fail" if definite or read else "info", error=error_text(error))


class Workload(Protocol):
    name: str
    # Worker coroutines the runner starts; they share the cluster.
    workers: int
    # The mean pause between one worker's operations.
    pause_s_mean: float

    def plan(self, state: WorkerState) -> Planned: ...

    async def invoke(
        self, client: AsyncClient, planned: Planned, state: WorkerState, context: Context
    ) -> Completion: ...

    def observe(self, planned: Planned, completion: Completion, state: WorkerState) -> None:
        """Learns from a completion (the value a read saw, the lock now held)."""

    def final_plan(self, state: WorkerState, last: Completion | None) -> Planned | None:
        """The next final operation (`last`: how the previous one ended), or None when they are
        done. Final operations run once the cluster has healed and quiesced, one at a time; a
        workload plans an operation again until it succeeds. Finishing them before the run's
        final deadline is the run's liveness."""
        ...

    def check(self, ops: list[Op]) -> CheckResult: ...
