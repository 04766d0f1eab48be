"""Speed of the linearizability checker on register histories of 1,000 to 100,000 operations.

Each history is generated from a fixed seed (xr_jepsen.checkers.synthetic): 10 keys, 10 clients,
reads, writes and cas, about 2% of operations with an unknown outcome (info), and the client of
each info operation moving on to a new process, as jepsen-lite's clients do. Generated histories
are linearizable, so the verdict must be True; one more row breaks a 10,000-operation history
(a read of a value never written) to time the failing path, which includes finding the window.

The reference is Porcupine's published figure (Go; its README and paper: a 1,712-operation
etcd history, partitioned per key, checked in about 0.1 s), i.e. about 17,000 operations/s. It is
a published figure, not measured in this run: Go is not installed here. Target: 10,000 operations
in under 2 s.

Seconds are CPU seconds of this process (wall seconds beside them): the machine is shared.

Run: `python bench/checker.py [--sizes 1000 10000 100000] [--rounds R] [--seed S]`. The last line
is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time

from xr_jepsen.checkers import LinearizableChecker, register
from xr_jepsen.checkers.synthetic import register_history
from xr_jepsen.history import Op

KEYS = 10
CLIENTS = 10
INFO_FRACTION = 0.02
PORCUPINE_OPERATIONS = 1_712
PORCUPINE_S = 0.1
PORCUPINE_PER_S = PORCUPINE_OPERATIONS / PORCUPINE_S
TARGET_OPERATIONS = 10_000
TARGET_S = 2.0


def _broken(ops: list[Op], rng: random.Random) -> list[Op]:
    """The history with one acknowledged read, in its second half, returning a value nobody
    wrote: certainly not linearizable."""
    reads = [op for op in ops[len(ops) // 2 :] if op.f == "read" and op.type == "ok"]
    read = rng.choice(reads)
    broken = list(ops)
    broken[read.index] = dataclasses.replace(read, value="never written")
    return broken


def measure(ops: list[Op], rounds: int) -> tuple[float, float, dict[str, object]]:
    """The median CPU and wall-clock seconds of `rounds` checks, and the last result as JSON.
    CPU time is the headline: other load on this shared machine inflates wall time."""
    cpu_s: list[float] = []
    wall_s: list[float] = []
    document: dict[str, object] = {}
    for _ in range(rounds):
        checker = LinearizableChecker(register, time_budget_s=600.0)
        started_s, started_cpu_s = time.perf_counter(), time.process_time()
        result = checker.check(ops)
        cpu_s.append(time.process_time() - started_cpu_s)
        wall_s.append(time.perf_counter() - started_s)
        document = result.to_json()
    return statistics.median(cpu_s), statistics.median(wall_s), document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    arguments = parser.parse_args()
    if arguments.rounds < 1 or any(size < 1 for size in arguments.sizes):
        parser.error("--rounds and every --sizes must be at least 1")
    rows: list[dict[str, object]] = []
    cases: list[tuple[str, int, bool]] = [(f"{size:,}", size, False) for size in arguments.sizes]
    cases.append(("10,000 broken", 10_000, True))
    print(
        f"{'history':>15} {'operations':>10} {'events':>8} {'keys':>4} {'info':>5} "
        f"{'CPU s':>7} {'wall s':>7} {'ops/s':>9} {'vs Porcupine':>12}  verdict"
    )
    for label, size, broken in cases:
        rng = random.Random(arguments.seed)
        ops = register_history(
            rng, operations=size, keys=KEYS, clients=CLIENTS, info_fraction=INFO_FRACTION
        )
        if broken:
            ops = _broken(ops, rng)
        # Very large histories get one round: the point there is that they finish at all.
        rounds = 1 if size > TARGET_OPERATIONS else arguments.rounds
        elapsed_s, wall_s, document = measure(ops, rounds)
        info = sum(1 for op in ops if op.type == "info")
        per_s = size / elapsed_s
        verdict = str(document["valid"])
        if document["window"] is not None:
            verdict += f", window {document['window']}"
        print(
            f"{label:>15} {size:>10,} {len(ops):>8,} {KEYS:>4} {info:>5} {elapsed_s:>7.3f} "
            f"{wall_s:>7.3f} "
            f"{per_s:>9,.0f} {per_s / PORCUPINE_PER_S:>11.2f}x  {verdict}"
        )
        rows.append(
            {
                "history": label,
                "operations": size,
                "seconds": round(elapsed_s, 4),
                "wall_seconds": round(wall_s, 4),
                "operations_per_s": round(per_s),
                "valid": document["valid"],
            }
        )
    print(
        f"reference: Porcupine (Go), {PORCUPINE_OPERATIONS:,} operations per key-partitioned "
        f"history in about {PORCUPINE_S} s = {PORCUPINE_PER_S:,.0f} ops/s; a published figure, "
        "not measured in this run"
    )
    target_row = next((row for row in rows if row["history"] == f"{TARGET_OPERATIONS:,}"), None)
    if target_row is not None:
        print(
            f"target: {TARGET_OPERATIONS:,} operations in under {TARGET_S} s; "
            f"measured {target_row['seconds']} CPU s"
        )
    print(
        json.dumps(
            {
                "bench": "checker",
                "unit": "CPU seconds",
                "rows": rows,
                "reference_operations_per_s": PORCUPINE_PER_S,
                "reference": "published figure, not measured here",
                "target_s": TARGET_S,
            }
        )
    )


if __name__ == "__main__":
    main()
