"""raftstore against raw pysyncobj on 3 processes each, on loopback, measured in the same run.

Systems:
- raw: `bench/_raw_pysyncobj.py`, a SyncObj with one `@replicated` method taking bytes and doing
  nothing, `appendEntriesUseBatch=False`, `autoTick` on, callbacks, a journal file like raftstore's
  (`--no-raw-journal` drops it). Its load runs inside the leader, on pysyncobj's own thread.
- raftstore: `python -m raftstore.member` with raftstore's default configuration; its load runs
  inside the leader through `RaftStore.propose` (group commit, asyncio bridge, state machine).
Both replicate the same command size: a `KvPut` of a 64-byte value with a client id and seq,
encoded by xrcore (raw replicates those bytes as they are).

Each point is a closed loop at 1, 16, 64 and 1,000 commands in flight for `--duration-s`. Each
round measures every point of one system, then of the other, in an order that alternates between
rounds; the figure is the median over `--rounds`. While one system is measured the other cluster
is paused with SIGSTOP, so its idle work (raftstore's tick driver and lease ticks) takes no CPU
from the measured one; a resumed cluster re-elects, so it first gets `SETTLE_S` alone, and each
point waits for a stable leader.

Failover: kill -9 the raftstore leader, then write to both survivors (retrying the same client id
and seq) until one write commits; the time from the kill to that commit, over `--failover-trials`.
The killed member restarts from its data directory before the next trial.

Run: `python bench/raftstore.py [--quick]` (`--quick`: 1 round of 1.5 s and 3 failovers, where
`--rounds`, `--duration-s` and `--failover-trials` do not say otherwise). Everything stops by
itself; on errors, Ctrl-C and SIGTERM every member is resumed (if paused) and stopped, and the
temporary directory removed. The last line is one JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the package it measures: run as a script, its own folder would come
# first on the path and shadow that package, so the repository root takes its place.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator, Sequence  # noqa: E402
from typing import Any  # noqa: E402

from bench._arguments import positive_integers  # noqa: E402
from bench._signals import run_main, shielded  # noqa: E402
from raftstore.member import MemberClient, MemberProcess, MemberUnreachable, free_ports  # noqa: E402
from xrcore import Envelope, encode  # noqa: E402
from xrcore.commands import KvPut  # noqa: E402

CONCURRENCIES = (1, 16, 64, 1_000)
VALUE_BYTES = 64
MEMBERS = 3
READY_TIMEOUT_S = 60.0
LEADER_TIMEOUT_S = 60.0
# A load's answer comes after its window plus the time to drain what is still in flight.
LOAD_ANSWER_MARGIN_S = 60.0
FAILOVER_PUT_TIMEOUT_S = 0.5
FAILOVER_RETRY_PAUSE_S = 0.005
FAILOVER_TIMEOUT_S = 30.0
# Longer than either system's largest election timeout (1.4 s): a resumed cluster re-elects.
SETTLE_S = 2.0
# Option -> (default, with --quick).
DEFAULTS: dict[str, tuple[float, float]] = {
    "rounds": (3, 1),
    "duration_s": (2.5, 1.5),
    "failover_trials": (5, 3),
}
RAW_MODULE = "bench._raw_pysyncobj"
RAFTSTORE_MODULE = "raftstore.member"


class Cluster:
    """Three member processes of one system and a control client for each."""

    def __init__(self, name: str, module: str, root: Path, options: Sequence[str] = ()) -> None:
        ports = free_ports(2 * MEMBERS)
        raft_ports, control_ports = ports[:MEMBERS], ports[MEMBERS:]
        self.name = name
        self.processes = [
            MemberProcess(
                raft_port=raft_port,
                peer_ports=[other for other in raft_ports if other != raft_port],
                control_port=control_port,
                data_dir=root / name / f"member-{position}",
                options=options,
                module=module,
            )
            for position, (raft_port, control_port) in enumerate(
                zip(raft_ports, control_ports, strict=True)
            )
        ]
        self.clients = [MemberClient(process.control_port) for process in self.processes]

    def start(self) -> None:
        for process in self.processes:
            process.start()
        for process in self.processes:
            process.wait_ready(READY_TIMEOUT_S)

    def alive(self) -> list[int]:
        return [n for n, process in enumerate(self.processes) if process.running]

    def signal(self, signal_number: int) -> None:
        for process in self.processes:
            if process.process is not None and process.running:
                process.process.send_signal(signal_number)

    async def leader(self) -> int:
        """The member leading with a quorum, once every live member names it."""
        deadline_s = time.monotonic() + LEADER_TIMEOUT_S
        while time.monotonic() < deadline_s:
            alive = self.alive()
            statuses: dict[int, dict[str, Any]] = {}
            for member in alive:
                with contextlib.suppress(MemberUnreachable):
                    statuses[member] = await self.clients[member].call({"op": "status"})
            leaders = [
                member
                for member, status in statuses.items()
                if status["is_leader"] and status["has_quorum"]
            ]
            if len(statuses) == len(alive) and len(leaders) == 1:
                address = self.processes[leaders[0]].address
                if all(status["leader"] == address for status in statuses.values()):
                    return leaders[0]
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{self.name}: no stable leader in {LEADER_TIMEOUT_S} s")

    async def load(self, request: dict[str, Any], duration_s: float) -> dict[str, Any]:
        leader = await self.leader()
        answer = await self.clients[leader].call(
            {**request, "duration_s": duration_s}, timeout_s=duration_s + LOAD_ANSWER_MARGIN_S
        )
        if not answer.get("ok"):
            raise RuntimeError(f"{self.name} load failed: {answer}")
        return answer

    async def stop(self) -> None:
        for client in self.clients:
            await client.close()
        self.halt()

    def halt(self) -> None:
        """Resumes every member (a paused one would not act on SIGTERM), then stops it: SIGTERM,
        SIGKILL after 5 s. Needs no event loop, so it also runs after one has failed."""
        self.signal(signal.SIGCONT)
        for process in self.processes:
            process.terminate(timeout_s=5.0)


def _command_bytes() -> bytes:
    """The bytes the raw system replicates: what raftstore's load proposes, encoded."""
    envelope = Envelope(
        command=KvPut(key="load/0", value=b"x" * VALUE_BYTES),
        now_ms=time.time_ns() // 1_000_000,
        client_id=f"load-{12345}-{0}",
        seq=1,
    )
    return encode(envelope)


# Throughput and latency.


@contextlib.asynccontextmanager
async def _alone(
    cluster: Cluster, others: Sequence[Cluster], *, pause: bool
) -> AsyncIterator[None]:
    """Pauses the other clusters (SIGSTOP) while `cluster` is measured. A cluster that resumes
    from a pause elects a new leader, so `cluster` first gets `SETTLE_S` to finish an election
    of its own before anything is measured."""
    if pause:
        for other in others:
            other.signal(signal.SIGSTOP)
        await asyncio.sleep(SETTLE_S)
    try:
        yield
    finally:
        for other in others:
            other.signal(signal.SIGCONT)


async def _measure(
    systems: dict[str, tuple[Cluster, dict[str, Any]]],
    *,
    concurrencies: Sequence[int],
    rounds: int,
    duration_s: float,
    pause_other: bool,
    warmup: bool = False,
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Every point of one system, then every point of the other, in an order that alternates
    between rounds; with `warmup`, the lines printed say so."""
    results: dict[str, dict[int, list[dict[str, Any]]]] = {
        name: {concurrency: [] for concurrency in concurrencies} for name in systems
    }
    names = list(systems)
    for round_number in range(rounds):
        order = names if round_number % 2 == 0 else names[::-1]
        for name in order:
            cluster, request = systems[name]
            others = [systems[other][0] for other in names if other != name]
            async with _alone(cluster, others, pause=pause_other):
                for concurrency in concurrencies:
                    answer = await cluster.load(
                        {**request, "concurrency": concurrency, "count": 10**9}, duration_s
                    )
                    results[name][concurrency].append(answer)
                    label = "warm-up" if warmup else f"round {round_number + 1}/{rounds}"
                    print(
                        f"{label} {name:>9} c={concurrency:<5} "
                        f"{answer['commits_per_s']:>9,.0f} commits/s  "
                        f"p50 {_milliseconds(answer['latency_p50_ms'])}  "
                        f"p99 {_milliseconds(answer['latency_p99_ms'])}"
                        + (f"  errors {answer['errors']}" if answer["errors"] else ""),
                        flush=True,
                    )
    return results


def _milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _median(answers: list[dict[str, Any]], field: str) -> float:
    values = [answer[field] for answer in answers if answer[field] is not None]
    return float(statistics.median(values)) if values else float("nan")


# Failover.


async def _first_commit(cluster: Cluster, survivors: list[int], trial: int) -> float:
    """Writes through every survivor, the same (client_id, seq) each time, until one commits;
    returns the moment of that commit."""
    committed = asyncio.get_running_loop().create_future()
    request = {
        "op": "put",
        "key": f"failover/{trial}",
        "value": b"x" * VALUE_BYTES,
        "client_id": "failover",
        "seq": trial + 1,
        "timeout_s": FAILOVER_PUT_TIMEOUT_S,
    }

    async def writer(member: int) -> None:
        client = MemberClient(cluster.processes[member].control_port)
        try:
            while not committed.done():
                try:
                    answer = await client.call(request, timeout_s=FAILOVER_PUT_TIMEOUT_S * 4)
                except MemberUnreachable:
                    answer = {"ok": False}
                if answer["ok"]:
                    if not committed.done():
                        committed.set_result(time.perf_counter())
                    return
                await asyncio.sleep(FAILOVER_RETRY_PAUSE_S)
        finally:
            await client.close()

    tasks = [asyncio.create_task(writer(member)) for member in survivors]
    try:
        return float(await asyncio.wait_for(committed, FAILOVER_TIMEOUT_S))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _caught_up(cluster: Cluster, member: int) -> None:
    """Waits until `member` answers a linearizable read, which it can only do once it has
    applied the log up to a barrier committed after it restarted."""
    deadline_s = time.monotonic() + LEADER_TIMEOUT_S
    while time.monotonic() < deadline_s:
        with contextlib.suppress(MemberUnreachable):
            answer = await cluster.clients[member].call({"op": "get", "key": "failover/0"})
            if answer.get("ok"):
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"member {member} did not catch up in {LEADER_TIMEOUT_S} s")


async def _failover(cluster: Cluster, trials: int) -> list[float]:
    durations_s: list[float] = []
    for trial in range(trials):
        leader = await cluster.leader()
        survivors = [member for member in cluster.alive() if member != leader]
        process = cluster.processes[leader].process
        assert process is not None
        killed_s = time.perf_counter()
        process.kill()
        committed_s = await _first_commit(cluster, survivors, trial)
        durations_s.append(committed_s - killed_s)
        print(f"failover {trial + 1}/{trials}: {durations_s[-1]:.3f} s", flush=True)
        cluster.processes[leader].kill()
        await cluster.clients[leader].close()
        cluster.processes[leader].start()
        cluster.processes[leader].wait_ready(READY_TIMEOUT_S)
        await _caught_up(cluster, leader)
    return durations_s


# Report.


def _table(
    results: dict[str, dict[int, list[dict[str, Any]]]], concurrencies: Sequence[int]
) -> list[str]:
    lines = [
        "| in flight | raw commits/s | raw p50 | raw p99 | raftstore commits/s "
        "| raftstore p50 | raftstore p99 | commits/s raftstore/raw | p50 raftstore/raw |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for concurrency in concurrencies:
        raw = results["raw"][concurrency]
        store = results["raftstore"][concurrency]
        raw_rate = _median(raw, "commits_per_s")
        store_rate = _median(store, "commits_per_s")
        lines.append(
            f"| {concurrency:,} | {raw_rate:,.0f} | "
            f"{_milliseconds(_median(raw, 'latency_p50_ms'))} | "
            f"{_milliseconds(_median(raw, 'latency_p99_ms'))} | {store_rate:,.0f} | "
            f"{_milliseconds(_median(store, 'latency_p50_ms'))} | "
            f"{_milliseconds(_median(store, 'latency_p99_ms'))} | "
            f"{_ratio_text(store_rate, raw_rate)} | "
            f"{_ratio_text(_median(store, 'latency_p50_ms'), _median(raw, 'latency_p50_ms'))} |"
        )
    return lines


def _ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def _ratio_text(numerator: float, denominator: float) -> str:
    ratio = _ratio(numerator, denominator)
    return "-" if math.isnan(ratio) else f"{ratio:.2f}x"


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    """Starts both clusters in a temporary directory, measures, and stops every member however
    the run ends: the measuring loop stops them too, but if that loop is cut short (SIGTERM can
    strike anywhere in it), this stops what it left, paused members included."""
    with tempfile.TemporaryDirectory(prefix="xr-bench-raftstore-") as directory:
        root = Path(directory)
        raw_options = [] if arguments.raw_journal else ["--no-journal"]
        clusters = {
            "raw": Cluster("raw", RAW_MODULE, root, raw_options),
            "raftstore": Cluster("raftstore", RAFTSTORE_MODULE, root),
        }
        try:
            return asyncio.run(_run(arguments, clusters))
        finally:
            with shielded():
                for cluster in clusters.values():
                    cluster.halt()


async def _run(arguments: argparse.Namespace, clusters: dict[str, Cluster]) -> dict[str, Any]:
    command = _command_bytes()
    try:
        for cluster in clusters.values():
            cluster.start()
        systems: dict[str, tuple[Cluster, dict[str, Any]]] = {
            "raw": (clusters["raw"], {"op": "load", "command": command}),
            "raftstore": (clusters["raftstore"], {"op": "load", "value_size": VALUE_BYTES}),
        }
        print(
            f"command: {len(command)} bytes (KvPut, {VALUE_BYTES}-byte value); "
            f"{arguments.rounds} round(s) of {arguments.duration_s} s per point",
            flush=True,
        )
        # Warm-up: connections, caches and the first elections, not measured.
        await _measure(
            systems,
            concurrencies=(64,),
            rounds=1,
            duration_s=min(1.0, arguments.duration_s),
            pause_other=arguments.pause_other,
            warmup=True,
        )
        results = await _measure(
            systems,
            concurrencies=arguments.concurrencies,
            rounds=arguments.rounds,
            duration_s=arguments.duration_s,
            pause_other=arguments.pause_other,
        )
        async with _alone(clusters["raftstore"], [clusters["raw"]], pause=arguments.pause_other):
            failovers_s = await _failover(clusters["raftstore"], arguments.failover_trials)
    finally:
        for cluster in clusters.values():
            await cluster.stop()
    reference_point = 64 if 64 in arguments.concurrencies else arguments.concurrencies[-1]
    value = _median(results["raftstore"][reference_point], "commits_per_s")
    reference = _median(results["raw"][reference_point], "commits_per_s")
    first = arguments.concurrencies[0]
    p50_ratio = _ratio(
        _median(results["raftstore"][first], "latency_p50_ms"),
        _median(results["raw"][first], "latency_p50_ms"),
    )
    for line in _table(results, arguments.concurrencies):
        print(line)
    print(
        f"raftstore / raw: commits/s at {reference_point:,} in flight (the reference point) "
        f"{_ratio_text(value, reference)}; p50 at {first:,} in flight {_ratio_text(p50_ratio, 1)}"
    )
    print(
        f"failover (kill -9 leader, first write committed on a survivor): "
        f"median {statistics.median(failovers_s):.3f} s, max {max(failovers_s):.3f} s "
        f"(n={len(failovers_s)})"
    )
    return {
        "bench": "raftstore",
        "value": round(value),
        "unit": "commits/s",
        "concurrency": reference_point,
        "reference": round(reference),
        "ratio": _rounded(_ratio(value, reference)),
        # At the first of --concurrencies (1 by default), as the key says for the default.
        "p50_ratio_at_1": _rounded(p50_ratio),
        "failover_median_s": round(statistics.median(failovers_s), 3),
        "failover_max_s": round(max(failovers_s), 3),
        "failover_trials": len(failovers_s),
        "rounds": arguments.rounds,
        "duration_s": arguments.duration_s,
        "command_bytes": len(command),
        "raw_journal": arguments.raw_journal,
    }


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with --quick's values for the options not given (usage error, exit 2,
    for a bad value)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round of 1.5 s, 3 failovers (the options below, where given, still count)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="3 (--quick: 1)")
    parser.add_argument("--duration-s", type=float, default=None, help="2.5 (--quick: 1.5)")
    parser.add_argument("--failover-trials", type=int, default=None, help="5 (--quick: 3)")
    parser.add_argument(
        "--concurrencies",
        type=positive_integers,
        default=CONCURRENCIES,
        help="comma-separated commands in flight (default 1,16,64,1000)",
    )
    parser.add_argument(
        "--raw-journal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give raw pysyncobj a journal file like raftstore's (default: on)",
    )
    parser.add_argument(
        "--pause-other",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="SIGSTOP the cluster not being measured (default: on)",
    )
    arguments = parser.parse_args(argv)
    # Explicit values win over --quick's.
    for name, (default, quick) in DEFAULTS.items():
        if getattr(arguments, name) is None:
            setattr(arguments, name, quick if arguments.quick else default)
    if (
        arguments.failover_trials < 1
        or arguments.rounds < 1
        or not 0 < arguments.duration_s < math.inf
        or any(concurrency < 1 for concurrency in arguments.concurrencies)
    ):
        parser.error(
            "--failover-trials, --rounds and each of --concurrencies must be at least 1, "
            "--duration-s positive and finite"
        )
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    return run_main(lambda: _main(arguments))


def _main(arguments: argparse.Namespace) -> int:
    print(json.dumps(run(arguments)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
