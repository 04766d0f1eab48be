"""The protected resources: what fencing tokens protect, run by the harness.

A `FencedResource` accepts a token for a name (a lock, a job's key) unless it has already
accepted a higher one for that name, and remembers every decision. The lock workload presents
tokens to it directly; job attempts running inside the nodes' executors present theirs over HTTP
(`ResourceServer`, `POST /complete` with `{"key", "token", "job_id", "attempt"}`), bound to the
harness's address on the test bridge (or loopback).

A job's completion is an effect that must happen once. Before accepting one, the server asks the
cluster (a linearizable read) whether the token is still the one of the task's live attempt, so
a zombie attempt whose lease has passed to another is turned away even before the newer attempt
reports; the same token presented again (a retried request) is answered as before without being
recorded twice. A rejected job raises, so its attempt fails and the task is retried.

Every job completion the server decides is recorded in the history as a `complete` operation of
process `RESOURCE_PROCESS`, value `{"key", "token", "job_id"}`: `ok` when accepted, `fail` when
rejected.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["RESOURCE_PROCESS", "FencedResource", "ResourceServer"]

# The process number of events the resource records; far above any client's.
RESOURCE_PROCESS = 1_000_000
# A completion body is a few fields; anything bigger is not from the harness's job.
BODY_BYTES_MAX = 4096


@dataclass
class FencedResource:
    """Tokens per name: accepts a token at least as high as every one accepted before."""

    highest: dict[str, int] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def present(self, name: str, token: int) -> bool:
        with self._lock:
            accepted = token >= self.highest.get(name, token)
            if accepted:
                self.highest[name] = token
            self.decisions.append({"name": name, "token": token, "accepted": accepted})
            return accepted

    def seen(self, name: str, token: int) -> bool:
        """Whether exactly this token is the highest accepted for `name` (a repeat)."""
        with self._lock:
            return self.highest.get(name) == token


class ResourceServer:
    """The HTTP face of a `FencedResource` for job completions."""

    def __init__(
        self,
        resource: FencedResource,
        *,
        host: str,
        record: Callable[[dict[str, Any], bool, str | None], None],
        validate: Callable[[str, int], Awaitable[str | None]],
    ) -> None:
        """`record(value, accepted, why_rejected)` writes the history; `validate(job_id, token)`
        says why the token is not the job's live attempt, or None when it is."""
        self.resource = resource
        self.host = host
        self.port = 0
        self._record = record
        self._validate = validate
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=BODY_BYTES_MAX)
        app.router.add_post("/complete", self._complete)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _complete(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            key, token, job_id = str(body["key"]), int(body["token"]), str(body["job_id"])
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "expected {key, token, job_id}"}, status=400)
        if self.resource.seen(key, token):
            return web.json_response({"accepted": True, "repeat": True})
        problem = await self._validate(job_id, token)
        if self.resource.seen(key, token):
            # The same token was accepted while this request was being validated.
            return web.json_response({"accepted": True, "repeat": True})
        accepted = problem is None and self.resource.present(key, token)
        if problem is None and not accepted:
            problem = "a newer token was accepted"
        # The job id tells a superseded attempt of one job from a second job of the same key.
        self._record({"key": key, "token": token, "job_id": job_id}, accepted, problem)
        return web.json_response({"accepted": accepted, "reason": problem})
