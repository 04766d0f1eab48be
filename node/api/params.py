"""Query parameters a route does not take are refused, not ignored.

aiohttp hands every handler the whole query string, and a handler reads only the parameters it
knows, so a misspelt one was silently dropped: `DELETE /v1/kv/k?expected_mod_revison=3` deleted
the key unconditionally. Found by the Schemathesis run (tests/node/test_schemathesis.py). Each
route's query parameters are those the OpenAPI document declares for it (`node.api.openapi`), so
the document and the check cannot disagree; anything else answers 400 `request.invalid` naming
the parameter before the handler runs. Routes outside the document (the dashboard's files, test
routes) are not checked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache

from aiohttp import web

from xrcore.errors import InvalidArgument

__all__ = ["allowed_query_parameters", "middleware"]


@cache
def allowed_query_parameters() -> dict[tuple[str, str], frozenset[str]]:
    """(method, path template) -> the query parameter names the document declares."""
    from node.api.openapi import OPERATIONS, parameter_table

    table = parameter_table()
    allowed: dict[tuple[str, str], frozenset[str]] = {}
    for operation in OPERATIONS:
        names = frozenset(
            table[key]["name"] for key in operation.parameters if table[key]["in"] == "query"
        )
        allowed[(operation.method.upper(), operation.path)] = names
    return allowed


@web.middleware
async def middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.query:
        resource = request.match_info.route.resource
        method = "GET" if request.method == "HEAD" else request.method
        if resource is not None:
            allowed = allowed_query_parameters().get((method, resource.canonical))
            if allowed is not None:
                unknown = sorted(set(request.query) - allowed)
                if unknown:
                    takes = ", ".join(sorted(allowed)) or "none"
                    raise InvalidArgument(
                        f"unknown query parameter {', '.join(repr(name) for name in unknown)}; "
                        f"{method} {resource.canonical} takes: {takes}"
                    )
    return await handler(request)
