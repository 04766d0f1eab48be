"""The HTTP API under requests generated from its own OpenAPI document (Schemathesis).

A node serves the API on a loopback port; Schemathesis reads the document the node serves at
/v1/openapi.json and generates requests for every operation: valid ones (positive mode) and ones
that break the document (negative mode: wrong types, missing and unknown fields, out-of-range
numbers, bad headers). Every answer must pass these checks:

- no 5xx, and an answer within `REQUEST_TIMEOUT_S` (no hang);
- the status code, content type, headers and body are those the document declares for the
  operation (and a negative request is refused with a 4xx);
- a refused request (any 4xx) changes nothing: the replica's state before and after it is the
  same (`state_digest` says exactly what is compared).

Runs are made with an admin token, a tenant token and no token on a node that has tokens, and
without a token on a node with authentication off. The node's clock stands still (`FrozenClock`)
so that no session or attempt expires during a run: any difference in state across a refused
request is that request's doing. `/v1/ui/events` is left out: it is an endless stream, and
`tests/node/test_ui.py` reads it.

The default run sends `DEFAULT_REQUESTS` requests in all; the slow run (`make test-slow`) sends
`SLOW_REQUESTS`, in the same modes. Each run asserts how many requests it sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from node.api.app import create_app
from node.config import NodeConfig, hash_token, load_config
from raftstore.store import RaftStore
from tests.node.conftest import TOKENS, ApiNode, eventually
from xrcore.codec import decode_snapshot, encode_snapshot

pytestmark = pytest.mark.integration

# Every request gets an answer within this, or the run fails: long polls wait at most
# `WAIT_MAX_S`, far below it.
REQUEST_TIMEOUT_S = 10.0
WAIT_MAX_S = 0.2
DEFAULT_REQUESTS = 1_000
SLOW_REQUESTS = 2_000
# The node's clock: any fixed time will do.
FROZEN_NOW_MS = 1_700_000_000_000

_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


class FrozenClock:
    """Wall time that never moves (so the lease clock never moves and nothing expires), and a
    real monotonic clock for deadlines."""

    def now_ms(self) -> int:
        return FROZEN_NOW_MS

    def monotonic_s(self) -> float:
        return time.monotonic()


def _config(data_dir: Path, raft_address: str, *, tokens: bool) -> NodeConfig:
    text = (
        f"[http]\nwait_max_s = {WAIT_MAX_S}\nbody_bytes_max = 200000\n"
        "waiting_requests_max = 4\nstreams_max = 2\n\n[auth]\n"
    )
    if tokens:
        text += "".join(
            f'[[auth.tokens]]\nname = "{name}"\nsha256 = "{hash_token(secret)}"\n'
            f'role = "{role}"\ntenant = "{tenant}"\n'
            for name, (secret, role, tenant) in TOKENS.items()
        )
    path = data_dir / "fuzz-node.toml"
    path.write_text(text)
    return load_config(
        path=path,
        environ={},
        overrides={"region.name": "r0", "raft.address": raft_address, "data_dir": str(data_dir)},
    )


class FuzzNode(ApiNode):
    """`ApiNode` with a frozen clock, short waits, and tokens or none."""

    def __init__(self, data_dir: Path, *, tokens: bool) -> None:
        self.tokens = tokens
        super().__init__(data_dir)

    async def _start(self) -> Any:
        self.config = _config(self.data_dir, self.config.raft.self_address, tokens=self.tokens)
        store = RaftStore(self.config.raft, clock=FrozenClock(), limits=self.limits)
        await store.start()
        await eventually(lambda: store.is_leader)
        self.app = create_app(self.config, store=store, clock=FrozenClock())
        client = await self.serve(self.app)
        return store, client

    @property
    def base_url(self) -> str:
        return str(self.client.make_url("")).rstrip("/")


async def quiesce(node: FuzzNode) -> None:
    """Waits for work an earlier request left behind (leaving a lock's queue after its client
    went away), so that it cannot land between the two digests of a later request."""
    background = list(node.services.background)
    if background:
        await asyncio.gather(*background, return_exceptions=True)


def state_digest(store: RaftStore) -> str:
    """A digest of the replica's whole state, less what moves without any request: the applied
    index and time (the leader's ticks advance them), and the table of clients' stored results
    (a refused write that carries `Xr-Client-Id`/`Xr-Seq` stores its error there, by design, so
    that a retry gets the same answer). Everything else is compared: keys and their revisions,
    the KV history, sessions, locks, fencing tokens, jobs and attempts, regions, tenants,
    learned durations and the scheduling revision."""
    snapshot = decode_snapshot(store.replica.read(lambda machine: machine.snapshot()))
    comparable = msgspec.structs.replace(snapshot, index=0, now_ms=0, lease_clock_ms=0, clients={})
    return hashlib.sha256(encode_snapshot(comparable)).hexdigest()


@dataclass
class Tally:
    """What a run sent and got."""

    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    refused_checked: int = 0
    parser_refusals: int = 0


@dataclass(frozen=True)
class Mode:
    """How a run authenticates: a token name from `TOKENS`, or none, on a node with or without
    tokens."""

    name: str
    node_has_tokens: bool
    token: str | None


MODES = (
    Mode("admin", node_has_tokens=True, token="admin"),
    Mode("tenant", node_has_tokens=True, token="alpha"),
    Mode("no-token", node_has_tokens=True, token=None),
    Mode("auth-off", node_has_tokens=False, token=None),
)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, FuzzNode]]:
    started: dict[bool, FuzzNode] = {}
    try:
        for tokens in (True, False):
            directory = tmp_path_factory.mktemp(f"fuzz-{'tokens' if tokens else 'open'}")
            started[tokens] = FuzzNode(directory, tokens=tokens)
        yield started
    finally:
        for node in started.values():
            node.close()


def _schema(node: FuzzNode) -> Any:
    schema = schemathesis.openapi.from_url(
        f"{node.base_url}/v1/openapi.json", timeout=REQUEST_TIMEOUT_S
    )
    # The API ignores query parameters it does not know, as HTTP APIs commonly do (bodies are
    # closed: their unknown fields are refused); the token is sent by `fuzz`, not generated.
    schema.config.generation.update(allow_extra_parameters=False, with_security_parameters=False)
    # An oversize parameter or body is refused with 413 (limit.payload_too_large), as declared.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    return schema.exclude(operation_id="uiEvents")


def _refused_by_http_parser(response: schemathesis.Response) -> bool:
    """aiohttp's HTTP parser refuses a request line or header over 8,190 bytes with a plain-text
    400 before the application sees it. A parameter within the document's `maxLength` (counted in
    characters) can exceed that once its UTF-8 bytes are percent-encoded; docs/robustness.md
    says so. Such an answer is a refusal (checked for no state change), not an API answer."""
    content_type = response.headers.get("content-type", [""])[0]
    return (
        response.status_code == 400
        and content_type.startswith("text/plain")
        and response.content.startswith(b"Got more than 8190 bytes")
    )


@dataclass(frozen=True)
class Seeded:
    """Objects made before a run in the caller's tenant, so that generated requests also reach
    live sessions, keys, locks and jobs rather than only missing ones (404)."""

    session_id: str
    job_id: str
    key: str
    lock: str
    region: str = "r0"

    def path_parameters(self, path: str, tenant: str) -> dict[str, str]:
        """Values for the path parameters of the operation at `path`."""
        if path.startswith("/v1/locks/"):
            name = self.lock
        elif path.startswith("/v1/regions/"):
            name = self.region
        else:
            name = tenant
        return {"session_id": self.session_id, "job_id": self.job_id, "key": self.key, "name": name}


_RUNS = itertools.count()


def seed(node: FuzzNode, mode: Mode) -> Seeded | None:
    """Makes a session, a key under it, a lock it holds and a job; None without access."""
    if mode.node_has_tokens and mode.token is None:
        return None
    token = mode.token if mode.node_has_tokens else None
    session_id = node.ok("POST", "/v1/sessions", token=token, json={"ttl_ms": 600_000})[
        "session_id"
    ]
    seeded_job = node.ok(
        "POST", "/v1/jobs", token=token, json={"name": "fuzz", "workload": "matmul"}
    )
    # Runs share a node: each seeds names of its own.
    run = next(_RUNS)
    seeded = Seeded(
        session_id=session_id,
        job_id=seeded_job["job_id"],
        key=f"fuzz-key-{run}",
        lock=f"fuzz-lock-{run}",
    )
    node.ok(
        "PUT",
        f"/v1/kv/{seeded.key}",
        token=token,
        json={"value": "x", "session_id": session_id},
    )
    acquired = node.ok(
        "POST", f"/v1/locks/{seeded.lock}/acquire", token=token, json={"session_id": session_id}
    )
    assert acquired["granted"], acquired
    return seeded


def fuzz(node: FuzzNode, mode: Mode, requests_max: int) -> Tally:
    """Sends `requests_max` generated requests, half valid and half not, checking each answer."""
    schema = _schema(node)
    headers = {} if mode.token is None else {"Authorization": f"Bearer {TOKENS[mode.token][0]}"}
    checks = list(_CHECKS)
    if mode.node_has_tokens and mode.token is not None:
        checks.append(ignored_auth)
    tally = Tally()
    session = requests.Session()
    strategy = st.one_of(
        schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
        schema.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    seeded = seed(node, mode)
    tenant = "default" if mode.token is None else TOKENS[mode.token][2]

    @settings(
        max_examples=requests_max,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=strategy, aim=st.booleans())
    def run(case: Any, aim: bool) -> None:
        if aim and seeded is not None:
            known = seeded.path_parameters(case.operation.path, tenant)
            for name in case.path_parameters or {}:
                if name in known:
                    case.path_parameters[name] = known[name]
        node.run(quiesce(node))
        before = state_digest(node.store)
        response = case.call(
            base_url=node.base_url, session=session, headers=headers, timeout=REQUEST_TIMEOUT_S
        )
        tally.requests += 1
        tally.statuses[response.status_code] += 1
        tally.operations[case.operation.label] += 1
        if _refused_by_http_parser(response):
            tally.parser_refusals += 1
        else:
            case.validate_response(
                response,
                checks=checks,
                headers=headers,
                transport_kwargs={
                    "base_url": node.base_url,
                    "session": session,
                    "headers": headers,
                },
            )
        if 400 <= response.status_code < 500:
            tally.refused_checked += 1
            after = state_digest(node.store)
            assert after == before, (
                f"{case.operation.label} was refused with {response.status_code} "
                f"({response.content[:200]!r}) but changed the state"
            )

    run()
    return tally


def _run(nodes: dict[bool, FuzzNode], mode: Mode, requests_max: int) -> None:
    tally = fuzz(nodes[mode.node_has_tokens], mode, requests_max)
    print(
        f"\nschemathesis {mode.name}: {tally.requests} requests, statuses "
        f"{dict(sorted(tally.statuses.items()))}, {len(tally.operations)} operations, "
        f"{tally.refused_checked} refused requests checked for no state change, "
        f"{tally.parser_refusals} refused by aiohttp's parser (request line too long)"
    )
    # Hypothesis stops early only when it has run out of distinct examples, which these
    # strategies do not: every planned request was sent.
    assert tally.requests >= requests_max
    assert not any(status >= 500 for status in tally.statuses)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_generated_requests__no_server_error_and_refusals_change_nothing(
    nodes: dict[bool, FuzzNode], mode: Mode
) -> None:
    _run(nodes, mode, DEFAULT_REQUESTS // len(MODES))


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_generated_requests__long_run(nodes: dict[bool, FuzzNode], mode: Mode) -> None:
    _run(nodes, mode, SLOW_REQUESTS // len(MODES))


# What the runs found, each as a plain test: these fail without their fixes.


def test_value_base64_that_is_not_ascii__is_refused_with_400(nodes: dict[bool, FuzzNode]) -> None:
    # Found by the run: base64 of non-ASCII text raised ValueError, answered 500.
    answer = nodes[False].request(
        "PUT", "/v1/kv/fuzz-base64", token=None, json={"value_base64": "\u00d5"}
    )
    assert answer.status == 400, answer.body
    assert answer.error_code == "request.invalid"


def test_seq_reused_for_another_command__is_refused_with_400(nodes: dict[bool, FuzzNode]) -> None:
    # Found by the run: the stored result of a KV put was answered to a session grant that
    # reused its (client_id, seq), and the session handler failed on it with a 500.
    node = nodes[False]
    headers = {"Xr-Client-Id": "fuzz-reuse", "Xr-Seq": "1"}
    put = node.request("PUT", "/v1/kv/fuzz-reuse", token=None, json={"value": "x"}, headers=headers)
    assert put.status == 200, put.body
    before = state_digest(node.store)
    grant = node.request(
        "POST", "/v1/sessions", token=None, json={"ttl_ms": 60_000}, headers=headers
    )
    assert grant.status == 400, grant.body
    assert "seq 1" in grant.document["error"]["message"]
    assert state_digest(node.store) == before
    # A true retry of the put still gets its stored result.
    again = node.request(
        "PUT", "/v1/kv/fuzz-reuse", token=None, json={"value": "x"}, headers=headers
    )
    assert again.document == put.document


def test_tenant_set__declares_the_403_a_tenant_gets(nodes: dict[bool, FuzzNode]) -> None:
    # Found by the run: a tenant's PUT /v1/tenants/{name} answers 403, which was undeclared.
    node = nodes[True]
    answer = node.request("PUT", "/v1/tenants/alpha", token="alpha", json={})
    assert answer.status == 403
    document = node.ok("GET", "/v1/openapi.json", token=None)
    assert "403" in document["paths"]["/v1/tenants/{name}"]["put"]["responses"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/v1/kv/fuzz-big?expected_mod_revision=" + "9" * 25, None),
        ("PUT", "/v1/kv/fuzz-big", b'{"value": "x", "expected_mod_revision": ' + b"9" * 25 + b"}"),
        ("GET", "/v1/watch?from_revision=" + "9" * 25, None),
    ],
    ids=["query", "body", "watch"],
)
def test_integer_beyond_64_bits__is_refused_with_400(
    nodes: dict[bool, FuzzNode], method: str, path: str, body: bytes | None
) -> None:
    # Found by the run: an integer msgpack cannot hold failed the encoder (or islice, for a
    # watch) with a 500.
    headers = {"Content-Type": "application/json", "Accept": "application/msgpack"}
    answer = nodes[False].request(method, path, token=None, body=body, headers=headers)
    assert answer.status == 400, answer.body
    assert answer.error_code == "request.invalid"
