"""Errors only the client raises: a session or lock that was lost while held, and a lock that was
not granted in time.

They join `xrcore.errors`' single root `XrError` but are not in the server's catalogue: no server
answers with them. Each is raised in the caller's own task or thread, never from a background
keep-alive.
"""

from __future__ import annotations

from xrcore.errors import XrError

__all__ = ["LockLost", "LockNotGranted", "SessionLost"]


class SessionLost(XrError):
    """A session kept alive by the client ended (revoked, expired) or went without a successful
    keep-alive for a whole TTL, so the cluster may already have ended it."""

    code = "session.lost"
    http_status = 409
    # The work done while the session was believed alive may or may not have been protected.
    definite = False


class LockLost(XrError):
    """A held lock may have passed to someone else: its session was lost or the lock no longer
    belongs to it. Work done under the lock since then was not exclusive; resources that check
    the fencing token reject it."""

    code = "lock.lost"
    http_status = 409
    definite = False


class LockNotGranted(XrError):
    """A lock was not granted within the time the caller was willing to wait, or the session that
    waited for it was lost first (revoked, expired, or not kept alive for a TTL: the message says
    which); the caller does not hold it and has left the queue."""

    code = "lock.not_granted"
    http_status = 409
    definite = True
