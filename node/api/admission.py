"""Admission control: at most `http.requests_in_flight_max` requests are handled at once.

Under overload a node that queues every request makes every answer late, health checks included,
until clients time out and retry and the work done is wasted. This middleware refuses the excess
at once instead: a request beyond the bound gets 429 with `Retry-After` (`CapacityExceeded`, whose
message names the setting), and the admitted ones keep a bounded latency. Refusal is definite:
nothing was proposed, so the client may retry (`xrcore.client` does, within its deadline).

Not counted and never refused here, because they have bounds of their own or must answer under
overload (decided by route and query, before the handler runs):

- `/healthz`, `/readyz` and `/metrics`: an orchestrator must see an overloaded node as alive;
- `/v1/ui/events` and `/v1/watch` with `Accept: text/event-stream`: streams, `http.streams_max`;
- `/v1/watch` and `GET /v1/jobs/{job_id}` with a `wait_s` query above 0: long polls, bounded by
  `http.waiting_requests_max` (`node.api.app.waiting_slot`);
- `POST /v1/locks/{name}/acquire`, with a wait or without: whether it waits is in its body, which
  only the handler may read (`node.api.wire.read_body` refuses a body already read), so the route
  is decided as a whole. A wait has the bound above; an acquire without one is a single proposal,
  bounded by `raft.proposals_in_flight_max` (429 `Overloaded`).

Everything else counts, unknown routes included (they are cheap, and counting them keeps the rule
simple). The count is `NodeMetrics.requests_in_flight` (the `xr_http_requests_in_flight` gauge);
it is given back in a `finally`, so errors and cancellation (a client that went away) never leak
a place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from node.api.app import OPEN_PATHS, services
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


@web.middleware
async def middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    route = _route(request)
    if _has_own_bound(request, route):
        return await handler(request)
    node = services(request)
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
