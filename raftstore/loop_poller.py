"""pysyncobj's poller interface on an asyncio event loop, so pysyncobj runs on the loop's thread.

pysyncobj waits for its sockets in `poll(timeout)`, called at the end of each tick. Here the
event loop waits instead: `subscribe` registers the descriptor with the loop (`add_reader` /
`add_writer`), readiness calls pysyncobj's callback on the loop's thread, and `poll` returns at
once. `RaftStore` ticks after every readiness callback (`on_event`), after proposing, and on a
timer. With no tick thread, nothing crosses between threads on a write's path: a
measured 0.1 ms of the 0.6 ms a lone write took on 3 loopback processes (docs/raftstore.md).

pysyncobj closes a connection's socket before it unsubscribes the descriptor, which an event loop
cannot follow (epoll forgets a closed descriptor, and the loop's selector then fails to modify
it): `install` makes connections unsubscribe first (any poller accepts a second unsubscribe).

Descriptors subscribed before `attach` (pysyncobj opens its listening socket and wake-up pipe in
its constructor, before the loop runs) are registered when the loop attaches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import TcpConnection

__all__ = ["LoopPoller", "install"]

log = logging.getLogger(__name__)

_READ = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR


def install() -> None:
    """Makes pysyncobj's connections unsubscribe their descriptor before closing its socket.
    Idempotent."""
    if getattr(TcpConnection, "_xr_unsubscribes_first", False):
        return

    def disconnect(connection: Any, _original: Any = TcpConnection.disconnect) -> None:
        descriptor = connection.fileno()
        if descriptor is not None:
            getattr(connection, "_TcpConnection__poller").unsubscribe(descriptor)  # noqa: B009
        _original(connection)

    setattr(TcpConnection, "disconnect", disconnect)  # noqa: B010
    setattr(TcpConnection, "_xr_unsubscribes_first", True)  # noqa: B010


class LoopPoller:
    """A pysyncobj `Poller` whose waiting is done by an asyncio loop."""

    def __init__(self) -> None:
        install()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_event: Callable[[], None] = lambda: None
        # Descriptor -> (pysyncobj's callback, the event mask asked for, the mask registered).
        self._subscriptions: dict[Any, tuple[Callable[[Any, int], None], int, int]] = {}

    def attach(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[], None]) -> None:
        """Starts waiting on `loop`; `on_event` runs after each readiness callback."""
        self._loop = loop
        self._on_event = on_event
        for descriptor, (callback, mask, _) in list(self._subscriptions.items()):
            self.subscribe(descriptor, callback, mask)

    def detach(self) -> None:
        """Stops waiting: every descriptor leaves the loop (they stay subscribed here)."""
        loop = self._loop
        if loop is None:
            return
        for descriptor, (callback, mask, registered) in list(self._subscriptions.items()):
            self._register(loop, descriptor, registered, 0)
            self._subscriptions[descriptor] = (callback, mask, 0)
        self._loop = None

    # pysyncobj's Poller interface.

    def subscribe(self, descr: Any, callback: Callable[[Any, int], None], eventMask: int) -> None:
        registered = self._subscriptions.get(descr, (callback, 0, 0))[2]
        wanted = 0
        if self._loop is not None:
            wanted = (POLL_EVENT_TYPE.READ if eventMask & _READ else 0) | (
                eventMask & POLL_EVENT_TYPE.WRITE
            )
            self._register(self._loop, descr, registered, wanted)
        self._subscriptions[descr] = (callback, eventMask, wanted)

    def unsubscribe(self, descr: Any) -> None:
        subscription = self._subscriptions.pop(descr, None)
        if subscription is not None and self._loop is not None:
            self._register(self._loop, descr, subscription[2], 0)

    def poll(self, timeout: float) -> None:
        # The event loop waits; pysyncobj's tick must not.
        return None

    # Inside.

    def _register(
        self, loop: asyncio.AbstractEventLoop, descriptor: Any, registered: int, wanted: int
    ) -> None:
        """Changes the loop's registration of `descriptor` from `registered` to `wanted` (masks of
        READ and WRITE), touching only what differs: pysyncobj resubscribes after every send."""
        for event, add, remove in (
            (POLL_EVENT_TYPE.READ, loop.add_reader, loop.remove_reader),
            (POLL_EVENT_TYPE.WRITE, loop.add_writer, loop.remove_writer),
        ):
            if wanted & event and not registered & event:
                add(descriptor, self._ready, descriptor, event)
            elif registered & event and not wanted & event:
                remove(descriptor)

    def _ready(self, descriptor: Any, event: int) -> None:
        subscription = self._subscriptions.get(descriptor)
        if subscription is None:
            return
        try:
            subscription[0](descriptor, event)
        except Exception:  # pragma: no cover - a bug in pysyncobj or xr; keep the node up
            log.exception("raft socket event failed")
        self._on_event()
