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
flushed on the event loop (a few microseconds; see docs/authorization.md).

A line that cannot be written (a full disk, a read-only file system) never fails its request: it
is lost, and counted (`AuditLog.records_lost`, the metric `xr_audit_records_lost`). The file is
then opened again for the next line, so what its buffer held is dropped rather than written late,
and a line the disk cut short is ended before the next one: the lines the file lacks are exactly
the ones counted. A full disk fails every line, so the failure is reported on stderr at most once
a minute, with the records lost since the last message, and once more, with those lost since,
when lines are written again. A rotation that fails (a directory that refuses the rename) is
reported the same way; the line then goes to the live file, past `audit.bytes_max`, rather than
being lost, and the next line tries the rotation again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import time
from io import TextIOWrapper
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
    """`RotatingFileHandler`, used for its file and its rotation only (`write_line`), with three
    changes. It counts the bytes it wrote instead of asking the file system before every line
    (two `stat`s and a seek, which cost a third of a line's time and, each releasing the
    interpreter lock, more inside a busy node): the file is the node's own. With no rotated
    file to keep (`backupCount` 0) a full file is emptied: the standard handler would then never
    rotate, and the file would grow without bound. And after an error its file is closed and
    opened again at the next line, so a line that failed is never written late, and a stream
    that a failed rotation left closed is never written to again."""

    def __init__(self, path: Path, *, bytes_max: int, backups: int) -> None:
        super().__init__(path, maxBytes=bytes_max, backupCount=backups, encoding="utf-8")
        self._bytes = os.path.getsize(self.baseFilename)

    def write_line(self, line: bytes) -> OSError | None:
        """Appends `line` (one whole line, newline included), rotating first if it would take
        the file to `maxBytes`, and flushes. Raises `OSError` or `ValueError` when the line was
        not written; returns the error of a rotation that failed (the line was then written to
        the live file), else None."""
        size = len(line)
        rotation_error = None
        self.acquire()
        try:
            stream = self.stream or self._reopen()
            if self._bytes > 0 and self._bytes + size >= self.maxBytes:
                rotation_error = self._rotate()
                stream = self.stream or self._reopen()
            stream.write(line.decode("utf-8"))
            stream.flush()
            self._bytes += size
        except (OSError, ValueError):
            # ValueError: a write to a file that was closed.
            self._discard()
            raise
        finally:
            self.release()
        return rotation_error

    def _reopen(self) -> TextIOWrapper:
        """Opens the file again after an error, and learns its size, which the error left
        unknown."""
        self.stream = stream = self._open()
        self._bytes = os.path.getsize(self.baseFilename)
        if self._bytes > 0 and not _ends_a_line(self.baseFilename):
            # The disk filled in the middle of a line: that line is ended (and lost, counted
            # with its record), so the next one is whole and on a line of its own.
            stream.write("\n")
            stream.flush()
            self._bytes += 1
        return stream

    def _discard(self) -> None:
        """Closes the file after an error without writing what its buffer holds: those lines
        were reported lost, and a later write must not bring them back unannounced."""
        stream, self.stream = self.stream, None
        if stream is not None:
            # The flush that closing tries fails as the write did; the buffer goes with it.
            with contextlib.suppress(OSError, ValueError):
                stream.close()

    def _rotate(self) -> OSError | None:
        """Rotates; on an error, goes on with the live file (past `maxBytes`; the next line
        tries again) and returns the error."""
        try:
            self.doRollover()
        except OSError as error:
            self._discard()
            self._reopen()
            return error
        return None

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


def _ends_a_line(path: str) -> bool:
    with open(path, "rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1) == b"\n"


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


# At most one message a minute about a failing audit log: a full disk fails every line, and a
# message for each buried the node's stderr (4,612 lines in 10 s in a QA pass).
REPORT_INTERVAL_S = 60.0


class _Losses:
    """The audit log's lost records, counted, and the messages about them, at most one a
    minute: a message when the first record is lost, then one at the first loss a minute or
    more after the last message, each with the records lost since the last message. The first
    line written after a reported loss gets one more ("being written again"), with those lost
    since; so does the first written a minute or more after the last message, if records were
    lost since without a message. Its methods return the message, or None; the caller prints."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Since the log was opened: the metric xr_audit_records_lost.
        self.records_lost = 0
        self._unreported = 0
        # A "cannot write" message not yet followed by a "written again" one.
        self._failure_reported = False
        self._reported_s: float | None = None

    @property
    def unannounced(self) -> bool:
        """Whether a written line may owe a message (checked first: it costs no clock read)."""
        return self._failure_reported or self._unreported > 0

    def _due(self, now_s: float) -> bool:
        return self._reported_s is None or now_s - self._reported_s >= REPORT_INTERVAL_S

    def lost(self, error: Exception, *, now_s: float) -> str | None:
        self.records_lost += 1
        self._unreported += 1
        if not self._due(now_s):
            return None
        self._reported_s = now_s
        self._failure_reported = True
        lost, self._unreported = self._unreported, 0
        return (
            f"xr: cannot write the audit log {self.path}: {error}; {_records(lost)} lost since "
            f"the last message (the requests go on; xr_audit_records_lost counts them)"
        )

    def written(self, *, now_s: float) -> str | None:
        if not self._failure_reported and not (self._unreported and self._due(now_s)):
            return None
        self._reported_s = now_s
        self._failure_reported = False
        lost, self._unreported = self._unreported, 0
        return (
            f"xr: the audit log {self.path} is being written again; {_records(lost)} lost since "
            f"the last message"
        )


def _records(count: int) -> str:
    return f"{count} record" if count == 1 else f"{count} records"


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
        self._losses = _Losses(self._handler.baseFilename)
        self._rotation_reported_s: float | None = None
        self._closed = False

    @property
    def records_lost(self) -> int:
        """Records that could not be written since the log was opened (xr_audit_records_lost)."""
        return self._losses.records_lost

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
        try:
            rotation_error = self._handler.write_line(self._encoder.encode(line) + b"\n")
        except (OSError, ValueError) as write_error:
            # As `logging.Handler.handleError` reports an error: on stderr, and the request
            # goes on.
            self._report(self._losses.lost(write_error, now_s=self._clock.monotonic_s()))
            return
        if rotation_error is not None:
            self._report_rotation(rotation_error)
        if self._losses.unannounced:
            self._report(self._losses.written(now_s=self._clock.monotonic_s()))

    def _report_rotation(self, error: OSError) -> None:
        now_s = self._clock.monotonic_s()
        last_s = self._rotation_reported_s
        if last_s is not None and now_s - last_s < REPORT_INTERVAL_S:
            return
        self._rotation_reported_s = now_s
        self._report(
            f"xr: cannot rotate the audit log {self._handler.baseFilename}: {error}; writing on "
            f"to it past audit.bytes_max"
        )

    @staticmethod
    def _report(message: str | None) -> None:
        if message is not None:
            print(message, file=sys.stderr)

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
