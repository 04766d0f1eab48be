"""The directory a node makes its workers' private /tmp in (`executor.private_tmp`), and the
removal of those a node that crashed left behind.

A node that runs workers as other users makes one directory of root's alone under the machine's
temporary directory (`xr-<region>-jobs-XXXXXXXX`; `xr node run --check` makes `xr-check-...`),
and in it a directory per attempt (`sandbox`). It removes them when it stops. A node killed
(`kill -9`, a crash, the machine's power) cannot: its directory and every attempt's files in it
would stay until the machine's temporary directory is cleaned, if ever.

So each such directory holds a file, `held`, that its node holds an exclusive `flock` on for as
long as it runs; the kernel releases the lock when the node's process ends, however it ends. A
node making its directory first removes every directory under the temporary directory named
`xr-*`, owned by its own uid, whose `held` it can lock: no process holds it, so no node uses it.
It removes it holding that lock, so two nodes starting at once cannot both take it for dead.

`held` is locked under another name and renamed into place, so a directory being made (no
`held` yet, or one not yet locked) is never taken for dead; directories without `held` (another
program's, or an older node's) are left alone.

`used_bytes` measures what an attempt's /tmp and /var/tmp hold (`executor.tmp_bytes_max`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["HELD", "SandboxRoot", "remove_stale", "used_bytes"]

log = logging.getLogger(__name__)

# The file a running node holds locked in its directory.
HELD = "held"
# What every node's directory is named: `xr-` then the rest of its prefix.
PREFIX = "xr-"


class SandboxRoot:
    """A directory of root's alone that this process holds (`HELD`) until `close`."""

    def __init__(self, prefix: str, directory: Path | None = None) -> None:
        """Removes the directories of nodes that no longer run (`remove_stale`), then makes
        one in `directory` (the machine's temporary directory) named `prefix` and random
        characters, and locks its `HELD`."""
        if not prefix.startswith(PREFIX):
            raise ValueError(f"a sandbox root's prefix starts with {PREFIX!r}, not {prefix!r}")
        remove_stale(directory)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
        staged = self.path / f"{HELD}.new"
        try:
            self._held: int | None = os.open(
                staged, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
            )
            fcntl.flock(self._held, fcntl.LOCK_EX)
            os.rename(staged, self.path / HELD)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def close(self) -> None:
        """Removes the directory, then lets go of it (idempotent)."""
        if self._held is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._held)
        self._held = None


def remove_stale(directory: Path | None = None) -> list[Path]:
    """Removes each `xr-*` directory in `directory` (the machine's temporary directory) owned by
    this process's uid whose `HELD` no process holds; the directories removed."""
    where = Path(tempfile.gettempdir() if directory is None else directory)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(where))
    except OSError as error:
        log.warning("cannot look for sandbox roots left behind in %s: %s", where, error)
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        try:
            held = os.open(
                os.path.join(entry.path, HELD), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError:
            continue  # not a sandbox root, or one being made
        try:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its node runs
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
        finally:
            with contextlib.suppress(OSError):
                os.close(held)
    if removed:
        log.warning(
            "removed %d sandbox root(s) that stopped nodes left in %s: %s",
            len(removed),
            where,
            ", ".join(path.name for path in removed),
        )
    return removed


def used_bytes(directories: list[Path], stop_above: int) -> int:
    """The bytes of disk the files and directories under `directories` take, as `du` counts
    them (allocated blocks, each inode once, links not followed, missing entries skipped: a
    job changes its files while they are counted), or a first count above `stop_above` as
    soon as one is reached, so a job that writes without end is not walked to its end."""
    seen: set[tuple[int, int]] = set()
    total = 0
    pending = [str(directory) for directory in directories]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    directory = stat.S_ISDIR(info.st_mode)
                    if not directory and info.st_nlink > 1:
                        # A file linked under several names counts once.
                        if (info.st_dev, info.st_ino) in seen:
                            continue
                        seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
                    if total > stop_above:
                        return total
                    if directory:
                        pending.append(entry.path)
        except OSError:
            continue
    return total
