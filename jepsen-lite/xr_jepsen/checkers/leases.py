"""Leases are not cut short: a lock holder keeps its lock for at least its session's TTL.

Fencing keeps the protected resource safe when a lease expires under a holder, so the lock
checker cannot see a lease that expired early; this checker can. The locks workload grants a
fresh session (TTL `ttl_s`, not kept alive) inside each acquire, so the session's lease starts
no earlier than the acquire's invoke, and the system may expire it no earlier than `ttl_s` after
that on a clock running at the true rate. A `release` that fails because the lease is gone, with
`lock.not_held` (the session is there, the lock is not its) or `not_found` (the session itself
has expired and is gone), and completed less than `ttl_s - slack_s` after the holder's acquire
was invoked is an `early-expiry` anomaly. `slack_s` covers how far one log entry may move xr's
lease clock (a clock step is bounded per entry) and the harness's own timing.

The property holds only for clocks whose rate is true: if the history's nemesis events changed a
clock's rate (`rate` other than 1), the verdict is "unknown" (anomalies are still listed), since
no lease system can tell a fast clock from elapsed time on its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from xr_jepsen.checkers.base import CheckResult, Valid, anomaly, client_operations, smallest_window
from xr_jepsen.history import Op, Operation, is_nemesis

__all__ = ["LeaseChecker"]

# The error codes of a release that says its lease is gone (an error reads "<code>: <message>").
# Until 6 December 2026 only lock.not_held counted, and a holder whose whole session had expired
# (not_found) went unseen: the local-clock-leases fault was caught only when a release happened to
# answer the first.
LEASE_GONE_CODES = ("lock.not_held", "not_found")


def _rate_changed(ops: Sequence[Op]) -> bool:
    for op in ops:
        if is_nemesis(op) and isinstance(op.value, dict):
            rate = op.value.get("rate")
            if isinstance(rate, int | float) and rate != 1:
                return True
    return False


class LeaseChecker:
    """Checks that no lease ended before its TTL; see the module docstring."""

    def __init__(self, *, ttl_s: float, slack_s: float = 1.5, name: str = "leases") -> None:
        self.ttl_s = ttl_s
        self.slack_s = slack_s
        self.name = name

    def check(self, ops: Sequence[Op]) -> CheckResult:
        started_s = time.perf_counter()
        minimum_ns = int((self.ttl_s - self.slack_s) * 1e9)
        held: dict[int, tuple[Operation, Any]] = {}  # process -> (acquire, token)
        anomalies: list[dict[str, Any]] = []
        checked = 0
        for operation in client_operations(ops, ("acquire", "release")):
            process = operation.invoke.process
            completion = operation.completion
            if operation.f == "acquire":
                value = completion.value if completion is not None else None
                if operation.type == "ok" and isinstance(value, dict):
                    held[process] = (operation, value.get("token"))
                continue
            acquired = held.pop(process, None)
            if acquired is None or completion is None:
                continue
            acquire, token = acquired
            if not (
                isinstance(operation.invoke.value, dict)
                and operation.invoke.value.get("token") == token
            ):
                continue
            checked += 1
            code = (completion.error or "").partition(":")[0].strip()
            lost = operation.type == "fail" and code in LEASE_GONE_CODES
            held_ns = completion.time_ns - acquire.invoke.time_ns
            if lost and held_ns < minimum_ns:
                anomalies.append(
                    anomaly(
                        "early-expiry",
                        f"process {process} lost lock {operation.invoke.value.get('lock')!r} "
                        f"(token {token}) {held_ns / 1e9:.2f} s after asking for it; its lease "
                        f"was {self.ttl_s:g} s",
                        [*acquire.indices, *operation.indices],
                    )
                )
        rates = _rate_changed(ops)
        valid: Valid = "unknown" if rates else not anomalies
        message = (
            f"{checked} holds checked; "
            + (f"{len(anomalies)} leases ended early" if anomalies else "no lease ended early")
            + ("; clock rates were changed, so leases could not be judged" if rates else "")
        )
        return CheckResult(
            checker=self.name,
            valid=valid,
            message=message,
            anomalies=anomalies,
            window=smallest_window(anomalies) if valid is False else None,
            stats={
                "holds_checked": checked,
                "clock_rates_changed": rates,
                "elapsed_s": time.perf_counter() - started_s,
            },
        )
