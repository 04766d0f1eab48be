"""Histories: what a jepsen-lite run records, how it is stored, and how its operations pair up.

A history is a list of `Op`s in the order they happened. Each client operation appears twice: an
`invoke` when the client sends it and a completion when it learns the outcome:

- `ok`: it happened, and `value` is what it returned;
- `fail`: it definitely did not happen (a definite error);
- `info`: the outcome is unknown (a timeout, a reset): it may have taken effect at any moment after
  its invoke, even much later, or never. An invoke with no completion at all is treated the same.

A client process has at most one operation outstanding, so a completion belongs to the latest
invoke of its process. A client that sees `info` must move on to a new process number, because the
old operation may still be in flight. Faults are recorded as single `info` events of the nemesis,
process `NEMESIS_PROCESS` (-1) and f `"nemesis"`; checkers skip them. The two go together: an op
with only one of them is neither a fault nor a client operation, and `pair` refuses it.

On disk a history is JSON lines, one `Op.to_json()` object a line, written and read here. The
history index, not `time_ns`, orders events: the recorder takes the time and the index under one
lock, so index order is real-time order, and checkers use indices as their clock.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, get_args

from node.files import open_to_read

__all__ = [
    "NEMESIS_F",
    "NEMESIS_PROCESS",
    "OP_TYPES",
    "History",
    "HistoryError",
    "HistoryRecorder",
    "Op",
    "OpType",
    "Operation",
    "is_nemesis",
    "pair",
    "read_history",
    "write_history",
]

OpType = Literal["invoke", "ok", "fail", "info"]
OP_TYPES: frozenset[str] = frozenset(get_args(OpType))
NEMESIS_PROCESS = -1
NEMESIS_F = "nemesis"

_REQUIRED_FIELDS = ("index", "type", "f", "process", "value", "time_ns")
_OPTIONAL_FIELDS = ("key", "node", "error")
_KNOWN_FIELDS = frozenset(_REQUIRED_FIELDS + _OPTIONAL_FIELDS)


class HistoryError(ValueError):
    """A history that cannot be read or does not pair up; `line` (1-based, in the file) or `index`
    (in the history) says where, when known."""

    def __init__(self, message: str, *, line: int | None = None, index: int | None = None) -> None:
        where = f"line {line}: " if line is not None else ""
        where += f"op {index}: " if index is not None and line is None else ""
        super().__init__(where + message)
        self.reason = message
        self.line = line
        self.index = index


def _is_int(value: object) -> bool:
    # bool is an int subclass, and `true` is never a valid index or process.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One event of a history: an invoke, a completion, or a nemesis event."""

    index: int
    type: OpType
    f: str
    process: int
    value: Any
    time_ns: int
    key: str | None = None
    node: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.index) or self.index < 0:
            raise ValueError(f"index must be an integer >= 0, not {self.index!r}")
        if self.type not in OP_TYPES:
            raise ValueError(f"type must be one of {sorted(OP_TYPES)}, not {self.type!r}")
        if not isinstance(self.f, str) or not self.f:
            raise ValueError(f"f must be a non-empty string, not {self.f!r}")
        if not _is_int(self.process):
            raise ValueError(f"process must be an integer, not {self.process!r}")
        if not _is_int(self.time_ns):
            raise ValueError(f"time_ns must be an integer, not {self.time_ns!r}")
        for name in _OPTIONAL_FIELDS:
            field_value = getattr(self, name)
            if field_value is not None and not isinstance(field_value, str):
                raise ValueError(f"{name} must be a string or null, not {field_value!r}")

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored on one line; optional fields are left out when None."""
        data: dict[str, Any] = {
            "index": self.index,
            "type": self.type,
            "f": self.f,
            "process": self.process,
            "value": self.value,
            "time_ns": self.time_ns,
        }
        if self.key is not None:
            data["key"] = self.key
        if self.node is not None:
            data["node"] = self.node
        if self.error is not None:
            data["error"] = self.error
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Op:
        """The inverse of `to_json`; a ValueError names the missing, unknown or bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"an op must be a JSON object, not {type(data).__name__}")
        for name in _REQUIRED_FIELDS:
            if name not in data:
                raise ValueError(f"missing field {name!r}")
        unknown = sorted(set(data) - _KNOWN_FIELDS)
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}")
        return cls(
            index=data["index"],
            type=data["type"],
            f=data["f"],
            process=data["process"],
            value=data["value"],
            time_ns=data["time_ns"],
            key=data.get("key"),
            node=data.get("node"),
            error=data.get("error"),
        )


def is_nemesis(op: Op) -> bool:
    """True for fault events (process NEMESIS_PROCESS and f NEMESIS_F, both), which are not
    client operations and which checkers skip."""
    return op.process == NEMESIS_PROCESS and op.f == NEMESIS_F


@dataclass(frozen=True, slots=True)
class Operation:
    """A client operation: its invoke and its completion, None when it never returned (which
    checkers treat like `info`)."""

    invoke: Op
    completion: Op | None

    @property
    def type(self) -> OpType:
        """The outcome: "ok", "fail" or "info" (also for an operation that never returned)."""
        return "info" if self.completion is None else self.completion.type

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def process(self) -> int:
        return self.invoke.process

    @property
    def key(self) -> str | None:
        return self.invoke.key

    @property
    def value(self) -> Any:
        """What an `ok` operation returned; otherwise what it was invoked with."""
        if self.completion is not None and self.completion.type == "ok":
            return self.completion.value
        return self.invoke.value

    @property
    def indices(self) -> list[int]:
        """The history indices of its events."""
        if self.completion is None:
            return [self.invoke.index]
        return [self.invoke.index, self.completion.index]


def pair(ops: Sequence[Op]) -> list[Operation]:
    """Matches each invoke with the next completion of the same process, in invoke order.

    Nemesis events are skipped. Raises HistoryError for a completion with no outstanding invoke,
    a second invoke while one is outstanding, a completion whose f differs from its invoke's, or
    an op with only one of the nemesis's process and f (a client read on process -1 was skipped
    as if it were a fault, and so never judged).
    """
    outstanding: dict[int, int] = {}
    operations: list[Operation | None] = []
    slots: list[Op] = []
    for op in ops:
        if is_nemesis(op):
            continue
        if op.process == NEMESIS_PROCESS or op.f == NEMESIS_F:
            raise HistoryError(
                f"process {NEMESIS_PROCESS} and f {NEMESIS_F!r} go together (a fault event has "
                f"both, a client operation neither), not process {op.process} with f {op.f!r}",
                index=op.index,
            )
        if op.type == "invoke":
            if op.process in outstanding:
                earlier = slots[outstanding[op.process]].index
                raise HistoryError(
                    f"process {op.process} invokes again while op {earlier} is outstanding",
                    index=op.index,
                )
            outstanding[op.process] = len(slots)
            slots.append(op)
            operations.append(None)
            continue
        slot = outstanding.pop(op.process, None)
        if slot is None:
            raise HistoryError(
                f"{op.type} of process {op.process} has no outstanding invoke", index=op.index
            )
        invoke = slots[slot]
        if invoke.f != op.f:
            raise HistoryError(
                f"completion f {op.f!r} differs from its invoke's {invoke.f!r} (op {invoke.index})",
                index=op.index,
            )
        operations[slot] = Operation(invoke, op)
    return [
        operation if operation is not None else Operation(slots[slot], None)
        for slot, operation in enumerate(operations)
    ]


class History(list[Op]):
    """A list of ops with the reading, writing and pairing helpers as methods."""

    @classmethod
    def read(cls, path: str | Path) -> History:
        return cls(read_history(path))

    def write(self, path: str | Path) -> None:
        write_history(path, self)

    def operations(self) -> list[Operation]:
        return pair(self)

    def client_ops(self) -> list[Op]:
        """Every op but the nemesis events."""
        return [op for op in self if not is_nemesis(op)]


def _dumps(op: Op) -> str:
    return json.dumps(op.to_json(), separators=(",", ":"), allow_nan=False)


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise json.JSONDecodeError(f"{text} is too large", text, 0)
    return value


# A history line is one operation: far less than this.
LINE_BYTES_MAX = 1 << 20


def read_history(path: str | Path) -> list[Op]:
    """Reads a JSON-lines history. Blank lines are skipped; any other bad line raises
    HistoryError with its line number. Indices must be 0, 1, 2, ... in file order."""
    ops: list[Op] = []
    # A named pipe nobody writes to reads as empty instead of waiting for a writer.
    with open_to_read(path) as file:
        line_number = 0
        while raw := file.readline(LINE_BYTES_MAX + 1):
            line_number += 1
            if len(raw) > LINE_BYTES_MAX:
                # An endless file (/dev/zero) is refused here, not read until memory runs out.
                raise HistoryError(f"longer than {LINE_BYTES_MAX} bytes", line=line_number)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise HistoryError("not UTF-8 text", line=line_number) from None
            if not line.strip():
                continue
            try:
                # NaN and infinity are not JSON, and `write_history` never writes them.
                data = json.loads(line, parse_constant=_no_constant, parse_float=_finite)
            except json.JSONDecodeError as error:
                raise HistoryError(f"not JSON: {error.msg}", line=line_number) from None
            except RecursionError:
                raise HistoryError("not JSON: nested too deeply", line=line_number) from None
            try:
                op = Op.from_json(data)
            except ValueError as error:
                raise HistoryError(str(error), line=line_number) from None
            if op.index != len(ops):
                raise HistoryError(
                    f"index is {op.index}, expected {len(ops)} (indices count up from 0)",
                    line=line_number,
                )
            ops.append(op)
    return ops


def write_history(path: str | Path, ops: Iterable[Op]) -> None:
    """Writes ops as JSON lines, replacing the file."""
    with open(path, "w", encoding="utf-8") as file:
        for op in ops:
            file.write(_dumps(op) + "\n")


class HistoryRecorder:
    """A thread-safe, append-only recorder of one run's history.

    `clock` returns nanoseconds since the run started (inject a simulated one in tests); by default
    it is `time.monotonic_ns()` relative to the recorder's creation. The index and the time of an
    op are taken under one lock, so index order and time order agree. With `stream_path` every op is
    also appended to that JSON-lines file as it is recorded and flushed, so a run that crashes
    still leaves its history behind.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], int] | None = None,
        stream_path: str | Path | None = None,
    ) -> None:
        if clock is None:
            started_ns = time.monotonic_ns()

            def clock() -> int:
                return time.monotonic_ns() - started_ns

        self._clock = clock
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        # The index of each process's outstanding invoke.
        self._outstanding: dict[int, int] = {}
        self._stream: IO[str] | None = None
        if stream_path is not None:
            self._stream = open(stream_path, "w", encoding="utf-8")  # noqa: SIM115

    def _append(self, **fields: Any) -> Op:
        # Called with the lock held.
        op = Op(index=len(self._ops), time_ns=self._clock(), **fields)
        if self._stream is not None:
            self._stream.write(_dumps(op) + "\n")
            self._stream.flush()
        self._ops.append(op)
        return op

    def invoke(
        self, process: int, f: str, value: Any, key: str | None = None, node: str | None = None
    ) -> Op:
        """Records that `process` sends an operation; returns the invoke to complete later."""
        with self._lock:
            if process in self._outstanding:
                raise ValueError(
                    f"process {process} already has op {self._outstanding[process]} outstanding"
                )
            op = self._append(type="invoke", f=f, process=process, value=value, key=key, node=node)
            self._outstanding[process] = op.index
            return op

    def complete(
        self, invoke_op: Op, type: OpType, value: Any = None, error: str | None = None
    ) -> Op:
        """Records the outcome of `invoke_op`: "ok", "fail" or "info"."""
        if type == "invoke":
            raise ValueError("a completion's type is ok, fail or info")
        with self._lock:
            if self._outstanding.get(invoke_op.process) != invoke_op.index:
                raise ValueError(f"op {invoke_op.index} is not outstanding in this recorder")
            del self._outstanding[invoke_op.process]
            return self._append(
                type=type,
                f=invoke_op.f,
                process=invoke_op.process,
                value=value,
                key=invoke_op.key,
                node=invoke_op.node,
                error=error,
            )

    def nemesis(self, value: Any, *, node: str | None = None) -> Op:
        """Records a fault (or its healing) as one info event of the nemesis process."""
        with self._lock:
            return self._append(
                type="info", f=NEMESIS_F, process=NEMESIS_PROCESS, value=value, node=node
            )

    @property
    def ops(self) -> list[Op]:
        """A copy of the ops recorded so far."""
        with self._lock:
            return list(self._ops)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def close(self) -> None:
        """Closes the stream file, if any; the recorded ops stay readable."""
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None

    def __enter__(self) -> HistoryRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
