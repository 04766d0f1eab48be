"""The window of a client's writes in flight (`_transport`, rule 2), against a transport whose tries
wait on gates the test opens, so which write is in flight, waits or ends is set by the test, not
by timing.

The state machine keeps the results of a client's 32 newest seqs and refuses an older one as
`RequestTooOld`; the window keeps a client's writes within 32 seqs of its oldest write still in
flight, so no write it sends can be refused as too old while it is in flight.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from typing import Any

import pytest
from aiohttp import web

from tests.client.fake_node import FakeNode, FakeNodes
from xrcore.client import AsyncClient, Client
from xrcore.client._transport import SEQ_HEADER, WRITES_IN_FLIGHT_MAX, Transport, _Answer
from xrcore.errors import ClusterUnavailable
from xrcore.limits import Limits

# How many times the loop is let run for work that needs no I/O to settle.
_SETTLE_STEPS = 50


class GatedTransport(Transport):
    """A transport whose every try records its path and seq, then waits until the test opens
    the gate of its path (or its time runs out), and answers `{}`."""

    def __init__(self, *, timeout_s: float = 30.0) -> None:
        super().__init__("127.0.0.1:1", timeout_s=timeout_s)
        self.sent: list[tuple[str, int]] = []
        self.gates: dict[str, asyncio.Event] = {}

    def gate(self, path: str) -> asyncio.Event:
        return self.gates.setdefault(path, asyncio.Event())

    async def _try(
        self,
        endpoint: str,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        query: Mapping[str, str] | None,
        body: Mapping[str, Any] | None,
        timeout_s: float,
        sent: dict[str, bool] | None = None,
    ) -> _Answer:
        self.sent.append((path, int(headers.get(SEQ_HEADER, "0"))))
        if sent is not None:
            sent["sent"] = True
        # As a real try would, it gives up after its time (the call then fails).
        async with asyncio.timeout(timeout_s):
            await self.gate(path).wait()
        return _Answer(status=200, document={}, retry_after_s=0.0)

    def sent_paths(self) -> list[str]:
        return [path for path, _ in self.sent]

    def write(self, path: str, **arguments: Any) -> asyncio.Task[Any]:
        return asyncio.ensure_future(self.call("PUT", path, write=True, **arguments))


async def settle() -> None:
    for _ in range(_SETTLE_STEPS):
        await asyncio.sleep(0)


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(scenario)


def test_window__is_as_wide_as_the_results_the_state_machine_keeps_per_client() -> None:
    assert WRITES_IN_FLIGHT_MAX == Limits().results_per_client_max == 32


def test_33rd_write__waits_until_the_oldest_write_in_flight_ends() -> None:
    async def scenario() -> None:
        transport = GatedTransport()
        writes = [transport.write(f"/w/{number}") for number in range(33)]
        await settle()
        assert transport.sent_paths() == [f"/w/{number}" for number in range(32)]
        first_seq = transport.sent[0][1]
        assert [seq for _, seq in transport.sent] == list(range(first_seq, first_seq + 32))
        # A newer write ending opens no room: the window is counted from the oldest in flight.
        transport.gate("/w/1").set()
        await writes[1]
        await settle()
        assert len(transport.sent) == 32 and not writes[32].done()
        transport.gate("/w/0").set()
        await writes[0]
        await settle()
        assert transport.sent[32] == ("/w/32", first_seq + 32)
        for gate in list(transport.gates.values()):
            gate.set()
        await asyncio.gather(*writes)
        assert not transport._writes_in_flight and not transport._turn_waiters
        await transport.close()

    run(scenario())


def test_waiting_writes__take_their_turns_in_the_order_they_came() -> None:
    async def scenario() -> None:
        transport = GatedTransport()
        writes = [transport.write(f"/w/{number}") for number in range(32 + 3)]
        await settle()
        for number in range(3):
            transport.gate(f"/w/{number}").set()
        await settle()
        assert transport.sent_paths()[32:] == ["/w/32", "/w/33", "/w/34"]
        for gate in list(transport.gates.values()):
            gate.set()
        await asyncio.gather(*writes)
        await transport.close()

    run(scenario())


def test_long_poll_write__does_not_hold_the_window_and_is_not_held_by_it() -> None:
    async def scenario() -> None:
        transport = GatedTransport()
        # A lock acquire waiting in the lock's queue, for as long as the test likes.
        waiting = transport.write("/lock/acquire", wait_s=60.0)
        await settle()
        assert transport.sent_paths() == ["/lock/acquire"]
        # Plain writes go through behind it, many more than the window is wide.
        for number in range(WRITES_IN_FLIGHT_MAX * 2):
            transport.gate(f"/w/{number}").set()
        await asyncio.gather(
            *(transport.write(f"/w/{number}") for number in range(WRITES_IN_FLIGHT_MAX * 2))
        )
        assert not waiting.done()
        # A full window does not hold up a long-poll write either.
        plain = [transport.write(f"/x/{number}") for number in range(WRITES_IN_FLIGHT_MAX)]
        await settle()
        transport.gate("/lock/again").set()
        await transport.call("PUT", "/lock/again", write=True, wait_s=60.0)
        transport.gate("/lock/acquire").set()
        for number in range(WRITES_IN_FLIGHT_MAX):
            transport.gate(f"/x/{number}").set()
        await asyncio.gather(waiting, *plain)
        await transport.close()

    run(scenario())


def test_write_waiting_past_its_deadline__raises_a_definite_cluster_unavailable() -> None:
    async def scenario() -> None:
        # The writes in flight have all the time they need, and the late one only 0.2 s: with
        # the same deadline for all, which ends first is a matter of timers firing together.
        transport = GatedTransport(timeout_s=30.0)
        writes = [transport.write(f"/w/{number}") for number in range(WRITES_IN_FLIGHT_MAX)]
        await settle()
        with pytest.raises(ClusterUnavailable, match="writes in flight did not end") as raised:
            await transport.call("PUT", "/late", write=True, timeout_s=0.2)
        assert raised.value.definite
        assert "/late" not in transport.sent_paths()
        for gate in list(transport.gates.values()):
            gate.set()
        await asyncio.gather(*writes)
        assert not transport._writes_in_flight and not transport._turn_waiters
        await transport.close()

    run(scenario())


def test_cancelled_writes__free_their_places_in_flight_and_in_the_queue() -> None:
    async def scenario() -> None:
        transport = GatedTransport()
        writes = [transport.write(f"/w/{number}") for number in range(WRITES_IN_FLIGHT_MAX)]
        queued = transport.write("/queued")
        await settle()
        queued.cancel()
        writes[0].cancel()
        await settle()
        assert queued.cancelled() and "/queued" not in transport.sent_paths()
        # The oldest write in flight was cancelled: the window moves on to the next one.
        first_seq = transport.sent[0][1]
        after = transport.write("/after")
        await settle()
        assert transport.sent[-1] == ("/after", first_seq + WRITES_IN_FLIGHT_MAX)
        for gate in list(transport.gates.values()):
            gate.set()
        transport.gate("/after").set()
        await asyncio.gather(*writes[1:], after)
        assert not transport._writes_in_flight and not transport._turn_waiters
        await transport.close()

    run(scenario())


def test_reads__take_no_place_in_the_window() -> None:
    async def scenario() -> None:
        transport = GatedTransport()
        writes = [transport.write(f"/w/{number}") for number in range(WRITES_IN_FLIGHT_MAX)]
        await settle()
        transport.gate("/read").set()
        assert await transport.call("GET", "/read") == {}
        for gate in list(transport.gates.values()):
            gate.set()
        await asyncio.gather(*writes)
        await transport.close()

    run(scenario())


# Against a node that keeps results as the state machine does.


class ResultsNode(FakeNode):
    """Answers every write as the state machine would: it keeps the results of each client's 32
    newest seqs, answers a repeat from them, and refuses a seq older than the oldest kept as
    `request.too_old`. The first try of every `refuse_every`th seq it sees is refused with 429
    (as an overloaded node does), so that write's retry comes after newer ones were applied."""

    def __init__(self, *, refuse_every: int, retry_after_s: float) -> None:
        super().__init__({})
        self.refuse_every = refuse_every
        self.retry_after_s = retry_after_s
        self.results: dict[str, dict[int, dict[str, Any]]] = {}
        self.refused: set[int] = set()
        self.seqs_seen: set[int] = set()
        self.keys: set[str] = set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        kept = self.results.setdefault(request.headers["Xr-Client-Id"], {})
        seq = int(request.headers["Xr-Seq"])
        if seq in kept:
            return web.json_response(kept[seq])
        if len(kept) >= Limits().results_per_client_max and seq < min(kept):
            return _error_answer("request.too_old", 409)
        if seq not in self.seqs_seen:
            self.seqs_seen.add(seq)
            if len(self.seqs_seen) % self.refuse_every == 0:
                self.refused.add(seq)
                return _error_answer("cluster.overloaded", 429, retry_after_s=self.retry_after_s)
        self.keys.add(request.path)
        kept[seq] = {"revision": len(self.keys), "previous_mod_revision": 0, "version": 1}
        while len(kept) > Limits().results_per_client_max:
            del kept[min(kept)]
        return web.json_response(kept[seq])


def _error_answer(code: str, status: int, *, retry_after_s: float = 0.0) -> web.Response:
    document = {"error": {"code": code, "message": f"fake {code}", "definite": status == 429}}
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s else None
    return web.json_response(document, status=status, headers=headers)


def test_300_concurrent_puts_on_one_async_client__none_is_refused_as_too_old(
    fakes: FakeNodes,
) -> None:
    node = fakes.serve(ResultsNode(refuse_every=50, retry_after_s=0.2))

    async def scenario() -> None:
        async with AsyncClient(node.url, timeout_s=30) as client:
            await asyncio.gather(*(client.kv.put(f"k{number}", "v") for number in range(300)))

    run(scenario())
    assert node.refused, "no write was held up: the test did not test the window"
    assert node.keys == {f"/v1/kv/k{number}" for number in range(300)}


def test_100_threads_sharing_one_client__none_is_refused_as_too_old(fakes: FakeNodes) -> None:
    node = fakes.serve(ResultsNode(refuse_every=50, retry_after_s=0.2))
    failures: list[BaseException] = []
    with Client(node.url, timeout_s=30) as client:

        def write(thread: int) -> None:
            try:
                for number in range(3):
                    client.kv.put(f"k{thread}-{number}", "v")
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=write, args=(number,)) for number in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not failures, failures[:3]
    assert node.refused and len(node.keys) == 300
