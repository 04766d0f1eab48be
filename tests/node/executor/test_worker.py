"""The worker protocol; the job context in-process (progress rate limit, metrics, checkpoint
answers that come late); and the worker as a real subprocess driven through a socketpair the way
the executor drives it: progress, checkpoint answers, stop requests, SIGTERM, failures retryable
or not, and the example user job.

The small jobs at the top are entrypoints the worker subprocess imports from this module."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from node.executor.checkpoints import FileCheckpointStore
from node.executor.context import JobContext, NonRetryableError
from node.executor.protocol import (
    CONTROL_FD_ENV,
    EXIT_FAILED,
    EXIT_STOPPED,
    EXIT_SUCCEEDED,
    TASK_ENV,
    Channel,
    CheckpointAck,
    CheckpointSaved,
    Failed,
    LineTooLong,
    Message,
    Progress,
    ProtocolError,
    Result,
    Stop,
    TaskDescription,
    decode,
    decode_task,
    encode,
    encode_task,
    worker_command,
)
from tests.node.executor.conftest import process_running

REPOSITORY = Path(__file__).resolve().parents[3]
MODULE = "tests.node.executor.test_worker"
# Generous: two cores shared with other test runs; the jobs themselves take milliseconds.
MESSAGE_WAIT_S = 30.0


# Jobs the worker subprocess runs.


def wait_for_stop(ctx: JobContext) -> dict[str, Any]:
    ctx.progress(0, 1)
    deadline_s = time.monotonic() + MESSAGE_WAIT_S
    while not ctx.should_stop() and time.monotonic() < deadline_s:
        time.sleep(0.01)
    return {"stop_reason": ctx.stop_reason}


def raises(ctx: JobContext) -> dict[str, Any]:
    raise RuntimeError(f"the disk is on fire (task {ctx.task_index})")


def opens(ctx: JobContext) -> dict[str, Any]:
    with open(ctx.args["path"]) as opened:
        return {"read": opened.read()}


def refuses(ctx: JobContext) -> dict[str, Any]:
    raise NonRetryableError("argument 'n' must be even")


def returns_a_list(ctx: JobContext) -> list[int]:
    return [1, 2, 3]


def leaves_a_thread(ctx: JobContext) -> dict[str, Any]:
    """Returns while a thread it started (not a daemon) still runs, for far longer than the test
    waits."""
    import threading

    threading.Thread(target=time.sleep, args=(10 * MESSAGE_WAIT_S,)).start()
    return {"ok": 1}


def ignores_everything(ctx: JobContext) -> dict[str, Any]:
    """Starts a child process, reports its pid as the metric "child", and then computes forever:
    it ignores SIGTERM and never polls `should_stop()`."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", str(10 * MESSAGE_WAIT_S)])
    ctx.progress(1, 0, child=float(child.pid))
    while True:
        time.sleep(0.05)


def returns_what_json_cannot_hold(ctx: JobContext) -> dict[str, Any]:
    kind = ctx.args["kind"]
    if kind == "deep":
        nested: dict[str, Any] = {}
        for _ in range(5000):
            nested = {"x": nested}
        return nested
    if kind == "large":
        return {"text": "x" * 200_000}
    results: dict[str, dict[str, Any]] = {
        "nan": {"a": float("nan")},
        "infinity": {"a": [1.0, -float("inf")]},
        "bytes": {"a": b"\x00\x01hello"},
        "surrogate": {"a": "\ud800"},
    }
    return results[kind]


class UnprintableError(NonRetryableError):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def refuses_with_a_surrogate(ctx: JobContext) -> dict[str, Any]:
    raise NonRetryableError("bad \udcff byte")


def refuses_without_a_message(ctx: JobContext) -> dict[str, Any]:
    raise UnprintableError()


def raises_a_type_error(ctx: JobContext) -> dict[str, Any]:
    return {"length": len(ctx)}  # type: ignore[arg-type]


def takes_nothing() -> dict[str, Any]:
    return {}


NOT_CALLABLE = 3


def checkpoints_twice(ctx: JobContext) -> dict[str, Any]:
    import numpy as np

    committed = [ctx.checkpoint(step, {"w": np.full(4, float(step))}) for step in (1, 2)]
    return {"committed": committed, "stop_reason": ctx.stop_reason}


# The protocol.


def test_messages_round_trip_as_single_lines() -> None:
    messages: list[Message] = [
        Progress(done=3, total=10, metrics={"loss": 0.5}),
        CheckpointSaved(
            step=4, uri="a/0/x.json", checksum="sha256:ab", size_bytes=9, bytes_written=1
        ),
        Result(result={"pi": 3.14, "nested": {"a": [1]}}),
        Failed(error="boom\nline two", retryable=False),
        CheckpointAck(ok=False, error="stale token", superseded=True, step=4),
        Stop(reason="cancelled"),
    ]
    for message in messages:
        line = encode(message)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert decode(line[:-1]) == message
    assert json.loads(encode(Stop(reason="shutdown"))) == {"type": "stop", "reason": "shutdown"}
    # What the executor writes by hand, without the optional fields, decodes too.
    assert decode(b'{"type": "checkpoint_ack", "ok": true, "error": null}') == CheckpointAck(
        ok=True
    )


def test_a_channel_carries_messages_both_ways_and_reports_the_end() -> None:
    left, right = socket.socketpair()
    parent, child = Channel(left), Channel(right)
    child.send(Progress(done=1, total=2))
    child.send(Result(result={}))
    parent.send(Stop(reason="cancelled"))
    assert parent.receive() == Progress(done=1, total=2)
    assert parent.receive() == Result(result={})
    assert child.receive() == Stop(reason="cancelled")
    child.close()
    assert parent.receive() is None
    parent.close()


def test_oversize_lines_are_refused_when_sent_and_when_received() -> None:
    left, right = socket.socketpair()
    sender, receiver = Channel(left, line_bytes_max=1000), Channel(right, line_bytes_max=1000)
    with pytest.raises(LineTooLong, match="more than 1000"):
        sender.send(Result(result={"text": "x" * 1000}))
    left.sendall(b"{" + b" " * 5000 + b"}\n")
    with pytest.raises(LineTooLong, match="longer than 1000 bytes"):
        receiver.receive()
    left.close()
    right.close()


def test_malformed_lines_are_reported_and_skipped() -> None:
    left, right = socket.socketpair()
    receiver = Channel(right)
    left.sendall(b'not json\n{"type": "nonsense"}\n{"type": "stop", "reason": "shutdown"}\n')
    with pytest.raises(ProtocolError, match="malformed"):
        receiver.receive()
    with pytest.raises(ProtocolError, match="malformed"):
        receiver.receive()
    assert receiver.receive() == Stop(reason="shutdown")
    left.close()
    right.close()


def test_task_descriptions_round_trip_and_bad_ones_fail_in_the_parent() -> None:
    task = TaskDescription(
        job_id="j",
        task_index=1,
        array_size=2,
        attempt=1,
        token=5,
        workload="gemm",
        checkpoint_dir="/x",
    )
    assert decode_task(encode_task(task)) == task
    with pytest.raises(ValueError, match="exactly one of entrypoint and workload"):
        TaskDescription(job_id="j", task_index=0, attempt=1, token=5, checkpoint_dir="/x")
    with pytest.raises(ProtocolError, match=r"task_index must be in 0\.\.1"):
        decode_task(encode_task(task).replace('"task_index":1', '"task_index":2'))
    with pytest.raises(ProtocolError, match="device must be"):
        decode_task(encode_task(task).replace('"cpu"', '"tpu:0"'))


# The job context, in-process.


class RecordingSender:
    """Records what the context sends; answers the checkpoints whose steps are in `answer`."""

    def __init__(self, answer: set[int] | None = None) -> None:
        self.context: JobContext | None = None
        self.messages: list[Message] = []
        self.answer = answer or set()

    def send(self, message: Message) -> None:
        self.messages.append(message)
        if isinstance(message, CheckpointSaved) and message.step in self.answer:
            assert self.context is not None
            self.context.handle(CheckpointAck(ok=True, step=message.step))


def make_context(
    root: Path, sender: RecordingSender, now_s: list[float], *, ack_wait_s: float = 5.0
) -> JobContext:
    task = TaskDescription(
        job_id="job-c", task_index=0, attempt=1, token=3, workload="gemm", checkpoint_dir=str(root)
    )
    context = JobContext(
        task,
        sender=sender,
        store=FileCheckpointStore(root, chunk_grace_s=0.0),
        xp=np,
        clock=lambda: now_s[0],
        ack_wait_s=ack_wait_s,
    )
    sender.context = context
    return context


def test_context__progress_is_rate_limited_but_the_last_report_is_always_sent(
    tmp_path: Path,
) -> None:
    sender, now_s = RecordingSender(), [100.0]
    context = make_context(tmp_path, sender, now_s)
    for done, at_s in [(1, 100.0), (2, 100.05), (3, 100.1), (4, 100.25), (5, 100.3)]:
        now_s[0] = at_s
        context.progress(done, 10, loss=1.0 / done)
    assert [message.done for message in sender.messages if isinstance(message, Progress)] == [1, 4]
    context.flush_progress()
    context.progress(10, 10)  # reaching the total is always sent
    sent = [message for message in sender.messages if isinstance(message, Progress)]
    assert [message.done for message in sent] == [1, 4, 5, 10]
    assert sent[2].metrics == {"loss": 0.2}


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({"loss": float("nan")}, "metrics must be finite"),
        ({"bad name": 1.0}, "must start with a letter or digit"),
        ({f"m{index}": 1.0 for index in range(33)}, "at most 32 metrics"),
    ],
)
def test_context__bad_metrics_are_refused(
    tmp_path: Path, metrics: dict[str, float], message: str
) -> None:
    context = make_context(tmp_path, RecordingSender(), [0.0])
    with pytest.raises(ValueError, match=message):
        context.progress(1, 2, **metrics)


def test_context__an_unanswered_checkpoint_counts_once_answered_late(tmp_path: Path) -> None:
    sender, now_s = RecordingSender(answer={2, 4}), [0.0]
    # No time passes on this clock, so a checkpoint nobody answers gives up at once.
    context = make_context(tmp_path, sender, now_s, ack_wait_s=0.0)
    store = FileCheckpointStore(tmp_path)

    assert context.checkpoint(1, {"w": np.ones(2)}) is False
    assert not context.should_stop()
    context.handle(CheckpointAck(ok=True))  # the late answer, for the oldest outstanding: step 1
    assert context.checkpoint(2, {"w": np.full(2, 2.0)}) is True
    assert [info.step for info in store.list_checkpoints("job-c", 0)] == [1, 2]

    # Step 3 is never answered; once step 4 is committed it never will be, and it goes.
    assert context.checkpoint(3, {"w": np.full(2, 3.0)}) is False
    assert context.checkpoint(4, {"w": np.full(2, 4.0)}) is True
    assert [info.step for info in store.list_checkpoints("job-c", 0)] == [2, 4]
    context.handle(CheckpointAck(ok=True, step=3))  # far too late: ignored
    assert [info.step for info in store.list_checkpoints("job-c", 0)] == [2, 4]


def test_context__a_stop_request_keeps_its_first_reason(tmp_path: Path) -> None:
    context = make_context(tmp_path, RecordingSender(), [0.0])
    assert context.stop_reason is None and not context.should_stop()
    context.handle(Stop(reason="wall_time"))
    context.request_stop("signal")
    assert context.should_stop() and context.stop_reason == "wall_time"


# The worker as a subprocess.


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    channel: Channel
    # Whether it leads a process group of its own.
    own_group: bool = False

    def receive(self) -> Message | None:
        return self.channel.receive()

    def receive_until(self, kind: type[Any]) -> Any:
        while True:
            message = self.receive()
            assert message is not None, f"channel closed before a {kind.__name__}: {self.logs()}"
            if isinstance(message, kind):
                return message

    def finish(self) -> tuple[int, list[Message]]:
        """The exit code and every message after the ones already read."""
        messages = []
        while (message := self.receive()) is not None:
            messages.append(message)
        return self.process.wait(MESSAGE_WAIT_S), messages

    def logs(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        assert self.process.stdout is not None
        return self.process.stdout.read().decode(errors="replace")


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    started: list[Worker] = []

    def start_worker(
        *,
        workload: str | None = None,
        entrypoint: str | None = None,
        own_group: bool = False,
        **fields: Any,
    ) -> Worker:
        """A worker for the task; with `own_group`, in a process group of its own, as the
        executor starts it."""
        task = TaskDescription(
            job_id="job-w",
            task_index=0,
            attempt=1,
            token=fields.pop("token", 7),
            workload=workload,
            entrypoint=entrypoint,
            args=fields.pop("args", {}),
            checkpoint_dir=str(tmp_path / "checkpoints"),
            **fields,
        )
        parent, child = socket.socketpair()
        parent.settimeout(MESSAGE_WAIT_S)
        environment = {
            **os.environ,
            TASK_ENV: encode_task(task),
            CONTROL_FD_ENV: str(child.fileno()),
            "PYTHONPATH": str(REPOSITORY),
        }
        process = subprocess.Popen(
            worker_command(sys.executable),
            cwd=REPOSITORY,
            env=environment,
            pass_fds=(child.fileno(),),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=own_group,
        )
        child.close()
        worker = Worker(process, Channel(parent), own_group)
        started.append(worker)
        return worker

    yield start_worker
    for worker in started:
        if worker.own_group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGKILL)
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()
        worker.channel.close()
        if worker.process.stdout is not None:
            worker.process.stdout.close()


@pytest.mark.integration
def test_worker__a_workload_reports_progress_then_its_result(start: Any) -> None:
    worker = start(workload="montecarlo", args={"samples": 100_000, "seed": 1})
    code, messages = worker.finish()
    assert code == EXIT_SUCCEEDED, worker.logs()
    progress = [message for message in messages if isinstance(message, Progress)]
    assert progress and progress[-1].done == progress[-1].total == 100_000
    assert isinstance(messages[-1], Result)
    assert abs(messages[-1].result["pi"] - 3.14159) < 0.05


@pytest.mark.integration
def test_worker__committed_then_superseded_checkpoint_makes_it_stop(
    start: Any, tmp_path: Path
) -> None:
    worker = start(entrypoint=f"{MODULE}:checkpoints_twice")
    first = worker.receive_until(CheckpointSaved)
    assert first.step == 1 and "token-7" in first.uri
    loaded = FileCheckpointStore(tmp_path / "checkpoints").load(first.uri, first.checksum)
    assert loaded.arrays["w"].tolist() == [1.0] * 4
    worker.channel.send(CheckpointAck(ok=True))
    second = worker.receive_until(CheckpointSaved)
    assert second.step == 2
    worker.channel.send(CheckpointAck(ok=False, error="fencing.stale_token: superseded"))

    code, messages = worker.finish()

    assert code == EXIT_STOPPED, worker.logs()
    assert not any(isinstance(message, Result | Failed) for message in messages)
    assert "refused: this attempt is superseded" in worker.logs()


@pytest.mark.integration
def test_worker__a_checkpoint_not_committed_for_want_of_quorum_lets_it_go_on(start: Any) -> None:
    worker = start(entrypoint=f"{MODULE}:checkpoints_twice")
    worker.receive_until(CheckpointSaved)
    worker.channel.send(CheckpointAck(ok=False, error="no quorum", superseded=False, step=1))
    worker.receive_until(CheckpointSaved)
    worker.channel.send(CheckpointAck(ok=True, step=2))
    code, messages = worker.finish()
    assert code == EXIT_SUCCEEDED, worker.logs()
    assert messages[-1] == Result(result={"committed": [False, True], "stop_reason": None})


@pytest.mark.integration
@pytest.mark.parametrize("how", ["message", "sigterm", "executor_gone"])
def test_worker__asked_to_stop_exits_3_without_a_result(start: Any, how: str) -> None:
    worker = start(entrypoint=f"{MODULE}:wait_for_stop")
    worker.receive_until(Progress)  # the job is running

    if how == "message":
        worker.channel.send(Stop(reason="cancelled"))
    elif how == "sigterm":
        worker.process.send_signal(signal.SIGTERM)
    else:
        worker.channel._socket.shutdown(socket.SHUT_WR)

    code, messages = worker.finish()
    assert code == EXIT_STOPPED, worker.logs()
    assert messages == []
    expected = {"message": "cancelled", "sigterm": "signal", "executor_gone": "disconnected"}[how]
    assert f"stopped on request ({expected})" in worker.logs()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        ("no_such_package.module:train", "cannot import module 'no_such_package.module'"),
        (f"{MODULE}:no_such_function", f"module '{MODULE}' has no function 'no_such_function'"),
        (f"{MODULE}:refuses", "NonRetryableError: argument 'n' must be even"),
        (f"{MODULE}:returns_a_list", "the job returned a list, not a dict"),
    ],
)
def test_worker__failures_another_attempt_would_repeat_are_not_retryable(
    start: Any, entrypoint: str, message: str
) -> None:
    worker = start(entrypoint=entrypoint)
    code, messages = worker.finish()
    assert code == EXIT_FAILED, worker.logs()
    assert len(messages) == 1 and isinstance(messages[0], Failed)
    assert message in messages[0].error
    assert messages[0].retryable is False


@pytest.mark.integration
@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"workload": "nosuch"}, "unknown workload 'nosuch'; the built-in workloads are fft, "),
        ({"workload": "gemm", "args": {"n": 0}}, "gemm: n must be an integer in 1..32768, got 0"),
        ({"entrypoint": "no-module"}, "entrypoint 'no-module' is not of the form package.module"),
        ({"entrypoint": f"{MODULE}:nothing"}, f"module '{MODULE}' has no function 'nothing'"),
        (
            {"entrypoint": f"{MODULE}:NOT_CALLABLE"},
            f"entrypoint '{MODULE}:NOT_CALLABLE' is not callable: 'NOT_CALLABLE' in module "
            f"'{MODULE}' is of type int",
        ),
        (
            {"entrypoint": "os:getcwd"},
            "entrypoint 'os:getcwd' cannot take the context: too many positional arguments",
        ),
        (
            {"entrypoint": f"{MODULE}:takes_nothing"},
            f"entrypoint '{MODULE}:takes_nothing' cannot take the context: too many positional",
        ),
        ({"entrypoint": f"{MODULE}:returns_a_list"}, "the job returned a list, not a dict"),
        (
            {"entrypoint": f"{MODULE}:returns_what_json_cannot_hold", "args": {"kind": "large"}},
            "the job's result is 200011 bytes as JSON, more than 65536",
        ),
    ],
)
def test_worker__xrs_own_refusals_are_their_message_alone(
    start: Any, task: dict[str, Any], message: str
) -> None:
    """They showed the traceback of xr's worker, which says nothing to the job's author."""
    worker = start(**task)
    code, messages = worker.finish()
    assert code == EXIT_FAILED, worker.logs()
    assert len(messages) == 1 and isinstance(messages[0], Failed)
    assert messages[0].error.startswith(message) and "Traceback" not in messages[0].error
    assert messages[0].retryable is False


@pytest.mark.integration
@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nan", "ValueError: Out of range float values are not JSON compliant"),
        ("infinity", "ValueError: Out of range float values are not JSON compliant"),
        ("bytes", "TypeError: Object of type bytes is not JSON serializable"),
        ("surrogate", "UnicodeEncodeError: 'utf-8' codec can't encode character '\\ud800'"),
        ("deep", "RecursionError: maximum recursion depth exceeded"),
    ],
)
def test_worker__a_result_json_cannot_hold_exactly_fails_at_once_saying_why(
    start: Any, kind: str, reason: str
) -> None:
    """NaN and infinities became null and bytes base64 text, silently; a lone surrogate and a
    deep nesting failed with an error that was retried."""
    worker = start(entrypoint=f"{MODULE}:returns_what_json_cannot_hold", args={"kind": kind})
    code, messages = worker.finish()
    assert code == EXIT_FAILED, worker.logs()
    (failure,) = messages
    assert isinstance(failure, Failed) and failure.retryable is False
    assert failure.error.startswith(f"the job's result is not JSON ({reason}"), failure.error
    assert "Traceback" not in failure.error


@pytest.mark.integration
@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        ("refuses_with_a_surrogate", "NonRetryableError: bad \\udcff byte\n"),
        (
            "refuses_without_a_message",
            "UnprintableError: (the UnprintableError's message could not be made into text)\n",
        ),
    ],
)
def test_worker__a_refusal_whose_message_is_not_text_is_still_reported_and_not_retried(
    start: Any, entrypoint: str, message: str
) -> None:
    """Describing the failure raised: the worker crashed, and the task was retried as a worker
    that exited with code 1."""
    worker = start(entrypoint=f"{MODULE}:{entrypoint}")
    code, messages = worker.finish()
    assert code == EXIT_FAILED, worker.logs()
    (failure,) = messages
    assert isinstance(failure, Failed) and failure.retryable is False
    assert failure.error.startswith(message), failure.error


@pytest.mark.integration
def test_worker__a_type_error_of_the_jobs_own_is_retried(start: Any) -> None:
    """Only an entrypoint whose signature cannot take the context is refused as such."""
    worker = start(entrypoint=f"{MODULE}:raises_a_type_error")
    code, messages = worker.finish()
    assert code == EXIT_FAILED, worker.logs()
    (failure,) = messages
    assert isinstance(failure, Failed) and failure.retryable is True
    assert failure.error.startswith("TypeError: object of type 'JobContext' has no len()")


@pytest.mark.integration
def test_worker__a_thread_the_job_leaves_running_does_not_hold_back_its_result(
    start: Any,
) -> None:
    """The interpreter waited for the thread before it exited, and the executor ends an attempt
    when its worker exits: the task ran on (holding its slot) and hit its wall time."""
    worker = start(entrypoint=f"{MODULE}:leaves_a_thread")
    code, messages = worker.finish()
    assert code == EXIT_SUCCEEDED, worker.logs()
    assert messages == [Result(result={"ok": 1})]


@pytest.mark.integration
def test_worker__when_the_executor_is_gone_a_job_that_ignores_it_is_ended_with_its_group(
    start: Any,
) -> None:
    """A node killed with kill -9 left its workers running, while their tasks ran again
    elsewhere: the worker asked a job to stop, but a job that never polls `should_stop()` went
    on, holding its devices. Now the worker ends after `kill_grace_s`, and, as the leader of its
    process group, takes what the job started with it."""
    worker = start(entrypoint=f"{MODULE}:ignores_everything", own_group=True, kill_grace_s=0.5)
    child = int(worker.receive_until(Progress).metrics["child"])
    assert process_running(child)

    worker.channel.close()  # as the node's death closes it

    worker.process.wait(MESSAGE_WAIT_S)
    deadline_s = time.monotonic() + MESSAGE_WAIT_S
    while process_running(child) and time.monotonic() < deadline_s:
        time.sleep(0.05)
    assert not process_running(child)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("private_tmp", "path", "named"),
    [(True, "/tmp", True), (True, "/var/tmp", True), (False, "/tmp", False), (True, "/srv", False)],
)
def test_worker__a_file_missing_from_its_own_tmp_is_named_as_such_and_not_retried(
    start: Any, private_tmp: bool, path: str, named: bool
) -> None:
    """A job given a path under the host's /tmp finds nothing with /tmp of its own: the
    failure says so, and is not retried (every attempt starts with it empty). Elsewhere, or
    without, a missing file is a plain retryable failure."""
    missing = f"{path}/xr-test-missing-{os.getpid()}/input.npy"
    worker = start(entrypoint=f"{MODULE}:opens", args={"path": missing}, private_tmp=private_tmp)
    code, messages = worker.finish()
    assert code == EXIT_FAILED, worker.logs()
    (failure,) = messages
    assert isinstance(failure, Failed)
    hint = f"{missing} is not there: this job has /tmp, /var/tmp and /dev/shm of its own"
    assert failure.error.startswith(hint) is named, failure.error
    assert "FileNotFoundError: [Errno 2] No such file or directory" in failure.error
    assert failure.retryable is not named


@pytest.mark.integration
def test_worker__an_exception_is_a_retryable_failure_with_its_message(start: Any) -> None:
    worker = start(entrypoint=f"{MODULE}:raises")
    code, messages = worker.finish()
    assert code == EXIT_FAILED
    (failure,) = messages
    assert isinstance(failure, Failed) and failure.retryable is True
    assert failure.error.startswith("RuntimeError: the disk is on fire (task 0)")
    assert 'in raises\n    raise RuntimeError(f"the disk is on fire' in failure.error
    assert "the disk is on fire" in worker.logs()  # the traceback is in the task's log too


@pytest.mark.integration
def test_worker__the_example_user_job_runs_checkpoints_and_resumes(
    start: Any, tmp_path: Path
) -> None:
    args = {"steps": 40, "checkpoint_every": 10, "features": 8, "samples": 256, "lr": 0.1}
    worker = start(entrypoint="examples.user_job:train", args=args)
    committed = []
    while True:
        message = worker.receive()
        assert message is not None, worker.logs()
        if isinstance(message, CheckpointSaved):
            committed.append(message)
            worker.channel.send(CheckpointAck(ok=True))
        if isinstance(message, Result):
            break
    assert worker.process.wait(MESSAGE_WAIT_S) == EXIT_SUCCEEDED
    assert [saved.step for saved in committed] == [10, 20, 30]
    assert message.result["weight_error"] < 0.05 and message.result["resumed_from"] == 0

    from node.executor.protocol import CheckpointRef

    last = committed[-1]
    resumed = start(
        entrypoint="examples.user_job:train",
        args=args,
        token=8,
        checkpoint=CheckpointRef(uri=last.uri, checksum=last.checksum, step=last.step),
    )
    result = resumed.receive_until(Result)
    assert result.result["resumed_from"] == 30
    assert result.result["loss"] == message.result["loss"]
