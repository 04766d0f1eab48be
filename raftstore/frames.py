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

Each connection a member closes for what its peer sent (or did not send) is counted by reason
(`Refusals`, `RaftStore.status()["connections_refused"]`, the metric
`xr_raft_connections_refused`) and logged, at most once a minute for each peer host and reason
with a count of those not logged. pysyncobj closes such connections silently, so a member given
another cluster secret, or not named in the others' `raft.peers`, was a member the others never
heard from and nothing said why.

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

import logging
import math
import struct
import time
import zlib
from collections import Counter
from typing import Any

import pysyncobj.tcp_connection as tcp_connection_module
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.transport import TCPTransport

__all__ = [
    "HANDSHAKE_FRAME_BYTES_MAX",
    "REFUSAL_LOG_INTERVAL_S",
    "REFUSAL_REASONS",
    "STORED_FRAME_BYTES_MAX",
    "UNIDENTIFIED_CONNECTIONS_MAX",
    "Refusals",
    "SmallFramesStored",
    "install",
    "refusals",
    "refused_counts",
]

# A handshake frame is under 200 bytes (a Fernet token of a 32-byte key or an address); this
# leaves room for long host names while bounding what a stranger can make a member hold.
HANDSHAKE_FRAME_BYTES_MAX = 64 << 10

_PARSE = "_TcpConnection__processParseMessage"
_READ = "_TcpConnection__processRead"
_BUFFER = "_TcpConnection__readBuffer"
_TRUSTED = "_xr_trusted"
_ACCEPTED_AT = "_xr_accepted_at"
# On an incoming connection: the transport that accepted it and the peer's "host:port".
_TRANSPORT = "_xr_transport"
_PEER = "_xr_peer"
# On a transport: its `Refusals`.
_REFUSALS = "_xr_refusals"
_DISCONNECTED = getattr(tcp_connection_module, "CONNECTION_STATE").DISCONNECTED  # noqa: B009

log = logging.getLogger(__name__)

# Why a member closed an incoming connection (`Refusals`).
REFUSAL_REASONS = ("unauthenticated", "bad_message", "frame_too_long", "not_a_member", "silent")

# A refusal is logged at most this often for each peer host and reason.
REFUSAL_LOG_INTERVAL_S = 60.0

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


class Refusals:
    """The incoming connections one member closed for what their peer sent, counted by reason:

    - `unauthenticated`: its first message did not authenticate (or, without a secret, parse);
    - `bad_message`: a later message did not (replayed, reordered or corrupted);
    - `frame_too_long`: before its first message, a frame longer than a handshake, or a negative
      length;
    - `not_a_member`: it named itself as no member of this one's cluster (or asked for
      pysyncobj's read-only replication or a utility command);
    - `silent`: it did not identify itself within the connection timeout.
    """

    def __init__(self, secret: bool) -> None:
        self.secret = secret
        self.counts: Counter[str] = Counter()
        # (host, reason) -> when last logged, and how many since that were not.
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}

    def record(self, peer: str, reason: str, now_s: float, detail: str = "") -> None:
        self.counts[reason] += 1
        host = peer.rpartition(":")[0] or peer
        last_s, unlogged = self._logged.get((host, reason), (-math.inf, 0))
        if now_s - last_s < REFUSAL_LOG_INTERVAL_S:
            self._logged[(host, reason)] = (last_s, unlogged + 1)
            return
        if len(self._logged) >= UNIDENTIFIED_CONNECTIONS_MAX * 16:
            self._logged.clear()
        self._logged[(host, reason)] = (now_s, 0)
        more = f" ({unlogged} more from {host} since the last report)" if unlogged else ""
        level = logging.INFO if reason == "silent" else logging.WARNING
        log.log(
            level, "closed a Raft connection from %s: %s%s", peer, self._why(reason, detail), more
        )

    def _why(self, reason: str, detail: str) -> str:
        if reason == "unauthenticated" and self.secret:
            return (
                "its first message did not authenticate with this member's cluster secret: the "
                "peer has another raft.cluster_secret (or none), or is not an xr member"
            )
        if reason == "unauthenticated":
            return (
                "its first message is not a member's handshake: the peer may have a "
                "raft.cluster_secret while this member has none, or is not an xr member"
            )
        if reason == "bad_message":
            return "a message did not authenticate or parse (replayed, reordered or corrupted)"
        if reason == "frame_too_long":
            return "before identifying itself it sent a frame longer than a handshake"
        if reason == "not_a_member":
            return detail or "its handshake is not a member's"
        return "it did not identify itself within raft.connection_timeout_s"


def refusals(transport: Any) -> Refusals:
    """The transport's `Refusals`, made on first use."""
    found: Refusals | None = getattr(transport, _REFUSALS, None)
    if found is None:
        found = Refusals(secret=transport._syncObj.encryptor is not None)
        setattr(transport, _REFUSALS, found)
    return found


def refused_counts(transport: Any) -> dict[str, int]:
    """How many incoming connections the transport's member closed, by `Refusals` reason."""
    found: Refusals | None = getattr(transport, _REFUSALS, None)
    return {} if found is None else dict(found.counts)


def _refused(connection: Any, reason: str, detail: str = "") -> None:
    """Counts and logs the refusal of an incoming connection (one this member accepted)."""
    transport = getattr(connection, _TRANSPORT, None)
    if transport is not None:
        peer = getattr(connection, _PEER, "an unknown peer")
        refusals(transport).record(peer, reason, time.monotonic(), detail)


def _not_a_member(message: Any) -> str:
    if message == "readonly" or isinstance(message, list):
        return "it asked for a read-only replica or a utility command, which xr refuses"
    if isinstance(message, str):
        return (
            f"it named itself {message[:200]!r}, which is not in this member's raft.peers (a "
            "member started with other raft.peers or raft.address spellings?)"
        )
    return "its handshake is not a member's"


def _peer_name(connection: Any) -> str:
    socket_: Any = getattr(connection, "_TcpConnection__socket", None)
    try:
        host, port = socket_.getpeername()[:2]
    except (AttributeError, OSError, ValueError):
        return "an unknown peer"
    return f"{host}:{port}"


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
            _refused(connection, "frame_too_long")
            connection.disconnect()
            return False
        return more

    def process_parse(connection: Any) -> Any:
        if not _frame_allowed(connection):
            _refused(connection, "frame_too_long")
            connection.disconnect()
            return None
        trusted = getattr(connection, _TRUSTED, False)
        message = original_parse(connection)
        if message is not None:
            if not trusted:
                setattr(connection, _TRUSTED, True)
            return message
        # pysyncobj closes a connection whose frame does not authenticate or parse.
        if connection.state == _DISCONNECTED:
            _refused(connection, "bad_message" if trusted else "unauthenticated")
        return None

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
        _refused(connection, "silent")
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
        setattr(connection, _TRANSPORT, transport)
        setattr(connection, _PEER, _peer_name(connection))
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
            _refused(connection, "not_a_member", _not_a_member(message))
            _close(transport, connection)

    setattr(TCPTransport, "_onNewIncomingConnection", on_new_incoming)  # noqa: B010
    setattr(TCPTransport, "_onIncomingMessageReceived", on_incoming_message)  # noqa: B010
    setattr(TCPTransport, "_onTick", on_tick)  # noqa: B010
