"""Time as an interface, so the store can be given another clock (tests skew it; the simulator
in `raftstore.sim` has its own per-node clock)."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "RealClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch: what a proposer stamps on a command."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back: for deadlines and intervals."""
        ...


class RealClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic()
