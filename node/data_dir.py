"""One node per data directory.

Two nodes started on one data directory (a copied configuration, a `--set data_dir=...` given
to every region of `xr up`) would write one Raft journal through two memory maps: each tears the
other's records, and a write the cluster acknowledged can be gone when the directory is read
again. So a node holds an exclusive `flock` on `<data_dir>/node.lock` from before it opens its
journal until it stops (the kernel lets go of it however the process ends, `kill -9` included),
and a second node is refused at start, naming the directory and the holder's pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from node.config import ConfigError

__all__ = ["LOCK_FILE", "DataDirLock"]

LOCK_FILE = "node.lock"


class DataDirLock:
    """The lock on one data directory, held from construction until `release`."""

    def __init__(self, data_dir: Path) -> None:
        """Makes the directory if it is missing; ConfigError when another process holds it."""
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / LOCK_FILE
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(descriptor)
            raise ConfigError(
                f"data_dir {data_dir} is in use by another node (pid {holder}): each node needs "
                "a data directory of its own"
            ) from None
        except BaseException:
            os.close(descriptor)
            raise
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{os.getpid()}\n".encode())
        self._descriptor: int | None = descriptor

    def release(self) -> None:
        """Lets go of the directory (idempotent)."""
        if self._descriptor is not None:
            with contextlib.suppress(OSError):
                os.close(self._descriptor)
            self._descriptor = None
