"""The lock, queue and set checkers on generated legal histories and on histories broken in a
known way, and `compose`'s three-valued arithmetic."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xr_jepsen.checkers import (
    CheckResult,
    LinearizableChecker,
    LockChecker,
    QueueChecker,
    SetChecker,
    Valid,
    compose,
    merge_valid,
    register,
)
from xr_jepsen.checkers.synthetic import lock_history, queue_history, set_history
from xr_jepsen.history import Op, pair

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)


def reindexed(ops: Sequence[Op]) -> list[Op]:
    return [dataclasses.replace(op, index=index) for index, op in enumerate(ops)]


def appended(
    ops: Sequence[Op], f: str, value: Any, result: Any, *, at: int | None = None
) -> list[Op]:
    """`ops` with one more ok operation (a fresh process) inserted at position `at`."""
    process = max(op.process for op in ops) + 1
    invoke = Op(index=0, type="invoke", f=f, process=process, value=value, time_ns=0)
    completion = Op(index=0, type="ok", f=f, process=process, value=result, time_ns=0)
    position = len(ops) if at is None else at
    return reindexed([*ops[:position], invoke, completion, *ops[position:]])


def final_read(ops: Sequence[Op]) -> Op:
    return next(op for op in reversed(ops) if op.f == "read-final" and op.type == "ok")


def with_final(ops: Sequence[Op], value: Any) -> list[Op]:
    final = final_read(ops)
    broken = list(ops)
    broken[final.index] = dataclasses.replace(final, value=value)
    return broken


# Locks.


@given(seed=SEEDS, rounds=st.integers(1, 40))
def test_locks__generated_fenced_handovers_are_valid(seed: int, rounds: int) -> None:
    result = LockChecker().check(lock_history(random.Random(seed), rounds=rounds))
    assert result.valid is True, result.to_json()


@given(seed=SEEDS, rounds=st.integers(3, 40))
def test_locks__a_token_going_backwards_is_found(seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    ops = lock_history(rng, rounds=rounds)
    # Round 2's accesses (token 20) completed before any access of round 3 or later began; make
    # one of those accepted with round 1's token 10.
    late = [op for op in ops if op.f == "access" and op.type == "ok" and op.value["token"] >= 30]
    access = rng.choice(late)
    invoke = next(op for op in pair(ops) if op.completion == access).invoke
    stale = {"lock": "l", "token": 10}
    broken = list(ops)
    broken[invoke.index] = dataclasses.replace(invoke, value=stale)
    broken[access.index] = dataclasses.replace(access, value=stale)
    result = LockChecker().check(broken)
    assert result.valid is False
    assert {item["kind"] for item in result.anomalies} == {"access-order"}
    assert result.window is not None and result.window[1] == access.index


@given(seed=SEEDS, rounds=st.integers(1, 20))
def test_locks__an_accepted_token_no_acquire_returned_is_found(seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    ops = lock_history(rng, rounds=rounds)
    # Tokens are multiples of 10, so 10 * rounds + 5 was never granted.
    token = {"lock": "l", "token": 10 * rounds + 5}
    result = LockChecker().check(appended(ops, "access", token, token))
    assert result.valid is False
    assert "unknown-token" in {item["kind"] for item in result.anomalies}


# Queue.


@given(seed=SEEDS, jobs=st.integers(0, 40))
def test_queue__generated_exactly_once_histories_are_valid(seed: int, jobs: int) -> None:
    result = QueueChecker().check(queue_history(random.Random(seed), jobs=jobs))
    assert result.valid is True, result.to_json()


@given(
    seed=SEEDS,
    jobs=st.integers(1, 40),
    kind=st.sampled_from(["duplicate", "lost", "stale", "missing", "fencing"]),
)
def test_queue__an_injected_anomaly_is_found(seed: int, jobs: int, kind: str) -> None:
    rng = random.Random(seed)
    ops = queue_history(rng, jobs=jobs, info_fraction=0.0)
    final = dict(final_read(ops).value)
    key = rng.choice(sorted(final))
    token = final[key]["token"]
    before_final = final_read(ops).index - 1
    if kind == "duplicate":
        # The succeeded attempt's effect accepted a second time.
        again = {"key": key, "token": token}
        broken = appended(ops, "complete", again, again, at=before_final)
    elif kind == "fencing":
        # A zombie's older token accepted after its successor's.
        older = {"key": key, "token": token - 1_000_000}
        broken = appended(ops, "complete", older, older, at=before_final)
    elif kind == "lost":
        del final[key]
        broken = with_final(ops, final)
    elif kind == "stale":
        # The resource's last word came from an attempt newer than the one that succeeded.
        newer = {"key": key, "token": token + 1_000_000}
        broken = appended(ops, "complete", newer, newer, at=before_final)
    else:
        final[key] = {"state": "succeeded", "token": token + 1_000_000}
        broken = with_final(ops, final)
    result = QueueChecker().check(broken)
    assert result.valid is False
    assert kind in {item["kind"] for item in result.anomalies}


def test_queue__an_effect_superseded_by_a_rerun_is_not_an_anomaly() -> None:
    """An attempt that took effect and lost its lease before committing is re-run with a higher
    token; the fenced resource keeps the new effect. Counted, not flagged."""
    ops = queue_history(random.Random(3), jobs=4, info_fraction=0.0)
    final = dict(final_read(ops).value)
    key = sorted(final)[0]
    earlier = {"key": key, "token": final[key]["token"] - 1_000_000}
    rerun = appended(ops, "complete", earlier, earlier, at=1)
    result = QueueChecker().check(rerun)
    assert result.valid is True, result.to_json()
    assert result.stats["reexecuted"] == 1


def test_queue__without_a_final_read_is_unknown_unless_a_duplicate_shows() -> None:
    ops = queue_history(random.Random(1), jobs=5, info_fraction=0.0)
    without = reindexed([op for op in ops if op.f != "read-final"])
    assert QueueChecker().check(without).valid == "unknown"
    accepted = next(op for op in without if op.f == "complete" and op.type == "ok")
    assert (
        QueueChecker().check(appended(without, "complete", accepted.value, accepted.value)).valid
        is False
    )


# Sets.


@given(seed=SEEDS, adds=st.integers(0, 60))
def test_set__generated_histories_are_valid(seed: int, adds: int) -> None:
    ops, _ = set_history(random.Random(seed), adds=adds)
    assert SetChecker().check(ops).valid is True


@given(seed=SEEDS, adds=st.integers(1, 60))
def test_set__a_lost_add_is_found(seed: int, adds: int) -> None:
    rng = random.Random(seed)
    ops, present = set_history(rng, adds=adds)
    acknowledged = [
        operation.invoke.value
        for operation in pair(ops)
        if operation.f == "add" and operation.type == "ok"
    ]
    if not acknowledged:
        return
    lost = rng.choice(acknowledged)
    result = SetChecker().check(with_final(ops, [value for value in present if value != lost]))
    assert result.valid is False
    assert [item["kind"] for item in result.anomalies] == ["lost"]


@given(seed=SEEDS, adds=st.integers(0, 60))
def test_set__an_element_never_added_is_found(seed: int, adds: int) -> None:
    ops, present = set_history(random.Random(seed), adds=adds)
    result = SetChecker().check(with_final(ops, [*present, -1]))
    assert result.valid is False
    assert [item["kind"] for item in result.anomalies] == ["unexpected"]


# Composition.


class Fixed:
    """A checker that always returns the same verdict."""

    def __init__(self, valid: Valid) -> None:
        self.name = f"fixed-{valid}"
        self.valid = valid

    def check(self, ops: Sequence[Op]) -> CheckResult:
        anomalies = [{"kind": "k", "message": "m", "ops": [0]}] if self.valid is False else []
        window = (0, 0) if self.valid is False else None
        return CheckResult(
            checker=self.name, valid=self.valid, message="", anomalies=anomalies, window=window
        )


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ([], True),
        ([True, True], True),
        ([True, "unknown"], "unknown"),
        (["unknown", False], False),
        ([False, True], False),
    ],
)
def test_compose__false_beats_unknown_beats_true(verdicts: list[Valid], expected: Valid) -> None:
    checker = compose({f"c{number}": Fixed(valid) for number, valid in enumerate(verdicts)})
    result = checker.check([])
    assert result.valid == expected == merge_valid(verdicts)
    assert sorted(result.stats["results"]) == [f"c{number}" for number in range(len(verdicts))]
    if expected is False:
        assert result.window == (0, 0)
        assert all("checker" in item for item in result.anomalies)


def test_compose__runs_real_checkers_on_one_history_and_serializes() -> None:
    ops, _ = set_history(random.Random(2), adds=20)
    checker = compose({"set": SetChecker(), "linearizable": LinearizableChecker(register)})
    result = checker.check(ops)
    assert result.valid is True
    document = result.to_json()
    assert document["stats"]["results"]["set"]["valid"] is True
    assert document["window"] is None
