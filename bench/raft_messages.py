"""Raft messages and members' CPU per put: the working tree against a git revision, in one run.

Two 3-member clusters on loopback run side by side for the whole benchmark: this checkout's
nodes, and the nodes of `--against REV` (its tree exported with `git archive` to a temporary
folder). Each node counts every message it sends to another member (a `sitecustomize` hook on
pysyncobj's connection, loaded through PYTHONPATH only by the processes this benchmark starts).
The load is bench/api.py's put (closed loop, requests round robin over the members); for each
concurrency the two sides alternate round by round, and a side's figures are its messages over
its puts, summed over the rounds, and the median of its members' CPU time per put (user and
system, read from /proc over each timed window, bench/_load.py). This machine's speed moves by
up to 2x within the hour: compare the two sides of one run, not runs.

Each side's disk syncs per put are counted too (its members' `xr_raft_journal_syncs_total`, read
at each window's start and end; `fsync` mode only).

`--sync-stand-in KIND:SECONDS` (with `--durability fsync`) changes this tree's nodes only, to
tell what fsync mode's cost is made of, against the revision's real syncs in the same run:
`none` replaces the journal's `fdatasync` by a call that does nothing (everything else of fsync
mode kept: the outbox, its ordering, the syncs counted), `sleep` by a blocking sleep of SECONDS
(the wait without the disk), and `hold` replaces the sync by a non-blocking hold: the messages
that would wait for it are released SECONDS later by a timer on the node's event loop, which
goes on meanwhile (the most a sync moved off the loop could gain; the leader counts itself
toward commits at once, and no sync is counted). All three lose durability: measurement only,
in the benchmark's own nodes.

`--disk-latency SECONDS` (with `--durability fsync`) stands for a slower disk on both sides:
every journal sync sleeps SECONDS after its `fdatasync`, in the process that syncs (the node, or
its sync helper where syncs run off the loop, `raft.background_sync`).

Run: `python bench/raft_messages.py [--against REV] [--durability fsync] [--concurrency 1,16,64]
[--duration 4] [--warmup 1] [--rounds 3] [--sync-stand-in sleep:0.0005] [--disk-latency 0.002]
[--json PATH]` (about 1.5 minutes with the defaults). The last line is one JSON object.

The revision's nodes run its own packages (`node.localcluster` starts them with `python -P`):
before 472a068 they ran this checkout's, so earlier comparisons compared the tree with itself.
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
import asyncio  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

from bench import api  # noqa: E402
from bench._arguments import check_output_path, positive_integers, write_output  # noqa: E402
from bench._load import CellResult, run_cell  # noqa: E402
from bench._revision import ROOT  # noqa: E402
from bench._signals import run_main  # noqa: E402
from bench.durability import MODES, XrDurabilitySystem  # noqa: E402

__all__ = ["main"]

PROGRAM = "raft_messages"
COUNTS_DIRECTORY = "XR_BENCH_MESSAGE_COUNTS"
# Loaded by the nodes this benchmark starts: counts what each sends, by message type, and writes
# the counts (with how many times it wrote them) to COUNTS_DIRECTORY/<pid>.json on SIGUSR2.
_HOOK = """
import collections, json, os, signal

directory = os.environ.get("XR_BENCH_MESSAGE_COUNTS")
if directory:
    from pysyncobj import tcp_connection

    counts = collections.Counter()
    dumps = [0]
    original = tcp_connection.TcpConnection.send

    def send(connection, message):
        kind = message.get("type") if isinstance(message, dict) else None
        counts[kind if isinstance(kind, str) else type(message).__name__] += 1
        return original(connection, message)

    def dump(*_):
        dumps[0] += 1
        path = os.path.join(directory, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as file:
            json.dump({"dumps": dumps[0], "counts": counts}, file)
        os.replace(path + ".tmp", path)

    tcp_connection.TcpConnection.send = send
    signal.signal(signal.SIGUSR2, dump)

disk_latency = os.environ.get("XR_BENCH_DISK_LATENCY")
if disk_latency:
    # A slower disk, on both sides: each journal sync sleeps this long after its fdatasync, in
    # the process that syncs (the node, or its sync helper off the loop where there is one).
    import time as _time
    from raftstore import replica as _replica

    _extra_s = float(disk_latency)

    def _slower_sync(descriptor, _sync=os.fdatasync):
        _sync(descriptor)
        _time.sleep(_extra_s)

    _replica.journal_file_sync = _slower_sync
    try:
        from raftstore import background_sync as _background_sync
    except ImportError:  # a revision from before syncs off the loop
        pass
    else:
        _synced = "os.fdatasync(descriptor)"
        assert _synced in _background_sync._HELPER
        _background_sync._HELPER = _background_sync._HELPER.replace(
            _synced, f"{_synced}; __import__('time').sleep({_extra_s!r})"
        )

stand_in = os.environ.get("XR_BENCH_SYNC_STAND_IN")
tree = os.environ.get("XR_BENCH_TREE")
if stand_in and tree:
    import asyncio, collections as _collections, pathlib, time
    from raftstore import replica

    # Only the nodes of the working tree: the revision's run from its exported copy.
    if pathlib.Path(replica.__file__).resolve().is_relative_to(pathlib.Path(tree)):
        kind, _, seconds_text = stand_in.partition(":")
        seconds = float(seconds_text)
        # The stand-ins replace a sync on the loop: none runs off it.
        replica.Replica.sync_off_the_loop = lambda *args, **kwargs: None
        if kind == "none":
            replica.journal_file_sync = lambda descriptor: None
        elif kind == "sleep":
            replica.journal_file_sync = lambda descriptor: time.sleep(seconds)
        else:
            def flush(outbox):
                # Outbox.flush, with the sync replaced by a batch released `seconds` later.
                early, rest = outbox.take()
                for node, message in early:
                    outbox._send(node, message)
                batches = outbox.__dict__.setdefault("xr_batches", _collections.deque())
                if outbox.journal.dirty:
                    outbox.journal.claim_synced()
                    batches.append(list(rest))
                    asyncio.get_running_loop().call_later(seconds, release, outbox)
                elif batches:
                    batches[-1].extend(rest)
                else:
                    for node, message in rest:
                        outbox._send(node, message)

            def release(outbox):
                for node, message in outbox.xr_batches.popleft():
                    outbox._send(node, message)

            replica.Outbox.flush = flush
"""
STAND_IN_KINDS = ("sleep", "hold")
STAND_IN_SECONDS_MAX = 1.0
DISK_LATENCY_MAX_S = 0.1
COUNTS_WAIT_S = 5.0
LEASE_TTL_S = 60


def _export(revision: str, folder: Path) -> None:
    """The tree of `revision` into `folder`; a revision git cannot read exits with a message."""
    try:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", revision], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        stderr = getattr(error, "stderr", b"") or b""
        detail = stderr.decode(errors="replace").strip() or str(error)
        raise SystemExit(f"{PROGRAM}: cannot read revision {revision!r}: {detail}") from None


def _counts(directory: Path, pids: Sequence[int]) -> collections.Counter[str]:
    """Messages sent so far by the processes `pids`, by type, summed."""
    total: collections.Counter[str] = collections.Counter()
    for pid in pids:
        path = directory / f"{pid}.json"
        before = json.loads(path.read_text())["dumps"] if path.exists() else 0
        os.kill(pid, signal.SIGUSR2)
        deadline_s = time.monotonic() + COUNTS_WAIT_S
        while True:
            document: dict[str, Any] = (
                json.loads(path.read_text()) if path.exists() else {"dumps": 0}
            )
            if document["dumps"] > before:
                counts: dict[str, int] = document["counts"]
                total.update(counts)
                break
            if time.monotonic() > deadline_s:
                raise RuntimeError(f"node {pid} did not report its message counts")
            time.sleep(0.01)
    return total


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="xr-bench-raft-messages-") as directory:
        root = Path(directory)
        (root / "hook").mkdir()
        (root / "hook" / "sitecustomize.py").write_text(_HOOK)
        (root / "counts").mkdir()
        (root / "revision").mkdir()
        _export(arguments.against, root / "revision")
        os.environ[COUNTS_DIRECTORY] = str(root / "counts")
        if arguments.sync_stand_in is not None:
            os.environ["XR_BENCH_SYNC_STAND_IN"] = arguments.sync_stand_in
            os.environ["XR_BENCH_TREE"] = str(ROOT)
        if arguments.disk_latency is not None:
            os.environ["XR_BENCH_DISK_LATENCY"] = repr(arguments.disk_latency)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(root / "hook"), os.environ.get("PYTHONPATH")])
        )
        sides = {"this tree": None, arguments.against: root / "revision"}
        systems: dict[str, XrDurabilitySystem] = {}
        stoppers: list[Callable[[], None]] = []
        try:
            for label, code_root in sides.items():
                system = XrDurabilitySystem(
                    root,
                    durability=arguments.durability,
                    name=f"side-{len(systems)}",
                    code_root=code_root,
                )
                stoppers.append(system.stop)
                system.start()
                systems[label] = system
            stand_in, latency = arguments.sync_stand_in, arguments.disk_latency
            print(
                f"durability {arguments.durability}"
                f"{f' (this tree: sync stand-in {stand_in})' if stand_in else ''}"
                f"{f' (both: disk latency +{latency} s)' if latency else ''}; "
                f"{arguments.rounds} round(s) of "
                f"{arguments.warmup} s warm-up + {arguments.duration} s per concurrency and side; "
                f"{api.SPREAD}",
                flush=True,
            )
            with api._event_loop_runner() as runner:
                cells = [
                    _cell(runner, systems, root / "counts", concurrency, arguments)
                    for concurrency in arguments.concurrency
                ]
        finally:
            api._stop_all(stoppers)
    return _report(cells, arguments)


def _put(
    runner: asyncio.Runner,
    system: XrDurabilitySystem,
    concurrency: int,
    duration_s: float,
    tag: str,
) -> CellResult:
    # No warm-up inside the cell: the messages counted around it are the window's (and the
    # drain's, at most `concurrency` puts more than the window counts).
    result: CellResult = runner.run(
        run_cell(
            system.operation("put", tag=tag, lease_ttl_s=LEASE_TTL_S),
            system.urls,
            concurrency=concurrency,
            warmup_s=0.0,
            duration_s=duration_s,
            request_timeout_s=api.REQUEST_TIMEOUT_S,
            error_code=system.error_code,
            cpu_pids=system.member_pids(),
            sync_count=system.sync_count,
        )
    )
    return result


def _cell(
    runner: asyncio.Runner,
    systems: dict[str, XrDurabilitySystem],
    counts_directory: Path,
    concurrency: int,
    arguments: argparse.Namespace,
) -> dict[str, Any]:
    puts = {label: 0 for label in systems}
    sent = {label: collections.Counter[str]() for label in systems}
    cpu: dict[str, list[float]] = {label: [] for label in systems}
    syncs: dict[str, list[float]] = {label: [] for label in systems}
    for round_number in range(arguments.rounds):
        for label, system in systems.items():
            pids = system.node_pids()
            if arguments.warmup > 0:
                _put(
                    runner,
                    system,
                    concurrency,
                    arguments.warmup,
                    f"c{concurrency}-r{round_number}w",
                )
            before = _counts(counts_directory, pids)
            result = _put(
                runner, system, concurrency, arguments.duration, f"c{concurrency}-r{round_number}"
            )
            after = _counts(counts_directory, pids)
            after.subtract(before)
            system.check_alive()
            puts[label] += result.operations
            sent[label].update(after)
            if result.members_cpu_us_per_op is not None:
                cpu[label].append(result.members_cpu_us_per_op)
            if result.syncs_per_op is not None:
                syncs[label].append(result.syncs_per_op)
            per_put = sum(after.values()) / result.operations if result.operations else math.nan
            print(
                f"c={concurrency:<3} round {round_number + 1}/{arguments.rounds} {label:<12} "
                f"{result.ops_per_s:>9,.0f} puts/s, {per_put:.2f} messages per put, failed "
                f"{api._failures_text(result.failures)}",
                flush=True,
            )
    return {
        "concurrency": concurrency,
        "sides": {
            label: {
                "puts": puts[label],
                "messages_per_put": sum(sent[label].values()) / puts[label]
                if puts[label]
                else None,
                "by_type": {
                    kind: count / puts[label]
                    for kind, count in sorted(sent[label].items())
                    if count > 0 and puts[label]
                },
                "members_cpu_us_per_put": statistics.median(cpu[label]) if cpu[label] else None,
                "syncs_per_put": statistics.median(syncs[label]) if syncs[label] else None,
            }
            for label in systems
        },
    }


def _ratio(this: float | None, reference: float | None) -> float | None:
    return this / reference if this is not None and reference else None


def _report(cells: list[dict[str, Any]], arguments: argparse.Namespace) -> dict[str, Any]:
    reference = arguments.against
    print(f"\nput, durability {arguments.durability}, {arguments.rounds} round(s) per side\n")
    print(
        "| concurrency | side | puts counted | messages per put | members' CPU per put "
        "| syncs per put |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    verdicts = []
    for cell in cells:
        for label, side in cell["sides"].items():
            messages = side["messages_per_put"]
            cpu = side["members_cpu_us_per_put"]
            syncs = side["syncs_per_put"]
            print(
                f"| {cell['concurrency']} | {label} | {side['puts']:,} | "
                f"{'-' if messages is None else f'{messages:.2f}'} | "
                f"{'-' if cpu is None else f'{cpu:,.0f} us'} | "
                f"{'-' if syncs is None else f'{syncs:.2f}'} |"
            )
        this, other = cell["sides"]["this tree"], cell["sides"][reference]
        cell["ratio_messages"] = _ratio(this["messages_per_put"], other["messages_per_put"])
        cell["ratio_members_cpu"] = _ratio(
            this["members_cpu_us_per_put"], other["members_cpu_us_per_put"]
        )
        verdicts.append(
            f"c={cell['concurrency']}: this tree / {reference}: messages per put "
            f"{api._ratio_text(cell['ratio_messages'] or math.nan)}, members' CPU per put "
            f"{api._ratio_text(cell['ratio_members_cpu'] or math.nan)}"
        )
    print()
    for verdict in verdicts:
        print(verdict)
    return {
        "benchmark": PROGRAM,
        "against": reference,
        "durability": arguments.durability,
        "sync_stand_in": arguments.sync_stand_in,
        "disk_latency_s": arguments.disk_latency,
        "rounds": arguments.rounds,
        "cells": cells,
    }


def _positive(kind: type[float] | type[int]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"must be above 0 and finite: {text}")
        return value

    return parse


def _stand_in(text: str) -> str:
    if text == "none":
        return "none:0"
    kind, _, seconds_text = text.partition(":")
    try:
        seconds = float(seconds_text)
    except ValueError:
        seconds = math.nan
    if kind not in STAND_IN_KINDS or not 0 < seconds <= STAND_IN_SECONDS_MAX:
        raise argparse.ArgumentTypeError(
            f"give none, sleep:SECONDS or hold:SECONDS, with 0 < SECONDS <= "
            f"{STAND_IN_SECONDS_MAX:g}: "
            f"{text!r}"
        )
    return f"{kind}:{seconds!r}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="the git revision to compare (HEAD)")
    parser.add_argument("--durability", choices=MODES, default="fsync", help="raft.durability")
    parser.add_argument("--concurrency", type=positive_integers, default=(1, 16, 64))
    parser.add_argument("--duration", type=_positive(float), default=4.0, help="seconds (4)")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of puts before each counted cell (1)"
    )
    parser.add_argument("--rounds", type=_positive(int), default=3, help="rounds per side (3)")
    parser.add_argument(
        "--sync-stand-in",
        type=_stand_in,
        metavar="KIND:SECONDS",
        help="this tree's nodes replace the journal sync: none, sleep:S (blocking) or hold:S",
    )
    parser.add_argument(
        "--disk-latency",
        type=_positive(float),
        metavar="SECONDS",
        help="both sides: every journal sync takes SECONDS longer (a slower disk)",
    )
    parser.add_argument("--json", type=Path, help="write every figure to this file as JSON")
    arguments = parser.parse_args(argv)
    if arguments.disk_latency is not None and not arguments.disk_latency <= DISK_LATENCY_MAX_S:
        parser.error(f"--disk-latency must be at most {DISK_LATENCY_MAX_S:g} s")
    if arguments.disk_latency is not None and (
        arguments.durability != "fsync" or arguments.sync_stand_in is not None
    ):
        parser.error("--disk-latency needs --durability fsync and no --sync-stand-in")
    if not 0 <= arguments.warmup < math.inf:
        parser.error("--warmup must be 0 or more, and finite")
    if arguments.sync_stand_in is not None and arguments.durability != "fsync":
        parser.error("--sync-stand-in needs --durability fsync (write mode has no sync)")
    check_output_path(parser, "--json", arguments.json)
    return run_main(lambda: _main(arguments))


def _main(arguments: argparse.Namespace) -> int:
    document = run(arguments)
    written = arguments.json is None or write_output(
        arguments.json, json.dumps(document, indent=2), program="raft_messages"
    )
    print(json.dumps(document))
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
