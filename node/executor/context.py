"""`JobContext`: everything a job's function gets from xr while it runs in a worker.

A job is a function `def train(ctx: JobContext) -> dict`. Through the context it computes on `xp`
(CuPy on a GPU, NumPy otherwise), resumes from `restore()`, commits state with `checkpoint()`,
reports `progress()` and polls `should_stop()` between steps. It raises `NonRetryableError` for
failures that another attempt cannot fix (bad arguments); any other exception is retried.

Rules:
- A checkpoint counts only once the log has committed it with this attempt's fencing token:
  `checkpoint()` writes it, asks the executor to commit it and waits for the answer. A refusal of
  the token means another attempt has taken over: `should_stop()` turns true and the function
  must return. A commit that merely did not happen (no quorum) is not a reason to stop: the job
  goes on computing and checkpoints again later.
- A checkpoint is written once and never replaced: a step no newer than the newest this
  attempt knows committed (the log would refuse it), or one of this attempt's steps still
  awaiting its answer, is not written and `checkpoint()` returns False at once. Writing it would
  replace the manifest the log names (same step, same token), which would then fail its checksum.
  Calls from several threads are taken one at a time.
- A checkpoint the store cannot write (a full disk, a directory it may not write) is not
  committed either: `checkpoint()` returns False and logs one line naming the checkpoint
  directory and the operating system's error, so a job that ignores the answer still leaves a
  trace in its log. Nothing of it is committed and no partial file is left (each file is whole
  or absent; chunks written before the error are collected as garbage), so the same step can be
  written again once there is room. It used to raise a bare OSError that did not say it was the
  checkpoint store's.
- `restore()` returns the newest committed checkpoint this attempt knows: the one the task was
  claimed with, or one this attempt committed since. If it is corrupt, the newest older
  checkpoint of the same task that still verifies (its manifest digest and every chunk hash) is
  used instead, and the log says which; when none verifies the task starts from scratch.
- After each commit, checkpoints of this task older than the last `KEEP_COMMITTED` committed ones
  are garbage-collected (never those of a newer attempt). A checkpoint whose answer did not come
  in time may still be committed later, until a newer one is (the log commits only newer steps).
- The stop flag is only ever set, never cleared, and the first reason wins. Setting it takes no
  lock, so the SIGTERM handler may set it at any moment.
"""

from __future__ import annotations

import collections
import logging
import math
import numbers
import operator
import threading
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Protocol

from node.executor.arrays import array_module, to_numpy
from node.executor.checkpoints import (
    Checkpoint,
    CheckpointExists,
    CheckpointStore,
    CorruptCheckpoint,
)
from node.executor.protocol import (
    CheckpointAck,
    CheckpointSaved,
    ExecutorMessage,
    Message,
    Progress,
    Stop,
    TaskDescription,
)
from xrcore._validate import INT_MAX, NAME_PATTERN
from xrcore.limits import METRICS_PER_UPDATE_MAX

__all__ = [
    "ACK_WAIT_S_MAX",
    "KEEP_COMMITTED",
    "PROGRESS_INTERVAL_S",
    "JobContext",
    "NonRetryableError",
    "Sender",
]

# At most five progress messages a second; the one that reaches the total is always sent.
PROGRESS_INTERVAL_S = 0.2
# The executor answers a checkpoint when the log has (or definitely has not) committed it; past
# this the job goes on without knowing, and a late answer is still taken into account.
ACK_WAIT_S_MAX = 300.0
# Committed checkpoints kept per task: the latest, and one to fall back to if it is corrupt.
KEEP_COMMITTED = 2
# Older checkpoints tried when the committed one is corrupt.
FALLBACK_TRIES_MAX = 8
METRIC_NAME_BYTES_MAX = 128
_ACK_POLL_S = 0.1


class NonRetryableError(Exception):
    """Raised by a job for a failure that another attempt would repeat (bad arguments, bad
    input data): the task fails at once instead of being retried."""


class TaskRefused(NonRetryableError):
    """xr's own refusal of a task (an unknown workload, a built-in workload's bad argument, an
    entrypoint that names no function): its message says all, so the failure shows it without
    a traceback of xr's code."""


class Sender(Protocol):
    """Where the context's messages go: the worker's `Channel`, or a stand-in in tests."""

    def send(self, message: Message) -> None: ...


class JobContext:
    """The context handed to a job's function; see the module docstring."""

    def __init__(
        self,
        task: TaskDescription,
        *,
        sender: Sender,
        store: CheckpointStore,
        xp: ModuleType | None = None,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
        ack_wait_s: float = ACK_WAIT_S_MAX,
    ) -> None:
        self.task = task
        self.xp: ModuleType = xp if xp is not None else array_module(task.device)
        self.device = task.device
        self.job_id = task.job_id
        self.task_index = task.task_index
        self.array_size = task.array_size
        self.token = task.token
        self.attempt = task.attempt
        self.args: dict[str, Any] = dict(task.args)
        # The job's `checkpoint_interval_s`: how often it asked to checkpoint (0: as it sees
        # fit). xr does not enforce it.
        self.checkpoint_interval_s = task.checkpoint_interval_s
        self.logger = logger or logging.getLogger("xr.job")
        self._sender = sender
        self._store = store
        self._clock = clock
        self._ack_wait_s = ack_wait_s
        self._stop_reason: str | None = None
        # One checkpoint at a time: each waits for its own answer.
        self._checkpointing = threading.Lock()
        # Guards the checkpoint answers and the committed list, shared with the reader thread.
        self._acks = threading.Condition()
        self._outstanding: collections.deque[int] = collections.deque()
        self._answered: dict[int, CheckpointAck] = {}
        # The step `checkpoint()` is waiting on, if any.
        self._awaited: int | None = None
        # Checkpoints whose answer did not come in time: step -> (uri, checksum). Kept from
        # garbage collection, since the log may still commit them.
        self._unanswered: dict[int, tuple[str, str]] = {}
        # The newest committed checkpoints, step -> (uri, checksum or None when unknown), at
        # most KEEP_COMMITTED of them.
        self._committed: dict[int, tuple[str, str | None]] = {}
        self._last_progress_s = -math.inf
        self._pending_progress: Progress | None = None

    # Stopping.

    @property
    def stop_reason(self) -> str | None:
        """Why the job was asked to stop (cancelled, lease_lost, superseded, preempted,
        wall_time, shutdown, signal, disconnected), or None. After lease_lost, preempted,
        shutdown and signal the task runs again: checkpoint before returning."""
        return self._stop_reason

    def should_stop(self) -> bool:
        return self._stop_reason is not None

    def request_stop(self, reason: str) -> None:
        # A plain assignment, atomic under the GIL: safe from a signal handler, which must not
        # take a lock the interrupted code may hold.
        if self._stop_reason is None:
            self._stop_reason = reason

    def handle(self, message: ExecutorMessage) -> None:
        """Takes a message from the executor; the worker's reader thread calls it."""
        if isinstance(message, Stop):
            self.logger.info("asked to stop: %s", message.reason)
            self.request_stop(message.reason)
        elif isinstance(message, CheckpointAck):
            self._take_ack(message)

    # Restoring.

    def restore(self) -> dict[str, Any] | None:
        """The newest committed checkpoint as `{"step", "arrays", "meta"}` (arrays on `xp`):
        the task's when the attempt began, or one this attempt committed since; an older one
        that verifies if it is corrupt; or None to start from scratch."""
        with self._acks:
            newest = max(self._committed, default=None)
            own = None if newest is None else self._committed[newest]
        claimed = self.task.checkpoint
        checksum: str | None
        if claimed is not None and (newest is None or newest <= claimed.step):
            step, uri, checksum = claimed.step, claimed.uri, claimed.checksum
        elif newest is not None and own is not None:
            step, (uri, checksum) = newest, own
        else:
            return None
        try:
            checkpoint = self._store.load(uri, checksum)
        except CorruptCheckpoint as error:
            self.logger.error("the committed checkpoint is unusable: %s", error)
            fallback = self._fallback(step)
            if fallback is None:
                self.logger.error("no older checkpoint of this task verifies: starting over")
                return None
            checkpoint = fallback
            self.logger.warning(
                "restoring the older checkpoint %s (step %d) instead", checkpoint.uri, fallback.step
            )
        with self._acks:
            verified = checksum if checkpoint.uri == uri else None
            self._record_commit(checkpoint.step, checkpoint.uri, verified)
        self.logger.info("restored checkpoint %s (step %d)", checkpoint.uri, checkpoint.step)
        arrays = {name: self.xp.asarray(array) for name, array in checkpoint.arrays.items()}
        return {"step": checkpoint.step, "arrays": arrays, "meta": checkpoint.meta}

    def _fallback(self, committed_step: int) -> Checkpoint | None:
        """The newest checkpoint of this task older than the committed one that verifies."""
        infos = self._store.list_checkpoints(self.job_id, self.task_index)
        older = [info for info in reversed(infos) if info.step < committed_step]
        for info in older[:FALLBACK_TRIES_MAX]:
            try:
                return self._store.load(info.uri, None)
            except CorruptCheckpoint as error:
                self.logger.error("older checkpoint is unusable too: %s", error)
        return None

    # Checkpointing.

    def checkpoint(
        self, step: int, arrays: Mapping[str, Any], meta: Mapping[str, Any] | None = None
    ) -> bool:
        """Writes the arrays and `meta` as the state after `step`, and has the log commit it.
        True once committed. False when it was not (the log says why, a store that cannot be
        written among the reasons): then `should_stop()` says whether the attempt was superseded
        (stop now) or the commit merely failed (go on)."""
        step = _count("step", step)
        if not isinstance(arrays, Mapping):
            raise TypeError(
                f"arrays must be a mapping of names to arrays, got {type(arrays).__name__}"
            )
        if meta is not None and not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a mapping or None, got {type(meta).__name__}")
        with self._checkpointing:
            return self._checkpoint(step, arrays, meta)

    def _newest_committed_step(self) -> int | None:
        """The newest step this attempt knows the log committed (its claim's, or its own)."""
        claimed = self.task.checkpoint
        steps = [*self._committed, *([claimed.step] if claimed is not None else [])]
        return max(steps, default=None)

    def _checkpoint(
        self, step: int, arrays: Mapping[str, Any], meta: Mapping[str, Any] | None
    ) -> bool:
        if self._stop_reason in ("superseded", "disconnected"):
            # Nothing this attempt writes could be committed any more.
            return False
        with self._acks:
            newest = self._newest_committed_step()
            awaited = step in self._unanswered
        if newest is not None and step <= newest:
            self.logger.warning(
                "checkpoint at step %d not written: step %d is committed, and only a newer step "
                "can be",
                step,
                newest,
            )
            return False
        if awaited:
            self.logger.warning(
                "checkpoint at step %d not written: this attempt's checkpoint at that step may "
                "still be committed",
                step,
            )
            return False
        try:
            saved = self._store.save(
                self.job_id,
                self.task_index,
                step=step,
                token=self.token,
                arrays={name: to_numpy(array) for name, array in arrays.items()},
                meta=meta or {},
            )
        except CheckpointExists:
            # Written by this attempt before, and not committed then (no quorum): the log may
            # still commit that one, so it stays as it is.
            self.logger.warning(
                "checkpoint at step %d not written: this attempt wrote that step before (its "
                "commit failed, and the log may still take it); checkpoint a later step",
                step,
            )
            return False
        except OSError as error:
            # A full or unwritable store is this checkpoint's failure, not the job's: the job
            # goes on and may checkpoint again once there is room.
            self.logger.error(
                "checkpoint at step %d not written: the checkpoint directory %s cannot be "
                "written: %s",
                step,
                self.task.checkpoint_dir,
                error,
            )
            return False
        with self._acks:
            self._outstanding.append(step)
            # Set before sending: the answer may arrive before this thread waits for it.
            self._awaited = step
        message = CheckpointSaved(
            step=step,
            uri=saved.uri,
            checksum=saved.checksum,
            size_bytes=saved.size_bytes,
            bytes_written=saved.bytes_written,
        )
        if not self._send(message):
            return False
        ack = self._wait_for_ack(step, saved.uri, saved.checksum)
        if ack is None:
            self.logger.warning(
                "checkpoint at step %d not answered within %.0f s; going on", step, self._ack_wait_s
            )
            return False
        if not ack.ok:
            what = "refused: this attempt is superseded" if ack.superseded else "not committed"
            self.logger.warning("checkpoint at step %d %s (%s)", step, what, ack.error)
            return False
        self.logger.info(
            "checkpoint at step %d committed (%d bytes, %d written)",
            step,
            saved.size_bytes,
            saved.bytes_written,
        )
        with self._acks:
            self._record_commit(step, saved.uri, saved.checksum)
        self._collect_garbage()
        return True

    def _wait_for_ack(self, step: int, uri: str, checksum: str) -> CheckpointAck | None:
        deadline_s = self._clock() + self._ack_wait_s
        with self._acks:
            while step not in self._answered:
                if self._stop_reason in ("superseded", "disconnected"):
                    break
                if self._clock() >= deadline_s:
                    break
                self._acks.wait(_ACK_POLL_S)
            self._awaited = None
            ack = self._answered.pop(step, None)
            if ack is None:
                self._unanswered[step] = (uri, checksum)
            return ack

    def _take_ack(self, ack: CheckpointAck) -> None:
        with self._acks:
            step = ack.step
            if step is None and self._outstanding:
                step = self._outstanding.popleft()
            elif step is not None and step in self._outstanding:
                self._outstanding.remove(step)
            if step is None:
                self.logger.warning("checkpoint answer for no checkpoint ignored: %s", ack)
                return
            if ack.ok is False and ack.superseded:
                self.request_stop("superseded")
            late = self._unanswered.pop(step, None)
            if step == self._awaited:
                self._answered[step] = ack
                self._acks.notify_all()
            elif late is not None and ack.ok:
                self.logger.info("checkpoint at step %d was committed after all", step)
                self._record_commit(step, *late)

    def _record_commit(self, step: int, uri: str, checksum: str | None) -> None:
        """Notes a committed checkpoint; answers may come late, so order by step, not arrival."""
        self._committed[step] = (uri, checksum)
        for old in sorted(self._committed)[:-KEEP_COMMITTED]:
            del self._committed[old]
        # The log commits only newer steps, so an older checkpoint still unanswered never will
        # be: forget it, and let garbage collection have it.
        newest = max(self._committed)
        for old in [unanswered for unanswered in self._unanswered if unanswered < newest]:
            del self._unanswered[old]
            if old in self._outstanding:
                self._outstanding.remove(old)

    def _collect_garbage(self) -> None:
        with self._acks:
            keep = [uri for uri, _ in (*self._committed.values(), *self._unanswered.values())]
        try:
            collected = self._store.garbage_collect(
                self.job_id, self.task_index, keep, token=self.token
            )
        except OSError as error:
            # Garbage left behind costs space, not correctness: the next commit tries again.
            self.logger.warning("checkpoint garbage collection failed: %s", error)
            return
        if collected.manifests_deleted or collected.chunks_deleted:
            self.logger.debug(
                "deleted %d old checkpoints and %d chunks (%d bytes)",
                len(collected.manifests_deleted),
                collected.chunks_deleted,
                collected.bytes_freed,
            )

    # Progress.

    def progress(self, done: int, total: int, **metrics: float) -> None:
        """Reports `done` of `total` units of work and numeric metrics (loss=0.3). At most five
        a second are sent; the one that reaches `total` always is."""
        message = Progress(
            done=_count("done", done), total=_count("total", total), metrics=_check_metrics(metrics)
        )
        now_s = self._clock()
        if message.done >= message.total or now_s - self._last_progress_s >= PROGRESS_INTERVAL_S:
            self._pending_progress = None
            self._last_progress_s = now_s
            self._send(message)
        else:
            self._pending_progress = message

    def flush_progress(self) -> None:
        """Sends the last progress report held back by the rate limit, if any."""
        pending, self._pending_progress = self._pending_progress, None
        if pending is not None:
            self._send(pending)

    def _send(self, message: Message) -> bool:
        try:
            self._sender.send(message)
        except OSError as error:
            # The executor is gone: nothing this attempt does can be committed any more.
            self.logger.error("lost the executor (%s); stopping", error)
            self.request_stop("disconnected")
            return False
        return True


def _count(field: str, value: Any) -> int:
    """A step or a count of work: a whole number from 0 to INT_MAX (an int, a NumPy integer or a
    float with no fraction); TypeError or ValueError naming `field` otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool):
        raise TypeError(f"{field} must be an integer, got bool {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{field} must be an integer, got {type(value).__name__} {value!r:.80}"
        ) from None
    if not 0 <= number <= INT_MAX:
        raise ValueError(f"{field} must be between 0 and {INT_MAX}, got {number}")
    return number


def _check_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    if len(metrics) > METRICS_PER_UPDATE_MAX:
        raise ValueError(f"at most {METRICS_PER_UPDATE_MAX} metrics, got {len(metrics)}")
    checked: dict[str, float] = {}
    for name, value in metrics.items():
        # A name that matches the pattern is ASCII, so it encodes.
        if NAME_PATTERN.fullmatch(name) is None or len(name.encode()) > METRIC_NAME_BYTES_MAX:
            raise ValueError(
                f"metric name {name!r} must start with a letter or digit, contain only letters, "
                f"digits and . _ : @ / -, and be at most {METRIC_NAME_BYTES_MAX} bytes"
            )
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"metric {name!r} must be a number, got {type(value).__name__} {value!r:.80}"
            )
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ValueError(f"metric {name!r} is {number}; metrics must be finite numbers")
        checked[name] = number
    return checked
