"""Built-in workloads, written once against `ctx.xp` so they run on CuPy and NumPy alike.

Each is `def name(ctx: JobContext) -> dict` returning the task's result. All check
`ctx.should_stop()` between steps and report progress; a workload that stops early returns a
partial result, which the worker does not report (the attempt ended on request).

- `gemm`: dense matrix products; reports TFLOP/s.
- `fft`: 2-D complex FFTs, seeded by the task's array index; reports GFLOP/s and checks Parseval.
- `montecarlo`: estimates pi from random points.
- `mlp_train`: trains a small MLP on synthetic data with SGD or Adam, checkpointing weights and
  optimizer state every `checkpoint_every` steps and resuming from `ctx.restore()`. Each step's
  batch is drawn from its own generator seeded by (seed, step), so a run resumed at any step sees
  exactly the batches an uninterrupted run would: on NumPy its final weights are bit-identical.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from node.executor.arrays import synchronize, to_numpy
from node.executor.context import JobContext, NonRetryableError, TaskRefused

__all__ = ["WORKLOADS", "fft", "gemm", "mlp_train", "montecarlo"]

# Argument bounds: beyond them a task would only run out of memory or time.
MATRIX_N_MAX = 32_768
FFT_N_MAX = 16_384
REPEATS_MAX = 1_000_000
SAMPLES_MAX = 10**13
STEPS_MAX = 10_000_000
HIDDEN_MAX = 16_384
BATCH_MAX = 1 << 20
# Monte Carlo points drawn per batch: bounds memory (two float64 coordinates each).
MONTECARLO_BATCH_SAMPLES = 1 << 20
# The MLP's input width and its synthetic teacher's, fixed so checkpoints stay compatible.
MLP_INPUTS = 16
_ADAM_BETA1 = 0.9
_ADAM_BETA2 = 0.999
_ADAM_EPSILON = 1e-8
_DTYPES = ("float32", "float64")


def _seed(*parts: object) -> int:
    """A 32-bit seed derived from `parts` (NumPy's and CuPy's RandomState take 32 bits)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


class _Args:
    """A workload's arguments, checked: unknown names and out-of-range values are
    non-retryable failures with the argument's name in the message."""

    def __init__(self, workload: str, args: Mapping[str, Any], known: tuple[str, ...]) -> None:
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise TaskRefused(
                f"{workload}: unknown argument(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
        self.workload = workload
        self.args = args

    def integer(self, name: str, default: int, minimum: int, maximum: int) -> int:
        value = self.args.get(name, default)
        if type(value) is not int or not minimum <= value <= maximum:
            raise TaskRefused(
                f"{self.workload}: {name} must be an integer in {minimum}..{maximum}, "
                f"got {value!r:.80}"
            )
        return value

    def number(self, name: str, default: float, minimum: float, maximum: float) -> float:
        value = self.args.get(name, default)
        if type(value) not in (int, float) or not minimum <= value <= maximum:
            raise TaskRefused(
                f"{self.workload}: {name} must be a number in {minimum}..{maximum}, "
                f"got {value!r:.80}"
            )
        return float(value)

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.args.get(name, default)
        if value not in choices:
            raise TaskRefused(
                f"{self.workload}: {name} must be one of {', '.join(choices)}, got {value!r:.80}"
            )
        return str(value)


# gemm.


def gemm(ctx: JobContext) -> dict[str, Any]:
    """Args: n (matrix size, 1024), repeats (10), dtype (float32), seed (0)."""
    args = _Args("gemm", ctx.args, ("n", "repeats", "dtype", "seed"))
    n = args.integer("n", 1024, 1, MATRIX_N_MAX)
    repeats = args.integer("repeats", 10, 1, REPEATS_MAX)
    dtype = args.choice("dtype", "float32", _DTYPES)
    seed = args.integer("seed", 0, 0, 2**32 - 1)
    xp = ctx.xp
    generator = xp.random.RandomState(_seed("gemm", seed, ctx.task_index))
    a = generator.standard_normal((n, n)).astype(dtype)
    b = generator.standard_normal((n, n)).astype(dtype)
    c = a @ b  # warm-up: kernel selection and memory pool growth are not timed
    synchronize(xp)
    started_s = time.perf_counter()
    done = 0
    for done in range(1, repeats + 1):
        if ctx.should_stop():
            done -= 1
            break
        c = a @ b
        ctx.progress(done, repeats)
    synchronize(xp)
    seconds = max(time.perf_counter() - started_s, 1e-9)
    # A corner of the product against a float64 product of the same inputs on the host.
    corner = min(n, 8)
    expected = to_numpy(a[:corner]).astype(np.float64) @ to_numpy(b[:, :corner]).astype(np.float64)
    error = np.abs(to_numpy(c[:corner, :corner]) - expected).max() / max(np.abs(expected).max(), 1)
    return {
        "n": n,
        "repeats": done,
        "dtype": dtype,
        "device": ctx.device,
        "seconds": seconds,
        "tflops": 2.0 * n**3 * done / seconds / 1e12,
        "max_relative_error": float(error),
    }


# fft.


def fft(ctx: JobContext) -> dict[str, Any]:
    """Args: n (the side of an n x n complex array, 1024), repeats (10), seed (0; the task's
    array index is added, so each task of an array transforms different data)."""
    args = _Args("fft", ctx.args, ("n", "repeats", "seed"))
    n = args.integer("n", 1024, 1, FFT_N_MAX)
    repeats = args.integer("repeats", 10, 1, REPEATS_MAX)
    seed = args.integer("seed", 0, 0, 2**32 - 1) + ctx.task_index
    xp = ctx.xp
    generator = xp.random.RandomState(_seed("fft", seed))
    signal = (generator.standard_normal((n, n)) + 1j * generator.standard_normal((n, n))).astype(
        "complex64"
    )
    spectrum = xp.fft.fft2(signal)  # warm-up: plan creation is not timed
    synchronize(xp)
    started_s = time.perf_counter()
    done = 0
    for done in range(1, repeats + 1):
        if ctx.should_stop():
            done -= 1
            break
        spectrum = xp.fft.fft2(signal)
        ctx.progress(done, repeats)
    synchronize(xp)
    seconds = max(time.perf_counter() - started_s, 1e-9)
    points = n * n
    # Parseval: the energy of the signal equals that of its spectrum divided by the length.
    energy = float((xp.abs(signal.astype("complex128")) ** 2).sum())
    spectrum_energy = float((xp.abs(spectrum.astype("complex128")) ** 2).sum()) / points
    return {
        "n": n,
        "repeats": done,
        "seed": seed,
        "device": ctx.device,
        "seconds": seconds,
        # The conventional FFT operation count, 5 N log2 N.
        "gflops": 5.0 * points * math.log2(max(points, 2)) * done / seconds / 1e9,
        "parseval_relative_error": abs(energy - spectrum_energy) / max(energy, 1e-30),
    }


# montecarlo.


def montecarlo(ctx: JobContext) -> dict[str, Any]:
    """Args: samples (10 million), seed (0). Each batch of points has its own seed, derived from
    (seed, task index, batch), so the estimate does not depend on how the work was batched."""
    args = _Args("montecarlo", ctx.args, ("samples", "seed"))
    samples = args.integer("samples", 10_000_000, 1, SAMPLES_MAX)
    seed = args.integer("seed", 0, 0, 2**32 - 1)
    xp = ctx.xp
    batches = math.ceil(samples / MONTECARLO_BATCH_SAMPLES)
    inside = drawn = 0
    for batch in range(batches):
        if ctx.should_stop():
            break
        count = min(MONTECARLO_BATCH_SAMPLES, samples - drawn)
        generator = xp.random.RandomState(_seed("montecarlo", seed, ctx.task_index, batch))
        points = generator.random_sample((count, 2))
        inside += int(((points * points).sum(axis=1) <= 1.0).sum())
        drawn += count
        ctx.progress(drawn, samples)
    estimate = 4.0 * inside / max(drawn, 1)
    return {
        "pi": estimate,
        "error": abs(estimate - math.pi),
        "samples": drawn,
        "inside": inside,
        "seed": seed,
        "device": ctx.device,
    }


# mlp_train.

_PARAMETERS = ("w1", "b1", "w2", "b2")


def _teacher(seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng([seed, 0xC0FFEE]).standard_normal((MLP_INPUTS, 1))


def _batch(seed: int, step: int, size: int, teacher: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """The batch of `step`: inputs and targets, from a generator of its own."""
    generator = np.random.default_rng([seed, step])
    inputs = generator.standard_normal((size, MLP_INPUTS))
    targets = np.sin(inputs @ teacher)
    return inputs.astype(np.float32), targets.astype(np.float32)


def _initial_parameters(seed: int, hidden: int) -> dict[str, np.ndarray[Any, Any]]:
    generator = np.random.default_rng([seed, 0x1A1])
    return {
        "w1": (generator.standard_normal((MLP_INPUTS, hidden)) / math.sqrt(MLP_INPUTS)),
        "b1": np.zeros(hidden),
        "w2": (generator.standard_normal((hidden, 1)) / math.sqrt(hidden)),
        "b2": np.zeros(1),
    }


def _gradients(
    xp: Any, parameters: dict[str, Any], inputs: Any, targets: Any
) -> tuple[float, dict[str, Any]]:
    """Mean squared error of a one-hidden-layer tanh network, and its gradients."""
    hidden = xp.tanh(inputs @ parameters["w1"] + parameters["b1"])
    predictions = hidden @ parameters["w2"] + parameters["b2"]
    residuals = predictions - targets
    loss = float((residuals * residuals).mean())
    d_predictions = residuals * (2.0 / residuals.shape[0])
    d_hidden = (d_predictions @ parameters["w2"].T) * (1.0 - hidden * hidden)
    return loss, {
        "w1": inputs.T @ d_hidden,
        "b1": d_hidden.sum(axis=0),
        "w2": hidden.T @ d_predictions,
        "b2": d_predictions.sum(axis=0),
    }


class _Optimizer:
    """SGD, or Adam with its moments, as arrays that go into the checkpoint with the weights."""

    def __init__(
        self, xp: Any, kind: str, learning_rate: float, parameters: dict[str, Any]
    ) -> None:
        self.kind = kind
        self.learning_rate = learning_rate
        self.state: dict[str, Any] = {}
        if kind == "adam":
            for name, value in parameters.items():
                self.state[f"adam_m.{name}"] = xp.zeros_like(value)
                self.state[f"adam_v.{name}"] = xp.zeros_like(value)

    def update(
        self, xp: Any, parameters: dict[str, Any], gradients: dict[str, Any], step: int
    ) -> None:
        if self.kind == "sgd":
            for name, gradient in gradients.items():
                parameters[name] -= self.learning_rate * gradient
            return
        # Adam's bias correction uses the 1-based count of updates, which is step + 1.
        correction1 = 1.0 - _ADAM_BETA1 ** (step + 1)
        correction2 = 1.0 - _ADAM_BETA2 ** (step + 1)
        for name, gradient in gradients.items():
            m = self.state[f"adam_m.{name}"]
            v = self.state[f"adam_v.{name}"]
            m *= _ADAM_BETA1
            m += (1.0 - _ADAM_BETA1) * gradient
            v *= _ADAM_BETA2
            v += (1.0 - _ADAM_BETA2) * gradient * gradient
            parameters[name] -= (
                self.learning_rate * (m / correction1) / (xp.sqrt(v / correction2) + _ADAM_EPSILON)
            )


def weights_sha256(parameters: Mapping[str, Any]) -> str:
    """A digest of the weights' dtypes, shapes and bytes, for comparing runs bit for bit."""
    digest = hashlib.sha256()
    for name in sorted(parameters):
        array = np.asarray(to_numpy(parameters[name]), order="C")
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def mlp_train(ctx: JobContext) -> dict[str, Any]:
    """Args: steps (200), checkpoint_every (50; 0: never), hidden (32), batch (64), lr (0.01),
    seed (0), optimizer (adam or sgd)."""
    known = ("steps", "checkpoint_every", "hidden", "batch", "lr", "seed", "optimizer")
    args = _Args("mlp_train", ctx.args, known)
    steps = args.integer("steps", 200, 1, STEPS_MAX)
    checkpoint_every = args.integer("checkpoint_every", 50, 0, STEPS_MAX)
    hidden = args.integer("hidden", 32, 1, HIDDEN_MAX)
    batch = args.integer("batch", 64, 1, BATCH_MAX)
    learning_rate = args.number("lr", 0.01, 1e-12, 10.0)
    seed = args.integer("seed", 0, 0, 2**32 - 1)
    kind = args.choice("optimizer", "adam", ("adam", "sgd"))
    xp = ctx.xp
    parameters = {
        name: xp.asarray(value.astype(np.float32))
        for name, value in _initial_parameters(seed, hidden).items()
    }
    optimizer = _Optimizer(xp, kind, learning_rate, parameters)
    start = _resume(ctx, parameters, optimizer)
    teacher = _teacher(seed)
    loss = math.nan
    last_checkpoint = start
    for step in range(start, steps):
        if ctx.should_stop():
            # Worth keeping when the task will run again; not when it was cancelled or taken
            # over by another attempt.
            resumable = ctx.stop_reason in ("lease_lost", "shutdown", "signal", "preempted")
            if resumable and step > last_checkpoint:
                _checkpoint(ctx, step, parameters, optimizer, loss)
            return {"stopped_at": step, "reason": ctx.stop_reason}
        inputs, targets = _batch(seed, step, batch, teacher)
        loss, gradients = _gradients(xp, parameters, xp.asarray(inputs), xp.asarray(targets))
        if not math.isfinite(loss):
            raise NonRetryableError(f"mlp_train diverged at step {step} (loss {loss}); lower lr")
        optimizer.update(xp, parameters, gradients, step)
        ctx.progress(step + 1, steps, loss=loss)
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            _checkpoint(ctx, step + 1, parameters, optimizer, loss)
            last_checkpoint = step + 1
    return {
        "steps": steps,
        "resumed_from": start,
        "final_loss": loss,
        "optimizer": kind,
        "device": ctx.device,
        "weights_sha256": weights_sha256(parameters),
    }


def _checkpoint(
    ctx: JobContext, step: int, parameters: dict[str, Any], optimizer: _Optimizer, loss: float
) -> None:
    arrays = {f"param.{name}": value for name, value in parameters.items()} | optimizer.state
    meta = {"step": step, "optimizer": optimizer.kind}
    if math.isfinite(loss):
        meta["loss"] = loss
    ctx.checkpoint(step, arrays, meta)


def _resume(ctx: JobContext, parameters: dict[str, Any], optimizer: _Optimizer) -> int:
    """Loads the restored checkpoint into `parameters` and the optimizer; the step to start at."""
    restored = ctx.restore()
    if restored is None:
        return 0
    arrays = restored["arrays"]
    expected = {f"param.{name}" for name in parameters} | set(optimizer.state)
    if set(arrays) != expected or restored["meta"].get("optimizer") != optimizer.kind:
        raise NonRetryableError(
            "mlp_train: the checkpoint does not match the arguments "
            f"(arrays {sorted(arrays)}, optimizer {restored['meta'].get('optimizer')!r})"
        )
    for name in parameters:
        if arrays[f"param.{name}"].shape != parameters[name].shape:
            raise NonRetryableError(f"mlp_train: checkpoint array {name} has another shape")
        parameters[name] = arrays[f"param.{name}"]
    for name in optimizer.state:
        optimizer.state[name] = arrays[name]
    step: int = restored["step"]
    ctx.logger.info("mlp_train resumes at step %d", step)
    return step


WORKLOADS: dict[str, Callable[[JobContext], dict[str, Any]]] = {
    "gemm": gemm,
    "fft": fft,
    "montecarlo": montecarlo,
    "mlp_train": mlp_train,
}
