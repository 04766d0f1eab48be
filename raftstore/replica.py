"""The pysyncobj object that replicates xrcore's state machine.

It exposes exactly one replicated method, `apply_group`, which takes the bytes of a group of
encoded xrcore envelopes (group commit: commands that arrive together share one log entry) and
applies them in order. pysyncobj numbers replicated methods by sorted name, so a second replicated
method would be a wire-format change; there is none.

Snapshots go through xrcore's codec, never pickle: the snapshot file holds xrcore's snapshot bytes
and, beside them, pysyncobj's own log metadata (the last applied entries and the member set) in
pysyncobj's encoding, which is what pysyncobj itself would have written.

Durability (`RaftConfig.durability`): in "write" mode the journal is pysyncobj's own, written to
the page cache and never synced. In "fsync" mode the journal is a `DurableJournal` and every
message the replica sends waits in an `Outbox`: once per tick phase (before the tick, before the
poller waits, after it) the outbox syncs the journal if it changed, then sends what waited. So a
follower's appended entries are on disk before its answer leaves, the leader's own entries are on
disk before any follower can acknowledge them (and so before the leader counts itself in a commit
quorum), a member alone syncs before the tick that commits, and many entries share one sync.
Term and vote are written to disk (temporary file, fsync, rename, directory fsync) before the
call that changes them returns, so before any vote leaves.

Threads: every method here runs on the thread that ticks the replica (the event loop's, under
`RaftStore`), except `read`, which any thread may call; `state_lock` keeps a read from seeing a
group half applied.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import importlib
import logging
import math
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pysyncobj.syncobj as syncobj_module
from pysyncobj import SyncObj, SyncObjConf, SyncObjException, replicated
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import SyncObjExceptionWrongVer
from pysyncobj.transport import Transport

from raftstore import disk, entries, frames, messages, pickling
from raftstore.background_sync import HelperFailed, SyncRunner, SyncRunnerFactory
from raftstore.config import RaftConfig
from raftstore.files import fsync_directory, write_file_durably
from raftstore.guards import back_off_to_commit_index, keep_matching_entries
from raftstore.messages import PRE_VOTE, PRE_VOTE_RESPONSE
from xrcore import Applied, StateMachine
from xrcore.codec import ENVELOPE_VERSION, newer_version
from xrcore.errors import CodecError, InvalidArgument
from xrcore.limits import DEFAULT_LIMITS, ENVELOPE_BYTES_MAX, Limits

__all__ = [
    "GROUP_COMMANDS_MAX",
    "DurableJournal",
    "FileSync",
    "Outbox",
    "Replica",
    "check_snapshot_present",
    "decode_group",
    "decode_raft_snapshot",
    "encode_group",
    "encode_raft_snapshot",
    "journal_file_sync",
    "repair_journal",
    "seed_data_dir",
    "snapshot_members",
]

log = logging.getLogger(__name__)


class _OncePerMinute(logging.Filter):
    """Lets pysyncobj's message for an entry it stops at through once a minute: it logs it on
    every tick while this member waits to be upgraded (`Replica.halted`)."""

    def __init__(self) -> None:
        super().__init__()
        self._passed_s = -math.inf

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("request to switch to unsupported code version"):
            return True
        now_s = time.monotonic()
        if now_s - self._passed_s < 60.0:
            return False
        self._passed_s = now_s
        return True


logging.getLogger(syncobj_module.__name__).addFilter(_OncePerMinute())

# The mode of a Raft directory a member makes (an existing one is left as it is).
RAFT_DIR_MODE = 0o700
T = TypeVar("T")
# pysyncobj's journal module: its FileJournal is not in the stub (xr uses it only here).
_journal_module: Any = importlib.import_module("pysyncobj.journal")
# SyncObj's tick, which `Replica._onTick` wraps (not in the stub).
_sync_obj_on_tick: Callable[[Any, float], None] = getattr(SyncObj, "_onTick")  # noqa: B009
# SyncObj's apply of one committed entry, which `Replica._SyncObj__doApplyCommand` wraps.
_sync_obj_do_apply: Callable[[Any, bytes], Any] = getattr(SyncObj, "_SyncObj__doApplyCommand")  # noqa: B009


# A log entry holds at most this many commands; a group beyond it is malformed.
GROUP_COMMANDS_MAX = 4_096
SNAPSHOT_MAGIC = b"xr-raft-snapshot-1\n"


_group_encoder = msgspec.msgpack.Encoder()
_group_decoder = msgspec.msgpack.Decoder(list[bytes])


def encode_group(entries: list[bytes]) -> bytes:
    return _group_encoder.encode(entries)


def decode_group(data: Any) -> list[bytes]:
    """The encoded envelopes of a group; `CodecError` if it is not a list of byte strings (or
    not bytes at all: a forged log entry may carry any pickled value)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"a command group is bytes, not {type(data).__name__}")
    try:
        entries = _group_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CodecError(f"malformed command group: {error}") from None
    if len(entries) > GROUP_COMMANDS_MAX:
        raise CodecError(f"a group holds at most {GROUP_COMMANDS_MAX} commands")
    if any(len(entry) > ENVELOPE_BYTES_MAX for entry in entries):
        raise CodecError(f"a command in a group is over {ENVELOPE_BYTES_MAX} bytes")
    return entries


class _IncomingSnapshot:
    """The start of the snapshot a leader is streaming to this replica: enough of it to read
    the raft entry it ends at, which `_write_snapshot` puts in its header."""

    # A header larger than this (two log entries of the largest groups) is not read.
    PREFIX_BYTES_MAX = 4 * (1 << 20)

    def __init__(self) -> None:
        self.prefix = bytearray()

    def add(self, data: bytes, *, first: bool) -> None:
        if first:
            self.prefix = bytearray()
        if len(self.prefix) < self.PREFIX_BYTES_MAX:
            self.prefix += data[: self.PREFIX_BYTES_MAX - len(self.prefix)]

    def last_entry(self) -> tuple[int, int] | None:
        """The raft index and term of the last entry the snapshot holds; None if they cannot be
        read."""
        prefix = bytes(self.prefix)
        self.prefix = bytearray()
        offset = len(SNAPSHOT_MAGIC)
        if not prefix.startswith(SNAPSHOT_MAGIC) or len(prefix) < offset + 8:
            return None
        size = int.from_bytes(prefix[offset : offset + 8], "big")
        if len(prefix) < offset + 8 + size:
            return None
        try:
            meta = pickling.loads(prefix[offset + 8 : offset + 8 + size])
            return int(meta[0][1]), int(meta[0][2])
        except Exception:
            return None


# Durability.

FileSync = Callable[[int], None]
# The journal's sync where a replica is given none: fdatasync, as etcd's WAL (the file's size is
# data for fdatasync, so a grown journal is covered).
journal_file_sync: FileSync = os.fdatasync
# pysyncobj's journal layout (`raftstore.disk`): a 40-byte header whose last 4 bytes are the end of
# the last record, then records of (4-byte size, 8-byte index, 8-byte term, command, 4-byte size).
_JOURNAL_HEADER_BYTES = 40
_JOURNAL_END_OFFSET = 36


def repair_journal(path: Path) -> int:
    """Cuts a torn tail off a pysyncobj journal file; returns the bytes cut (0 if intact).

    The journal is a memory map the kernel writes back page by page in any order, so after a power
    loss the header's end offset can point past records that never reached the disk; pysyncobj
    would then fail to start (or read garbage). A record is kept while its two size fields agree,
    its index follows the previous one and, in a journal of format 2, its checksum matches. Only
    entries written after the last sync can be torn, and in "fsync" mode none of those was
    acknowledged. A record that fails its checksum before the journal's last record, which
    passes, is not a torn tail but a damaged disk: `disk.JournalDamaged`, and nothing is cut."""
    if not path.exists():
        return 0
    with path.open("r+b") as file:
        data = file.read()
        if len(data) < _JOURNAL_HEADER_BYTES:
            return 0
        checked = struct.unpack_from("<I", data, disk.FORMAT_OFFSET)[0] == disk.CHECKED_FORMAT
        end = int(struct.unpack_from("<I", data, _JOURNAL_END_OFFSET)[0])
        offset = _JOURNAL_HEADER_BYTES
        previous_index: int | None = None
        limit = min(end, len(data))
        while offset < end:
            record = _record_at(data, offset, limit, checked)
            if record is None:
                break
            index, size = record
            if previous_index is not None and index != previous_index + 1:
                break
            previous_index = index
            offset += size + 8
        if offset >= end:
            return 0
        if checked:
            _refuse_damage_before_the_last_record(path, data, offset, limit)
        file.seek(_JOURNAL_END_OFFSET)
        file.write(struct.pack("<I", offset))
        file.flush()
        os.fsync(file.fileno())
    log.warning(
        "journal %s had a torn tail: cut %d bytes after offset %d", path, end - offset, offset
    )
    return end - offset


def check_snapshot_present(config: RaftConfig) -> None:
    """Refuses (`disk.JournalDamaged`) a data directory whose journal starts past its first
    entry with no snapshot beside it: the entries before were compacted into the snapshot, and
    without it the member applied nothing and served an empty state, while voting and
    acknowledging appends (the disk QA pass of session 32, a snapshot moved away)."""
    path = config.journal_file
    if config.snapshot_file.exists() or not path.exists():
        return
    with path.open("rb") as file:
        head = file.read(_JOURNAL_HEADER_BYTES + 12)
    if len(head) < _JOURNAL_HEADER_BYTES + 12:
        return
    end = struct.unpack_from("<I", head, _JOURNAL_END_OFFSET)[0]
    first = struct.unpack_from("<Q", head, _JOURNAL_HEADER_BYTES + 4)[0]
    if end > _JOURNAL_HEADER_BYTES and first > 1:
        raise disk.JournalDamaged(
            errno.ENOENT,
            f"{config.snapshot_file} is missing, but the journal {path} starts at entry {first}: "
            "the entries before it are only in the snapshot. Put the snapshot back, or move the "
            "data directory aside and start the node again to take the others' state "
            "(docs/operations.md, resync)",
        )


def _record_at(data: bytes, offset: int, limit: int, checked: bool) -> tuple[int, int] | None:
    """The index and size of the record at `offset`, if its sizes agree, it ends by `limit` and
    (`checked`) its checksum matches; else None."""
    if offset + 4 > limit:
        return None
    size = struct.unpack_from("<I", data, offset)[0]
    if size < (20 if checked else 16) or offset + 8 + size > limit:
        return None
    if struct.unpack_from("<I", data, offset + 4 + size)[0] != size:
        return None
    index, term = struct.unpack_from("<QQ", data, offset + 4)
    if checked:
        stored = struct.unpack_from("<I", data, offset + 20)[0]
        command = data[offset + 24 : offset + 4 + size]
        if stored != disk.record_checksum(index, term, command):
            return None
    return int(index), int(size)


def _refuse_damage_before_the_last_record(
    path: Path, data: bytes, bad_offset: int, limit: int
) -> None:
    """Raises `disk.JournalDamaged` if the journal's last record (found from its end, by its
    trailing size) lies after `bad_offset` and passes its checks: a torn tail has no good
    record after its first bad one."""
    if limit - 4 < bad_offset:
        return
    size = struct.unpack_from("<I", data, limit - 4)[0]
    last = limit - 8 - size
    if last <= bad_offset or _record_at(data, last, limit, checked=True) is None:
        return
    index = struct.unpack_from("<Q", data, bad_offset + 4)[0] if bad_offset + 12 <= limit else None
    raise disk.JournalDamaged(
        errno.EIO,
        f"{path} is damaged: the record at offset {bad_offset} (entry {index}, as far as it "
        "can be read) is not what was written, and records after it are intact, so this is not "
        "a torn tail: the disk returned other bytes. This member's log cannot be trusted: move "
        "its data directory aside and start it again to take the others' state "
        "(docs/operations.md, resync), and check the disk",
    )


class _DurableMetaStorer:
    """pysyncobj's MetaStorer (term, vote, commit index), writing its file durably."""

    def __init__(self, path: str) -> None:
        self._path = path

    def getMeta(self) -> Any:
        try:
            return pickling.loads(Path(self._path).read_bytes())
        except Exception:
            return {}

    def storeMeta(self, meta: Any) -> None:
        write_file_durably(Path(self._path), pickling.dumps(meta))

    def getPath(self) -> str:
        return self._path


class DurableJournal:
    """pysyncobj's FileJournal, synced to disk when `sync` is called (the `Outbox` calls it).

    Every change marks it dirty; `sync` msyncs the map and syncs the file once for all changes
    since the last sync. Term and vote (the meta file) are written durably at once. Log compaction
    (`deleteEntriesTo`) writes the kept entries to a new file and renames it over the journal,
    rather than rewriting the journal in place as pysyncobj does, so a crash in the middle cannot
    lose entries the snapshot does not hold."""

    # A sync that takes longer than this is logged: the event loop, heartbeats included, waited
    # for it, and at the minimum election timeout (0.4 s) followers may elect another leader.
    SLOW_SYNC_S = 0.1
    # At most one warning per this many seconds, counting the slow syncs since the last one.
    SLOW_SYNC_WARNING_INTERVAL_S = 10.0
    # The weight of each sync's time in `recent_sync_s`, a moving average: a stall of 0.1 s lifts
    # it to 20 ms at once, and about 15 syncs of a fast disk bring it back under a millisecond.
    RECENT_SYNC_WEIGHT = 0.2

    def __init__(
        self,
        path: Path,
        *,
        file_sync: FileSync = os.fdatasync,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._file_sync = file_sync
        self._clock = clock
        self._inner = self._open()
        # Every change to the log counts up `version`; `synced_version` is the version on disk
        # (unknown at first: pysyncobj may have just created the file and written its first entry).
        self.version = 1
        self.synced_version = 0
        self._directory_synced = False
        # For tests and status: how many syncs, and the raft index and term on disk after the last.
        self.syncs = 0
        self.synced_index = 0
        self.synced_term = self._inner.getCurrentTerm()
        # A sync in progress off the loop (`begin_sync`): the version, index and term it covers.
        self._syncing: tuple[int, int, int] | None = None
        self._syncing_since_s = 0.0
        # For status and metrics: seconds spent in file syncs, the longest, and how many took
        # over SLOW_SYNC_S.
        self.sync_s_total = 0.0
        self.sync_s_max = 0.0
        # The disk's recent sync time (an exponentially weighted mean of in-line and off-loop
        # syncs; `Outbox` chooses between the two by it), and how many syncs ran off the loop.
        self.recent_sync_s = 0.0
        self.syncs_off_loop = 0
        self.slow_syncs = 0
        self._slow_unreported = 0
        self._slow_warned_s = float("-inf")

    def _open(self) -> Any:
        inner = disk.CheckedJournal(str(self.path))
        storer = _DurableMetaStorer(str(self.path) + ".meta")
        setattr(inner, "_FileJournal__metaStorer", storer)  # noqa: B010 - name-mangled
        return inner

    @property
    def dirty(self) -> bool:
        """Whether the log changed since the last sync."""
        return self.version != self.synced_version

    def claim_synced(self) -> None:
        """Treats everything as on disk without a sync, and counts none: only for the benchmark's
        stand-ins for the sync (`bench/raft_messages.py --sync-stand-in`)."""
        self.synced_version = self.version
        self.synced_index = self._last_index()

    def sync(self) -> None:
        """Syncs the file now, on the calling thread, if the log changed since the last sync."""
        if not self.dirty:
            return
        mapped = getattr(self._inner, "_FileJournal__journalFile")  # noqa: B009 - name-mangled
        if sys.platform != "linux":
            # Linux's fdatasync writes the pages dirtied through the shared map too (msync's
            # MS_SYNC is the same range sync there); elsewhere msync first.
            getattr(mapped, "_ResizableFile__mm").flush()  # noqa: B009
        covers = (self.version, self._last_index(), self._inner.getCurrentTerm())
        started_s = self._clock()
        try:
            self._file_sync(self.descriptor())
        except OSError as error:
            disk.fail_stop(self.path, error)
        self._timed(self._clock() - started_s)
        self._sync_directory_once()
        self._synced(*covers)

    def begin_sync(self) -> int:
        """Notes what a sync started now covers and returns the descriptor to sync (off the
        loop, Linux only: the sync must also write the pages dirtied through the map). The
        caller reports its end with `end_sync`."""
        self._sync_directory_once()
        self._syncing = (self.version, self._last_index(), self._inner.getCurrentTerm())
        self._syncing_since_s = self._clock()
        return self.descriptor()

    @property
    def syncing(self) -> bool:
        """Whether a sync started by `begin_sync` has not ended yet."""
        return self._syncing is not None

    def end_sync(self, synced: bool, took_s: float | None = None) -> None:
        """The sync `begin_sync` started ended: if `synced`, what it covers is on disk. `took_s`
        is the sync's own time where the runner measured it (else the time since it began)."""
        covers, self._syncing = self._syncing, None
        if covers is None:
            return
        if took_s is None:
            took_s = self._clock() - self._syncing_since_s
        self._timed(took_s, in_line=False)
        if synced:
            self.syncs_off_loop += 1
            self._synced(*covers)

    def descriptor(self) -> int:
        mapped = getattr(self._inner, "_FileJournal__journalFile")  # noqa: B009 - name-mangled
        return int(getattr(mapped, "_ResizableFile__f").fileno())  # noqa: B009

    def _sync_directory_once(self) -> None:
        # The journal's name (pysyncobj may have just created the file) is on disk before any
        # sync of its content counts.
        if not self._directory_synced:
            fsync_directory(self.path.parent)
            self._directory_synced = True

    def _last_index(self) -> int:
        return int(self._inner[-1][1]) if len(self._inner) else 0

    def _synced(self, version: int, index: int, term: int) -> None:
        """What a finished sync covers is on disk. Syncs may end out of order (one in line while
        one runs off the loop), so nothing here goes back."""
        self.syncs += 1
        if version <= self.synced_version:
            return
        self.synced_version = version
        self.synced_index = index
        self.synced_term = max(self.synced_term, term)

    def _timed(self, took_s: float, *, in_line: bool = True) -> None:
        self.recent_sync_s += self.RECENT_SYNC_WEIGHT * (took_s - self.recent_sync_s)
        self.sync_s_total += took_s
        self.sync_s_max = max(self.sync_s_max, took_s)
        if took_s <= self.SLOW_SYNC_S:
            return
        self.slow_syncs += 1
        self._slow_unreported += 1
        now_s = self._clock()
        if now_s - self._slow_warned_s >= self.SLOW_SYNC_WARNING_INTERVAL_S:
            log.warning(
                "journal sync took %.3f s (%d sync(s) over %.1f s since the last warning): %s "
                "(a slow or overloaded disk)",
                took_s,
                self._slow_unreported,
                self.SLOW_SYNC_S,
                "the node waited, heartbeats included; near the election timeout followers may "
                "elect another leader"
                if in_line
                else "acknowledgements waited for it (off the event loop: heartbeats did not)",
            )
            self._slow_unreported = 0
            self._slow_warned_s = now_s

    # pysyncobj's Journal interface (its names).

    def add(self, command: bytes, idx: int, term: int) -> None:
        self._inner.add(command, idx, term)
        self.version += 1

    def clear(self) -> None:
        self._inner.clear()
        self._truncated(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        # pysyncobj's argument is a position in the journal, not a raft index.
        first = int(self._inner[entryFrom][1]) if entryFrom < len(self._inner) else None
        self._inner.deleteEntriesFrom(entryFrom)
        if first is not None:
            self._truncated(first - 1)
        else:
            self.version += 1

    def _truncated(self, kept_index: int) -> None:
        """Entries after `kept_index` were removed: a sync of the file from before no longer
        covers the entries that will take their indexes, and neither does one in progress."""
        self.version += 1
        self.synced_index = min(self.synced_index, kept_index)
        if self._syncing is not None:
            version, index, term = self._syncing
            self._syncing = (version, min(index, kept_index), term)

    def deleteEntriesTo(self, entryTo: int) -> None:
        try:
            self._compact(entryTo)
        except OSError as error:
            disk.fail_stop(self.path, error)

    def _compact(self, entryTo: int) -> None:
        # pysyncobj renamed the new snapshot into place without a directory sync: the log may
        # lose what the snapshot holds only once the snapshot is surely the file on disk.
        fsync_directory(self.path.parent)
        kept = [self._inner[position] for position in range(entryTo, len(self._inner))]
        temporary = self.path.with_name(self.path.name + ".compact")
        temporary.unlink(missing_ok=True)
        fresh = disk.CheckedJournal(str(temporary))
        for entry in kept:
            fresh.add(*entry)
        fresh._destroy()
        with temporary.open("rb") as file:
            os.fsync(file.fileno())
        self._inner.onOneSecondTimer()
        self._inner._destroy()
        os.replace(temporary, self.path)
        fsync_directory(self.path.parent)
        self._inner = self._open()
        # Everything is on disk; a sync in progress covers the old file and now counts for less.
        self._synced(self.version, self._last_index(), self._inner.getCurrentTerm())

    def __getitem__(self, item: Any) -> Any:
        return self._inner[item]

    def __len__(self) -> int:
        return len(self._inner)

    def _destroy(self) -> None:
        self._inner._destroy()

    def flush(self) -> None:
        self._inner.flush()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._inner.setRaftCommitIndex(raftCommitIndex)

    def getRaftCommitIndex(self) -> int:
        return int(self._inner.getRaftCommitIndex())

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        self._inner.setCurrentTerm(term, votedForNodeId)
        self.synced_term = term

    def getCurrentTerm(self) -> int:
        return int(self._inner.getCurrentTerm())

    def getVotedForNodeId(self) -> Any:
        return self._inner.getVotedForNodeId()

    def onOneSecondTimer(self) -> None:
        self._inner.onOneSecondTimer()


class Outbox:
    """Holds the messages a replica sends until the journal is on disk.

    Each message is tagged with the journal's version when it was sent. In line (the default),
    `flush` sends the leading run of leader messages, syncs the journal (if it changed) and then
    sends, in order, everything else that waited. With a `SyncRunner` (`run_syncs_with`), `flush`
    starts a sync off the loop instead and returns; when it ends, the messages it covers leave.
    Either way messages leave in the order they were sent, and a message that must wait for the
    sync leaves only once a sync that began after it was sent has ended. Any thread may `send`;
    the ticking thread flushes."""

    def __init__(self, journal: DurableJournal, send: Callable[[Any, Any], Any]) -> None:
        self.journal = journal
        self._send = send
        self._lock = threading.Lock()
        self._messages: collections.deque[tuple[Any, Any, int]] = collections.deque()
        self._runner: SyncRunner | None = None
        # With a runner: a sync still runs in line while the disk's recent syncs took less than
        # this (`raft.background_sync_min_ms`), and no sync runs off the loop.
        self.in_line_below_s = 0.0
        # Called on the loop after each sync off the loop ends (the replica's commit may move).
        self.after_sync: Callable[[], None] = lambda: None

    def send(self, node: Any, message: Any) -> bool:
        with self._lock:
            self._messages.append((node, message, self.journal.version))
        return True

    # What a leader sends: its entries may leave before they are on its own disk (Raft thesis,
    # 10.2.1: the leader writes its log in parallel with replicating it), since the leader counts
    # itself toward a commit only once they are (in line: on a later tick, after the sync; off
    # the loop: `Replica._commit_cap`).
    _BEFORE_SYNC = frozenset({"append_entries", "apply_command_response"})

    @classmethod
    def _may_leave_before_sync(cls, message: Any) -> bool:
        return isinstance(message, dict) and message.get("type") in cls._BEFORE_SYNC

    def take(self) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """Every waiting message, split into the leading run of leader messages (which may leave
        before the sync) and the rest (which must wait for it)."""
        with self._lock:
            messages = [(node, message) for node, message, _ in self._messages]
            self._messages.clear()
        early = 0
        while early < len(messages) and self._may_leave_before_sync(messages[early][1]):
            early += 1
        return messages[:early], messages[early:]

    @property
    def in_background(self) -> bool:
        return self._runner is not None

    def run_syncs_with(self, runner: SyncRunner | None) -> None:
        """Syncs off the loop with `runner` from now on (None: in line again)."""
        if self._runner is not None:
            self._runner.close()
            self.journal.end_sync(synced=False)
        self._runner = runner

    def flush(self) -> None:
        if self._syncs_in_line():
            # The leading run of leader messages goes out at once, then the sync overlaps with
            # the network round trip and the followers' own syncs; the rest (answers, votes)
            # waits.
            early, rest = self.take()
            for node, message in early:
                self._send(node, message)
            self.journal.sync()
            for node, message in rest:
                self._send(node, message)
            return
        self._release()
        self._start_sync()

    def _syncs_in_line(self) -> bool:
        """Whether the next sync runs in line: without a runner, or while the disk is fast (its
        recent syncs took less than `in_line_below_s`) and no sync runs off the loop. A fast
        sync in line costs less than the helper's round trip, and a slow one would stop the
        loop, heartbeats included, for longer than the round trip costs."""
        journal = self.journal
        return self._runner is None or (
            not journal.syncing and journal.recent_sync_s < self.in_line_below_s
        )

    def on_synced(self, error: OSError | None, took_s: float) -> None:
        """The runner's report (on the loop): the sync in progress ended, after `took_s`."""
        self.journal.end_sync(synced=error is None, took_s=took_s)
        if error is not None and not isinstance(error, HelperFailed):
            # The disk refused the sync; the runner failing is `HelperFailed`.
            disk.fail_stop(self.journal.path, error)
        if error is not None:
            # In line from now on: the next flush syncs on the loop, and fails there as a sync
            # in line would (the messages keep waiting).
            log.error("journal sync off the loop failed (%s): syncing in line from now on", error)
            self._runner = None
        else:
            # What the sync covers leaves; what changed since is synced, in line or off.
            self.flush()
        self.after_sync()

    def _start_sync(self) -> None:
        runner = self._runner
        journal = self.journal
        if runner is not None and journal.dirty and not journal.syncing:
            runner.start(journal.begin_sync())

    def _release(self) -> None:
        """Sends, in order, the messages that may leave now."""
        synced = self.journal.synced_version
        may_leave = self._may_leave_before_sync
        while True:
            with self._lock:
                if not self._messages:
                    return
                node, message, version = self._messages[0]
                if version > synced and not may_leave(message):
                    return
                self._messages.popleft()
            self._send(node, message)


class _CappedIndexes:
    """pysyncobj's match indexes (follower -> highest index known to match) as it reads them
    while the commit is capped: no index above the cap; writes go to the real ones."""

    def __init__(self, real: dict[Any, int], cap: int) -> None:
        self._real = real
        self._cap = cap

    def __getitem__(self, node: Any) -> int:
        return min(self._real[node], self._cap)

    def get(self, node: Any, default: int = 0) -> int:
        return min(self._real.get(node, default), self._cap)

    def __setitem__(self, node: Any, index: int) -> None:
        self._real[node] = index

    def pop(self, node: Any, default: Any = None) -> Any:
        return self._real.pop(node, default)

    def items(self) -> Any:
        return self._real.items()


def _probe_bind(address: str) -> None:
    """Raises the OSError binding `address` (host:port) meets, as pysyncobj's own bind would
    (SO_REUSEADDR), naming the address: pysyncobj drops the reason."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
            probe.listen()
        except OSError as error:
            raise OSError(
                error.errno, f"cannot listen for Raft on {address}: {error.strerror}"
            ) from None
        except ValueError as error:
            raise OSError(f"cannot listen for Raft on {address}: {error}") from None


class Replica(SyncObj):
    """One member of the Raft group, holding one `StateMachine`."""

    def __init__(
        self,
        config: RaftConfig,
        *,
        limits: Limits = DEFAULT_LIMITS,
        transport: Transport | None = None,
        on_applied: Callable[[list[Applied]], None] | None = None,
        file_sync: FileSync | None = None,
        poller: Any | None = None,
    ) -> None:
        """`file_sync` syncs the journal's file descriptor in "fsync" mode; by default
        `journal_file_sync` (tests replace either to count or observe syncs). `poller` replaces
        pysyncobj's own (`raftstore.loop_poller.LoopPoller` runs it on an event loop)."""
        # Set before SyncObj.__init__, which may load a snapshot and replay the journal.
        self.machine = StateMachine(limits)
        # Committed entries this replica could not decode (`_undecodable`), counted from the
        # journal's replay on.
        self.undecodable_entries = 0
        self._undecodable_logged_s = -math.inf
        # Why this replica stopped applying the log (`_halt`), or None while it applies it.
        self.halted: str | None = None
        self._halted_logged_s = -math.inf
        self._snapshot_failure_logged_s = -math.inf
        self.state_lock = threading.Lock()
        self.on_applied = on_applied
        self.durable = config.durability == "fsync"
        # Mode 0700 when made here, whatever the umask: the journal and the snapshot hold every
        # tenant's keys and jobs (pysyncobj makes its files with the umask's mode).
        config.data_dir.mkdir(mode=RAFT_DIR_MODE, parents=True, exist_ok=True)
        repair_journal(config.journal_file)
        check_snapshot_present(config)
        # Listen where this node says it is, not on every interface.
        bind_address = config.bind_address or config.self_address
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            journalFile=str(config.journal_file),
            fullDumpFile=str(config.snapshot_file),
            serializer=self._write_snapshot,
            deserializer=self._read_snapshot,
            password=config.cluster_secret,
            raftMinTimeout=config.raft_min_timeout_s,
            raftMaxTimeout=config.raft_max_timeout_s,
            appendEntriesPeriod=config.append_entries_period_s,
            leaderFallbackTimeout=config.leader_fallback_timeout_s,
            connectionTimeout=config.connection_timeout_s,
            connectionRetryTime=config.connection_retry_time_s,
            commandsQueueSize=config.commands_queue_size,
            appendEntriesBatchSizeBytes=config.append_entries_batch_bytes,
            logCompactionMinEntries=config.log_compaction_min_entries,
            logCompactionMinTime=config.log_compaction_min_time_s,
            logCompactionSplit=False,
            commandsWaitLeader=True,
            dynamicMembershipChange=True,
            useFork=False,
            bindAddress=bind_address,
            # pysyncobj's default (0) retries a failed bind forever, and with autoTick off its
            # constructor spins on it: one attempt, after the probe below.
            maxBindRetries=1,
        )
        if transport is None:
            _probe_bind(bind_address)
        # Strangers on the Raft port may not announce frames bigger than a handshake, nor
        # identify themselves as anything but a member; and nothing a peer sends runs code.
        frames.install()
        pickling.install()
        disk.install()
        # pysyncobj makes its poller in its constructor through a module function, and hands it
        # to its transport there: the only way in is to stand in for that function meanwhile.
        create_poller = syncobj_module.createPoller
        if poller is not None:
            syncobj_module.createPoller = lambda pollerType: poller
        try:
            super().__init__(
                config.self_address,
                list(config.peers),
                conf,
                transport=transport,
            )
        except SyncObjException as error:
            # The port was taken between the probe and pysyncobj's bind.
            raise OSError(f"cannot listen for Raft on {bind_address}: {error}") from None
        finally:
            syncobj_module.createPoller = create_poller
        if poller is not None:
            # pysyncobj writes to its wake-up pipe on every proposal to end the poller's wait; a
            # loop-driven replica is ticked by its owner after proposing instead.
            notifier = getattr(self, "_SyncObj__pipeNotifier", None)
            if notifier is not None:
                notifier.notify = lambda: None
        self._incoming_snapshot = _IncomingSnapshot()
        # Pre-vote: the round in progress (the term it asks for, who said yes), the term a round
        # won, when a leader was last heard from, and how many rounds this member started.
        self._pre_vote_enabled = config.pre_vote
        self._min_election_timeout_s = config.raft_min_timeout_s
        self._pre_vote_term = 0
        self._pre_vote_granted: set[Any] = set()
        self._pre_vote_won_term = 0
        self._leader_heard_s = float("-inf")
        self._lower_term_leader_heard_s = float("-inf")
        self.pre_vote_rounds = 0
        self._guard_append_entries()
        # Commit notices (see `_SyncObj__applyLogEntries`): when the held-back notice is due
        # (pysyncobj's monotonic clock, 0.0 if none is held back), and the log indexes of
        # commands that followers forwarded and wait on.
        self._commit_notice_delay_s = config.commit_notice_delay_s
        self._commit_notice_due_s = 0.0
        self._forwarded_indexes: collections.deque[int] = collections.deque()
        self._watch_sends()
        self.journal: DurableJournal | None = None
        self.outbox: Outbox | None = None
        # Ticks in which the leader's commit was capped at what its own disk holds (status).
        self.commits_held_for_own_sync = 0
        self._commit_held = False
        if self.durable:
            self._make_durable(config, file_sync or journal_file_sync)

    def _make_durable(self, config: RaftConfig, file_sync: FileSync) -> None:
        """Swaps pysyncobj's journal for a `DurableJournal` on the same file (nothing has been
        sent yet: no tick has run) and routes every message through an `Outbox`."""
        getattr(self, "_SyncObj__raftLog")._destroy()  # noqa: B009 - name-mangled
        self.journal = DurableJournal(config.journal_file, file_sync=file_sync)
        setattr(self, "_SyncObj__raftLog", self.journal)  # noqa: B010 - name-mangled
        transport: Any = getattr(self, "_SyncObj__transport")  # noqa: B009 - name-mangled
        self.outbox = Outbox(self.journal, transport.send)
        transport.send = self.outbox.send
        # Before the poller waits: what this tick appended and sent goes out after one sync.
        getattr(self, "addOnTickCallback")(self.outbox.flush)  # noqa: B009 - not in the stub

    # Commit notices. pysyncobj's leader (batching off) sends every follower an append_entries
    # message as soon as it has applied newly committed entries, only to carry the commit index,
    # and each follower answers it. The next entries carry the commit index anyway, so the leader
    # holds the notice back for up to `commit_notice_delay_s`: at one write in flight the next
    # write's entries carry it, and the messages per write are halved. Safety does not depend on
    # when followers learn of a commit; a follower that forwarded a command waits to apply it, so
    # such commits are announced at once.

    # Overrides SyncObj's private (name-mangled) method: SyncObj's `self.__applyLogEntries()`
    # finds this one.
    def _SyncObj__applyLogEntries(self) -> bool:
        applied: bool = getattr(SyncObj, "_SyncObj__applyLogEntries")(self)  # noqa: B009
        if not self._isLeader():
            # Indexes forwarded to an earlier term of this member's leadership: no longer awaited.
            self._forwarded_indexes.clear()
            return applied
        if not applied:
            return applied
        commit_index: int = getattr(self, "_SyncObj__raftCommitIndex")  # noqa: B009
        forwarded = self._forwarded_indexes
        awaited = False
        while forwarded and forwarded[0] <= commit_index:
            forwarded.popleft()
            awaited = True
        if awaited:
            return True
        if not self._commit_notice_due_s:
            self._commit_notice_due_s = syncobj_module.monotonicTime() + self._commit_notice_delay_s
        return False

    # Overrides SyncObj's private method, as above.
    def _SyncObj__sendAppendEntries(self) -> None:
        # Every follower gets a message holding the commit index: nothing is held back anymore.
        self._commit_notice_due_s = 0.0
        getattr(SyncObj, "_SyncObj__sendAppendEntries")(self)  # noqa: B009

    def _send_due_commit_notice(self) -> None:
        due_s = self._commit_notice_due_s
        if due_s and syncobj_module.monotonicTime() >= due_s:
            if self._isLeader():
                self._SyncObj__sendAppendEntries()
            self._commit_notice_due_s = 0.0

    def tick_wait_s(self, wait_s: float) -> float:
        """How long the next tick may wait for messages: at most `wait_s`, less while a held-back
        commit notice is due sooner."""
        due_s = self._commit_notice_due_s
        if not due_s:
            return wait_s
        return max(0.0, min(wait_s, due_s - syncobj_module.monotonicTime()))

    def _watch_sends(self) -> None:
        """One wrapper around every message this replica sends (a hot path):
        - a follower's `next_node_idx` rejection backs off to its commit index
          (`guards.back_off_to_commit_index`, pysyncobj's liveness bug 4 in docs/raftstore.md);
        - the leader notes the log index of every command a follower forwarded: it answers it
          with an `apply_command_response` naming the index, and the follower then waits to
          apply it, so that commit is announced at once."""
        transport: Any = getattr(self, "_SyncObj__transport")  # noqa: B009 - name-mangled
        send = transport.send
        forwarded = self._forwarded_indexes

        def send_watched(node: Any, message: Any) -> bool:
            if isinstance(message, dict):
                kind = message.get("type")
                if kind == "next_node_idx":
                    message = back_off_to_commit_index(self, message)
                elif kind == "apply_command_response" and isinstance(message.get("log_idx"), int):
                    forwarded.append(message["log_idx"])
            return bool(send(node, message))

        transport.send = send_watched

    def _onTick(self, timeToWait: float = 0.0) -> None:
        self._send_due_commit_notice()
        outbox = self.outbox
        if outbox is None:
            _sync_obj_on_tick(self, timeToWait)
            return
        # Before: answers to messages that arrived outside a tick, and whatever a member alone
        # appended, are on disk (in line), or on their way to it (off the loop), before this
        # tick commits or applies anything.
        outbox.flush()
        cap = self._commit_cap(outbox) if outbox.in_background else None
        if cap is None:
            _sync_obj_on_tick(self, timeToWait)
        else:
            # pysyncobj reads the followers' match indexes only to compute the commit, and (with
            # the loop's poller) receives no message inside a tick, so capping what it reads for
            # the tick caps the commit; what it writes goes to the real indexes.
            self.commits_held_for_own_sync += 1
            self._commit_held = True
            real = getattr(self, "_SyncObj__raftMatchIndex")  # noqa: B009 - name-mangled
            setattr(self, "_SyncObj__raftMatchIndex", _CappedIndexes(real, cap))  # noqa: B010
            try:
                _sync_obj_on_tick(self, timeToWait)
            finally:
                setattr(self, "_SyncObj__raftMatchIndex", real)  # noqa: B010
        # After: the answers to what the poller received are sent after one sync.
        outbox.flush()

    def sync_off_the_loop(
        self,
        runner: SyncRunnerFactory | None,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        tick_soon: Callable[[], None] = lambda: None,
        in_line_below_s: float = 0.0,
    ) -> None:
        """In "fsync" mode on Linux, syncs the journal with a `SyncRunner` made by `runner` on
        `loop` from now on, so the loop goes on while the disk works, except while the disk's
        recent syncs took less than `in_line_below_s` (those run in line); `tick_soon` asks for
        a tick when a sync ends after the leader held a commit back for it. None: in line
        again."""
        outbox = self.outbox
        if outbox is None or (runner is not None and sys.platform != "linux"):
            return
        if runner is None or loop is None:
            outbox.run_syncs_with(None)
            outbox.after_sync = lambda: None
            return
        try:
            made = runner(loop, outbox.on_synced)
        except OSError as error:
            log.warning("cannot sync the journal off the event loop (%s): syncing in line", error)
            return
        outbox.run_syncs_with(made)
        outbox.in_line_below_s = in_line_below_s

        def after_sync() -> None:
            # Only a commit held back for the leader's own sync may move now.
            if self._commit_held:
                self._commit_held = False
                tick_soon()

        outbox.after_sync = after_sync

    def _commit_cap(self, outbox: Outbox) -> int | None:
        """The highest index the leader may commit in this tick, where pysyncobj would commit
        more; None if it would not.

        pysyncobj's leader counts itself toward a commit of every entry it holds. Off the loop
        its newest entries may not be on its disk yet while followers that answered for them
        have them on theirs: it may count itself only up to what it synced. (In line the sync
        ends each tick phase, before any answer to what it sent can arrive.) The commit is then
        the highest index held by a majority counting the leader only up to its synced index:
        with `needed` followers besides itself, the `needed`-th highest follower match capped at
        what it synced, or the match of the next follower, which makes a majority without it."""
        if not self._isLeader():
            return None
        journal = outbox.journal
        synced = journal.synced_index
        last_index: int = getattr(self, "_SyncObj__getCurrentLogIndex")()  # noqa: B009
        if synced >= last_index:
            return None
        others = getattr(self, "_SyncObj__otherNodes")  # noqa: B009 - name-mangled
        if not others:
            # A member alone commits whatever it holds: sync in line.
            journal.sync()
            return None
        match_index = getattr(self, "_SyncObj__raftMatchIndex")  # noqa: B009 - name-mangled
        # pysyncobj commits once 1 (itself) + followers > members / 2.
        needed = (len(others) + 1) // 2
        matches = sorted((match_index.get(node, 0) for node in others), reverse=True)
        with_itself = matches[needed - 1]
        without_itself = matches[needed] if len(matches) > needed else 0
        cap = max(min(synced, with_itself), without_itself)
        return cap if cap < with_itself else None

    # Pre-vote (`RaftConfig.pre_vote`). pysyncobj campaigns in its tick once its election
    # deadline has passed: it raises its term, and any member that hears the higher term, a
    # healthy leader included, steps down. Its check is `deadline < now and
    # __connectedToAnyone()`, and `__connectedToAnyone` is called nowhere else, so overriding it
    # puts the gate exactly where pysyncobj is about to campaign. There a member that has not won
    # a pre-vote round starts one instead: it asks the others whether they would vote for it in
    # the next term and puts its deadline off by a new election timeout. The others answer
    # without changing any state: yes if its log is at least as up to date as theirs and they
    # have not heard from a leader within the minimum election timeout (a leader always says
    # no), and with their term, which a member behind it takes. Once a majority, itself
    # included, said yes, its deadline is set to now, and the next tick campaigns. A leadership
    # transfer (`timeout_now`) campaigns at once, as in etcd.

    # Tests turn it off to show the member stranded without it.
    campaign_over_lower_term_leader = True
    # A refused round's answer carries the voter's term, and a member behind it takes it, as
    # etcd's pre-candidate does (`_on_pre_vote_response`). Tests turn it off to show the
    # deadlock without it.
    take_term_from_refusal = True

    def _SyncObj__connectedToAnyone(self) -> bool:
        if self.halted is not None:
            # It could lead nowhere: it proposes nothing while it waits to be upgraded. It still
            # votes for the others.
            return False
        connected = bool(getattr(SyncObj, "_SyncObj__connectedToAnyone")(self))  # noqa: B009
        if not connected or not self._pre_vote_enabled:
            return connected
        return self._may_campaign()

    def _may_campaign(self) -> bool:
        """Whether pysyncobj, about to campaign, may; if not, a pre-vote round starts."""
        others = getattr(self, "_SyncObj__otherNodes")  # noqa: B009 - name-mangled
        if not others:
            return True
        term = self.raftCurrentTerm
        transferring = getattr(self, "_SyncObj__transferInProgress")  # noqa: B009
        if self._pre_vote_won_term == term + 1 or transferring:
            return True
        now_s = syncobj_module.monotonicTime()
        if (
            self.campaign_over_lower_term_leader
            and now_s - self._lower_term_leader_heard_s < self._min_election_timeout_s
        ):
            # A leader of a lower term is alive: this member's term is above it (it won a
            # round, then lost its campaign), so it ignores that leader, and the others, hearing
            # that leader, refuse its rounds. Only a higher term can join them again: it
            # campaigns, and the leader steps down on hearing it (as etcd answers a lower-term
            # leader with its higher term).
            log.info(
                "campaigning for term %d without a pre-vote: a leader of a lower term is alive",
                term + 1,
            )
            return True
        generate_timeout = getattr(self, "_SyncObj__generateRaftTimeout")  # noqa: B009
        setattr(self, "_SyncObj__raftElectionDeadline", now_s + generate_timeout())  # noqa: B010
        # It no longer hears a leader, so it names none (etcd's pre-candidate sets `lead` to
        # None; a campaigning pysyncobj member does the same): its status says so, and commands
        # wait for a leader instead of being forwarded to one that does not answer. Hearing a
        # leader again sets it back.
        setattr(self, "_SyncObj__raftLeader", None)  # noqa: B010 - name-mangled
        self._pre_vote_term = term + 1
        self._pre_vote_granted = {None}  # None: this member's own yes
        self.pre_vote_rounds += 1
        log.info("no leader heard within the election timeout: pre-vote for term %d", term + 1)
        request = {
            "type": PRE_VOTE,
            "term": term + 1,
            "last_log_index": getattr(self, "_SyncObj__getCurrentLogIndex")(),  # noqa: B009
            "last_log_term": getattr(self, "_SyncObj__getCurrentLogTerm")(),  # noqa: B009
        }
        transport: Any = getattr(self, "_SyncObj__transport")  # noqa: B009 - name-mangled
        for node in others:
            transport.send(node, dict(request))
        return False

    def _on_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        """Answers a pre-vote request (its fields checked by `messages.check`), with this
        member's term; changes nothing here."""
        term: int = message["term"]
        last_index: int = message["last_log_index"]
        last_term: int = message["last_log_term"]
        own_term = getattr(self, "_SyncObj__getCurrentLogTerm")()  # noqa: B009
        own_index = getattr(self, "_SyncObj__getCurrentLogIndex")()  # noqa: B009
        up_to_date = last_term > own_term or (last_term == own_term and last_index >= own_index)
        leader_heard = (
            self._isLeader()
            or syncobj_module.monotonicTime() - self._leader_heard_s < self._min_election_timeout_s
        )
        granted = term > self.raftCurrentTerm and up_to_date and not leader_heard
        log.info(
            "pre-vote for term %d from %s: %s",
            term,
            node,
            "yes"
            if granted
            else "no (" + ("a leader is heard" if leader_heard else "log or term") + ")",
        )
        transport: Any = getattr(self, "_SyncObj__transport")  # noqa: B009 - name-mangled
        answer = {"type": PRE_VOTE_RESPONSE, "term": term, "granted": granted}
        transport.send(node, {**answer, "current_term": self.raftCurrentTerm})

    def _on_pre_vote_response(self, node: Any, message: dict[str, Any]) -> None:
        current_term = message.get("current_term")
        if (
            self.take_term_from_refusal
            and message.get("granted") is False
            and current_term is not None  # absent from older members' answers
            and current_term > self.raftCurrentTerm
            and not self._isLeader()
        ):
            # A voter of a higher term refuses every round below its term, and a member whose
            # log is behind can win no round: if the member with the newest log is the one at
            # the lower term, neither can ever lead (found by tests/sim/test_stranger.py; a
            # candidate that dies after its request reached one member leaves the same). It
            # takes the voter's term, and its next round is for the term above it.
            log.info("pre-vote refused by %s, at term %d: taking that term", node, current_term)
            getattr(self, "_SyncObj__setCurrentTerm")(current_term, None)  # noqa: B009
            return
        if message.get("granted") is not True or message.get("term") != self._pre_vote_term:
            return
        if self._pre_vote_term != self.raftCurrentTerm + 1:
            return  # a round of an earlier term
        self._pre_vote_granted.add(node)
        others = getattr(self, "_SyncObj__otherNodes")  # noqa: B009 - name-mangled
        if len(self._pre_vote_granted) > (len(others) + 1) / 2:
            self._pre_vote_won_term = self._pre_vote_term
            log.info("pre-vote for term %d won: campaigning", self._pre_vote_term)
            setattr(self, "_SyncObj__raftElectionDeadline", 0.0)  # noqa: B010 - name-mangled

    def _guard_append_entries(self) -> None:
        """Works around two pysyncobj 0.3.17 safety bugs in how a follower handles an
        append_entries message that carries no `prevLogIdx` (a snapshot chunk, or an empty
        `serialized` field). Both were found by the simulator (`raftstore.sim`); the scenario
        tests in `tests/sim/test_scenarios.py` reproduce each.

        1. pysyncobj takes the leader's commit index from such a message without checking that
           its own log matches the leader's, so it commits and applies whatever stale entries
           its log holds up to that index: a deposed leader that rejoins while the new leader
           sends it a snapshot applies its own uncommitted entries, and acknowledges them to
           their proposers. Raft lets a follower advance its commit index only up to the last
           entry it has checked against the leader's log, so these messages lose their commit
           index here; the next regular append_entries, whose previous entry is checked,
           brings it.
        2. pysyncobj installs every snapshot it receives, also one older than what it has
           already applied (a leader that got several "reset" answers sends the same snapshot
           several times): the state machine goes back to the older index, entries are applied
           a second time, and the log entries it acknowledged after that index are thrown away.
           Raft says a follower that already holds the snapshot's last entry keeps its log and
           state; so such a snapshot is dropped here, and the entries the leader sends after it
           are checked against the log as usual.

        Before all that it drops a message no member sends (`raftstore.messages`): a term
        pysyncobj cannot write, a field of another type, a forwarded command that is not a call
        of `apply_group` (which pysyncobj's leader would log undecoded, `raftstore.entries`)."""
        transport: Any = getattr(self, "_SyncObj__transport")  # noqa: B009 - name-mangled
        receive = transport._onMessageReceivedCallback
        incoming = self._incoming_snapshot

        def receive_guarded(node: Any, message: Any) -> None:
            try:
                messages.check(message)
            except messages.BadMessage as error:
                log.warning("a message from %s dropped: %s", node, error)
                return
            kind = message["type"]
            if kind == PRE_VOTE:
                self._on_pre_vote(node, message)
                return
            if kind == PRE_VOTE_RESPONSE:
                self._on_pre_vote_response(node, message)
                return
            if kind == "append_entries":
                if message["term"] >= self.raftCurrentTerm:
                    self._leader_heard_s = syncobj_module.monotonicTime()
                else:
                    self._lower_term_leader_heard_s = syncobj_module.monotonicTime()
            if kind == "append_entries" and "prevLogIdx" not in message:
                message = {**message, "commit_index": 0}
                serialized = message.get("serialized")
                if serialized is not None:
                    data, first, last = serialized
                    incoming.add(data, first=first)
                    if last:
                        entry = incoming.last_entry()
                        if entry is not None and self._holds(*entry):
                            message["serialized"] = None
            elif kind == "append_entries":
                message = keep_matching_entries(self, message)
            receive(node, message)

        transport.setOnMessageReceivedCallback(receive_guarded)

    def _holds(self, index: int, term: int) -> bool:
        """Whether this replica has applied raft entry `index` (applied entries are committed,
        so they are the leader's) or holds it, with `term`, in its log."""
        if index <= self.raftLastApplied:
            return True
        log: Any = getattr(self, "_SyncObj__raftLog")  # noqa: B009 - name-mangled
        first = int(log[0][1])
        if not first <= index <= int(log[-1][1]):
            return False
        return bool(log[index - first][2] == term)

    # Overrides SyncObj's private `__doApplyCommand`, which applies one committed entry and raised,
    # on every tick for good, on an entry it could not decode (`raftstore.entries`).
    def _SyncObj__doApplyCommand(self, command: Any) -> Any:
        if self.halted is not None:
            # Every later entry too: pysyncobj's apply loop goes on to the next entry after one
            # that raised, and would apply it in the place of the one this replica stopped at.
            raise SyncObjExceptionWrongVer(ENVELOPE_VERSION + 1)
        try:
            group = entries.applicable_group(command)
        except entries.BadEntry as error:
            index = self.raftLastApplied + 1
            log.error("raft entry %d skipped, as on every member: %s", index, error)
            return None
        if group is None:
            return _sync_obj_do_apply(self, command)
        return self.apply_group(group, _doApply=True)  # type: ignore[call-arg]

    @replicated
    def apply_group(self, group: bytes) -> list[Applied]:
        """Applies each command of a group, in order, at consecutive xrcore indexes."""
        if self.halted is not None:
            raise SyncObjExceptionWrongVer(ENVELOPE_VERSION + 1)
        try:
            entries = decode_group(group)
        except CodecError as error:
            # Every replica of this version rejects the same malformed group the same way:
            # nothing applied.
            self._undecodable(self.raftLastApplied + 1, error.message)
            return []
        newest = max((newer_version(entry) or 0 for entry in entries), default=0)
        if newest:
            self._halt(self.raftLastApplied + 1, newest)
        with self.state_lock:
            machine = self.machine
            results = [machine.apply(entry, machine.index + 1) for entry in entries]
        for applied in results:
            if applied.result.error is not None and applied.result.error.code == CodecError.code:
                self._undecodable(applied.index, applied.result.error.message)
        if self.on_applied is not None:
            self.on_applied(results)
        return results

    def _halt(self, index: int, version: int) -> None:
        """Stops applying the log at raft entry `index`, which holds an entry of envelope
        `version`, written by a newer release. Raising `SyncObjExceptionWrongVer` makes pysyncobj
        leave the entry unapplied and try it again on every tick (as for its own code versions),
        so the state and the snapshots stay at the entry before; the member still votes and
        keeps the log, and once upgraded and restarted it applies the log from there. Its store
        refuses requests meanwhile (`RaftStore`): skipping the entry, as a malformed one is
        skipped, would make it differ from the newer replicas that apply it."""
        if self.halted is None:
            self.halted = (
                f"raft entry {index} holds an entry of envelope version {version}, written by a "
                f"newer release (this one reads version {ENVELOPE_VERSION}): this node applies "
                "nothing past it until it is upgraded (docs/operations.md, Upgrades)"
            )
        now_s = time.monotonic()
        if now_s - self._halted_logged_s >= 60.0:
            self._halted_logged_s = now_s
            log.error("stopped applying the log: %s", self.halted)
        raise SyncObjExceptionWrongVer(version)

    def _undecodable(self, index: int, why: str) -> None:
        """Counts and logs a committed entry this replica could not decode, and so skipped. A
        node of this version proposes none, so one is most likely a newer node's (a command or
        field this version does not know, against a release note), which the newer replicas
        applied: this one may differ from them from here on. Logged at most once a minute."""
        self.undecodable_entries += 1
        now_s = time.monotonic()
        if now_s - self._undecodable_logged_s < 60.0:
            return
        self._undecodable_logged_s = now_s
        log.error(
            "committed entry %d could not be decoded by this version and was skipped (%s; %d "
            "such entries since start): if a node of a newer release wrote it (a command or "
            "field this one does not know), or this node's disk damaged a journal written "
            "before 0.32.0 (which has no checksums), this replica may now differ from the "
            "others (docs/operations.md, Upgrades: compare /v1/snapshot/hash, and resync a node "
            "that differs)",
            index,
            why[:300],
            self.undecodable_entries,
        )

    def _doDestroy(self) -> None:
        super()._doDestroy()
        # pysyncobj never closes the pipe that wakes its poller: two descriptors leaked per
        # replica (a test process making hundreds crossed select()'s limit of 1,024). A late
        # `notify` must not write into whatever file reuses the number, so it is disarmed first.
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is None:
            return
        notifier.notify = lambda: None
        read_fd = getattr(notifier, "_PipeNotifier__pipeR")  # noqa: B009 - name-mangled
        write_fd = getattr(notifier, "_PipeNotifier__pipeW")  # noqa: B009 - name-mangled
        self._poller.unsubscribe(read_fd)
        os.close(read_fd)
        os.close(write_fd)

    def propose_group(self, group: bytes, callback: Callable[[Any, int], None]) -> None:
        """Proposes a group; `callback(results, reason)` runs inside a tick once it is
        applied here, or has failed. pysyncobj's decorator adds the `callback` argument.

        pysyncobj calls a completion inside its apply loop, before it counts the entry applied:
        one that raised made it apply the entry again on the next tick, so this member's state
        went one entry ahead of the others'. What `callback` raises is logged instead."""

        def completion(results: Any, reason: int) -> None:
            try:
                callback(results, reason)
            except Exception:
                log.exception("a proposal's completion raised; its entry stays applied once")

        self.apply_group(group, callback=completion)  # type: ignore[call-arg]

    def last_contact_s(self) -> dict[str, float]:
        """On the leader: seconds since each follower last answered, by address."""
        if not self._isLeader():
            return {}
        responses: dict[Any, float] = getattr(self, "_SyncObj__lastResponseTime")  # noqa: B009
        now_s = syncobj_module.monotonicTime()
        return {str(node): round(now_s - seen_s, 3) for node, seen_s in responses.items()}

    def connections_refused(self) -> dict[str, int]:
        """Incoming Raft connections closed for what their peer sent, by reason
        (`frames.Refusals`)."""
        return frames.refused_counts(getattr(self, "_SyncObj__transport"))  # noqa: B009

    def read(self, query: Callable[[StateMachine], T]) -> T:
        with self.state_lock:
            return query(self.machine)

    # Snapshots.

    # pysyncobj writes the snapshot to a temporary name through `_write_snapshot` and renames it
    # into place; in "fsync" mode the file is synced before the rename and the directory before
    # the journal drops what the snapshot holds (`DurableJournal.deleteEntriesTo`).

    def _write_snapshot(self, path: str, raft_data: Any) -> None:
        with self.state_lock:
            state = self.machine.snapshot()
        try:
            with Path(path).open("wb") as file:
                file.write(encode_raft_snapshot(raft_data, state))
                if self.durable:
                    file.flush()
                    os.fsync(file.fileno())
        except OSError as error:
            # pysyncobj drops the error without a word and tries again at a later tick; the log
            # keeps the entries the snapshot would have held. Said once a minute.
            now_s = time.monotonic()
            if now_s - self._snapshot_failure_logged_s >= 60.0:
                self._snapshot_failure_logged_s = now_s
                log.error(
                    "cannot write the snapshot %s (%s): the log keeps its entries", path, error
                )
            raise

    def _read_snapshot(self, path: str) -> Any:
        data = Path(path).read_bytes()
        if self.durable:
            # A snapshot received from the leader was written without a sync; it must be on disk
            # before the journal is cleared to match it.
            with Path(path).open("rb") as file:
                os.fsync(file.fileno())
            fsync_directory(Path(path).parent)
        meta, state = decode_raft_snapshot(data, path)
        machine = StateMachine.restore(state)
        with self.state_lock:
            self.machine = machine
        return meta


def encode_raft_snapshot(raft_data: Any, state: bytes) -> bytes:
    """The snapshot file (`raft.snapshot`): xr's magic, pysyncobj's log metadata (the last two
    applied entries and the member set, pickled as pysyncobj would) and xrcore's snapshot."""
    meta = pickling.dumps(raft_data)
    return SNAPSHOT_MAGIC + len(meta).to_bytes(8, "big") + meta + state


def decode_raft_snapshot(data: bytes, path: str) -> tuple[Any, bytes]:
    if not data.startswith(SNAPSHOT_MAGIC):
        raise CodecError(f"{path} is not an xr raft snapshot")
    offset = len(SNAPSHOT_MAGIC)
    size = int.from_bytes(data[offset : offset + 8], "big")
    meta = pickling.loads(data[offset + 8 : offset + 8 + size])
    return meta, data[offset + 8 + size :]


def snapshot_members(config: RaftConfig) -> frozenset[str] | None:
    """The Raft addresses of the members that the snapshot in `config.data_dir` names, or None
    when there is no snapshot. pysyncobj takes its member set from the snapshot (dynamic
    membership is on for `add_member`), not from its configuration. Reads only the header."""
    path = config.snapshot_file
    try:
        with path.open("rb") as file:
            head = file.read(len(SNAPSHOT_MAGIC) + 8)
            if not head.startswith(SNAPSHOT_MAGIC) or len(head) < len(SNAPSHOT_MAGIC) + 8:
                raise CodecError(f"{path} is not an xr raft snapshot")
            size = int.from_bytes(head[len(SNAPSHOT_MAGIC) :], "big")
            meta_bytes = file.read(min(size, _SNAPSHOT_META_BYTES_MAX))
    except FileNotFoundError:
        return None
    try:
        return frozenset(str(node) for node in pickling.loads(meta_bytes)[-1])
    except Exception as error:
        raise CodecError(f"{path}: its header cannot be read ({error})") from None


# The pickled log metadata of a snapshot: two entries and the member set, a few KiB at most.
_SNAPSHOT_META_BYTES_MAX = 16 << 20


def seed_data_dir(config: RaftConfig, state: bytes) -> None:
    """Makes `config.data_dir` the Raft directory of a member of a NEW cluster that starts from
    `state` (xrcore snapshot bytes): a snapshot file whose log metadata names this cluster's
    members (pysyncobj takes its member set from the snapshot) and a journal holding just the
    two entries the snapshot ends at, at raft indexes 1 and 2 of term 1. Every member of the new
    cluster is seeded the same way, so their logs agree; xrcore's own index, revisions and fencing
    tokens live in the state and go on from where they were. Refuses a directory that already
    holds a journal or a snapshot."""
    StateMachine.restore(state)  # refuse what xrcore cannot read before touching the disk
    for existing in (config.journal_file, config.snapshot_file):
        if existing.exists():
            raise InvalidArgument(f"{existing} exists: restore only into a new data directory")
    config.data_dir.mkdir(mode=RAFT_DIR_MODE, parents=True, exist_ok=True)
    meta_file = Path(str(config.journal_file) + ".meta")
    try:
        _seed(config, state, meta_file)
    except BaseException:
        # A full disk, say: what was written would stop the node at start (an empty journal)
        # and refuse the next restore; the directory goes back to holding no Raft data.
        for written in (config.snapshot_file, config.journal_file, meta_file):
            with contextlib.suppress(OSError):
                written.unlink(missing_ok=True)
        raise


def _seed(config: RaftConfig, state: bytes, meta_file: Path) -> None:
    no_op = bytes([1])  # pysyncobj's _COMMAND_TYPE.NO_OP
    first, last = (no_op, 1, 1), (no_op, 2, 1)
    members = {TCPNode(address) for address in (config.self_address, *config.peers)}
    write_file_durably(config.snapshot_file, encode_raft_snapshot((last, first, members), state))
    # pysyncobj's own journal class, not the one that stops the process on a failed write: the
    # caller removes what was written and reports the error.
    journal = disk.PlainFileJournal(str(config.journal_file))
    setattr(  # noqa: B010 - name-mangled
        journal, "_FileJournal__metaStorer", _DurableMetaStorer(str(meta_file))
    )
    journal.add(*first)
    journal.add(*last)
    journal.setCurrentTerm(1, None)
    journal.setRaftCommitIndex(2)
    journal.onOneSecondTimer()
    journal._destroy()
    with config.journal_file.open("rb") as file:
        os.fsync(file.fileno())
    fsync_directory(config.data_dir)
