"""A grow-only set stored in xr keys: each `add` creates one key for its element (a put that
must create, `expected_mod_revision=0`), and `read-final` lists the prefix once the cluster has
healed. The checker verifies that every acknowledged element is present (no lost writes) and
that nothing appears that was never added.
"""

from __future__ import annotations

from dataclasses import dataclass

from xr_jepsen.checkers import CheckResult, SetChecker
from xr_jepsen.history import Op
from xr_jepsen.workloads.base import Completion, Context, Planned, WorkerState, outcome_of
from xrcore.client import AsyncClient
from xrcore.errors import XrError

__all__ = ["SetWorkload"]

PREFIX = "set/"


@dataclass
class SetWorkload:
    name: str = "set"
    workers: int = 4
    # The mean pause between one worker's operations.
    pause_s_mean: float = 0.05

    def plan(self, state: WorkerState) -> Planned:
        return Planned(f="add", value=state.unique())

    async def invoke(
        self, client: AsyncClient, planned: Planned, state: WorkerState, context: Context
    ) -> Completion:
        if planned.f == "read-final":
            try:
                elements = sorted([int(item.text) async for item in client.kv.list(PREFIX)])
            except XrError as error:
                return outcome_of(error, read=True)
            return Completion(type="ok", value=elements)
        try:
            await client.kv.put(
                f"{PREFIX}{planned.value:012d}", str(planned.value), expected_mod_revision=0
            )
        except XrError as error:
            return outcome_of(error)
        return Completion(type="ok", value=planned.value)

    def observe(self, planned: Planned, completion: Completion, state: WorkerState) -> None:
        pass

    def final_plan(self, state: WorkerState, last: Completion | None) -> Planned | None:
        if last is not None and last.type == "ok":
            return None
        return Planned(f="read-final", value=None)

    def check(self, ops: list[Op]) -> CheckResult:
        return SetChecker().check(ops)
