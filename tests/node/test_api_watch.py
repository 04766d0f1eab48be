"""Watch through the app factory: long polls that return what another task writes, resuming from
`next_revision` or `Last-Event-ID`, Server-Sent Events, and 410 for a compacted revision."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import ClientResponse

from node.api.app import SERVICES, create_app
from tests.node.conftest import Answer, ApiNode, auth_headers, eventually
from xrcore.limits import PAGE_BYTES_MAX, VALUE_BYTES_MAX, Limits

pytestmark = pytest.mark.integration


def test_long_poll__returns_a_put_made_by_another_task_while_it_waits(api: ApiNode) -> None:
    start = api.revision() + 1

    async def body() -> Answer:
        watching = asyncio.ensure_future(
            api.call("GET", f"/v1/watch?prefix=watch-poll/&from_revision={start}&wait_s=5")
        )
        await eventually(lambda: api.services.waiting == 1)
        await api.call("PUT", "/v1/kv/watch-poll/a", json={"value": "1"})
        return await watching

    answer = api.run(body())
    assert answer.status == 200
    events = answer.document["events"]
    assert [(event["kind"], event["key"], event["value"]) for event in events] == [
        ("put", "watch-poll/a", "1")
    ]
    assert answer.document["next_revision"] == events[0]["revision"] + 1


def test_long_poll__resumes_from_next_revision_and_sees_only_its_prefix(api: ApiNode) -> None:
    start = api.revision() + 1
    api.ok("PUT", "/v1/kv/watch-resume/a", json={"value": "1"})
    api.ok("PUT", "/v1/kv/watch-elsewhere", json={"value": "not watched"})
    api.ok("DELETE", "/v1/kv/watch-resume/a")

    first = api.ok("GET", f"/v1/watch?prefix=watch-resume/&from_revision={start}&limit=1")
    assert [event["kind"] for event in first["events"]] == ["put"]
    second = api.ok("GET", f"/v1/watch?prefix=watch-resume/&from_revision={first['next_revision']}")
    assert [(event["kind"], event["key"]) for event in second["events"]] == [
        ("delete", "watch-resume/a")
    ]
    # Nothing new: an empty answer at once without wait_s, with where to continue from.
    third = api.ok("GET", f"/v1/watch?prefix=watch-resume/&from_revision={second['next_revision']}")
    assert third["events"] == []
    assert third["next_revision"] >= second["next_revision"]


def test_long_poll__large_values__come_in_pages_of_about_page_bytes_max(api: ApiNode) -> None:
    start = api.revision() + 1
    big = "x" * VALUE_BYTES_MAX
    for n in range(20):
        api.ok("PUT", f"/v1/kv/watch-big/{n:02}", json={"value": big})
    keys: list[str] = []
    next_revision = start
    while len(keys) < 20:
        page = api.ok(
            "GET", f"/v1/watch?prefix=watch-big/&from_revision={next_revision}&limit=1000"
        )
        assert 1 <= len(page["events"]) <= PAGE_BYTES_MAX // VALUE_BYTES_MAX
        keys += [event["key"] for event in page["events"]]
        next_revision = page["next_revision"]
    assert keys == [f"watch-big/{n:02}" for n in range(20)]
    listed = api.ok("GET", "/v1/kv?prefix=watch-big/&limit=1000")
    assert 1 <= len(listed["items"]) <= PAGE_BYTES_MAX // VALUE_BYTES_MAX
    assert listed["next"] is not None


def test_long_poll__resumes_after_last_event_id(api: ApiNode) -> None:
    revisions = [
        api.ok("PUT", f"/v1/kv/watch-last-id/{name}", json={"value": name})["revision"]
        for name in ("a", "b")
    ]
    resumed = api.ok(
        "GET",
        "/v1/watch?prefix=watch-last-id/",
        headers={"Last-Event-ID": str(revisions[0])},
    )
    assert [event["key"] for event in resumed["events"]] == ["watch-last-id/b"]


async def _sse_events(response: ClientResponse, count: int) -> list[dict[str, Any]]:
    """Reads `count` events (id, event, data) from a Server-Sent Events stream."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    while len(events) < count:
        line = (await response.content.readline()).decode().rstrip("\n")
        if line.startswith(":"):
            continue
        if not line:
            if current:
                events.append(current)
                current = {}
            continue
        name, _, value = line.partition(": ")
        current[name] = msgspec.json.decode(value) if name == "data" else value
    return events


def _sse_keys(events: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for event in events:
        assert int(event["id"]) == event["data"]["revision"]
        yield event["event"], event["data"]["key"]


def test_sse__streams_puts_and_deletes_and_resumes_with_last_event_id(api: ApiNode) -> None:
    start = api.revision() + 1
    headers = {**auth_headers("alpha"), "Accept": "text/event-stream"}
    path = f"/v1/watch?prefix=watch-sse/&from_revision={start}"

    async def body() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with api.client.get(path, headers=headers) as stream:
            assert stream.status == 200
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            await api.call("PUT", "/v1/kv/watch-sse/a", json={"value": "1"})
            await api.call("PUT", "/v1/kv/watch-sse/b", json={"value": "2"})
            await api.call("DELETE", "/v1/kv/watch-sse/a")
            streamed = await _sse_events(stream, 3)
        # EventSource reconnects with the id of the last event it saw.
        resume = {**headers, "Last-Event-ID": streamed[0]["id"]}
        async with api.client.get("/v1/watch?prefix=watch-sse/", headers=resume) as stream:
            resumed = await _sse_events(stream, 2)
        await eventually(lambda: api.services.streams == 0)
        return streamed, resumed

    streamed, resumed = api.run(body())
    assert list(_sse_keys(streamed)) == [
        ("put", "watch-sse/a"),
        ("put", "watch-sse/b"),
        ("delete", "watch-sse/a"),
    ]
    assert list(_sse_keys(resumed)) == [("put", "watch-sse/b"), ("delete", "watch-sse/a")]


def test_watch__without_from_revision__is_400(api: ApiNode) -> None:
    refused = api.request("GET", "/v1/watch?prefix=watch-")
    assert (refused.status, refused.error_code) == (400, "request.invalid")
    assert "from_revision" in refused.document["error"]["message"]


@pytest.mark.parametrize("last_id", ["-5", "1_0", "5x", "+5", "", "9223372036854775807"])
def test_watch__last_event_id_that_is_not_a_revision__is_400(api: ApiNode, last_id: str) -> None:
    refused = api.request(
        "GET", "/v1/watch?prefix=watch-bad-id/", headers={"Last-Event-ID": last_id}
    )
    assert (refused.status, refused.error_code) == (400, "request.invalid")
    assert "Last-Event-ID" in refused.document["error"]["message"]


@pytest.mark.parametrize("from_revision", ["0", "-1", "x", "9223372036854775808"])
def test_watch__from_revision_is_checked_even_when_last_event_id_is_sent(
    api: ApiNode, from_revision: str
) -> None:
    refused = api.request(
        "GET",
        f"/v1/watch?prefix=watch-both/&from_revision={from_revision}",
        headers={"Last-Event-ID": "1"},
    )
    assert (refused.status, refused.error_code) == (400, "request.invalid")
    assert "from_revision" in refused.document["error"]["message"]


@pytest.fixture(scope="module")
def short_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    """A node that keeps only the last four changes, so a watch can fall behind cheaply."""
    node = ApiNode(tmp_path_factory.mktemp("short-history"), limits=Limits(watch_history_max=4))
    try:
        yield node
    finally:
        node.close()


def test_watch__from_a_compacted_revision__is_410_for_long_poll_and_sse(
    short_history: ApiNode,
) -> None:
    for position in range(6):
        short_history.ok("PUT", f"/v1/kv/compacted-{position}", json={"value": "x"})

    polled = short_history.request("GET", "/v1/watch?from_revision=1")
    assert (polled.status, polled.error_code) == (410, "kv.compacted")
    streamed = short_history.request(
        "GET", "/v1/watch?from_revision=1", headers={"Accept": "text/event-stream"}
    )
    assert (streamed.status, streamed.error_code) == (410, "kv.compacted")
    # The retained revisions are still served.
    retained = short_history.ok("GET", "/v1/watch?from_revision=3")
    assert [event["key"] for event in retained["events"]] == [
        f"compacted-{position}" for position in range(2, 6)
    ]


def test_sse__a_client_that_stops_reading__is_cut_off_and_its_stream_place_freed(
    tmp_path: Path,
) -> None:
    """A client that keeps its connection open but reads nothing used to hold its stream (one of
    `http.streams_max`) for ever: each write waited for room in the socket without end."""
    node = ApiNode(tmp_path)
    config = dataclasses.replace(
        node.config, http=msgspec.structs.replace(node.config.http, stream_write_timeout_s=0.5)
    )

    async def scenario() -> None:
        app = create_app(config, store=node.store)
        client = await node.serve(app)
        services = app[SERVICES]
        loop = asyncio.get_running_loop()
        stalled = socket.socket()
        # A small receive window, never read: the node's writes back up quickly.
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.setblocking(False)
        try:
            await loop.sock_connect(stalled, (client.server.host, client.server.port))
            head = "".join(f"{name}: {value}\r\n" for name, value in auth_headers("alpha").items())
            await loop.sock_sendall(
                stalled,
                b"GET /v1/watch?prefix=stall/&from_revision=1 HTTP/1.1\r\nHost: x\r\n"
                b"Accept: text/event-stream\r\n" + head.encode() + b"\r\n",
            )
            await eventually(lambda: services.streams == 1)
            value = "x" * 60_000
            for number in range(400):
                if services.streams == 0:
                    break
                answer = await node.call("PUT", f"/v1/kv/stall/{number}", json={"value": value})
                assert answer.status == 200, answer.body
            await eventually(lambda: services.streams == 0)
        finally:
            stalled.close()

    try:
        node.run(scenario())
    finally:
        node.close()


def test_streams_and_waits__one_tenant_takes_at_most_its_share(tmp_path: Path) -> None:
    # One tenant opening every stream (and every long poll) of a node left the others none.
    node = ApiNode(tmp_path)
    http = msgspec.structs.replace(
        node.config.http,
        streams_max=4,
        streams_per_tenant_max=2,
        waiting_requests_max=4,
        waiting_requests_per_tenant_max=2,
    )
    config = dataclasses.replace(node.config, http=http)

    async def scenario() -> dict[str, Any]:
        app = create_app(config, store=node.store)
        client = await node.serve(app)
        services = app[SERVICES]
        seen: dict[str, Any] = {}
        sse = {"Accept": "text/event-stream"}

        def stream(token: str) -> Any:
            return client.get(
                "/v1/watch?prefix=share/&from_revision=1", headers={**auth_headers(token), **sse}
            )

        # Closed, not left through `async with`, which waits for an endless stream to end.
        first, second = await stream("alpha"), await stream("alpha")
        try:
            assert (first.status, second.status) == (200, 200)
            third = await node.call(
                "GET", "/v1/watch?prefix=share/&from_revision=1", headers=sse, client=client
            )
            seen["alpha_third_stream"] = (third.status, third.document["error"]["message"])
            other = await stream("beta")
            seen["beta_stream"] = other.status
            other.close()
            # Long polls: alpha's two waits take its share, beta still gets one.
            revision = node.store.replica.read(lambda machine: machine.revision) + 1000
            poll = f"/v1/watch?prefix=share/&from_revision={revision}&wait_s=2"
            waits = [asyncio.ensure_future(node.call("GET", poll, client=client)) for _ in range(2)]
            await eventually(lambda: services.waiting == 2)
            refused = await node.call("GET", poll, client=client)
            seen["alpha_third_wait"] = (refused.status, refused.document["error"]["message"])
            other_wait = await node.call("GET", poll, token="beta", client=client)
            seen["beta_wait"] = other_wait.status
            await asyncio.gather(*waits)
        finally:
            first.close()
            second.close()
        await eventually(lambda: services.streams == 0 and services.waiting == 0)
        seen["counts_left"] = (dict(services.streams_by_tenant), dict(services.waiting_by_tenant))
        return seen

    try:
        seen = node.run(scenario())
    finally:
        node.close()
    status, message = seen["alpha_third_stream"]
    assert status == 429 and "2 event streams of tenant 'alpha'" in message
    assert seen["beta_stream"] == 200
    status, message = seen["alpha_third_wait"]
    assert status == 429 and "2 requests of tenant 'alpha'" in message
    assert seen["beta_wait"] == 200
    assert seen["counts_left"] == ({}, {})
