"""One HTTP call to the cluster, with failover across endpoints, retries and exactly-once writes.

The rules, in the order a call meets them:

1. A call has one deadline: `timeout_s` from its start, plus the time the server may wait for a
   long poll (`wait_s`). Every try, back-off and `Retry-After` pause fits inside it. The wait
   counts only once a node has taken the request: while every try is refused or finds no node,
   a long poll has `timeout_s` alone.
2. A write carries an idempotency key, the client's `Xr-Client-Id` and an `Xr-Seq` drawn once per
   call. Every try of the call re-sends the same key, so the state machine applies the write at
   most once and answers a repeat with the stored result. That stored answer is authoritative,
   so a definite error answered to a retry is raised as definite.
   The state machine keeps the results of only the newest `WRITES_IN_FLIGHT_MAX` (32) seqs of a
   client and refuses an older seq as `RequestTooOld`. So writes go through a sliding window: a
   write may draw seq n only while n - (the lowest seq of the client's writes still in flight)
   < 32; otherwise it waits its turn, within its own deadline (`ClusterUnavailable`, definite,
   saying the client's writes in flight did not end in time). When a write is applied, at most
   31 newer seqs of the client can have been, so it is never refused as too old and its retries
   find its stored result. A seq leaves the window when its call ends, however it ends.
   A long-poll write (`wait_s`: a lock acquire waiting in the queue) takes no place in the
   window, or every other write of the client would stall behind the wait: it draws its seq at
   once. So it can still be refused as too old (`RequestTooOld`, indefinite) when 32 newer
   writes of the client are applied before it is, which needs its first try to be held up
   behind all of them, or before a retry of it arrives after its answer was lost (a long wait
   gives the client's other writes time to pass it).
3. No answer (refused, reset, timed out, or longer than `answer_bytes_max`), 5xx, a node
   without a leader, or a 2xx whose body is not a JSON object (something that is not an xr
   node: every route of the API answers one, so this is read as a broken answer, after which a
   write may have been applied): the next endpoint is tried; after each full round of endpoints
   the call backs off (50 ms doubling to 1 s, with jitter).
4. 429 (`cluster.overloaded`, `limit.capacity`): the same endpoint again, with the same key,
   after `Retry-After`, if that fits before the deadline; otherwise the 429's own error is raised
   (or `Timeout`, if an earlier try may have been applied). A 429 without `Retry-After` is
   raised at once: a node sends none for a refusal the state machine applied (a full table, a
   tenant's quota), which is stored under the key, so a retry would only repeat it.
5. Any other error answer is raised at once as the same `xrcore.errors` class the server used.
   An answer without an xr error document (a web server's "404: Not Found"), and a node's own
   answer that it has no such route (an endpoint URL with a path after the port), are raised
   as an `XrError` naming the path, never as `NotFound`: a method that turns `NotFound` into
   None ("no such key") must not say so of a URL that is not the API.
6. Deadline passed: `Timeout` (indefinite) when some try may have reached the state machine (a
   write sent without an answer, or answered with an indefinite error); `ClusterUnavailable`
   (definite) when no try could have. The error names each endpoint's last problem, the most
   telling first: a node's own answer (no quorum, no leader) says more than a connection that
   failed, so it is never hidden behind the endpoint that happened to be tried last.
7. The client closed while the call runs (its waits, back-offs and tries): the call ends at
   once with `UnknownOutcome` (indefinite) when some try of a write may have reached the state
   machine, the one in flight included once its request was sent, and `ClusterUnavailable`
   (definite) otherwise. A call begun after the close raises RuntimeError: that is a mistake
   of the program, not an outcome.

`https://` endpoints are verified against `ca_file` (the system's CAs when it is not given);
`cert_file` and `key_file` are the client certificate a node asks for under mutual TLS. A bare
`host:port` is plain http.

An answer is read up to `answer_bytes_max` (1 GiB unless the transport is given another bound):
an endpoint that is not an xr node, or a broken one, could otherwise send without end and take
the caller's memory. The largest answers the API gives (a page of 1,000 keys of 64 KiB) are
well under it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import math
import os
import random
import secrets
import ssl
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import msgspec
import yarl

from xrcore._validate import check_name
from xrcore.errors import (
    ClusterUnavailable,
    NotFound,
    Timeout,
    UnknownOutcome,
    XrError,
    error_from_code,
)
from xrcore.limits import Limits

__all__ = [
    "ANSWER_BYTES_MAX",
    "WRITES_IN_FLIGHT_MAX",
    "AnswerTooLong",
    "Transport",
    "check_body",
    "check_number",
    "check_seconds",
    "normalize_endpoint",
    "read_answer",
    "tls_context",
]

log = logging.getLogger("xr.client")

CLIENT_ID_HEADER = "Xr-Client-Id"
SEQ_HEADER = "Xr-Seq"
REQUEST_ID_HEADER = "Xr-Request-Id"
_BACKOFF_BASE_S = 0.05
_BACKOFF_MAX_S = 1.0
# One try may use at most this share of a call's own timeout (besides a long poll's wait), so a
# node that accepts connections but never answers (paused, wedged) leaves time to try another.
_TRY_SHARE = 0.5
_TRY_MIN_S = 1.0
# A connect slower than this, even across regions, is to a dead or unreachable node.
_CONNECT_MAX_S = 3.0
_RETRY_AFTER_DEFAULT_S = 1.0
# The longest answer read by default (module docstring).
ANSWER_BYTES_MAX = 1 << 30
# The width of the window of a client's writes in flight (module docstring, rule 2): the number of
# seqs per client whose results the state machine keeps, which is what it can still answer a
# retry from.
WRITES_IN_FLIGHT_MAX = Limits().results_per_client_max
# What a node answers, as a `not_found` error, for a path that is no route of its API.
_NO_ROUTE_PREFIX = "no route "
_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


class NotUtf8(UnicodeEncodeError):
    """A str argument with a lone surrogate (how Python passes on bytes that are not UTF-8), which
    no request can carry. A UnicodeEncodeError, so a ValueError, whose message names the
    argument; the command line turns it into a usage error."""

    def __init__(self, field: str, error: UnicodeEncodeError) -> None:
        super().__init__(error.encoding, error.object, error.start, error.end, error.reason)
        self.field = field

    def __str__(self) -> str:
        return f"{self.field} is not valid UTF-8 (a lone surrogate at position {self.start})"


def check_utf8(field: str, value: str) -> None:
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as error:
            raise NotUtf8(field, error) from None


# The longest host name DNS allows.
_HOST_CHARS_MAX = 253


def check_number(field: str, value: object) -> float:
    """`value` as a float; TypeError naming `field` unless it is an int or a float (not a bool)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{field} must be a number, got {type(value).__name__} {value!r:.80}")
    return float(value)


def check_seconds(field: str, value: object) -> float:
    """A duration argument: a finite number (ValueError for NaN and infinities)."""
    seconds = check_number(field, value)
    if not math.isfinite(seconds):
        raise ValueError(f"{field} must be a number of seconds, got {value}")
    return seconds


def normalize_endpoint(endpoint: str) -> str:
    """`host:port` or `http://host:port/` as `http://host:port`; ValueError for anything that is
    not an http or https URL with a host."""
    if not isinstance(endpoint, str):
        raise TypeError(
            f"an endpoint must be a str, got {type(endpoint).__name__} {endpoint!r:.80}"
        )
    text = endpoint.strip()
    if not text:
        raise ValueError("an endpoint must not be empty")
    if "://" not in text:
        text = f"http://{text}"
    text = text.rstrip("/")
    try:
        url = yarl.URL(text)
        # The host is encoded (IDNA) only when a request is made: do it now, so that a host no
        # request could reach is refused here.
        host = url.raw_host
        usable = (
            url.scheme in ("http", "https")
            and bool(host)
            and len(host or "") <= _HOST_CHARS_MAX
            and text.isprintable()
        )
    except (ValueError, UnicodeError):
        usable = False
    if not usable:
        raise ValueError(f"endpoint {endpoint!r:.80} is not an http:// or https:// URL with a host")
    return text


def tls_context(
    *, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext | None:
    """The TLS context for `https://` endpoints, or None for the default (the system's CAs, no
    client certificate) when no file is given. Raises ValueError naming a file that does not
    load. `cert_file` may hold the key too, in which case `key_file` is not needed."""
    for name, path in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
        # An int would be taken by `open` as a file descriptor (True as stdout) and closed.
        if path is not None and not isinstance(path, str | os.PathLike):
            raise TypeError(f"{name} must be a path, got {type(path).__name__} {path!r:.80}")
    if ca_file is None and cert_file is None and key_file is None:
        return None
    if key_file is not None and cert_file is None:
        raise ValueError("key_file needs cert_file, the certificate the key belongs to")
    if ca_file is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        # Only this CA: a cluster with its own CA is not whoever a public CA vouches for.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ca_data = _read("ca_file", ca_file)
        try:
            context.load_verify_locations(cadata=ca_data.decode("ascii"))
        # ValueError: not ASCII, or no certificate at all (an empty file).
        except (ValueError, ssl.SSLError) as error:
            raise ValueError(f"ca_file {ca_file!r}: not PEM CA certificates ({error})") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None:
        # Read here first so a missing file is named; `ssl` would not say which one.
        _read("cert_file", cert_file)
        if key_file is not None:
            _read("key_file", key_file)
        try:
            # An empty passphrase rather than none: OpenSSL would prompt on the terminal.
            context.load_cert_chain(cert_file, key_file, password="")
        except ssl.SSLError as error:
            if key_file is None:
                raise ValueError(
                    f"cert_file {cert_file!r}: not a PEM certificate followed by its unencrypted "
                    f"key ({error.reason or error}); a key in a file of its own is given as "
                    "key_file (--key-file)"
                ) from None
            raise ValueError(
                f"cert_file {cert_file!r} and key_file {key_file!r}: not a PEM certificate and "
                f"its unencrypted key ({error.reason or error})"
            ) from None
    return context


# A PEM file of certificates or a key; more is not one (a path to /dev/zero would be read until
# the process runs out of memory).
_PEM_BYTES_MAX = 1 << 20


def _read(name: str, path: str) -> bytes:
    try:
        # Not waiting for a writer: a named pipe nobody writes to reads as empty at once.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            os.set_blocking(descriptor, True)
            data = file.read(_PEM_BYTES_MAX + 1)
    except OSError as error:
        raise ValueError(f"{name} {path!r}: cannot read it: {error.strerror}") from None
    if len(data) > _PEM_BYTES_MAX:
        raise ValueError(
            f"{name} {path!r}: cannot read it: larger than the maximum of {_PEM_BYTES_MAX} bytes"
        )
    return data


@dataclass(frozen=True, kw_only=True)
class _Answer:
    status: int
    document: Any
    retry_after_s: float | None


class Transport:
    """The endpoints, the HTTP session and the idempotency key's sequence of one client. Lives on
    one event loop; the aiohttp session is made on first use, inside that loop."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        client_id: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        answer_bytes_max: int = ANSWER_BYTES_MAX,
    ) -> None:
        if isinstance(endpoints, str):
            # One URL, or several separated by commas as XR_ENDPOINTS and --endpoints take them.
            listed = (
                [part.strip() for part in endpoints.split(",")] if "," in endpoints else [endpoints]
            )
        elif isinstance(endpoints, Sequence) and not isinstance(endpoints, bytes | bytearray):
            listed = list(endpoints)
        else:
            raise TypeError(
                f"endpoints must be a str or a sequence of str, got {type(endpoints).__name__}"
            )
        if not listed:
            raise ValueError("give at least one endpoint")
        if not check_number("timeout_s", timeout_s) > 0 or math.isinf(timeout_s):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s}")
        self.endpoints: tuple[str, ...] = tuple(normalize_endpoint(item) for item in listed)
        self.timeout_s = timeout_s
        if not isinstance(answer_bytes_max, int) or isinstance(answer_bytes_max, bool):
            raise TypeError(
                f"answer_bytes_max must be an int, got {type(answer_bytes_max).__name__}"
            )
        if answer_bytes_max <= 0:
            raise ValueError(
                f"answer_bytes_max must be a positive number of bytes, got {answer_bytes_max!r}"
            )
        self.answer_bytes_max = answer_bytes_max
        if client_id is not None and not isinstance(client_id, str):
            raise TypeError(f"client_id must be a str, got {type(client_id).__name__}")
        if client_id:
            # The cluster would refuse every write under a client id that is not a name.
            check_name("client_id", client_id)
        self.client_id = client_id or f"client-{secrets.token_hex(8)}"
        if token is not None and not isinstance(token, str):
            raise TypeError(f"token must be a str, got {type(token).__name__}")
        if token is not None and not (token and token.isascii() and token.isprintable()):
            # It goes in a header: a line break would end it, and HTTP headers are ASCII.
            raise ValueError("token must be a non-empty string of printable ASCII characters")
        self._token = token
        self._tls = tls_context(ca_file=ca_file, cert_file=cert_file, key_file=key_file)
        self._has_certificate = cert_file is not None
        # Seqs start at the wall clock in microseconds, so a client restarted with the same
        # `client_id` keeps drawing seqs above those of its previous run and never receives a
        # result stored for an older write.
        self._seq = time.time_ns() // 1_000
        # The seqs of the plain writes still in flight (at most WRITES_IN_FLIGHT_MAX), and the
        # writes waiting for their turn, first come first served; each waiter's future is given
        # its seq when its turn comes.
        self._writes_in_flight: set[int] = set()
        self._turn_waiters: collections.deque[asyncio.Future[int]] = collections.deque()
        self._current = 0
        self._random = random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        # The tasks running a call, and those of them that `close` cancelled: a cancellation by
        # the close ends the call with an `XrError` (rule 7), any other stays a cancellation.
        self._calls: set[asyncio.Task[Any]] = set()
        self._cancelled_by_close: set[asyncio.Task[Any]] = set()

    @property
    def closed(self) -> bool:
        """Whether `close` has begun: a loop of calls (a watch) must not retry past it."""
        return self._closed

    @property
    def current_endpoint(self) -> str:
        return self.endpoints[self._current]

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _window_open(self) -> bool:
        """Whether the next seq may be drawn for a write that enters the window."""
        return (
            not self._writes_in_flight
            or self._seq + 1 - min(self._writes_in_flight) < WRITES_IN_FLIGHT_MAX
        )

    def _enter_window(self) -> int:
        seq = self.next_seq()
        self._writes_in_flight.add(seq)
        return seq

    def _grant_turns(self) -> None:
        """Gives the waiting writes their seqs, in order, while the window has room."""
        while self._turn_waiters and self._window_open():
            waiter = self._turn_waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._enter_window())

    def _leave_window(self, seq: int) -> None:
        self._writes_in_flight.discard(seq)
        self._grant_turns()

    async def _take_turn(self, method: str, path: str, deadline_s: float, shown_s: float) -> int:
        """A seq in the window for a write, once its turn comes; `ClusterUnavailable` when the
        deadline passes first (nothing was sent)."""
        if not self._turn_waiters and self._window_open():
            return self._enter_window()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._turn_waiters.append(waiter)
        # Waiters that were cancelled may still hold the head of the queue.
        self._grant_turns()
        try:
            async with asyncio.timeout_at(deadline_s):
                return await waiter
        except BaseException as error:
            if waiter.done() and not waiter.cancelled():
                # Its turn came, but it was cancelled or ran out of time before taking it: the
                # seq it was given leaves the window, unsent.
                self._leave_window(waiter.result())
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._turn_waiters.remove(waiter)
            if isinstance(error, TimeoutError):
                raise ClusterUnavailable(
                    f"{method} {path}: this client's writes in flight did not end within "
                    f"{shown_s:g} s, so this write never got its turn (a client has at most "
                    f"{WRITES_IN_FLIGHT_MAX} writes in flight); nothing was applied"
                ) from None
            raise

    async def close(self) -> None:
        """Ends the calls still running (rule 7) and closes the connections."""
        self._closed = True
        current = asyncio.current_task()
        for task in self._calls - {current}:
            self._cancelled_by_close.add(task)
            task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the client is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # True: aiohttp's default verification with the system's CAs.
                connector=aiohttp.TCPConnector(limit=256, ssl=self._tls or True),
                timeout=aiohttp.ClientTimeout(total=None),
                trace_configs=[_SENT_TRACE],
            )
        return self._session

    def _headers(self, request_id: str) -> dict[str, str]:
        headers = {"Accept": "application/json", REQUEST_ID_HEADER: request_id}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _rotate_from(self, failed: int) -> None:
        # Several calls may fail on the same endpoint at once; only the first moves the client
        # on, so the others do not skip past a healthy endpoint.
        if self._current == failed:
            self._current = (failed + 1) % len(self.endpoints)

    async def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        write: bool = False,
        wait_s: float | None = None,
        wait_in: Literal["query", "body"] = "query",
        timeout_s: float | None = None,
        try_timeout_max_s: float | None = None,
    ) -> Any:
        """The decoded answer of `method path` (a JSON object), following the rules in the module
        docstring. `path` is already percent-encoded. `wait_s` makes the call a long poll: the
        deadline grows by it, and each try sends the wait that is left as `wait_s` in the query
        or the body. A write with `wait_s` is a long-poll write: it takes no place in the window
        of writes in flight (module docstring, rule 2). `try_timeout_max_s` bounds each try
        besides the call's own share (a keep-alive must move on from a silent node well within
        its session's TTL)."""
        if timeout_s is not None and (not timeout_s > 0 or math.isinf(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s}")
        if wait_s is not None and (not wait_s >= 0 or math.isinf(wait_s)):
            raise ValueError(f"wait_s must be a number of seconds, 0 or more, got {wait_s}")
        if body is not None:
            check_body(body)
        loop = asyncio.get_running_loop()
        own_timeout_s = self.timeout_s if timeout_s is None else timeout_s
        started_s = loop.time()
        wait_until_s = started_s + (wait_s or 0.0)
        deadline_s = wait_until_s + own_timeout_s
        headers = self._headers(secrets.token_hex(8))
        record = _Record(write=write)
        with self._running(lambda: _closed_error(method, path, record)):
            in_window = write and wait_s is None
            seq = 0
            if write:
                headers[CLIENT_ID_HEADER] = self.client_id
                # A long-poll write takes no place in the window (module docstring, rule 2).
                seq = (
                    await self._take_turn(method, path, deadline_s, own_timeout_s)
                    if in_window
                    else self.next_seq()
                )
                headers[SEQ_HEADER] = str(seq)
            try:
                return await self._tries(
                    method,
                    path,
                    query=query,
                    body=body,
                    record=record,
                    headers=headers,
                    started_s=started_s,
                    wait_until_s=None if wait_s is None else wait_until_s,
                    deadline_s=deadline_s,
                    own_timeout_s=own_timeout_s,
                    try_timeout_max_s=try_timeout_max_s,
                    wait_in=wait_in,
                )
            finally:
                # However the call ended: an answer, an error, a cancellation.
                if in_window:
                    self._leave_window(seq)

    @contextlib.contextmanager
    def _running(self, closed_error: Callable[[], XrError]) -> Iterator[None]:
        """Runs one call of the current task so that `close` can end it (rule 7): a cancellation
        by the close is raised as `closed_error()`. RuntimeError when the client is closed
        already."""
        if self._closed:
            raise RuntimeError("the client is closed")
        task = asyncio.current_task()
        assert task is not None, "a call runs in a task"
        self._calls.add(task)
        try:
            yield
        except asyncio.CancelledError:
            # A cancellation of the caller's own (a timeout around the call) stays one.
            if task not in self._cancelled_by_close or task.uncancel() > 0:
                raise
            raise closed_error() from None
        finally:
            self._calls.discard(task)
            self._cancelled_by_close.discard(task)

    async def _tries(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Mapping[str, Any] | None,
        record: _Record,
        headers: Mapping[str, str],
        started_s: float,
        wait_until_s: float | None,
        deadline_s: float,
        own_timeout_s: float,
        try_timeout_max_s: float | None,
        wait_in: Literal["query", "body"],
    ) -> dict[str, Any]:
        """The tries of one call, until an answer, an error to raise, or its deadline;
        `wait_until_s`: when a long poll's wait ends (None: not a long poll). What the tries
        meet goes in `record`, which the call's error reports."""
        loop = asyncio.get_running_loop()
        write = record.write
        tries = 0
        # A long poll waits on a node that took its request: while no node has (each refused
        # the connection, or none could be reached), the call has its own timeout alone.
        reached = False
        # Endpoints whose certificate this client does not trust: no retry changes that, so
        # once every endpoint is among them the call ends at once instead of at its deadline.
        untrusted: set[int] = set()
        while True:
            now_s = loop.time()
            give_up_s = deadline_s if reached else min(deadline_s, started_s + own_timeout_s)
            remaining_s = give_up_s - now_s
            if remaining_s <= 0:
                raise _give_up(method, path, give_up_s - started_s, record)
            endpoint_index = self._current
            endpoint = self.endpoints[endpoint_index]
            wait_left_s = None if wait_until_s is None else max(0.0, wait_until_s - now_s)
            try_share_s = max(_TRY_MIN_S, own_timeout_s * _TRY_SHARE)
            if try_timeout_max_s is not None:
                try_share_s = min(try_share_s, try_timeout_max_s)
            try_timeout_s = min(remaining_s, (wait_left_s or 0.0) + try_share_s)
            tries += 1
            sent: dict[str, bool] = {}
            try:
                answer = await self._try(
                    endpoint,
                    method,
                    path,
                    headers=headers,
                    query=_with_wait(
                        query, wait_left_s if wait_in == "query" else None, as_text=True
                    ),
                    body=_with_wait(
                        body, wait_left_s if wait_in == "body" else None, as_text=False
                    ),
                    timeout_s=try_timeout_s,
                    sent=sent,
                )
            except asyncio.CancelledError:
                # Cut off (by a close, rule 7) after its request went out: a write may have been
                # applied.
                if sent:
                    record.uncertain = record.uncertain or write
                    record.met(
                        endpoint, "sent, and no answer before the call was ended", _NO_ANSWER
                    )
                raise
            except aiohttp.ClientConnectorCertificateError as error:
                # The node's certificate failed verification: the request was never sent.
                record.met(endpoint, str(error), _NOT_SENT)
                untrusted.add(endpoint_index)
                if not reached and len(untrusted) == len(self.endpoints):
                    raise ClusterUnavailable(
                        f"{method} {path}: no endpoint's certificate could be verified, so "
                        f"nothing was sent (give the CA that signed the nodes' certificates: "
                        f"ca_file, --ca-file; last: {record.summary()})"
                    ) from None
            except aiohttp.ClientConnectorError as error:
                # Refused or unreachable: the request was never sent.
                record.met(endpoint, _connect_failure(error), _NOT_SENT)
            except _NotSent as not_sent:
                record.met(
                    endpoint,
                    "the request could not be sent in time"
                    if isinstance(not_sent.error, TimeoutError)
                    else f"not sent: {_lost_answer(not_sent.error)}",
                    _NOT_SENT,
                )
            except (aiohttp.ClientError, TimeoutError) as error:
                # Sent, but the answer was lost: a write may have been applied.
                reached = True
                record.uncertain = record.uncertain or write
                # A last try cut short by the call's deadline says less than the tries before
                # it did: what they met is what the error reports.
                if not (isinstance(error, TimeoutError) and try_timeout_s >= remaining_s > 0):
                    record.met(
                        endpoint,
                        f"{_lost_answer(error)}{self._disconnection_hint(endpoint, error)}",
                        _NO_ANSWER,
                    )
                elif endpoint not in record.problems:
                    record.met(endpoint, "no answer in time", _NO_ANSWER)
            else:
                reached = True
                if answer.status < 400 and isinstance(answer.document, dict):
                    return answer.document
                if answer.status < 400:
                    # Every route of the API answers a JSON object: whatever answered is not an
                    # xr node, or a broken one. As for a lost answer, a write may have been
                    # applied (by an xr node behind something that mangled its answer).
                    record.uncertain = record.uncertain or write
                    record.met(
                        endpoint,
                        f"HTTP {answer.status} with an answer that is not a JSON object "
                        "(not an xr node?)",
                        _FOREIGN_ANSWER,
                    )
                else:
                    failure = _server_error(
                        answer.status, answer.document, f"{method} {path}", endpoint
                    )
                    if answer.status == 429:
                        retry_after_s = answer.retry_after_s
                        if retry_after_s is not None and loop.time() + retry_after_s < deadline_s:
                            await asyncio.sleep(retry_after_s)
                            continue
                        if record.uncertain:
                            record.met(endpoint, repr(failure), _NODE_ANSWER)
                            raise _give_up(method, path, deadline_s - started_s, record)
                        raise failure
                    if answer.status < 500:
                        raise failure
                    record.uncertain = record.uncertain or (write and not failure.definite)
                    record.met(
                        endpoint,
                        f"{failure.code}: {failure.message}",
                        _NODE_ANSWER,
                        without_quorum=_without_quorum(failure),
                    )
            log.debug(
                "%s %s: try %d failed (%s: %s)",
                method,
                path,
                tries,
                endpoint,
                record.problems[endpoint].what,
            )
            self._rotate_from(endpoint_index)
            await self._back_off(tries, deadline_s - loop.time())

    async def _back_off(self, tries: int, remaining_s: float) -> None:
        # Straight on to the next endpoint within a round; a pause after each full round.
        if tries % len(self.endpoints) != 0 or remaining_s <= 0:
            return
        rounds = tries // len(self.endpoints)
        delay_s = min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2 ** min(rounds - 1, 16))
        delay_s *= 0.5 + self._random.random() / 2
        await asyncio.sleep(min(delay_s, remaining_s))

    def _disconnection_hint(self, endpoint: str, error: BaseException) -> str:
        """What an https node that hangs up before answering most likely means, for a client
        without a certificate. A node that requires client certificates (mutual TLS) refuses
        one without, but under TLS 1.3 its refusal comes after the client's side of the
        handshake, and aiohttp reports it as a plain disconnection or a reset connection."""
        hung_up = isinstance(error, aiohttp.ServerDisconnectedError | ConnectionResetError) or (
            isinstance(error, OSError) and error.errno == errno.ECONNRESET
        )
        if hung_up and endpoint.startswith("https://") and not self._has_certificate:
            return (
                " (a node that requires client certificates disconnects a client without one: "
                "give cert_file and key_file, --cert-file and --key-file on the command line)"
            )
        return ""

    async def _try(
        self,
        endpoint: str,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        query: Mapping[str, str] | None,
        body: Mapping[str, Any] | None,
        timeout_s: float,
        sent: dict[str, bool] | None = None,
    ) -> _Answer:
        """One request. `sent` (given empty) is marked once the request has gone out."""
        url = yarl.URL(endpoint + path, encoded=True)
        data = None if body is None else _json_encoder.encode(body)
        sent_headers = dict(headers)
        if data is not None:
            sent_headers["Content-Type"] = "application/json"
        sent = {} if sent is None else sent
        try:
            async with self._http().request(
                method,
                url,
                params=query,
                data=data,
                headers=sent_headers,
                timeout=aiohttp.ClientTimeout(
                    total=timeout_s, sock_connect=min(timeout_s, _CONNECT_MAX_S)
                ),
                trace_request_ctx=sent,
            ) as response:
                raw = await read_answer(response, self.answer_bytes_max)
                return _Answer(
                    status=response.status,
                    document=_decode(raw),
                    retry_after_s=_retry_after_s(response.headers.get("Retry-After")),
                )
        except (aiohttp.ClientError, TimeoutError) as error:
            if not sent and not isinstance(error, aiohttp.ClientConnectorError):
                # Out of time (or cut off) before the request went out: no node took it. On a
                # loaded machine a connection to a port that refuses can take longer than a
                # short try, and the try's timeout read as a node that took the request.
                raise _NotSent(error) from error
            raise

    async def probe(self, path: str) -> tuple[int, Any]:
        """One try of `GET path` on the current endpoint, whatever the status; no failover.
        Raises `ClusterUnavailable` when the endpoint does not answer."""
        endpoint = self.current_endpoint
        try:
            with self._running(
                lambda: ClusterUnavailable(f"{endpoint}: the client was closed before it answered")
            ):
                answer = await self._try(
                    endpoint,
                    "GET",
                    path,
                    headers=self._headers(secrets.token_hex(8)),
                    query=None,
                    body=None,
                    timeout_s=self.timeout_s,
                )
        except (aiohttp.ClientError, TimeoutError, _NotSent) as caught:
            error = caught.error if isinstance(caught, _NotSent) else caught
            raise ClusterUnavailable(
                f"{endpoint} did not answer: {str(error) or 'no answer in time'}"
                f"{self._disconnection_hint(endpoint, error)}"
            ) from None
        return answer.status, answer.document


class AnswerTooLong(aiohttp.ClientPayloadError):
    """An answer longer than the bound it was read under. A payload error, as a broken answer is:
    whoever catches `aiohttp.ClientError` treats the answer as lost."""

    def __init__(self, bytes_max: int) -> None:
        super().__init__(f"the answer is longer than {bytes_max} bytes (answer_bytes_max)")


async def read_answer(response: aiohttp.ClientResponse, bytes_max: int) -> bytes:
    """The answer's body, or `AnswerTooLong` as soon as it is known to exceed `bytes_max` (from
    its Content-Length, or while it arrives); the connection is then closed, not reused."""
    if response.content_length is not None and response.content_length > bytes_max:
        response.close()
        raise AnswerTooLong(bytes_max)
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > bytes_max:
            response.close()
            raise AnswerTooLong(bytes_max)
    return bytes(body)


def _with_wait(
    fields: Mapping[str, Any] | None, wait_s: float | None, *, as_text: bool
) -> dict[str, Any] | None:
    """`fields` with the wait that is left as `wait_s` (text in a query, a number in a body)."""
    if wait_s is None:
        return None if fields is None else dict(fields)
    shown = dict(fields or {})
    # Milliseconds are precision enough for a wait.
    rounded_s = round(wait_s, 3)
    shown["wait_s"] = str(rounded_s) if as_text else rounded_s
    return shown


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return _json_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        # Not a document of the API (nested past the decoder's depth, too): the caller reports
        # what it expected.
        return None


def _retry_after_s(header: str | None) -> float | None:
    """Seconds to wait before asking again; None without the header (do not ask again)."""
    if header is None:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        return _RETRY_AFTER_DEFAULT_S


def _server_error(status: int, document: Any, request: str, endpoint: str) -> XrError:
    """The typed error an error answer carries. An answer without one (a proxy's page, a web
    server's "404: Not Found") becomes an indefinite `XrError` naming the status and the request;
    so does a node's answer that `request`'s path is no route of its API, which the node sends
    as `not_found` but which must not read as "no such key" (module docstring, rule 5)."""
    info = document.get("error") if isinstance(document, dict) else None
    if not (isinstance(info, dict) and isinstance(info.get("code"), str)):
        return XrError(
            f"{request}: {endpoint} answered HTTP {status} without an xr error (not an xr node, "
            "or not the xr API at this URL?)"
        )
    message = str(info.get("message", ""))
    if info["code"] == NotFound.code and message.startswith(_NO_ROUTE_PREFIX):
        return XrError(
            f"{request}: {endpoint} has no such route ({message}); the endpoint's URL does not "
            "lead to the xr API (a path after the port?)"
        )
    return error_from_code(info["code"], message)


def check_body(body: Mapping[str, Any]) -> None:
    """Refuses a request body JSON cannot carry as given, naming the field (ValueError)."""
    for field, value in body.items():
        try:
            _check_finite(value, f"body.{field}")
        except RecursionError:
            raise ValueError(f"body.{field}: nested too deeply to send") from None


def _check_finite(value: Any, where: str) -> None:
    """Refuses a NaN or infinite number in a request body: JSON has neither, and the encoder
    would send null, which the API takes as "not given"."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {value!r} is not a finite number")
    if isinstance(value, str):
        check_utf8(where, value)
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for position, item in enumerate(value):
            _check_finite(item, f"{where}[{position}]")


# How much a try's problem tells of the cluster (`_Record.summary`, most first): a node's own
# error answer, then an answer that is not the API's, then no answer to a request that was sent,
# then a request that could not be sent (refused, unreachable, an untrusted certificate).
_NODE_ANSWER = 3
_FOREIGN_ANSWER = 2
_NO_ANSWER = 1
_NOT_SENT = 0


@dataclass(frozen=True, kw_only=True)
class _Problem:
    what: str
    # How much it tells of the cluster: _NODE_ANSWER, _FOREIGN_ANSWER, _NO_ANSWER or _NOT_SENT.
    telling: int
    # A node's answer that its cluster has no leader, or that the log entry was not committed in
    # time: what a cluster without a quorum answers.
    without_quorum: bool


class _Record:
    """What the tries of one call met: whether a write may have been applied, and each
    endpoint's last problem, which the call's error reports."""

    def __init__(self, *, write: bool) -> None:
        self.write = write
        # Some try may have reached the state machine (module docstring, rule 6).
        self.uncertain = False
        # Each endpoint's last problem, in the order the endpoints last met one.
        self.problems: dict[str, _Problem] = {}

    def met(self, endpoint: str, what: str, telling: int, *, without_quorum: bool = False) -> None:
        self.problems.pop(endpoint, None)
        self.problems[endpoint] = _Problem(
            what=what, telling=telling, without_quorum=without_quorum
        )

    @property
    def without_quorum(self) -> bool:
        return any(problem.without_quorum for problem in self.problems.values())

    def summary(self) -> str:
        """Each endpoint's last problem, the most telling first (the latest among equals): a
        node that answered it has no quorum is not hidden behind one that refused the
        connection after it."""
        if not self.problems:
            return "no try was made"
        # A stable sort: among equals, the latest stays first.
        ranked = sorted(
            reversed(self.problems.items()), key=lambda item: item[1].telling, reverse=True
        )
        return "; ".join(f"{endpoint}: {problem.what}" for endpoint, problem in ranked)


def _connect_failure(error: aiohttp.ClientConnectorError) -> str:
    """A failed connection, briefly: aiohttp's text repeats the host and port that the endpoint
    already names, and asyncio's ("Connect call failed ('10.0.0.1', 8700)") hides the reason
    behind the error number."""
    cause = error.os_error
    if isinstance(cause, ssl.SSLError):
        return str(error)
    if cause.errno is not None and cause.errno > 0:
        return f"cannot connect ({os.strerror(cause.errno)})"
    # A failed name lookup (a negative number of its own) says what failed in its text.
    return f"cannot connect ({cause.strerror or cause})"


class _NotSent(Exception):
    """A try that ended before its request was sent (headers written): no node took it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


async def _on_headers_sent(
    _session: aiohttp.ClientSession,
    context: types.SimpleNamespace,
    _params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["sent"] = True


# Marks a try's request as sent once its headers are written (`_try`).
_SENT_TRACE = aiohttp.TraceConfig()
_SENT_TRACE.on_request_headers_sent.append(_on_headers_sent)


def _lost_answer(error: BaseException) -> str:
    """What a try that was sent but got no answer met. A try cut short by its own timeout raises
    a TimeoutError with no text."""
    text = str(error)
    if not text and isinstance(error, TimeoutError):
        return "no answer in time"
    return f"{type(error).__name__} {text}".rstrip()


def _without_quorum(failure: XrError) -> bool:
    """Whether a node's error answer is what a cluster without a quorum answers: no leader
    known or reachable, or a log entry not committed in time."""
    if isinstance(failure, Timeout):
        return True
    return isinstance(failure, ClusterUnavailable) and "no leader" in failure.message


def _give_up(method: str, path: str, deadline_s: float, record: _Record) -> XrError:
    """The error for a call that ran out of time; `deadline_s`: the time it had (its timeout,
    plus a long poll's wait). A read applies nothing whatever happened, so only a write says
    that nothing was applied."""
    shown_s = f"{round(deadline_s, 2):g}"
    hint = (
        "; the cluster may have no quorum (see `xr cluster status`)"
        if record.without_quorum
        else ""
    )
    if record.uncertain:
        return Timeout(
            f"{method} {path}: no answer within {shown_s} s; it may or may not have been "
            f"applied (last: {record.summary()}){hint}"
        )
    applied = "; nothing was applied" if record.write else ""
    return ClusterUnavailable(
        f"{method} {path}: no node could serve it within {shown_s} s{applied} "
        f"(last: {record.summary()}){hint}"
    )


def _closed_error(method: str, path: str, record: _Record) -> XrError:
    """The error for a call the client's close ended (rule 7)."""
    last = f" (last: {record.summary()})" if record.problems else ""
    if record.uncertain:
        return UnknownOutcome(
            f"{method} {path}: the client was closed while this call ran; it may or may not "
            f"have been applied{last}"
        )
    applied = "; nothing was applied" if record.write else ""
    return ClusterUnavailable(
        f"{method} {path}: the client was closed while this call ran{applied}{last}"
    )
