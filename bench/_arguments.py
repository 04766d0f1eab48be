"""Argument checks shared by the benchmark scripts, made before any work starts.

A benchmark writes its output file when its run ends, minutes after it started; an output path it
cannot write there would lose the whole run's figures, so each script checks it with
`check_output_path` right after parsing its arguments, as a usage error (exit 2) naming the option.
What the check cannot foresee (a full disk, a device such as /dev/full) fails the write at the
end: `write_output` then says so in one line, after the figures are printed, and the script
exits 1.

The argument types here (`positive_integers`, `integer_between`) answer a bad value with one line
that says what was expected, where a bare `int` or a lambda would name its own function.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__":
    # Run as a script, a module does nothing or fails on an import: say whose it is.
    print(
        f"{__file__} is a module of the scripts in bench/ with output paths, not a script: run "
        "one of those",
        file=sys.stderr,
    )
    raise SystemExit(2)

__all__ = ["check_output_path", "integer_between", "positive_integers", "write_output"]


def positive_integers(text: str) -> tuple[int, ...]:
    """An argument type: whole numbers of at least 1, comma-separated ("1,16,64")."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected whole numbers of at least 1, comma-separated (such as 1,16,64)"
        )
    return values


def integer_between(low: int, high: int) -> Callable[[str], int]:
    """An argument type: one whole number from `low` to `high`, both included."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected a whole number from {low:,} to {high:,}"
            )
        return value

    return parse


def check_output_path(
    parser: argparse.ArgumentParser,
    option: str,
    path: Path | None,
    *,
    make_parents: bool = False,
) -> None:
    """Exits with a usage error if `path` (the value of `option`; None: not given) could not be
    written: a directory, an unwritable file, or a parent that is missing (unless the script makes
    it, `make_parents`: then the nearest existing ancestor), not a directory, or unwritable."""
    if path is None:
        return
    problem = _output_path_problem(path, make_parents=make_parents)
    if problem is not None:
        parser.error(f"{option} {path}: {problem}")


def _output_path_problem(path: Path, *, make_parents: bool) -> str | None:
    if path.is_dir():
        return "is a directory"
    if path.exists():
        if not os.access(path, os.W_OK):
            return "is not writable"
        if stat.S_ISFIFO(path.stat().st_mode) and not _has_reader(path):
            # The write at the end would wait for a reader forever.
            return "is a named pipe that nobody reads"
        return None
    parent = path.absolute().parent
    while make_parents and not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.exists():
        return f"its directory {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {parent} is not writable"
    return None


def _has_reader(fifo: Path) -> bool:
    """Whether a named pipe has a reader now (`/dev/stdout` piped to another program has one)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as error:
        if error.errno == errno.ENXIO:
            return False
        raise
    return True


def write_output(path: Path, text: str, *, program: str) -> bool:
    """Writes `text` to `path`; False, after a line on stderr naming the path and the reason,
    if it cannot (the caller prints its figures to stdout as well, and exits 1)."""
    try:
        path.write_text(text)
    except OSError as error:
        print(f"{program}: cannot write {path}: {error.strerror}", file=sys.stderr)
        return False
    return True
