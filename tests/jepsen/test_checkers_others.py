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
from xr_jepsen.history import HistoryError, Op, pair

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


@given(seed=SEEDS, rounds=st.integers(2, 20), data=st.data())
def test_locks__a_token_granted_to_two_acquires_is_found(
    seed: int, rounds: int, data: st.DataObject
) -> None:
    # Two holders with one token passed as valid: only strictly lower tokens were compared.
    ops = lock_history(random.Random(seed), rounds=rounds)
    again = data.draw(st.integers(2, rounds))
    token, earlier = again * 10, (again - 1) * 10
    acquires = [op.index for op in ops if op.f == "acquire" and op.type == "invoke"]
    start = acquires[again - 1]
    end = acquires[again] if again < rounds else len(ops)
    # Round `again` is granted round `again - 1`'s token, and uses it.
    broken = [
        dataclasses.replace(op, value={**op.value, "token": earlier})
        if start <= op.index < end and isinstance(op.value, dict) and op.value.get("token") == token
        else op
        for op in ops
    ]
    result = LockChecker().check(broken)
    assert result.valid is False
    assert {item["kind"] for item in result.anomalies} == {"duplicate-grant"}
    assert result.anomalies[0]["ops"][0] == acquires[again - 2]


@pytest.mark.parametrize("token", ["1", True, [1], {"n": 1}, 1.0, None])
@pytest.mark.parametrize("where", ["acquire", "access"])
def test_locks__a_token_that_is_not_an_integer_is_refused(token: Any, where: str) -> None:
    # A string token was skipped (the history judged valid), and `true` counted as 1.
    ops = lock_history(random.Random(1), rounds=2, info_fraction=0.0)
    target = next(op for op in ops if op.f == where and op.type == "ok")
    bad = dict(ops[target.index].value, token=token)
    broken = list(ops)
    broken[target.index] = dataclasses.replace(target, value=bad)
    if where == "access":
        # The token an access presents is its invoke's.
        target = next(o.invoke for o in pair(ops) if o.completion == target)
        broken[target.index] = dataclasses.replace(target, value=bad)
    with pytest.raises(HistoryError, match=f"op {target.index}: {where} token must be an integer"):
        LockChecker().check(broken)


def test_locks__an_ok_acquire_without_a_token_is_refused() -> None:
    ops = lock_history(random.Random(1), rounds=1, info_fraction=0.0)
    target = next(op for op in ops if op.f == "acquire" and op.type == "ok")
    broken = list(ops)
    broken[target.index] = dataclasses.replace(target, value={"lock": "l"})
    with pytest.raises(HistoryError, match=f"op {target.index}: an ok acquire must carry a token"):
        LockChecker().check(broken)


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
    # Not "exactly once" without a word: the message says an effect was superseded.
    assert "re-executions of 1 jobs superseded 1 earlier effects" in result.message


def _with_job_ids(ops: Sequence[Op]) -> list[Op]:
    """`ops` as the harness records them now: each completion and final entry names its job."""
    changed = []
    for op in ops:
        if op.f == "complete" and isinstance(op.value, dict):
            op = dataclasses.replace(op, value={**op.value, "job_id": f"id-{op.value['key']}"})
        elif op.f == "read-final" and op.type == "ok":
            value = {key: {**entry, "job_ids": [f"id-{key}"]} for key, entry in op.value.items()}
            op = dataclasses.replace(op, value=value)
        changed.append(op)
    return changed


@given(seed=SEEDS, jobs=st.integers(1, 30), in_final=st.booleans())
def test_queue__a_key_served_by_two_jobs_is_found(seed: int, jobs: int, in_final: bool) -> None:
    # A job enqueued twice whose second copy ran with a higher token passed as a re-execution.
    rng = random.Random(seed)
    ops = _with_job_ids(queue_history(rng, jobs=jobs, info_fraction=0.0))
    assert QueueChecker().check(ops).valid is True
    final = dict(final_read(ops).value)
    key = rng.choice(sorted(final))
    if in_final:
        final[key] = {**final[key], "job_ids": [f"id-{key}", "other"]}
        broken = with_final(ops, final)
    else:
        earlier = {"key": key, "token": final[key]["token"] - 1_000_000, "job_id": "other"}
        broken = appended(ops, "complete", earlier, earlier, at=1)
    result = QueueChecker().check(broken)
    assert result.valid is False
    assert [item["kind"] for item in result.anomalies] == ["duplicate-job"]
    assert f"served by 2 jobs (id-{key}, other)" in result.anomalies[0]["message"]


def _complete_with(token: Any, outcome: str) -> list[Op]:
    value = {"key": "j1", "token": token}
    return [
        Op(index=0, type="invoke", f="enqueue", process=0, value="j1", time_ns=0),
        Op(index=1, type="ok", f="enqueue", process=0, value="j1", time_ns=1),
        Op(index=2, type="invoke", f="complete", process=1, value=value, time_ns=2),
        Op(index=3, type=outcome, f="complete", process=1, value=value, time_ns=3),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize("token", [[1], {"n": 1}, True, "1", 1.5])
@pytest.mark.parametrize("outcome", ["ok", "info", "fail"])
def test_queue__a_token_that_is_not_an_integer_is_refused(token: Any, outcome: str) -> None:
    # [1] was an unhashable-type traceback (exit 1, "anomaly found"); true counted as 1.
    with pytest.raises(HistoryError, match="op 2: complete token must be an integer or null"):
        QueueChecker().check(_complete_with(token, outcome))


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"state": "succeeded", "token": {"n": 1}}, "read-final token must be an integer"),
        (
            {"state": "succeeded", "token": 1, "job_ids": "a"},
            "read-final job_ids must be a list of strings",
        ),
        (
            {"state": "succeeded", "token": 1, "job_ids": [1]},
            "read-final job_ids must be a list of strings",
        ),
    ],
)
def test_queue__a_bad_final_entry_is_refused(entry: dict[str, Any], words: str) -> None:
    ops = _complete_with(1, "ok")
    ops += [
        Op(index=4, type="invoke", f="read-final", process=2, value=None, time_ns=4),
        Op(index=5, type="ok", f="read-final", process=2, value={"j1": entry}, time_ns=5),
    ]
    with pytest.raises(HistoryError, match=f"op 5: {words}"):
        QueueChecker().check(ops)


def test_queue__a_job_id_that_is_not_a_string_is_refused() -> None:
    ops = _complete_with(1, "ok")
    ops[3] = dataclasses.replace(ops[3], value={"key": "j1", "token": 1, "job_id": 7})
    with pytest.raises(HistoryError, match="op 3: complete job_id must be a string"):
        QueueChecker().check(ops)


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
