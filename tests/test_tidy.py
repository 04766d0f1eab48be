"""Proves the layering rules hold, by reading the source rather than trusting reviews.

`xrcore` is the pure core: it imports no clock, randomness, concurrency, operating system, network
or replication module, and nothing from the layers above it (`raftstore`, `node`, `xr_jepsen`).
The client subpackage `xrcore/client/`, which talks HTTP, is the one planned exception and is not
checked. `raftstore` does not import `node`. Every checked file opens with a docstring that says
what it is for. The checker is tested on small sources first, so that a checker that sees nothing
cannot pass by accident.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent

# Modules whose behaviour depends on the machine or the moment: the core must get time and
# randomness from the log, and leave threads, processes, sockets and files to the shell.
IMPURE_MODULES = frozenset(
    {
        "aiohttp",
        "asyncio",
        "cupy",
        "datetime",
        "multiprocessing",
        "os",
        "pysyncobj",
        "random",
        "secrets",
        "socket",
        "subprocess",
        "threading",
        "time",
        "uuid",
    }
)
# The layers above the core: `node -> raftstore -> xrcore`, and jepsen-lite outside them all.
LAYERS_ABOVE_CORE = frozenset({"node", "raftstore", "xr_jepsen"})
CORE_BANNED = IMPURE_MODULES | LAYERS_ABOVE_CORE
RAFTSTORE_BANNED = frozenset({"node", "xr_jepsen"})


def _package_parts(path: Path, root: Path) -> list[str]:
    """The dotted name, as parts, of the package that the module in `path` belongs to."""
    parts = list(path.relative_to(root).parts)
    return parts[:-1]


def _imported_modules(tree: ast.Module, package_parts: list[str]) -> Iterator[tuple[int, str]]:
    """Every module imported anywhere in `tree` (also inside functions and `if TYPE_CHECKING`),
    with its line; relative imports are resolved against the importing module's package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.lineno, node.module or ""
                continue
            # One dot is the module's own package, each further dot one package up.
            base = package_parts[: max(0, len(package_parts) - (node.level - 1))]
            yield node.lineno, ".".join([*base, *([node.module] if node.module else [])])


def check_source(
    source: str, *, filename: str, banned: frozenset[str], package_parts: list[str] | None = None
) -> list[str]:
    """The violations in one file's source: banned imports and a missing module docstring."""
    tree = ast.parse(source, filename=filename)
    problems: list[str] = []
    if ast.get_docstring(tree, clean=False) is None:
        problems.append(f"{filename}:1: does not open with a module docstring")
    for line, module in _imported_modules(tree, package_parts or []):
        top = module.split(".")[0]
        if top in banned:
            problems.append(f"{filename}:{line}: imports {module!r}, which is banned here")
    return problems


def _python_files(root: Path, *, skip: tuple[str, ...] = ()) -> list[Path]:
    """The Python files under `root`, leaving out the subpackages named in `skip`."""
    files = sorted(root.rglob("*.py"))
    return [path for path in files if path.relative_to(root).parts[0] not in skip]


def _check_package(package: str, banned: frozenset[str], *, skip: tuple[str, ...] = ()) -> None:
    files = _python_files(REPOSITORY / package, skip=skip)
    assert files, f"no Python files found under {package}/: the checker would see nothing"
    problems: list[str] = []
    for path in files:
        problems += check_source(
            path.read_text(encoding="utf-8"),
            filename=str(path.relative_to(REPOSITORY)),
            banned=banned,
            package_parts=_package_parts(path, REPOSITORY),
        )
    assert not problems, "layering rules broken:\n" + "\n".join(problems)


# The checker itself.


def test_checker__finds_a_banned_import_with_its_file_and_line() -> None:
    source = '"""A module."""\n\nimport json\nimport time\n'
    problems = check_source(source, filename="xrcore/bad.py", banned=CORE_BANNED)
    assert problems == ["xrcore/bad.py:4: imports 'time', which is banned here"]


@pytest.mark.parametrize(
    ("statement", "module"),
    [
        ("import os.path", "os.path"),
        ("from datetime import datetime", "datetime"),
        ("from random import Random as R", "random"),
        ("import threading, json", "threading"),
        ("from node.api import create_app", "node.api"),
        ("import raftstore", "raftstore"),
        ("from xr_jepsen import checker", "xr_jepsen"),
        ("def f():\n    import socket", "socket"),
        ("if TYPE_CHECKING:\n    from asyncio import Future", "asyncio"),
        ("from ..node import api", "node"),
    ],
)
def test_checker__finds_every_form_of_import(statement: str, module: str) -> None:
    source = f'"""A module."""\n{statement}\n'
    problems = check_source(
        source, filename="xrcore/bad.py", banned=CORE_BANNED, package_parts=["xrcore"]
    )
    assert len(problems) == 1 and f"imports {module!r}" in problems[0], problems


@pytest.mark.parametrize(
    "statement",
    [
        "import json",
        "from xrcore import codec",
        "from . import codec",
        "from .errors import XrError",
        "from timeit import timeit",  # a longer name that merely starts like a banned one
        "import msgspec",
    ],
)
def test_checker__allows_pure_imports(statement: str) -> None:
    source = f'"""A module."""\n{statement}\n'
    problems = check_source(
        source, filename="xrcore/good.py", banned=CORE_BANNED, package_parts=["xrcore"]
    )
    assert problems == []


def test_checker__finds_a_missing_docstring() -> None:
    source = "# A comment is not a docstring.\nimport json\n"
    problems = check_source(source, filename="xrcore/bare.py", banned=CORE_BANNED)
    assert problems == ["xrcore/bare.py:1: does not open with a module docstring"]


def test_checker__skips_the_client_subpackage_only(tmp_path: Path) -> None:
    for name in ["codec.py", "client.py", "client/__init__.py", "client/http.py", "sub/client.py"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('"""A module."""\n')
    files = _python_files(tmp_path, skip=("client",))
    assert [path.relative_to(tmp_path).as_posix() for path in files] == [
        "client.py",
        "codec.py",
        "sub/client.py",
    ]


# The repository.


def test_xrcore__imports_nothing_impure_and_no_layer_above_it() -> None:
    _check_package("xrcore", CORE_BANNED, skip=("client",))


def test_raftstore__does_not_import_node() -> None:
    _check_package("raftstore", RAFTSTORE_BANNED)
