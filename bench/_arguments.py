"""Argument checks shared by the benchmark scripts, made before any work starts.

A benchmark writes its output file when its run ends, minutes after it started; an output path it
cannot write there would lose the whole run's figures, so each script checks it with
`check_output_path` right after parsing its arguments, as a usage error (exit 2) naming the option.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script, a module does nothing or fails on an import: say whose it is.
    print(
        f"{__file__} is a module of the scripts in bench/ with output paths, not a script: run "
        "one of those",
        file=sys.stderr,
    )
    raise SystemExit(2)

__all__ = ["check_output_path"]


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
        return None if os.access(path, os.W_OK) else "is not writable"
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
