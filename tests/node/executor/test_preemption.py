"""Preemption end to end on one in-process node with one CPU slot: a higher-priority job makes a
running lower-priority one checkpoint and yield; the low one resumes from that checkpoint once
the high one is done, and its failures count stays 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.node.executor.test_executor import _Api, _run

pytestmark = pytest.mark.integration


def test_a_higher_priority_job_preempts_a_running_one_which_checkpoints_and_resumes(
    tmp_path: Path,
) -> None:
    async def body(api: _Api) -> None:
        low = await api.submit("count_steps", args={"steps": 60}, priority=0)
        await api.running(low)
        high = await api.submit("succeed", priority=10)

        finished_high = await api.finished(high)
        assert finished_high["state"] == "succeeded"
        finished_low = await api.finished(low)
        assert finished_low["state"] == "succeeded", finished_low
        task = finished_low["tasks"][0]
        first, second = task["attempts"]
        assert first["outcome"] == "preempted"
        assert task["failures"] == 0
        result = json.loads(task["result"])
        # The second attempt started where the first one checkpointed when it yielded.
        assert second["restored_step"] is not None and second["restored_step"] > 0
        assert result["resumed_from"] == second["restored_step"]
        events = await api.get(f"/v1/jobs/{high}")
        assert "est. finish" in events["tasks"][0]["reason"]

    _run(
        tmp_path,
        body,
        **{
            "region.cpu_slots": "1",
            "scheduler.preemption_min_run_s": "0",
            "scheduler.preemption_grace_s": "30",
        },
    )
