"""The `xr-jepsen` command line: run a workload against a real cluster under a nemesis, check a
stored history, rebuild a report, or run the whole matrix.

    xr-jepsen run --workload register --nemesis partition-halves --nodes 3 --time 30 --seed 7
    xr-jepsen check jepsen-runs/x/history.jsonl
    xr-jepsen report jepsen-runs/x
    xr-jepsen matrix --nodes 5 --time 60

Exit codes: 0 valid, 1 a checker found an anomaly, 2 a usage error or a run that cannot be made
here (a partition nemesis without network namespaces; a nemesis that could inject no fault, on
too few nodes or in too short a time), 3 unknown (the linearizability search ran out of time) or
not live (the final operations did not succeed after the heal); 130 on Ctrl-C; 143 for a run
that SIGTERM stopped early, unless what ran holds an anomaly (1). The matrix: 1 if any run is
invalid, else 2 if any run failed with an error, else 143 if SIGTERM stopped it, else 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from node.cli_common import FiniteFloatRange
from xr_jepsen.nemesis import NEMESES, refusal
from xr_jepsen.workloads import WORKLOADS

if TYPE_CHECKING:
    from xr_jepsen.runner import RunConfig

__all__ = ["cli", "main"]

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_UNKNOWN = 3
# 128 + SIGTERM, as a shell reports a process that signal ended.
EXIT_SIGTERM = 143
DEFAULT_RUNS_DIR = Path("jepsen-runs")
# f names that tell which workload wrote a history (read-final is the queue's and the set's).
_WORKLOAD_OF_F = {
    "cas": "register",
    "write": "register",
    "read": "register",
    "acquire": "locks",
    "access": "locks",
    "release": "locks",
    "enqueue": "queue",
    "complete": "queue",
    "add": "set",
}


def _exit_code(verdict: str) -> int:
    return {"valid": EXIT_VALID, "invalid": EXIT_INVALID}.get(verdict, EXIT_UNKNOWN)


def _say(line: str) -> None:
    click.echo(line, err=True)


def _dir_option(name: str, help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--dir`: a directory for a run's or a matrix's files, checked not to be empty text."""
    return click.option(
        "--dir",
        name,
        type=click.Path(file_okay=False),
        callback=lambda _ctx, _param, value: _non_empty_path(value, "--dir"),
        default=None,
        help=help_text,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def cli() -> None:
    """jepsen-lite for xr: real node processes, real faults, checked histories."""


@cli.command()
@click.option("--workload", type=click.Choice(WORKLOADS), required=True)
@click.option("--nemesis", type=click.Choice(NEMESES), default="none", show_default=True)
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option("--time", "time_s", type=FiniteFloatRange(1, 3600), default=30, show_default=True)
@click.option("--seed", type=int, default=None, help="default: drawn, and printed")
@_dir_option("run_dir", "a new or empty directory")
@click.option(
    "--no-namespaces",
    is_flag=True,
    help="nodes on loopback even where namespaces work (process and clock faults only)",
)
@click.option(
    "--fault-transport",
    is_flag=True,
    help="without namespaces, make partitions as message drops inside the nodes (test-only "
    "XR_TEST_PARTITIONS); the run records that it did",
)
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE", help="a node setting")
def run(
    workload: str,
    nemesis: str,
    nodes: int,
    time_s: float,
    seed: int | None,
    run_dir: Path | None,
    no_namespaces: bool,
    fault_transport: bool,
    settings: tuple[str, ...],
) -> None:
    """Runs WORKLOAD for --time seconds under --nemesis, then heals, checks and reports."""
    from xr_jepsen.runner import RunConfig, RunRefused
    from xr_jepsen.runner import run as run_one

    # Everything that can be refused is, before the run's directory is made.
    node_settings = _settings(settings)
    _refuse_pointless(nemesis, nodes=nodes, time_s=time_s)
    if seed is None:
        seed = time.time_ns() % 1_000_000
    if run_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = DEFAULT_RUNS_DIR / f"{stamp}-{workload}-{nemesis}-s{seed}"
    _make_run_dir(run_dir)
    config = RunConfig(
        workload=workload,
        nemesis=nemesis,
        nodes=nodes,
        time_s=time_s,
        seed=seed,
        run_dir=run_dir,
        namespaces=not no_namespaces,
        fault_transport=fault_transport,
        settings=node_settings,
    )
    try:
        results = run_one(config, progress=_say)
    except RunRefused as error:
        _say(f"xr-jepsen: refused: {error}")
        sys.exit(EXIT_USAGE)
    except RuntimeError as error:
        # The cluster did not start (a bad --set, say): the run could not be made.
        _say(f"xr-jepsen: the run failed: {error}")
        sys.exit(EXIT_USAGE)
    except Exception as error:
        # A fault of the harness itself: one line here, the traceback in the run's directory;
        # not exit 1, which says the history holds an anomaly.
        _say(f"xr-jepsen: the run failed: {_record_error(run_dir, error)}")
        sys.exit(EXIT_USAGE)
    shown = ("verdict", "ops", "faults", "anomalies", "stopped_by", "command")
    click.echo(json.dumps({k: results.get(k) for k in shown}))
    verdict = str(results["verdict"])
    if results.get("stopped_by") == "SIGTERM":
        # The verdict is on a shortened run; only an anomaly in it is news in its own right.
        _say(f"xr-jepsen: stopped early by SIGTERM; verdict on what ran: {verdict}")
        if verdict != "invalid":
            sys.exit(EXIT_SIGTERM)
    sys.exit(_exit_code(verdict))


@cli.command()
@click.argument("history", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--workload", type=click.Choice(WORKLOADS), default=None, help="default: guessed")
def check(history: Path, workload: str | None) -> None:
    """Checks a stored HISTORY (JSON lines) and prints the checker's verdict as JSON."""
    from xr_jepsen.history import read_history
    from xr_jepsen.workloads import make_workload

    try:
        ops = read_history(history)
        if not ops:
            # Nothing happened, so nothing can be said to be valid.
            raise click.UsageError("the history is empty: there is nothing to check")
        if workload is None:
            workload = next((_WORKLOAD_OF_F[op.f] for op in ops if op.f in _WORKLOAD_OF_F), None)
        if workload is None:
            raise click.UsageError("cannot tell the workload from the history; give --workload")
        if not any(_WORKLOAD_OF_F.get(op.f) == workload for op in ops):
            # A checker finds no anomaly among operations it does not judge: not "valid".
            fs = sorted(f for f, owner in _WORKLOAD_OF_F.items() if owner == workload)
            raise click.UsageError(
                f"the history holds no operation of the {workload} workload ({', '.join(fs)}); "
                "is it another workload's?"
            )
        result = make_workload(workload).check(ops)
    except OSError as error:
        raise click.BadParameter(
            f"cannot read it: {error.strerror}", param_hint="HISTORY"
        ) from None
    except ValueError as error:
        # A HistoryError (a bad line, ops that do not pair up) or an op the checker cannot take.
        raise click.BadParameter(str(error), param_hint="HISTORY") from None
    click.echo(json.dumps(result.to_json(), indent=2, default=str))
    verdict = "unknown" if result.valid == "unknown" else "valid" if result.valid else "invalid"
    sys.exit(_exit_code(verdict))


@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def report(run_dir: Path) -> None:
    """Rebuilds RUN_DIR/report.html from the run's files and prints its path."""
    from xr_jepsen.report import ReportError, write_report

    try:
        path = write_report(run_dir)
    except ReportError as error:
        raise click.BadParameter(str(error), param_hint="RUN_DIR") from None
    except OSError as error:
        raise click.ClickException(
            f"cannot write {error.filename or run_dir / 'report.html'}: {error.strerror}"
        ) from None
    click.echo(str(path))


@cli.command()
@click.option(
    "--workloads",
    default=",".join(WORKLOADS),
    show_default=True,
    callback=lambda _ctx, _param, value: _names(value, WORKLOADS, "--workloads"),
)
@click.option(
    "--nemeses",
    default=",".join(name for name in NEMESES if name != "none"),
    show_default=True,
    callback=lambda _ctx, _param, value: _names(value, NEMESES, "--nemeses"),
)
@click.option("--nodes", type=click.IntRange(1, 9), default=5, show_default=True)
@click.option("--time", "time_s", type=FiniteFloatRange(1, 3600), default=60, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@_dir_option("runs_dir", "a new or empty directory for the runs and matrix.json")
def matrix(
    workloads: list[str],
    nemeses: list[str],
    nodes: int,
    time_s: float,
    seed: int,
    runs_dir: Path | None,
) -> None:
    """Every workload under every nemesis; prints a table of runs, operations, anomalies and
    verdicts, and rewrites DIR/matrix.json after every run. Exits 1 if any run is invalid, else 2
    if any run failed with an error (its error.txt says why), else 143 if SIGTERM stopped it,
    else 0."""
    from xr_jepsen.runner import RunConfig

    for nemesis in nemeses:
        _refuse_pointless(nemesis, nodes=nodes, time_s=time_s)
    runs_dir = runs_dir or DEFAULT_RUNS_DIR / f"matrix-{time.strftime('%Y%m%d-%H%M%S')}"
    if (runs_dir / "matrix.json").exists():
        raise click.BadParameter(f"{runs_dir} already holds a matrix", param_hint="--dir")
    cells = [(workload, nemesis) for workload in workloads for nemesis in nemeses]
    for workload, nemesis in cells:
        _make_run_dir(runs_dir / f"{workload}-{nemesis}")
    rows: list[dict[str, Any]] = []
    # Written before the first run too: it marks the directory as a matrix's.
    _write_matrix(runs_dir, rows, cells=len(cells))
    for number, (workload, nemesis) in enumerate(cells, start=1):
        _say(f"matrix: run {number} of {len(cells)}: {workload}/{nemesis}")
        config = RunConfig(
            workload=workload,
            nemesis=nemesis,
            nodes=nodes,
            time_s=time_s,
            seed=seed,
            run_dir=runs_dir / f"{workload}-{nemesis}",
        )
        try:
            row = _matrix_row(config)
        except KeyboardInterrupt:
            # Ctrl-C ends the matrix (main exits 130); the finished rows stay in matrix.json.
            _write_matrix(runs_dir, rows, cells=len(cells), stopped_by="Ctrl-C")
            raise
        rows.append(row)
        _say(f"matrix: run {number} of {len(cells)}: {row}")
        _write_matrix(runs_dir, rows, cells=len(cells), stopped_by=row.get("stopped_by"))
        if row.get("stopped_by"):
            _say(f"matrix: stopped by {row['stopped_by']} after {number} of {len(cells)} runs")
            break
    click.echo(_table(rows))
    for row in rows:
        if "error" in row:
            click.echo(f"{row['run']}: {row['verdict']}: {row['error']}")
    click.echo(f"matrix: {runs_dir / 'matrix.json'}")
    sys.exit(_matrix_exit_code(rows))


def _matrix_row(config: RunConfig) -> dict[str, Any]:
    """Runs one cell of the matrix and returns its row. Any exception from the run becomes the
    row's error (with its traceback in the run's error.txt), so the cells after it still run;
    KeyboardInterrupt is no Exception and ends the matrix."""
    from xr_jepsen.runner import RunRefused
    from xr_jepsen.runner import run as run_one

    name = f"{config.workload}/{config.nemesis}"
    started_s = time.monotonic()
    try:
        results = run_one(config, progress=_say)
        row = {
            "run": name,
            "ops": results["ops"]["total"],
            "info": results["ops"]["info"],
            "faults": results.get("faults"),
            "anomalies": results["anomalies"],
            "verdict": results["verdict"],
        }
        if results.get("stopped_by"):
            row["stopped_by"] = results["stopped_by"]
    except RunRefused as error:
        row = {"run": name, "verdict": "refused", "error": _first_line(error)}
    except Exception as error:
        row = {"run": name, "verdict": "error", "error": _record_error(config.run_dir, error)}
    row["seconds"] = round(time.monotonic() - started_s)
    return row


def _refuse_pointless(nemesis: str, *, nodes: int, time_s: float) -> None:
    """A usage error for a nemesis that could inject no fault here (`nemesis.refusal`): its
    verdict would be reported under the nemesis's name while nothing was tested."""
    refused = refusal(nemesis, size=nodes, duration_s=time_s)
    if refused is not None:
        raise click.UsageError(refused)


def _record_error(run_dir: Path, error: Exception) -> str:
    """Writes the traceback of a run's unexpected error to run_dir/error.txt; returns one line
    that names the error and that file."""
    line = f"{type(error).__name__}: {_first_line(error)}"
    try:
        (run_dir / "error.txt").write_text("".join(traceback.format_exception(error)))
    except OSError:
        return line
    return f"{line} (traceback in {run_dir / 'error.txt'})"


def _matrix_exit_code(rows: list[dict[str, Any]]) -> int:
    # An anomaly is the news that matters most; an error means a cell has no verdict at all,
    # which must not pass as a clean matrix; unknown, not live and refused rows leave it 0.
    verdicts = {row["verdict"] for row in rows}
    if "invalid" in verdicts:
        return EXIT_INVALID
    if "error" in verdicts:
        return EXIT_USAGE
    if any(row.get("stopped_by") == "SIGTERM" for row in rows):
        return EXIT_SIGTERM
    return EXIT_VALID


def _write_matrix(
    runs_dir: Path, rows: list[dict[str, Any]], *, cells: int, stopped_by: str | None = None
) -> None:
    """Replaces matrix.json atomically (a new file, then os.replace), so that a matrix stopped at
    any moment leaves the table of every finished run, never a half-written file."""
    document = {
        "complete": len(rows) == cells and stopped_by is None,
        "cells": cells,
        "stopped_by": stopped_by,
        "rows": rows,
    }
    path = runs_dir / "matrix.json"
    try:
        _replace_file(path, json.dumps(document, indent=2, default=str) + "\n")
    except OSError as error:
        raise _CannotWrite(f"cannot write {path}: {error.strerror}") from None


class _CannotWrite(click.ClickException):
    # Not 1, which says an anomaly was found: the matrix cannot be made here.
    exit_code = EXIT_USAGE


def _replace_file(path: Path, text: str) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _non_empty_path(value: str | None, option: str) -> Path | None:
    if value is None:
        return None
    if not value:
        raise click.BadParameter("must not be empty", param_hint=option)
    return Path(value)


def _make_run_dir(path: Path) -> None:
    """Makes a run's directory, refusing one that holds files already: a run there would
    overwrite an earlier run's history and start its nodes on the earlier run's data."""
    try:
        if path.is_dir() and any(path.iterdir()):
            raise click.BadParameter(
                f"{path} is not empty; a run needs a new or empty directory", param_hint="--dir"
            )
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.BadParameter(
            f"cannot make {path}: {error.strerror}", param_hint="--dir"
        ) from None


def _names(value: str, known: tuple[str, ...], option: str) -> list[str]:
    names = value.split(",")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise click.BadParameter(
            f"{unknown[0]!r} is not one of {', '.join(known)}", param_hint=option
        )
    return list(dict.fromkeys(names))


def _settings(pairs: tuple[str, ...]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise click.BadParameter(f"expected NAME=VALUE, got {pair!r}", param_hint="--set")
        settings[name] = value
    return settings


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:500]


def _table(rows: list[dict[str, Any]]) -> str:
    columns = ["run", "ops", "info", "faults", "anomalies", "verdict", "seconds"]
    cells = [[str(row.get(column, "-")) for column in columns] for row in rows]
    widths = [
        max([len(column)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)
    ]
    lines = [
        "  ".join(
            column.upper().ljust(width) for column, width in zip(columns, widths, strict=True)
        )
    ]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in cells
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="xr-jepsen", standalone_mode=False)
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.exceptions.Exit as done:
        return done.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        return 130
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 0
    return 0
