"""Clusters on free loopback ports, for tests that talk to a member's Raft port as a stranger: one
member alone, or two running members of three, whose third address a stranger gives as its own."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket
import struct
import zlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from raftstore.config import RaftConfig
from raftstore.store import RaftStore


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def start_member(tmp_path: Path, secret: str | None, **settings: Any) -> RaftStore:
    """A started one-member cluster on a free loopback port, with `settings` for its config."""
    store = RaftStore(
        RaftConfig(
            self_address=f"127.0.0.1:{free_port()}",
            peers=(),
            data_dir=tmp_path / "raft",
            cluster_secret=secret,
            **settings,
        )
    )
    await store.start()
    return store


def raft_port(store: RaftStore) -> int:
    return int(store.config.self_address.rpartition(":")[2])


@contextlib.asynccontextmanager
async def two_of_three(tmp_path: Path) -> AsyncIterator[tuple[str, list[RaftStore]]]:
    """Two started members of a three-member cluster, and the third's address, which no member
    holds (a stranger may give it as its own); the members are stopped on exit."""
    absent, *running = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    stores = [
        RaftStore(
            RaftConfig(
                self_address=address,
                peers=tuple(peer for peer in (absent, *running) if peer != address),
                data_dir=tmp_path / address.replace(":", "_"),
            )
        )
        for address in running
    ]
    try:
        for store in stores:
            await store.start()
        yield absent, stores
    finally:
        for store in stores:
            await store.stop()


async def leader_of(stores: list[RaftStore]) -> RaftStore:
    async with asyncio.timeout(30):
        while not any(store.is_leader for store in stores):
            await asyncio.sleep(0.05)
    return next(store for store in stores if store.is_leader)


def plain_frame(message: object) -> bytes:
    """`message` framed as pysyncobj 0.3.17 frames it without a secret."""
    payload = zlib.compress(pickle.dumps(message, protocol=2))
    return struct.pack("i", len(payload)) + payload


async def send_as(member: str, store: RaftStore, messages: Sequence[object], hold_s: float) -> None:
    """Connects to `store`'s Raft port, says it is `member`, sends `messages` and holds the
    connection `hold_s` (a pause for the store to read them, not a bound) before closing it."""
    _, writer = await asyncio.open_connection("127.0.0.1", raft_port(store))
    writer.write(b"".join(plain_frame(message) for message in [member, *messages]))
    await writer.drain()
    await asyncio.sleep(hold_s)
    writer.close()
