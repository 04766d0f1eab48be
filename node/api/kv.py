"""KV: get, put (with compare-and-set), delete and range, in the caller's tenant namespace."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from node.api.app import principal, read, write
from node.api.auth import Principal
from node.api.wire import (
    bytes_fields,
    field,
    query_int,
    query_text,
    read_body,
    reject_unknown,
    respond,
    value_from_body,
)
from xrcore import kv
from xrcore.commands import KvDelete, KvPut
from xrcore.errors import InvalidArgument
from xrcore.limits import KEY_BYTES_MAX, RANGE_LIMIT_MAX

__all__ = ["key_view", "routes"]

routes = web.RouteTableDef()
_PUT_FIELDS = frozenset({"value", "value_base64", "expected_mod_revision", "session_id"})


def key_view(caller: Principal, view: dict[str, Any]) -> dict[str, Any]:
    shown = dict(view)
    shown["key"] = caller.unscoped(view["key"])
    shown.update(bytes_fields(view["value"]))
    return shown


def _key(request: web.Request, caller: Principal) -> str:
    key = request.match_info["key"]
    if not key:
        raise InvalidArgument("the key must not be empty")
    if len(caller.scoped(key).encode()) > KEY_BYTES_MAX:
        raise InvalidArgument(
            f"the key is too long: with the tenant prefix it must fit {KEY_BYTES_MAX} bytes"
        )
    return caller.scoped(key)


# A key is any text: slashes and line breaks included (`.` would not match a newline, and such a
# key answered 404; found by tests/node/test_schemathesis.py).
_KEY = r"{key:[\s\S]+}"


@routes.get(f"/v1/kv/{_KEY}")
async def get_key(request: web.Request) -> web.Response:
    caller = principal(request)
    key = _key(request, caller)
    result = await read(request, lambda machine: kv.get(machine, key))
    return respond(request, {**key_view(caller, result.value), "stale": result.stale})


@routes.put(f"/v1/kv/{_KEY}")
async def put_key(request: web.Request) -> web.Response:
    caller = principal(request)
    key = _key(request, caller)
    body = await read_body(request)
    reject_unknown(body, _PUT_FIELDS)
    from node.api.sessions import own_session

    session_id = field(body, "session_id", str, default=None, nullable=True)
    if session_id is not None:
        await own_session(request, caller, session_id)
    command = KvPut(
        key=key,
        value=value_from_body(body),
        expected_mod_revision=field(
            body, "expected_mod_revision", int, default=None, nullable=True
        ),
        session_id=session_id,
    )
    return respond(request, await write(request, command))


@routes.delete(f"/v1/kv/{_KEY}")
async def delete_key(request: web.Request) -> web.Response:
    caller = principal(request)
    key = _key(request, caller)
    expected = query_int(request, "expected_mod_revision", low=0)
    result = await write(request, KvDelete(key=key, expected_mod_revision=expected))
    return respond(request, result)


@routes.get("/v1/kv")
async def range_keys(request: web.Request) -> web.Response:
    caller = principal(request)
    prefix = caller.scoped(query_text(request, "prefix", default="") or "")
    after_text = query_text(request, "after")
    after = None if after_text is None else caller.scoped(after_text)
    limit = query_int(request, "limit", default=100, low=1, high=RANGE_LIMIT_MAX)
    assert limit is not None
    result = await read(
        request, lambda machine: kv.range_(machine, prefix, limit=limit, after=after)
    )
    page = result.value
    return respond(
        request,
        {
            "revision": page["revision"],
            "items": [key_view(caller, item) for item in page["items"]],
            "next": None if page["next"] is None else caller.unscoped(page["next"]),
            "stale": result.stale,
        },
    )
