"""Watch: the KV changes under a prefix from a revision on, as a long poll or Server-Sent Events.

Both read the replicated change history after a read barrier (so a watch never starts behind a
write the caller already saw), then wait on this node for new entries to be applied. A watcher
resumes from `next_revision` (long poll) or from the last event id (`Last-Event-ID`, sent by
EventSource on reconnect). Revisions older than the retained history answer 410
`kv.compacted`; an SSE stream then sends an `error` event and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from functools import partial
from typing import Any

import msgspec
from aiohttp import web

from node.api.app import (
    Services,
    principal,
    query_wait_s,
    read,
    services,
    still_authorized,
    stream_slot,
    waiting_slot,
)
from node.api.auth import Principal
from node.api.kv import key_view
from node.api.wire import open_event_stream, query_int, query_text, respond, write_to_stream
from xrcore import StateMachine, kv
from xrcore.errors import InvalidArgument, Unauthenticated, XrError
from xrcore.limits import PAGE_BYTES_MAX

__all__ = ["routes"]

routes = web.RouteTableDef()
# A long poll scans at most this many history entries per answer (the whole history by default).
_SCAN_PAGES_MAX = 10
_SSE_KEEPALIVE_S = 15.0
_SSE_BATCH = 100


def _collect(
    machine: StateMachine, prefix: str, from_revision: int, limit: int
) -> tuple[list[dict[str, Any]], int, int]:
    """Events under `prefix` from `from_revision`, at most `limit` and about `PAGE_BYTES_MAX`
    of keys and values; the revision to continue from; and the store's revision. Raises
    `Compacted`."""
    matched: list[dict[str, Any]] = []
    matched_bytes = 0
    next_revision = from_revision
    for _ in range(_SCAN_PAGES_MAX):
        page = kv.watch(machine, next_revision, limit=1000)
        for event in page["events"]:
            if event["key"].startswith(prefix):
                matched_bytes += len(event["key"]) + len(event["value"] or b"")
                if matched and matched_bytes > PAGE_BYTES_MAX:
                    return matched, next_revision, machine.revision
                matched.append(event)
            next_revision = event["revision"] + 1
            if len(matched) == limit:
                return matched, next_revision, machine.revision
        if not page["events"]:
            next_revision = page["next_revision"]
            break
    return matched, next_revision, machine.revision


def _collect_at(
    machine: StateMachine, *, prefix: str, from_revision: int, limit: int
) -> tuple[tuple[list[dict[str, Any]], int, int], int]:
    """`_collect` and the index of the state it read."""
    return _collect(machine, prefix, from_revision, limit), machine.index


def _event_view(caller: Principal, event: dict[str, Any]) -> dict[str, Any]:
    shown = key_view(caller, event)
    return {
        "revision": shown["revision"],
        "kind": shown["kind"],
        "key": shown["key"],
        "value": shown["value"],
        "value_base64": shown["value_base64"],
        "create_revision": shown["create_revision"],
        "version": shown["version"],
    }


# An event id is a revision in decimal digits only: `int()` alone also takes "-5", " 5" and "1_0".
_EVENT_ID = re.compile(r"[0-9]+")


def _start_revision(request: web.Request) -> int:
    # Checked whenever sent, even when Last-Event-ID takes its place: a request the document
    # refuses is refused.
    from_revision = query_int(request, "from_revision", default=None, low=1, high=kv.REVISION_MAX)
    last_id = request.headers.get("Last-Event-ID")
    if last_id is not None:
        if _EVENT_ID.fullmatch(last_id) is None:
            raise InvalidArgument(
                f"Last-Event-ID must be a revision (decimal digits only), got {last_id[:80]!r}"
            )
        last_revision = int(last_id)
        if last_revision >= kv.REVISION_MAX:
            raise InvalidArgument(
                f"Last-Event-ID must be below {kv.REVISION_MAX}, got {last_id[:80]!r}"
            )
        return last_revision + 1
    if from_revision is None:
        raise InvalidArgument(
            "from_revision is required (the first revision to watch; a key's mod_revision + 1 or "
            "a read's revision + 1)"
        )
    return from_revision


@routes.get("/v1/watch")
async def watch(request: web.Request) -> web.StreamResponse:
    caller = principal(request)
    prefix = caller.scoped(query_text(request, "prefix", default="") or "")
    start = _start_revision(request)
    if "text/event-stream" in request.headers.get("Accept", ""):
        return await _stream(request, caller, prefix, start)
    limit = query_int(request, "limit", default=100, low=1, high=1000)
    assert limit is not None
    waited_s = query_wait_s(request)
    result = await read(request, lambda machine: _collect(machine, prefix, start, limit))
    events, next_revision, revision = result.value
    if not events and waited_s > 0:
        async with waiting_slot(request):
            events, next_revision, revision = await _wait_events(
                request, prefix, next_revision, limit, waited_s
            )
    return respond(
        request,
        {
            "events": [_event_view(caller, event) for event in events],
            "next_revision": next_revision,
            "revision": revision,
        },
    )


async def _wait_events(
    request: web.Request, prefix: str, from_revision: int, limit: int, timeout_s: float
) -> tuple[list[dict[str, Any]], int, int]:
    node = services(request)
    store = node.store
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + timeout_s
    next_revision = from_revision
    while True:
        (events, next_revision, revision), index = store.replica.read(
            partial(_collect_at, prefix=prefix, from_revision=next_revision, limit=limit)
        )
        remaining_s = deadline_s - loop.time()
        if events or remaining_s <= 0 or node.stopping.is_set():
            return events, next_revision, revision
        await store.wait_applied(index, timeout_s=min(remaining_s, 1.0))


def _sse(event: str | None, data: Any, *, event_id: int | None = None) -> bytes:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append("data: " + msgspec.json.encode(data).decode())
    return ("\n".join(lines) + "\n\n").encode()


async def _stream(
    request: web.Request, caller: Principal, prefix: str, start: int
) -> web.StreamResponse:
    node = services(request)
    with stream_slot(request):
        # The first read goes through the barrier and raises before the stream starts (a 410
        # or a 503 is then an ordinary error answer).
        result = await read(request, lambda machine: _collect(machine, prefix, start, _SSE_BATCH))
        return await _follow(request, caller, prefix, node, result.value)


async def _follow(
    request: web.Request,
    caller: Principal,
    prefix: str,
    node: Services,
    first: tuple[list[dict[str, Any]], int, int],
) -> web.StreamResponse:
    response = await open_event_stream(request)
    events, next_revision, _ = first
    store = node.store
    loop = asyncio.get_running_loop()
    last_sent_s = loop.time()
    while True:
        if not still_authorized(request, caller):
            revoked = Unauthenticated(
                "the token this stream was opened with was revoked or now stands for another "
                "role or tenant; open the stream again"
            )
            await write_to_stream(request, response, _sse("error", revoked.to_dict()))
            break
        for event in events:
            await write_to_stream(
                request,
                response,
                _sse(
                    "put" if event["kind"] == "put" else "delete",
                    _event_view(caller, event),
                    event_id=event["revision"],
                ),
            )
            last_sent_s = loop.time()
        if node.stopping.is_set():
            break
        if loop.time() - last_sent_s >= _SSE_KEEPALIVE_S:
            await write_to_stream(request, response, b": keepalive\n\n")
            last_sent_s = loop.time()
        index = store.replica.read(lambda machine: machine.index)
        await store.wait_applied(index, timeout_s=1.0)
        try:
            (events, next_revision, _), _ = store.replica.read(
                partial(_collect_at, prefix=prefix, from_revision=next_revision, limit=_SSE_BATCH)
            )
        except XrError as error:
            # The watcher fell behind the retained history.
            await write_to_stream(request, response, _sse("error", error.to_dict()))
            break
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response
