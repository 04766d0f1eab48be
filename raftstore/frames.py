"""A bound on what an unauthenticated peer can make a member buffer on the Raft port.

pysyncobj 0.3.17 frames peer traffic as a 4-byte signed length and then the message, and it
trusts the length before it authenticates anything: a connection that announces a 2 GiB frame
and keeps sending is buffered in full (by repeated concatenation) before the Fernet check, with
or without a cluster secret, and a negative length is never refused. Anyone who reaches the
port could so exhaust a member's memory (found by tests/raftstore/test_raft_port_garbage.py's
author; docs/robustness.md).

The first message on every connection is a handshake of a few dozen bytes (the connecting
member's address, or with a secret a 32-byte random key, each wrapped in a Fernet token), so
until a connection has delivered one message that parsed (and, with a secret, authenticated),
a frame longer than `HANDSHAKE_FRAME_BYTES_MAX` or a negative length closes it. After that the
peer has shown it holds the secret (or, without one, it is on loopback, which xr trusts), and
frames are bounded only by pysyncobj's own batching.

Connections, too: pysyncobj checks a connection's timeout only when something happens on it, so
a connection that is accepted and then sends nothing was held for ever (a descriptor each; a
stranger opening them without end would take every descriptor the node has, its HTTP API and
journal included). An incoming connection must now identify itself (the handshake above: the
connecting member's address, after the key exchange with a secret) within the member's
connection timeout (`raft.connection_timeout_s`, 3.5 s) from its accept, or it is closed; and at
most `UNIDENTIFIED_CONNECTIONS_MAX` may wait at once: beyond that the oldest is closed, so a
member's own handshake (a round trip or two) still gets through all but a flood faster than that.

What a connection may identify itself as, too: pysyncobj takes as an incoming connection's first
message (after the key exchange, with a secret) a member's address, but also `"readonly"`, which
makes the stranger a non-voting replica the leader sends the whole log to, and a utility command
(a list: add or remove a member, hand leadership over, set the code version, report the status),
which it runs. Without a secret anyone who reached the port could so read every key and job, or
take members out of the cluster, past xr's authorization; with a secret anyone who holds it. xr
uses neither (members are added and removed through its API), so an incoming connection whose
first message is not a member's address (or, with a secret, a 32-byte key and then an address)
is closed before pysyncobj sees it.

Installed once, on import of `raftstore.replica`'s dependencies, by patching pysyncobj's
`TcpConnection` and `TCPTransport`: the patch changes nothing for a well-behaved peer.

`install` also changes how small frames are compressed. pysyncobj zlib-compresses every message
at level 3, and most messages are small (an answer, one group's entry), where compression saves
a few bytes for 10-17 us of CPU each way. A message under `STORED_FRAME_BYTES_MAX` bytes is sent
as deflate's stored blocks instead (a zlib stream that does not compress): any zlib decoder reads
it, so members of older versions read these frames and these members read theirs, and a cluster
can be upgraded one member at a time. Larger messages (batches, snapshots) are compressed as
before, so the traffic between regions stays compressed where it counts. Measured side by side
in `write` mode (`bench/raft_messages.py --against` the commit before, 4 rounds): members' CPU
per put 0.88x, 0.92x and 0.94x at 1, 16 and 64 in flight, puts 1.12x, 1.07x and 1.05x
(docs/durability.md).
"""

from __future__ import annotations

import math
import struct
import time
import zlib
from typing import Any

import pysyncobj.tcp_connection as tcp_connection_module
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.transport import TCPTransport

__all__ = [
    "HANDSHAKE_FRAME_BYTES_MAX",
    "STORED_FRAME_BYTES_MAX",
    "UNIDENTIFIED_CONNECTIONS_MAX",
    "SmallFramesStored",
    "install",
]

# A handshake frame is under 200 bytes (a Fernet token of a 32-byte key or an address); this
# leaves room for long host names while bounding what a stranger can make a member hold.
HANDSHAKE_FRAME_BYTES_MAX = 64 << 10

_PARSE = "_TcpConnection__processParseMessage"
_READ = "_TcpConnection__processRead"
_BUFFER = "_TcpConnection__readBuffer"
_TRUSTED = "_xr_trusted"
_ACCEPTED_AT = "_xr_accepted_at"

# Incoming connections that have not yet identified themselves, at once. A cluster has at most
# `xrcore.limits.Limits.regions_max` (64) members, and each connects to each other once.
UNIDENTIFIED_CONNECTIONS_MAX = 64


# The random key each side of a connection sends first when there is a secret (os.urandom(32)).
RANDOM_KEY_BYTES = 32

# Messages shorter than this (pickled) are sent uncompressed, in deflate's stored blocks.
STORED_FRAME_BYTES_MAX = 1024


class SmallFramesStored:
    """Stands in for the `zlib` module in pysyncobj's `tcp_connection`, which calls only
    `compress(data, level)` and `decompress(data)`."""

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        if len(data) >= STORED_FRAME_BYTES_MAX:
            return zlib.compress(data, level)
        # Level 0 (stored blocks) with the smallest window and state: nothing to search.
        packer = zlib.compressobj(0, zlib.DEFLATED, 9, 1)
        return packer.compress(data) + packer.flush()

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return zlib.decompress(data)


def _frame_allowed(connection: Any) -> bool:
    buffer: bytes = getattr(connection, _BUFFER)
    if len(buffer) < 4:
        return True
    (length,) = struct.unpack("i", buffer[:4])
    if length < 0:
        return False
    return bool(getattr(connection, _TRUSTED, False)) or length <= HANDSHAKE_FRAME_BYTES_MAX


def install() -> None:
    """Patches `TcpConnection` and its module's compression (idempotent)."""
    if getattr(TcpConnection, "_xr_frames_installed", False):
        return
    setattr(tcp_connection_module, "zlib", SmallFramesStored)  # noqa: B010
    original_read = getattr(TcpConnection, _READ)
    original_parse = getattr(TcpConnection, _PARSE)

    def process_read(connection: Any) -> bool:
        more: bool = original_read(connection)
        if more and not _frame_allowed(connection):
            connection.disconnect()
            return False
        return more

    def process_parse(connection: Any) -> Any:
        if not _frame_allowed(connection):
            connection.disconnect()
            return None
        message = original_parse(connection)
        if message is not None:
            setattr(connection, _TRUSTED, True)
        return message

    def disconnect(connection: Any, _original: Any = TcpConnection.disconnect) -> None:
        # A connection object is reused for the next connection to the same peer.
        setattr(connection, _TRUSTED, False)
        _original(connection)

    setattr(TcpConnection, _READ, process_read)
    setattr(TcpConnection, _PARSE, process_parse)
    setattr(TcpConnection, "disconnect", disconnect)  # noqa: B010
    _install_connection_bounds()
    setattr(TcpConnection, "_xr_frames_installed", True)  # noqa: B010


def _close(transport: Any, connection: Any) -> None:
    connection.disconnect()
    transport._unknownConnections.discard(connection)


def _close_unidentified(transport: Any, now_s: float) -> None:
    """Closes the incoming connections that have not identified themselves within the
    connection timeout of their accept. Called on every tick; a no-op when none waits."""
    unknown = transport._unknownConnections
    if not unknown:
        return
    deadline_s = now_s - transport._syncObj.conf.connectionTimeout
    for connection in [c for c in unknown if getattr(c, _ACCEPTED_AT, math.inf) < deadline_s]:
        _close(transport, connection)


def _identifies_a_member(transport: Any, connection: Any, message: Any) -> bool:
    """Whether `message`, on an incoming connection that has not identified itself, is what a
    member sends there: with a secret first its random key, then (as without) its address."""
    if transport._syncObj.encryptor is not None and not connection.sendRandKey:
        return isinstance(message, bytes) and len(message) == RANDOM_KEY_BYTES
    return isinstance(message, str) and message in transport._nodeAddrToNode


def _install_connection_bounds() -> None:
    # pysyncobj registers the transport's bound `_onTick` and `_onNewIncomingConnection` when it
    # makes the transport, so members made after this use the patched ones.
    original_new = getattr(TCPTransport, "_onNewIncomingConnection")  # noqa: B009 - no stub
    original_tick = getattr(TCPTransport, "_onTick")  # noqa: B009 - no stub
    original_incoming = getattr(TCPTransport, "_onIncomingMessageReceived")  # noqa: B009

    def on_new_incoming(transport: Any, connection: Any) -> None:
        setattr(connection, _ACCEPTED_AT, time.monotonic())
        original_new(transport, connection)
        unknown = transport._unknownConnections
        if len(unknown) > UNIDENTIFIED_CONNECTIONS_MAX:
            _close(transport, min(unknown, key=lambda c: getattr(c, _ACCEPTED_AT, math.inf)))

    def on_tick(transport: Any) -> None:
        original_tick(transport)
        _close_unidentified(transport, time.monotonic())

    def on_incoming_message(transport: Any, connection: Any, message: Any) -> None:
        if _identifies_a_member(transport, connection, message):
            original_incoming(transport, connection, message)
        else:
            _close(transport, connection)

    setattr(TCPTransport, "_onNewIncomingConnection", on_new_incoming)  # noqa: B010
    setattr(TCPTransport, "_onIncomingMessageReceived", on_incoming_message)  # noqa: B010
    setattr(TCPTransport, "_onTick", on_tick)  # noqa: B010
