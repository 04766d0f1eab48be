"""A grow-only set: every acknowledged add is in the final read, and nothing else is.

Operations: `add` (value: the element; ok = acknowledged, fail = definitely not added, info =
maybe) and `read-final` (ok value: the list of elements; the last such read counts).

Anomalies: lost (an add acknowledged before the final read began is missing from it), unexpected
(the read holds an element no add attempted, or only failed adds did) and duplicate (the read
lists an element twice). An add still in flight when the read began may or may not show. Without
a final read the verdict is "unknown".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from xr_jepsen.checkers.base import CheckResult, Valid, anomaly, client_operations, smallest_window
from xr_jepsen.checkers.models import freeze
from xr_jepsen.history import Op, Operation

__all__ = ["SetChecker"]


class SetChecker:
    """Checks a grow-only set against its final read; see the module docstring."""

    def __init__(self, *, name: str = "set") -> None:
        self.name = name

    def check(self, ops: Sequence[Op]) -> CheckResult:
        started_s = time.perf_counter()
        operations = client_operations(ops, ("add", "read-final"))
        attempted: dict[Hashable, Operation] = {}
        acknowledged: dict[Hashable, Operation] = {}
        final: Operation | None = None
        for operation in operations:
            if operation.f == "read-final":
                if operation.type == "ok":
                    final = operation
                continue
            if operation.type == "fail":
                continue
            element = freeze(operation.invoke.value)
            attempted.setdefault(element, operation)
            if operation.type == "ok":
                acknowledged.setdefault(element, operation)
        stats: dict[str, Any] = {"attempted": len(attempted), "acknowledged": len(acknowledged)}
        if final is None:
            stats["elapsed_s"] = time.perf_counter() - started_s
            return CheckResult(
                checker=self.name, valid="unknown", message="no final read", stats=stats
            )
        values = final.value if isinstance(final.value, list) else []
        counts = Counter(freeze(value) for value in values)
        anomalies: list[dict[str, Any]] = []
        read_started = final.invoke.index
        for element, add in acknowledged.items():
            assert add.completion is not None
            if element not in counts and add.completion.index < read_started:
                anomalies.append(
                    anomaly(
                        "lost",
                        f"acknowledged add of {element!r} (op {add.invoke.index}) is missing "
                        "from the final read",
                        [*add.indices, *final.indices],
                    )
                )
        for element, count in counts.items():
            if element not in attempted:
                anomalies.append(
                    anomaly(
                        "unexpected",
                        f"the final read holds {element!r}, which no add attempted (or only "
                        "failed ones)",
                        final.indices,
                    )
                )
            if count > 1:
                anomalies.append(
                    anomaly(
                        "duplicate",
                        f"the final read lists {element!r} {count} times",
                        final.indices,
                    )
                )
        valid: Valid = not anomalies
        stats["read"] = len(values)
        stats["elapsed_s"] = time.perf_counter() - started_s
        return CheckResult(
            checker=self.name,
            valid=valid,
            message=(
                f"all {len(acknowledged)} acknowledged adds are in the final read"
                if valid
                else f"{len(anomalies)} anomalies"
            ),
            anomalies=anomalies,
            window=smallest_window(anomalies) if valid is False else None,
            stats=stats,
        )
