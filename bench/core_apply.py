"""Decode + apply throughput of the replicated core on one core, for a realistic mix.

The mix, in equal parts: lock acquire, lock release, KV put, job heartbeat, session keepalive,
over 256 sessions, locks, keys and running tasks, with the proposer's clock moving 1 ms an entry.
Entries are encoded before timing starts (a proposer encodes; every replica decodes and applies),
so the figure is what one replica's apply loop sustains. The headline is per second of this
process's CPU time, which other load on the machine does not distort; wall-clock rates are
printed beside it. Target: 50,000 commands/s, so that the
core never limits the cluster (pysyncobj itself peaks near 20,000 commits/s on this machine).

Run: `python bench/core_apply.py [--entries N] [--rounds R]`. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from xrcore import Envelope, StateMachine, encode
from xrcore import commands as c

WIDTH = 256
START_MS = 1_700_000_000_000
TARGET_PER_S = 50_000


def _setup() -> tuple[StateMachine, list[bytes], list[str], list[tuple[str, int]]]:
    machine = StateMachine()
    log: list[bytes] = []
    now_ms = START_MS

    def apply(command: c.Command) -> dict[str, object]:
        nonlocal now_ms
        now_ms += 1
        entry = encode(Envelope(command=command, now_ms=now_ms))
        log.append(entry)
        return machine.apply(entry, len(log)).result.unwrap()

    apply(c.RegionRegister(name="r1", http_address="http://127.0.0.1:1", raft_address="r:1"))
    sessions = [str(apply(c.SessionGrant(ttl_ms=600_000))["session_id"]) for _ in range(WIDTH)]
    tasks: list[tuple[str, int]] = []
    job_id = str(
        apply(c.JobSubmit(spec=c.JobSpec(name="b", workload="w", array_size=WIDTH)))["job_id"]
    )
    for index in range(WIDTH):
        apply(c.TaskAssign(job_id=job_id, task_index=index, region="r1"))
        claim = apply(
            c.TaskClaim(
                job_id=job_id, task_index=index, region="r1", executor_id="e", lease_ttl_ms=600_000
            )
        )
        tasks.append((job_id, int(str(claim["token"]))))
    return machine, log, sessions, tasks


def _workload(
    sessions: list[str], tasks: list[tuple[str, int]], count: int, start_ms: int
) -> list[bytes]:
    entries: list[bytes] = []
    seqs = [0] * WIDTH
    for number in range(count // 5):
        slot = number % WIDTH
        session_id = sessions[slot]
        job_id, token = tasks[slot]
        for command in (
            c.LockAcquire(name=f"lock/{slot}", session_id=session_id, wait=True),
            c.KvPut(key=f"key/{slot}", value=b"x" * 64),
            c.TaskHeartbeat(
                job_id=job_id,
                task_index=slot,
                token=token,
                done=number,
                total=count,
                metrics={"loss": 0.5},
            ),
            c.SessionKeepAlive(session_id=session_id),
            c.LockRelease(name=f"lock/{slot}", session_id=session_id),
        ):
            seqs[slot] += 1
            entries.append(
                encode(
                    Envelope(
                        command=command,
                        now_ms=start_ms + len(entries),
                        client_id=f"client-{slot}",
                        seq=seqs[slot],
                    )
                )
            )
    return entries


def measure(entries_count: int) -> tuple[float, float]:
    """Commands per second of CPU time (one core, robust to other load) and of wall time."""
    machine, log, sessions, tasks = _setup()
    entries = _workload(sessions, tasks, entries_count, machine.now_ms + 1)
    first = len(log) + 1
    apply = machine.apply
    started_s, started_cpu_s = time.perf_counter(), time.process_time()
    for offset, entry in enumerate(entries):
        applied = apply(entry, first + offset)
        if applied.result.error is not None or applied.duplicate:
            raise AssertionError(f"benchmark entry {offset} was not applied: {applied}")
    elapsed_s = time.perf_counter() - started_s
    elapsed_cpu_s = time.process_time() - started_cpu_s
    return len(entries) / elapsed_cpu_s, len(entries) / elapsed_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    if arguments.entries < 1 or arguments.rounds < 1:
        parser.error("--entries and --rounds must be at least 1")
    rates = []
    for round_number in range(1, arguments.rounds + 1):
        rate, wall_rate = measure(arguments.entries)
        rates.append(rate)
        print(
            f"round {round_number}/{arguments.rounds}: {rate:,.0f} commands per CPU second "
            f"({wall_rate:,.0f} per wall second)"
        )
    median = statistics.median(rates)
    print(
        f"median {median:,.0f} commands/s; target {TARGET_PER_S:,}/s "
        f"({median / TARGET_PER_S:.2f}x target)"
    )
    print(
        json.dumps(
            {
                "bench": "core_apply",
                "value": round(median),
                "unit": "commands/s",
                "target": TARGET_PER_S,
                "ratio_to_target": round(median / TARGET_PER_S, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
