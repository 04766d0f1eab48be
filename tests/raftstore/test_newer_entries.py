"""A member stops applying the log at an entry a newer release wrote, and goes on once upgraded.

An entry of an envelope version above this release's (`codec.newer_version`) is one a newer node
wrote for newer nodes, which apply it. A member that skipped it, as it skips a malformed entry,
would differ from them from there on: the rolling-upgrade QA pass of session 31 saw such a node
acknowledge writes its peers refused. So the member stops there: it applies nothing past it,
refuses requests (ClusterUnavailable, on which clients try another node), still keeps and votes
on the log, and once restarted as the newer release applies the log from that entry on, losing
nothing. Without the stop the first test fails: each member skips the entry and applies the rest.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import pickle
from pathlib import Path
from typing import Any

import pytest

from raftstore import replica as replica_module
from raftstore.config import RaftConfig
from raftstore.replica import encode_group
from raftstore.store import RaftStore
from tests.raftstore.one_member import free_port, leader_of
from xrcore import codec
from xrcore.codec import Envelope, encode
from xrcore.commands import KvPut
from xrcore.errors import ClusterUnavailable

pytestmark = pytest.mark.integration


def _entry(key: str, version: int) -> bytes:
    """A KV put of `key` as an envelope of `version` (a newer release's, above 1)."""
    entry = encode(Envelope(command=KvPut(key=key, value=b"v"), now_ms=1))
    assert entry.count(b"\xa1v\x01") == 1
    return entry.replace(b"\xa1v\x01", b"\xa1v" + bytes((version,)))


def _raw(entries: list[bytes]) -> bytes:
    """A log entry calling `apply_group`, as pysyncobj logs one (`raftstore.entries`)."""
    return b"\x00" + pickle.dumps((0, (encode_group(entries),)), protocol=5)


def _upgraded_decode(data: Any) -> Envelope:
    """The codec of a release that reads version 2 envelopes (here: as version 1)."""
    if isinstance(data, bytes):
        data = data.replace(b"\xa1v\x02", b"\xa1v\x01")
    return _decode(data)


_decode = codec.decode


def _state(store: RaftStore) -> tuple[list[str], str]:
    return store.replica.read(
        lambda machine: (sorted(machine.keys), hashlib.sha256(machine.snapshot()).hexdigest())
    )


def _stores(addresses: list[str], tmp_path: Path) -> list[RaftStore]:
    return [
        RaftStore(
            RaftConfig(
                self_address=address,
                peers=tuple(peer for peer in addresses if peer != address),
                data_dir=tmp_path / address.replace(":", "_"),
            )
        )
        for address in addresses
    ]


async def _eventually(condition: Any, what: str) -> None:
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0.05)
    assert condition(), what


def test_an_entry_of_a_newer_release__stops_every_member_there_and_nothing_is_lost_after_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]

    async def before_upgrade() -> None:
        stores = _stores(addresses, tmp_path)
        try:
            for store in stores:
                await store.start()
            leader = await leader_of(stores)
            (await leader.propose(KvPut(key="before", value=b"v"))).result.unwrap()
            # The newer release's entry, then one this release could apply, straight into the
            # leader's log (as a newer leader would write them).
            leader.replica._applyCommand(_raw([_entry("from-newer", 2)]), None)
            await _eventually(
                lambda: all(store.replica.halted is not None for store in stores), "all stopped"
            )
            stopped_at = [store.status()["applied_index"] for store in stores]
            leader.replica._applyCommand(_raw([_entry("later", 1)]), None)
            # The log goes on: the entry after is committed everywhere, and applied nowhere.
            await _eventually(
                lambda: all(
                    store.status()["commit_index"] > applied
                    for store, applied in zip(stores, stopped_at, strict=True)
                ),
                "the log goes on",
            )
            await asyncio.sleep(0.5)
            for store, applied in zip(stores, stopped_at, strict=True):
                assert store.status()["applied_index"] == applied
                assert _state(store)[0] == ["before"]
                assert "newer release" in (store.status()["apply_halted"] or "")
                with pytest.raises(ClusterUnavailable, match="must be upgraded"):
                    await store.propose(KvPut(key="refused", value=b"v"), timeout_s=1)
                with pytest.raises(ClusterUnavailable, match="must be upgraded"):
                    await store.read(lambda machine: machine.index, consistency="stale")
        finally:
            for store in stores:
                await store.stop()

    async def after_upgrade() -> None:
        stores = _stores(addresses, tmp_path)
        try:
            for store in stores:
                await store.start()
            leader = await leader_of(stores)
            (await leader.propose(KvPut(key="after", value=b"v"))).result.unwrap()
            expected = ["after", "before", "from-newer", "later"]
            await _eventually(
                lambda: all(_state(store)[0] == expected for store in stores), "all applied"
            )
            assert len({_state(store)[1] for store in stores}) == 1
            assert all(store.status()["apply_halted"] is None for store in stores)
        finally:
            for store in stores:
                await store.stop()

    with caplog.at_level(logging.ERROR):
        asyncio.run(before_upgrade())
    stopped = [r for r in caplog.records if "stopped applying the log" in r.getMessage()]
    # Once a minute at most, on each member.
    assert len(stopped) == 3, [r.getMessage() for r in stopped]
    monkeypatch.setattr(codec, "decode", _upgraded_decode)
    monkeypatch.setattr(replica_module, "newer_version", lambda entry: None)
    asyncio.run(after_upgrade())


def test_a_leader_that_stopped__hands_the_leadership_to_a_member_that_applies_the_log(
    tmp_path: Path,
) -> None:
    """Led by a member that stopped, a cluster proposes nothing: neither lease ticks nor the
    schedule. Here the two followers stand for newer nodes (they go past the entry); the leader,
    of this release, stops, hands over, and does not campaign again, not even when the new
    leader goes."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]

    async def scenario() -> None:
        stores = _stores(addresses, tmp_path)
        running = list(stores)
        try:
            for store in stores:
                await store.start()
            old = await leader_of(stores)
            newer = [store for store in stores if store is not old]
            for store in newer:
                store.replica._halt = lambda index, version: None  # type: ignore[method-assign]
            old.replica._applyCommand(_raw([_entry("from-newer", 2)]), None)
            await _eventually(lambda: old.replica.halted is not None, "the old leader stopped")
            new_leader = await leader_of(newer)
            (await new_leader.propose(KvPut(key="after", value=b"v"))).result.unwrap()
            # Long enough for several election timeouts: the stopped member stays a follower.
            for _ in range(20):
                await asyncio.sleep(0.1)
                assert not old.is_leader
            assert old.status()["leader"] == new_leader.config.self_address
            # Nor when the leader goes: the one member left that applies the log is elected.
            running.remove(new_leader)
            await new_leader.stop()
            last = next(store for store in newer if store is not new_leader)
            async with asyncio.timeout(30):
                while not last.is_leader:
                    assert not old.is_leader
                    await asyncio.sleep(0.01)
            (await last.propose(KvPut(key="last", value=b"v"))).result.unwrap()
        finally:
            for store in running:
                await store.stop()

    asyncio.run(scenario())
