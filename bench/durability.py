"""What fsync costs: xr put with `raft.durability = "fsync"` against the default mode and etcd 3.4.

Four clusters of 3 members on loopback run for the whole benchmark: xr with durability "write"
(the default: the journal reaches the page cache before a write is acknowledged), xr with
"fsync" (it reaches the disk), etcd 3.4 with fsync (etcd's default) and etcd 3.4 with
`--unsafe-no-fsync`, both started by `anchors/etcd-cluster`. The last is the like-for-like
reference for xr's `write` mode, so each run also shows what the sync costs each system (fsync /
no fsync) and how the two compare without it. The machinery is bench/api.py's: the same
closed-loop load generator, the same put of a 64-byte value with xr's idempotency headers,
requests spread round robin over the members, and for each concurrency the systems interleaved
round by round; figures are medians over rounds. Each row also gives the CPU time the system's 3
members used together per put, and the load generator's, during the timed windows
(bench/_load.py), and the disk syncs the 3 members made together per put in those windows, read
from their `/metrics` at each window's start and end (xr's `xr_raft_journal_syncs_total`,
counted in `fsync` mode only, and etcd's WAL fsyncs,
`etcd_disk_wal_fsync_duration_seconds_count`). The target (docs/durability.md): xr with fsync at
least 1.0x etcd's put throughput.

Run: `python bench/durability.py [--duration 3] [--warmup 1] [--rounds 3]
[--concurrency 1,16,64] [--json PATH]` (about 3 minutes with the defaults). The last line is one
JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# As in bench/api.py: run as a script, this folder would shadow the `raftstore` package.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

from bench import api  # noqa: E402
from bench._arguments import check_output_path, positive_integers, write_output  # noqa: E402
from bench._load import CellResult  # noqa: E402
from bench._signals import run_main  # noqa: E402
from node.localcluster import LocalCluster  # noqa: E402

__all__ = ["main", "run"]

MODES = ("write", "fsync")
RATIO_MIN = 1.0
ETCD_NO_FSYNC = "etcd-nofsync"


class XrDurabilitySystem(api.XrSystem):
    """bench/api.py's xr system, with the cluster's `raft.durability` set; `code_root` runs
    another checkout's nodes (bench/raft_messages.py), under `name`."""

    def __init__(
        self,
        root: Path,
        *,
        durability: str,
        name: str | None = None,
        code_root: Path | None = None,
    ) -> None:
        super().__init__(root)
        self.name = name or f"xr-{durability}"
        self.cluster = LocalCluster(
            root / self.name,
            size=api.MEMBERS,
            settings={"raft.durability": durability},
            code_root=code_root,
        )
        self.urls = self.cluster.urls


def _microseconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f} us"


def _syncs(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _row(concurrency: int, name: str, summary: api.Summary, versus_etcd: float) -> str:
    return (
        f"| {concurrency} | {name} | {summary.ops_per_s:,.0f} | "
        f"{api._milliseconds(summary.latency_p50_ms)} | "
        f"{api._milliseconds(summary.latency_p99_ms)} | "
        f"{_microseconds(summary.members_cpu_us_per_op)} | "
        f"{_microseconds(summary.driver_cpu_us_per_op)} | {_syncs(summary.syncs_per_op)} | "
        f"{summary.failed} | {api._ratio_text(versus_etcd)} |"
    )


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    arguments.ops = ["put"]
    with tempfile.TemporaryDirectory(prefix="xr-bench-durability-") as directory:
        root = Path(directory)
        stoppers: list[Callable[[], None]] = []
        try:
            xr_systems = []
            # Each cluster starts before the next picks its ports, so no two pick the same.
            for mode in MODES:
                system = XrDurabilitySystem(root, durability=mode)
                stoppers.append(system.stop)
                system.start()
                xr_systems.append(system)
            base_ports = api._etcd_base_ports(2)
            etcd = api.EtcdSystem(root, name="etcd", fsync=True, base_port=base_ports[0])
            stoppers.append(etcd.stop)
            etcd.start()
            etcd_nofsync = api.EtcdSystem(
                root, name=ETCD_NO_FSYNC, fsync=False, base_port=base_ports[1]
            )
            stoppers.append(etcd_nofsync.stop)
            etcd_nofsync.start()
            systems: list[api.System] = [*xr_systems, etcd, etcd_nofsync]
            print(
                f"{etcd.version()}; xr leaders: {[system.leader() for system in xr_systems]}\n"
                f"{arguments.rounds} round(s) of {arguments.warmup} s warm-up + "
                f"{arguments.duration} s per concurrency and system; {api.SPREAD}",
                flush=True,
            )
            with api._event_loop_runner() as runner:
                results = runner.run(api._measure(systems, arguments, count_syncs=True))
        finally:
            api._stop_all(stoppers)
    return _report(results, arguments)


def _report(
    results: dict[tuple[str, int], dict[str, list[CellResult]]], arguments: argparse.Namespace
) -> dict[str, Any]:
    print(f"\nput, median of {arguments.rounds} interleaved round(s)\n")
    print(
        "| concurrency | system | ops/s | p50 | p99 | CPU per put, 3 members | CPU per put, "
        "load generator | syncs per put, 3 members | failed | vs etcd |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    cells: list[dict[str, Any]] = []
    verdicts: list[str] = []
    for (_, concurrency), per_system in results.items():
        summaries = {name: api.Summary.of(rounds) for name, rounds in per_system.items()}
        fsync, write, etcd = summaries["xr-fsync"], summaries["xr-write"], summaries["etcd"]
        etcd_nofsync = summaries[ETCD_NO_FSYNC]
        versus_etcd = api._ratio(fsync.ops_per_s, etcd.ops_per_s)
        versus_write = api._ratio(fsync.ops_per_s, write.ops_per_s)
        etcd_versus_nofsync = api._ratio(etcd.ops_per_s, etcd_nofsync.ops_per_s)
        write_versus_nofsync = api._ratio(write.ops_per_s, etcd_nofsync.ops_per_s)
        for name, summary in summaries.items():
            print(_row(concurrency, name, summary, api._ratio(summary.ops_per_s, etcd.ops_per_s)))
        cpu_versus_etcd = api._ratio(fsync.members_cpu_us_per_op, etcd.members_cpu_us_per_op)
        syncs_versus_etcd = api._ratio(fsync.syncs_per_op, etcd.syncs_per_op)
        verdicts.append(
            f"c={concurrency}: xr-fsync / etcd {api._ratio_text(versus_etcd)} (target >= "
            f"{RATIO_MIN:g}x: {'met' if versus_etcd >= RATIO_MIN else 'NOT met'}); "
            f"members' CPU per put "
            f"xr-fsync / etcd {api._ratio_text(cpu_versus_etcd)}; syncs per put "
            f"xr-fsync / etcd {api._ratio_text(syncs_versus_etcd)}; what the sync costs: "
            f"xr-fsync / xr-write {api._ratio_text(versus_write)}, etcd / etcd-nofsync "
            f"{api._ratio_text(etcd_versus_nofsync)}; without it: xr-write / etcd-nofsync "
            f"{api._ratio_text(write_versus_nofsync)}"
        )
        cells.append(
            {
                "concurrency": concurrency,
                **{
                    name: {
                        "ops_per_s": api._number(summary.ops_per_s),
                        "p50_ms": api._number(summary.latency_p50_ms),
                        "p99_ms": api._number(summary.latency_p99_ms),
                        "failed": summary.failed,
                        "members_cpu_us_per_op": api._number(summary.members_cpu_us_per_op),
                        "driver_cpu_us_per_op": api._number(summary.driver_cpu_us_per_op),
                        "syncs_per_op": api._number(summary.syncs_per_op),
                    }
                    for name, summary in summaries.items()
                },
                "ratio_fsync_vs_etcd": api._number(versus_etcd),
                "ratio_fsync_vs_write": api._number(versus_write),
                "ratio_members_cpu_fsync_vs_etcd": api._number(cpu_versus_etcd),
                "ratio_syncs_fsync_vs_etcd": api._number(syncs_versus_etcd),
                "ratio_etcd_vs_etcd_nofsync": api._number(etcd_versus_nofsync),
                "ratio_write_vs_etcd_nofsync": api._number(write_versus_nofsync),
                "target_met": bool(versus_etcd >= RATIO_MIN)
                if not math.isnan(versus_etcd)
                else None,
            }
        )
    print()
    for verdict in verdicts:
        print(verdict)
    return {"benchmark": "durability", "rounds": arguments.rounds, "cells": cells}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per cell (3)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each cell (1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument(
        "--concurrency",
        type=positive_integers,
        default=(1, 16, 64),
        metavar="C,C,...",
        help="workers per cell, comma-separated (1,16,64)",
    )
    parser.add_argument("--json", type=Path, help="write every figure to this file as JSON")
    arguments = parser.parse_args(argv)
    # Written so that NaN, which compares false with anything, is refused too.
    if not (0 < arguments.duration <= api.CELL_S_MAX and 0 <= arguments.warmup <= api.CELL_S_MAX):
        parser.error(
            f"--duration must be over 0 and --warmup 0 or more, at most {api.CELL_S_MAX:g} s"
        )
    if arguments.rounds < 1:
        parser.error("--rounds must be at least 1")
    check_output_path(parser, "--json", arguments.json)
    return run_main(lambda: _main(arguments))


def _main(arguments: argparse.Namespace) -> int:
    problem = api.etcd_script_problem()
    if problem is not None:
        print(f"durability: {problem} (XR_ETCD_CLUSTER names another)", file=sys.stderr)
        return 2
    try:
        document = run(arguments)
    except api.StartFailed as error:
        print(f"durability: {error}", file=sys.stderr)
        return 1
    written = True
    if arguments.json is not None:
        written = write_output(
            arguments.json, json.dumps(document, indent=2) + "\n", program="durability"
        )
        if written:
            print(f"wrote {arguments.json}")
    print(json.dumps(document))
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
