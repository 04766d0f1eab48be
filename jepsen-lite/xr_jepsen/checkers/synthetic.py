"""Seeded synthetic histories with known verdicts, for the checkers' tests and benchmark.

Each generator simulates correct systems: concurrent clients whose operations take effect
atomically at one moment between invoke and completion (or, for an unknown outcome, at any moment
after the invoke, even after the client gave up, or never). So every generated history is legal,
and a test that breaks one in a known way knows the verdict. Everything derives from the `rng`
passed in.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xr_jepsen.history import Op, OpType

__all__ = [
    "SyntheticOp",
    "lock_history",
    "queue_history",
    "register_history",
    "set_history",
    "to_history",
]


@dataclass
class SyntheticOp:
    """One simulated client operation: its times and what the history records for it."""

    process: int
    f: str
    value: Any
    invoke_s: float
    complete_s: float | None
    type: OpType = "ok"
    result: Any = None
    key: str | None = None


def to_history(operations: list[SyntheticOp]) -> list[Op]:
    """Invokes and completions in time order, indexed 0..n-1."""
    events: list[tuple[float, int, int]] = []
    for number, operation in enumerate(operations):
        events.append((operation.invoke_s, 0, number))
        if operation.complete_s is not None:
            events.append((operation.complete_s, 1, number))
    events.sort()
    ops: list[Op] = []
    for moment_s, kind, number in events:
        operation = operations[number]
        invoke = kind == 0
        ops.append(
            Op(
                index=len(ops),
                type="invoke" if invoke else operation.type,
                f=operation.f,
                process=operation.process,
                value=operation.value if invoke else operation.result,
                time_ns=int(moment_s * 1e9),
                key=operation.key,
                error=None if invoke or operation.type == "ok" else "simulated",
            )
        )
    return ops


def _schedule(
    rng: random.Random,
    count: int,
    clients: int,
    info_fraction: float,
    make: Callable[[int, float, float], SyntheticOp],
) -> list[SyntheticOp]:
    """`count` operations by `clients` closed-loop clients. `make(process, invoke_s, effect_s)`
    builds each; an unknown-outcome one gets `complete_s` None when it is the client's last, and
    its client moves on to a new process number (the old operation may still be in flight)."""
    ready = [(rng.random() * 0.01, client, client) for client in range(clients)]
    heapq.heapify(ready)
    operations: list[SyntheticOp] = []
    while len(operations) < count:
        now_s, client, process = heapq.heappop(ready)
        invoke_s = now_s + rng.random() * 0.002
        effect_s = invoke_s + rng.random() * 0.01
        operation = make(process, invoke_s, effect_s)
        operation.complete_s = effect_s + rng.random() * 0.01
        operations.append(operation)
        if rng.random() < info_fraction:
            operation.type = "info"
            operation.result = None
            process += clients
        heapq.heappush(ready, (operation.complete_s, client, process))
    return operations


def register_history(
    rng: random.Random,
    *,
    operations: int,
    keys: int = 1,
    clients: int = 5,
    info_fraction: float = 0.02,
    fail_fraction: float = 0.0,
    cas: bool = True,
    values: int | None = None,
) -> list[Op]:
    """A linearizable history of read, write and cas on `keys` registers.

    Written values are unique per history unless `values` is given (then drawn from range(values)).
    An unknown-outcome operation takes effect with probability 1/2, at a random moment up to well
    after its client gave up. A `fail` operation (a `fail_fraction` of writes, and every cas whose
    compare fails) has no effect.
    """
    counter = iter(range(1, 1 << 62))
    planned: list[tuple[float, int, SyntheticOp]] = []

    def make(process: int, invoke_s: float, effect_s: float) -> SyntheticOp:
        roll = rng.random()
        key = f"k{rng.randrange(keys)}"
        fresh = next(counter) if values is None else rng.randrange(values)
        if roll < 0.5:
            operation = SyntheticOp(process, "read", None, invoke_s, None, key=key)
        elif roll < 0.8 or not cas:
            operation = SyntheticOp(process, "write", fresh, invoke_s, None, key=key)
        else:
            # The expected value is filled in from the state at invoke time, below.
            operation = SyntheticOp(process, "cas", [None, fresh], invoke_s, None, key=key)
        planned.append((effect_s, len(planned), operation))
        return operation

    history = _schedule(rng, operations, clients, info_fraction, make)
    # Replay the effects in time order on a sequential register per key. A cas expects the value
    # its key held at its invoke half the time (likely to succeed), else a random earlier value.
    effects: list[tuple[float, int, SyntheticOp]] = []
    for effect_s, number, operation in planned:
        if operation.type == "info":
            if rng.random() < 0.5:
                continue
            effect_s = operation.invoke_s + rng.random() * 0.1
        elif operation.f == "write" and rng.random() < fail_fraction:
            operation.type = "fail"
            continue
        effects.append((effect_s, number, operation))
    effects.sort(key=lambda item: (item[0], item[1]))
    invokes = sorted(history, key=lambda operation: operation.invoke_s)
    state: dict[str | None, Any] = {}
    seen: dict[str | None, list[Any]] = {}
    effect_position = 0
    for operation in invokes:
        # Advance the register to this invoke, to pick a cas's expected value.
        while effect_position < len(effects) and effects[effect_position][0] < operation.invoke_s:
            _apply(state, seen, effects[effect_position][2])
            effect_position += 1
        if operation.f == "cas":
            choices = seen.get(operation.key, [None])
            expected = state.get(operation.key) if rng.random() < 0.5 else rng.choice(choices[-5:])
            operation.value = [expected, operation.value[1]]
    state.clear()
    seen.clear()
    for _, _, operation in effects:
        _apply(state, seen, operation)
    return to_history(history)


def _apply(
    state: dict[str | None, Any], seen: dict[str | None, list[Any]], op: SyntheticOp
) -> None:
    """Applies one operation to the sequential registers and records what it returned."""
    current = state.get(op.key)
    if op.f == "read":
        if op.type == "ok":
            op.result = current
    elif op.f == "write":
        state[op.key] = op.value
        seen.setdefault(op.key, [None]).append(op.value)
    elif op.value[0] == current:
        state[op.key] = op.value[1]
        seen.setdefault(op.key, [None]).append(op.value[1])
    elif op.type == "ok":
        op.type = "fail"
        op.result = None


def set_history(
    rng: random.Random, *, adds: int, clients: int = 5, info_fraction: float = 0.05
) -> tuple[list[Op], list[int]]:
    """Adds of unique integers and a final read of the set: the history and the elements that
    took effect. An unknown-outcome add takes effect with probability 1/2."""
    counter = iter(range(adds))

    def make(process: int, invoke_s: float, effect_s: float) -> SyntheticOp:
        return SyntheticOp(process, "add", next(counter), invoke_s, None)

    history = _schedule(rng, adds, clients, info_fraction, make)
    present = [
        operation.value for operation in history if operation.type == "ok" or rng.random() < 0.5
    ]
    end_s = max((operation.complete_s or 0.0 for operation in history), default=0.0) + 1.0
    final = SyntheticOp(10_000, "read-final", None, end_s, end_s + 0.1, result=sorted(present))
    return to_history([*history, final]), sorted(present)


def lock_history(rng: random.Random, *, rounds: int, info_fraction: float = 0.05) -> list[Op]:
    """One lock handed from holder to holder with increasing tokens; each holder accesses the
    resource with its token (accepted), and now and then a former holder tries its stale token
    (rejected). Tokens are the round number times 10, as a Raft log index would be: increasing,
    not consecutive. Operations run one after another, each on its own process."""
    operations: list[SyntheticOp] = []
    now_s = 0.0

    def add(f: str, value: Any, result: Any, outcome: OpType = "ok") -> None:
        nonlocal now_s
        invoke_s = now_s + rng.random() * 0.001
        now_s = invoke_s + 0.001 + rng.random() * 0.001
        operations.append(SyntheticOp(len(operations), f, value, invoke_s, now_s, outcome, result))

    for round_number in range(1, rounds + 1):
        lock = {"lock": "l", "token": round_number * 10}
        add("acquire", {"lock": "l"}, lock)
        for _ in range(rng.randint(1, 3)):
            add("access", lock, lock)
        if round_number > 1 and rng.random() < 0.3:
            add("access", {"lock": "l", "token": (round_number - 1) * 10}, None, "fail")
        add("release", lock, None, "info" if rng.random() < info_fraction else "ok")
    return to_history(operations)


def queue_history(
    rng: random.Random, *, jobs: int, clients: int = 3, info_fraction: float = 0.05
) -> list[Op]:
    """Jobs enqueued, each completed by one accepted attempt (some after a rejected stale
    attempt), and a final read that shows each as succeeded with its accepted token. An
    unknown-outcome enqueue takes effect with probability 1/2."""
    operations: list[SyntheticOp] = []
    now_s = 0.0
    final: dict[str, Any] = {}
    next_token = 1

    def add(f: str, value: Any, result: Any, outcome: OpType = "ok") -> None:
        nonlocal now_s
        invoke_s = now_s + rng.random() * 0.001
        now_s = invoke_s + 0.001 + rng.random() * 0.001
        process = rng.randrange(clients)
        operations.append(SyntheticOp(process, f, value, invoke_s, now_s, outcome, result))

    for number in range(jobs):
        key = f"job-{number}"
        unknown = rng.random() < info_fraction
        add(
            "enqueue",
            key,
            None if unknown else {"key": key, "job_id": number},
            "info" if unknown else "ok",
        )
        if unknown and rng.random() < 0.5:
            continue
        if rng.random() < 0.2:
            add("complete", {"key": key, "token": next_token}, None, "fail")
            next_token += 1
        add("complete", {"key": key, "token": next_token}, {"key": key, "token": next_token})
        final[key] = {"state": "succeeded", "token": next_token}
        next_token += 1
    add("read-final", None, final)
    # Closed-loop clients never overlap their own operations: give each its own process.
    for number, operation in enumerate(operations):
        operation.process = number
    return to_history(operations)
