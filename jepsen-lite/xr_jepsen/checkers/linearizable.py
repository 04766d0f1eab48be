"""Linearizability checking in the style of Porcupine, with just-in-time linearization.

The question: is there one order of the operations that (1) respects real time, an operation that
completed before another was invoked comes first, and (2) is a legal sequential run of the model?
`fail` operations are left out (they did not happen). Operations with an unknown outcome (`info`,
or never completed) may be placed anywhere after their invoke, or nowhere, and the model accepts
any output for them.

How the search works, and why it is not Porcupine's loop verbatim:
- Partitioned per key (`per_key=True`): a key-value history is linearizable if and only if each
  key's sub-history is (Herlihy and Wing's locality), and small searches are exponentially
  cheaper than one big one.
- The history index is the clock: the recorder assigns indices in real-time order, so there are
  no ties to break.
- Wing and Gong's depth-first search over "which operation next" with Lowe's memoization, but
  just in time (Lowe, "Testing for linearizability", 2017): operations are placed only when a
  completion forces them, in the order completions occur. At each completion the search first
  tries the completing operation alone, which succeeds almost always in a legal history, so the
  common path is one model step per operation. Only when that fails does it enumerate the other
  ways to reach the completion: sequences of still-open operations ending with the completing one,
  shortest first.
- Porcupine gives unknown-outcome operations a return time of +infinity, which makes its search
  exponential in the number of them outstanding: every subset of them may be placed before any
  later operation. Here, a configuration (state, placed operations) is memoized as failed, and one
  that differs only by having placed more unknown-outcome operations is pruned too: placing an
  optional operation never helps once the same state is reached without it. An unknown-outcome
  operation directly followed by a blind one (a write) is never tried: the write erases it. And
  with `Model.enabling`, a blind unknown-outcome operation is only placed right before an
  operation that depends on the state it produces (found through an index by effect), and a
  non-blind one only from the state it depends on: a backtrack costs about the number of
  operations that could use a value, not the number outstanding (hundreds, over a long run with
  faults).
- Iterative throughout (an explicit stack), integer bitsets for placed operations.

On a False verdict the checker finds the failing key's smallest window: the earliest history index
`last` such that the history cut there is not linearizable (operations still open at the cut count
as unknown-outcome), then the latest `first` such that the window [first, last] alone is still not
linearizable from *any* starting state (`Model.any_state`). `first` is only ever a clean cut, an
index that no operation completing inside the window straddles, so a window's verdict is a true
witness: no earlier or later event can make it legal. Both edges are monotone, so each is found
by binary search, within `shrink_budget_s`.
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from xr_jepsen.checkers.base import CheckResult, Valid, anomaly, client_operations, merge_valid
from xr_jepsen.checkers.models import UNKNOWN, Model
from xr_jepsen.history import Op, Operation

__all__ = ["LinearizableChecker"]

# How many search steps run between two looks at the clock.
_CLOCK_EVERY_STEPS = 1024


class _BudgetExceeded(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Item:
    """An operation as the search sees it: `ret` None means its outcome is unknown."""

    call: int
    ret: int | None
    input: Hashable
    output: Hashable


def _window_items(
    model: Model, operations: Sequence[Operation], first: int, last: int
) -> tuple[list[_Item], bool] | None:
    """The items of the window [first, last] of one key's operations (sorted by invoke), and
    whether any operation was cut off before `first`; None when `first` is not a clean cut.

    Operations invoked after `last` are left out; those completing after it count as unknown;
    those completed before `first` are left out; those invoked before `first` and unknown inside
    the window stay in, as unknown.
    """
    items: list[_Item] = []
    cut_before = False
    for operation in operations:
        call = operation.invoke.index
        if call > last:
            break
        completion = operation.completion
        ret = completion.index if completion is not None and operation.type == "ok" else None
        if ret is not None and ret < first:
            cut_before = True
            continue
        known = ret is not None and ret <= last
        if call < first and known:
            return None
        encoded = model.encode(operation if known else Operation(operation.invoke, None))
        if encoded is not None:
            items.append(_Item(call, ret if known else None, encoded[0], encoded[1]))
    return items, cut_before


@dataclass
class _SearchResult:
    valid: Valid
    # The history index of the completion no placement could explain (when valid is False).
    failing_index: int | None
    configurations: int


def _dominated(table: dict[Any, list[int]], key: Any, placed_unknown: int) -> bool:
    """Whether `table` holds `key` with a subset of `placed_unknown`: the same state and placed
    regular operations, reached with fewer optional ones placed."""
    seen = table.get(key)
    if seen is None:
        return False
    return any(earlier & placed_unknown == earlier for earlier in seen)


class _Search:
    """Just-in-time linearization of `items` from `start`; see the module docstring.

    A configuration is (state, placed, placed_unknown): the model state, the bitset of regular
    operations placed before their completion, and the bitset of unknown-outcome ones placed.
    Regular operation e (in completion order) completes at event e.
    """

    def __init__(
        self, model: Model, items: Sequence[_Item], start: Hashable, deadline_s: float
    ) -> None:
        regular = sorted(
            (item for item in items if item.ret is not None), key=lambda item: item.ret or 0
        )
        unknown = sorted((item for item in items if item.ret is None), key=lambda item: item.call)
        self.step = model.step
        self.start = start
        self.deadline_s = deadline_s
        self.count = len(regular)
        self.returns = [item.ret for item in regular]
        self.inputs = [item.input for item in regular]
        self.outputs = [item.output for item in regular]
        self.blind = [model.blind(item.input) for item in regular]
        self.unknown_inputs = [item.input for item in unknown]
        self.unknown_blind = [model.blind(item.input) for item in unknown]
        # A blind operation's effect does not depend on the state: compute it once.
        self.unknown_effects = [
            self.step(start, item.input, UNKNOWN)[1] if is_blind else None
            for item, is_blind in zip(unknown, self.unknown_blind, strict=True)
        ]
        self.bits, self.open_others, self.unknown_invoked = self._index(
            regular, [item.call for item in unknown]
        )
        # With `Model.enabling`, blind unknown-outcome operations are placed only together with
        # the operation right after them that they enable, found through `by_effect` (effect
        # state -> their numbers); the others are tried one by one.
        enabling = model.enabling
        self.by_effect: dict[Hashable, list[int]] | None = None
        self.enabling: list[Hashable] = []
        self.unknown_enabling: list[Hashable] = []
        if enabling is not None:
            self.by_effect = {}
            for number, effect in enumerate(self.unknown_effects):
                if self.unknown_blind[number]:
                    self.by_effect.setdefault(effect, []).append(number)
            self.enabling = [
                None if is_blind else enabling(item.input, item.output)
                for item, is_blind in zip(regular, self.blind, strict=True)
            ]
            self.unknown_enabling = [
                None if is_blind else enabling(item.input, UNKNOWN)
                for item, is_blind in zip(unknown, self.unknown_blind, strict=True)
            ]
        self.tried_alone = [
            number
            for number, is_blind in enumerate(self.unknown_blind)
            if enabling is None or not is_blind
        ]
        self.configurations = 0

    @staticmethod
    def _index(
        regular: Sequence[_Item], unknown_calls: Sequence[int]
    ) -> tuple[list[int], list[tuple[int, ...]], list[int]]:
        """Each regular operation's bit, and for each completion the other regular operations
        open at that moment and how many unknown-outcome ones had been invoked.

        A bit is a slot, free again once its operation completes: bitsets stay as small as the
        concurrency, not the history, which keeps hashing them for the memo cheap."""
        bits = [0] * len(regular)
        open_others: list[tuple[int, ...]] = []
        unknown_invoked: list[int] = []
        events = sorted(
            [(item.call, 0, number) for number, item in enumerate(regular)]
            + [(item.ret or 0, 1, number) for number, item in enumerate(regular)]
        )
        open_now: dict[int, None] = {}
        free_slots: list[int] = []
        for position, kind, number in events:
            if kind == 0:
                open_now[number] = None
                slot = heapq.heappop(free_slots) if free_slots else len(open_now) - 1
                bits[number] = 1 << slot
            else:
                del open_now[number]
                heapq.heappush(free_slots, bits[number].bit_length() - 1)
                open_others.append(tuple(open_now))
                unknown_invoked.append(bisect.bisect_left(unknown_calls, position))
        return bits, open_others, unknown_invoked

    def run(self) -> _SearchResult:
        try:
            return self._run()
        except _BudgetExceeded:
            return _SearchResult("unknown", None, self.configurations)

    def _run(self) -> _SearchResult:
        step, inputs, outputs, bits = self.step, self.inputs, self.outputs, self.bits
        # A frame: [event, state, placed, placed_unknown, successors]; successors None means
        # only the operation alone has been tried, `exhausted` that no other move exists (the
        # operation was placed earlier, so taking it out of `placed` was the only move).
        exhausted: Iterator[tuple[Hashable, int, int]] = iter(())
        failed: dict[tuple[int, Hashable, int], list[int]] = {}
        stack: list[list[Any]] = []
        event, state, placed, placed_unknown = 0, self.start, 0, 0
        furthest = 0
        while True:
            if event == self.count:
                return _SearchResult(True, None, self.configurations)
            self.configurations += 1
            if self.configurations % _CLOCK_EVERY_STEPS == 0:
                self._check_clock()
            furthest = max(furthest, event)
            if not (failed and _dominated(failed, (event, state, placed), placed_unknown)):
                bit = bits[event]
                if placed & bit:
                    stack.append([event, state, placed, placed_unknown, exhausted])
                    placed ^= bit
                    event += 1
                    continue
                ok, state_after = step(state, inputs[event], outputs[event])
                if ok:
                    stack.append([event, state, placed, placed_unknown, None])
                    state = state_after
                    event += 1
                    continue
                more = self._successors(event, state, placed, placed_unknown)
                following = next(more, None)
                if following is not None:
                    stack.append([event, state, placed, placed_unknown, more])
                    state, placed, placed_unknown = following
                    event += 1
                    continue
                failed.setdefault((event, state, placed), []).append(placed_unknown)
            # Backtrack to the latest frame with a move left to try.
            while stack:
                frame = stack[-1]
                if frame[4] is None:
                    frame[4] = self._successors(frame[0], frame[1], frame[2], frame[3])
                following = next(frame[4], None)
                if following is not None:
                    state, placed, placed_unknown = following
                    event = frame[0] + 1
                    break
                stack.pop()
                failed.setdefault((frame[0], frame[1], frame[2]), []).append(frame[3])
            else:
                return _SearchResult(False, self.returns[furthest], self.configurations)

    def _check_clock(self) -> None:
        if time.perf_counter() > self.deadline_s:
            raise _BudgetExceeded

    def _enabled(
        self, enabling: Hashable, limit: int, placed_unknown: int
    ) -> list[tuple[int, Hashable]]:
        """Blind unknown-outcome operations, invoked among the first `limit` and not placed yet,
        whose effect is `enabling`: the ones worth placing right before an operation that
        depends on that state. Each as (its bit, its effect)."""
        assert self.by_effect is not None
        return [
            (1 << number, self.unknown_effects[number])
            for number in self.by_effect.get(enabling, ())
            if number < limit and not placed_unknown >> number & 1
        ]

    def _successors(
        self, event: int, start: Hashable, placed: int, placed_unknown: int
    ) -> Iterator[tuple[Hashable, int, int]]:
        """Configurations after placing event's operation, other than placing it alone: first
        after one other open operation, then after two, and so on, skipping dominated ones."""
        step, inputs, outputs, bits, blind = (
            self.step,
            self.inputs,
            self.outputs,
            self.bits,
            self.blind,
        )
        unknown_inputs, unknown_blind, unknown_effects = (
            self.unknown_inputs,
            self.unknown_blind,
            self.unknown_effects,
        )
        indexed = self.by_effect is not None
        limit = self.unknown_invoked[event]
        target_input, target_output, target_blind = inputs[event], outputs[event], blind[event]
        others = [number for number in self.open_others[event] if not placed & bits[number]]
        alone = self.tried_alone[: bisect.bisect_left(self.tried_alone, limit)]
        optional = [number for number in alone if not placed_unknown >> number & 1]
        optional_by_enabling: dict[Hashable, list[int]] = {}
        pairs: list[tuple[int, Hashable, int]] = []
        if indexed:
            for number in optional:
                enabling = self.unknown_enabling[number]
                optional_by_enabling.setdefault(enabling, []).append(number)
                pairs += [
                    (number, effect, bit)
                    for bit, effect in self._enabled(enabling, limit, placed_unknown)
                ]
        seen: dict[Any, list[int]] = {(start, placed): [placed_unknown]}
        produced: dict[Any, list[int]] = {}
        ok, direct = step(start, target_input, target_output)
        if ok:
            produced[(direct, placed)] = [placed_unknown]
        level = [(start, placed, placed_unknown, False)]
        # Counted locally and added per level: an attribute update per step is measurably slower.
        explored = 0
        while level:
            self.configurations += explored
            explored = 0
            self._check_clock()
            next_level = []
            for state_before, placed_before, unknown_before, after_unknown in level:
                # Each move is (state the operation starts from, unknown-outcome bits placed
                # with it): the operation alone, or right after a blind one it depends on.
                if indexed and not after_unknown and not target_blind:
                    for bit, effect in self._enabled(self.enabling[event], limit, unknown_before):
                        explored += 1
                        ok, final = step(effect, target_input, target_output)
                        if ok and not _dominated(
                            produced, (final, placed_before), unknown_before | bit
                        ):
                            produced.setdefault((final, placed_before), []).append(
                                unknown_before | bit
                            )
                            yield final, placed_before, unknown_before | bit
                for number in others:
                    if placed_before & bits[number] or (after_unknown and blind[number]):
                        continue
                    moves = [(state_before, 0)]
                    if indexed and not after_unknown and not blind[number]:
                        moves += [
                            (effect, bit)
                            for bit, effect in self._enabled(
                                self.enabling[number], limit, unknown_before
                            )
                        ]
                    for state_in, with_unknown in moves:
                        explored += 1
                        ok, state_after = step(state_in, inputs[number], outputs[number])
                        placed_after = placed_before | bits[number]
                        unknown_after = unknown_before | with_unknown
                        if not ok or _dominated(seen, (state_after, placed_after), unknown_after):
                            continue
                        seen.setdefault((state_after, placed_after), []).append(unknown_after)
                        next_level.append((state_after, placed_after, unknown_after, False))
                        ok, final = step(state_after, target_input, target_output)
                        if ok and not _dominated(produced, (final, placed_after), unknown_after):
                            produced.setdefault((final, placed_after), []).append(unknown_after)
                            yield final, placed_after, unknown_after
                if indexed:
                    # By `Model.enabling`'s contract, an unknown-outcome operation changes
                    # nothing from any state but its enabling one, so only those are tried,
                    # alone or right after a blind one that produces that state.
                    unknown_moves = [
                        (number, state_before, 0)
                        for number in optional_by_enabling.get(state_before, ())
                    ]
                    if not after_unknown:
                        unknown_moves += pairs
                else:
                    unknown_moves = [
                        (number, state_before, 0)
                        for number in optional
                        if not (after_unknown and unknown_blind[number])
                    ]
                for number, state_in, with_unknown in unknown_moves:
                    if (unknown_before >> number & 1) or (unknown_before & with_unknown):
                        continue
                    explored += 1
                    if unknown_blind[number]:
                        ok, state_after = True, unknown_effects[number]
                    else:
                        ok, state_after = step(state_in, unknown_inputs[number], UNKNOWN)
                    unknown_after = unknown_before | with_unknown | 1 << number
                    if not ok or _dominated(seen, (state_after, placed_before), unknown_after):
                        continue
                    seen.setdefault((state_after, placed_before), []).append(unknown_after)
                    next_level.append((state_after, placed_before, unknown_after, True))
                    # The target right after an unknown-outcome operation is dominated when it
                    # is blind: it erases that operation's effect.
                    if target_blind:
                        continue
                    ok, final = step(state_after, target_input, target_output)
                    if ok and not _dominated(produced, (final, placed_before), unknown_after):
                        produced.setdefault((final, placed_before), []).append(unknown_after)
                        yield final, placed_before, unknown_after
            level = next_level


def _search(
    model: Model, items: Sequence[_Item], start: Hashable, deadline_s: float
) -> _SearchResult:
    return _Search(model, items, start, deadline_s).run()


def _fails(
    model: Model, operations: Sequence[Operation], first: int, last: int, deadline_s: float
) -> bool:
    """Whether the window [first, last] is certainly not linearizable; False when it is, when
    `first` is not a clean cut, or when the budget ran out."""
    built = _window_items(model, operations, first, last)
    if built is None:
        return False
    items, cut_before = built
    if cut_before and model.any_state is None:
        return False
    start = model.any_state if cut_before else model.init()
    return _search(model, items, start, deadline_s).valid is False


def _clean_cuts(operations: Sequence[Operation], last: int) -> list[int]:
    """Invoke indices `first` <= last that no operation completing in [first, last] straddles."""
    cuts: list[int] = []
    latest_known = -1
    for operation in operations:
        call = operation.invoke.index
        if call > last:
            break
        if latest_known < call:
            cuts.append(call)
        completion = operation.completion
        if completion is not None and operation.type == "ok" and completion.index <= last:
            latest_known = max(latest_known, completion.index)
    return cuts


def _shrink(
    model: Model, operations: Sequence[Operation], failing_index: int, deadline_s: float
) -> tuple[int, int]:
    """The smallest failing window [first, last] of one key; see the module docstring."""
    first = operations[0].invoke.index
    completions = sorted(
        operation.completion.index
        for operation in operations
        if operation.completion is not None and operation.type == "ok"
    )
    last = completions[-1]
    # The earliest failing cut: the search's own guess first, since it is almost always right.
    if _fails(model, operations, first, failing_index, deadline_s):
        last = failing_index
    else:
        low = bisect.bisect_right(completions, failing_index)
        high = len(completions) - 1
        while low < high:
            middle = (low + high) // 2
            if _fails(model, operations, first, completions[middle], deadline_s):
                high = middle
            else:
                low = middle + 1
        last = completions[high]
    cuts = _clean_cuts(operations, last)
    low, high = 0, len(cuts) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if _fails(model, operations, cuts[middle], last, deadline_s):
            low = middle
        else:
            high = middle - 1
    return cuts[low], last


class LinearizableChecker:
    """Checks that a history is linearizable with respect to `model` (see models.py).

    Only operations whose f the model knows are checked. With `per_key=True` each key is checked
    alone. Past `time_budget_s` the verdict is "unknown"; finding the failing window gets
    `shrink_budget_s` more and reports the best window found by then.
    """

    def __init__(
        self,
        model: Model,
        *,
        time_budget_s: float = 60.0,
        shrink_budget_s: float = 10.0,
        per_key: bool = True,
        name: str = "linearizable",
    ) -> None:
        self.model = model
        self.time_budget_s = time_budget_s
        self.shrink_budget_s = shrink_budget_s
        self.per_key = per_key
        self.name = name

    def check(self, ops: Sequence[Op]) -> CheckResult:
        started_s = time.perf_counter()
        deadline_s = started_s + self.time_budget_s
        model = self.model
        partitions: dict[str | None, list[Operation]] = {}
        total = 0
        for operation in client_operations(ops, sorted(model.fs)):
            if operation.type == "fail":
                continue
            total += 1
            key = operation.key if self.per_key else None
            partitions.setdefault(key, []).append(operation)
        verdicts: list[Valid] = []
        anomalies: list[dict[str, Any]] = []
        windows: list[tuple[int, int]] = []
        unknown_keys: list[str | None] = []
        configurations = 0
        end = max((op.index for op in ops), default=0)
        for key in sorted(partitions, key=lambda name: "" if name is None else name):
            operations = partitions[key]
            built = _window_items(model, operations, 0, end)
            assert built is not None, "the whole history is always a clean window"
            result = _search(model, built[0], model.init(), deadline_s)
            configurations += result.configurations
            verdicts.append(result.valid)
            if result.valid == "unknown":
                unknown_keys.append(key)
            if result.valid is not False:
                continue
            assert result.failing_index is not None
            shrink_deadline_s = time.perf_counter() + self.shrink_budget_s
            first, last = _shrink(model, operations, result.failing_index, shrink_deadline_s)
            windows.append((first, last))
            anomalies.append(self._anomaly(key, operations, first, last))
        valid = merge_valid(verdicts)
        window = min(windows, key=lambda pair: (pair[1] - pair[0], pair[0])) if windows else None
        if valid is True:
            message = f"linearizable: {total} operations over {len(partitions)} keys"
        elif valid is False:
            message = f"not linearizable: {len(anomalies)} of {len(partitions)} keys fail"
        else:
            message = (
                f"unknown: the {self.time_budget_s} s budget ran out on {len(unknown_keys)} keys"
            )
        return CheckResult(
            checker=self.name,
            valid=valid,
            message=message,
            anomalies=anomalies,
            window=window if valid is False else None,
            stats={
                "model": model.name,
                "operations": total,
                "keys": len(partitions),
                "unknown_keys": unknown_keys,
                "configurations": configurations,
                "elapsed_s": time.perf_counter() - started_s,
            },
        )

    def _anomaly(
        self, key: str | None, operations: Sequence[Operation], first: int, last: int
    ) -> dict[str, Any]:
        indices = [
            index
            for operation in operations
            for index in operation.indices
            if first <= index <= last
        ]
        culprit = next(
            (
                operation
                for operation in operations
                if operation.completion is not None and operation.completion.index == last
            ),
            None,
        )
        what = ""
        if culprit is not None:
            encoded = self.model.encode(culprit)
            if encoded is not None:
                what = f": op {culprit.invoke.index} ({self.model.describe(*encoded)}) "
                what += "has no legal place"
        count = sum(1 for operation in operations if first <= operation.invoke.index <= last)
        scope = "the history" if key is None else f"key {key!r}"
        return anomaly(
            "nonlinearizable",
            f"{scope}: ops {first}..{last} ({count} operations invoked there) are not "
            f"linearizable{what}",
            indices,
            key=key,
            window=[first, last],
        )
