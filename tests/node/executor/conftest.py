"""Fixtures the executor's tests share."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture()
def sandboxes() -> Iterator[Path]:
    """A directory of root's alone, as the executor makes for its workers' sandboxes
    (`Executor.prepare`, `executor.private_tmp`)."""
    path = Path(tempfile.mkdtemp(prefix="xr-test-sandboxes-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
