"""The executor's control channel to a worker: a worker that dies mid-message resets the socket,
and the reader must end quietly so the attempt is still ended and its devices released (it once
raised, killing the supervising task before it could end the attempt)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from node.executor.executor import Executor


def test_a_reset_control_channel_ends_the_reader_without_raising() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.set_exception(ConnectionResetError(104, "Connection reset by peer"))
        attempt = SimpleNamespace(job_id="job-1", task_index=0)
        executor = cast(Any, object.__new__(Executor))
        await asyncio.wait_for(executor._read_messages(attempt, reader), 5.0)

    asyncio.run(main())
