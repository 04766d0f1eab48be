"""What every checker returns and how checkers combine: three-valued verdicts and `compose`.

A checker reads a whole history and says whether it obeys one safety property: True (it does),
False (it does not, and `anomalies` say where) or "unknown" (the history cannot tell, for example
there was no final read, or the search ran out of its time budget). "unknown" is never a pass.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from xr_jepsen.history import Op, Operation, is_nemesis, pair

__all__ = [
    "CheckResult",
    "Checker",
    "Valid",
    "anomaly",
    "client_operations",
    "compose",
    "merge_valid",
    "smallest_window",
]

Valid = bool | Literal["unknown"]


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """One checker's verdict on one history.

    Each anomaly is `{"kind": str, "message": str, "ops": [history indices]}` (a checker may add
    keys such as "key"). `window` is the smallest failing range of history indices, inclusive,
    when the checker can find one and `valid` is False.
    """

    checker: str
    valid: Valid
    message: str
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    window: tuple[int, int] | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "checker": self.checker,
            "valid": self.valid,
            "message": self.message,
            "anomalies": self.anomalies,
            "window": None if self.window is None else list(self.window),
            "stats": self.stats,
        }


class Checker(Protocol):
    """Anything with a name that judges a history."""

    name: str

    def check(self, ops: Sequence[Op]) -> CheckResult: ...


def anomaly(kind: str, message: str, ops: Sequence[int], **extra: Any) -> dict[str, Any]:
    """One anomaly in the shape CheckResult documents; `ops` are sorted history indices."""
    return {"kind": kind, "message": message, "ops": sorted(set(ops)), **extra}


def client_operations(ops: Sequence[Op], f: Sequence[str] | None = None) -> list[Operation]:
    """The paired client operations of a history, nemesis events left out, optionally only
    those whose f is in `f`."""
    operations = pair([op for op in ops if not is_nemesis(op)])
    if f is None:
        return operations
    wanted = set(f)
    return [operation for operation in operations if operation.f in wanted]


def smallest_window(anomalies: Sequence[dict[str, Any]]) -> tuple[int, int] | None:
    """The shortest (first, last) span of history indices among the anomalies' ops."""
    spans = [(min(item["ops"]), max(item["ops"])) for item in anomalies if item["ops"]]
    return min(spans, key=lambda span: (span[1] - span[0], span[0])) if spans else None


def merge_valid(verdicts: Sequence[Valid]) -> Valid:
    """False if any is False, else "unknown" if any is, else True (also for no verdicts)."""
    if any(verdict is False for verdict in verdicts):
        return False
    if any(verdict == "unknown" for verdict in verdicts):
        return "unknown"
    return True


class _Composed:
    def __init__(self, checkers: Mapping[str, Checker], *, name: str = "compose") -> None:
        self.checkers = dict(checkers)
        self.name = name

    def check(self, ops: Sequence[Op]) -> CheckResult:
        started_s = time.perf_counter()
        results = {name: checker.check(ops) for name, checker in self.checkers.items()}
        valid = merge_valid([result.valid for result in results.values()])
        anomalies = [
            {**item, "checker": name}
            for name, result in results.items()
            for item in result.anomalies
        ]
        # The window of the first failing checker, in the order they were given.
        window = next((result.window for result in results.values() if result.valid is False), None)
        message = "; ".join(f"{name}: {result.valid}" for name, result in results.items())
        return CheckResult(
            checker=self.name,
            valid=valid,
            message=message,
            anomalies=anomalies,
            window=window,
            stats={
                "results": {name: result.to_json() for name, result in results.items()},
                "elapsed_s": time.perf_counter() - started_s,
            },
        )


def compose(checkers: Mapping[str, Checker]) -> Checker:
    """One checker that runs each of `checkers` on the same history. Its verdict is False if any
    is False, else "unknown" if any is, else True; `stats["results"]` holds each sub-result's
    JSON by name, and each anomaly gains a "checker" key naming the one that found it."""
    return _Composed(dict(checkers))
