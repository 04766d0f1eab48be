"""The audit log: one JSON line per write request, who did what, when, and how it ended.

Every request whose method is not GET, HEAD or OPTIONS gets a line, refused ones included (401,
403, any 4xx or 5xx) and one whose client went away before the answer (`status` null, `error`
`request.cancelled`: the write may have been applied). A line holds:

    time        UTC, ISO 8601 with milliseconds ("2025-01-31T12:00:00.123Z")
    principal   {"name", "role", "tenant"} of the token, or null (no valid token)
    method, path, route   the route as the OpenAPI document names it, or "unmatched"
    status      the HTTP status answered
    error       the error code answered ("auth.forbidden"), or null
    request_id  the Xr-Request-Id answered
    remote      the caller's address
    index       the Raft log index the write committed at (Xr-Index), or null

Never the body, the query string or any header: no value, token or secret reaches the file.

The file is written through the standard library's `RotatingFileHandler` on a logger of its own
that is not registered with `logging` and does not propagate, so audit lines never reach the
node's log and the node's logging settings never change the audit log. The handler rotates at
`audit.bytes_max` and keeps at most `audit.files_max` files in all: the live file and
`files_max - 1` rotated ones (`audit.log.1` the newest), deleting the oldest; with
`files_max = 1` the live file is emptied when full. A line is written and flushed on the event
loop (a few microseconds; see docs/authorization.md). An error writing it (a full disk) is
reported on stderr by `logging` and never fails the request.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from logging.handlers import RotatingFileHandler
from pathlib import Path

import msgspec

from node.api.auth import Principal
from raftstore.clock import Clock

__all__ = ["READ_METHODS", "AuditLog"]

# Requests with these methods change nothing and are not audited.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _time(now_ms: int) -> str:
    moment = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _RotatingFile(RotatingFileHandler):
    """`RotatingFileHandler` with two changes. It counts the bytes it wrote instead of asking the
    file system before every line (two `stat`s and a seek, which cost a third of a line's time
    and, each releasing the interpreter lock, more inside a busy node): the file is the node's
    own. And with no rotated file to keep (`backupCount` 0) a full file is emptied: the standard
    handler would then never rotate, and the file would grow without bound."""

    def __init__(self, path: Path, *, bytes_max: int, backups: int) -> None:
        super().__init__(path, maxBytes=bytes_max, backupCount=backups, encoding="utf-8")
        self._bytes = os.path.getsize(self.baseFilename)
        self._line_bytes = 0

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        self._line_bytes = len(self.format(record).encode("utf-8")) + len(self.terminator)
        return self._bytes > 0 and self._bytes + self._line_bytes >= self.maxBytes

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self._bytes += self._line_bytes

    def doRollover(self) -> None:
        self._bytes = 0
        if self.backupCount > 0:
            super().doRollover()
            return
        if self.stream:
            self.stream.close()
        # Opened for writing, which empties it, and then appended to like any live file.
        with open(self.baseFilename, "w", encoding=self.encoding):
            pass
        self.stream = self._open()


class AuditLog:
    def __init__(self, path: Path, *, bytes_max: int, files_max: int, clock: Clock) -> None:
        assert files_max >= 1, files_max
        # Opened now, not at the first write, so a node that cannot write its audit log does
        # not start (`OSError` from the application's start).
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._clock = clock
        self._handler = _RotatingFile(path, bytes_max=bytes_max, backups=files_max - 1)
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        # Constructed, not `logging.getLogger`: one logger per application (a test process runs
        # many), none left behind in logging's registry, and no configuration reaches it.
        self._logger = logging.Logger("xr.audit", logging.INFO)
        self._logger.propagate = False
        self._logger.addHandler(self._handler)

    def record(
        self,
        *,
        principal: Principal | None,
        method: str,
        path: str,
        route: str,
        status: int | None,
        error: str | None,
        request_id: str,
        remote: str | None,
        index: int | None,
    ) -> None:
        line = {
            "time": _time(self._clock.now_ms()),
            "principal": None
            if principal is None
            else {"name": principal.name, "role": principal.role, "tenant": principal.tenant},
            "method": method,
            "path": path,
            "route": route,
            "status": status,
            "error": error,
            "request_id": request_id,
            "remote": remote,
            "index": index,
        }
        # A message without arguments is written as is: no %-formatting of the path.
        self._logger.info(msgspec.json.encode(line).decode())

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._handler.close()
