"""What a journal sync costs the node's process: `os.fdatasync` in line against io_uring.

Each sync follows a 300-byte write through a memory map, as pysyncobj's journal is written, and
they run one at a time. In line, the sync is a blocking `os.fdatasync`. Through io_uring, the
process submits `IORING_OP_FSYNC` (`IORING_FSYNC_DATASYNC`) and learns of its end from an eventfd
that a uvloop event loop watches: the loop is free while the disk works, as it is with
`raft.background_sync`'s helper process, but without a second process. The figures are the
process's CPU time per sync (user and system, io_uring's kernel workers included, since they
are threads of the process) and the wall time per sync, the two ways alternating round by round
in the same run; the ratio is io_uring's over in line's. docs/durability.md has the conclusion.

io_uring goes through the `liburing` package from PyPI, which xr does not depend on: without
it, this measures the in-line syncs only and says so.

Run: `python bench/sync_cost.py [--syncs 2000] [--rounds 2] [--dir DIR]` (the file is made in
DIR, default the working directory: put it on the disk whose syncs you want to time). The last
line is one JSON object; without io_uring its `note` says why there is no ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import mmap
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RECORD = b"x" * 300
FILE_BYTES = 8 << 20
NOT_MEASURED = (
    "io_uring not measured, so no ratio: the liburing and uvloop packages are not both "
    "installed (pip install liburing uvloop)"
)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _in_line(descriptor: int, journal: mmap.mmap, syncs: int) -> None:
    for number in range(syncs):
        offset = number * len(RECORD) % (FILE_BYTES - len(RECORD))
        journal[offset : offset + len(RECORD)] = RECORD
        os.fdatasync(descriptor)


async def _through_io_uring(liburing: Any, descriptor: int, journal: mmap.mmap, syncs: int) -> None:
    ring = liburing.Ring()
    liburing.io_uring_queue_init(8, ring)
    event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    completion = liburing.Cqe()
    finished = 0

    def submit() -> None:
        offset = finished * len(RECORD) % (FILE_BYTES - len(RECORD))
        journal[offset : offset + len(RECORD)] = RECORD
        entry = liburing.io_uring_get_sqe(ring)
        liburing.io_uring_prep_fsync(entry, descriptor, liburing.IORING_FSYNC_DATASYNC)
        liburing.io_uring_submit(ring)

    def on_event() -> None:
        nonlocal finished
        try:
            os.eventfd_read(event)
        except BlockingIOError:
            return
        while not done.done():
            try:
                liburing.io_uring_peek_cqe(ring, completion)
            except BlockingIOError:
                return
            result = completion[0].res
            liburing.io_uring_cqe_seen(ring, completion[0])
            if result < 0:
                done.set_exception(OSError(-result, os.strerror(-result)))
                return
            finished += 1
            if finished == syncs:
                done.set_result(None)
                return
            submit()

    try:
        liburing.io_uring_register_eventfd(ring, event)
        loop.add_reader(event, on_event)
        submit()
        await done
    finally:
        loop.remove_reader(event)
        os.close(event)
        liburing.io_uring_queue_exit(ring)


def _timed(run: Callable[[], None], syncs: int) -> tuple[float, float]:
    """CPU and wall microseconds per sync."""
    cpu_s, wall_s = _cpu_s(), time.perf_counter()
    run()
    return (_cpu_s() - cpu_s) / syncs * 1e6, (time.perf_counter() - wall_s) / syncs * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--syncs", type=int, default=2_000, help="syncs per round (2000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating (2)")
    parser.add_argument("--dir", type=Path, default=Path("."), help="where the file is made (.)")
    arguments = parser.parse_args(argv)
    if arguments.syncs < 1 or arguments.rounds < 1:
        parser.error("--syncs and --rounds must be at least 1")
    if not arguments.dir.is_dir() or not os.access(arguments.dir, os.W_OK):
        parser.error(f"--dir {arguments.dir} is not a directory this process can write in")
    liburing: Any = None
    uvloop: Any = None
    try:
        liburing = importlib.import_module("liburing")
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        liburing = None
    with tempfile.NamedTemporaryFile(dir=arguments.dir, prefix=".xr-sync-cost-") as file:
        descriptor = file.fileno()
        os.ftruncate(descriptor, FILE_BYTES)
        journal = mmap.mmap(descriptor, FILE_BYTES)
        rows: dict[str, list[tuple[float, float]]] = {"in line": [], "io_uring": []}
        for number in range(arguments.rounds):
            rows["in line"].append(
                _timed(lambda: _in_line(descriptor, journal, arguments.syncs), arguments.syncs)
            )
            if liburing is not None:
                rows["io_uring"].append(
                    _timed(
                        lambda: uvloop.run(
                            _through_io_uring(liburing, descriptor, journal, arguments.syncs)
                        ),
                        arguments.syncs,
                    )
                )
            print(f"round {number + 1}/{arguments.rounds} done", file=sys.stderr, flush=True)
        journal.close()
    print(f"{arguments.syncs} syncs a round, {arguments.rounds} round(s), file in {arguments.dir}")
    print("| way | CPU per sync | wall per sync |")
    print("| --- | ---: | ---: |")
    medians: dict[str, tuple[float, float]] = {}
    for way, figures in rows.items():
        if not figures:
            print(f"| {way} | not measured (`pip install liburing uvloop`) | |")
            continue
        medians[way] = (
            statistics.median(cpu for cpu, _ in figures),
            statistics.median(wall for _, wall in figures),
        )
        print(f"| {way} | {medians[way][0]:.1f} us | {medians[way][1]:.1f} us |")
    document: dict[str, Any] = {
        "bench": "sync_cost",
        "syncs": arguments.syncs,
        "rounds": arguments.rounds,
        **{
            f"{way.replace(' ', '_')}_{kind}_us_per_sync": round(figures[position], 1)
            for way, figures in medians.items()
            for position, kind in enumerate(("cpu", "wall"))
        },
    }
    if len(medians) == 2:
        cpu_ratio = medians["io_uring"][0] / medians["in line"][0]
        wall_ratio = medians["io_uring"][1] / medians["in line"][1]
        print(f"io_uring / in line: CPU {cpu_ratio:.2f}x, wall {wall_ratio:.2f}x")
        document["cpu_ratio_io_uring_in_line"] = round(cpu_ratio, 3)
        document["wall_ratio_io_uring_in_line"] = round(wall_ratio, 3)
    else:
        document["note"] = NOT_MEASURED
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
