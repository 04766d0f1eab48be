"""The HTTP API's application factory, its middleware and the helpers every handler uses.

`create_app(config, store=..., clock=...)` builds the aiohttp application with every dependency
injected; `node.daemon` builds the real ones. One middleware does, in order: a request id, the
caller's identity and the route's rule (`node.api.auth.ROUTE_RULES`: 401 or 403 before the
handler runs), the error mapping (`{"error": {"code", "message", "definite"}}` with the status of
the error's class; 429 and 503 carry `Retry-After`), metrics, an access log line and, for a
write, an audit line (`node.api.audit`). Handlers stay thin: parse, call `write` or `read`, shape
the answer.

SIGHUP makes the node read `auth.tokens_file` again (installed when the application starts on
the main thread, as `node.daemon` runs it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import secrets
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from node.api.audit import READ_METHODS, AuditLog
from node.api.auth import Access, Authenticator, Permission, Principal, rule_for
from node.api.wire import BODY_TIMEOUT_S, STREAM_WRITE_TIMEOUT_S, respond
from node.config import NodeConfig
from node.metrics import NodeMetrics
from raftstore.clock import Clock, RealClock
from raftstore.faults import Fault, acknowledge_before_commit
from raftstore.store import RaftStore, ReadResult
from xrcore import StateMachine
from xrcore._validate import NAME_BYTES_MAX, NAME_PATTERN
from xrcore.codec import SEQ_MAX
from xrcore.commands import Command
from xrcore.errors import (
    CapacityExceeded,
    Forbidden,
    InvalidArgument,
    PayloadTooLarge,
    XrError,
)

__all__ = [
    "CLIENT_ID_HEADER",
    "INDEX",
    "INDEX_HEADER",
    "PRINCIPAL",
    "REQUEST_ID_HEADER",
    "SEQ_HEADER",
    "SERVICES",
    "Services",
    "create_app",
    "principal",
    "read",
    "services",
    "still_authorized",
    "stream_slot",
    "waiting_slot",
    "write",
]

log = logging.getLogger("xr.http")
access_log = logging.getLogger("xr.access")
T = TypeVar("T")

CLIENT_ID_HEADER = "Xr-Client-Id"
SEQ_HEADER = "Xr-Seq"
REQUEST_ID_HEADER = "Xr-Request-Id"
INDEX_HEADER = "Xr-Index"
# Open without a token while auth.open_health is set (`Access.OPEN_HEALTH` in
# `node.api.auth.ROUTE_RULES`, which decides; admission control reads this set).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass
class Services:
    config: NodeConfig
    store: RaftStore
    clock: Clock
    auth: Authenticator
    metrics: NodeMetrics
    # Open while the application runs, when audit.enabled.
    audit: AuditLog | None = None
    waiting: int = 0
    streams: int = 0
    # The same, by tenant (only tenants holding some).
    waiting_by_tenant: collections.Counter[str] = field(default_factory=collections.Counter)
    streams_by_tenant: collections.Counter[str] = field(default_factory=collections.Counter)
    # Set on SIGTERM: new waits are refused, running ones end early.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Work that outlives its request (leaving a lock queue after the client went away).
    background: set[asyncio.Task[Any]] = field(default_factory=set)

    # Request ids: a random prefix per node process and a counter, unique and cheap (a random
    # id per request cost 1-3% of a busy node's CPU in the system's random source).
    request_id_prefix: str = field(default_factory=lambda: secrets.token_hex(4))
    request_counter: itertools.count[int] = field(default_factory=itertools.count)

    def next_request_id(self) -> str:
        return f"{self.request_id_prefix}-{next(self.request_counter)}"

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


SERVICES = web.AppKey("services", Services)
PRINCIPAL = web.RequestKey("principal", Principal)
# The log index a read or write saw, answered in the Xr-Index header.
INDEX = web.RequestKey("index", int)
# Set when the state machine applied the request's command and refused it: its refusal is stored
# under the request's idempotency key, so a retry gets the same one and no `Retry-After` is sent.
REFUSED_IN_THE_LOG = web.RequestKey("refused_in_the_log", bool)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]


def principal(request: web.Request, permission: Permission = Permission.DATA) -> Principal:
    caller = request[PRINCIPAL]
    caller.require(permission)
    return caller


def still_authorized(request: web.Request, caller: Principal) -> bool:
    """Whether the request's token still stands for `caller` (an event stream asks once a
    second). A token removed from the tokens file, or given another role or tenant, is refused
    from the next request on; an open stream would otherwise go on sending what it no longer
    may read."""
    try:
        return services(request).auth.authenticate(request) == caller
    except XrError:
        return False


# Writes and reads.


def _idempotency(request: web.Request, caller: Principal) -> tuple[str | None, int | None]:
    client_id = request.headers.get(CLIENT_ID_HEADER)
    seq_text = request.headers.get(SEQ_HEADER)
    if client_id is None and seq_text is None:
        return None, None
    if client_id is None or seq_text is None:
        raise InvalidArgument(f"{CLIENT_ID_HEADER} and {SEQ_HEADER} must be sent together")
    try:
        seq: int | None = int(seq_text)
    except ValueError:
        seq = None
    # Checked here, not only in the envelope, so the message names the header the caller sent.
    if seq is None or not 1 <= seq <= SEQ_MAX:
        raise InvalidArgument(
            f"{SEQ_HEADER} must be an integer from 1 to {SEQ_MAX}, got {seq_text!r}"
        )
    if not client_id or NAME_PATTERN.fullmatch(client_id) is None:
        raise InvalidArgument(
            f"{CLIENT_ID_HEADER} must start with a letter or digit and contain only letters, "
            f"digits and . _ : @ / -, got {client_id[:80]!r}"
        )
    scoped = caller.scoped(client_id)
    if len(scoped.encode()) > NAME_BYTES_MAX:
        raise InvalidArgument(
            f"{CLIENT_ID_HEADER} is too long: with the tenant prefix it must fit "
            f"{NAME_BYTES_MAX} bytes"
        )
    # Clients live in their tenant's namespace: one tenant cannot read another's stored results.
    return scoped, seq


async def write(request: web.Request, command: Command, *, idempotent: bool = True) -> Any:
    """Proposes a command with the request's idempotency key and returns its result's value, or
    raises its typed error. Any node takes writes: pysyncobj forwards them to the leader."""
    store = services(request).store
    caller = request[PRINCIPAL]
    client_id, seq = _idempotency(request, caller) if idempotent else (None, None)
    if store.faults.active(Fault.ACK_BEFORE_COMMIT):
        applied = await acknowledge_before_commit(store, command, client_id=client_id, seq=seq)
    else:
        applied = await store.propose(command, client_id=client_id, seq=seq)
    request[INDEX] = applied.index
    if applied.result.error is not None:
        request[REFUSED_IN_THE_LOG] = True
    return applied.result.unwrap()


def consistency(request: web.Request) -> str:
    value = request.query.get("consistency", "linearizable")
    if value not in ("linearizable", "stale"):
        raise InvalidArgument(f"consistency must be linearizable or stale, not {value!r}")
    return value


async def read(request: web.Request, query: Callable[[StateMachine], T]) -> ReadResult:
    """A read after a barrier committed through the log, or a local read when the request says
    `consistency=stale` (the answer then says `"stale": true`)."""
    result = await services(request).store.read(
        query,
        consistency="stale" if consistency(request) == "stale" else "linearizable",
    )
    request[INDEX] = result.index
    return result


@contextlib.asynccontextmanager
async def waiting_slot(request: web.Request) -> AsyncIterator[None]:
    """A place among the requests allowed to wait (lock waits, long polls); 429 beyond the
    node's bound or the caller's tenant's share of it."""
    http = services(request).config.http
    with _place(
        request,
        "waiting",
        http.waiting_requests_max,
        http.waiting_requests_per_tenant_max,
        ("requests", "are already waiting", "http.waiting_requests_per_tenant_max"),
    ):
        yield


def stream_slot(request: web.Request) -> contextlib.AbstractContextManager[None]:
    """A place among the open event streams; 429 beyond the node's bound or the caller's
    tenant's share of it."""
    http = services(request).config.http
    return _place(
        request,
        "streams",
        http.streams_max,
        http.streams_per_tenant_max,
        ("event streams", "are open", "http.streams_per_tenant_max"),
    )


@contextlib.contextmanager
def _place(
    request: web.Request,
    kind: Literal["waiting", "streams"],
    limit: int,
    share: int,
    words: tuple[str, str, str],
) -> Iterator[None]:
    """One of the node's `limit` places of a kind (`Services.waiting`, `Services.streams`), at
    most `share` of them the caller's tenant's."""
    node = services(request)
    by_tenant = node.waiting_by_tenant if kind == "waiting" else node.streams_by_tenant
    tenant = _share_holder(request, node)
    things, are, setting = words
    if getattr(node, kind) >= limit:
        raise CapacityExceeded(f"{limit} {things} {are} on this node; retry later")
    if tenant is not None and by_tenant[tenant] >= share:
        raise CapacityExceeded(
            f"{share} {things} of tenant {tenant!r} {are} on this node ({setting}); retry later"
        )
    setattr(node, kind, getattr(node, kind) + 1)
    if tenant is not None:
        by_tenant[tenant] += 1
    try:
        yield
    finally:
        setattr(node, kind, getattr(node, kind) - 1)
        if tenant is not None:
            by_tenant[tenant] -= 1
            if by_tenant[tenant] <= 0:
                del by_tenant[tenant]


def _share_holder(request: web.Request, node: Services) -> str | None:
    """The tenant whose share a wait or a stream counts against: None with authentication
    off, where every request is the same anonymous caller and only the node's bound applies."""
    caller = request.get(PRINCIPAL)
    if not node.auth.enabled or not isinstance(caller, Principal):
        return None
    return caller.tenant


def wait_s(request: web.Request, requested_s: float) -> float:
    """The wait a request asked for (`wait_s`, seconds), at most `http.wait_max_s`. A lock wait
    or a long poll may always end sooner than asked (an event, the node stopping), so a longer
    one is served as the longest this node allows rather than refused (as Consul serves its
    blocking queries): the answer says the wait ended, and a client that wants longer asks
    again, as xr's client does. Refused: a negative or not-a-number wait."""
    if not requested_s >= 0:
        raise InvalidArgument(f"wait_s must be a number of seconds, 0 or more, got {requested_s}")
    return min(requested_s, services(request).config.http.wait_max_s)


def query_wait_s(request: web.Request) -> float:
    """`wait_s` from the query string (default 0), as `wait_s` serves it."""
    text = request.query.get("wait_s")
    if text is None:
        return 0.0
    try:
        requested_s = float(text)
    except ValueError:
        raise InvalidArgument(f"query parameter wait_s must be a number, got {text!r}") from None
    return wait_s(request, requested_s)


# Middleware.


def _route_name(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def _error_response(request: web.Request, error: XrError, status: int) -> web.Response:
    document = error.to_dict()
    caller = request.get(PRINCIPAL)
    if isinstance(caller, Principal):
        # The core names keys and locks as stored, `'<tenant>/name'`; show the caller its own
        # names. Only the caller's own prefix is removed, so nothing of another tenant shows.
        document["message"] = str(document["message"]).replace(f"'{caller.prefix}", "'")
    response = respond(request, {"error": document}, status=status)
    if status in (429, 503) and not request.get(REFUSED_IN_THE_LOG, False):
        response.headers["Retry-After"] = "1"
    return response


def _http_error(request: web.Request, error: web.HTTPException) -> tuple[web.Response, str]:
    code = {
        404: "not_found",
        405: "request.method_not_allowed",
        413: "limit.payload_too_large",
    }.get(error.status, "request.invalid")
    message = {
        404: f"no route {request.path}; the API is described at /v1/openapi.json",
        405: f"{request.method} is not allowed on {request.path}",
        413: "the request body is larger than this node accepts "
        f"({services(request).config.http.body_bytes_max} bytes)",
    }.get(error.status, error.reason)
    response = respond(
        request,
        {"error": {"code": code, "message": message, "definite": True}},
        status=error.status,
    )
    if isinstance(error, web.HTTPMethodNotAllowed):
        response.headers["Allow"] = ", ".join(sorted(error.allowed_methods))
    return response, code


def _refuse_cross_origin_writes(request: web.Request) -> None:
    """A write a web page of another origin sent (a browser names the page's origin in
    `Origin`): refused, Forbidden. With authentication off any page the user opened could
    otherwise submit, cancel or take locks on a node the browser reaches (cross-site request
    forgery: a form's POST needs no preflight). The dashboard reads only, and the client, the
    CLI and other programs send no `Origin`."""
    origin = request.headers.get("Origin")
    if origin is None or request.method in READ_METHODS:
        return
    if urlsplit(origin).netloc.lower() != request.host.lower():
        raise Forbidden(
            f"a write from a web page of another origin ({origin[:200]!r}) is refused: this "
            "node takes writes from programs, which send no Origin header"
        )


def _authorize(request: web.Request, node: Services) -> None:
    """Who is calling, and whether the route lets them: before the handler, for every route."""
    _refuse_cross_origin_writes(request)
    rule = rule_for(request)
    if rule is Access.PUBLIC or (rule is Access.OPEN_HEALTH and node.auth.open_health):
        return
    caller = node.auth.authenticate(request)
    request[PRINCIPAL] = caller
    if isinstance(rule, Permission):
        caller.require(rule)


def _audit(
    request: web.Request,
    node: Services,
    *,
    status: int | None,
    error: str | None,
    request_id: str,
    index: int | None,
) -> None:
    if node.audit is None or request.method in READ_METHODS:
        return
    caller = request.get(PRINCIPAL)
    node.audit.record(
        principal=caller if isinstance(caller, Principal) else None,
        method=request.method,
        path=request.path,
        route=_route_name(request),
        status=status,
        error=error,
        request_id=request_id,
        remote=request.remote,
        index=index,
    )


@web.middleware
async def _middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    node = services(request)
    request_id = request.headers.get(REQUEST_ID_HEADER) or node.next_request_id()
    if len(request_id) > 64:
        request_id = request_id[:64]
    started_s = time.perf_counter()
    response: web.StreamResponse
    error_code: str | None = None
    try:
        _authorize(request, node)
        response = await handler(request)
    except XrError as error:
        error_code = error.code
        response = _error_response(request, error, error.http_status)
    except web.HTTPRequestEntityTooLarge:
        too_large = PayloadTooLarge(
            f"the request body is larger than this node's maximum of "
            f"{node.config.http.body_bytes_max} bytes (http.body_bytes_max)"
        )
        error_code = too_large.code
        response = _error_response(request, too_large, 413)
    except web.HTTPException as error:
        response, error_code = _http_error(request, error)
    except (asyncio.CancelledError, ConnectionResetError):
        # The client went away: the write may still have been applied, so it is audited.
        _audit(
            request,
            node,
            status=None,
            error="request.cancelled",
            request_id=request_id,
            index=request.get(INDEX),
        )
        raise
    except Exception:
        error_code = "xr.internal"
        log.exception(
            "request %s %s failed (request id %s)", request.method, request.path, request_id
        )
        response = respond(
            request,
            {
                "error": {
                    "code": "xr.internal",
                    "message": f"internal error; the node's log has it under request id "
                    f"{request_id}",
                    "definite": False,
                }
            },
            status=500,
        )
    duration_s = time.perf_counter() - started_s
    if not response.prepared:
        response.headers[REQUEST_ID_HEADER] = request_id
        if INDEX in request:
            response.headers[INDEX_HEADER] = str(request[INDEX])
    _audit(
        request,
        node,
        status=response.status,
        error=error_code,
        request_id=request_id,
        index=request.get(INDEX),
    )
    route = _route_name(request)
    node.metrics.observe(route, request.method, response.status, duration_s)
    if access_log.isEnabledFor(logging.DEBUG) or response.status >= 500:
        access_log.log(
            logging.WARNING if response.status >= 500 else logging.DEBUG,
            "%s %s %d %.1f ms",
            request.method,
            request.path,
            response.status,
            duration_s * 1000,
            extra={"request_id": request_id, "route": route},
        )
    return response


# The application.


async def _audit_log(app: web.Application) -> AsyncIterator[None]:
    node = app[SERVICES]
    if node.config.audit.enabled:
        node.audit = AuditLog(
            node.config.audit_path,
            bytes_max=node.config.audit.bytes_max,
            files_max=node.config.audit.files_max,
            clock=node.clock,
        )
        # Left attached when the log closes, so the count does not fall back to 0.
        node.metrics.audit = node.audit
    try:
        yield
    finally:
        if node.audit is not None:
            node.audit.close()
            node.audit = None


# The authenticators of the applications running on the main thread's loop.
_HANGUP_LISTENERS: set[Authenticator] = set()


async def _reload_tokens_on_hangup(app: web.Application) -> AsyncIterator[None]:
    """SIGHUP reads auth.tokens_file again. Signal handlers belong to the main thread's loop, so
    an application served elsewhere (tests) has none; one loop handler serves every
    application of the process."""
    auth = app[SERVICES].auth
    hangup = getattr(signal, "SIGHUP", None)
    main_thread = threading.current_thread() is threading.main_thread()
    if auth.tokens_file is None or hangup is None or not main_thread:
        yield
        return
    loop = asyncio.get_running_loop()
    if not _HANGUP_LISTENERS:
        loop.add_signal_handler(hangup, _hangup)
    _HANGUP_LISTENERS.add(auth)
    try:
        yield
    finally:
        _HANGUP_LISTENERS.discard(auth)
        if not _HANGUP_LISTENERS:
            loop.remove_signal_handler(hangup)


def _hangup() -> None:
    log.info("SIGHUP: reading auth.tokens_file again")
    for auth in list(_HANGUP_LISTENERS):
        auth.reload()


def create_app(
    config: NodeConfig,
    *,
    store: RaftStore,
    clock: Clock | None = None,
) -> web.Application:
    from node.api import (
        admission,
        cluster,
        health,
        jobs,
        kv,
        locks,
        openapi,
        params,
        sessions,
        snapshot,
        tenants,
        ui,
        watch,
    )

    app = web.Application(
        middlewares=[_middleware, params.middleware, admission.middleware],
        client_max_size=config.http.body_bytes_max,
    )
    clock = clock or RealClock()
    app[SERVICES] = Services(
        config=config,
        store=store,
        clock=clock,
        # Raises ConfigError for an invalid auth.tokens_file: the node does not start.
        auth=Authenticator(config.auth, clock=clock),
        metrics=NodeMetrics(store, config.region.name),
    )
    app[BODY_TIMEOUT_S] = config.http.request_timeout_s
    app[STREAM_WRITE_TIMEOUT_S] = config.http.stream_write_timeout_s
    app.cleanup_ctx.append(_audit_log)
    app.cleanup_ctx.append(_reload_tokens_on_hangup)
    for module in (
        health,
        kv,
        sessions,
        locks,
        jobs,
        cluster,
        snapshot,
        tenants,
        watch,
        openapi,
        ui,
    ):
        app.router.add_routes(module.routes)
    if getattr(store, "drops", None) is not None:
        # Test runs only (`raftstore.testnet`): not part of the API or its document.
        from node.api import testnet

        app.router.add_routes(testnet.routes)
    return app
