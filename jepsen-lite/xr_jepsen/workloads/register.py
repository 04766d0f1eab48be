"""Per-key registers with reads, writes of unique values and compare-and-set, on xr's KV.

Each key is one linearizable register. A write puts a value no other operation writes. A
compare-and-set `[expected, new]` reads the key (a linearizable read) and, if it holds `expected`,
puts `new` only if the key's mod revision is still the one read (`expected_mod_revision`); a
different value read, or a revision that moved, means the swap did not happen (`fail`). Since
every value is unique, a moved revision means a write of another value landed inside the
operation, so "not swapped" is a legal linearization. Expected values come from what the worker
last saw of the key, so swaps often succeed.
"""

from __future__ import annotations

from dataclasses import dataclass

from xr_jepsen.checkers import CheckResult, LinearizableChecker, register
from xr_jepsen.history import Op
from xr_jepsen.workloads.base import Completion, Context, Planned, WorkerState, outcome_of
from xrcore.client import AsyncClient
from xrcore.errors import CompareFailed, XrError

__all__ = ["RegisterWorkload"]

PREFIX = "register/"


@dataclass
class RegisterWorkload:
    name: str = "register"
    workers: int = 8
    # Workers that only ever ask their own node, and only read: a node that still believes it
    # leads after a partition is then asked while the others write (the runner pins them; a
    # write would hang there until it times out, so they do not write).
    pinned_workers: int = 3
    # The mean pause between one worker's operations.
    pause_s_mean: float = 0.05
    keys: int = 3
    # The linearizability search's budget per run; beyond it the verdict is "unknown".
    time_budget_s: float = 30.0

    def _key(self, index: int) -> str:
        return f"{PREFIX}k{index}"

    def plan(self, state: WorkerState) -> Planned:
        key = self._key(state.rng.randrange(self.keys))
        roll = state.rng.random()
        if roll < 0.4 or state.worker < self.pinned_workers:
            return Planned(f="read", value=None, key=key)
        if roll < 0.7 or state.seen.get(key) is None:
            return Planned(f="write", value=state.unique(), key=key)
        return Planned(f="cas", value=[state.seen[key], state.unique()], key=key)

    async def invoke(
        self, client: AsyncClient, planned: Planned, state: WorkerState, context: Context
    ) -> Completion:
        assert planned.key is not None
        if planned.f == "read":
            try:
                found = await client.kv.get(planned.key)
            except XrError as error:
                return outcome_of(error, read=True)
            return Completion(type="ok", value=None if found is None else int(found.text))
        if planned.f == "write":
            try:
                await client.kv.put(planned.key, str(planned.value))
            except XrError as error:
                return outcome_of(error)
            return Completion(type="ok", value=planned.value)
        return await self._cas(client, planned.key, planned.value)

    async def _cas(self, client: AsyncClient, key: str, value: list[int]) -> Completion:
        expected, new = value
        try:
            found = await client.kv.get(key)
        except XrError as error:
            # Nothing was written yet: the swap certainly did not happen.
            return outcome_of(error, read=True)
        if found is None or int(found.text) != expected:
            return Completion(type="fail", value=value, error="cas: the key holds another value")
        try:
            await client.kv.put(key, str(new), expected_mod_revision=found.mod_revision)
        except CompareFailed:
            return Completion(type="fail", value=value, error="cas: the revision moved")
        except XrError as error:
            return outcome_of(error)
        return Completion(type="ok", value=value)

    def observe(self, planned: Planned, completion: Completion, state: WorkerState) -> None:
        if completion.type != "ok" or planned.key is None:
            return
        if planned.f == "read":
            state.seen[planned.key] = completion.value
        elif planned.f == "write":
            state.seen[planned.key] = planned.value
        elif planned.f == "cas":
            state.seen[planned.key] = planned.value[1]

    def final_plan(self, state: WorkerState, last: Completion | None) -> Planned | None:
        # One successful read of every key, in order; `counter` counts the keys read.
        if last is not None and last.type == "ok":
            state.counter += 1
        if state.counter >= self.keys:
            return None
        return Planned(f="read", value=None, key=self._key(state.counter))

    def check(self, ops: list[Op]) -> CheckResult:
        checker = LinearizableChecker(register, time_budget_s=self.time_budget_s)
        return checker.check(ops)
