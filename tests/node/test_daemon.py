"""The node daemon as real processes: readiness follows the quorum, SIGTERM on the leader hands
leadership over before the node exits, and a restarted node rejoins from its data directory
with every acknowledged write."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.localcluster import LocalCluster, LocalNode, free_ports

pytestmark = pytest.mark.integration
WAIT_S = 30.0


def _call(url: str, *, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10.0) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def _eventually(check: Any, what: str) -> Any:
    deadline_s = time.monotonic() + WAIT_S
    while time.monotonic() < deadline_s:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("daemon"), size=3)
    local.start()
    try:
        yield local
    finally:
        local.kill()


def _leader(cluster: LocalCluster) -> LocalNode:
    found: LocalNode = _eventually(cluster.leader, "a leader")
    return found


def test_sigterm_on_the_leader_hands_leadership_over_and_a_restart_rejoins(
    cluster: LocalCluster,
) -> None:
    leader = _leader(cluster)
    follower = next(node for node in cluster.nodes if node is not leader)
    status, _ = _call(f"{follower.url}/v1/kv/daemon/a", method="PUT", body={"value": "1"})
    assert status == 200
    leader.terminate()
    assert leader.exit_code == 0, leader.log_tail()
    assert "handed leadership to" in leader.log_tail()
    successor = _leader(cluster)
    assert successor is not leader
    status, _ = _call(f"{successor.url}/v1/kv/daemon/b", method="PUT", body={"value": "2"})
    assert status == 200
    leader.start()
    cluster.wait_ready(nodes=[leader], timeout_s=WAIT_S)
    for key, value in (("a", "1"), ("b", "2")):
        status, document = _call(f"{leader.url}/v1/kv/daemon/{key}?consistency=stale")
        if status != 200:  # the restarted node may still be catching up: wait for it
            _eventually(
                lambda key=key: (
                    _call(f"{leader.url}/v1/kv/daemon/{key}?consistency=stale")[0] == 200
                ),
                f"key {key} on the restarted node",
            )
            status, document = _call(f"{leader.url}/v1/kv/daemon/{key}?consistency=stale")
        assert document["value"] == value


def test_a_node_without_a_quorum_is_not_ready_and_refuses_default_reads(
    cluster: LocalCluster,
) -> None:
    survivor = cluster.nodes[0]
    others = cluster.nodes[1:]
    try:
        for node in others:
            node.kill()
        _eventually(lambda: _call(f"{survivor.url}/readyz")[0] == 503, "readyz 503")
        status, document = _call(f"{survivor.url}/v1/kv/daemon/a")
        assert status in (503, 504)
        assert document["error"]["definite"] is (status == 503)
        # A stale read still answers from local state and says so.
        status, document = _call(f"{survivor.url}/v1/kv/daemon/a?consistency=stale")
        assert status == 200 and document["stale"] is True
        assert _call(f"{survivor.url}/healthz")[0] == 200
    finally:
        for node in others:
            if not node.running:
                node.start()
        cluster.wait_ready(timeout_s=WAIT_S)


def test_a_node_with_an_invalid_configuration_exits_with_a_message(tmp_path: Path) -> None:
    local = LocalCluster(tmp_path, size=1, settings={"http.wait_max_s": "-3"})
    node = local.nodes[0]
    node.start()
    assert node.process is not None
    assert node.process.wait(30) == 2
    assert "http.wait_max_s" in node.log_tail()


def test_a_node_whose_raft_port_is_taken_exits_with_a_message(tmp_path: Path) -> None:
    """pysyncobj retries a failed bind forever by default, and its constructor spun on it: the
    node hung at start, silent, on one core."""
    local = LocalCluster(tmp_path, size=1)
    node = local.nodes[0]
    with socket.create_server((node.host, node.raft_port)):
        node.start()
        assert node.process is not None
        try:
            assert node.process.wait(30) == 1
        finally:
            node.kill()
    assert f"cannot listen for Raft on {node.raft_address}: Address already in use" in (
        node.log_tail()
    )


def test_a_second_node_on_a_data_directory_in_use_is_refused_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """Two nodes on one data directory wrote one journal through two memory maps: the second
    logged errors on every tick, and an acknowledged write was gone after a restart."""
    local = LocalCluster(tmp_path, size=1)
    first = local.nodes[0]
    first.start()
    assert first.process is not None
    second: LocalNode | None = None
    try:
        _eventually(lambda: first.ready(), "the first node ready")
        status, _ = _call(f"{first.url}/v1/kv/x", method="PUT", body={"value": "1"})
        assert status == 200
        raft_port, http_port = free_ports(2)
        second = dataclasses.replace(
            first, region="second", raft_port=raft_port, http_port=http_port, process=None,
            log_path=tmp_path / "second.log", peers=[],
        )  # fmt: skip
        second.start()
        assert second.process is not None
        assert second.process.wait(30) == 2
        assert (
            f"data_dir {first.data_dir} is in use by another node (pid {first.process.pid})"
            in second.log_tail()
        ), second.log_tail()
    finally:
        if second is not None:
            # Without the lock it would run on (a failing run must not leave it behind).
            second.kill()
        first.terminate()
    first.start()
    try:
        _eventually(lambda: first.ready(), "the first node ready again")
        status, document = _call(f"{first.url}/v1/kv/x")
        assert status == 200 and document["value"] == "1", document
    finally:
        first.terminate()


def test_a_connection_that_never_finishes_its_headers_is_closed(tmp_path: Path) -> None:
    """A client that connects and sends its headers a byte at a time, or none at all, held a
    connection (a file descriptor) for about an hour (aiohttp's default); many such clients
    could take every descriptor the node has. `http.idle_timeout_s` closes them."""
    local = LocalCluster(tmp_path, size=1, settings={"http.idle_timeout_s": "1"})
    local.start()
    try:
        node = local.nodes[0]
        with socket.create_connection((node.host, node.http_port), timeout=WAIT_S) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            # Blocks until the node closes the connection; the socket's timeout (30 s) would
            # raise instead, as with aiohttp's default of about an hour.
            assert slow.recv(1) == b""
        # Requests are answered as before.
        status, _ = _call(f"{node.url}/healthz")
        assert status == 200
    finally:
        local.kill()


def _answer(connection: socket.socket) -> tuple[bytes, Any]:
    """The status line and the JSON body of one HTTP answer read from `connection`."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += connection.recv(65536) or b"\r\n\r\n"
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = connection.recv(65536)
        if not chunk:
            break
        body += chunk
    return head.split(b"\r\n")[0], json.loads(body) if body else None


def test_a_request_body_that_does_not_arrive_in_time_is_answered_408(tmp_path: Path) -> None:
    """A body sent slowly, or announced and never sent, held its connection and its place among
    the requests in flight without end: 300 of them made every other request 429.
    `http.request_timeout_s` (documented, but read by nothing) now bounds it."""
    local = LocalCluster(tmp_path, size=1, settings={"http.request_timeout_s": "0.5"})
    local.start()
    try:
        node = local.nodes[0]
        with socket.create_connection((node.host, node.http_port), timeout=WAIT_S) as slow:
            slow.sendall(
                b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"value": "'
            )
            # The socket's timeout (30 s) raises if the node never answers.
            status_line, document = _answer(slow)
        assert status_line.startswith(b"HTTP/1.1 408 "), status_line
        assert document["error"]["code"] == "request.body_timeout"
        assert "http.request_timeout_s" in document["error"]["message"]
        assert _call(f"{node.url}/v1/kv/slow")[0] == 404  # nothing was written
    finally:
        local.kill()


def test_the_api_server_takes_request_bodies_as_sent(tmp_path: Path) -> None:
    """aiohttp inflated every compressed request body on the event loop, even one the node
    refused and aiohttp only drained: a few gzip bombs kept /healthz waiting for seconds. The
    node's server now hands bodies over as sent: here a handler reads the gzip bytes."""
    import asyncio
    import gzip

    from aiohttp import web

    from node.api.connections import CappedAppRunner
    from node.config import load_config
    from node.daemon import http_server_options

    config = load_config(
        path=None,
        overrides={"region.name": "r0", "data_dir": str(tmp_path), "raft.address": "127.0.0.1:1"},
    )
    body = gzip.compress(b'{"value": "x"}')

    async def scenario() -> bytes:
        async def echo(request: web.Request) -> web.Response:
            return web.Response(body=await request.read())

        app = web.Application()
        app.router.add_put("/echo", echo)
        runner = CappedAppRunner(app, connections_max=8, **http_server_options(config))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            port = runner.addresses[0][1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"PUT /echo HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nConnection: close"
                b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            answer = await reader.read()
            writer.close()
            return answer.partition(b"\r\n\r\n")[2]
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == body


def test_a_compressed_request_body_is_refused(tmp_path: Path) -> None:
    """End to end: the node refuses a compressed body with its own message."""
    local = LocalCluster(tmp_path, size=1)
    local.start()
    try:
        node = local.nodes[0]
        body = b"certainly not gzip"
        with socket.create_connection((node.host, node.http_port), timeout=WAIT_S) as client:
            client.sendall(
                b"PUT /v1/kv/zipped HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Encoding: gzip\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            status_line, document = _answer(client)
        assert status_line.startswith(b"HTTP/1.1 400 "), status_line
        assert document["error"]["code"] == "request.invalid"
        assert "not accepted compressed" in document["error"]["message"]
    finally:
        local.kill()


def test_connections_past_the_bound_are_answered_429_and_closed(tmp_path: Path) -> None:
    """Connections were not bounded: clients holding many could take every descriptor the
    process may have, and the node (Raft included) would stop working."""
    connections_max = 4
    local = LocalCluster(tmp_path, size=1, settings={"http.connections_max": str(connections_max)})
    local.start()
    held: list[socket.socket] = []
    try:
        node = local.nodes[0]
        address = (node.host, node.http_port)
        held = [socket.create_connection(address, timeout=WAIT_S) for _ in range(connections_max)]
        with socket.create_connection(address, timeout=WAIT_S) as refused:
            answer = b""
            while chunk := refused.recv(4096):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429 ") and b"Retry-After: 1" in head
        assert json.loads(body)["error"]["code"] == "limit.capacity"
        for connection in held:
            connection.close()
        held = []
        _eventually(lambda: _call(f"{node.url}/healthz")[0] == 200, "a connection is taken again")
        # The refusal is counted, with the bound, where operators look.
        with urllib.request.urlopen(f"{node.url}/metrics", timeout=WAIT_S) as response:
            metrics = response.read().decode()
        samples = dict(
            line.split(" ", 1) for line in metrics.splitlines() if line.startswith("xr_http_conn")
        )
        # At least the one above; a health check made before the node saw the others close
        # may have been refused too.
        assert float(samples["xr_http_connections_refused_total"]) >= 1.0, samples
        assert samples["xr_http_connections_max"] == f"{float(connections_max)}"
        assert samples["xr_http_connections"] == "1.0"
    finally:
        for connection in held:
            connection.close()
        local.kill()


# Run in place of `python -m node.cli`: the store's start blocks the event loop for a second (as
# resolving an absent peer's name did, for 11 s in a container) and then never finishes.
_STALLED_START = """
import asyncio, sys, time
from raftstore.store import RaftStore
started = RaftStore.start
async def stalled_start(self):
    print("store starting", flush=True)
    time.sleep(1.0)
    await started(self)
    await asyncio.sleep(3600)
RaftStore.start = stalled_start
from node.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_during_start_up__stops_the_node_at_once_and_it_exits_0(tmp_path: Path) -> None:
    """The handlers were installed once the node had started: a SIGTERM before that killed an
    ordinary process uncleanly, and was dropped by a container's PID 1 (the kernel drops a
    signal whose action is the default there), so `docker stop` waited its grace period and
    sent SIGKILL."""
    import signal
    import subprocess

    local = LocalCluster(tmp_path, size=1)
    node = local.nodes[0]
    node.data_dir.mkdir(parents=True)
    command = node.command()
    at = command.index("-m")
    command[at : at + 2] = ["-c", _STALLED_START]
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with node.log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            env=environment,
        )  # fmt: skip
    try:
        _eventually(lambda: "store starting" in node.log_tail(), "the store starting")
        process.send_signal(signal.SIGTERM)  # while the loop is blocked
        sent_s = time.monotonic()
        exit_code = process.wait(WAIT_S)
        stopped_in_s = time.monotonic() - sent_s
    finally:
        process.kill()
        process.wait()
    output = node.log_tail()
    assert exit_code == 0, output
    assert stopped_in_s < 10.0, output  # not the 45 s grace period and a SIGKILL
    assert f"stopping region {node.region} during start-up" in output
    assert f"region {node.region} stopped" in output
    assert "ready at" not in output


def test_the_ready_line_is_a_json_log_line_with_log_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With `log.json` the ready line was plain text among the JSON lines."""
    from node.config import load_config
    from node.daemon import _say_ready

    settings = {"region.name": "r0", "data_dir": str(tmp_path), "raft.address": "127.0.0.1:1"}
    _say_ready(load_config(environ={}, overrides={**settings, "http.address": "127.0.0.1:9"}))
    assert capsys.readouterr().out == "xr node r0 ready at http://127.0.0.1:9\n"
    _say_ready(load_config(environ={}, overrides={**settings, "log.json": "true"}))
    (line,) = capsys.readouterr().out.splitlines()
    document = json.loads(line)
    assert document["message"] == "xr node r0 ready at http://127.0.0.1:8700"
    assert (document["level"], document["logger"], document["region"]) == ("info", "xr.node", "r0")


def test_json_logs_carry_the_request_id_and_route() -> None:
    import logging

    from node.daemon import JsonFormatter

    record = logging.LogRecord("xr.access", logging.WARNING, __file__, 1, "GET %s", ("/x",), None)
    record.request_id = "abc-1"
    record.route = "/v1/kv/{key}"
    document = json.loads(JsonFormatter().format(record))
    assert document["message"] == "GET /x"
    assert (document["request_id"], document["route"], document["level"]) == (
        "abc-1",
        "/v1/kv/{key}",
        "warning",
    )
