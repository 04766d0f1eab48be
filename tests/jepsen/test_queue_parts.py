"""The queue workload's parts that make its history: the protected resource's record of each
completion and the final read's entry per job name. Both must name the job, so that the checker
can tell a superseded re-execution of one job from a second job of the same key."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest

from xr_jepsen.resource import FencedResource, ResourceServer
from xr_jepsen.workloads.queue import _add_job


@pytest.mark.integration
def test_resource__records_the_job_id_of_each_completion() -> None:
    # It recorded only {key, token}: two jobs of one key looked like one job run twice.
    recorded: list[tuple[dict[str, Any], bool, str | None]] = []

    async def validate(job_id: str, token: int) -> str | None:
        return None

    async def complete() -> None:
        server = ResourceServer(
            FencedResource(),
            host="127.0.0.1",
            record=lambda value, accepted, why: recorded.append((value, accepted, why)),
            validate=validate,
        )
        await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                for job_id, token in (("a", 3), ("b", 5)):
                    body = {"key": "j1", "token": token, "job_id": job_id, "attempt": 1}
                    async with session.post(f"{server.url}/complete", json=body) as answer:
                        assert (await answer.json())["accepted"] is True
        finally:
            await server.stop()

    asyncio.run(complete())
    assert recorded == [
        ({"key": "j1", "token": 3, "job_id": "a"}, True, None),
        ({"key": "j1", "token": 5, "job_id": "b"}, True, None),
    ]


def _job(job_id: str, state: str, token: int | None) -> Any:
    attempts = [] if token is None else [SimpleNamespace(outcome="succeeded", token=token)]
    tasks = [SimpleNamespace(attempts=attempts)]
    return cast(Any, SimpleNamespace(job_id=job_id, name="j1", state=state, tasks=tasks))


def test_final_read__keeps_every_job_id_of_a_name() -> None:
    # Keyed by name alone, a second job of the same name replaced the first.
    states: dict[str, Any] = {}
    _add_job(states, _job("a", "failed", None))
    _add_job(states, _job("b", "succeeded", 7))
    _add_job(states, _job("c", "succeeded", 9))
    assert states == {"j1": {"state": "succeeded", "token": 7, "job_ids": ["a", "b", "c"]}}
