"""`xr job` saying what the job is now (found by a QA pass): `ls --state` offered a task state the
cluster refuses for jobs; `show` left out the metrics and results the docs send readers to, and
showed an earlier attempt's error and the scheduler's old placement reason beside tasks that had
finished or failed since; `watch` left out results; `logs` began its tail inside a line; and the
cluster named args' text form only when they were neither an object nor text.

The commands meet a fake client (`connect` replaced), fed with jobs written here or read from a
node serving the API, on which no scheduler or executor runs: the tests apply their commands.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import click
import msgspec
import pytest
from click.testing import CliRunner, Result

from node.api.jobs import JOB_STATES
from node.cli import xr
from node.cli_common import CommandFailed
from node.cli_job import _follow, _print_changes
from tests.node.conftest import ApiNode
from xrcore.client import Job, JobLogs
from xrcore.commands import (
    Placement,
    SchedulePass,
    TaskClaim,
    TaskComplete,
    TaskFail,
    TaskHeartbeat,
)

pytestmark = pytest.mark.integration

_PLACED = "r0: est. finish in 60.0 min (run 60.0 min at speed 1, data 0.0 s), $0.00, 0.00 kg CO2"
_KILLED = "worker exited with code -9 without a result: (no output)"


class _Jobs:
    """The client's `jobs`, answering with what a test gave it."""

    def __init__(self, *, job: Job | None = None, logs: JobLogs | None = None) -> None:
        self.job = job
        self.logs_answer = logs

    def get(self, job_id: str) -> Job | None:
        return self.job

    def logs(self, job_id: str, **options: Any) -> JobLogs | None:
        return self.logs_answer


def _invoke(monkeypatch: pytest.MonkeyPatch, jobs: _Jobs, *arguments: str) -> Result:
    class Client:
        pass

    client = Client()
    client.jobs = jobs  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def connect() -> Iterator[Client]:
        yield client

    monkeypatch.setattr("node.cli_job.connect", connect)
    return CliRunner().invoke(xr, list(arguments))


def _job(state: str, tasks: list[dict[str, Any]]) -> Job:
    return msgspec.convert(
        {
            "job_id": "job-1", "name": "n", "tenant": "t", "state": state, "priority": 0,
            "submitted_at_ms": 1_000, "array_size": len(tasks), "tasks": tasks,
        },
        Job,
    )  # fmt: skip


def _attempt(number: int, outcome: str | None, **more: Any) -> dict[str, Any]:
    ended = None if outcome is None else 2_000 + number
    return {
        "number": number, "token": number, "region": "r0", "executor_id": "e",
        "started_at_ms": 1_000 + number, "ended_at_ms": ended, "outcome": outcome, **more,
    }  # fmt: skip


def _section(output: str, title: str) -> list[str]:
    """The lines of `xr job show`'s section `title`, or [] when it has none."""
    lines = output.splitlines()
    if title not in lines:
        return []
    start = lines.index(title) + 1
    end = next((n for n in range(start, len(lines)) if not lines[n].strip()), len(lines))
    return lines[start:end]


def _task_rows(output: str) -> dict[str, str]:
    """`xr job show`'s task table: each task's row, by its index."""
    lines = output.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("TASK  STATE"))
    end = next((n for n in range(start, len(lines)) if not lines[n]), len(lines))
    return {line.split()[0]: line for line in lines[start + 1 : end]}


# xr job ls


def test_job_ls__offers_exactly_the_job_states_the_cluster_takes() -> None:
    """It offered the task states, "assigned" among them, which the cluster refused."""
    command = xr.commands["job"].commands["ls"]  # type: ignore[attr-defined]
    choice = next(option.type for option in command.params if option.name == "state")
    assert tuple(choice.choices) == JOB_STATES
    refused = CliRunner().invoke(xr, ["job", "ls", "--state", "assigned"])
    assert refused.exit_code == 2 and "'assigned' is not one of" in refused.output


# xr job show


def test_job_show__shows_each_tasks_latest_metrics_and_result_cutting_long_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The docs say `ctx.progress`'s metrics are shown by `xr job show`; they and the task's
    result were in `--json` only."""
    long_result = '{"weights": [' + ", ".join(["0.5"] * 300) + "]}"
    tasks = [
        {
            "index": 0, "state": "succeeded", "done": 12, "total": 12,
            "metrics": {"loss": 0.01234567, "accuracy": 0.5}, "result": '{"loss": 0.0123}',
            "attempts": [_attempt(1, "succeeded")],
        },
        {
            "index": 1, "state": "succeeded", "result": long_result,
            "attempts": [_attempt(1, "succeeded")],
        },
        {"index": 2, "state": "running", "metrics": {"loss": 2.5}, "attempts": [_attempt(1, None)]},
        {"index": 3, "state": "pending"},
    ]  # fmt: skip
    shown = _invoke(monkeypatch, _Jobs(job=_job("running", tasks)), "job", "show", "job-1")
    assert shown.exit_code == 0, shown.output
    assert _section(shown.output, "metrics (the latest each task reported):") == [
        "  task 0: accuracy=0.5, loss=0.0123457",
        "  task 2: loss=2.5",
    ]
    results = _section(shown.output, "results:")
    assert results[0] == '  task 0: {"loss": 0.0123}'
    cut = len(long_result) - 200
    assert (
        results[1] == f"  task 1: {long_result[:200]}... ({cut} more characters; --json has them)"
    )
    assert len(results) == 2


def test_job_show__errors_and_reasons_only_where_they_explain_the_present_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A succeeded task showed its first attempt's error; finished tasks, and a task pending
    again after a failure, showed the placement's estimate as why they are where they are."""
    backing_off = "backing off after 1 failure(s) until 2025-01-01 00:00:10Z"
    traceback = "ValueError: boom\nTraceback (most recent call last):\n  ..."
    tasks = [
        {
            "index": 0, "state": "succeeded", "failures": 1, "error": _KILLED, "reason": _PLACED,
            "attempts": [_attempt(1, "failed", error=_KILLED), _attempt(2, "succeeded")],
        },
        {
            "index": 1, "state": "failed", "failures": 1, "error": traceback, "reason": _PLACED,
            "attempts": [_attempt(1, "failed", error=traceback)],
        },
        {
            "index": 2, "state": "pending", "failures": 1, "error": _KILLED, "reason": _PLACED,
            "attempts": [_attempt(1, "failed", error=_KILLED)],
        },
        {
            "index": 3, "state": "pending", "failures": 1, "error": _KILLED, "reason": backing_off,
            "attempts": [_attempt(1, "failed", error=_KILLED)],
        },
        {
            "index": 4, "state": "running", "failures": 1, "error": _KILLED, "reason": _PLACED,
            "region": "r0", "attempts": [_attempt(1, "failed", error=_KILLED), _attempt(2, None)],
        },
        {"index": 5, "state": "cancelled", "reason": _PLACED},
        {
            "index": 6, "state": "pending", "reason": "moving aside to r1 (speed 2, here 1)",
            "attempts": [_attempt(1, "preempted")],
        },
    ]  # fmt: skip
    shown = _invoke(monkeypatch, _Jobs(job=_job("running", tasks)), "job", "show", "job-1")
    assert shown.exit_code == 0, shown.output
    rows = _task_rows(shown.output)
    errors = {index for index, row in rows.items() if "boom" in row or "code -9" in row}
    assert errors == {"1", "2", "3"}
    assert rows["1"].endswith("ValueError: boom (...)")
    assert _section(shown.output, "why (from the scheduler):") == [
        f"  task 3: {backing_off}",
        f"  task 4: {_PLACED}",
        "  task 6: moving aside to r1 (speed 2, here 1)",
    ]


def test_job_show__a_nodes_answer_after_a_retry_and_a_success_shows_no_stale_reason_or_error(
    api: ApiNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster keeps a task's placement reason and last error after the attempt ends; the
    command shows them only while they explain the task's state."""
    region = api.register_region()
    submitted = api.ok("POST", "/v1/jobs", json={"name": "cli-retry", "workload": "sleep"})
    job_id = submitted["job_id"]

    def run_attempt(reason: str) -> int:
        revision = api.run(_schedule_revision(api))
        placed = Placement(job_id=job_id, task_index=0, region=region, reason=reason)
        api.propose(SchedulePass(revision=revision, assigns=(placed,)))
        claim = TaskClaim(
            job_id=job_id, task_index=0, region=region, executor_id="e", lease_ttl_ms=600_000
        )
        token: int = api.propose(claim)["token"]
        return token

    def show() -> tuple[dict[str, Any], str]:
        document = api.ok("GET", f"/v1/jobs/{job_id}")
        shown = _invoke(
            monkeypatch, _Jobs(job=msgspec.convert(document, Job)), "job", "show", job_id
        )
        assert shown.exit_code == 0, shown.output
        return document["tasks"][0], shown.output

    token = run_attempt(f"{region}: first placement")
    api.propose(TaskFail(job_id=job_id, task_index=0, token=token, error=_KILLED))
    task, output = show()
    assert (task["state"], task["reason"]) == ("pending", f"{region}: first placement")
    assert _section(output, "why (from the scheduler):") == []
    assert _task_rows(output)["0"].endswith(_KILLED)

    token = run_attempt(f"{region}: second placement")
    heartbeat = TaskHeartbeat(
        job_id=job_id, task_index=0, token=token, done=3, total=3, metrics={"loss": 0.25}
    )
    api.propose(heartbeat)
    api.propose(TaskComplete(job_id=job_id, task_index=0, token=token, result='{"loss": 0.25}'))
    task, output = show()
    assert (task["state"], task["error"]) == ("succeeded", _KILLED)
    assert task["reason"] == f"{region}: second placement"
    assert "code -9" not in _task_rows(output)["0"]
    assert _section(output, "why (from the scheduler):") == []
    assert _section(output, "results:") == ['  task 0: {"loss": 0.25}']
    assert _section(output, "metrics (the latest each task reported):") == ["  task 0: loss=0.25"]


async def _schedule_revision(api: ApiNode) -> int:
    revision: int = api.store.replica.read(lambda machine: machine.schedule_revision)
    return revision


# xr job watch and xr job submit --wait


def test_job_watch__shows_a_succeeded_tasks_result_cut_when_long(
    capsys: pytest.CaptureFixture[str],
) -> None:
    long_result = '{"text": "' + "x" * 300 + '"}'

    def task(index: int, state: str, result: str | None) -> dict[str, Any]:
        return {
            "index": index, "state": state, "region": "r0", "attempts": 1, "error": None,
            "result": result,
        }  # fmt: skip

    before = {"job_id": "job-1", "state": "running", "tasks": [task(0, "running", None)]}
    after = {
        "job_id": "job-1",
        "state": "succeeded",
        "tasks": [task(0, "succeeded", '{"loss": 0.25}'), task(1, "succeeded", long_result)],
    }
    with click.Context(click.Command("watch")):
        _print_changes(before, after)
    cut = len(long_result) - 200
    assert capsys.readouterr().out.splitlines() == [
        "job job-1: succeeded",
        '  task 0: succeeded in r0 (attempt 1), result {"loss": 0.25}',
        f"  task 1: succeeded in r0 (attempt 1), result {long_result[:200]}... ({cut} more "
        "characters; --json has them)",
    ]


def test_job_watch__a_failed_job_names_the_failed_tasks_error_not_an_earlier_attempts() -> None:
    """Task 0 failed once and then succeeded; task 1 failed: the failure is task 1's."""
    tasks = [
        {
            "index": 0, "state": "succeeded", "error": _KILLED,
            "attempts": [_attempt(1, "failed", error=_KILLED), _attempt(2, "succeeded")],
        },
        {
            "index": 1, "state": "failed", "error": "ValueError: boom",
            "attempts": [_attempt(1, "failed", error="ValueError: boom")],
        },
    ]  # fmt: skip
    client: Any = type("Client", (), {"jobs": _Jobs(job=_job("failed", tasks))})()
    with click.Context(click.Command("watch")), pytest.raises(CommandFailed) as failed:
        _follow(client, "job-1")
    assert failed.value.message == "job job-1 failed: ValueError: boom"


# xr job logs


@pytest.mark.parametrize(
    ("log", "truncated", "shown"),
    [
        # Cut inside a line (and inside a character): the tail starts at the next line.
        ("\ufffdrt of a line\nline 2\nline 3\n", True, "line 2\nline 3\n"),
        # No line starts inside the tail: all of it.
        ("the middle of one long line", True, "the middle of one long line"),
        ("the end of one long line\n", True, "the end of one long line\n"),
        # The whole log: nothing was cut.
        ("line 1\nline 2\n", False, "line 1\nline 2\n"),
    ],
)
def test_job_logs__a_cut_tail_starts_at_the_first_line_that_starts_in_it(
    monkeypatch: pytest.MonkeyPatch, log: str, truncated: bool, shown: str
) -> None:
    answer = JobLogs(
        job_id="job-1",
        task_index=0,
        attempt=1,
        region="r0",
        log=log,
        truncated=truncated,
        size_bytes=1_000,
    )
    result = _invoke(monkeypatch, _Jobs(logs=answer), "job", "logs", "job-1", "--tail-bytes", "40")
    assert result.exit_code == 0, result.output
    assert result.stdout == shown
    header = f"[xr: the last {len(shown.encode())} of 1000 bytes of task 0 attempt 1 in r0]\n"
    assert result.stderr == (header if truncated else "")


# The cluster's answer to args that are not an object


@pytest.mark.parametrize(
    ("args", "named"), [([1, 2], "an array"), (5, "a number"), (True, "a boolean"), (None, "null")]
)
def test_submit__args_that_are_not_an_object_are_named_so(
    api: ApiNode, args: Any, named: str
) -> None:
    """The cluster said "Expected `str`, got `array`", though it takes an object too."""
    refused = api.request(
        "POST", "/v1/jobs", json={"name": "cli-args", "workload": "sleep", "args": args}
    )
    assert (refused.status, refused.error_code) == (400, "request.invalid")
    message = refused.document["error"]["message"]
    assert message == f"invalid job spec: args must be a JSON object, not {named}"
