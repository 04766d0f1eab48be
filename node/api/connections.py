"""A bound on the HTTP API's open connections (`http.connections_max`).

Each connection holds a file descriptor, and the node's Raft connections, journal, logs and
checkpoints need descriptors of their own: clients that open connections without end (or slowly
enough that `http.idle_timeout_s` has not closed them yet) would otherwise take every descriptor
the process may have, and the node would stop working, Raft included. Beyond the bound a new
connection is answered 429 `limit.capacity` with `Retry-After` (the client library retries it)
and closed, without reading its request.

aiohttp has no such bound. Its sites take the application runner's `server` as the protocol
factory for each accepted connection, so `CappedAppRunner` hands them a factory that counts the
server's connections first. By default the bound is the descriptor limit less what the rest of
the node needs, so that it refuses only connections that would take those descriptors; the node
raises its soft descriptor limit toward the hard one first (`connections_bound`), as Go programs
such as etcd do at start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from typing import Any, cast

from aiohttp import web
from aiohttp.web_server import Server

from xrcore.errors import CapacityExceeded

__all__ = [
    "DESCRIPTORS_RESERVED",
    "DESCRIPTORS_WANTED",
    "CappedAppRunner",
    "connections_bound",
    "open_connections",
]

log = logging.getLogger(__name__)

# Descriptors kept for everything but the API's connections: Raft's connections, the journal,
# logs, the executor's jobs and checkpoints, the sync helper.
DESCRIPTORS_RESERVED = 1_024
# The descriptor limit the node asks for when `http.connections_max` is 0 (the default).
DESCRIPTORS_WANTED = 65_536


def _refusal(connections_max: int) -> bytes:
    error = CapacityExceeded(
        f"{connections_max} connections are already open to this node (http.connections_max); "
        "retry later"
    )
    body = json.dumps({"error": error.to_dict()}).encode()
    head = (
        "HTTP/1.1 429 Too Many Requests\r\n"
        "Content-Type: application/json\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Refusal(asyncio.Protocol):
    """Answers 429 and closes, whatever the client sends."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio's classes).
        cast(asyncio.WriteTransport, transport).write(self._answer)
        transport.close()


def open_connections(server: Server) -> int:
    """How many connections `server` holds. aiohttp's public `connections` copies its table into
    a new list on every call, which at tens of thousands of connections would make each accept
    cost a copy of them all; the table's length is read instead where aiohttp has it."""
    table = getattr(server, "_connections", None)
    if isinstance(table, dict):
        return len(table)
    return len(server.connections)


class _CappedFactory:
    """The protocol factory the sites use: aiohttp's server while it has fewer than
    `connections_max` connections, a refusal beyond (counted in the runner)."""

    def __init__(self, server: Server, runner: CappedAppRunner) -> None:
        self._server = server
        self._runner = runner
        self._answer = _refusal(runner.connections_max)

    def __call__(self) -> asyncio.Protocol:
        if open_connections(self._server) >= self._runner.connections_max:
            self._runner.connections_refused += 1
            return _Refusal(self._answer)
        protocol: asyncio.Protocol = self._server()
        return protocol


class CappedAppRunner(web.AppRunner):
    """An AppRunner whose sites accept at most `connections_max` connections at once. It counts
    the connections it refused (`connections_refused`) for the node's metrics."""

    def __init__(self, app: web.Application, *, connections_max: int, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.connections_max = connections_max
        self.connections_refused = 0

    @property
    def server(self) -> Any:
        server = super().server
        return None if server is None else _CappedFactory(server, self)

    def connections_open(self) -> int:
        """The API connections open now (0 before `setup`)."""
        server = super().server
        return 0 if server is None else open_connections(server)


def connections_bound(configured: int) -> int:
    """The bound on the API's open connections: `configured`, or with 0 (the default) the
    process's descriptor limit less what the rest of the node needs. The soft descriptor limit
    is raised toward the hard one first, to fit `configured` or, with 0, up to
    `DESCRIPTORS_WANTED`; a warning is logged when `configured` does not fit."""
    wanted = configured + DESCRIPTORS_RESERVED if configured else DESCRIPTORS_WANTED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured or DESCRIPTORS_WANTED - DESCRIPTORS_RESERVED
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as error:
            log.warning(
                "could not raise the descriptor limit from %d to %d: %s", soft, target, error
            )
    # On a small limit the rest of the node keeps half of it.
    room = soft - min(DESCRIPTORS_RESERVED, soft // 2)
    if not configured:
        return room
    if configured > room:
        log.warning(
            "the descriptor limit (%d, ulimit -n) leaves room for about %d API connections, "
            "fewer than http.connections_max (%d): past that, accepting a connection fails "
            "instead of being refused with 429; raise the limit or lower the setting",
            soft,
            room,
            configured,
        )
    return configured
