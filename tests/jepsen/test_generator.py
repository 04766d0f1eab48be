"""The generator and the workloads' plans without processes: the same seed plans the same
operations, values are unique, and the final operations are planned until they succeed."""

from __future__ import annotations

from typing import Any

import pytest

from xr_jepsen.generator import Generator
from xr_jepsen.workloads import WORKLOADS, Completion, Planned, make_workload

OPS_PER_WORKER = 200


def _answer(planned: Planned) -> Completion:
    """A stand-in cluster that grants, accepts and stores everything."""
    if planned.f == "read":
        return Completion(type="ok", value=7)
    if planned.f == "acquire":
        return Completion(type="ok", value={**planned.value, "token": 5})
    return Completion(type="ok", value=planned.value)


def _plans(workload_name: str, seed: int, worker: int) -> list[tuple[Any, ...]]:
    generator = Generator(make_workload(workload_name), seed)
    state = generator.state(worker)
    plans = []
    for _ in range(OPS_PER_WORKER):
        planned = generator.next(worker)
        if planned.f == "acquire":
            # What a granted acquire leaves behind for the next plans (`invoke` does it).
            state.seen["held"] = {**planned.value, "token": 5, "session_id": "s", "accesses": 0}
        elif planned.f == "access":
            state.seen["held"]["accesses"] += 1
        elif planned.f == "release":
            state.seen.pop("held")
        generator.observe(worker, planned, _answer(planned))
        plans.append((planned.f, repr(planned.value), planned.key, generator.pause_s(worker)))
    return plans


@pytest.mark.parametrize("workload", WORKLOADS)
def test_generator__same_seed_same_plans(workload: str) -> None:
    assert _plans(workload, 42, 1) == _plans(workload, 42, 1)
    assert _plans(workload, 42, 1) != _plans(workload, 43, 1)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_generator__workers_plan_independently(workload: str) -> None:
    assert _plans(workload, 42, 0) != _plans(workload, 42, 1)


def test_generator__written_values_are_unique_across_workers() -> None:
    written = [
        planned_value
        for worker in range(4)
        for f, planned_value, _, _ in _plans("register", 9, worker)
        if f == "write"
    ]
    assert len(written) == len(set(written)) > 0


def test_register__cas_expects_the_value_last_seen() -> None:
    generator = Generator(make_workload("register"), 5)
    state = generator.state(0)
    for _ in range(OPS_PER_WORKER):
        planned = generator.next(0)
        if planned.f == "cas":
            assert planned.key is not None
            assert planned.value[0] == state.seen[planned.key]
        generator.observe(0, planned, _answer(planned))


def test_pauses__average_the_workloads_mean() -> None:
    generator = Generator(make_workload("set"), 1)
    pauses = [generator.pause_s(0) for _ in range(2000)]
    assert min(pauses) >= 0
    assert abs(sum(pauses) / len(pauses) - make_workload("set").pause_s_mean) < 0.01


def _finals(workload_name: str, outcomes: list[str]) -> list[str]:
    """The final plans, answering each with the next of `outcomes` (then ok)."""
    workload = make_workload(workload_name)
    state = Generator(workload, 0).final_state()
    planned_fs: list[str] = []
    last: Completion | None = None
    for step in range(50):
        planned = workload.final_plan(state, last)
        if planned is None:
            return planned_fs
        planned_fs.append(f"{planned.f} {planned.key or ''}".strip())
        kind = outcomes[step] if step < len(outcomes) else "ok"
        last = (
            Completion(type="ok", value=_answer(planned).value)
            if kind == "ok"
            else Completion(type="fail")
        )
        if planned.f == "acquire" and kind == "ok":
            state.seen["held"] = {**planned.value, "token": 5, "session_id": "s", "accesses": 0}
        elif planned.f == "release":
            state.seen.pop("held", None)
    raise AssertionError("the final plan never ended")


def test_final__register_reads_every_key_until_each_read_succeeds() -> None:
    assert _finals("register", ["fail", "ok", "fail", "fail"]) == [
        "read register/k0",
        "read register/k0",
        "read register/k1",
        "read register/k1",
        "read register/k1",
        "read register/k2",
    ]


def test_final__locks_acquires_until_granted_then_releases_each_lock() -> None:
    assert _finals("locks", ["fail", "ok", "ok"]) == [
        "acquire",
        "acquire",
        "release locks/l0",
        "acquire",
        "release locks/l1",
    ]


@pytest.mark.parametrize("workload", ["queue", "set"])
def test_final__read_final_until_it_succeeds(workload: str) -> None:
    assert _finals(workload, ["fail"]) == ["read-final", "read-final"]
