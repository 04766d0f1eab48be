"""A full disk, and other failures to start or serve a worker, neither leak the region's room nor
raise where no one hears.

From a QA pass with a full disk: an attempt whose log directory could not be made raised out of
the executor's task before anything released its CPU slot ("Task exception was never
retrieved"); the attempt ended only when its lease expired, and the region, shown healthy with
its slots, kept tasks `assigned` with no attempt forever once both slots had gone that way. A
checkpoint store that was full raised a bare OSError from `ctx.checkpoint` that did not say it
was the store's. The disk is never really filled here: the call that would fail raises ENOSPC.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import io
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import numpy as np
import pytest

from node.daemon import Node
from node.executor.checkpoints import FileCheckpointStore
from node.executor.context import JobContext
from node.executor.executor import Executor, _Attempt
from node.executor.job_user import prepare_area
from node.executor.protocol import CheckpointAck, CheckpointSaved, Message, TaskDescription
from raftstore.store import RaftStore
from tests.node.executor.test_executor import _Api, _config
from xrcore.commands import JobSpec
from xrcore.devices import Grant

NO_SPACE = os.strerror(errno.ENOSPC)


def _no_space(path: object = None) -> OSError:
    return OSError(errno.ENOSPC, NO_SPACE, None if path is None else str(path))


def _run(tmp_path: Path, body: Callable[[Node, _Api], Awaitable[None]]) -> None:
    """Runs `body` against one node in CPU mode with a single CPU slot, so that one leaked slot
    leaves no room for any later task."""
    config = _config(tmp_path, **{"region.cpu_slots": "1"})

    async def main() -> None:
        node = Node(config)
        await node.start()
        try:
            async with aiohttp.ClientSession(f"http://{config.http.address}") as http:
                api = _Api(http)
                await api.until(lambda: api.get("/v1/regions"), lambda r: r["items"])
                await body(node, api)
        finally:
            await node.stop()

    asyncio.run(main())


async def _until_nothing_is_held(node: Node, api: _Api) -> None:
    """Until the executor holds no attempt, and then its one slot is free: an attempt lets go of
    its slot just after its end is applied."""
    executor = node.executor
    assert executor is not None

    async def held() -> int:
        return len(executor.attempts)

    await api.until(held, lambda count: count == 0)
    assert executor.free_slots == 1


@pytest.mark.integration
def test_an_attempt_whose_log_directory_cannot_be_made__fails_at_once_and_frees_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    logs = tmp_path / "logs"
    full = [True]
    mkdir = Path.mkdir

    def mkdir_on_a_full_disk(
        self: Path, mode: int = 0o777, parents: bool = False, exist_ok: bool = False
    ) -> None:
        # A job's directory of logs (`<data_dir>/logs/<job>`) is where the QA pass saw it fail.
        if full[0] and self.parent == logs:
            raise _no_space(self)
        mkdir(self, mode=mode, parents=parents, exist_ok=exist_ok)

    monkeypatch.setattr(Path, "mkdir", mkdir_on_a_full_disk)

    async def body(node: Node, api: _Api) -> None:
        job_id = await api.submit("succeed", max_attempts=2)
        job = await api.finished(job_id)
        task = job["tasks"][0]
        # Each attempt failed at once (not `lease_expired`), and the task by the usual rules.
        assert job["state"] == "failed", job
        assert [attempt["outcome"] for attempt in task["attempts"]] == ["failed", "failed"]
        assert task["error"] == (
            f"cannot start worker: [Errno {errno.ENOSPC}] {NO_SPACE}: '{logs / job_id}'"
        )
        await _until_nothing_is_held(node, api)

        # Space is freed: the one slot runs the next task.
        full[0] = False
        job = await api.finished(await api.submit("succeed"))
        assert job["state"] == "succeeded", job
        await _until_nothing_is_held(node, api)

    with caplog.at_level(logging.INFO, logger="xr.executor"):
        _run(tmp_path, body)
        gc.collect()

    # One line for each attempt, naming the path and the error.
    failures = [r for r in caplog.records if "cannot start worker" in r.getMessage()]
    assert [record.levelno for record in failures] == [logging.ERROR, logging.ERROR]
    assert all(str(logs) in r.getMessage() and NO_SPACE in r.getMessage() for r in failures)
    assert "never retrieved" not in caplog.text


@pytest.mark.integration
def test_an_unforeseen_error_while_starting_a_worker__fails_the_attempt_and_frees_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not only operating-system errors: anything that raises between the claim and the worker's
    start fails the attempt, which is retried by the usual rules."""
    calls = [0]

    def fails_once(*arguments: Any, **options: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("the executor's own fault")
        prepare_area(*arguments, **options)

    monkeypatch.setattr("node.executor.executor.prepare_area", fails_once)

    async def body(node: Node, api: _Api) -> None:
        job = await api.finished(await api.submit("succeed", max_attempts=2))
        task = job["tasks"][0]
        assert job["state"] == "succeeded", job
        outcomes = [attempt["outcome"] for attempt in task["attempts"]]
        assert outcomes == ["failed", "succeeded"], task
        assert task["attempts"][0]["error"] == (
            "cannot start worker: RuntimeError: the executor's own fault"
        )
        await _until_nothing_is_held(node, api)

    with caplog.at_level(logging.INFO, logger="xr.executor"):
        _run(tmp_path, body)
        gc.collect()
    assert "never retrieved" not in caplog.text


def _executor(tmp_path: Path, store: object = None) -> Executor:
    return Executor(_config(tmp_path, **{"region.cpu_slots": "1"}), cast(RaftStore, store))


def test_a_claim_that_raises__gives_its_slot_back(tmp_path: Path) -> None:
    class FailingStore:
        async def propose(self, command: object) -> None:
            raise RuntimeError("not an answer of the log")

    executor = _executor(tmp_path, FailingStore())
    spec = JobSpec(name="t", workload="gemm")
    executor._assigned_here = lambda: [("job-1", 0, spec, 0)]  # type: ignore[method-assign]

    with pytest.raises(RuntimeError, match="not an answer"):
        asyncio.run(executor._claim_assigned())

    assert executor.free_slots == 1 and executor.attempts == {}


class _FullLog(io.BytesIO):
    """A job's log file on a full disk."""

    name = "/data/logs/job-1/0-1.log"

    def write(self, data: Any) -> int:
        raise _no_space()


def test_a_log_that_cannot_be_written__is_dropped_and_the_worker_s_output_still_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the log cannot be written the pump used to raise and stop reading: a worker writing
    more than a pipe holds then blocked, and its attempt held its slot until its wall time."""
    executor = _executor(tmp_path)
    attempt = _Attempt(
        job_id="job-1",
        task_index=0,
        token=1,
        attempt=1,
        grant=Grant(devices=()),
        wall_time_limit_s=0,
    )

    async def pump() -> asyncio.StreamReader:
        output = asyncio.StreamReader()
        for _ in range(64):
            output.feed_data(b"x" * 65536)
        output.feed_eof()
        attempt.process = cast(Any, SimpleNamespace(stdout=output))
        await asyncio.wait_for(executor._pump_logs(attempt, _FullLog()), 10.0)
        return output

    with caplog.at_level(logging.INFO, logger="xr.executor"):
        output = asyncio.run(pump())

    assert output.at_eof()
    (record,) = [r for r in caplog.records if "cannot write its log" in r.getMessage()]
    assert _FullLog.name in record.getMessage() and NO_SPACE in record.getMessage()


# The job's side: `ctx.checkpoint` on a full checkpoint store.


class _Committer:
    """Stands in for the executor: commits every checkpoint it is sent, at once."""

    def __init__(self) -> None:
        self.context: JobContext | None = None
        self.sent: list[Message] = []

    def send(self, message: Message) -> None:
        self.sent.append(message)
        if isinstance(message, CheckpointSaved):
            assert self.context is not None
            self.context.handle(CheckpointAck(ok=True, step=message.step))


def test_a_checkpoint_on_a_full_store__is_not_committed_and_says_where_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    task = TaskDescription(
        job_id="job-1", task_index=0, attempt=1, token=3, workload="w", checkpoint_dir=str(tmp_path)
    )
    committer = _Committer()
    context = JobContext(
        task,
        sender=committer,
        store=FileCheckpointStore(tmp_path),
        xp=np,
        logger=logging.getLogger("job"),
    )
    committer.context = context
    # Two chunks: the first is written whole, the disk is full for the second.
    arrays = {"a": np.zeros(1000), "b": np.ones(1000)}
    fsync = os.fsync
    files_synced = [0]

    def fsync_on_a_filling_disk(descriptor: int) -> None:
        if stat.S_ISREG(os.fstat(descriptor).st_mode):
            files_synced[0] += 1
            if files_synced[0] == 2:
                raise _no_space()
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync_on_a_filling_disk)
    with caplog.at_level(logging.INFO, logger="job"):
        committed = context.checkpoint(3, arrays, {"loss": 0.5})

    assert committed is False
    assert committer.sent == []
    (record,) = [r for r in caplog.records if r.name == "job" and "step 3" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert str(tmp_path) in record.getMessage() and NO_SPACE in record.getMessage()
    # No partial file and no manifest: nothing could be committed, nor restored.
    assert not [path for path in tmp_path.rglob("*") if path.name.endswith(".tmp")]
    assert not list(tmp_path.rglob("step-*.json"))

    # Once there is room the same step is written and committed.
    monkeypatch.setattr(os, "fsync", fsync)
    assert context.checkpoint(3, arrays, {"loss": 0.5})
    restored = context.restore()
    assert restored is not None and restored["step"] == 3
    assert np.array_equal(restored["arrays"]["b"], arrays["b"])
