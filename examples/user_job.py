"""An example user job: least-squares regression by gradient descent, resumable.

It shows the whole `JobContext` API: `ctx.xp` for the arrays (CuPy on a GPU, NumPy otherwise),
`ctx.restore()` to continue from the last committed checkpoint, `ctx.checkpoint()` every few steps,
`ctx.progress()` with a metric, and `ctx.should_stop()` between steps. Bad arguments raise
`NonRetryableError`, so the task fails at once instead of being retried.

Entrypoint: `examples.user_job:train`, with arguments such as
`{"steps": 500, "checkpoint_every": 100, "features": 64, "samples": 4096, "lr": 0.1, "seed": 1}`.
"""

from __future__ import annotations

from typing import Any

from node.executor.context import JobContext, NonRetryableError

__all__ = ["train"]


def train(ctx: JobContext) -> dict[str, Any]:
    steps = int(ctx.args.get("steps", 500))
    checkpoint_every = int(ctx.args.get("checkpoint_every", 100))
    features = int(ctx.args.get("features", 64))
    samples = int(ctx.args.get("samples", 4096))
    learning_rate = float(ctx.args.get("lr", 0.1))
    if steps < 1 or features < 1 or samples < 1 or learning_rate <= 0:
        raise NonRetryableError("steps, features, samples and lr must be positive")
    xp = ctx.xp

    # The data comes from the seed, so every attempt of this task sees the same problem; each task
    # of a job array gets its own.
    generator = xp.random.RandomState(int(ctx.args.get("seed", 0)) + ctx.task_index)
    inputs = generator.standard_normal((samples, features))
    truth = generator.standard_normal(features)
    targets = inputs @ truth + 0.01 * generator.standard_normal(samples)

    weights = xp.zeros(features)
    start = 0
    restored = ctx.restore()
    if restored is not None:
        weights = restored["arrays"]["weights"]
        start = restored["step"]
        ctx.logger.info("resuming at step %d", start)

    loss = float("nan")
    for step in range(start, steps):
        if ctx.should_stop():
            ctx.logger.info("asked to stop (%s) at step %d", ctx.stop_reason, step)
            return {"stopped_at": step}
        residuals = inputs @ weights - targets
        loss = float((residuals * residuals).mean())
        weights = weights - learning_rate * (2.0 / samples) * (inputs.T @ residuals)
        ctx.progress(step + 1, steps, loss=loss)
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            ctx.checkpoint(step + 1, {"weights": weights}, {"loss": loss})

    error = float(xp.abs(weights - truth).max())
    ctx.logger.info("done: loss %.3g, largest weight error %.3g", loss, error)
    return {"steps": steps, "resumed_from": start, "loss": loss, "weight_error": error}
