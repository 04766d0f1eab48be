"""Tokens are added, rotated and revoked through `auth.tokens_file` without a restart.

Each test serves an application with a tokens file on the shared node's store. Its clock's
monotonic time is moved by hand, so "the file is looked at most once a second" is exercised
without sleeping. An invalid file (bad TOML, a bad digest, a name used twice) is refused with an
error that names the file and the problem, and the previous tokens stay in use; at start it stops
the node like any invalid setting. SIGHUP reads the file at once (on the main thread's loop, as
the daemon runs the application).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from node.api.app import SERVICES, create_app
from node.api.auth import TOKENS_FILE_CHECK_INTERVAL_S
from node.config import ConfigError, NodeConfig, hash_token
from raftstore.clock import RealClock
from tests.node.conftest import ApiNode
from tests.node.test_api_watch import _sse_events

pytestmark = pytest.mark.integration

_PROBE = "/v1/cluster/status"


class _ManualClock:
    """Wall time as it is; monotonic time moves only when a test says so."""

    def __init__(self) -> None:
        self._real = RealClock()
        self.monotonic = 1000.0

    def now_ms(self) -> int:
        return self._real.now_ms()

    def monotonic_s(self) -> float:
        return self.monotonic

    def pass_interval(self) -> None:
        self.monotonic += TOKENS_FILE_CHECK_INTERVAL_S


def _entry(name: str, token: str, *, role: str = "tenant", tenant: str = "rotated") -> str:
    return (
        f'[[tokens]]\nname = "{name}"\nsha256 = "{hash_token(token)}"\n'
        f'role = "{role}"\ntenant = "{tenant}"\n\n'
    )


def _write(path: Path, text: str) -> None:
    """Writes the file as an operator should: a new file renamed over the old one."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


def _config(api: ApiNode, tokens_file: Path) -> NodeConfig:
    auth = msgspec.structs.replace(api.config.auth, tokens_file=str(tokens_file))
    return dataclasses.replace(api.config, auth=auth)


@dataclasses.dataclass
class _Served:
    api: ApiNode
    client: TestClient[Any, Any]
    clock: _ManualClock
    path: Path

    def status(self, token: str | None) -> int:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        answer = self.api.request("GET", _PROBE, token=None, headers=headers, client=self.client)
        return answer.status


def _serve(api: ApiNode, path: Path) -> _Served:
    clock = _ManualClock()
    app = create_app(_config(api, path), store=api.store, clock=clock)
    return _Served(api=api, client=api.run(api.serve(app)), clock=clock, path=path)


@pytest.fixture
def served(api: ApiNode, tmp_path: Path) -> _Served:
    path = tmp_path / "tokens.toml"
    _write(path, _entry("file-a", "secret-a") + _entry("file-b", "secret-b"))
    return _serve(api, path)


def test_file_tokens__are_accepted_beside_the_configured_ones(served: _Served) -> None:
    assert served.status("secret-a") == 200
    assert served.status("secret-b") == 200
    assert served.status("token-alpha") == 200
    assert served.status("not-a-token") == 401


def test_a_revoked_token__is_refused_and_a_new_one_accepted__without_a_restart(
    served: _Served,
) -> None:
    assert served.status("secret-a") == 200
    _write(served.path, _entry("file-b", "secret-b") + _entry("file-c", "secret-c"))
    served.clock.pass_interval()

    assert served.status("secret-a") == 401
    assert served.status("secret-c") == 200
    assert served.status("secret-b") == 200
    # The configured tokens are untouched by the file.
    assert served.status("token-alpha") == 200


def test_a_rotated_token__under_the_same_name__replaces_the_old_one(served: _Served) -> None:
    _write(served.path, _entry("file-a", "secret-a-2") + _entry("file-b", "secret-b"))
    served.clock.pass_interval()
    assert served.status("secret-a") == 401
    assert served.status("secret-a-2") == 200


def test_the_file__is_looked_at_no_more_than_once_an_interval(served: _Served) -> None:
    assert served.status("secret-a") == 200
    _write(served.path, _entry("file-c", "secret-c"))
    # Within the interval the node keeps what it read; the next interval reads the change.
    assert served.status("secret-a") == 200
    served.clock.pass_interval()
    assert served.status("secret-a") == 401


def test_a_change_in_place__with_the_same_size__is_seen(served: _Served) -> None:
    # Some editors rewrite in place: same inode and, here, the same size; the times differ.
    assert served.status("secret-a") == 200
    before = served.path.stat()
    served.path.write_text(_entry("file-x", "secret-x") + _entry("file-b", "secret-b"))
    os.utime(served.path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert served.path.stat().st_size == before.st_size
    served.clock.pass_interval()
    assert served.status("secret-a") == 401
    assert served.status("secret-x") == 200


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[tokens]\nname = ", "not valid TOML"),
        (
            '[[tokens]]\nname = "bad"\nsha256 = "abc123"\nrole = "tenant"\ntenant = "t"\n',
            "must be 64 hex digits",
        ),
        (_entry("dup", "secret-1") + _entry("dup", "secret-2"), "tokens.1.name: 'dup' is used"),
        (
            _entry("one", "secret-1") + _entry("two", "secret-1"),
            "tokens.1.sha256: the same token is configured twice",
        ),
        (_entry("alpha", "secret-new"), "'alpha' in the tokens file is used twice"),
        (_entry("again", "token-alpha"), "the same digest as token 'alpha'"),
        (_entry("boss", "secret-1", role="root"), "Invalid enum value 'root'"),
        ('[[tokens]]\nname = "x"\nsha256 = "' + "a" * 64 + '"\ncolour = "red"\n', "colour"),
        (_entry("slash", "secret-1", tenant="a/b"), "must be non-empty without '/'"),
    ],
    ids=[
        "bad toml",
        "bad digest",
        "name twice in the file",
        "token twice in the file",
        "name of a configured token",
        "token of a configured token",
        "unknown role",
        "unknown field",
        "bad tenant",
    ],
)
def test_an_invalid_file__is_refused_with_a_logged_error__and_the_previous_tokens_stay(
    served: _Served, text: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert served.status("secret-a") == 200
    with caplog.at_level(logging.ERROR, logger="xr.auth"):
        _write(served.path, text)
        served.clock.pass_interval()
        assert served.status("secret-a") == 200
    assert served.status("secret-b") == 200
    assert served.status("secret-1") == 401
    errors = [record.getMessage() for record in caplog.records if record.name == "xr.auth"]
    assert len(errors) == 1, errors
    assert str(served.path) in errors[0] and problem in errors[0], errors[0]
    # The digest of a token never appears in the message.
    assert hash_token("secret-1") not in errors[0]


def test_a_deleted_file__keeps_the_previous_tokens(
    served: _Served, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="xr.auth"):
        served.path.unlink()
        served.clock.pass_interval()
        assert served.status("secret-a") == 200
    assert any("cannot read it" in record.getMessage() for record in caplog.records)
    # A file put back is read again.
    _write(served.path, _entry("file-c", "secret-c"))
    served.clock.pass_interval()
    assert served.status("secret-c") == 200
    assert served.status("secret-a") == 401


def test_an_empty_file__revokes_its_tokens_and_keeps_authentication_on(
    api: ApiNode, tmp_path: Path
) -> None:
    path = tmp_path / "tokens.toml"
    _write(path, "")
    auth = msgspec.structs.replace(api.config.auth, tokens=[], tokens_file=str(path))
    app = create_app(dataclasses.replace(api.config, auth=auth), store=api.store)
    client = api.run(api.serve(app))
    assert api.request("GET", _PROBE, token=None, client=client).status == 401
    assert api.request("GET", _PROBE, token="alpha", client=client).status == 401


@pytest.mark.parametrize(
    ("text", "problem"),
    [("not toml [", "not valid TOML"), (_entry("alpha", "x"), "'alpha'"), (None, "cannot read")],
    ids=["bad toml", "name of a configured token", "missing"],
)
def test_an_invalid_file_at_start__stops_the_node_naming_the_file(
    api: ApiNode, tmp_path: Path, text: str | None, problem: str
) -> None:
    path = tmp_path / "tokens.toml"
    if text is not None:
        _write(path, text)
    with pytest.raises(ConfigError) as raised:
        create_app(_config(api, path), store=api.store)
    assert "auth.tokens_file" in str(raised.value)
    assert str(path) in str(raised.value) and problem in str(raised.value)


def test_sighup__reads_the_file_at_once(api: ApiNode, tmp_path: Path) -> None:
    assert threading.current_thread() is threading.main_thread()
    path = tmp_path / "tokens.toml"
    _write(path, _entry("file-a", "secret-a"))
    # The clock never moves: only the signal can make the node read the file again.
    app = create_app(_config(api, path), store=api.store, clock=_ManualClock())
    auth = app[SERVICES].auth
    received: list[int] = []
    # A fallback, so that a handler the application failed to install cannot end pytest.
    previous = signal.signal(signal.SIGHUP, lambda number, frame: received.append(number))

    async def scenario() -> list[str]:
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            _write(path, _entry("file-b", "secret-b"))
            os.kill(os.getpid(), signal.SIGHUP)
            for _ in range(1000):
                if "file-b" in auth.token_names or received:
                    break
                await asyncio.sleep(0.01)
            return auth.token_names
        finally:
            await runner.cleanup()

    try:
        names = asyncio.run(scenario())
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert received == [], "the application did not install its SIGHUP handler"
    assert "file-b" in names and "file-a" not in names


def test_a_revoked_token__ends_the_event_streams_it_opened(served: _Served) -> None:
    # A stream opened before the revocation went on sending the tenant's new writes.
    headers = {"Authorization": "Bearer secret-a", "Accept": "text/event-stream"}
    writer = {"Authorization": "Bearer secret-b"}  # the same tenant's other token
    start = served.api.revision() + 1

    async def body() -> tuple[list[dict[str, Any]], bytes, bytes]:
        client = served.client
        async with (
            client.get(f"/v1/watch?prefix=&from_revision={start}", headers=headers) as watch,
            client.get("/v1/ui/events", headers=headers) as ui,
        ):
            assert (watch.status, ui.status) == (200, 200)
            await served.api.call(
                "PUT",
                "/v1/kv/before",
                json={"value": "1"},
                token=None,
                headers=writer,
                client=client,
            )
            before = await _sse_events(watch, 1)
            _write(served.path, _entry("file-b", "secret-b"))
            served.clock.pass_interval()
            await served.api.call(
                "PUT",
                "/v1/kv/after",
                json={"value": "2"},
                token=None,
                headers=writer,
                client=client,
            )
            # Both streams end within a second or two of the next look at the token.
            rest = await asyncio.wait_for(watch.content.read(), timeout=10.0)
            ui_rest = await asyncio.wait_for(ui.content.read(), timeout=10.0)
        return before, rest, ui_rest

    before, rest, ui_rest = served.api.run(body())
    assert [event["data"]["key"] for event in before] == ["before"]
    assert b"after" not in rest and b"auth.unauthenticated" in rest, rest
    assert b'"after"' not in ui_rest
    assert served.status("secret-a") == 401
