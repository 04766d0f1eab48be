"""The cost of pickling a put's Raft messages: xr's (`raftstore.pickling`) against pysyncobj's own.

The reference is pysyncobj 0.3.17's `pysyncobj.pickle` as shipped: protocol 2 and `pickle.loads`
(which runs any function a pickle names). xr's writes protocol 5 and reads through an unpickler
that refuses every global but the few pysyncobj's data holds. Each side pickles and unpickles the
messages one put takes, as pysyncobj builds them (an entry's command, a follower's forward of it
and the leader's answer, the leader's append_entries and the follower's reply), and unpickles the
command once more, as a member does when it applies the entry. The two sides alternate round by
round in one process; each round times `--puts` puts. It prints each side's median microseconds
per put and the median of the per-round ratios, xr's over pysyncobj's: below 1 is cheaper.

Run: `python bench/pickling.py [--puts 20000] [--rounds 5] [--json PATH]`. The last line is one
JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# As in bench/scheduler.py: the repository root comes first on the path, not this folder.
_BENCH_DIRECTORY = Path(__file__).resolve().parent
sys.path[:] = [str(_BENCH_DIRECTORY.parent)] + [
    entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH_DIRECTORY
]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import pysyncobj.pickle as pysyncobj_pickle  # noqa: E402

from bench._arguments import check_output_path, write_output  # noqa: E402

# pysyncobj's functions before xr replaces them (nothing in this process has yet).
_SHIPPED_DUMPS = pysyncobj_pickle.dumps
_SHIPPED_LOADS = pysyncobj_pickle.loads

from raftstore import pickling  # noqa: E402
from raftstore.replica import encode_group  # noqa: E402

Dumps = Callable[[Any], bytes]
Loads = Callable[[bytes], Any]

# A put's group: one xrcore envelope of about the size bench/api.py's 64-byte put makes.
_GROUP = encode_group([bytes(range(200)) + b"k" * 40])
_REGULAR_COMMAND = b"\x00"


def _one_put(dumps: Dumps, loads: Loads) -> None:
    """What pysyncobj pickles and unpickles for one forwarded put, with one follower."""
    command = _REGULAR_COMMAND + dumps((0, (_GROUP,)))
    # A follower forwards the command to the leader, which answers once it is applied.
    loads(dumps({"type": "apply_command", "command": command, "request_id": 41}))
    # The leader sends the entry; the follower answers with its next index.
    loads(
        dumps(
            {
                "type": "append_entries",
                "term": 3,
                "commit_index": 1_000,
                "entries": [(command, 1_001, 3)],
                "prevLogIdx": 1_000,
                "prevLogTerm": 3,
            }
        )
    )
    loads(dumps({"type": "next_node_idx", "next_node_idx": 1_002, "reset": False, "success": True}))
    answer = {"type": "apply_command_response", "request_id": 41, "log_idx": 1_001, "log_term": 3}
    loads(dumps(answer))
    # Each member unpickles the command when it applies the entry.
    loads(command[1:])


def _round(dumps: Dumps, loads: Loads, puts: int) -> float:
    """Microseconds per put."""
    started = time.perf_counter()
    for _ in range(puts):
        _one_put(dumps, loads)
    return (time.perf_counter() - started) / puts * 1e6


SIDES: dict[str, tuple[Dumps, Loads]] = {
    "xr": (pickling.dumps, pickling.loads),
    "pysyncobj": (_SHIPPED_DUMPS, _SHIPPED_LOADS),
}


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    for dumps, loads in SIDES.values():
        _round(dumps, loads, 200)  # warm up
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for number in range(arguments.rounds):
        for side, (dumps, loads) in SIDES.items():
            times[side].append(_round(dumps, loads, arguments.puts))
        print(
            f"round {number + 1}/{arguments.rounds}: xr {times['xr'][-1]:.2f} us, "
            f"pysyncobj {times['pysyncobj'][-1]:.2f} us per put",
            flush=True,
        )
    ratio = statistics.median(mine / theirs for mine, theirs in zip(*times.values(), strict=True))
    figures = {
        "benchmark": "pickling",
        "puts": arguments.puts,
        "rounds": arguments.rounds,
        "xr_us_per_put": statistics.median(times["xr"]),
        "pysyncobj_us_per_put": statistics.median(times["pysyncobj"]),
        "ratio": ratio,
    }
    print("\n| side | us per put |")
    print("| --- | ---: |")
    print(f"| xr (protocol 5, globals refused) | {figures['xr_us_per_put']:.2f} |")
    shipped = figures["pysyncobj_us_per_put"]
    print(f"| pysyncobj as shipped (protocol 2, pickle.loads) | {shipped:.2f} |")
    print(f"xr / pysyncobj: {ratio:.2f}x (median of the rounds' ratios)")
    print(json.dumps(figures))
    return figures


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if not 1 <= value <= 10_000_000:
        raise argparse.ArgumentTypeError("must be from 1 to 10,000,000")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--puts", type=_count, default=20_000, help="puts per round (20000)")
    parser.add_argument("--rounds", type=_count, default=5, help="rounds per side (5)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    arguments = parser.parse_args(argv)
    check_output_path(parser, "--json", arguments.json)
    figures = run(arguments)
    if arguments.json is not None and not write_output(
        arguments.json, json.dumps(figures, indent=2) + "\n", program="pickling"
    ):
        sys.exit(1)


if __name__ == "__main__":
    main()
