"""The bound on the API's connections and the descriptor limit (node/api/connections.py); the
bound itself is tested on a real node in tests/node/test_daemon.py."""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import pytest

from node.api import connections
from node.api.connections import DESCRIPTORS_RESERVED, DESCRIPTORS_WANTED, connections_bound


class FakeLimits:
    def __init__(self, soft: int, hard: int) -> None:
        self.soft, self.hard, self.refuse = soft, hard, False
        self.set_to: list[tuple[int, int]] = []

    def getrlimit(self, kind: int) -> tuple[int, int]:
        assert kind == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, kind: int, limits: tuple[int, int]) -> None:
        if self.refuse:
            raise ValueError("not allowed")
        self.set_to.append(limits)
        self.soft = limits[0]


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> FakeLimits:
    fake = FakeLimits(1_024, 524_288)
    monkeypatch.setattr(resource, "getrlimit", fake.getrlimit)
    monkeypatch.setattr(resource, "setrlimit", fake.setrlimit)
    return fake


def test_default__the_limit_is_raised_and_the_bound_leaves_the_reserve(limits: FakeLimits) -> None:
    assert connections_bound(0) == DESCRIPTORS_WANTED - DESCRIPTORS_RESERVED
    assert limits.set_to == [(DESCRIPTORS_WANTED, 524_288)]


def test_default__a_small_hard_limit_keeps_half_for_the_rest_of_the_node(
    limits: FakeLimits,
) -> None:
    limits.soft = limits.hard = 1_024
    assert connections_bound(0) == 512
    assert limits.set_to == []


def test_configured__the_limit_is_raised_to_fit_it(limits: FakeLimits) -> None:
    assert connections_bound(4_096) == 4_096
    assert limits.set_to == [(4_096 + DESCRIPTORS_RESERVED, 524_288)]


def test_configured__a_limit_that_fits_already_is_left_alone(limits: FakeLimits) -> None:
    limits.soft = 65_536
    assert connections_bound(4_096) == 4_096
    assert limits.set_to == []


def test_configured__too_many_for_the_hard_limit_is_warned_about(
    limits: FakeLimits, caplog: pytest.LogCaptureFixture
) -> None:
    limits.hard = 2_048
    with caplog.at_level(logging.WARNING, logger=connections.__name__):
        assert connections_bound(4_096) == 4_096
    assert limits.set_to == [(2_048, 2_048)]
    assert "leaves room for about 1024 API connections" in caplog.text


def test_a_refused_raise_is_warned_about(
    limits: FakeLimits, caplog: pytest.LogCaptureFixture
) -> None:
    limits.refuse = True
    with caplog.at_level(logging.WARNING, logger=connections.__name__):
        assert connections_bound(4_096) == 4_096
    assert "could not raise the descriptor limit from 1024 to 5120" in caplog.text
    assert "fewer than http.connections_max (4096)" in caplog.text


class CountingServer:
    """Stands in for aiohttp's `web_server.Server`: a connection table, and a `connections`
    that counts how often it is called (aiohttp's copies the table into a list each time)."""

    def __init__(self, open_now: int) -> None:
        self._connections = {object(): object() for _ in range(open_now)}
        self.copies = 0

    @property
    def connections(self) -> list[object]:
        self.copies += 1
        return list(self._connections)


def test_open_connections_reads_the_table_without_copying_it() -> None:
    server = CountingServer(3)
    assert connections.open_connections(server) == 3  # type: ignore[arg-type]
    assert server.copies == 0


def test_open_connections_falls_back_to_the_public_list() -> None:
    class Listed:
        connections = [object(), object()]

    assert connections.open_connections(Listed()) == 2  # type: ignore[arg-type]


def test_the_runner_counts_its_connections_and_refusals() -> None:
    asyncio.run(_runner_counts())


async def _runner_counts() -> None:
    from aiohttp import web

    runner = connections.CappedAppRunner(web.Application(), connections_max=2)
    assert runner.connections_open() == 0
    await runner.setup()
    try:
        server = runner.server
        first, second = server(), server()
        assert not isinstance(first, connections._Refusal)
        # aiohttp's server adds a connection to its table when the connection is made.
        inner: Any = super(connections.CappedAppRunner, runner).server
        table: dict[Any, Any] = inner._connections
        table[first], table[second] = object(), object()
        assert runner.connections_open() == 2
        assert isinstance(server(), connections._Refusal)
        assert isinstance(server(), connections._Refusal)
        assert runner.connections_refused == 2
        del table[first]
        assert not isinstance(server(), connections._Refusal)
        assert runner.connections_refused == 2
    finally:
        await runner.cleanup()
