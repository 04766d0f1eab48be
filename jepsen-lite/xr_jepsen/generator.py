"""The generator: which operation each worker does next, and how long it pauses before the next,
all from the run's seed.

Each worker draws from its own random source, `Random(f"{seed}/worker/{n}")`, so its sequence of
planned operations does not depend on how the workers interleave: given the same answers from
the cluster, a worker plans the same operations again. (Some plans depend on answers: a
compare-and-set expects the value the worker last saw, a lock holder accesses what it holds.)
The nemesis schedule is drawn the same way in `nemesis.schedule`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from xr_jepsen.workloads.base import Completion, Planned, WorkerState, Workload

__all__ = ["FINAL_PROCESS", "Generator"]

# Process numbers: worker n is process n, then n + workers after each info, and so on; the final
# operations are processes from FINAL_PROCESS on; the protected resource records its events as
# `resource.RESOURCE_PROCESS`; the nemesis is -1.
FINAL_PROCESS = 500_000


@dataclass
class Generator:
    workload: Workload
    seed: int
    states: dict[int, WorkerState] = field(default_factory=dict)

    def state(self, worker: int) -> WorkerState:
        if worker not in self.states:
            self.states[worker] = WorkerState(
                worker=worker, rng=random.Random(f"{self.seed}/worker/{worker}")
            )
        return self.states[worker]

    def next(self, worker: int) -> Planned:
        return self.workload.plan(self.state(worker))

    def observe(self, worker: int, planned: Planned, completion: Completion) -> None:
        self.workload.observe(planned, completion, self.state(worker))

    def pause_s(self, worker: int) -> float:
        """The pause after an operation: uniform around the workload's mean, drawn from the
        worker's source."""
        return self.state(worker).rng.uniform(0.0, 2 * self.workload.pause_s_mean)

    def final_state(self) -> WorkerState:
        """The state of the process doing the final operations, apart from every worker's."""
        return WorkerState(worker=0, rng=random.Random(f"{self.seed}/final"))
