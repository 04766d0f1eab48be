"""The pysyncobj object that replicates xrcore's state machine.

It exposes exactly one replicated method, `apply_group`, which takes the bytes of a group of
encoded xrcore envelopes (group commit: commands that arrive together share one log entry) and
applies them in order. pysyncobj numbers replicated methods by sorted name, so a second replicated
method would be a wire-format change; there is none.

Snapshots go through xrcore's codec, never pickle: the snapshot file holds xrcore's snapshot bytes
and, beside them, pysyncobj's own log metadata (the last applied entries and the member set) in
pysyncobj's encoding, which is what pysyncobj itself would have written.

Threads: every method here runs on the tick driver's thread, except `read`, which any thread may
call; `state_lock` keeps a read from seeing a group half applied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.syncobj as syncobj_module
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.transport import Transport

from raftstore import frames
from raftstore.config import RaftConfig
from raftstore.guards import back_off_to_commit_index, keep_matching_entries
from xrcore import Applied, StateMachine
from xrcore.errors import CodecError
from xrcore.limits import DEFAULT_LIMITS, ENVELOPE_BYTES_MAX, Limits

__all__ = ["GROUP_COMMANDS_MAX", "Replica", "decode_group", "encode_group"]

T = TypeVar("T")

# A log entry holds at most this many commands; a group beyond it is malformed.
GROUP_COMMANDS_MAX = 4_096
SNAPSHOT_MAGIC = b"xr-raft-snapshot-1\n"


_group_encoder = msgspec.msgpack.Encoder()
_group_decoder = msgspec.msgpack.Decoder(list[bytes])


def encode_group(entries: list[bytes]) -> bytes:
    return _group_encoder.encode(entries)


def decode_group(data: bytes) -> list[bytes]:
    """The encoded envelopes of a group; `CodecError` if it is not a list of byte strings."""
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
            meta = pysyncobj_pickle.loads(prefix[offset + 8 : offset + 8 + size])
            return int(meta[0][1]), int(meta[0][2])
        except Exception:
            return None


class Replica(SyncObj):
    """One member of the Raft group, holding one `StateMachine`."""

    def __init__(
        self,
        config: RaftConfig,
        *,
        limits: Limits = DEFAULT_LIMITS,
        transport: Transport | None = None,
        on_applied: Callable[[list[Applied]], None] | None = None,
    ) -> None:
        # Set before SyncObj.__init__, which may load a snapshot and replay the journal.
        self.machine = StateMachine(limits)
        self.state_lock = threading.Lock()
        self.on_applied = on_applied
        config.data_dir.mkdir(parents=True, exist_ok=True)
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
            # Listen where this node says it is, not on every interface.
            bindAddress=config.bind_address or config.self_address,
        )
        # Strangers on the Raft port may not announce frames bigger than a handshake.
        frames.install()
        super().__init__(
            config.self_address,
            list(config.peers),
            conf,
            transport=transport,
        )
        self._incoming_snapshot = _IncomingSnapshot()
        self._guard_append_entries()

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
           are checked against the log as usual."""
        transport: Any = getattr(self, "_SyncObj__transport")  # noqa: B009 - name-mangled
        receive = transport._onMessageReceivedCallback
        incoming = self._incoming_snapshot

        def receive_guarded(node: Any, message: Any) -> None:
            if (
                isinstance(message, dict)
                and message.get("type") == "append_entries"
                and "prevLogIdx" not in message
            ):
                message = {**message, "commit_index": 0}
                serialized = message.get("serialized")
                if serialized is not None:
                    data, first, last = serialized
                    incoming.add(data, first=first)
                    if last:
                        entry = incoming.last_entry()
                        if entry is not None and self._holds(*entry):
                            message["serialized"] = None
            elif isinstance(message, dict) and message.get("type") == "append_entries":
                message = keep_matching_entries(self, message)
            receive(node, message)

        transport.setOnMessageReceivedCallback(receive_guarded)
        send = transport.send

        def send_guarded(node: Any, message: Any) -> bool:
            if isinstance(message, dict) and message.get("type") == "next_node_idx":
                message = back_off_to_commit_index(self, message)
            return bool(send(node, message))

        transport.send = send_guarded

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

    @replicated
    def apply_group(self, group: bytes) -> list[Applied]:
        """Applies each command of a group, in order, at consecutive xrcore indexes."""
        try:
            entries = decode_group(group)
        except CodecError:
            # Every replica rejects the same malformed group the same way: nothing applied.
            return []
        with self.state_lock:
            machine = self.machine
            results = [machine.apply(entry, machine.index + 1) for entry in entries]
        if self.on_applied is not None:
            self.on_applied(results)
        return results

    def propose_group(self, group: bytes, callback: Callable[[Any, int], None]) -> None:
        """Proposes a group; `callback(results, reason)` runs on the tick thread once it is
        applied here, or has failed. pysyncobj's decorator adds the `callback` argument."""
        self.apply_group(group, callback=callback)  # type: ignore[call-arg]

    def last_contact_s(self) -> dict[str, float]:
        """On the leader: seconds since each follower last answered, by address."""
        if not self._isLeader():
            return {}
        responses: dict[Any, float] = getattr(self, "_SyncObj__lastResponseTime")  # noqa: B009
        now_s = syncobj_module.monotonicTime()
        return {str(node): round(now_s - seen_s, 3) for node, seen_s in responses.items()}

    def read(self, query: Callable[[StateMachine], T]) -> T:
        with self.state_lock:
            return query(self.machine)

    # Snapshots.

    def _write_snapshot(self, path: str, raft_data: Any) -> None:
        with self.state_lock:
            state = self.machine.snapshot()
        meta = pysyncobj_pickle.dumps(raft_data)
        with Path(path).open("wb") as file:
            file.write(SNAPSHOT_MAGIC)
            file.write(len(meta).to_bytes(8, "big"))
            file.write(meta)
            file.write(state)

    def _read_snapshot(self, path: str) -> Any:
        data = Path(path).read_bytes()
        if not data.startswith(SNAPSHOT_MAGIC):
            raise CodecError(f"{path} is not an xr raft snapshot")
        offset = len(SNAPSHOT_MAGIC)
        size = int.from_bytes(data[offset : offset + 8], "big")
        meta = pysyncobj_pickle.loads(data[offset + 8 : offset + 8 + size])
        machine = StateMachine.restore(data[offset + 8 + size :])
        with self.state_lock:
            self.machine = machine
        return meta
