"""The protocol between the executor (parent) and a worker subprocess running one task attempt.

The parent starts `python -m node.executor.worker` (see `worker_command`) with two variables in its
environment: `XR_TASK`, the task as JSON (`TaskDescription`), and `XR_CONTROL_FD`, the number of
the worker's end of a Unix socketpair. The worker's stdout and stderr are the task's own logs; the
parent captures them. Control messages are JSON objects, one per line, at most `LINE_BYTES_MAX`
bytes each (newline included), tagged by `type`:

worker -> executor
    progress        {"done", "total", "metrics": {name: float}}, at most a few per second
    checkpoint      {"step", "uri", "checksum", "size_bytes", "bytes_written"}: written, please
                    commit; the executor answers with one `checkpoint_ack`
    result          {"result": {...}}, once, just before exit code 0
    failed          {"error", "retryable"}, once, just before exit code 1

executor -> worker
    checkpoint_ack  {"ok", "error", "superseded", "step"}: ok is true when the log committed it.
                    When it is false, `superseded` says whether the log refused the attempt's token
                    (the attempt is superseded: the worker stops) or the commit merely did not
                    happen (no quorum, a step not newer than the committed one: the worker goes
                    on). Absent, `superseded` counts as true. `step`, when present, names the
                    checkpoint answered; without it answers follow the checkpoints in order.
    stop            {"reason"}: cancelled, lease_lost, superseded, preempted, wall_time or shutdown

Exit codes: 0 succeeded (a `result` was sent), 1 failed (a `failed` was sent, unless the worker
could not even start), 3 stopped on request (nothing sent; the parent knows why it asked).

The parent closes its end only after the worker has exited. A worker that sees it close (the
node died) stops its job and ends within the task's `kill_grace_s`, whether the job returns or
not.
"""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any, Final

import msgspec

from node.executor.arrays import device_index
from xrcore.limits import ARRAY_SIZE_MAX, JOB_ARGS_BYTES_MAX, JOB_RESULT_BYTES_MAX

__all__ = [
    "CONTROL_FD_ENV",
    "EXIT_FAILED",
    "EXIT_STOPPED",
    "EXIT_SUCCEEDED",
    "LINE_BYTES_MAX",
    "STOP_REASONS",
    "TASK_ENV",
    "Channel",
    "CheckpointAck",
    "CheckpointRef",
    "CheckpointSaved",
    "ExecutorMessage",
    "Failed",
    "LineTooLong",
    "Message",
    "Progress",
    "ProtocolError",
    "Result",
    "Stop",
    "TaskDescription",
    "WorkerMessage",
    "decode",
    "decode_task",
    "encode",
    "encode_task",
    "worker_command",
]

TASK_ENV: Final = "XR_TASK"
CONTROL_FD_ENV: Final = "XR_CONTROL_FD"
WORKER_MODULE: Final = "node.executor.worker"

EXIT_SUCCEEDED: Final = 0
EXIT_FAILED: Final = 1
EXIT_STOPPED: Final = 3

# Large enough for the largest result the log accepts, with room for the envelope.
LINE_BYTES_MAX: Final = JOB_RESULT_BYTES_MAX + 64 * 1024
_RECEIVE_BYTES = 64 * 1024

STOP_REASONS: Final = ("cancelled", "lease_lost", "superseded", "wall_time", "shutdown")


class ProtocolError(Exception):
    """A control message that is malformed, of an unknown type, or too long."""


class LineTooLong(ProtocolError):
    """A control line longer than the limit; the channel cannot be read any further."""


# Messages.


class _Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


class Progress(_Message, frozen=True, tag="progress"):
    done: int
    total: int
    metrics: dict[str, float] = {}


class CheckpointSaved(_Message, frozen=True, tag="checkpoint"):
    step: int
    uri: str
    checksum: str
    size_bytes: int
    bytes_written: int


class Result(_Message, frozen=True, tag="result"):
    result: dict[str, Any]


class Failed(_Message, frozen=True, tag="failed"):
    error: str
    retryable: bool = True


class CheckpointAck(_Message, frozen=True, tag="checkpoint_ack"):
    ok: bool
    error: str | None = None
    superseded: bool = True
    step: int | None = None


class Stop(_Message, frozen=True, tag="stop"):
    reason: str


WorkerMessage = Progress | CheckpointSaved | Result | Failed
ExecutorMessage = CheckpointAck | Stop
Message = WorkerMessage | ExecutorMessage

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Message)


def encode(message: Message, *, line_bytes_max: int = LINE_BYTES_MAX) -> bytes:
    """One message as a line, newline included."""
    data = _encoder.encode(message) + b"\n"
    if len(data) > line_bytes_max:
        raise LineTooLong(
            f"{type(message).__name__} message is {len(data)} bytes, more than {line_bytes_max}"
        )
    return data


def decode(line: bytes) -> Message:
    try:
        return _decoder.decode(line)
    except msgspec.DecodeError as error:
        raise ProtocolError(f"malformed control message ({error}): {line[:200]!r}") from None


class Channel:
    """Messages over a connected stream socket, one JSON line each. `send` is thread-safe and
    blocking; `receive` is meant for one reading thread."""

    def __init__(self, connection: socket.socket, *, line_bytes_max: int = LINE_BYTES_MAX) -> None:
        self._socket = connection
        self._line_bytes_max = line_bytes_max
        self._send_lock = threading.Lock()
        self._buffer = bytearray()
        # Where the search for a newline resumes: the bytes before it have none.
        self._scanned = 0

    @classmethod
    def from_fd(cls, descriptor: int) -> Channel:
        return cls(socket.socket(fileno=descriptor))

    def send(self, message: Message) -> None:
        data = encode(message, line_bytes_max=self._line_bytes_max)
        with self._send_lock:
            self._socket.sendall(data)

    def receive(self) -> Message | None:
        """The next message, or None when the other end has closed. Raises ProtocolError for a
        malformed line (the next call reads the line after it) and LineTooLong for an overlong
        one (after which the channel is unusable)."""
        line = self._read_line()
        return None if line is None else decode(line)

    def _read_line(self) -> bytes | None:
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                if len(line) + 1 > self._line_bytes_max:
                    raise LineTooLong(f"control line longer than {self._line_bytes_max} bytes")
                return line
            self._scanned = len(self._buffer)
            if len(self._buffer) >= self._line_bytes_max:
                raise LineTooLong(f"control line longer than {self._line_bytes_max} bytes")
            chunk = self._socket.recv(_RECEIVE_BYTES)
            if not chunk:
                if self._buffer:
                    raise ProtocolError("channel closed in the middle of a control message")
                return None
            self._buffer += chunk

    def close(self) -> None:
        self._socket.close()


# The task description.


class CheckpointRef(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The last checkpoint the log committed for the task."""

    uri: str
    checksum: str
    step: int


class TaskDescription(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one worker runs: one attempt of one task. Exactly one of `entrypoint`
    (`package.module:function`) and `workload` (a built-in workload's name) is set."""

    job_id: str
    task_index: int
    array_size: int = 1
    attempt: int
    # The attempt's fencing token; it is also in the name of every checkpoint the attempt writes.
    token: int
    entrypoint: str | None = None
    workload: str | None = None
    args: dict[str, Any] = {}
    checkpoint: CheckpointRef | None = None
    # The checkpoint store's root directory, shared by all regions.
    checkpoint_dir: str
    # The part of it this task's checkpoints go in (`checkpoints.tenant_area`, its tenant's);
    # "" for the store's root, as before areas.
    checkpoint_area: str = ""
    # "cpu" or "cuda:N", N as the worker sees devices (after CUDA_VISIBLE_DEVICES).
    device: str = "cpu"
    # A share of the device: CuPy's memory pool is capped at this (0: the whole device).
    gpu_memory_mb: int = 0
    # The worker has /tmp, /var/tmp and /dev/shm of its own (`executor.private_tmp`), empty at
    # its start: a file missing there is named as such in its failure.
    private_tmp: bool = False
    # `executor.kill_grace_s`: how long the worker lets its job run on once the executor is gone
    # (its end of the socketpair closed) before it ends the job itself.
    kill_grace_s: float = 10.0
    # The job's `checkpoint_interval_s`: how often it asks to checkpoint, in seconds of run time
    # (0: as the job sees fit). xr does not enforce it; the job reads it as
    # `ctx.task.checkpoint_interval_s`.
    checkpoint_interval_s: int = 0

    def __post_init__(self) -> None:
        if (self.entrypoint is None) == (self.workload is None):
            raise ValueError("exactly one of entrypoint and workload must be set")
        if not 1 <= self.array_size <= ARRAY_SIZE_MAX:
            raise ValueError(f"array_size must be in 1..{ARRAY_SIZE_MAX}, got {self.array_size}")
        if not 0 <= self.task_index < self.array_size:
            raise ValueError(f"task_index must be in 0..{self.array_size - 1}")
        if (
            self.token <= 0
            or self.attempt < 0
            or min(self.gpu_memory_mb, self.checkpoint_interval_s) < 0
        ):
            raise ValueError(
                "token must be positive; attempt, gpu_memory_mb and checkpoint_interval_s not "
                "negative"
            )
        if not 0 < self.kill_grace_s <= 86_400:
            raise ValueError(f"kill_grace_s must be in (0, 86400], got {self.kill_grace_s}")
        if not self.checkpoint_dir:
            raise ValueError("checkpoint_dir must be set")
        area = self.checkpoint_area
        if area and (area.startswith("/") or {"", ".", ".."} & set(area.split("/"))):
            raise ValueError(f"checkpoint_area must be a relative path down, got {area!r}")
        device_index(self.device)


_task_decoder = msgspec.json.Decoder(TaskDescription)


def encode_task(task: TaskDescription) -> str:
    """The value of `XR_TASK`. Decoded again before it is returned, so a description the worker
    would refuse fails here, in the parent, with the reason."""
    data = msgspec.json.encode(task)
    # Linux refuses a single environment string over 128 KiB; args are bounded well below it.
    if len(data) > JOB_ARGS_BYTES_MAX + 16 * 1024:
        raise ProtocolError(f"task description is {len(data)} bytes, too large for XR_TASK")
    decode_task(data)
    return data.decode()


def decode_task(text: str | bytes) -> TaskDescription:
    try:
        return _task_decoder.decode(text)
    except msgspec.DecodeError as error:
        raise ProtocolError(f"bad task description in {TASK_ENV}: {error}") from None


def worker_command(python: str = sys.executable) -> list[str]:
    """The worker's command line; run it with `XR_TASK` and `XR_CONTROL_FD` set."""
    return [python, "-m", WORKER_MODULE]
