"""The cost of one audit-log line: xr's `AuditLog` against the standard `logging` path, in one run.

The reference is how the audit log was written until 4 December 2026 and how a Python service
would write one: a `logging.Logger` of its own (not propagating) with a `RotatingFileHandler`
and a `"%(message)s"` formatter, the same JSON line (msgspec), the time formatted with
`datetime`. xr's `node.api.audit.AuditLog` writes the same fields to the same kind of handler's
file directly. Both write to files in a temporary folder with the same size limit (no rotation
within a round unless `--bytes-max` is small), alternating round by round in one process; each
round times `--lines` lines. With `--against REV`, `node/api/audit.py` as it was at that git
revision runs in every round too (the rest of the repository from the working tree). It prints
each side's median microseconds per line and the median of the per-round ratios of this tree
over each reference: below 1 is cheaper.

Run: `python bench/audit_log.py [--lines 50000] [--rounds 5] [--bytes-max 67108864]
[--against 9febbfa]`. The last line is one JSON object.
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
import logging  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from logging.handlers import RotatingFileHandler  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import msgspec  # noqa: E402

import node.api.audit as current  # noqa: E402
from bench._revision import module_at  # noqa: E402
from node.api.auth import Principal  # noqa: E402
from raftstore.clock import RealClock  # noqa: E402

_CALLER = Principal(name="bench", role="tenant", tenant="t")


class _LoggingAudit:
    """The reference: the same line through a logger, a `LogRecord` and a formatter."""

    def __init__(self, path: Path, *, bytes_max: int) -> None:
        self._clock = RealClock()
        self._handler = RotatingFileHandler(path, maxBytes=bytes_max, backupCount=1)
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger = logging.Logger("bench.audit", logging.INFO)
        self._logger.propagate = False
        self._logger.addHandler(self._handler)

    def record(self, number: int) -> None:
        moment = datetime.fromtimestamp(self._clock.now_ms() / 1000, tz=UTC)
        line = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "principal": {"name": _CALLER.name, "role": _CALLER.role, "tenant": _CALLER.tenant},
            "method": "PUT",
            "path": f"/v1/kv/bench/{number}",
            "route": "/v1/kv/{key}",
            "status": 200,
            "error": None,
            "request_id": f"bench-{number}",
            "remote": "127.0.0.1",
            "index": number,
        }
        self._logger.info(msgspec.json.encode(line).decode())

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._handler.close()


class _XrAudit:
    """xr's audit log, of this tree or of the module `audit` (`node/api/audit.py` at a
    revision)."""

    def __init__(self, path: Path, *, bytes_max: int, audit: ModuleType = current) -> None:
        self._log = audit.AuditLog(path, bytes_max=bytes_max, files_max=2, clock=RealClock())

    def record(self, number: int) -> None:
        self._log.record(
            principal=_CALLER,
            method="PUT",
            path=f"/v1/kv/bench/{number}",
            route="/v1/kv/{key}",
            status=200,
            error=None,
            request_id=f"bench-{number}",
            remote="127.0.0.1",
            index=number,
        )

    def close(self) -> None:
        self._log.close()


def _round(make: Callable[[Path], _XrAudit | _LoggingAudit], folder: Path, lines: int) -> float:
    """Microseconds per line over `lines` lines (CPU time of this process)."""
    log = make(folder / "audit.log")
    try:
        for number in range(min(lines, 1000)):  # Warm: the file is open, the code is hot.
            log.record(number)
        started_s = time.process_time()
        for number in range(lines):
            log.record(number)
        return (time.process_time() - started_s) * 1e6 / lines
    finally:
        log.close()


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    bytes_max = arguments.bytes_max
    with tempfile.TemporaryDirectory(prefix="xr-bench-audit-") as directory:
        root = Path(directory)
        # Each side: its label and how it opens its log at a path.
        sides: dict[str, Callable[[Path], _XrAudit | _LoggingAudit]] = {
            "this tree": lambda path: _XrAudit(path, bytes_max=bytes_max),
            "logging": lambda path: _LoggingAudit(path, bytes_max=bytes_max),
        }
        if arguments.against is not None:
            earlier = module_at(arguments.against, "node/api/audit.py", root, program="audit_log")
            sides[arguments.against] = lambda path: _XrAudit(
                path, bytes_max=bytes_max, audit=earlier
            )
        times: dict[str, list[float]] = {name: [] for name in sides}
        for number in range(arguments.rounds):
            for index, (name, make) in enumerate(sides.items()):
                folder = root / f"round-{number}-side-{index}"
                folder.mkdir()
                times[name].append(_round(make, folder, arguments.lines))
            print(
                f"round {number + 1}/{arguments.rounds}: "
                + ", ".join(f"{name} {values[-1]:.2f} us" for name, values in times.items())
                + " a line",
                flush=True,
            )
    ours = times["this tree"]
    figures: dict[str, Any] = {
        "benchmark": "audit_log",
        "lines": arguments.lines,
        "us_per_line": {
            name: round(statistics.median(values), 3) for name, values in times.items()
        },
        # This tree over each reference, the median of the rounds' ratios.
        "ratio": {
            name: round(statistics.median(a / b for a, b in zip(ours, values, strict=True)), 3)
            for name, values in times.items()
            if name != "this tree"
        },
    }
    title = f"audit line ({arguments.lines:,} lines, median of {arguments.rounds})"
    print(f"\n| {title} | us | this tree / it |")
    print("| --- | ---: | ---: |")
    labels = {"this tree": "xr `AuditLog`, this tree", "logging": "standard `logging` path"}
    for name, value in figures["us_per_line"].items():
        ratio = figures["ratio"].get(name)
        ratio_text = "-" if ratio is None else f"{ratio:.2f}x"
        label = labels.get(name, f"xr `AuditLog` at {name}")
        print(f"| {label} | {value:.2f} | {ratio_text} |")
    print(json.dumps(figures))
    return figures


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=_positive, default=50_000, help="lines timed per round")
    parser.add_argument("--rounds", type=_positive, default=5, help="rounds of each side")
    parser.add_argument(
        "--bytes-max",
        type=_positive,
        default=64 * 1024 * 1024,
        help="each file's size limit (audit.bytes_max), bytes",
    )
    parser.add_argument(
        "--against", metavar="REV", help="also time node/api/audit.py as it was at this revision"
    )
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
