"""The worker: `python -m node.executor.worker` runs one attempt of one task, then exits.

It reads the task from `XR_TASK` and its end of the control socketpair from `XR_CONTROL_FD` (see
`node.executor.protocol`), sets up the `JobContext`, resolves the built-in workload or imports the
entrypoint `package.module:function`, and calls it. Then it sends `result` and exits 0, or sends
`failed` and exits 1, or, when it was asked to stop while the function ran, exits 3 without
reporting (a partial result is not a result). It exits at once (`os._exit`): threads the job left
running do not keep it alive, and the job's `atexit` handlers do not run.

A reader thread takes the executor's messages (stop requests, checkpoint answers); SIGTERM sets
the same stop flag, so the function can checkpoint and return before the executor's SIGKILL.
When the executor's end of the channel closes (its node died), the reader thread asks the job to
stop (`disconnected`) and, if the job has not returned `kill_grace_s` later, ends the worker
itself. A worker that leads its own process group, as the executor starts it, ends that group
with it then, so that nothing the job started outlives a node that is no longer there to end it.

Failures are retryable unless the function raised `NonRetryableError`, the entrypoint cannot be
imported, cannot take the context or is not callable, the result is not a small JSON object
(NaN, infinities, bytes and lone surrogates are refused, not changed), the task exceeded its GPU
memory share, or (with /tmp of its own, `executor.private_tmp`) a file it opened under /tmp,
/var/tmp or /dev/shm is not there: cases another attempt would repeat.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import msgspec

from node.executor import sandbox
from node.executor.arrays import DeviceUnavailable, array_module, is_out_of_memory
from node.executor.arrays import set_memory_limit as set_pool_limit
from node.executor.checkpoints import FileCheckpointStore
from node.executor.context import JobContext, NonRetryableError, TaskRefused
from node.executor.protocol import (
    CONTROL_FD_ENV,
    EXIT_FAILED,
    EXIT_STOPPED,
    EXIT_SUCCEEDED,
    TASK_ENV,
    Channel,
    CheckpointAck,
    Failed,
    LineTooLong,
    ProtocolError,
    Result,
    Stop,
    TaskDescription,
    decode_task,
)
from node.executor.workloads import WORKLOADS
from xrcore.commands import ENTRYPOINT_PATTERN
from xrcore.limits import JOB_RESULT_BYTES_MAX, MESSAGE_BYTES_MAX

__all__ = ["main", "resolve", "run"]

log = logging.getLogger("xr.worker")

# A failure's message: the exception, then the end of its traceback, within what the log keeps.
TRACEBACK_LINES_MAX = 20
_SUMMARY_BYTES_MAX = 1_024

JobFunction = Callable[[JobContext], Any]

# Set by the reader thread when the executor's end of the channel has closed.
_executor_gone = threading.Event()


def resolve(task: TaskDescription) -> JobFunction:
    """The function to run; NonRetryableError when there is none to be had."""
    if task.workload is not None:
        try:
            return WORKLOADS[task.workload]
        except KeyError:
            known = ", ".join(sorted(WORKLOADS))
            raise TaskRefused(
                f"unknown workload {task.workload!r}; the built-in workloads are {known}"
            ) from None
    entrypoint = task.entrypoint or ""
    if ENTRYPOINT_PATTERN.fullmatch(entrypoint) is None:
        raise TaskRefused(f"entrypoint {entrypoint!r} is not of the form package.module:name")
    module_name, function_name = entrypoint.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise NonRetryableError(
            f"cannot import module {module_name!r} of entrypoint {entrypoint!r}: "
            f"{type(error).__name__}: {error} (sys.path: {sys.path[:4]})"
        ) from error
    function = getattr(module, function_name, None)
    if function is None:
        raise TaskRefused(f"module {module_name!r} has no function {function_name!r}")
    if not callable(function):
        raise TaskRefused(
            f"entrypoint {entrypoint!r} is not callable: {function_name!r} in module "
            f"{module_name!r} is of type {type(function).__name__}"
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        # Some built-in callables have no signature to check: the call itself will tell.
        signature = None
    if signature is not None:
        try:
            signature.bind(None)
        except TypeError as error:
            raise TaskRefused(
                f"entrypoint {entrypoint!r} cannot take the context: {error}"
            ) from None
    resolved: JobFunction = function
    return resolved


def _printable(text: str, bytes_max: int) -> str:
    """`text` cut to `bytes_max` bytes of UTF-8, with what UTF-8 cannot hold (lone surrogates)
    written as backslash escapes, so that it always goes into a control message."""
    return text.encode(errors="backslashreplace")[:bytes_max].decode(errors="ignore")


def _message_of(error: BaseException) -> str:
    """`str(error)`, or a note saying it could not be had (a `__str__` that raises)."""
    try:
        return str(error)
    except Exception:
        return f"(the {type(error).__name__}'s message could not be made into text)"


def describe_failure(error: BaseException) -> str:
    """The exception and the end of its traceback, cut to fit a failure message in the log.
    Never raises: lone surrogates are written as backslash escapes, and an exception whose
    message cannot be made into text is named by its type."""
    summary = _printable(f"{type(error).__name__}: {_message_of(error)}", _SUMMARY_BYTES_MAX)
    try:
        lines = traceback.format_exception(error)
    except Exception:
        lines = []
    tail = "".join(lines[-TRACEBACK_LINES_MAX:])
    room = MESSAGE_BYTES_MAX - len(summary.encode()) - 1
    tail_bytes = tail.encode(errors="backslashreplace")[-room:] if room > 0 else b""
    return summary + "\n" + tail_bytes.decode(errors="ignore")


def _receive(channel: Channel, context: JobContext) -> None:
    """The reader thread: hands the executor's messages to the context until the channel ends."""
    while True:
        try:
            message = channel.receive()
        except LineTooLong as error:
            log.error("control channel unusable: %s", error)
            message = None
        except ProtocolError as error:
            log.error("ignoring a control message: %s", error)
            continue
        except OSError as error:
            log.error("control channel failed: %s", error)
            message = None
        if message is None:
            # Without the executor nothing can be committed: stop like a lost lease.
            context.request_stop("disconnected")
            return
        if not isinstance(message, CheckpointAck | Stop):
            log.error("ignoring a message meant for the executor: %s", message)
            continue
        context.handle(message)


def _check_result(value: Any) -> dict[str, Any]:
    """The function's return value as the task's result: a JSON object within the log's bound.
    TaskRefused for anything else, and for what JSON cannot hold exactly: NaN and infinities
    (msgspec writes null), bytes (msgspec writes base64 text), lone surrogates (not UTF-8) and
    nesting too deep to encode."""
    result = {} if value is None else value
    if not isinstance(result, dict):
        raise TaskRefused(f"the job returned a {type(result).__name__}, not a dict")
    try:
        # The standard encoder first, for what msgspec would change silently rather than refuse.
        json.dumps(result, allow_nan=False)
        encoded = msgspec.json.encode(result)
    except (TypeError, ValueError, OverflowError, RecursionError) as error:
        # ValueError covers NaN, infinities and a lone surrogate (UnicodeEncodeError).
        raise TaskRefused(
            f"the job's result is not JSON ({type(error).__name__}: {_message_of(error)}); "
            "return a dict of strings, finite numbers, booleans, None, lists and dicts"
        ) from None
    if len(encoded) > JOB_RESULT_BYTES_MAX:
        raise TaskRefused(
            f"the job's result is {len(encoded)} bytes as JSON, more than {JOB_RESULT_BYTES_MAX}"
        )
    decoded: dict[str, Any] = msgspec.json.decode(encoded)
    return decoded


def _failure(error: BaseException, task: TaskDescription) -> Failed:
    if isinstance(error, TaskRefused):
        return Failed(error=_printable(_message_of(error), MESSAGE_BYTES_MAX // 4), retryable=False)
    if isinstance(error, NonRetryableError):
        return Failed(error=describe_failure(error), retryable=False)
    missing = _missing_private_file(error) if task.private_tmp else None
    if missing is not None:
        # Every attempt starts with them empty, so another attempt would not find it either.
        message = (
            f"{missing} is not there: this job has /tmp, /var/tmp and /dev/shm of its own, "
            "empty when it starts (executor.private_tmp); give it paths outside them: "
            f"{describe_failure(error)}"
        )
        return Failed(error=_printable(message, MESSAGE_BYTES_MAX // 4), retryable=False)
    if is_out_of_memory(error) and task.gpu_memory_mb:
        message = (
            f"the task exceeded its GPU memory share of {task.gpu_memory_mb} MB "
            f"(gpu_memory_mb): {describe_failure(error)}"
        )
        return Failed(error=_printable(message, MESSAGE_BYTES_MAX // 4), retryable=False)
    return Failed(error=describe_failure(error), retryable=True)


def _missing_private_file(error: BaseException) -> str | None:
    """The path of a file not found in the worker's own /tmp, /var/tmp or /dev/shm, if that
    is what `error` is."""
    if not isinstance(error, FileNotFoundError) or error.filename is None:
        return None
    path = os.fsdecode(error.filename)
    return path if sandbox.covered_by(path) is not None else None


def _report(channel: Channel, message: Failed | Result) -> None:
    try:
        channel.send(message)
    except OSError as error:
        log.error("cannot report to the executor: %s", error)


def _control(channel: Channel, context: JobContext, grace_s: float) -> None:
    """The reader thread's life: `_receive` until the channel ends, then, if the job has not
    returned within `grace_s` of being asked to stop, the end of the worker. A job that never
    polls `should_stop()` must not keep computing (holding its devices) for a node that is gone
    while its task runs again elsewhere."""
    _receive(channel, context)
    _executor_gone.set()
    time.sleep(grace_s)
    log.warning(
        "the executor is gone and the job did not return within %.1f s of being asked to stop: "
        "ending it",
        grace_s,
    )
    _end(EXIT_STOPPED)


def _listen(channel: Channel, context: JobContext, grace_s: float) -> None:
    """Starts the reader thread, and makes SIGTERM a stop request like the executor's."""
    threading.Thread(
        target=_control, args=(channel, context, grace_s), name="xr-control", daemon=True
    ).start()

    def on_sigterm(signal_number: int, frame: FrameType | None) -> None:
        context.request_stop("signal")

    # Signal handlers can only be installed from the main thread (tests may call `run` elsewhere).
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)


def run(task: TaskDescription, channel: Channel) -> int:
    """Runs the task, reports its outcome on `channel` and returns the exit code. Only for a
    worker process: once `channel` ends, its reader thread ends the process (`_control`)."""
    try:
        xp = array_module(task.device)
    except DeviceUnavailable as error:
        # Another region, or this one after a repair, may have the device.
        _report(channel, Failed(error=str(error)[: MESSAGE_BYTES_MAX // 4], retryable=True))
        return EXIT_FAILED
    if task.gpu_memory_mb and not set_pool_limit(xp, task.gpu_memory_mb << 20):
        log.info("gpu_memory_mb=%d does not apply on NumPy (CPU mode)", task.gpu_memory_mb)
    store = FileCheckpointStore(Path(task.checkpoint_dir), area=task.checkpoint_area)
    context = JobContext(task, sender=channel, store=store, xp=xp, logger=logging.getLogger("job"))
    _listen(channel, context, task.kill_grace_s)
    try:
        result = _check_result(resolve(task)(context))
    except Exception as error:
        if context.should_stop():
            log.warning("stopped (%s) with an error: %s", context.stop_reason, error)
            return EXIT_STOPPED
        log.error("the job failed", exc_info=error)
        _report(channel, _failure(error, task))
        return EXIT_FAILED
    if context.should_stop():
        log.info("stopped on request (%s); the result is not reported", context.stop_reason)
        return EXIT_STOPPED
    context.flush_progress()
    _report(channel, Result(result=result))
    return EXIT_SUCCEEDED


def _configure_logging(task: TaskDescription | None) -> None:
    where = f"{task.job_id}[{task.task_index}]#{task.attempt} " if task else ""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {where}%(name)s: %(message)s",
    )


def main() -> int:
    try:
        descriptor = int(os.environ[CONTROL_FD_ENV])
    except (KeyError, ValueError):
        _configure_logging(None)
        log.error("%s must hold the control socket's file descriptor", CONTROL_FD_ENV)
        return EXIT_FAILED
    channel = Channel.from_fd(descriptor)
    try:
        task = decode_task(os.environ.get(TASK_ENV, ""))
    except ProtocolError as error:
        _configure_logging(None)
        log.error("%s", error)
        _report(channel, Failed(error=str(error)[: MESSAGE_BYTES_MAX // 4], retryable=False))
        return EXIT_FAILED
    _configure_logging(task)
    return run(task, channel)


def _end(code: int) -> NoReturn:
    """Ends the worker now with exit code `code`, its output flushed. Without waiting for the
    threads the job left running: the interpreter would, and the attempt would end only with
    them (its result discarded at its wall time). When the executor is gone and the worker leads
    its process group, the group is killed, the worker with it: the executor kills it after
    every worker's exit, and it is no longer there to."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if _executor_gone.is_set() and os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(code)


def _main_then_end() -> NoReturn:
    """`main`, then `_end` with its exit code. An exception that escapes `main` (the job called
    `sys.exit` or raised `KeyboardInterrupt`) ends it as the interpreter would for `sys.exit`:
    with the code asked for (a message is printed and counts as 1); for any other exception, with
    its traceback on stderr and code 1."""
    try:
        code = main()
    except SystemExit as error:
        if error.code is None or isinstance(error.code, int):
            code = error.code or 0
        else:
            print(error.code, file=sys.stderr)
            code = EXIT_FAILED
    except BaseException:
        traceback.print_exc()
        code = EXIT_FAILED
    _end(code)


if __name__ == "__main__":
    _main_then_end()
