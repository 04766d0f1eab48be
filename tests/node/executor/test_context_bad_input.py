"""Bad arguments to a job's `JobContext` are refused by name, and nothing is sent or written.

`progress()` and `checkpoint()` are what a job's own code calls; a wrong type raises TypeError
and a bad value ValueError, before a message goes to the executor or a file to the store. The
sweep these come from is described in docs/robustness.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from node.executor.checkpoints import FileCheckpointStore
from node.executor.context import JobContext
from node.executor.protocol import Message, TaskDescription


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, message: Message) -> None:
        self.sent.append(message)


def _deep(levels: int) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for _ in range(levels):
        nested = {"a": nested}
    return nested


ARRAYS = {"w": np.zeros(2)}
Call = Callable[[JobContext], object]
CASES: dict[str, tuple[Call, type[Exception], str]] = {
    "progress done None": (lambda c: c.progress(None, 10), TypeError, "done"),  # type: ignore[arg-type]
    "progress done str": (lambda c: c.progress("5", 10), TypeError, "done"),  # type: ignore[arg-type]
    "progress done 1.5": (lambda c: c.progress(1.5, 10), TypeError, "done"),  # type: ignore[arg-type]
    "progress done bool": (lambda c: c.progress(True, 10), TypeError, "done"),
    "progress total inf": (lambda c: c.progress(1, float("inf")), TypeError, "total"),  # type: ignore[arg-type]
    "progress total 2**64": (lambda c: c.progress(1, 2**64), ValueError, "total"),
    "progress metric None": (lambda c: c.progress(1, 2, loss=None), TypeError, "loss"),  # type: ignore[arg-type]
    "progress metric 10**400": (lambda c: c.progress(1, 2, loss=10**400), ValueError, "loss"),
    "progress metric name surrogate": (
        lambda c: c.progress(1, 2, **{"\udcff": 1.0}),
        ValueError,
        "metric name",
    ),
    "checkpoint step None": (lambda c: c.checkpoint(None, ARRAYS), TypeError, "step"),  # type: ignore[arg-type]
    "checkpoint step bool": (lambda c: c.checkpoint(True, ARRAYS), TypeError, "step"),
    "checkpoint step 2**64": (lambda c: c.checkpoint(2**64, ARRAYS), ValueError, "step"),
    "checkpoint arrays None": (lambda c: c.checkpoint(1, None), TypeError, "arrays"),  # type: ignore[arg-type]
    "checkpoint array name surrogate": (
        lambda c: c.checkpoint(1, {"\udcff": np.zeros(1)}),
        ValueError,
        "array names",
    ),
    "checkpoint meta 0": (lambda c: c.checkpoint(1, ARRAYS, 0), TypeError, "meta"),  # type: ignore[arg-type]
    "checkpoint meta NaN": (
        lambda c: c.checkpoint(1, ARRAYS, {"loss": float("nan")}),
        ValueError,
        "meta must be JSON",
    ),
    "checkpoint meta bytes": (
        lambda c: c.checkpoint(1, ARRAYS, {"b": b"x"}),
        ValueError,
        "meta must be JSON",
    ),
    "checkpoint meta surrogate": (
        lambda c: c.checkpoint(1, ARRAYS, {"s": "\udcff"}),
        ValueError,
        "meta must be JSON",
    ),
    "checkpoint meta nested deeper than the stack": (
        lambda c: c.checkpoint(1, ARRAYS, _deep(100_000)),
        ValueError,
        "meta must be JSON",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_argument__is_refused_by_name_and_nothing_is_sent_or_written(
    tmp_path: Path, case: str
) -> None:
    call, error, message = CASES[case]
    task = TaskDescription(
        job_id="job-1",
        task_index=0,
        attempt=1,
        token=5,
        workload="w",
        checkpoint=None,
        checkpoint_dir=str(tmp_path),
    )
    recorder = _Recorder()
    context = JobContext(
        task,
        sender=recorder,
        store=FileCheckpointStore(tmp_path),
        xp=np,
        clock=lambda: 0.0,
        ack_wait_s=0.0,
    )
    with pytest.raises(error, match=message):
        call(context)
    assert recorder.sent == []
    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []
