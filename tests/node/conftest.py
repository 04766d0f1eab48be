"""A region node's HTTP API in one process, for the `test_api_*` modules.

Each `ApiNode` is a single-member RaftStore (it elects itself) and the application from
`create_app`, served on a loopback socket by aiohttp's `TestServer`. pytest-asyncio is not
installed and a store belongs to the event loop it started on, so a node runs its own event loop
in a background thread and tests hand it coroutines (`run`) or plain requests (`request`). One
node serves the whole session, so there is one election, not one per test; tests keep apart by
using their own key, lock and job names.

The shared node has four tokens (see `TOKENS`): an admin and an operator of tenant `ops`, and
tenants `alpha` and `beta`. Its limits are small where tests need to reach them: one waiting
request at a time, waits of at most `WAIT_MAX_S`, bodies of at most `BODY_BYTES_MAX`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from node.api.app import SERVICES, Services, create_app
from node.config import NodeConfig, hash_token, load_config
from raftstore.store import RaftStore
from xrcore.commands import Command, RegionRegister, TaskAssign, TaskClaim
from xrcore.limits import DEFAULT_LIMITS, Limits

T = TypeVar("T")

# name -> (bearer token, role, tenant)
TOKENS: dict[str, tuple[str, str, str]] = {
    "admin": ("token-admin", "admin", "ops"),
    "operator": ("token-operator", "operator", "ops"),
    "alpha": ("token-alpha", "tenant", "alpha"),
    "beta": ("token-beta", "tenant", "beta"),
}
WAIT_MAX_S = 5.0
# Above the largest KV value (64 KiB) as JSON, so only deliberately oversize bodies reach it.
BODY_BYTES_MAX = 200_000
# A failsafe against a hung test, not an assertion about speed.
RUN_TIMEOUT_S = 60.0
EVENTUALLY_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def node_config(
    data_dir: Path, raft_address: str, *, open_health: bool = True, waiting_requests_max: int = 1
) -> NodeConfig:
    """The configuration every API test node uses, from a TOML file as an operator writes it."""
    tokens = "".join(
        f'[[auth.tokens]]\nname = "{name}"\nsha256 = "{hash_token(secret)}"\n'
        f'role = "{role}"\ntenant = "{tenant}"\n'
        for name, (secret, role, tenant) in TOKENS.items()
    )
    text = (
        f"[http]\nbody_bytes_max = {BODY_BYTES_MAX}\nwait_max_s = {WAIT_MAX_S}\n"
        f"waiting_requests_max = {waiting_requests_max}\nstreams_max = 4\n\n"
        f"[auth]\nopen_health = {'true' if open_health else 'false'}\n{tokens}"
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"node-{'open' if open_health else 'closed'}.toml"
    path.write_text(text)
    return load_config(
        path=path,
        environ={},
        overrides={"region.name": "r0", "raft.address": raft_address, "data_dir": str(data_dir)},
    )


@dataclass(frozen=True)
class Answer:
    """One HTTP answer, read in full."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def document(self) -> Any:
        if self.headers.get("Content-Type", "").startswith("application/msgpack"):
            return msgspec.msgpack.decode(self.body)
        return msgspec.json.decode(self.body)

    @property
    def error_code(self) -> str:
        code: str = self.document["error"]["code"]
        return code


def auth_headers(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {TOKENS[token][0]}"}


async def eventually(check: Callable[[], T | None], timeout_s: float = EVENTUALLY_TIMEOUT_S) -> T:
    """Polls `check` on the event loop until it returns something other than None or False."""
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + timeout_s
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if loop.time() > deadline_s:
            raise AssertionError("the condition was not reached in time")
        await asyncio.sleep(0.01)


class ApiNode:
    """A single-member node serving the API, with its own event loop on a thread."""

    def __init__(self, data_dir: Path, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.data_dir = data_dir
        self.config = node_config(data_dir, f"127.0.0.1:{_free_port()}")
        self.limits = limits
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="api-test-loop")
        self._thread.start()
        self._clients: list[TestClient[Any, Any]] = []
        self.store, self.client = self.run(self._start())

    async def _start(self) -> tuple[RaftStore, TestClient[Any, Any]]:
        store = RaftStore(self.config.raft, limits=self.limits)
        await store.start()
        await eventually(lambda: store.is_leader)
        self.app = create_app(self.config, store=store)
        client = await self.serve(self.app)
        return store, client

    async def serve(self, app: web.Application) -> TestClient[Any, Any]:
        """Serves an application on a loopback port, closed with the node."""
        client: TestClient[Any, Any] = TestClient(TestServer(app))
        await client.start_server()
        self._clients.append(client)
        return client

    @property
    def services(self) -> Services:
        return self.app[SERVICES]

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(RUN_TIMEOUT_S)

    async def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = "alpha",
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        client: TestClient[Any, Any] | None = None,
    ) -> Answer:
        sent = {**auth_headers(token), **(headers or {})}
        if json is not None:
            body = msgspec.json.encode(json)
            sent.setdefault("Content-Type", "application/json")
        async with (client or self.client).request(method, path, data=body, headers=sent) as got:
            return Answer(status=got.status, headers=dict(got.headers), body=await got.read())

    def request(
        self,
        method: str,
        path: str,
        *,
        token: str | None = "alpha",
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        client: TestClient[Any, Any] | None = None,
    ) -> Answer:
        return self.run(
            self.call(
                method, path, token=token, json=json, body=body, headers=headers, client=client
            )
        )

    # Shortcuts for set-up steps that are not what a test checks.

    def ok(self, method: str, path: str, **options: Any) -> Any:
        """The document of a request that must succeed."""
        answer = self.request(method, path, **options)
        assert answer.status < 300, (answer.status, answer.body)
        return answer.document

    def session(self, token: str = "alpha") -> str:
        # Long enough to outlive the test session: an expiry would change state mid-test.
        granted = self.ok("POST", "/v1/sessions", token=token, json={"ttl_ms": 600_000})
        session_id: str = granted["session_id"]
        return session_id

    def register_region(self) -> str:
        """Registers this node's region, as the daemon does once a leader is known."""
        command = RegionRegister(
            name=self.config.region.name,
            http_address="127.0.0.1:1",
            raft_address=self.config.raft.self_address,
        )
        self.propose(command)
        return command.name

    def start_task(self, job_id: str, region: str, *, executor_id: str, lease_ttl_ms: int) -> None:
        """Places task 0 of `job_id` in `region` and claims it there, as the leader's pass and
        the region's executor do: the task runs, with its first attempt."""
        self.propose(TaskAssign(job_id=job_id, task_index=0, region=region))
        self.propose(
            TaskClaim(
                job_id=job_id,
                task_index=0,
                region=region,
                executor_id=executor_id,
                lease_ttl_ms=lease_ttl_ms,
            )
        )

    def propose(self, command: Command) -> Any:
        """Applies a command the API does not offer (an executor's task updates)."""

        async def propose() -> Any:
            return (await self.store.propose(command)).result.unwrap()

        return self.run(propose())

    def revision(self) -> int:
        """The KV store's revision (all tenants)."""
        revision: int = self.ok("GET", "/v1/kv?limit=1")["revision"]
        return revision

    def close(self) -> None:
        async def stop() -> None:
            for client in self._clients:
                await client.close()
            await self.store.stop()

        try:
            self.run(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


@pytest.fixture(scope="session")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    node = ApiNode(tmp_path_factory.mktemp("api-node"))
    try:
        yield node
    finally:
        node.close()
