"""Time as an interface: the real clock for nodes, a simulated one for tests and simulations."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "RealClock", "SimulatedClock"]


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


class SimulatedClock:
    """A clock that moves only when told to; `skew_ms` shifts the wall clock alone."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.elapsed_s = 0.0
        self.start_ms = start_ms
        self.skew_ms = 0

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a simulated clock only moves forward")
        self.elapsed_s += seconds

    def now_ms(self) -> int:
        return self.start_ms + int(self.elapsed_s * 1000) + self.skew_ms

    def monotonic_s(self) -> float:
        return self.elapsed_s
