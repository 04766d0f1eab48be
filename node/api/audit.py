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

The file is the stream of a standard library `RotatingFileHandler` that is attached to no
logger: audit lines never reach the node's log, and the node's logging settings never change the
audit log. Lines go to the handler's file directly (`_RotatingFile.write_line`), without a
`LogRecord`, a logger or a formatter, which cost three quarters of a line's time; the handler's
own `doRollover` rotates. It rotates at `audit.bytes_max` and keeps at most `audit.files_max`
files in all: the live file and `files_max - 1` rotated ones (`audit.log.1` the newest), deleting
the oldest; with `files_max = 1` the live file is emptied when full. A line is written and
flushed on the event loop (a few microseconds; see docs/authorization.md). An error writing it
(a full disk) is reported on stderr and never fails the request.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path

import msgspec

from node.api.auth import Principal
from raftstore.clock import Clock

__all__ = ["READ_METHODS", "AuditLog"]

# Requests with these methods change nothing and are not audited.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class _TimeText:
    """A moment as the audit log writes it: UTC, ISO 8601 with milliseconds
    ("2025-01-31T12:00:00.123Z"). The text of the last second is kept: lines come many to a
    second, and formatting a datetime costs about 2 microseconds a line."""

    def __init__(self) -> None:
        self._second = -1
        self._second_text = ""

    def text(self, now_ms: int) -> str:
        second, milliseconds = divmod(now_ms, 1000)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{milliseconds:03d}Z"


class _RotatingFile(RotatingFileHandler):
    """`RotatingFileHandler`, used for its file and its rotation only (`write_line`), with two
    changes. It counts the bytes it wrote instead of asking the file system before every line
    (two `stat`s and a seek, which cost a third of a line's time and, each releasing the
    interpreter lock, more inside a busy node): the file is the node's own. And with no rotated
    file to keep (`backupCount` 0) a full file is emptied: the standard handler would then never
    rotate, and the file would grow without bound."""

    def __init__(self, path: Path, *, bytes_max: int, backups: int) -> None:
        super().__init__(path, maxBytes=bytes_max, backupCount=backups, encoding="utf-8")
        self._bytes = os.path.getsize(self.baseFilename)

    def write_line(self, line: bytes) -> None:
        """Appends `line` (one whole line, newline included), rotating first if it would take
        the file to `maxBytes`, and flushes; an error is reported on stderr, never raised."""
        size = len(line)
        self.acquire()
        try:
            if self._bytes > 0 and self._bytes + size >= self.maxBytes:
                self.doRollover()
            if self.stream is None:
                self.stream = self._open()
            self.stream.write(line.decode("utf-8"))
            self.stream.flush()
            self._bytes += size
        except (OSError, ValueError) as error:
            # As `logging.Handler.handleError` reports an error: on stderr, and the request goes
            # on. ValueError: a write to a file that was closed.
            print(f"xr: cannot write the audit log {self.baseFilename}: {error}", file=sys.stderr)
        finally:
            self.release()

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


def check_audit_path(path: Path) -> None:
    """Refuses (`OSError`, saying why) an audit log path that names something other than a
    regular file: the log is rotated by renaming it, which would move a device such as
    /dev/null away, and a named pipe would stop the node at its first line until a reader came."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise OSError(
            errno.EINVAL,
            "not a regular file (the audit log is rotated by renaming it; name a file of its own)",
            str(path),
        )


class AuditLog:
    def __init__(self, path: Path, *, bytes_max: int, files_max: int, clock: Clock) -> None:
        assert files_max >= 1, files_max
        # Opened now, not at the first write, so a node that cannot write its audit log does
        # not start (`OSError` from the application's start).
        check_audit_path(path)
        # Who did what: a directory made here is 0750 whatever the umask (its group, a log
        # shipper's, may read it; no one else). An existing one is left as it is.
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.path = path
        self._clock = clock
        self._time = _TimeText()
        self._encoder = msgspec.json.Encoder()
        self._handler = _RotatingFile(path, bytes_max=bytes_max, backups=files_max - 1)
        self._closed = False

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
        if self._closed:
            return
        line = {
            "time": self._time.text(self._clock.now_ms()),
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
        self._handler.write_line(self._encoder.encode(line) + b"\n")

    def close(self) -> None:
        # A request that ends after the application stopped writes nothing (the handler would
        # open the file again).
        self._closed = True
        try:
            self._handler.close()
        except OSError as error:
            # Lines still buffered meet a full disk when the file is closed: reported as a
            # failed write is, and the node's shutdown goes on.
            print(
                f"xr: cannot write the audit log {self._handler.baseFilename}: {error}",
                file=sys.stderr,
            )
