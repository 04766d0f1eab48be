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

And a disk may return other bytes than were written. pysyncobj's journal records carry no
checksum: a damaged command was read back as one that does not decode, every member skipped it
as a malformed entry, and the damaged member differed from the others from there on (the same
QA pass, garbage written into two members' journals: acknowledged writes lost). Journals of
format 2 (`CheckedJournal`: every journal this release creates, and an older one from its first
compaction on) hold a CRC-32 of each record's index, term and command inside the record;
`replica.repair_journal` checks them before pysyncobj reads the file, and a member whose journal
is damaged anywhere but in a torn tail refuses to start (`JournalDamaged`), naming the file, the
offset and the entry.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from raftstore import pickling

__all__ = [
    "CHECKED_FORMAT",
    "FORMAT_OFFSET",
    "STORAGE_FAILED_EXIT",
    "AllocatedFile",
    "CheckedJournal",
    "JournalDamaged",
    "PlainFileJournal",
    "allocate",
    "fail_stop",
    "install",
    "record_checksum",
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


# pysyncobj's journal: a 40-byte header (its name in 24 bytes, its version in 8, the format in 4,
# the end of the last record in 4), then records of (4-byte size, 8-byte index, 8-byte term,
# command, 4-byte size), the size counting index, term and command. In format 2 the command is
# preceded by the CRC-32 (little-endian, 4 bytes) of the index and term as packed and the command.
FORMAT_OFFSET = 32
CHECKED_FORMAT = 2


def record_checksum(index: int, term: int, command: bytes) -> int:
    return zlib.crc32(command, zlib.crc32(struct.pack("<QQ", index, term)))


class JournalDamaged(OSError):
    """A record of the journal is not what was written, and it is not a torn tail."""


def _check_meta(path: Path) -> None:
    """Refuses (`JournalDamaged`) a metadata file that exists but cannot be read as one.
    pysyncobj read any such file as empty: the member forgot its term and the vote it gave in
    it, and could vote a second time in that term (two leaders); found by the disk QA pass of
    session 32, with a damaged file and with one the node's user could not read."""
    if not path.exists():
        return
    try:
        meta = pickling.loads(path.read_bytes())
        problem = None if isinstance(meta, dict) else f"it holds a {type(meta).__name__}"
    except Exception as error:  # a damaged pickle raises anything
        problem = str(error) or type(error).__name__
    if problem is not None:
        raise JournalDamaged(
            errno.EIO,
            f"{path} cannot be read ({problem}): it holds this member's term and vote, which it "
            "must not forget (it could vote twice in one term); mend its permissions if that is "
            "the cause, else move the data directory aside and start the node again to take the "
            "others' state (docs/operations.md, resync)",
        )


class CheckedJournal(PlainFileJournal):  # type: ignore[misc]
    """pysyncobj's file journal, in format 2 (each record checked by its CRC-32) and with its
    writes stopping the process when they fail (`fail_stop`). A journal of format 1 (written
    before 0.32.0) is read and appended to as it is, and becomes format 2 when it is next
    emptied (log compaction rewrites it from its first record). Its metadata (term, vote,
    commit index) goes to `<journal>.meta`."""

    def __init__(self, journalFile: str) -> None:
        self.path = journalFile
        try:
            super().__init__(journalFile)
        except OSError as error:
            fail_stop(journalFile, error)
        _check_meta(Path(journalFile + ".meta"))
        mapped = getattr(self, "_FileJournal__journalFile")  # noqa: B009 - name-mangled
        self.checked = struct.unpack("<I", mapped.read(FORMAT_OFFSET, 4))[0] == CHECKED_FORMAT
        if self.checked:
            # pysyncobj read each checksum as the start of its command (`repair_journal` has
            # checked them).
            entries = getattr(self, "_FileJournal__journal")  # noqa: B009 - name-mangled
            for position, (data, index, term) in enumerate(entries):
                command = bytes(data[4:])
                if int.from_bytes(data[:4], "little") != record_checksum(index, term, command):
                    raise JournalDamaged(
                        errno.EIO, f"{journalFile}: entry {index} does not match its checksum"
                    )
                entries[position] = (command, index, term)

    def _FileJournal__getDefaultHeader(self) -> bytes:
        header: bytes = getattr(PlainFileJournal, "_FileJournal__getDefaultHeader")(self)  # noqa: B009
        return header[:FORMAT_OFFSET] + struct.pack("<I", CHECKED_FORMAT) + header[36:]

    def add(self, command: Any, idx: int, term: int) -> None:
        try:
            if not self.checked:
                super().add(command, idx, term)
                return
            data = command if isinstance(command, bytes) else command.encode("utf-8")
            checksum = struct.pack("<I", record_checksum(idx, term, data))
            super().add(checksum + data, idx, term)
            # What pysyncobj keeps in memory is the command, not the record.
            getattr(self, "_FileJournal__journal")[-1] = (command, idx, term)  # noqa: B009
        except OSError as error:
            fail_stop(self.path, error)

    def clear(self) -> None:
        try:
            super().clear()
            if not self.checked:
                mapped = getattr(self, "_FileJournal__journalFile")  # noqa: B009 - name-mangled
                mapped.write(FORMAT_OFFSET, struct.pack("<I", CHECKED_FORMAT))
                self.checked = True
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
    _journal_module.FileJournal = CheckedJournal
