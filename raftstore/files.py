"""Durable file replacement, shared by the Raft store (backups, term and vote, snapshots) and the
executor's checkpoints: a file is replaced whole or not at all, and the replacement survives a
power loss once the call returns."""

from __future__ import annotations

import os
import tempfile
from contextlib import suppress
from pathlib import Path

__all__ = ["fsync_directory", "write_file_durably"]


def fsync_directory(path: Path) -> None:
    """Makes the names in a directory (a file created, renamed or unlinked there) durable."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_file_durably(
    path: Path, data: bytes | memoryview, *, suffix: str = ".tmp", mode: int | None = None
) -> None:
    """Replaces `path` with `data`: a temporary file in the same directory (so the rename stays on
    one filesystem; named `.<name>.<random><suffix>`), fsynced, renamed over `path`, then the
    directory fsynced. A crash at any point leaves the old file or the new one, never a mix; a
    failure removes the temporary file. `mode` sets the new file's permissions."""
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=suffix
    )
    try:
        with os.fdopen(descriptor, "wb") as sink:
            if mode is not None:
                os.fchmod(sink.fileno(), mode)
            sink.write(data)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_directory(path.parent)
