"""Admission control (`node.api.admission`): beyond `http.requests_in_flight_max` requests handled
at once the next is refused at once with 429, Retry-After and `limit.capacity`; health checks and
waits are not counted; the count never leaks. Also the overload benchmark (`bench/overload.py`):
a short single-node run in the default suite, the 60 s three-node run behind `slow`.

The in-process tests serve a second application over the shared node's store with a small bound
and one extra route, `/v1/overload-test/hold` (admin only, as every route the authorization table
does not list), whose handlers wait until the test lets them go: that is
how a test holds exactly N requests in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from bench import overload
from node.api.app import SERVICES, Services, create_app
from tests.node.conftest import Answer, ApiNode, auth_headers, eventually

pytestmark = pytest.mark.integration

IN_FLIGHT_MAX = 2
BODIES_ARRIVING_MAX = 4
HOLD = "/v1/overload-test/hold"


@dataclass
class Held:
    """The hold route's handlers: each waits for `release`; `tasks` lets a test cancel one."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    fail: bool = False


@dataclass
class Bounded:
    node: ApiNode
    app: web.Application
    client: TestClient[Any, Any]
    held: Held

    @property
    def services(self) -> Services:
        return self.app[SERVICES]

    def in_flight(self) -> int:
        return self.services.metrics.requests_in_flight

    def arriving(self) -> int:
        return self.services.metrics.bodies_arriving

    async def slow_bodies(self, count: int) -> list[asyncio.StreamWriter]:
        """Starts `count` PUTs whose bodies arrive no further than their first bytes."""
        server = self.client.server
        head = "".join(f"{name}: {value}\r\n" for name, value in auth_headers("alpha").items())
        writers = []
        for _ in range(count):
            _, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(
                b"PUT /v1/kv/overload-slow HTTP/1.1\r\nHost: x\r\n"
                + head.encode()
                + b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"value": "'
            )
            await writer.drain()
            writers.append(writer)
        return writers

    async def call(self, method: str, path: str, **options: Any) -> Answer:
        return await self.node.call(method, path, client=self.client, **options)

    def request(self, method: str, path: str, **options: Any) -> Answer:
        return self.node.run(self.call(method, path, **options))

    async def hold(self, count: int) -> list[asyncio.Task[Answer]]:
        """Starts `count` requests that stay in their handler until released."""
        started = len(self.held.tasks)
        calls = [asyncio.ensure_future(self.call("GET", HOLD, token="admin")) for _ in range(count)]
        await eventually(lambda: len(self.held.tasks) == started + count)
        return calls

    def release(self) -> None:
        """Lets every held handler answer, and arms a fresh event for the next test."""

        async def release() -> None:
            self.held.release.set()
            await eventually(lambda: self.in_flight() == 0)
            self.held.release = asyncio.Event()
            self.held.tasks.clear()
            self.held.fail = False

        self.node.run(release())


@pytest.fixture(scope="module")
def bounded(api: ApiNode) -> Iterator[Bounded]:
    config = api.config
    config = dataclasses.replace(
        config,
        http=msgspec.structs.replace(
            config.http,
            requests_in_flight_max=IN_FLIGHT_MAX,
            bodies_arriving_max=BODIES_ARRIVING_MAX,
        ),
    )
    held = Held()

    async def hold(request: web.Request) -> web.Response:
        current = asyncio.current_task()
        assert current is not None
        held.tasks.append(current)
        await held.release.wait()
        if held.fail:
            raise RuntimeError("the hold route was told to fail")
        return web.json_response({"held": True})

    async def start() -> tuple[web.Application, TestClient[Any, Any]]:
        app = create_app(config, store=api.store)
        app.router.add_get(HOLD, hold)
        return app, await api.serve(app)

    app, client = api.run(start())
    state = Bounded(node=api, app=app, client=client, held=held)
    try:
        yield state
    finally:
        state.release()


def test_admission__bound_reached__next_request_is_refused_at_once_with_retry_after(
    bounded: Bounded,
) -> None:
    async def scenario() -> tuple[Answer, Answer, Answer, list[Answer]]:
        calls = await bounded.hold(IN_FLIGHT_MAX)
        refused = await bounded.call("GET", "/v1/kv/overload-refused")
        health = await bounded.call("GET", "/healthz", token=None)
        metrics = await bounded.call("GET", "/metrics", token=None)
        bounded.held.release.set()
        return refused, health, metrics, list(await asyncio.gather(*calls))

    try:
        refused, health, metrics, held = bounded.node.run(scenario())
    finally:
        bounded.release()
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    assert refused.error_code == "limit.capacity"
    assert "http.requests_in_flight_max" in refused.document["error"]["message"]
    assert refused.document["error"]["definite"] is True
    assert health.status == 200
    assert metrics.status == 200
    assert b"xr_http_requests_in_flight 2.0" in metrics.body
    assert [answer.status for answer in held] == [200] * IN_FLIGHT_MAX


def test_admission__after_release__requests_are_admitted_again(bounded: Bounded) -> None:
    async def fill() -> Answer:
        await bounded.hold(IN_FLIGHT_MAX)
        return await bounded.call("PUT", "/v1/kv/overload-again", json={"value": "x"})

    assert bounded.node.run(fill()).status == 429
    bounded.release()
    assert bounded.in_flight() == 0
    assert bounded.request("PUT", "/v1/kv/overload-again", json={"value": "x"}).status == 200
    assert bounded.request("GET", "/v1/kv/overload-again").document["value"] == "x"


def test_admission__handler_cancelled__its_place_is_given_back(bounded: Bounded) -> None:
    async def scenario() -> int:
        await bounded.hold(IN_FLIGHT_MAX)
        # The server cancels a handler whose client went away; here the test does it directly.
        bounded.held.tasks[0].cancel()
        await eventually(lambda: bounded.in_flight() == IN_FLIGHT_MAX - 1)
        return (await bounded.call("GET", "/v1/kv/overload-cancelled")).status

    try:
        admitted_status = bounded.node.run(scenario())
    finally:
        bounded.release()
    assert admitted_status == 404
    assert bounded.in_flight() == 0


def test_admission__handler_fails__its_place_is_given_back(bounded: Bounded) -> None:
    async def scenario() -> list[Answer]:
        calls = await bounded.hold(IN_FLIGHT_MAX)
        bounded.held.fail = True
        bounded.held.release.set()
        return list(await asyncio.gather(*calls))

    try:
        failed = bounded.node.run(scenario())
    finally:
        bounded.release()
    assert [answer.status for answer in failed] == [500] * IN_FLIGHT_MAX
    assert bounded.in_flight() == 0


def test_admission__slow_request_bodies__hold_no_place_among_the_requests_in_flight(
    bounded: Bounded,
) -> None:
    """A body is received before its request is admitted: more slow uploads than
    `http.requests_in_flight_max` leave reads and quick writes answered (each slow one held a
    place for up to `http.request_timeout_s` and made every other call 429)."""

    async def scenario() -> tuple[Answer, Answer, int]:
        slow = await bounded.slow_bodies(IN_FLIGHT_MAX + 1)
        try:
            await eventually(lambda: bounded.arriving() == IN_FLIGHT_MAX + 1)
            read = await bounded.call("GET", "/v1/kv/overload-slow")
            write = await bounded.call("PUT", "/v1/kv/overload-quick", json={"value": "x"})
            return read, write, bounded.in_flight()
        finally:
            for writer in slow:
                writer.close()

    read, write, in_flight = bounded.node.run(scenario())
    assert (read.status, read.error_code) == (404, "not_found")
    assert write.status == 200, write.body
    assert in_flight == 0
    # Clients that went away mid-body give their places back.
    bounded.node.run(eventually(lambda: bounded.arriving() == 0))


def test_admission__bodies_arriving_bound_reached__a_body_is_refused_and_a_read_is_not(
    bounded: Bounded,
) -> None:
    async def scenario() -> tuple[Answer, Answer, Answer, Answer]:
        slow = await bounded.slow_bodies(BODIES_ARRIVING_MAX)
        try:
            await eventually(lambda: bounded.arriving() == BODIES_ARRIVING_MAX)
            refused = await bounded.call("PUT", "/v1/kv/overload-quick", json={"value": "x"})
            read = await bounded.call("GET", "/v1/kv/overload-slow")
            # A health check is never refused, even one that (oddly) carries a body.
            health = await bounded.call("GET", "/healthz", token=None, json={"odd": True})
            metrics = await bounded.call("GET", "/metrics", token=None)
            return refused, read, health, metrics
        finally:
            for writer in slow:
                writer.close()

    refused, read, health, metrics = bounded.node.run(scenario())
    assert (refused.status, refused.error_code) == (429, "limit.capacity")
    assert refused.headers["Retry-After"] == "1"
    assert "http.bodies_arriving_max" in refused.document["error"]["message"]
    assert (read.status, read.error_code) == (404, "not_found")
    assert health.status == 200
    assert f"xr_http_bodies_arriving {BODIES_ARRIVING_MAX}.0".encode() in metrics.body
    bounded.node.run(eventually(lambda: bounded.arriving() == 0))


def test_admission__bound_reached__waits_and_health_checks_are_not_counted(
    bounded: Bounded,
) -> None:
    session_id = bounded.node.session()

    async def scenario() -> dict[str, int]:
        await bounded.hold(IN_FLIGHT_MAX)
        statuses = {
            "healthz": await bounded.call("GET", "/healthz", token=None),
            "readyz": await bounded.call("GET", "/readyz", token=None),
            "job wait": await bounded.call("GET", "/v1/jobs/overload-no-such-job?wait_s=0.1"),
            "watch wait": await bounded.call(
                "GET", "/v1/watch?prefix=overload-none&from_revision=1&wait_s=0.05"
            ),
            "lock wait": await bounded.call(
                "POST",
                "/v1/locks/overload-lock/acquire",
                json={"session_id": session_id, "wait_s": 0.5},
            ),
            # A lock acquire is not counted with a wait or without (see `node.api.admission`).
            "lock now": await bounded.call(
                "POST",
                "/v1/locks/overload-lock-2/acquire",
                json={"session_id": session_id},
            ),
            # The same routes without a wait are ordinary requests.
            "job now": await bounded.call("GET", "/v1/jobs/overload-no-such-job"),
            "watch now": await bounded.call(
                "GET", "/v1/watch?prefix=overload-none&from_revision=1"
            ),
        }
        # Waits hold no place: only the held requests are counted.
        assert bounded.in_flight() == IN_FLIGHT_MAX
        return {name: answer.status for name, answer in statuses.items()}

    try:
        statuses = bounded.node.run(scenario())
    finally:
        bounded.release()
    assert statuses == {
        "healthz": 200,
        "readyz": 200,
        "job wait": 404,
        "watch wait": 200,
        "lock wait": 200,
        "lock now": 200,
        "job now": 429,
        "watch now": 429,
    }


def test_overload_bench__short_single_node_run__structural_properties_hold(
    tmp_path: Path,
) -> None:
    report = overload.run(
        overload.Settings(
            base_dir=tmp_path,
            members=1,
            duration_s=3.0,
            capacity_s=1.0,
            requests_in_flight_max=4,
            offered_factor=4.0,
        )
    )
    _check_report(report)


@pytest.mark.slow
def test_overload_bench__three_nodes_sixty_seconds__structural_properties_hold(
    tmp_path: Path,
) -> None:
    report = overload.run(overload.Settings(base_dir=tmp_path, members=3, duration_s=60.0))
    _check_report(report)


def _check_report(report: dict[str, Any]) -> None:
    assert report["health"]["probes"] > 0
    assert report["health"]["not_ok"] == 0, report["health"]
    assert report["lost_acknowledged_writes"] == 0
    assert report["refused"] > 0, report
    assert report["refused_without_retry_after"] == 0
    assert report["admitted"] > 0
    # Every request sent was admitted and answered, or refused: none timed out or failed.
    assert report["unanswered"] == 0, report
    assert report["admitted"] + report["refused"] + report["other"] == report["sent"]
    # The nodes timed exactly the PUTs sent during the run (scraped before and after it), and
    # the prober, a process of its own, timed its probes.
    assert report["node_put_timing"]["requests"] == report["sent"], report["node_put_timing"]
    assert report["node_put_timing"]["p99_ms_at_most"] is not None
    assert report["health"]["latency_max_ms"] >= report["health"]["latency_p50_ms"] > 0


def test_bucket_quantiles__are_the_smallest_bounds_holding_the_share() -> None:
    before = {0.1: 10.0, 0.5: 10.0, float("inf"): 10.0}
    after = {0.1: 60.0, 0.5: 109.0, float("inf"): 110.0}
    assert overload._bucket_quantiles(before, after) == {
        "requests": 100,
        "p50_ms_at_most": 100.0,
        "p99_ms_at_most": 500.0,
        "p999_ms_at_most": None,  # beyond the last finite bound
    }
