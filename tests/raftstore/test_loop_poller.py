"""LoopPoller: pysyncobj's poller interface served by an asyncio loop."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from pysyncobj.poller import POLL_EVENT_TYPE

from raftstore.loop_poller import LoopPoller

READ = POLL_EVENT_TYPE.READ
WRITE = POLL_EVENT_TYPE.WRITE
ERROR = POLL_EVENT_TYPE.ERROR


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[int, int]] = []
        self.after_event = 0

    def callback(self, descriptor: int, event: int) -> None:
        self.events.append((descriptor, event))

    def on_event(self) -> None:
        self.after_event += 1


async def _turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_subscribed_before_attach__readiness_calls_back_once_attached() -> None:
    async def main() -> None:
        left, right = socket.socketpair()
        poller, recorder = LoopPoller(), _Recorder()
        try:
            poller.subscribe(left.fileno(), recorder.callback, READ | ERROR)
            right.send(b"x")
            await _turns()
            assert recorder.events == []  # not attached: nobody waits yet
            poller.attach(asyncio.get_running_loop(), recorder.on_event)
            await _turns()
            assert (left.fileno(), READ) in recorder.events
            assert recorder.after_event == len(recorder.events)
        finally:
            poller.detach()
            left.close()
            right.close()

    asyncio.run(main())


def test_resubscribing_without_write__stops_write_callbacks() -> None:
    async def main() -> None:
        left, right = socket.socketpair()
        poller, recorder = LoopPoller(), _Recorder()
        poller.attach(asyncio.get_running_loop(), recorder.on_event)
        try:
            poller.subscribe(left.fileno(), recorder.callback, READ | WRITE | ERROR)
            await _turns()
            assert (left.fileno(), WRITE) in recorder.events  # a socket pair is writable
            poller.subscribe(left.fileno(), recorder.callback, READ | ERROR)
            recorder.events.clear()
            await _turns()
            assert recorder.events == []
        finally:
            poller.detach()
            left.close()
            right.close()

    asyncio.run(main())


def test_unsubscribe_and_detach__no_more_callbacks() -> None:
    async def main() -> None:
        pairs = [socket.socketpair() for _ in range(2)]
        poller, recorder = LoopPoller(), _Recorder()
        poller.attach(asyncio.get_running_loop(), recorder.on_event)
        try:
            for left, _ in pairs:
                poller.subscribe(left.fileno(), recorder.callback, READ | ERROR)
            poller.unsubscribe(pairs[0][0].fileno())
            poller.unsubscribe(pairs[0][0].fileno())  # a second time is harmless
            poller.detach()
            for _, right in pairs:
                right.send(b"x")
            await _turns()
            assert recorder.events == []
        finally:
            for pair in pairs:
                for item in pair:
                    item.close()

    asyncio.run(main())


def test_poll__returns_at_once_the_loop_does_the_waiting() -> None:
    poller: Any = LoopPoller()
    assert poller.poll(10.0) is None
