"""The catalogue of every error xr reports, in one place.

Every error has a stable `code` (clients match on it, never on the message), the HTTP status the API
answers with, and `definite`: True when the operation certainly did not take effect, False when it
may have (timeouts, lost leaders). When in doubt an error is indefinite, which is always safe.
The client maps `code` back to the same class with `error_from_code`.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BodyTimeout",
    "CapacityExceeded",
    "CheckpointNotNewer",
    "ClusterUnavailable",
    "CodecError",
    "Compacted",
    "CompareFailed",
    "Forbidden",
    "InvalidArgument",
    "InvalidTransition",
    "LeaderChanged",
    "LockNotHeld",
    "MembershipChangeInProgress",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RequestTooOld",
    "StaleSchedule",
    "StaleToken",
    "Timeout",
    "Unauthenticated",
    "UnknownOutcome",
    "UnsupportedVersion",
    "XrError",
    "error_from_code",
]


class XrError(Exception):
    """The root of every error xr raises on purpose."""

    code: ClassVar[str] = "xr.internal"
    http_status: ClassVar[int] = 500
    definite: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "definite": self.definite}


class CodecError(XrError):
    """Bytes that are not a well-formed command or snapshot."""

    code = "codec.malformed"
    http_status = 400
    definite = True


class UnsupportedVersion(CodecError):
    code = "codec.unsupported_version"


class InvalidArgument(XrError):
    """A well-formed request whose values are not allowed."""

    code = "request.invalid"
    http_status = 400
    definite = True


class PayloadTooLarge(InvalidArgument):
    code = "limit.payload_too_large"
    http_status = 413


class BodyTimeout(InvalidArgument):
    """A request's body did not arrive within the node's time for it (`http.request_timeout_s`);
    nothing was done."""

    code = "request.body_timeout"
    http_status = 408


class CapacityExceeded(XrError):
    """A bounded table or queue is full; retrying later may succeed."""

    code = "limit.capacity"
    http_status = 429
    definite = True


class Unauthenticated(XrError):
    """No bearer token, or one the node does not know."""

    code = "auth.unauthenticated"
    http_status = 401
    definite = True


class Forbidden(XrError):
    """The caller's role does not permit the request."""

    code = "auth.forbidden"
    http_status = 403
    definite = True


class NotFound(XrError):
    code = "not_found"
    http_status = 404
    definite = True


class CompareFailed(XrError):
    """A compare-and-set whose expected revision did not match."""

    code = "kv.compare_failed"
    http_status = 409
    definite = True


class Compacted(XrError):
    """A watch asked for revisions older than the retained history."""

    code = "kv.compacted"
    http_status = 410
    definite = True


class LockNotHeld(XrError):
    code = "lock.not_held"
    http_status = 409
    definite = True


class StaleToken(XrError):
    """An update carried a fencing token that is no longer current: the sender is a zombie."""

    code = "fencing.stale_token"
    http_status = 409
    definite = True


class InvalidTransition(XrError):
    code = "job.invalid_transition"
    http_status = 409
    definite = True


class StaleSchedule(XrError):
    """A scheduling pass was computed from a state that has changed since; it is recomputed."""

    code = "schedule.stale"
    http_status = 409
    definite = True


class CheckpointNotNewer(XrError):
    code = "checkpoint.not_newer"
    http_status = 409
    definite = True


class RequestTooOld(XrError):
    """A retried request older than the results kept for its client; it may have been applied."""

    code = "request.too_old"
    http_status = 409
    definite = False


class Overloaded(XrError):
    """Too many proposals in flight; nothing was proposed."""

    code = "cluster.overloaded"
    http_status = 429
    definite = True


class ClusterUnavailable(XrError):
    """No leader or no quorum was reachable; nothing was proposed."""

    code = "cluster.unavailable"
    http_status = 503
    definite = True


class MembershipChangeInProgress(XrError):
    """A membership change was asked for while another has not yet committed."""

    code = "cluster.membership_change_in_progress"
    http_status = 409
    definite = True


class Timeout(XrError):
    code = "cluster.timeout"
    http_status = 504
    definite = False


class LeaderChanged(XrError):
    code = "cluster.leader_changed"
    http_status = 503
    definite = False


class UnknownOutcome(XrError):
    code = "cluster.unknown_outcome"
    http_status = 503
    definite = False


def _catalogue() -> dict[str, type[XrError]]:
    found: dict[str, type[XrError]] = {}
    pending: list[type[XrError]] = [XrError]
    while pending:
        cls = pending.pop()
        if cls.code in found:
            raise AssertionError(f"error code {cls.code!r} is used twice")
        found[cls.code] = cls
        pending.extend(cls.__subclasses__())
    return found


CATALOGUE: dict[str, type[XrError]] = _catalogue()


def error_from_code(code: str, message: str) -> XrError:
    """Rebuild the typed error a server reported; unknown codes become indefinite `XrError`s."""
    cls = CATALOGUE.get(code)
    if cls is None:
        error = XrError(f"{code}: {message}")
        return error
    return cls(message)
