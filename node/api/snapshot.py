"""Backups of the replicated state (`xr snapshot save`), and each node's state hash.

- `GET /v1/snapshot` (admins): after a linearizable read barrier, the state machine's snapshot,
  as a backup file (base64 in the answer, with its index, term and checksum beside it). The
  barrier makes it consistent and at least as new as every write acknowledged before the request.
- `GET /v1/snapshot/hash` (admins): this node's applied state, read locally without a barrier:
  its xrcore index and the SHA-256 of its snapshot. Members that have applied the same index
  must answer the same hash (the crash tests compare them).

The backup file format (`encode_backup` / `decode_backup`), version 1:
`MAGIC`, a 4-byte big-endian header length, the header (JSON: format, machine_index, raft_index,
raft_term, taken_at_ms, state_bytes), xrcore's snapshot bytes, and the SHA-256 of everything
before it (32 bytes). A file that is not one, is truncated or corrupt is refused with a message
that says which.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from node.api.app import principal, services
from node.api.auth import Permission
from node.api.wire import respond
from xrcore import StateMachine
from xrcore.errors import CodecError, InvalidArgument

__all__ = ["BACKUP_FORMAT", "MAGIC", "Backup", "decode_backup", "encode_backup", "routes"]

routes = web.RouteTableDef()

MAGIC = b"xr-backup\n"
BACKUP_FORMAT = 1
_DIGEST_BYTES = 32
_HEADER_BYTES_MAX = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class Backup:
    machine_index: int
    raft_index: int
    raft_term: int
    taken_at_ms: int
    state: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.state).hexdigest()


def encode_backup(backup: Backup) -> bytes:
    header = json.dumps(
        {
            "format": BACKUP_FORMAT,
            "machine_index": backup.machine_index,
            "raft_index": backup.raft_index,
            "raft_term": backup.raft_term,
            "taken_at_ms": backup.taken_at_ms,
            "state_bytes": len(backup.state),
        },
        sort_keys=True,
    ).encode()
    body = MAGIC + len(header).to_bytes(4, "big") + header + backup.state
    return body + hashlib.sha256(body).digest()


def decode_backup(data: bytes) -> Backup:
    """The backup a file holds; `InvalidArgument` saying why when it is not a whole, intact xr
    backup (nothing is trusted before the checksum matches)."""
    if not data.startswith(MAGIC):
        raise InvalidArgument("not an xr backup file (it does not start with the xr backup mark)")
    if len(data) < len(MAGIC) + 4 + _DIGEST_BYTES:
        raise InvalidArgument("the backup file is truncated")
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise InvalidArgument(
            "the backup file's checksum does not match: it is truncated or corrupt"
        )
    offset = len(MAGIC)
    size = int.from_bytes(body[offset : offset + 4], "big")
    if size > _HEADER_BYTES_MAX or offset + 4 + size > len(body):
        raise InvalidArgument("the backup file's header is malformed")
    try:
        header: Any = json.loads(body[offset + 4 : offset + 4 + size])
        if header.get("format") != BACKUP_FORMAT:
            raise InvalidArgument(
                f"backup format {header.get('format')!r} is not supported (this xr reads "
                f"format {BACKUP_FORMAT})"
            )
        state = body[offset + 4 + size :]
        if len(state) != header["state_bytes"]:
            raise InvalidArgument("the backup file's state has the wrong length")
        backup = Backup(
            machine_index=int(header["machine_index"]),
            raft_index=int(header["raft_index"]),
            raft_term=int(header["raft_term"]),
            taken_at_ms=int(header["taken_at_ms"]),
            state=state,
        )
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as error:
        raise InvalidArgument(f"the backup file's header is malformed: {error}") from None
    except RecursionError:
        raise InvalidArgument("the backup file's header is malformed: nested too deeply") from None
    try:
        machine = StateMachine.restore(state)
    except CodecError as error:
        raise InvalidArgument(f"the backup's state cannot be read: {error}") from None
    if machine.index != backup.machine_index:
        raise InvalidArgument("the backup's state is not at the index its header says")
    return backup


@routes.get("/v1/snapshot")
async def save(request: web.Request) -> web.Response:
    principal(request, Permission.ADMIN)
    node = services(request)
    store = node.store
    # Read through the barrier: the state includes every write acknowledged before this request.
    result = await store.read(lambda machine: machine.snapshot())
    backup = Backup(
        machine_index=result.index,
        raft_index=int(store.replica.raftLastApplied),
        raft_term=int(store.replica.raftCurrentTerm),
        taken_at_ms=node.clock.now_ms(),
        state=result.value,
    )
    # Hashing, framing, base64 and encoding the answer take seconds for a large state (1.6 s
    # for 240 MB): on the thread that runs Raft, a save from the leader cost it its term. The
    # state's bytes are the snapshot's own, so nothing else touches them meanwhile.
    return await asyncio.to_thread(_answer, request, backup)


def _answer(request: web.Request, backup: Backup) -> web.Response:
    return respond(
        request,
        {
            "machine_index": backup.machine_index,
            "raft_index": backup.raft_index,
            "raft_term": backup.raft_term,
            "taken_at_ms": backup.taken_at_ms,
            "state_bytes": len(backup.state),
            "sha256": backup.sha256,
            "file": base64.b64encode(encode_backup(backup)).decode(),
        },
    )


def _state_hash(machine: StateMachine) -> tuple[int, str]:
    return machine.index, hashlib.sha256(machine.snapshot()).hexdigest()


@routes.get("/v1/snapshot/hash")
async def state_hash(request: web.Request) -> web.Response:
    principal(request, Permission.ADMIN)
    store = services(request).store
    index, digest = store.replica.read(_state_hash)
    return respond(
        request,
        {
            "region": services(request).config.region.name,
            "machine_index": index,
            "sha256": digest,
            "durability": store.config.durability,
        },
    )
