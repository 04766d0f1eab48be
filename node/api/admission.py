"""Admission control: at most `http.requests_in_flight_max` requests are handled at once.

Under overload a node that queues every request makes every answer late, health checks included,
until clients time out and retry and the work done is wasted. This middleware refuses the excess
at once instead: a request beyond the bound gets 429 with `Retry-After` (`CapacityExceeded`, whose
message names the setting), and the admitted ones keep a bounded latency. Refusal is definite:
nothing was proposed, so the client may retry (`xrcore.client` does, within its deadline).

A request's body is received before the request is admitted (`node.api.wire.receive_body`, within
`http.request_timeout_s`): the bound is on work being done, and a client uploading slowly (across
an ocean, or on purpose) would otherwise hold a place for as long as its body took. Bodies being
received have a bound of their own, `http.bodies_arriving_max` (429 beyond it, naming the
setting), which bounds the memory they take. Requests without a body skip that step, so reads
keep being answered while slow uploads fill it (as do `/healthz`, `/readyz` and `/metrics`, whose
bodies, if any, are not read).

Not counted and never refused here, because they have bounds of their own or must answer under
overload (decided by route and query, before the handler runs):

- `/healthz`, `/readyz` and `/metrics`: an orchestrator must see an overloaded node as alive;
- `/v1/ui/events` and `/v1/watch` with `Accept: text/event-stream`: streams, `http.streams_max`;
- `/v1/watch` and `GET /v1/jobs/{job_id}` with a `wait_s` query above 0: long polls, bounded by
  `http.waiting_requests_max` (`node.api.app.waiting_slot`);
- `POST /v1/locks/{name}/acquire`, with a wait or without: whether it waits is in its body, which
  the handler checks, so the route is decided as a whole. A wait has the bound above; an acquire
  without one is a single proposal, bounded by `raft.proposals_in_flight_max` (429 `Overloaded`).

Everything else counts, unknown routes included (they are cheap, and counting them keeps the rule
simple). The counts are `NodeMetrics.requests_in_flight` and `NodeMetrics.bodies_arriving` (the
`xr_http_requests_in_flight` and `xr_http_bodies_arriving` gauges); each is given back in a
`finally`, so errors and cancellation (a client that went away) never leak a place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from node.api.app import OPEN_PATHS, Services, services
from node.api.wire import receive_body
from xrcore.errors import CapacityExceeded

__all__ = ["middleware"]

# Routes (aiohttp's canonical form) that are never counted, whatever the query.
_UNCOUNTED_ROUTES = OPEN_PATHS | {"/v1/ui/events", "/v1/locks/{name}/acquire"}
# Routes that are long polls when their query asks for a wait.
_LONG_POLL_ROUTES = frozenset({("GET", "/v1/watch"), ("GET", "/v1/jobs/{job_id}")})


def _route(request: web.Request) -> tuple[str, str]:
    resource = request.match_info.route.resource
    return request.method, resource.canonical if resource is not None else ""


def _positive(value: object) -> bool:
    """Whether a `wait_s` value asks for a wait. Anything malformed counts as no wait: the handler
    refuses it with a 400, and until then the request is counted like any other."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        return float(value) > 0
    except ValueError:
        return False


def _has_own_bound(request: web.Request, route: tuple[str, str]) -> bool:
    """Whether the request is one that is not counted, decided by its route, query and headers."""
    canonical = route[1]
    if canonical in _UNCOUNTED_ROUTES:
        return True
    if canonical == "/v1/watch" and "text/event-stream" in request.headers.get("Accept", ""):
        return True
    return route in _LONG_POLL_ROUTES and _positive(request.query.get("wait_s"))


async def _receive(request: web.Request, node: Services) -> None:
    """Receives the request's body under `http.bodies_arriving_max`."""
    metrics = node.metrics
    limit = node.config.http.bodies_arriving_max
    if metrics.bodies_arriving >= limit:
        raise CapacityExceeded(
            f"{limit} request bodies are already being received by this node "
            f"(http.bodies_arriving_max); retry later"
        )
    metrics.bodies_arriving += 1
    try:
        await receive_body(request)
    finally:
        metrics.bodies_arriving -= 1


@web.middleware
async def middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    node = services(request)
    route = _route(request)
    # Health checks and metrics take no body; one sent with them is left unread, never refused.
    if request.body_exists and route[1] not in OPEN_PATHS:
        await _receive(request, node)
    if _has_own_bound(request, route):
        return await handler(request)
    metrics = node.metrics
    limit = node.config.http.requests_in_flight_max
    if metrics.requests_in_flight >= limit:
        raise CapacityExceeded(
            f"{limit} requests are already being handled on this node "
            f"(http.requests_in_flight_max); retry later"
        )
    metrics.requests_in_flight += 1
    try:
        return await handler(request)
    finally:
        metrics.requests_in_flight -= 1
