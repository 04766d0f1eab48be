"""The built-in workloads on NumPy, run in-process with a stand-in executor: results are sane,
and `mlp_train` interrupted and resumed from a checkpoint ends with bit-identical weights."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from node.executor.checkpoints import FileCheckpointStore
from node.executor.context import JobContext, NonRetryableError
from node.executor.protocol import (
    CheckpointAck,
    CheckpointRef,
    CheckpointSaved,
    Message,
    Progress,
    Stop,
    TaskDescription,
)
from node.executor.workloads import WORKLOADS


class FakeExecutor:
    """Answers every checkpoint at once (committed unless told otherwise) and can ask the job to
    stop right after a given checkpoint step or progress count, as a lost lease would."""

    def __init__(
        self, *, stop_after_checkpoint: int | None = None, stop_after_done: int | None = None
    ) -> None:
        self.context: JobContext | None = None
        self.messages: list[Message] = []
        self.stop_after_checkpoint = stop_after_checkpoint
        self.stop_after_done = stop_after_done
        self.stop_reason = "lease_lost"

    def send(self, message: Message) -> None:
        assert self.context is not None
        self.messages.append(message)
        if isinstance(message, CheckpointSaved):
            self.context.handle(CheckpointAck(ok=True, step=message.step))
            if message.step == self.stop_after_checkpoint:
                self.context.handle(Stop(reason=self.stop_reason))
        if isinstance(message, Progress) and message.done == self.stop_after_done:
            self.context.handle(Stop(reason=self.stop_reason))

    @property
    def checkpoints(self) -> list[CheckpointSaved]:
        return [message for message in self.messages if isinstance(message, CheckpointSaved)]

    @property
    def progress(self) -> list[Progress]:
        return [message for message in self.messages if isinstance(message, Progress)]


def run_workload(
    root: Path,
    workload: str,
    args: dict[str, Any],
    *,
    executor: FakeExecutor | None = None,
    task_index: int = 0,
    token: int = 1,
    checkpoint: CheckpointSaved | None = None,
) -> tuple[dict[str, Any], FakeExecutor]:
    executor = executor or FakeExecutor()
    task = TaskDescription(
        job_id="job-1",
        task_index=task_index,
        array_size=4,
        attempt=token,
        token=token,
        workload=workload,
        args=args,
        checkpoint=None
        if checkpoint is None
        else CheckpointRef(uri=checkpoint.uri, checksum=checkpoint.checksum, step=checkpoint.step),
        checkpoint_dir=str(root),
    )
    # The progress rate limit would make runs depend on timing: a clock that leaps a second per
    # call lets every report through.
    ticks = iter(range(1, 10**9))
    context = JobContext(
        task,
        sender=executor,
        store=FileCheckpointStore(root),
        xp=np,
        clock=lambda: float(next(ticks)),
    )
    executor.context = context
    return WORKLOADS[workload](context), executor


# gemm, fft, montecarlo.


def test_gemm__computes_correct_products_and_reports_tflops(tmp_path: Path) -> None:
    result, executor = run_workload(tmp_path, "gemm", {"n": 64, "repeats": 3})
    assert result["n"] == 64 and result["repeats"] == 3
    assert result["tflops"] > 0
    assert result["max_relative_error"] < 1e-4
    assert [report.done for report in executor.progress] == [1, 2, 3]


def test_fft__parseval_holds_and_each_array_task_has_its_own_seed(tmp_path: Path) -> None:
    first, executor = run_workload(tmp_path, "fft", {"n": 32, "repeats": 2, "seed": 5})
    second, _ = run_workload(tmp_path, "fft", {"n": 32, "repeats": 2, "seed": 5}, task_index=1)
    assert first["parseval_relative_error"] < 1e-4
    assert first["gflops"] > 0
    assert (first["seed"], second["seed"]) == (5, 6)
    assert executor.progress[-1].done == 2


def test_montecarlo__estimates_pi_and_is_reproducible(tmp_path: Path) -> None:
    args = {"samples": 300_000, "seed": 3}
    result, executor = run_workload(tmp_path, "montecarlo", args)
    again, _ = run_workload(tmp_path, "montecarlo", args)
    assert abs(result["pi"] - math.pi) < 0.02
    assert result["samples"] == 300_000
    assert again["pi"] == result["pi"]
    assert executor.progress[-1].done == executor.progress[-1].total == 300_000


@pytest.mark.parametrize(
    ("workload", "args", "message"),
    [
        ("gemm", {"n": 0}, "n must be an integer in 1..32768"),
        ("gemm", {"size": 5}, "unknown argument"),
        ("fft", {"repeats": "3"}, "repeats must be an integer"),
        ("mlp_train", {"optimizer": "lbfgs"}, "optimizer must be one of adam, sgd"),
        ("mlp_train", {"lr": -1}, "lr must be a number"),
    ],
)
def test_bad_arguments_are_non_retryable(
    tmp_path: Path, workload: str, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(NonRetryableError, match=message):
        run_workload(tmp_path, workload, args)


def test_a_workload_stops_between_steps(tmp_path: Path) -> None:
    executor = FakeExecutor(stop_after_done=2)
    executor.stop_reason = "cancelled"
    result, _ = run_workload(tmp_path, "gemm", {"n": 16, "repeats": 50}, executor=executor)
    assert result["repeats"] == 2


# mlp_train.

MLP_ARGS = {"steps": 60, "checkpoint_every": 10, "hidden": 16, "batch": 32, "lr": 0.01, "seed": 7}


def test_mlp_train__learns_and_checkpoints_every_n_steps(tmp_path: Path) -> None:
    result, executor = run_workload(tmp_path, "mlp_train", MLP_ARGS)
    assert result["steps"] == 60 and result["resumed_from"] == 0
    first_loss = executor.progress[0].metrics["loss"]
    assert result["final_loss"] < first_loss
    assert [saved.step for saved in executor.checkpoints] == [10, 20, 30, 40, 50]
    # Garbage collection keeps the last two committed checkpoints.
    steps = [info.step for info in FileCheckpointStore(tmp_path).list_checkpoints("job-1", 0)]
    assert steps == [40, 50]


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_mlp_train__resumed_from_a_checkpoint_ends_bit_identical(
    tmp_path: Path, optimizer: str
) -> None:
    args = {**MLP_ARGS, "optimizer": optimizer}
    uninterrupted, _ = run_workload(tmp_path / "a", "mlp_train", args)

    interrupted, first = run_workload(
        tmp_path / "b", "mlp_train", args, executor=FakeExecutor(stop_after_checkpoint=30)
    )
    assert interrupted == {"stopped_at": 30, "reason": "lease_lost"}
    resumed, _ = run_workload(
        tmp_path / "b", "mlp_train", args, token=2, checkpoint=first.checkpoints[-1]
    )

    assert resumed["resumed_from"] == 30
    assert resumed["weights_sha256"] == uninterrupted["weights_sha256"]
    assert resumed["final_loss"] == uninterrupted["final_loss"]


def test_mlp_train__a_stop_between_checkpoints_saves_the_current_step(tmp_path: Path) -> None:
    uninterrupted, _ = run_workload(tmp_path / "a", "mlp_train", MLP_ARGS)
    executor = FakeExecutor(stop_after_done=23)
    executor.stop_reason = "shutdown"

    _, first = run_workload(tmp_path / "b", "mlp_train", MLP_ARGS, executor=executor)
    assert [saved.step for saved in first.checkpoints] == [10, 20, 23]
    resumed, _ = run_workload(
        tmp_path / "b", "mlp_train", MLP_ARGS, token=2, checkpoint=first.checkpoints[-1]
    )

    assert resumed["resumed_from"] == 23
    assert resumed["weights_sha256"] == uninterrupted["weights_sha256"]


def test_mlp_train__a_corrupt_checkpoint_resumes_from_the_previous_one(tmp_path: Path) -> None:
    uninterrupted, _ = run_workload(tmp_path / "a", "mlp_train", MLP_ARGS)
    _, first = run_workload(
        tmp_path / "b", "mlp_train", MLP_ARGS, executor=FakeExecutor(stop_after_checkpoint=40)
    )
    last = first.checkpoints[-1]
    (tmp_path / "b" / last.uri).write_bytes(b"garbage")

    resumed, _ = run_workload(tmp_path / "b", "mlp_train", MLP_ARGS, token=2, checkpoint=last)

    assert resumed["resumed_from"] == 30
    assert resumed["weights_sha256"] == uninterrupted["weights_sha256"]


# On a GPU.


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("workload", "args"),
    [
        ("gemm", {"n": 1024, "repeats": 5}),
        ("fft", {"n": 512, "repeats": 5}),
        ("montecarlo", {"samples": 2_000_000}),
        ("mlp_train", {"steps": 40, "checkpoint_every": 10}),
    ],
)
def test_workloads_run_on_cupy(tmp_path: Path, workload: str, args: dict[str, Any]) -> None:
    from node.executor.arrays import array_module

    executor = FakeExecutor()
    task = TaskDescription(
        job_id="job-gpu",
        task_index=0,
        attempt=1,
        token=1,
        workload=workload,
        args=args,
        checkpoint_dir=str(tmp_path),
        device="cuda:0",
    )
    context = JobContext(task, sender=executor, store=FileCheckpointStore(tmp_path))
    assert context.xp is array_module("cuda:0")
    executor.context = context
    result = WORKLOADS[workload](context)
    assert result["device"] == "cuda:0"
    if workload == "gemm":
        assert result["max_relative_error"] < 1e-3
    if workload == "montecarlo":
        assert abs(result["pi"] - math.pi) < 0.01
