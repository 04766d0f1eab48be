"""Exactly-once jobs: every acknowledged job succeeds exactly once, and the protected resource
ends with the effect of the attempt the system counted.

Operations:
- `enqueue`: value is the job's unique key (a string); ok = acknowledged (its value may be
  {"key": ..., "job_id": ...}), fail = definitely not enqueued, info = maybe.
- `complete`: recorded by the protected resource the jobs write to; ok value {"key": k,
  "token": t, "job_id": j} when the resource accepted the attempt with fencing token t of job j;
  fail = rejected.
- `read-final`: ok value {key: {"state": "succeeded" | ..., "token": int | null, "job_ids":
  [j, ...]}}, the system's final word on every job (the last such read counts): the state and
  token of the key's job, and the ids of every job the system holds under that key.
`job_id` and `job_ids` may be absent (histories recorded before they were); then a key's jobs
cannot be told apart and `duplicate-job` is not judged. A token is an integer (not a boolean) or
null, a job id a string: any other type is a malformed history, and `check` raises HistoryError
(a ValueError) naming the op.

What exactly-once means with a fenced resource: an attempt may take effect and then lose its
lease before its completion commits (its region died a moment too soon); the job then runs again
with a higher token, and the resource, which only accepts tokens at least as high as the last it
accepted, keeps the new effect. Such superseded effects are counted (`reexecuted`: the jobs that
ran again; `superseded`: their effects the newer ones replaced), not flagged. The same key
served by two jobs is another matter: the enqueue itself was applied twice.
Anomalies:
- lost: an enqueue acknowledged before the final read began that is not succeeded in the final
  read, or whose key the resource never accepted;
- duplicate: the same token accepted twice for a key (one attempt's effect counted twice);
- duplicate-job: a key served by two or more job ids, in accepted completions or in the final
  read (an enqueue applied twice, each copy running to its own effect);
- fencing: for a key, the resource accepted a token lower than one it had already accepted (a
  zombie attempt took effect after its successor);
- stale: an accepted token higher than the final succeeded attempt's (the resource's last word
  came from an attempt the system did not count);
- missing: the final succeeded attempt's token was never accepted, while no completion of that
  attempt is of unknown outcome (it succeeded without its effect);
- unexpected: a completion or a final succeeded job for a key that was never enqueued (a failed
  enqueue did not happen). An info enqueue may or may not show up.
Without a final read only duplicate, duplicate-job, fencing and unexpected completions can be
judged: the verdict is False if one is found, else "unknown".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from xr_jepsen.checkers.base import CheckResult, Valid, anomaly, client_operations, smallest_window
from xr_jepsen.history import HistoryError, Op, Operation

__all__ = ["QueueChecker"]


def _job_key(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("key"), str):
        return str(value["key"])
    return None


def _token(op: Op, value: Any) -> int | None:
    """The token in `value` (None when it has none); HistoryError for one of another type."""
    token = value.get("token") if isinstance(value, dict) else None
    if token is not None and (not isinstance(token, int) or isinstance(token, bool)):
        raise HistoryError(
            f"{op.f} token must be an integer or null, not {token!r}", index=op.index
        )
    return token


def _job_ids(op: Op, value: Any, field: str) -> list[str]:
    """The job id(s) in `value`'s `field` ("job_id": one, "job_ids": a list), [] when absent;
    HistoryError for ids that are not strings."""
    found = value.get(field) if isinstance(value, dict) else None
    if found is None:
        return []
    ids = found if field == "job_ids" else [found]
    if not isinstance(ids, list) or not all(isinstance(job_id, str) for job_id in ids):
        kind = "a list of strings" if field == "job_ids" else "a string"
        raise HistoryError(f"{op.f} {field} must be {kind}, not {found!r}", index=op.index)
    return ids


def _final_entries(op: Op) -> dict[str, Any]:
    """The final read's entries, their tokens and job ids checked."""
    read = op.value if isinstance(op.value, dict) else {}
    for entry in read.values():
        _token(op, entry)
        _job_ids(op, entry, "job_ids")
    return read


class QueueChecker:
    """Checks exactly-once job execution; see the module docstring."""

    def __init__(self, *, name: str = "queue") -> None:
        self.name = name

    def check(self, ops: Sequence[Op]) -> CheckResult:
        started_s = time.perf_counter()
        operations = client_operations(ops, ("enqueue", "complete", "read-final"))
        acknowledged: dict[str, Operation] = {}
        attempted: set[str] = set()
        accepted: dict[str, list[tuple[Operation, Any]]] = {}
        maybe_accepted: set[tuple[str, Any]] = set()
        # key -> job id -> the accepted completions of that job.
        served: dict[str, dict[str, list[Operation]]] = {}
        final: Operation | None = None
        for operation in operations:
            if operation.f == "enqueue":
                key = _job_key(operation.invoke.value)
                if key is None or operation.type == "fail":
                    continue
                attempted.add(key)
                if operation.type == "ok":
                    acknowledged.setdefault(key, operation)
            elif operation.f == "complete":
                for op in (operation.invoke, operation.completion):
                    if op is not None:
                        _token(op, op.value)
                        _job_ids(op, op.value, "job_id")
                if operation.type == "ok":
                    assert operation.completion is not None
                    value = operation.value
                    key = _job_key(value) or _job_key(operation.invoke.value)
                    if key is not None:
                        accepted.setdefault(key, []).append(
                            (operation, _token(operation.completion, value))
                        )
                        for job_id in _job_ids(operation.completion, value, "job_id"):
                            served.setdefault(key, {}).setdefault(job_id, []).append(operation)
                elif operation.type == "info":
                    value = operation.invoke.value
                    key = _job_key(value)
                    if key is not None and isinstance(value, dict):
                        maybe_accepted.add((key, value.get("token")))
            elif operation.f == "read-final" and operation.type == "ok":
                assert operation.completion is not None
                _final_entries(operation.completion)
                final = operation
        anomalies: list[dict[str, Any]] = []
        for key in sorted(accepted):
            completions = accepted[key]
            indices = [index for operation, _ in completions for index in operation.indices]
            if key not in attempted:
                anomalies.append(
                    anomaly("unexpected", f"job {key!r} completed but was never enqueued", indices)
                )
            seen: dict[Any, Operation] = {}
            highest: tuple[Any, Operation] | None = None
            for operation, token in completions:
                if token in seen:
                    anomalies.append(
                        anomaly(
                            "duplicate",
                            f"job {key!r}: token {token} was accepted twice (ops "
                            f"{seen[token].invoke.index} and {operation.invoke.index})",
                            [*seen[token].indices, *operation.indices],
                            key=key,
                        )
                    )
                seen.setdefault(token, operation)
                if isinstance(token, int):
                    if highest is not None and token < highest[0]:
                        anomalies.append(
                            anomaly(
                                "fencing",
                                f"job {key!r}: token {token} was accepted after token {highest[0]}",
                                [*highest[1].indices, *operation.indices],
                                key=key,
                            )
                        )
                    if highest is None or token > highest[0]:
                        highest = (token, operation)
        anomalies += _duplicate_jobs(served, final)
        reexecuted = sum(len({token for _, token in items}) > 1 for items in accepted.values())
        superseded = sum(len({token for _, token in items}) - 1 for items in accepted.values())
        if final is None:
            valid: Valid = False if anomalies else "unknown"
            message = "no final read" + (f"; {len(anomalies)} anomalies" if anomalies else "")
        else:
            anomalies += self._against_final(
                final, acknowledged, attempted, accepted, maybe_accepted
            )
            valid = not anomalies
            message = f"{len(anomalies)} anomalies"
            if valid:
                message = f"{len(acknowledged)} acknowledged jobs each completed exactly once"
            if valid and reexecuted:
                message += (
                    f", counting each job's last effect; re-executions of {reexecuted} jobs "
                    f"superseded {superseded} earlier effects with higher tokens, as fencing "
                    "allows"
                )
        return CheckResult(
            checker=self.name,
            valid=valid,
            message=message,
            anomalies=anomalies,
            window=smallest_window(anomalies) if valid is False else None,
            stats={
                "acknowledged": len(acknowledged),
                "attempted": len(attempted),
                "accepted_completions": sum(len(items) for items in accepted.values()),
                "reexecuted": reexecuted,
                "superseded": superseded,
                "final_read": final is not None,
                "elapsed_s": time.perf_counter() - started_s,
            },
        )

    def _against_final(
        self,
        final: Operation,
        acknowledged: dict[str, Operation],
        attempted: set[str],
        accepted: dict[str, list[tuple[Operation, Any]]],
        maybe_accepted: set[tuple[str, Any]],
    ) -> list[dict[str, Any]]:
        final_index = final.invoke.index
        read = final.value if isinstance(final.value, dict) else {}
        anomalies: list[dict[str, Any]] = []
        succeeded: dict[str, Any] = {
            key: entry.get("token")
            for key, entry in read.items()
            if isinstance(entry, dict) and entry.get("state") == "succeeded"
        }
        for key, enqueue in sorted(acknowledged.items()):
            # An enqueue still in flight when the final read began may legitimately be missing.
            assert enqueue.completion is not None
            if enqueue.completion.index > final_index:
                continue
            reasons = []
            if key not in succeeded:
                entry = read.get(key)
                state = entry.get("state") if isinstance(entry, dict) else None
                reasons.append(f"the final read shows it {state or 'missing'}")
            if key not in accepted:
                reasons.append("the resource never accepted a completion")
            if reasons:
                anomalies.append(
                    anomaly(
                        "lost",
                        f"acknowledged job {key!r} was lost: {' and '.join(reasons)}",
                        [*enqueue.indices, *final.indices],
                        key=key,
                    )
                )
        for key, token in sorted(succeeded.items()):
            if key not in attempted:
                anomalies.append(
                    anomaly(
                        "unexpected",
                        f"the final read shows job {key!r} succeeded, but it was never enqueued",
                        final.indices,
                        key=key,
                    )
                )
            tokens = {accepted_token for _, accepted_token in accepted.get(key, [])}
            for operation, accepted_token in accepted.get(key, []):
                if (
                    isinstance(accepted_token, int)
                    and isinstance(token, int)
                    and accepted_token > token
                ):
                    anomalies.append(
                        anomaly(
                            "stale",
                            f"job {key!r}: the resource accepted token {accepted_token} (op "
                            f"{operation.invoke.index}), newer than the succeeded attempt's "
                            f"token {token}",
                            [*operation.indices, *final.indices],
                            key=key,
                        )
                    )
            if accepted.get(key) and token not in tokens and (key, token) not in maybe_accepted:
                anomalies.append(
                    anomaly(
                        "missing",
                        f"job {key!r} succeeded with token {token}, but the resource never "
                        f"accepted that token (it accepted {sorted(tokens, key=str)})",
                        [
                            *(
                                index
                                for operation, _ in accepted[key]
                                for index in operation.indices
                            ),
                            *final.indices,
                        ],
                        key=key,
                    )
                )
        return anomalies


def _duplicate_jobs(
    served: dict[str, dict[str, list[Operation]]], final: Operation | None
) -> list[dict[str, Any]]:
    """One anomaly per key that two or more job ids served, in accepted completions or in the
    final read."""
    in_final: dict[str, list[str]] = {}
    if final is not None and final.completion is not None:
        for key, entry in _final_entries(final.completion).items():
            in_final[key] = _job_ids(final.completion, entry, "job_ids")
    anomalies: list[dict[str, Any]] = []
    for key in sorted(set(served) | set(in_final)):
        by_job = served.get(key, {})
        job_ids = sorted({*by_job, *in_final.get(key, [])})
        if len(job_ids) < 2:
            continue
        indices = [index for items in by_job.values() for item in items for index in item.indices]
        if len(in_final.get(key, [])) > 1 or not indices:
            assert final is not None
            indices += final.indices
        anomalies.append(
            anomaly(
                "duplicate-job",
                f"job {key!r} was served by {len(job_ids)} jobs ({', '.join(job_ids)}): an "
                "enqueue applied more than once",
                indices,
                key=key,
            )
        )
    return anomalies
