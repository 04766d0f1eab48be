"""What every `xr` client command shares: where the cluster is and who is asking, how answers are
printed, and how failures become one line on stderr and an exit code.

The connection settings come from, in order (first found wins): the command's flags
(`--endpoints`, `--token`, `--token-file`, `--timeout`, `--ca-file`, `--cert-file`,
`--key-file`), the environment (`XR_ENDPOINTS`, `XR_TOKEN`, `XR_CA_FILE`, `XR_CERT_FILE`,
`XR_KEY_FILE`), the client configuration file (`--config` or `XR_CLIENT_CONFIG`, a small TOML
file with `endpoints`, `token` or `token_file`, `timeout_s`, `ca_file`, `cert_file` and
`key_file`), then the defaults. The TLS files are for `https://` endpoints: the CA that signed the
nodes' certificates, and the client certificate and key a cluster with mutual TLS asks for.

Exit codes: 0 success, 1 a definite error (the request certainly did not take effect), 2 a usage
error, 3 an indefinite error (it may have taken effect: a timeout, a lost leader, an unreachable
cluster mid-request), 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from node.files import CONFIG_BYTES_MAX, SECRET_BYTES_MAX, read_text_bounded

if TYPE_CHECKING:
    from xrcore.client import Client

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_TIMEOUT_S",
    "EXIT_DEFINITE",
    "EXIT_INDEFINITE",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "ClientOptions",
    "ClientSettings",
    "CommandFailed",
    "client_options",
    "client_options_timed",
    "connect",
    "emit",
    "endpoints_hinted",
    "error_line",
    "exit_code_for",
    "format_time_ms",
    "json_output",
    "key_values",
    "non_empty",
    "one_line",
    "open_client",
    "resolve_settings",
    "table",
    "to_document",
    "value_fields",
]

DEFAULT_ENDPOINT = "http://127.0.0.1:8700"
DEFAULT_TIMEOUT_S = 10.0
EXIT_DEFINITE = 1
EXIT_USAGE = 2
EXIT_INDEFINITE = 3
EXIT_INTERRUPTED = 130
_TLS_KEYS = ("ca_file", "cert_file", "key_file")
_CONFIG_KEYS = frozenset({"endpoints", "token", "token_file", "timeout_s", *_TLS_KEYS})

F = TypeVar("F", bound=Callable[..., Any])


class FiniteFloatRange(click.FloatRange):
    """click's `FloatRange` that also refuses NaN, which compares false with any bound and so
    passes it, and infinity where there is no upper bound (JSON carries either as null)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class CommandFailed(Exception):
    """A failure the CLI itself detects; `main` shows it as `xr: <code>: <message>`, like an
    error from the cluster, and exits with `exit_code`."""

    def __init__(self, code: str, message: str, *, exit_code: int = EXIT_DEFINITE) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code


def error_line(code: str, message: str) -> str:
    # One line whatever the message holds, so scripts can read stderr line by line.
    return f"xr: {code}: {' '.join(message.split())}"


def exit_code_for(*, definite: bool) -> int:
    return EXIT_DEFINITE if definite else EXIT_INDEFINITE


def non_empty(context: click.Context, parameter: click.Parameter, value: Any) -> Any:
    """A click callback for keys, names and ids, which all go into URL paths."""
    if isinstance(value, str) and not value:
        raise click.BadParameter("must not be empty")
    return value


# Connection settings.


@dataclass
class ClientOptions:
    """The connection flags as given on the command line; None where not given."""

    endpoints: str | None = None
    token: str | None = None
    token_file: str | None = None
    config_file: str | None = None
    json: bool = False
    timeout_s: float | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """Where to connect and with what, once flags, environment and file are combined."""

    endpoints: list[str]
    token: str | None
    timeout_s: float
    # No flag, environment variable or client configuration named the endpoints: they are
    # `DEFAULT_ENDPOINT`.
    default_endpoints: bool = False
    # PEM files for TLS (`https://` endpoints); None: the default.
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def _remember(
    name: str,
) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(context: click.Context, parameter: click.Parameter, value: Any) -> None:
        if value is not None and value is not False:
            setattr(context.ensure_object(ClientOptions), name, value)

    return callback


def _timeout_option(default_timeout_s: float) -> Callable[[F], F]:
    return click.option(
        "--timeout",
        "timeout_s",
        metavar="SECONDS",
        type=FiniteFloatRange(min=0, min_open=True),
        expose_value=False,
        callback=_remember("timeout_s"),
        help=f"Seconds to wait for each request [default {default_timeout_s:g}].",
    )


# None: --timeout, whose default the command gives (`client_options_timed`).
_OPTIONS: list[Callable[[F], F] | None] = [
    click.option(
        "--endpoints",
        metavar="URLS",
        expose_value=False,
        callback=_remember("endpoints"),
        help="Comma-separated API URLs of the cluster's nodes "
        f"[env XR_ENDPOINTS; default {DEFAULT_ENDPOINT}].",
    ),
    click.option(
        "--token",
        metavar="TOKEN",
        expose_value=False,
        callback=_remember("token"),
        help="Bearer token [env XR_TOKEN]. Prefer --token-file: flags show in `ps`.",
    ),
    click.option(
        "--token-file",
        metavar="FILE",
        expose_value=False,
        callback=_remember("token_file"),
        help="File holding the bearer token.",
    ),
    click.option(
        "--config",
        "config_file",
        metavar="FILE",
        expose_value=False,
        callback=_remember("config_file"),
        help="Client configuration (TOML: endpoints, token or token_file, timeout_s, ca_file, "
        "cert_file, key_file) "
        "[env XR_CLIENT_CONFIG].",
    ),
    click.option(
        "--json",
        "json",
        is_flag=True,
        default=False,
        expose_value=False,
        callback=_remember("json"),
        help="Machine output: one JSON document on stdout.",
    ),
    None,
    click.option(
        "--ca-file",
        metavar="FILE",
        expose_value=False,
        callback=_remember("ca_file"),
        help="PEM file of the CA that signed the nodes' certificates, for https:// endpoints "
        "[env XR_CA_FILE; default: the system's CAs].",
    ),
    click.option(
        "--cert-file",
        metavar="FILE",
        expose_value=False,
        callback=_remember("cert_file"),
        help="PEM client certificate, for a cluster that requires one (mutual TLS) "
        "[env XR_CERT_FILE].",
    ),
    click.option(
        "--key-file",
        metavar="FILE",
        expose_value=False,
        callback=_remember("key_file"),
        help="PEM key of the client certificate (unencrypted) [env XR_KEY_FILE].",
    ),
]


def client_options(function: F) -> F:
    """Adds the connection options to a command; read them with `options()`."""
    return client_options_timed(DEFAULT_TIMEOUT_S)(function)


def client_options_timed(default_timeout_s: float) -> Callable[[F], F]:
    """`client_options` for a command whose requests wait `default_timeout_s` unless told
    otherwise (give `resolve_settings` the same), so that its --help says so."""
    timeout_option: Callable[[F], F] = _timeout_option(default_timeout_s)

    def decorate(function: F) -> F:
        for option in reversed(_OPTIONS):
            function = (option or timeout_option)(function)
        return function

    return decorate


def options() -> ClientOptions:
    return click.get_current_context().ensure_object(ClientOptions)


def _normalize_endpoints(text: str, *, where: str) -> list[str]:
    endpoints = []
    for item in text.split(","):
        item = item.strip()
        if not item.rstrip("/"):
            continue
        # A bare host:port is the common slip; the API is plain HTTP unless told otherwise.
        url = item if "://" in item else f"http://{item}"
        _check_endpoint(url, where=where)
        endpoints.append(url.rstrip("/"))
    if not endpoints:
        raise click.BadParameter(f"no endpoint in {text!r}", param_hint=where)
    return endpoints


def _check_endpoint(url: str, *, where: str) -> None:
    """Refuses a URL the HTTP client could not use, here rather than as a traceback from inside
    the first request."""
    import yarl

    try:
        parsed = yarl.URL(url)
        # yarl parses the host and port lazily: a bad port or host name fails when read.
        host, port = parsed.host, parsed.port
    except (ValueError, UnicodeError) as error:
        raise click.BadParameter(f"{url!r} is not a valid URL: {error}", param_hint=where) from None
    if parsed.scheme not in ("http", "https"):
        raise click.BadParameter(f"{url!r} must be an http:// or https:// URL", param_hint=where)
    if not host or port is None:
        raise click.BadParameter(f"{url!r} has no host", param_hint=where)


def _read_token_file(path: str, *, where: str) -> str:
    try:
        token = read_text_bounded(path, SECRET_BYTES_MAX).strip()
    except OSError as error:
        raise click.BadParameter(
            f"cannot read token file {path!r}: {error.strerror}", param_hint=where
        ) from None
    except UnicodeDecodeError:
        raise click.BadParameter(
            f"token file {path!r} is not UTF-8 text", param_hint=where
        ) from None
    if not token:
        raise click.BadParameter(f"token file {path!r} is empty", param_hint=where)
    return token


def _read_client_config(path: str) -> dict[str, Any]:
    where = f"client configuration {path!r}"
    try:
        document = tomllib.loads(read_text_bounded(path, CONFIG_BYTES_MAX))
    except OSError as error:
        raise click.BadParameter(
            f"cannot read {where}: {error.strerror}", param_hint="--config"
        ) from None
    except UnicodeDecodeError:
        raise click.BadParameter(f"{where} is not UTF-8 text", param_hint="--config") from None
    except tomllib.TOMLDecodeError as error:
        raise click.BadParameter(
            f"{where} is not valid TOML: {error}", param_hint="--config"
        ) from None
    unknown = sorted(set(document) - _CONFIG_KEYS)
    if unknown:
        raise click.BadParameter(
            f"{where}: unknown setting(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(_CONFIG_KEYS))}",
            param_hint="--config",
        )
    endpoints = document.get("endpoints")
    if isinstance(endpoints, list) and all(isinstance(item, str) for item in endpoints):
        document["endpoints"] = ",".join(endpoints)
    elif endpoints is not None and not isinstance(endpoints, str):
        raise click.BadParameter(
            f"{where}: endpoints must be a list of URLs or a comma-separated string",
            param_hint="--config",
        )
    for name in ("token", "token_file", *_TLS_KEYS):
        if name in document and not isinstance(document[name], str):
            raise click.BadParameter(f"{where}: {name} must be a string", param_hint="--config")
    timeout_s = document.get("timeout_s")
    # TOML has nan and inf; NaN compares false with 0, so it needs its own check.
    if timeout_s is not None and (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not 0 < timeout_s < math.inf
    ):
        raise click.BadParameter(
            f"{where}: timeout_s must be a positive, finite number", param_hint="--config"
        )
    return document


def resolve_settings(
    given: ClientOptions,
    environ: Mapping[str, str],
    *,
    default_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ClientSettings:
    """Flags, then environment, then the client configuration file, then defaults
    (`default_timeout_s` where neither the flag nor the file sets a timeout)."""
    config_path = given.config_file or environ.get("XR_CLIENT_CONFIG")
    file = _read_client_config(config_path) if config_path else {}
    if given.token is not None and given.token_file is not None:
        raise click.UsageError("give --token or --token-file, not both")
    if "token" in file and "token_file" in file:
        raise click.UsageError(f"{config_path}: give token or token_file, not both")
    if given.endpoints is not None:
        endpoints = _normalize_endpoints(given.endpoints, where="--endpoints")
    elif environ.get("XR_ENDPOINTS"):
        endpoints = _normalize_endpoints(environ["XR_ENDPOINTS"], where="XR_ENDPOINTS")
    elif file.get("endpoints"):
        endpoints = _normalize_endpoints(file["endpoints"], where="--config")
    else:
        endpoints = [DEFAULT_ENDPOINT]
    default_endpoints = not (
        given.endpoints is not None or environ.get("XR_ENDPOINTS") or file.get("endpoints")
    )
    token: str | None
    if given.token is not None:
        token = given.token
    elif given.token_file is not None:
        token = _read_token_file(given.token_file, where="--token-file")
    elif environ.get("XR_TOKEN"):
        token = environ["XR_TOKEN"]
    elif "token" in file:
        token = file["token"]
    elif "token_file" in file:
        token = _read_token_file(file["token_file"], where="--config")
    else:
        token = None
    timeout_s = given.timeout_s or float(file.get("timeout_s", default_timeout_s))
    tls_files: dict[str, str | None] = {}
    for name in _TLS_KEYS:
        flag = getattr(given, name)
        variable = f"XR_{name.upper()}"
        tls_files[name] = flag or environ.get(variable) or file.get(name)
    return ClientSettings(
        endpoints=endpoints,
        token=token,
        timeout_s=timeout_s,
        default_endpoints=default_endpoints,
        **tls_files,
    )


def open_client(settings: ClientSettings, *, endpoints: Sequence[str] | None = None) -> Client:
    """A client with the settings (to `endpoints` instead, when given); the caller closes it. A
    TLS file that does not load is a usage error."""
    # Imported here so `xr --help` and the node commands do not load the HTTP client.
    from xrcore.client import Client

    token = settings.token
    if token is not None and not (token and token.isascii() and token.isprintable()):
        # It goes in a header, which a line break would end.
        raise CommandFailed(
            "usage",
            "the token (--token, --token-file, XR_TOKEN or the client configuration) must be "
            "printable ASCII characters, and not empty",
            exit_code=EXIT_USAGE,
        )
    try:
        return Client(
            list(settings.endpoints if endpoints is None else endpoints),
            token=settings.token,
            timeout_s=settings.timeout_s,
            ca_file=settings.ca_file,
            cert_file=settings.cert_file,
            key_file=settings.key_file,
        )
    except ValueError as error:
        # The endpoints and the token were checked already, so it is a TLS file.
        raise CommandFailed("tls.invalid", str(error), exit_code=EXIT_USAGE) from None


@contextmanager
def connect() -> Iterator[Client]:
    """A client for the cluster the options name, closed when the command ends."""
    settings = resolve_settings(options(), os.environ)
    # The client logs what it also raises (a lost lock) and the command reports it itself;
    # with no logging set up, Python would print those records to stderr as well. A handler
    # here stops that; records still reach any handlers configured higher up.
    client_log = logging.getLogger("xr.client")
    if not client_log.handlers:
        client_log.addHandler(logging.NullHandler())

    client = open_client(settings)
    try:
        with endpoints_hinted(settings):
            yield client
    finally:
        client.close()


@contextmanager
def endpoints_hinted(settings: ClientSettings) -> Iterator[None]:
    """A cluster that cannot be reached at the default endpoints, which nothing chose, is most
    likely elsewhere (`xr up` picks free ports): the error says how to point the command at it."""
    from xrcore.errors import ClusterUnavailable

    try:
        yield
    except ClusterUnavailable as error:
        if not settings.default_endpoints:
            raise
        raise ClusterUnavailable(
            f"{error.message}; no endpoints were given, so the default {DEFAULT_ENDPOINT} was "
            "asked: set XR_ENDPOINTS or --endpoints (xr up prints them)"
        ) from None


# Output.


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns, two spaces apart; None shows as `-`."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [len(header) for header in headers]
    for row in cells:
        for position, cell in enumerate(row):
            widths[position] = max(widths[position], len(cell))
    lines = [
        "  ".join(cell.ljust(widths[position]) for position, cell in enumerate(row)).rstrip()
        for row in [list(headers), *cells]
    ]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{key}={_cell(item)}" for key, item in sorted(value.items())) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(_cell(item) for item in value) or "-"
    return one_line(str(value))


def _escape(code: int) -> str:
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
    return named.get(code, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


# Control characters (C0, DEL, C1) and the bidirectional overrides and isolates, which would
# break a table's lines or columns, or let a key or value (another tenant's data) move the
# cursor, recolour or rewrite the terminal, or show its text in another order.
_UNPRINTABLE = {
    code: _escape(code)
    for code in [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
}


def one_line(text: str) -> str:
    """`text` for a terminal, on one line: control characters escaped as Python writes them
    (`\\n`, `\\x1b`), so a key or value shows as what it holds and cannot drive the
    terminal."""
    return text.translate(_UNPRINTABLE)


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    """`name:  value` lines, values aligned; None shows as `-`."""
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name + ':':<{width + 1}}  {_cell(value)}" for name, value in pairs)


def to_document(value: Any) -> Any:
    """A value from the client (structs, tuples, bytes as base64) as plain JSON types, with the
    API's field names."""
    return msgspec.to_builtins(value)


def value_fields(value: bytes | None) -> dict[str, str | None]:
    """A KV value as the API shows it: UTF-8 text in `value` when it is text, always base64."""
    if value is None:
        return {"value": None, "value_base64": None}
    try:
        text: str | None = value.decode()
    except UnicodeDecodeError:
        text = None
    return {"value": text, "value_base64": base64.b64encode(value).decode()}


def emit(document: Any, human: Callable[[], None] | str) -> None:
    """Prints `document` as JSON under `--json`, else the human form (text or a printer)."""
    if options().json:
        click.echo(json.dumps(to_document(document), indent=2))
    elif callable(human):
        human()
    else:
        click.echo(human)


def json_output() -> bool:
    """Whether `--json` was given. Streaming commands (watch) then print one compact JSON
    document per line instead of one document."""
    return options().json


def format_time_ms(at_ms: int | None) -> str:
    if at_ms is None:
        return "-"
    seconds = at_ms / 1000
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{at_ms % 1000:03d}"
