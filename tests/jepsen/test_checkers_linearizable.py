"""The linearizability checker: against a brute-force reference, on generated legal histories,
on histories broken in ways that are certainly illegal, and on the windows it reports.

The reference is deliberately simple (try every order, memoized on the set placed and the state)
and so only usable on a handful of operations; the generated histories come from a simulated
register (xr_jepsen.checkers.synthetic), so they are legal by construction.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Hashable, Sequence
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from xr_jepsen.checkers import LinearizableChecker, kv, register
from xr_jepsen.checkers.models import Model, freeze
from xr_jepsen.checkers.synthetic import register_history
from xr_jepsen.history import Op, pair

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)


@dataclasses.dataclass(frozen=True)
class Record:
    """One register operation for the reference: ret None means unknown outcome."""

    call: int
    ret: int | None
    f: str
    argument: Hashable
    result: Hashable


def records_by_key(ops: Sequence[Op]) -> dict[str | None, list[Record]]:
    records: dict[str | None, list[Record]] = {}
    for operation in pair(ops):
        if operation.type == "fail" or operation.f == "nemesis":
            continue
        known = operation.type == "ok"
        assert operation.completion is not None or not known
        records.setdefault(operation.key, []).append(
            Record(
                call=operation.invoke.index,
                ret=operation.completion.index if known and operation.completion else None,
                f=operation.f,
                argument=freeze(operation.invoke.value),
                result=freeze(operation.value) if known else None,
            )
        )
    return records


def reference_linearizable(records: Sequence[Record], starts: Sequence[Hashable]) -> bool:
    """Some order of the records, from some start state, respects real time and the register;
    unknown-outcome records may be left out."""
    items = [record for record in records if not (record.f == "read" and record.ret is None)]

    @functools.cache
    def search(placed: frozenset[int], state: Hashable) -> bool:
        if all(number in placed for number, item in enumerate(items) if item.ret is not None):
            return True
        for number, item in enumerate(items):
            if number in placed:
                continue
            if any(
                other not in placed and before.ret is not None and before.ret < item.call
                for other, before in enumerate(items)
            ):
                continue
            if item.f == "read":
                if item.result != state:
                    continue
                after = state
            elif item.f == "write":
                after = item.argument
            else:
                assert isinstance(item.argument, tuple)
                expected, new = item.argument
                if state == expected:
                    after = new
                elif item.ret is None:
                    after = state
                else:
                    continue
            if search(placed | {number}, after):
                return True
        return False

    return any(search(frozenset(), start) for start in starts)


def reference(ops: Sequence[Op]) -> bool:
    return all(reference_linearizable(records, [None]) for records in records_by_key(ops).values())


def cut(records: Sequence[Record], first: int, last: int) -> list[Record]:
    """The window [first, last] as the checker documents it, written out independently."""
    window = []
    for record in records:
        if record.call > last or (record.ret is not None and record.ret < first):
            continue
        if record.ret is not None and record.ret <= last:
            assert record.call >= first, "the window's first index is not a clean cut"
            window.append(record)
        else:
            window.append(dataclasses.replace(record, ret=None, result=None))
    return window


def corrupt(rng: random.Random, ops: list[Op]) -> list[Op]:
    """Changes one read's value or one cas's outcome, which may or may not make it illegal."""
    reads = [op for op in ops if op.f == "read" and op.type == "ok"]
    cas = [op for op in ops if op.f == "cas" and op.type in ("ok", "fail")]
    broken = list(ops)
    if reads and (not cas or rng.random() < 0.7):
        read = rng.choice(reads)
        broken[read.index] = dataclasses.replace(read, value=rng.choice([None, 0, 1, 2]))
    elif cas:
        op = rng.choice(cas)
        broken[op.index] = dataclasses.replace(op, type="fail" if op.type == "ok" else "ok")
    return broken


@given(
    seed=SEEDS,
    operations=st.integers(1, 10),
    clients=st.integers(1, 4),
    values=st.integers(2, 4),
    info_fraction=st.sampled_from([0.0, 0.2, 0.4]),
    fail_fraction=st.sampled_from([0.0, 0.3]),
    broken=st.booleans(),
)
def test_register__agrees_with_the_brute_force_reference(
    seed: int,
    operations: int,
    clients: int,
    values: int,
    info_fraction: float,
    fail_fraction: float,
    broken: bool,
) -> None:
    rng = random.Random(seed)
    ops = register_history(
        rng,
        operations=operations,
        clients=clients,
        values=values,
        info_fraction=info_fraction,
        fail_fraction=fail_fraction,
    )
    if broken:
        ops = corrupt(rng, ops)
    result = LinearizableChecker(register).check(ops)
    assert result.valid == reference(ops)


@given(
    seed=SEEDS,
    operations=st.integers(1, 300),
    keys=st.integers(1, 4),
    clients=st.integers(1, 8),
    values=st.sampled_from([None, 2, 5]),
    info_fraction=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_register__generated_legal_histories_are_linearizable(
    seed: int,
    operations: int,
    keys: int,
    clients: int,
    values: int | None,
    info_fraction: float,
) -> None:
    ops = register_history(
        random.Random(seed),
        operations=operations,
        keys=keys,
        clients=clients,
        values=values,
        info_fraction=info_fraction,
        fail_fraction=0.1,
    )
    result = LinearizableChecker(register).check(ops)
    assert result.valid is True, result.to_json()
    assert result.window is None and not result.anomalies


def _inject(
    kind: str, rng: random.Random, ops: list[Op], *, after: int = 0
) -> tuple[list[Op], int] | None:
    """Breaks a unique-valued history so that it is certainly not linearizable (changing one read
    invoked after `after`); returns it and the index of the changed read's completion, or None
    when the history offers no spot."""
    pairs = [operation for operation in pair(ops) if operation.completion is not None]
    reads = [p for p in pairs if p.f == "read" and p.type == "ok" and p.invoke.index > after]
    if kind == "never-written":
        candidates = [(read, "never written") for read in reads]
    elif kind == "stale":
        # A value overwritten by an acknowledged write that completed before the read began.
        writes = [p for p in pairs if p.f == "write" and p.type == "ok"]
        candidates = []
        for read in reads:
            same_key = [write for write in writes if write.key == read.key]
            newer = [write for write in same_key if write.indices[-1] < read.invoke.index]
            if newer:
                older = [write for write in same_key if write.indices[-1] < newer[-1].invoke.index]
                candidates += [(read, write.invoke.value) for write in older[-3:]]
    else:
        # The value of a write that failed, so never happened.
        failed = [p for p in pairs if p.f == "write" and p.type == "fail"]
        candidates = [
            (read, write.invoke.value)
            for read in reads
            for write in failed
            if read.key == write.key and read.invoke.index > write.invoke.index
        ]
    if not candidates:
        return None
    read, value = rng.choice(candidates)
    assert read.completion is not None
    broken = list(ops)
    broken[read.completion.index] = dataclasses.replace(read.completion, value=value)
    return broken, read.completion.index


@given(
    seed=SEEDS,
    kind=st.sampled_from(["never-written", "stale", "failed-visible"]),
    operations=st.integers(20, 300),
    keys=st.integers(1, 3),
    clients=st.integers(1, 6),
    info_fraction=st.sampled_from([0.0, 0.05, 0.2]),
)
def test_register__an_injected_anomaly_is_found_with_a_window_around_it(
    seed: int, kind: str, operations: int, keys: int, clients: int, info_fraction: float
) -> None:
    rng = random.Random(seed)
    ops = register_history(
        rng,
        operations=operations,
        keys=keys,
        clients=clients,
        info_fraction=info_fraction,
        fail_fraction=0.2,
    )
    injected = _inject(kind, rng, ops)
    assume(injected is not None)
    assert injected is not None
    broken, changed = injected
    result = LinearizableChecker(register).check(broken)
    assert result.valid is False
    assert result.window is not None
    _, last = result.window
    # The first failing cut can only be at or before the broken read's completion.
    assert last <= changed
    assert result.anomalies[0]["ops"]


@given(
    seed=SEEDS,
    operations=st.integers(2, 10),
    clients=st.integers(1, 4),
    info_fraction=st.sampled_from([0.0, 0.3]),
)
def test_window__is_a_minimal_failing_cut_by_the_reference(
    seed: int, operations: int, clients: int, info_fraction: float
) -> None:
    rng = random.Random(seed)
    ops = register_history(
        rng, operations=operations, clients=clients, values=3, info_fraction=info_fraction
    )
    ops = corrupt(rng, ops)
    result = LinearizableChecker(register).check(ops)
    assume(result.valid is False)
    assert result.window is not None
    first, last = result.window
    records = records_by_key(ops)[result.anomalies[0]["key"]]
    starts: list[Hashable] = [None, *{record.argument for record in records}]
    starts += [record.argument[1] for record in records if record.f == "cas"]  # type: ignore[index]
    # The prefix ending at `last` fails and the one ending just before it does not ...
    assert not reference_linearizable(cut(records, 0, last), [None])
    assert reference_linearizable(cut(records, 0, last - 1), [None])
    # ... and the window fails from every state the register could be in at `first` (from the
    # initial state when nothing was cut off before it).
    if not any(record.ret is not None and record.ret < first for record in records):
        starts = [None]
    assert not reference_linearizable(cut(records, first, last), starts)


def test_window__is_small_in_a_long_history() -> None:
    rng = random.Random(7)
    ops = register_history(rng, operations=4_000, keys=5, clients=8, fail_fraction=0.1)
    injected = _inject("stale", rng, ops, after=len(ops) // 2)
    assert injected is not None
    broken, changed = injected
    result = LinearizableChecker(register).check(broken)
    assert result.valid is False and result.window is not None
    first, last = result.window
    assert last <= changed
    assert last - first < len(ops) // 50, result.window


def test_kv_model__whole_history_agrees_with_per_key() -> None:
    rng = random.Random(11)
    for _ in range(30):
        ops = register_history(rng, operations=40, keys=3, clients=4, values=3, info_fraction=0.2)
        ops = corrupt(rng, ops)
        whole = LinearizableChecker(kv, per_key=False).check(ops).valid
        assert whole == LinearizableChecker(register).check(ops).valid


# The register without its `enabling` index: the search tries every unknown-outcome operation.
UNINDEXED: Model = dataclasses.replace(register, enabling=None)


@given(
    seed=SEEDS,
    operations=st.integers(1, 60),
    clients=st.integers(1, 6),
    values=st.sampled_from([None, 2, 3]),
    info_fraction=st.sampled_from([0.1, 0.3, 0.5]),
    broken=st.booleans(),
)
def test_enabling_index__never_changes_a_verdict_or_a_window(
    seed: int, operations: int, clients: int, values: int | None, info_fraction: float, broken: bool
) -> None:
    rng = random.Random(seed)
    ops = register_history(
        rng, operations=operations, clients=clients, values=values, info_fraction=info_fraction
    )
    if broken:
        ops = corrupt(rng, ops)
    indexed = LinearizableChecker(register).check(ops)
    plain = LinearizableChecker(UNINDEXED).check(ops)
    assert (indexed.valid, indexed.window) == (plain.valid, plain.window)


def test_one_busy_key__with_timeouts_stays_fast() -> None:
    # Eight clients on one key, a twentieth of the operations timing out: each backtrack would
    # otherwise try every outstanding timed-out operation before every open one.
    ops = register_history(random.Random(8), operations=3_000, clients=8, info_fraction=0.05)
    result = LinearizableChecker(register, time_budget_s=20).check(ops)
    assert result.valid is True, result.message


def test_many_outstanding_info_writes__stay_polynomial() -> None:
    # A third of the operations time out: Porcupine's +infinity treatment would be exponential.
    ops = register_history(
        random.Random(3), operations=1_000, clients=6, cas=False, info_fraction=0.3
    )
    result = LinearizableChecker(register, time_budget_s=20).check(ops)
    assert result.valid is True, result.message


def test_time_budget__exhausted_is_unknown_not_a_pass() -> None:
    ops = register_history(random.Random(5), operations=20_000, keys=1, clients=10)
    result = LinearizableChecker(register, time_budget_s=0.0).check(ops)
    assert result.valid == "unknown"
    assert result.stats["unknown_keys"] == ["k0"]


def test_operations_the_model_does_not_know__are_left_out() -> None:
    ops = register_history(random.Random(1), operations=50, clients=3)
    extra: list[dict[str, Any]] = [
        {"type": "invoke", "f": "add", "process": 99, "value": 1},
        {"type": "ok", "f": "add", "process": 99, "value": None},
    ]
    mixed = [*ops, *(Op(index=len(ops) + n, time_ns=0, **fields) for n, fields in enumerate(extra))]
    result = LinearizableChecker(register).check(mixed)
    assert result.valid is True
    assert (
        result.stats["operations"] == LinearizableChecker(register).check(ops).stats["operations"]
    )
