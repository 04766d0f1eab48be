"""Garbage and replayed frames on the Raft port of real members, with and without a cluster
secret.

pysyncobj 0.3.17 frames peer traffic as a 4-byte length (a signed int in the machine's byte
order) and then `zlib(pickle(message))`, wrapped in a Fernet token (AES-CBC + HMAC-SHA256, key
derived from the secret) when `raft.cluster_secret` is set. A connection starts with a handshake:
without a secret the connecting side sends its address; with one, each side sends a random key and
every later message must carry the other side's key.

Two members run in this process on loopback (A connects to B, because pysyncobj connects from the
larger address to the smaller one), with a recording TCP proxy in front of B's Raft port: B
listens on `bind_address` and advertises the proxy's port, so A's connection to B is recorded
byte for byte. Then every member's Raft port gets, each on a fresh connection: random bytes,
truncated frames, huge and negative length prefixes, frames of garbage, a well-framed pickle that
records when it is unpickled (the canary), and the recorded A-to-B bytes replayed. Afterwards:

- each member still runs and the cluster still commits writes;
- nothing was applied twice: the KV revision and history hold exactly the writes made, once each,
  and both members hold the same keys;
- the canary never ran. With a secret, garbage is refused before pickle sees it, and a replay
  breaks off at the handshake's random key. Without one, pysyncobj unpickles what arrives, and
  ran the canary (its documented loopback trust) until `raftstore.pickling` refused every global
  but the few its messages hold (docs/robustness.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket
import struct
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any, TypeVar

import pytest

from raftstore.config import RaftConfig
from raftstore.store import RaftStore
from xrcore.commands import KvPut

pytestmark = pytest.mark.integration

T = TypeVar("T")
WAIT_S = 30.0
SECRET = "fuzz-cluster-secret"
WRITES_BEFORE = 5
# How long a replayed connection is kept open for the member to read what it was sent: a pause
# for the member to work, not a bound that is asserted.
REPLAY_HOLD_S = 1.0

# Unpickled canaries, by label: a pickle that calls `mark_unpickled` when it is loaded.
UNPICKLED: list[str] = []


def mark_unpickled(label: str) -> str:
    UNPICKLED.append(label)
    return label


class Canary:
    def __init__(self, label: str) -> None:
        self.label = label

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (mark_unpickled, (self.label,))


def frame(payload: bytes) -> bytes:
    return struct.pack("i", len(payload)) + payload


def plain_frame(message: Any) -> bytes:
    """A frame as pysyncobj writes one without a secret."""
    return frame(zlib.compress(pickle.dumps(message, protocol=2), 3))


def garbage(random: Random, canary_label: str) -> dict[str, bytes]:
    """What is sent to each member, one item per fresh connection."""
    valid = plain_frame("127.0.0.1:1")
    return {
        "random bytes": random.randbytes(4096),
        "random short": random.randbytes(3),
        "truncated frame": valid[: len(valid) - 3],
        "length prefix only": struct.pack("i", 100),
        "huge length prefix": struct.pack("i", (1 << 31) - 1) + random.randbytes(1024),
        "negative length prefix": struct.pack("i", -5) + random.randbytes(64),
        "zero length": struct.pack("i", 0) * 8,
        "frame of random bytes": frame(random.randbytes(256)),
        "frame of zlib garbage": frame(zlib.compress(random.randbytes(256))),
        "frame of a fernet-looking token": frame(b"gAAAAAB" + random.randbytes(120)),
        "unknown peer": plain_frame("10.9.9.9:9") + plain_frame({"type": "append_entries"}),
        "canary": plain_frame(Canary(canary_label)),
    }


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for item in sockets:
            item.bind(("127.0.0.1", 0))
        return [item.getsockname()[1] for item in sockets]
    finally:
        for item in sockets:
            item.close()


async def _eventually(check: Callable[[], Awaitable[T | None]], timeout_s: float = WAIT_S) -> T:
    deadline_s = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await check()
        if value is not None and value is not False:
            return value
        if asyncio.get_running_loop().time() > deadline_s:
            raise AssertionError("the condition was not reached in time")
        await asyncio.sleep(0.05)


@dataclass
class RecordingProxy:
    """Forwards connections to `target_port`, keeping what each client sent."""

    target_port: int
    recorded: list[bytearray] = field(default_factory=list)
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        recorded = bytearray()
        self.recorded.append(recorded)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            writer.close()
            return
        pumps = [
            asyncio.create_task(self._pump(reader, upstream_writer, recorded)),
            asyncio.create_task(self._pump(upstream_reader, writer, None)),
        ]
        self.tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for closing in (writer, upstream_writer):
            closing.close()

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, recorded: bytearray | None
    ) -> None:
        while data := await reader.read(65536):
            if recorded is not None:
                recorded += data
            writer.write(data)
            await writer.drain()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.tasks:
            task.cancel()


async def send_and_close(port: int, data: bytes, *, hold_s: float = 0.0) -> None:
    """Sends `data` on a fresh connection; with `hold_s`, reads what comes back for that long
    (or until the member hangs up) before closing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        if hold_s:
            with contextlib.suppress(TimeoutError, ConnectionError):
                async with asyncio.timeout(hold_s):
                    while await reader.read(65536):
                        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _kv_view(store: RaftStore) -> tuple[int, dict[str, tuple[bytes, int, int]], list[int]]:
    """The KV revision, each key's (value, mod_revision, version) and the history's revisions."""

    def view(machine: Any) -> tuple[int, dict[str, tuple[bytes, int, int]], list[int]]:
        keys = {
            key: (record.value, record.mod_revision, record.version)
            for key, record in machine.keys.items()
        }
        return machine.revision, keys, [event.revision for event in machine.history]

    return store.replica.read(view)


async def run_scenario(tmp_path: Path, *, secret: str | None) -> list[str]:
    UNPICKLED.clear()
    proxy_port, b_port, a_port = _free_ports(3)
    a_address, b_address = f"127.0.0.1:{a_port}", f"127.0.0.1:{proxy_port}"
    if a_address < b_address:
        # pysyncobj connects from the larger address: A must be the larger, so that A's
        # connection goes through the proxy.
        a_port, proxy_port = proxy_port, a_port
        a_address, b_address = f"127.0.0.1:{a_port}", f"127.0.0.1:{proxy_port}"
    proxy = RecordingProxy(target_port=b_port)
    await proxy.start(proxy_port)
    a = RaftStore(
        RaftConfig(
            self_address=a_address,
            peers=(b_address,),
            data_dir=tmp_path / "a",
            cluster_secret=secret,
        )
    )
    b = RaftStore(
        RaftConfig(
            self_address=b_address,
            peers=(a_address,),
            data_dir=tmp_path / "b",
            cluster_secret=secret,
            bind_address=f"127.0.0.1:{b_port}",
        )
    )
    await a.start()
    await b.start()
    try:
        client_id = "fuzz-client"
        seq = 0

        async def put(key: str) -> None:
            nonlocal seq
            seq += 1

            async def attempt() -> bool | None:
                leader = a if a.is_leader else b if b.is_leader else None
                if leader is None:
                    return None
                try:
                    applied = await leader.propose(
                        KvPut(key=key, value=key.encode()), client_id=client_id, seq=seq
                    )
                except Exception:
                    # Indefinite or unavailable: retried with the same (client_id, seq), so it
                    # is applied at most once.
                    return None
                applied.result.unwrap()
                return True

            await _eventually(attempt)

        for number in range(WRITES_BEFORE):
            await put(f"before-{number}")

        async def replicated() -> bool:
            return _kv_view(a)[0] == _kv_view(b)[0] == WRITES_BEFORE

        await _eventually(replicated)
        assert proxy.recorded and len(proxy.recorded[0]) > 0, "nothing was recorded"
        recording = bytes(proxy.recorded[0])

        random = Random(1)
        for port in (a_port, b_port):
            for label, data in garbage(random, canary_label=f"canary->{port}").items():
                await send_and_close(port, data, hold_s=0.2 if label == "canary" else 0.0)
        # The recorded bytes of A's connection, replayed to B as if A had connected again.
        await send_and_close(b_port, recording, hold_s=REPLAY_HOLD_S)
        await send_and_close(b_port, recording[: len(recording) // 2], hold_s=REPLAY_HOLD_S)

        # Both members still run and the cluster still commits.
        await put("after")

        async def converged() -> tuple[Any, Any] | None:
            views = _kv_view(a), _kv_view(b)
            return views if views[0] == views[1] else None

        view_a, _ = await _eventually(converged)
        revision, keys, history = view_a
        expected = {f"before-{number}" for number in range(WRITES_BEFORE)} | {"after"}
        assert set(keys) == expected
        # Each write applied once: one revision each, every key at version 1, no repeats.
        assert revision == len(expected)
        assert sorted(version for _, _, version in keys.values()) == [1] * len(expected)
        assert history == list(range(1, len(expected) + 1))
        return list(UNPICKLED)
    finally:
        await a.stop()
        await b.stop()
        await proxy.stop()


def test_raft_port__with_a_secret__garbage_and_replays_are_refused_before_unpickling(
    tmp_path: Path,
) -> None:
    unpickled = asyncio.run(run_scenario(tmp_path, secret=SECRET))
    assert unpickled == []


def test_raft_port__without_a_secret_on_loopback__members_survive_nothing_applies_twice_or_runs(
    tmp_path: Path,
) -> None:
    unpickled = asyncio.run(run_scenario(tmp_path, secret=None))
    # Without a secret pysyncobj unpickles whatever arrives, and the canary ran on both members
    # (pysyncobj's loopback trust) until raftstore.pickling refused the function it names.
    assert unpickled == []
