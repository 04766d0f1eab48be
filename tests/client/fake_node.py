"""Scripted HTTP nodes on loopback for testing the client's retries without a cluster.

A `FakeNode` answers each request to a route (`"PUT /v1/kv/a"`, or `"*"` for any) with the next
of its scripted replies; the last reply repeats. A reply can also drop the connection without
answering, stream a body of a given length (an answer too long to read), or answer text that is
not JSON (what a web server that is not an xr node answers). Every request is
recorded (method, path, query, headers, body) for the test to read.
The nodes run on an event loop in a thread of their own, so sync and async clients can both be
pointed at them.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

__all__ = ["DROP", "FakeNode", "FakeNodes", "Reply", "Seen", "error", "refused_url"]


@dataclass(frozen=True, kw_only=True)
class Reply:
    status: int = 200
    document: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # Close the connection without answering.
    drop: bool = False
    # Wait this long before answering (a long poll with nothing to report).
    delay_s: float = 0.0
    # Answer with this many bytes of body instead of `document`, in chunks, with a Content-Length
    # when `announced` (else chunked); the bytes the reader took are counted in `FakeNode.streamed`.
    stream_bytes: int = 0
    announced: bool = False
    # Answer this text (as text/html) instead of `document`.
    text: str | None = None


DROP = Reply(drop=True)


def error(code: str, status: int, *, definite: bool, retry_after: str | None = None) -> Reply:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return Reply(
        status=status,
        document={"error": {"code": code, "message": f"scripted {code}", "definite": definite}},
        headers=headers,
    )


@dataclass(frozen=True, kw_only=True)
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


class FakeNode:
    def __init__(self, routes: Mapping[str, list[Reply]]) -> None:
        self.routes = {route: list(replies) for route, replies in routes.items()}
        self.seen: list[Seen] = []
        self._answered: dict[str, int] = {}
        self.url = ""
        # Body bytes written by `stream_bytes` replies before the reader stopped taking them.
        self.streamed = 0

    def requests(self, route: str) -> list[Seen]:
        method, _, path = route.partition(" ")
        return [item for item in self.seen if item.method == method and item.path == path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.seen.append(
            Seen(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                headers=dict(request.headers),
                body=body,
            )
        )
        route = f"{request.method} {request.path}"
        if route not in self.routes:
            route = "*"
        replies = self.routes.get(route)
        if not replies:
            return web.json_response(
                {"error": {"code": "not_found", "message": "unscripted", "definite": True}},
                status=404,
            )
        count = self._answered.get(route, 0)
        self._answered[route] = count + 1
        reply = replies[min(count, len(replies) - 1)]
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.drop:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if reply.stream_bytes:
            return await self._stream(request, reply)
        if reply.text is not None:
            return web.Response(
                text=reply.text,
                status=reply.status,
                headers=reply.headers,
                content_type="text/html",
            )
        return web.json_response(reply.document, status=reply.status, headers=reply.headers)

    async def _stream(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        response = web.StreamResponse(status=reply.status, headers=reply.headers)
        response.content_type = "application/json"
        if reply.announced:
            response.content_length = reply.stream_bytes
        await response.prepare(request)
        chunk = b" " * 65_536
        try:
            while self.streamed < reply.stream_bytes:
                part = chunk[: reply.stream_bytes - self.streamed]
                await response.write(part)
                self.streamed += len(part)
        except (ConnectionError, RuntimeError):
            # The reader closed the connection: what it refused to read is not counted.
            return response
        await response.write_eof()
        return response


Served = TypeVar("Served", bound=FakeNode)


class FakeNodes:
    """Starts `FakeNode`s on a private loop thread; `close()` stops them all."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runners: list[web.AppRunner] = []

    def add(self, routes: Mapping[str, list[Reply]]) -> FakeNode:
        return self.serve(FakeNode(routes))

    def serve(self, node: Served) -> Served:
        """Serves `node` (a `FakeNode`, or one whose `handle` answers otherwise)."""
        node.url = asyncio.run_coroutine_threadsafe(self._serve(node), self._loop).result(10)
        return node

    async def _serve(self, node: FakeNode) -> str:
        application = web.Application()
        application.router.add_route("*", "/{tail:.*}", node.handle)
        # Requests still waiting when the test ends are not waited for.
        runner = web.AppRunner(application, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()
            # Handlers still waiting (a scripted delay) would otherwise be destroyed pending.
            current = asyncio.current_task()
            pending = [task for task in asyncio.all_tasks() if task is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def refused_url() -> str:
    """A loopback address where nothing listens: connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"
