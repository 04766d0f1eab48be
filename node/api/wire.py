"""Request and response bodies: JSON by default, msgpack when the client asks for it.

A request body is msgpack when its `Content-Type` is `application/msgpack` (or `x-msgpack`), JSON
otherwise; a response is msgpack when `Accept` names msgpack, JSON otherwise. Both encodings carry
the same document. Bytes (KV values) travel as base64 text in `value_base64`, with `value` as UTF-8
text beside it when the bytes are valid UTF-8, so a shell user reads values without decoding.
Query parameters are parsed here, each with a message naming the parameter.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web

from xrcore.errors import BodyTimeout, InvalidArgument, PayloadTooLarge

__all__ = [
    "BODY_TIMEOUT_S",
    "MSGPACK",
    "STREAM_WRITE_TIMEOUT_S",
    "bytes_fields",
    "field",
    "open_event_stream",
    "query_bool",
    "query_float",
    "query_int",
    "query_text",
    "read_body",
    "receive_body",
    "reject_unknown",
    "respond",
    "value_from_body",
    "wants_msgpack",
    "write_to_stream",
]

MSGPACK = "application/msgpack"
_MSGPACK_TYPES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})
_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()
# How long a request's body may take to arrive once its handler reads it (`http.request_timeout_s`;
# set by `node.api.app.create_app`). A body sent slowly, or announced and never sent, would
# otherwise hold its connection and its place among the requests in flight for ever.
BODY_TIMEOUT_S = web.AppKey("body_timeout_s", float)
_BODY_TIMEOUT_S_DEFAULT = 10.0
# How long a write to an event stream may wait for its client to take data
# (`http.stream_write_timeout_s`; set by `node.api.app.create_app`).
STREAM_WRITE_TIMEOUT_S = web.AppKey("stream_write_timeout_s", float)
_STREAM_WRITE_TIMEOUT_S_DEFAULT = 30.0
# A body once received (`receive_body`): the handler's read takes it without another timer.
_RECEIVED = web.RequestKey("received_body", bytes)


def wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return any(kind.split(";")[0].strip() in _MSGPACK_TYPES for kind in accept.split(","))


# Every answer of the API: its type is the one it says (a browser must not sniff a JSON error
# that repeats a query string as HTML), and nothing of it is stored by a browser or a proxy (it
# is one caller's data, read with its token).
_ANSWER_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def respond(request: web.Request, document: Any, *, status: int = 200) -> web.Response:
    if wants_msgpack(request):
        return web.Response(
            body=_msgpack_encoder.encode(document),
            status=status,
            content_type=MSGPACK,
            headers=_ANSWER_HEADERS,
        )
    return web.Response(
        body=_json_encoder.encode(document) + b"\n",
        status=status,
        content_type="application/json",
        headers=_ANSWER_HEADERS,
    )


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    """A Server-Sent Events answer, its headers sent (not stored, no proxy buffering)."""
    response = web.StreamResponse(
        headers={
            **_ANSWER_HEADERS,
            "Content-Type": "text/event-stream",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    return response


async def write_to_stream(request: web.Request, response: web.StreamResponse, data: bytes) -> None:
    """Writes to an event stream. A write that waits `STREAM_WRITE_TIMEOUT_S` for the client to
    take data (its connection open, the buffers full) cuts the client off: the connection is
    aborted and ConnectionResetError raised, as for a client that went away, so the stream's place
    is freed."""
    timeout_s = request.app.get(STREAM_WRITE_TIMEOUT_S, _STREAM_WRITE_TIMEOUT_S_DEFAULT)
    try:
        async with asyncio.timeout(timeout_s):
            await response.write(data)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError(
            f"the client took no data from its event stream for {timeout_s:g} s "
            "(http.stream_write_timeout_s)"
        ) from None


async def receive_body(request: web.Request) -> bytes:
    """The request body's bytes as sent. aiohttp keeps them once read, so the admission
    middleware receives a body before its request is admitted and the handler reads the same
    bytes. The size limit is aiohttp's `client_max_size` (413 from the error middleware); a body
    that has not arrived within `BODY_TIMEOUT_S` is 408."""
    if _RECEIVED in request:
        return request[_RECEIVED]
    timeout_s = request.app.get(BODY_TIMEOUT_S, _BODY_TIMEOUT_S_DEFAULT)
    try:
        async with asyncio.timeout(timeout_s):
            received = await request.read()
    except TimeoutError:
        raise BodyTimeout(
            f"the request body did not arrive within {timeout_s:g} s (http.request_timeout_s)"
        ) from None
    request[_RECEIVED] = received
    return received


async def read_body(request: web.Request, *, required: bool = True) -> dict[str, Any]:
    """The request body as a mapping (`receive_body`); a body that is not an object is 400. A
    compressed body is refused: the node does not decompress request bodies (a small one can
    expand without end)."""
    if not request.body_exists:
        if required:
            raise InvalidArgument("the request needs a body (a JSON object)")
        return {}
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise InvalidArgument(
            f"request bodies are not accepted compressed (Content-Encoding: {encoding}); send "
            "it as is"
        )
    data = await receive_body(request)
    kind = request.content_type
    name = "msgpack" if kind in _MSGPACK_TYPES else "JSON"
    try:
        document = (
            msgspec.msgpack.decode(data) if kind in _MSGPACK_TYPES else msgspec.json.decode(data)
        )
    except msgspec.DecodeError as error:
        raise InvalidArgument(f"the request body is not valid {name}: {error}") from None
    except RecursionError:
        raise InvalidArgument(f"the request body is not valid {name}: nested too deeply") from None
    if not isinstance(document, dict):
        raise InvalidArgument(f"the request body must be an object, not {type(document).__name__}")
    # msgpack maps may have keys of any type; every field name is text.
    if not all(isinstance(name, str) for name in document):
        raise InvalidArgument("the request body's keys must all be strings (field names)")
    return document


def reject_unknown(body: Mapping[str, Any], allowed: frozenset[str] | set[str]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidArgument(
            f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def field(
    body: Mapping[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    *,
    default: Any = ...,
    nullable: bool = False,
) -> Any:
    """A body field of the given type; `InvalidArgument` naming the field otherwise."""
    if name not in body:
        if default is ...:
            raise InvalidArgument(f"field {name!r} is required")
        return default
    value = body[name]
    if value is None and nullable:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; a JSON true is not a number.
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidArgument(f"field {name!r} must be {_kind_names(kinds)}, not a boolean")
    if not isinstance(value, kinds):
        if float in kinds and isinstance(value, int):
            return float(value)
        raise InvalidArgument(
            f"field {name!r} must be {_kind_names(kinds)}, not {type(value).__name__}"
        )
    return value


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        dict: "an object",
        list: "a list",
        bytes: "bytes",
    }
    return " or ".join(names.get(kind, kind.__name__) for kind in kinds)


def value_from_body(body: Mapping[str, Any]) -> bytes:
    """A KV value given as `value` (text, or bytes in msgpack) or `value_base64`."""
    if "value" in body and "value_base64" in body:
        raise InvalidArgument("give value or value_base64, not both")
    if "value_base64" in body:
        text = field(body, "value_base64", str)
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            # binascii.Error for bad characters or padding; a plain ValueError for text that is
            # not ASCII at all.
            raise InvalidArgument("value_base64 is not valid base64") from None
    value = field(body, "value", (str, bytes))
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise InvalidArgument("value is not valid UTF-8") from None
    return bytes(value)


def bytes_fields(value: bytes | None) -> dict[str, Any]:
    """`value` (text when the bytes are UTF-8, else None) and `value_base64`."""
    if value is None:
        return {"value": None, "value_base64": None}
    try:
        text: str | None = value.decode()
    except UnicodeDecodeError:
        text = None
    return {"value": text, "value_base64": base64.b64encode(value).decode()}


def query_text(
    request: web.Request, name: str, *, default: str | None = None, maximum_bytes: int = 1024
) -> str | None:
    value = request.query.get(name)
    if value is None:
        return default
    if len(value.encode()) > maximum_bytes:
        raise PayloadTooLarge(f"query parameter {name} is longer than {maximum_bytes} bytes")
    return value


def query_int(
    request: web.Request,
    name: str,
    *,
    default: int | None = None,
    low: int | None = None,
    high: int | None = None,
) -> int | None:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"query parameter {name} must be an integer, got {text!r}") from None
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            bounds = f"at least {low}"
        elif low is None:
            bounds = f"at most {high}"
        else:
            bounds = f"between {low} and {high}"
        raise InvalidArgument(f"query parameter {name} must be {bounds}, got {value}")
    return value


def query_float(
    request: web.Request, name: str, *, default: float, low: float, high: float
) -> float:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(f"query parameter {name} must be a number, got {text!r}") from None
    if not low <= value <= high:
        raise InvalidArgument(
            f"query parameter {name} must be between {low} and {high}, got {value}"
        )
    return value


def query_bool(request: web.Request, name: str, *, default: bool = False) -> bool:
    text = request.query.get(name)
    if text is None:
        return default
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise InvalidArgument(f"query parameter {name} must be true or false, got {text!r}")
