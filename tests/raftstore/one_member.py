"""A one-member cluster on a free loopback port, for tests that talk to a member's Raft port."""

from __future__ import annotations

import socket
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
