"""A member whose disk fails it stops.

Raft's safety rests on what a member wrote staying written: its term and vote before it answers,
its log before it acknowledges. pysyncobj goes on after a write that failed. It sets a new term in
memory before storing it, so a leader whose disk was full took a term it was never elected in
(two leaders in one term: the disk QA pass of session 32 lost acknowledged writes and left that
node's state different for good); a member whose disk could not store its metadata logged a
traceback every second and went on answering. And it grows its journal as a sparse memory map,
so a full disk killed the process with SIGBUS, with nothing in its log, when the kernel found no
block for a page written through the map.

So here the journal's file grows with its blocks allocated (`posix_fallocate`), which turns a full
disk into an `OSError` at the write; and every write of the journal and its metadata file that
fails stops the process at once (`fail_stop`), before pysyncobj can send anything its disk does
not hold: one CRITICAL line names the file and the error, and the process exits with
`STORAGE_FAILED_EXIT` (74, EX_IOERR). etcd does the same when its WAL cannot be written. A failed
sync (fsync, fdatasync) stops it too: after a failed sync Linux may report the next one as a
success without the pages having reached the disk. A node restarted on a disk still full stops at
its first write again: free space, or mend the disk, and start it.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
import os
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = [
    "STORAGE_FAILED_EXIT",
    "AllocatedFile",
    "FailStopJournal",
    "PlainFileJournal",
    "allocate",
    "fail_stop",
    "install",
]

log = logging.getLogger(__name__)

STORAGE_FAILED_EXIT = 74
# How the process ends; tests replace it to see the stop without losing the test process.
exit_process: Callable[[int], NoReturn] = os._exit

_journal_module: Any = importlib.import_module("pysyncobj.journal")
# pysyncobj's journal class as it is, for files whose writer handles a failure itself.
PlainFileJournal: Any = _journal_module.FileJournal
# File systems that cannot allocate ahead (`posix_fallocate` unsupported): the file then grows
# sparse, as pysyncobj grows it.
_NOT_SUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def fail_stop(path: object, error: BaseException) -> NoReturn:
    """Stops the process at once: `path` could not be written (or synced)."""
    log.critical(
        "cannot write %s (%s): stopping now, as a member that goes on after a failed write may "
        "lose or contradict what it acknowledged; free space or mend the disk, then start the "
        "node again (exit status %d)",
        path,
        error,
        STORAGE_FAILED_EXIT,
    )
    for handler in (*logging.getLogger().handlers, *log.handlers):
        # Stopping anyway: a handler that cannot flush has nothing more to say.
        with contextlib.suppress(Exception):
            handler.flush()
    exit_process(STORAGE_FAILED_EXIT)


def allocate(descriptor: int, size: int) -> None:
    """Gives the file its blocks up to `size` bytes (growing it to that size if shorter); an
    `OSError` (ENOSPC, EFBIG, EIO) if the disk cannot. A no-op where the file system cannot."""
    try:
        os.posix_fallocate(descriptor, 0, size)
    except OSError as error:
        if error.errno not in _NOT_SUPPORTED:
            raise


class AllocatedFile(_journal_module.ResizableFile):  # type: ignore[misc]
    """pysyncobj's journal file, with its blocks allocated as it grows, and at opening (a
    journal an earlier release grew sparse)."""

    def __init__(self, fileName: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(fileName, *args, **kwargs)
        allocate(self._descriptor(), len(self._mapped()))

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        mapped = self._mapped()
        if end > len(mapped):
            # pysyncobj's growth (its resize factor is 2), allocated before the map grows. The
            # map grows here too: pysyncobj's `write` compares with the file's size (`size()`),
            # which the allocation already grew.
            size = max(2 * len(mapped), end)
            allocate(self._descriptor(), size)
            mapped.resize(size)
        super().write(offset, values)

    def _mapped(self) -> Any:
        return getattr(self, "_ResizableFile__mm")  # noqa: B009 - name-mangled

    def _descriptor(self) -> int:
        return int(getattr(self, "_ResizableFile__f").fileno())  # noqa: B009 - name-mangled


class FailStopJournal(PlainFileJournal):  # type: ignore[misc]
    """pysyncobj's file journal, whose writes stop the process when they fail (`fail_stop`).
    Its metadata (term, vote, commit index) goes to `<journal>.meta`."""

    def __init__(self, journalFile: str) -> None:
        self.path = journalFile
        try:
            super().__init__(journalFile)
        except OSError as error:
            fail_stop(journalFile, error)

    def add(self, command: Any, idx: int, term: int) -> None:
        try:
            super().add(command, idx, term)
        except OSError as error:
            fail_stop(self.path, error)

    def clear(self) -> None:
        try:
            super().clear()
        except OSError as error:
            fail_stop(self.path, error)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        try:
            super().deleteEntriesFrom(entryFrom)
        except OSError as error:
            fail_stop(self.path, error)

    def deleteEntriesTo(self, entryTo: int) -> None:
        try:
            super().deleteEntriesTo(entryTo)
        except OSError as error:
            fail_stop(self.path, error)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        # Stops before pysyncobj, which set the term in memory first, can act on it.
        try:
            super().setCurrentTerm(term, votedForNodeId)
        except OSError as error:
            fail_stop(f"{self.path}.meta", error)

    def onOneSecondTimer(self) -> None:
        try:
            super().onOneSecondTimer()
        except OSError as error:
            fail_stop(f"{self.path}.meta", error)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as error:
            fail_stop(self.path, error)


def install() -> None:
    """pysyncobj makes its journal (and its journal's file) through module names: from now on
    they are these."""
    _journal_module.ResizableFile = AllocatedFile
    _journal_module.FileJournal = FailStopJournal
