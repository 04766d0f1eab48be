"""Checkers: each reads a history and returns a three-valued verdict with the anomalies found.

`LinearizableChecker` (with the `register` and `kv` models), `LockChecker`, `LeaseChecker`,
`QueueChecker` and `SetChecker`, combined with `compose`. See docs/jepsen-checkers.md for what
each one proves.
"""

from xr_jepsen.checkers.base import Checker, CheckResult, Valid, compose, merge_valid
from xr_jepsen.checkers.leases import LeaseChecker
from xr_jepsen.checkers.linearizable import LinearizableChecker
from xr_jepsen.checkers.locks import LockChecker
from xr_jepsen.checkers.models import ANY, UNKNOWN, Model, kv, register
from xr_jepsen.checkers.queue import QueueChecker
from xr_jepsen.checkers.sets import SetChecker

__all__ = [
    "ANY",
    "UNKNOWN",
    "CheckResult",
    "Checker",
    "LeaseChecker",
    "LinearizableChecker",
    "LockChecker",
    "Model",
    "QueueChecker",
    "SetChecker",
    "Valid",
    "compose",
    "kv",
    "merge_valid",
    "register",
]
