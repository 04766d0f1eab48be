"""Lock safety through fencing tokens: the protected resource never goes back to an older holder.

Operations, all with a value {"lock": name, "token": int} except acquire's invoke:
- `acquire`: ok value carries the token granted;
- `access`: the holder presents its token to the protected resource; ok = accepted, fail =
  rejected as stale, info = unknown (ignored: it may or may not have been accepted);
- `release`: recorded, not judged (a lease may expire under a holder; fencing is what keeps the
  resource safe then).

The property, per lock: every accepted access with a lower token happens before, in real time,
every accepted access with a higher token could have; that is, the tokens the resource accepted,
in the order it accepted them, never decrease. Each access is accepted at some moment between its
invoke and completion, so the property is violated exactly when an accepted access with token t2
completed before an accepted access with a lower token t1 < t2 was even invoked (checking every
such pair is enough: if no pair is ordered the wrong way, accepting each token group at the latest
invoke among it and the lower groups is a non-decreasing order).

Also anomalies: an accepted access whose token no acquire returned (ok, or info carrying a value),
an acquire granted a lower token than an acquire that completed before it was invoked, and two
`ok` acquires (distinct operations) granted the same token for one lock. The workload grants a
fresh session inside each acquire, so two such acquires are two grants, and a token that fences
off nobody (`duplicate-grant`).

A token is an integer (not a boolean). An `ok` acquire or access without one, or a token of any
other type, is a malformed history: `check` raises HistoryError (a ValueError) naming the op.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from xr_jepsen.checkers.base import CheckResult, anomaly, client_operations, smallest_window
from xr_jepsen.history import HistoryError, Op, Operation

__all__ = ["LockChecker"]


def _lock_and_token(op: Op, *, required: bool) -> tuple[str, int] | None:
    """The (lock, token) that `op`'s value carries, None when it carries no token and none is
    `required`; HistoryError for a token that is not an integer, or a missing required one."""
    value = op.value
    if not isinstance(value, dict) or "token" not in value:
        if required:
            raise HistoryError(f"an {op.type} {op.f} must carry a token", index=op.index)
        return None
    token = value["token"]
    if not isinstance(token, int) or isinstance(token, bool):
        raise HistoryError(f"{op.f} token must be an integer, not {token!r}", index=op.index)
    return str(value.get("lock")), token


class LockChecker:
    """Checks fencing-token order per lock; see the module docstring for the exact property."""

    def __init__(self, *, name: str = "locks") -> None:
        self.name = name

    def check(self, ops: Sequence[Op]) -> CheckResult:
        started_s = time.perf_counter()
        operations = client_operations(ops, ("acquire", "access", "release"))
        granted: dict[str, set[int]] = {}
        acquires: dict[str, list[tuple[Operation, int]]] = {}
        accesses: dict[str, list[tuple[Operation, int]]] = {}
        for operation in operations:
            completion = operation.completion
            if operation.f == "acquire" and completion is not None and completion.type != "fail":
                found = _lock_and_token(completion, required=completion.type == "ok")
                if found is not None:
                    granted.setdefault(found[0], set()).add(found[1])
                    if completion.type == "ok":
                        acquires.setdefault(found[0], []).append((operation, found[1]))
            elif operation.f == "access" and operation.type == "ok":
                assert completion is not None
                found = _lock_and_token(operation.invoke, required=False)
                if found is None:
                    found = _lock_and_token(completion, required=True)
                assert found is not None
                accesses.setdefault(found[0], []).append((operation, found[1]))
        anomalies: list[dict[str, Any]] = []
        for lock in sorted(accesses):
            anomalies += _unexpected_tokens(lock, accesses[lock], granted.get(lock, set()))
            anomalies += _out_of_order(lock, accesses[lock], "access")
        for lock in sorted(acquires):
            anomalies += _out_of_order(lock, acquires[lock], "acquire")
            anomalies += _duplicate_grants(lock, acquires[lock])
        valid = not anomalies
        accepted = sum(len(items) for items in accesses.values())
        return CheckResult(
            checker=self.name,
            valid=valid,
            message=(
                f"{accepted} accepted accesses over {len(accesses)} locks in token order"
                if valid
                else f"{len(anomalies)} fencing anomalies"
            ),
            anomalies=anomalies,
            window=None if valid else smallest_window(anomalies),
            stats={
                "locks": len(set(accesses) | set(acquires)),
                "accepted_accesses": accepted,
                "acquires": sum(len(items) for items in acquires.values()),
                "elapsed_s": time.perf_counter() - started_s,
            },
        )


def _unexpected_tokens(
    lock: str, accesses: list[tuple[Operation, int]], granted: set[int]
) -> list[dict[str, Any]]:
    return [
        anomaly(
            "unknown-token",
            f"lock {lock!r}: access op {operation.invoke.index} was accepted with token {token}, "
            "which no acquire returned",
            operation.indices,
            lock=lock,
        )
        for operation, token in accesses
        if token not in granted
    ]


def _duplicate_grants(lock: str, acquires: list[tuple[Operation, int]]) -> list[dict[str, Any]]:
    """Each `ok` acquire granted a token an earlier `ok` acquire of the lock was granted too
    (one anomaly per later grant, naming the first)."""
    first: dict[int, Operation] = {}
    anomalies: list[dict[str, Any]] = []
    for operation, token in sorted(acquires, key=lambda item: item[0].invoke.index):
        earlier = first.setdefault(token, operation)
        if earlier is not operation:
            anomalies.append(
                anomaly(
                    "duplicate-grant",
                    f"lock {lock!r}: acquire ops {earlier.invoke.index} and "
                    f"{operation.invoke.index} were both granted token {token}",
                    [*earlier.indices, *operation.indices],
                    lock=lock,
                )
            )
    return anomalies


def _out_of_order(lock: str, items: list[tuple[Operation, int]], what: str) -> list[dict[str, Any]]:
    """Pairs where a higher token completed before a lower one was invoked (one per offender).

    Sweeping tokens upwards, each item is compared with the latest invoke among lower tokens: if
    it completed before that invoke, the two are in the wrong order."""
    anomalies: list[dict[str, Any]] = []
    by_token: dict[int, list[Operation]] = {}
    for operation, token in items:
        by_token.setdefault(token, []).append(operation)
    verb = "granted" if what == "acquire" else "accepted"
    latest: tuple[int, Operation, int] | None = None  # (invoke index, operation, token)
    for token in sorted(by_token):
        group = by_token[token]
        for operation in group:
            assert operation.completion is not None
            if latest is not None and operation.completion.index < latest[0]:
                _, lower, lower_token = latest
                anomalies.append(
                    anomaly(
                        f"{what}-order",
                        f"lock {lock!r}: {what} op {operation.invoke.index} with token {token} "
                        f"completed before {what} op {lower.invoke.index} with the lower token "
                        f"{lower_token} was invoked, yet both were {verb}",
                        [*operation.indices, *lower.indices],
                        lock=lock,
                    )
                )
        for operation in group:
            if latest is None or operation.invoke.index > latest[0]:
                latest = (operation.invoke.index, operation, token)
    return anomalies
